#include "core/spec/run.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::spec {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

const char* size_kind_name(SizeKind k) {
  switch (k) {
    case SizeKind::fixed:
      return "fixed";
    case SizeKind::lognormal:
      return "lognormal";
    case SizeKind::histogram:
      return "histogram";
  }
  return "?";
}

bool DataSpec::heterogeneous() const {
  for (const auto* d : {&image, &text, &audio, &generated_image}) {
    if (d->kind != SizeKind::fixed) return true;
  }
  return false;
}

const char* attention_name(Attention a) { return a == Attention::flash ? "flash" : "standard"; }

std::string host_threads_problem(long long threads) {
  if (threads >= 0 && threads <= kMaxHostThreads) return "";
  if (threads < 0) return "must be >= 0 (got " + std::to_string(threads) + ")";
  return "at most " + std::to_string(kMaxHostThreads) + " (got " + std::to_string(threads) +
         "): each is a thread started in every process";
}

namespace {

// A `model:` or `cluster:` field: a path relative to the run file, or an inline mapping.
Node resolve_document(const Node& field, const std::string& base_dir) {
  if (field.is_map()) return field;
  std::string path = field.as_string();
  std::filesystem::path p(path);
  if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
  try {
    return load_document(p.lexically_normal().string());
  } catch (const Error& e) {
    if (e.status() != Status::io) throw;
    // Still an I/O failure (braid.h: BRAID_ERR_IO for a file the config names), located at the field.
    throw Error(Status::io, field.where() + ": " + field.path() + ": " + e.what());
  }
}

// "must be 0, 1, 2 or 3 (got 5)", or "" for a ZeRO stage.
std::string zero_stage_problem(long long v) {
  return v < 0 || v > 3 ? "must be 0, 1, 2 or 3 (got " + std::to_string(v) + ")" : "";
}

// Each field on its own (types, ranges, choices); check_training adds the relations.
TrainingSpec parse_training(const Node& n) {
  n.expect_keys({"global_batch", "microbatch", "contrastive_batch", "precision", "zero_stage", "recompute", "attention",
                 "sequence_parallel", "schedule", "virtual_stages", "overlap_grad_reduce", "overlap_param_gather",
                 "tp_comm_overlap", "fused_kernels", "fp8"});
  TrainingSpec t;
  t.global_batch = n.at("global_batch").as_int_at_least(1);
  t.microbatch = static_cast<int>(n.at("microbatch").as_int_at_least(1));
  t.contrastive_batch = t.global_batch;
  if (auto c = n.find("contrastive_batch")) t.contrastive_batch = c->as_int_at_least(1);
  if (auto p = n.find("precision")) {
    std::string s = p->as_choice({"bf16", "fp16", "fp32"});
    t.precision = s == "bf16" ? Precision::bf16 : s == "fp16" ? Precision::fp16 : Precision::fp32;
  }
  if (auto z = n.find("zero_stage")) {
    long long v = z->as_int();
    if (auto problem = zero_stage_problem(v); !problem.empty()) z->fail(problem);
    t.zero_stage = static_cast<int>(v);
  }
  if (auto r = n.find("recompute")) {
    std::string s = r->as_choice({"none", "selective", "full"});
    t.recompute = s == "none" ? Recompute::none : s == "selective" ? Recompute::selective : Recompute::full;
  }
  if (auto a = n.find("attention")) {
    t.attention = a->as_choice({"flash", "standard"}) == "flash" ? Attention::flash : Attention::standard;
  }
  if (auto s = n.find("sequence_parallel")) t.sequence_parallel = s->as_bool();
  if (auto s = n.find("schedule")) t.schedule = *parse_schedule(s->as_choice(run_schedule_names()));
  if (auto v = n.find("virtual_stages")) t.virtual_stages = static_cast<int>(v->as_int_at_least(1));
  if (auto o = n.find("overlap_grad_reduce")) t.overlap_grad_reduce = o->as_bool();
  if (auto o = n.find("overlap_param_gather")) t.overlap_param_gather = o->as_bool();
  if (auto o = n.find("tp_comm_overlap")) t.tp_comm_overlap = o->as_bool();
  if (auto f = n.find("fused_kernels")) t.fused_kernels = f->as_bool();
  if (auto f = n.find("fp8")) t.fp8 = f->as_bool();
  return t;
}

// The node of dotted field `path` below `n`, or the deepest one the file has (a check may
// name a field it left out). Recursive: assigning a YAML::Node would rebind the document.
Node field_at(const Node& n, std::string_view path) {
  const auto dot = path.find('.');
  auto child = n.find(path.substr(0, dot));
  if (!child) return n;
  if (dot == std::string_view::npos) return *child;
  return field_at(*child, path.substr(dot + 1));
}

int read_size(const Node& data, std::string_view modality, std::string_view field) {
  return static_cast<int>(data.at(modality).at(field).as_int_at_least(1));
}

// A size on the modality's grid: a whole number of patches (or latent cells) per side.
void expect_on_grid(const Node& n, int value, int step, const std::string& why) {
  if (value % step != 0)
    n.fail(std::to_string(value) + " is not a multiple of " + std::to_string(step) + " (" + why + ")");
}

SizeDistribution parse_distribution(const Node& n, int step, const std::string& why) {
  SizeDistribution d;
  d.step = step;
  n.expect_keys({"kind", "median", "sigma", "min", "max", "values", "weights"});
  const std::string kind = n.at("kind").as_choice({"fixed", "lognormal", "histogram"});
  auto only = [&](std::initializer_list<std::string_view> keys) {
    for (const auto& key : n.keys()) {
      if (key == "kind" || std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      const std::vector<std::string> takes(keys.begin(), keys.end());
      n.at(key).fail("does not apply to a " + kind + " distribution" +
                     (takes.empty() ? "" : " (it takes " + join_choices(takes, " and ") + ")"));
    }
  };
  if (kind == "fixed") {
    only({});
  } else if (kind == "lognormal") {
    only({"median", "sigma", "min", "max"});
    d.kind = SizeKind::lognormal;
    d.median = n.at("median").as_positive();
    d.sigma = n.at("sigma").as_double();
    if (d.sigma < 0) n.at("sigma").fail("must be zero or more (got " + n.at("sigma").yaml().Scalar() + ")");
    d.min = static_cast<int>(n.at("min").as_int_at_least(1));
    d.max = static_cast<int>(n.at("max").as_int_at_least(1));
    if (d.min > d.max) n.at("max").fail("max " + std::to_string(d.max) + " is below min " + std::to_string(d.min));
    if (d.median < d.min || d.median > d.max) {
      n.at("median").fail("median " + n.at("median").yaml().Scalar() + " lies outside [min, max] = [" +
                          std::to_string(d.min) + ", " + std::to_string(d.max) + "]");
    }
    if ((d.min + step - 1) / step * step > d.max) {
      n.at("max").fail("no multiple of " + std::to_string(step) + " lies in [" + std::to_string(d.min) + ", " +
                       std::to_string(d.max) + "] (" + why + ")");
    }
  } else {
    only({"values", "weights"});
    d.kind = SizeKind::histogram;
    const auto values = n.at("values").items();
    const auto weights = n.at("weights").items();
    if (values.empty()) n.at("values").fail("needs at least one size");
    if (weights.size() != values.size()) {
      n.at("weights").fail(std::to_string(weights.size()) + " weights for " + std::to_string(values.size()) +
                           " values: give one weight per value");
    }
    double total = 0;
    for (const auto& v : values) {
      d.values.push_back(static_cast<int>(v.as_int_at_least(1)));
      expect_on_grid(v, d.values.back(), step, why);
    }
    for (const auto& w : weights) {
      d.weights.push_back(w.as_double());
      if (d.weights.back() < 0) w.fail("a weight must be zero or more (got " + w.yaml().Scalar() + ")");
      total += d.weights.back();
    }
    if (!(total > 0)) n.at("weights").fail("the weights sum to 0; at least one must be positive");
    // Past the largest double every draw would land on the last value.
    if (!std::isfinite(total))
      n.at("weights").fail(
          "the weights sum to infinity in double precision; scale them down (only their ratios matter)");
  }
  return d;
}

// Reads `data.<modality>`: its nominal size `field`, and its optional distribution.
int read_modality(const Node& data, std::string_view modality, std::string_view field, int step, const std::string& why,
                  SizeDistribution& dist) {
  const int size = read_size(data, modality, field);
  dist = SizeDistribution{};
  dist.step = step;
  if (auto d = data.at(modality).find("distribution")) dist = parse_distribution(*d, step, why);
  return size;
}

DataSpec parse_data(const Node& n, const ModelSpec& model) {
  n.expect_keys({"image", "text", "audio", "generated_image", "seed", "steps"});
  for (const char* key : {"image", "generated_image"}) {
    if (auto m = n.find(key)) m->expect_keys({"resolution", "distribution"});
  }
  for (const char* key : {"text", "audio"}) {
    if (auto m = n.find(key)) m->expect_keys({"tokens", "distribution"});
  }
  DataSpec d;
  if (auto s = n.find("seed")) d.seed = static_cast<std::uint64_t>(s->as_int_at_least(0));
  if (auto s = n.find("steps")) {
    d.steps = static_cast<int>(s->as_int_at_least(1));
    constexpr int kMaxSteps = 10000;
    if (d.steps > kMaxSteps)
      s->fail("at most " + std::to_string(kMaxSteps) + " steps (got " + std::to_string(d.steps) + ")");
  }
  // Sizes on their grids: check_input_sizes, after.
  bool read[4] = {};  // image, text, audio, generated_image: the inputs the model takes
  for (const auto& m : model.modules) {
    if (m.role == Role::encoder && m.modality == Modality::image) {
      const std::string why = "the patch size of '" + m.name + "'";
      d.image_resolution = read_modality(n, "image", "resolution", m.patch_size, why, d.image);
      read[0] = true;
    }
    if ((m.role == Role::encoder && m.modality == Modality::text) || m.role == Role::llm) {
      d.text_tokens = read_modality(n, "text", "tokens", 1, "", d.text);
      read[1] = true;
    }
    if (m.role == Role::encoder && m.modality == Modality::audio) {
      d.audio_tokens = read_modality(n, "audio", "tokens", 1, "", d.audio);
      read[2] = true;
    }
    if (m.role == Role::generator) {
      const int cell = m.latent_downsample * m.patch_size;
      const std::string why = "latent downsample x patch size of '" + m.name + "'";
      d.generated_image_resolution = read_modality(n, "generated_image", "resolution", cell, why, d.generated_image);
      read[3] = true;
    }
  }
  // A size for an input no module takes would be silently ignored: most likely the wrong model.
  const char* inputs[] = {"image", "text", "audio", "generated_image"};
  for (int i = 0; i < 4; ++i) {
    if (auto unused = n.find(inputs[i]); unused && !read[i])
      unused->fail("model '" + model.name + "' takes no " + inputs[i] + " input; remove this section");
  }
  return d;
}

std::string short_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

TrainerSpec parse_trainer(const Node& n) {
  n.expect_keys({"steps", "learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps",
                 "grad_clip", "eval_every", "eval_samples", "checkpoint_every", "keep_checkpoints", "threads"});
  TrainerSpec t;
  auto count = [&](const char* key, long long& v, long long min) {
    if (auto f = n.find(key)) v = f->as_int_at_least(min);
  };
  auto real = [&](const char* key, double& v, double lo, double hi) {
    if (auto f = n.find(key)) {
      v = f->as_double();
      if (!(v >= lo && v <= hi))
        f->fail("must be in [" + short_number(lo) + ", " + short_number(hi) + "] (got " + short_number(v) + ")");
    }
  };
  count("steps", t.steps, 1);
  real("learning_rate", t.learning_rate, 0, 10);
  count("warmup_steps", t.warmup_steps, 0);
  real("min_lr_ratio", t.min_lr_ratio, 0, 1);
  real("weight_decay", t.weight_decay, 0, 10);
  real("beta1", t.beta1, 0, 0.999999);
  real("beta2", t.beta2, 0, 0.999999);
  real("eps", t.eps, 1e-12, 1);
  real("grad_clip", t.grad_clip, 0, 1e9);
  count("eval_every", t.eval_every, 0);
  count("eval_samples", t.eval_samples, 2);
  constexpr long long kMaxEvalSamples = 65536;  // an evaluation renders and holds all of them
  if (t.eval_samples > kMaxEvalSamples)
    n.at("eval_samples")
        .fail("at most " + std::to_string(kMaxEvalSamples) + " (got " + std::to_string(t.eval_samples) +
              "): an evaluation renders and holds every held-out sample");
  count("checkpoint_every", t.checkpoint_every, 0);
  count("keep_checkpoints", t.keep_checkpoints, 0);
  if (auto f = n.find("threads")) {
    const long long threads = f->as_int_at_least(0);
    if (auto problem = host_threads_problem(threads); !problem.empty()) f->fail(problem);
    t.threads = static_cast<int>(threads);
  }
  return t;
}

RunSpec parse_root(const Node& root, const std::string& base_dir) {
  root.expect_keys({"name", "description", "model", "cluster", "nodes", "training", "data", "trainer"});
  RunSpec run;
  run.source = root.source();
  run.model = parse_model(resolve_document(root.at("model"), base_dir));
  run.cluster = parse_cluster(resolve_document(root.at("cluster"), base_dir));
  if (auto n = root.find("nodes")) run.cluster.nodes = static_cast<int>(n->as_int_at_least(1));
  // A ceiling far above today's largest clusters, so that device indices stay ints.
  constexpr long long kMaxDevices = 1 << 20;
  if (static_cast<long long>(run.cluster.nodes) * run.cluster.devices_per_node > kMaxDevices) {
    (root.has("nodes") ? root.at("nodes") : root.at("cluster"))
        .fail(std::to_string(run.cluster.nodes) + " nodes of " + std::to_string(run.cluster.devices_per_node) +
              " devices exceed braid's limit of " + std::to_string(kMaxDevices) + " devices");
  }
  run.training = parse_training(root.at("training"));
  if (run.model.topology != Topology::contrastive && root.at("training").has("contrastive_batch")) {
    root.at("training").at("contrastive_batch").fail("only applies to models with a contrastive loss");
  }
  if (auto problem = check_training(run.training, run.model)) field_at(root, problem->field).fail(problem->message);
  if (auto problem = check_training_on(run.training, run.cluster))
    field_at(root, problem->field).fail(problem->message);
  run.data = parse_data(root.at("data"), run.model);
  if (auto problem = check_input_sizes(run.data, run.model)) field_at(root, problem->field).fail(problem->message);
  if (auto t = root.find("trainer")) run.trainer = parse_trainer(*t);
  return run;
}

}  // namespace

std::vector<std::string> run_schedule_names() {
  return schedule_names({Schedule::one_f_one_b, Schedule::interleaved, Schedule::gpipe});
}

std::optional<FieldProblem> check_training(const TrainingSpec& t, const ModelSpec& model) {
  auto problem = [](const char* field, std::string message) {
    return FieldProblem{std::string("training.") + field, std::move(message)};
  };
  if (auto p = int_at_least_problem(t.global_batch, 1); !p.empty()) return problem("global_batch", p);
  if (auto p = int_at_least_problem(t.microbatch, 1); !p.empty()) return problem("microbatch", p);
  if (t.global_batch % t.microbatch != 0) {
    return problem("global_batch", "global batch " + std::to_string(t.global_batch) +
                                       " is not divisible by the microbatch size " + std::to_string(t.microbatch));
  }
  // The planner prices and simulates every microbatch of a step: millions take it minutes,
  // for a run no engine trains (real steps hold thousands at most).
  constexpr long long kMaxMicrobatches = 1 << 20;
  if (t.global_batch / t.microbatch > kMaxMicrobatches) {
    return problem("global_batch", "global batch " + std::to_string(t.global_batch) + " is " +
                                       std::to_string(t.global_batch / t.microbatch) + " microbatches of " +
                                       std::to_string(t.microbatch) + " a step; at most " +
                                       std::to_string(kMaxMicrobatches));
  }
  if (model.topology != Topology::contrastive && t.contrastive_batch != t.global_batch)
    return problem("contrastive_batch", "only applies to models with a contrastive loss");
  if (auto p = int_at_least_problem(t.contrastive_batch, 1); !p.empty()) return problem("contrastive_batch", p);
  if (t.global_batch % t.contrastive_batch != 0) {
    return problem("contrastive_batch", "contrastive batch " + std::to_string(t.contrastive_batch) +
                                            " does not divide the global batch " + std::to_string(t.global_batch));
  }
  if (t.contrastive_batch % t.microbatch != 0) {
    return problem("contrastive_batch", "contrastive batch " + std::to_string(t.contrastive_batch) +
                                            " is not a multiple of the microbatch size " +
                                            std::to_string(t.microbatch));
  }
  if (auto p = zero_stage_problem(t.zero_stage); !p.empty()) return problem("zero_stage", p);
  const auto names = run_schedule_names();
  if (auto p = choice_problem(schedule_name(t.schedule), names); !p.empty()) return problem("schedule", p);
  if (auto p = int_at_least_problem(t.virtual_stages, 1); !p.empty()) return problem("virtual_stages", p);
  if (t.virtual_stages > 1 && t.schedule != Schedule::interleaved)
    return problem("virtual_stages", "virtual stages need 'schedule: interleaved'");
  if (t.schedule == Schedule::interleaved && t.virtual_stages < 2)
    return problem("schedule", "the interleaved schedule needs virtual_stages of at least 2");
  // Megatron-LM refuses the same combinations (megatron/training/arguments.py): the
  // parameter all-gather exists only with the distributed optimizer and is overlapped
  // only together with the gradient reduction; userbuffers overlap the all-gather and
  // reduce-scatter of sequence parallelism, so TP overlap needs it.
  if (t.overlap_param_gather && (t.zero_stage < 1 || t.zero_stage > 2))
    return problem("overlap_param_gather",
                   "needs zero_stage 1 or 2 (the distributed optimizer's parameter all-gather)");
  if (t.overlap_param_gather && !t.overlap_grad_reduce)
    return problem("overlap_param_gather", "needs overlap_grad_reduce: true, as in Megatron-LM");
  if (t.tp_comm_overlap && !t.sequence_parallel)
    return problem("tp_comm_overlap", "needs sequence_parallel: true (it overlaps sequence parallelism's collectives)");
  if (t.fp8 && t.precision == Precision::fp32)
    return problem("fp8", "FP8 GEMMs need mixed precision (precision bf16 or fp16)");
  return std::nullopt;
}

std::optional<FieldProblem> check_training_on(const TrainingSpec& t, const ClusterSpec& cluster) {
  if (t.fp8 && cluster.peak_flops_fp8 <= 0)
    return FieldProblem{"training.fp8", "cluster '" + cluster.name +
                                            "' gives no FP8 peak: add `fp8` to device.peak_tflops in its file"};
  return std::nullopt;
}

std::optional<FieldProblem> check_input_sizes(const DataSpec& d, const ModelSpec& model) {
  bool image = false, text = false, audio = false, generated = false;
  auto at_least_one = [](const char* field, int v) -> std::optional<FieldProblem> {
    if (auto p = int_at_least_problem(v, 1); !p.empty()) return FieldProblem{field, p};
    return std::nullopt;
  };
  for (const auto& m : model.modules) {
    if (m.role == Role::encoder && m.modality == Modality::image) {
      image = true;
      if (auto p = at_least_one("data.image.resolution", d.image_resolution)) return p;
      if (d.image_resolution % m.patch_size != 0) {
        return FieldProblem{"data.image.resolution", "image resolution " + std::to_string(d.image_resolution) +
                                                         " is not a multiple of the patch size " +
                                                         std::to_string(m.patch_size) + " of '" + m.name + "'"};
      }
    }
    if ((m.role == Role::encoder && m.modality == Modality::text) || m.role == Role::llm) {
      text = true;
      if (auto p = at_least_one("data.text.tokens", d.text_tokens)) return p;
    }
    if (m.role == Role::encoder && m.modality == Modality::audio) {
      audio = true;
      if (auto p = at_least_one("data.audio.tokens", d.audio_tokens)) return p;
    }
    if (m.role == Role::generator) {
      generated = true;
      if (auto p = at_least_one("data.generated_image.resolution", d.generated_image_resolution)) return p;
      const int cell = m.latent_downsample * m.patch_size;
      if (d.generated_image_resolution % cell != 0) {
        return FieldProblem{"data.generated_image.resolution",
                            "generated resolution " + std::to_string(d.generated_image_resolution) +
                                " is not a multiple of " + std::to_string(cell) +
                                " (latent downsample x patch size of '" + m.name + "')"};
      }
    }
  }
  const struct {
    bool taken;
    int value;
    const char* field;
    const char* input;
  } inputs[] = {{image, d.image_resolution, "data.image.resolution", "image"},
                {text, d.text_tokens, "data.text.tokens", "text"},
                {audio, d.audio_tokens, "data.audio.tokens", "audio"},
                {generated, d.generated_image_resolution, "data.generated_image.resolution", "generated image"}};
  for (const auto& in : inputs) {
    if (!in.taken && in.value != 0)
      return FieldProblem{in.field, std::string("the model takes no ") + in.input + " input (leave it 0, got " +
                                        std::to_string(in.value) + ")"};
  }
  return std::nullopt;
}

RunSpec load_run(const std::string& path) {
  Node root = load_document(path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  return parse_root(root, dir);
}

RunSpec parse_run(const std::string& text, const std::string& base_dir, const std::string& source) {
  return parse_root(parse_document(text, source), base_dir);
}

}  // namespace braid::spec
