#include "core/train/run_record.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <type_traits>

#include "core/common/error.hpp"

namespace braid::train {

namespace {

constexpr const char* kBlob = "run/fields";

std::string number(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

template <typename T>
std::string list(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    if constexpr (std::is_floating_point_v<T>)
      out += number(values[i]);
    else if constexpr (std::is_arithmetic_v<T>)
      out += std::to_string(values[i]);
    else
      out += values[i];
  }
  return out + "]";
}

class Fields {
 public:
  explicit Fields(std::vector<std::pair<std::string, std::string>>& out) : out_(out) {}
  void add(const std::string& name, std::string value) { out_.emplace_back(name, std::move(value)); }
  void add(const std::string& name, long long value) { add(name, std::to_string(value)); }
  void add(const std::string& name, int value) { add(name, std::to_string(value)); }
  void add(const std::string& name, bool value) { add(name, std::string(value ? "true" : "false")); }
  void add(const std::string& name, double value) { add(name, number(value)); }
  void add(const std::string& name, const char* value) { add(name, std::string(value)); }

 private:
  std::vector<std::pair<std::string, std::string>>& out_;
};

// Every field of a module that changes what it computes (not where it was written).
void add_module(Fields& f, const spec::ModuleSpec& m) {
  const std::string at = "model." + m.name + ".";
  f.add(at + "role", spec::role_name(m.role));
  f.add(at + "modality", spec::modality_name(m.modality));
  f.add(at + "layers", m.layers);
  f.add(at + "hidden", m.hidden);
  f.add(at + "ffn", m.ffn);
  f.add(at + "heads", m.heads);
  f.add(at + "kv_groups", m.kv_groups);
  f.add(at + "mlp", m.mlp == spec::Mlp::swiglu ? "swiglu" : "gelu");
  f.add(at + "causal", m.causal);
  f.add(at + "dropout", m.dropout);
  f.add(at + "vocab", m.vocab);
  f.add(at + "patch_size", m.patch_size);
  f.add(at + "channels", m.channels);
  f.add(at + "embed_dim", m.embed_dim);
  f.add(at + "downsample", m.downsample);
  f.add(at + "max_positions", m.max_positions);
  f.add(at + "max_image_size", m.max_image_size);
  f.add(at + "latent_downsample", m.latent_downsample);
  f.add(at + "frozen", m.frozen);
  f.add(at + "loss", m.loss);
  f.add(at + "inputs", list(m.inputs));
}

void add_sizes(Fields& f, const std::string& at, const spec::SizeDistribution& d) {
  f.add(at + ".kind", spec::size_kind_name(d.kind));
  if (d.kind == spec::SizeKind::lognormal) {
    f.add(at + ".median", d.median);
    f.add(at + ".sigma", d.sigma);
    f.add(at + ".min", d.min);
    f.add(at + ".max", d.max);
  }
  if (d.kind == spec::SizeKind::histogram) {
    f.add(at + ".values", list(d.values));
    f.add(at + ".weights", list(d.weights));
  }
  f.add(at + ".step", d.step);
}

// A name or value on a record line: '\\', '=' and a newline escaped (module names are free text).
std::string escaped(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '\\' || ch == '=') out += '\\';
    out += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_fields(const std::string& text, const std::string& source) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::string parts[2];
    int part = 0;
    for (std::size_t k = 0; k < line.size(); ++k) {
      if (line[k] == '=' && part == 0) {
        part = 1;
      } else if (line[k] == '\\' && k + 1 < line.size()) {
        ++k;
        parts[part] += line[k] == 'n' ? '\n' : line[k];
      } else {
        parts[part] += line[k];
      }
    }
    if (part == 0)
      throw Error(Status::bad_config, "checkpoint '" + source + "': its run record has a line without '=': " + line);
    fields.emplace_back(std::move(parts[0]), std::move(parts[1]));
  }
  return fields;
}

}  // namespace

RunRecord RunRecord::of(const spec::RunSpec& run, std::uint64_t seed) {
  RunRecord r;
  Fields f(r.fields);
  f.add("seed", std::to_string(seed));
  f.add("model.modules", static_cast<int>(run.model.modules.size()));
  for (const auto& m : run.model.modules) add_module(f, m);
  f.add("training.global_batch", run.training.global_batch);
  f.add("training.contrastive_batch", run.training.contrastive_batch);
  f.add("data.image_resolution", run.data.image_resolution);
  f.add("data.text_tokens", run.data.text_tokens);
  f.add("data.audio_tokens", run.data.audio_tokens);
  f.add("data.generated_image_resolution", run.data.generated_image_resolution);
  add_sizes(f, "data.image", run.data.image);
  add_sizes(f, "data.text", run.data.text);
  add_sizes(f, "data.audio", run.data.audio);
  add_sizes(f, "data.generated_image", run.data.generated_image);
  // The optimizer's settings besides the learning rate (lr_schedule.hpp compares that).
  f.add("trainer.weight_decay", run.trainer.weight_decay);
  f.add("trainer.beta1", run.trainer.beta1);
  f.add("trainer.beta2", run.trainer.beta2);
  f.add("trainer.eps", run.trainer.eps);
  f.add("trainer.grad_clip", run.trainer.grad_clip);
  return r;
}

void RunRecord::record(CheckpointContents& c) const {
  std::string text;
  for (const auto& [name, value] : fields) text += escaped(name) + "=" + escaped(value) + "\n";
  c.add_blob(kBlob, std::move(text));
}

std::optional<RunRecord> RunRecord::recorded(const CheckpointContents& c) {
  if (!c.has_blob(kBlob)) return std::nullopt;
  return RunRecord{parse_fields(c.blob(kBlob), c.source)};
}

std::string run_change(const CheckpointContents& c, const RunRecord& now) {
  const std::optional<RunRecord> then = RunRecord::recorded(c);
  if (!then) return "";
  const auto value_in = [](const RunRecord& r, const std::string& name) -> const std::string* {
    for (const auto& [n, v] : r.fields)
      if (n == name) return &v;
    return nullptr;
  };
  // Each field one record lacks or the other holds otherwise, this run's order first.
  std::vector<std::string> differ;
  std::string first;
  const auto compare = [&](const std::string& name) {
    const std::string* was = value_in(*then, name);
    const std::string* is = value_in(now, name);
    if ((was && is && *was == *is) || std::find(differ.begin(), differ.end(), name) != differ.end()) return;
    if (differ.empty())
      first = name + " was " + (was ? *was : "not recorded") + ", this run's " + (is ? *is : "absent");
    differ.push_back(name);
  };
  for (const auto& field : now.fields) compare(field.first);
  for (const auto& field : then->fields) compare(field.first);
  if (differ.empty()) return "";  // the same fields, perhaps in another order (modules listed otherwise)
  std::string out = "checkpoint '" + c.source + "' was trained on another run: its " + first;
  if (differ.size() > 1) {
    out += " (and " + std::to_string(differ.size() - 1) + " more field" + (differ.size() > 2 ? "s" : "") + ":";
    for (std::size_t i = 1; i < differ.size() && i <= 4; ++i) out += (i > 1 ? ", " : " ") + differ[i];
    if (differ.size() > 5) out += ", ...";
    out += ")";
  }
  return out;
}

}  // namespace braid::train
