#include "core/spec/model.hpp"

#include <limits>
#include <map>
#include <set>

#include "core/common/error.hpp"

namespace braid::spec {

const char* role_name(Role role) {
  switch (role) {
    case Role::encoder:
      return "encoder";
    case Role::projector:
      return "projector";
    case Role::llm:
      return "llm";
    case Role::generator:
      return "generator";
    case Role::loss:
      return "loss";
  }
  return "?";
}

const char* modality_name(Modality modality) {
  switch (modality) {
    case Modality::none:
      return "none";
    case Modality::image:
      return "image";
    case Modality::text:
      return "text";
    case Modality::audio:
      return "audio";
  }
  return "?";
}

const char* topology_name(Topology topology) {
  switch (topology) {
    case Topology::llm_only:
      return "language model alone";
    case Topology::chain:
      return "chain of encoders into a language model";
    case Topology::contrastive:
      return "contrastive dual encoder";
  }
  return "?";
}

const ModuleSpec* ModelSpec::find(const std::string& module_name) const {
  for (const auto& m : modules) {
    if (m.name == module_name) return &m;
  }
  return nullptr;
}

int ModelSpec::index_of(const std::string& module_name) const {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].name == module_name) return static_cast<int>(i);
  }
  return -1;
}

int ModelSpec::llm_index() const {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].role == Role::llm) return static_cast<int>(i);
  }
  return -1;
}

namespace {

Role parse_role(const Node& n) {
  std::string r = n.as_choice({"encoder", "projector", "llm", "generator", "loss"});
  if (r == "encoder") return Role::encoder;
  if (r == "projector") return Role::projector;
  if (r == "llm") return Role::llm;
  if (r == "generator") return Role::generator;
  return Role::loss;
}

int positive_int(const Node& map, std::string_view key) { return static_cast<int>(map.at(key).as_int_at_least(1)); }

// Reads the transformer fields shared by encoders, the llm and generators, and
// checks the shape is buildable (heads divide hidden, groups divide heads).
void read_transformer(const Node& n, ModuleSpec& m) {
  m.layers = positive_int(n, "layers");
  m.hidden = positive_int(n, "hidden");
  m.heads = positive_int(n, "heads");
  if (auto ffn = n.find("ffn")) {
    m.ffn = static_cast<int>(ffn->as_int_at_least(1));
  } else {
    const long long wide = 4LL * m.hidden;  // the default, which an int must hold
    if (wide > std::numeric_limits<int>::max())
      n.at("hidden").fail("is too large (got " + std::to_string(m.hidden) + "): the default ffn, 4 x hidden, exceeds " +
                          std::to_string(std::numeric_limits<int>::max()));
    m.ffn = static_cast<int>(wide);
  }
  m.kv_groups = n.has("kv_groups") ? static_cast<int>(n.at("kv_groups").as_int_at_least(1)) : m.heads;
  if (m.hidden % m.heads != 0) {
    n.at("heads").fail(std::to_string(m.heads) + " heads do not divide hidden size " + std::to_string(m.hidden));
  }
  if (m.heads % m.kv_groups != 0) {
    n.at("kv_groups")
        .fail(std::to_string(m.kv_groups) + " key/value groups do not divide " + std::to_string(m.heads) + " heads");
  }
  if (auto mlp = n.find("mlp")) m.mlp = mlp->as_choice({"gelu", "swiglu"}) == "swiglu" ? Mlp::swiglu : Mlp::gelu;
  if (auto d = n.find("dropout")) {
    m.dropout = d->as_double();
    if (m.dropout < 0 || m.dropout >= 1) d->fail("must be in [0, 1) (got " + d->as_string() + ")");
  }
}

ModuleSpec parse_module(const Node& n) {
  ModuleSpec m;
  m.where = n.where();
  m.path = n.path();
  n.expect_keys({"name",
                 "role",
                 "modality",
                 "layers",
                 "hidden",
                 "ffn",
                 "heads",
                 "kv_groups",
                 "mlp",
                 "causal",
                 "dropout",
                 "vocab",
                 "patch_size",
                 "channels",
                 "embed_dim",
                 "downsample",
                 "latent_downsample",
                 "max_positions",
                 "max_image_size",
                 "frozen",
                 "loss",
                 "inputs"});
  m.name = n.at("name").as_string();
  if (m.name.empty()) n.at("name").fail("a module needs a non-empty name");
  m.role = parse_role(n.at("role"));
  if (auto f = n.find("frozen")) m.frozen = f->as_bool();
  if (auto in = n.find("inputs")) {
    for (const auto& item : in->items()) m.inputs.push_back(item.as_string());
  }

  auto require_absent = [&](std::initializer_list<std::string_view> keys) {
    for (auto k : keys) {
      if (n.has(k)) n.at(k).fail(std::string("does not apply to a ") + role_name(m.role) + " module");
    }
  };

  switch (m.role) {
    case Role::encoder: {
      std::string mod = n.at("modality").as_choice({"image", "text", "audio"});
      m.modality = mod == "image" ? Modality::image : mod == "text" ? Modality::text : Modality::audio;
      read_transformer(n, m);
      m.causal = n.has("causal") ? n.at("causal").as_bool() : false;
      if (m.modality == Modality::image) {
        m.patch_size = static_cast<int>(n.at("patch_size").as_int_at_least(1));
        if (auto c = n.find("channels")) m.channels = static_cast<int>(c->as_int_at_least(1));
        if (auto s = n.find("max_image_size")) {
          m.max_image_size = static_cast<int>(s->as_int_at_least(1));
          if (m.max_image_size < m.patch_size) {
            s->fail("must be at least the patch size " + std::to_string(m.patch_size) + " (got " +
                    std::to_string(m.max_image_size) + ")");
          }
        }
        require_absent({"vocab", "max_positions"});
      } else {
        if (m.modality == Modality::text) {
          m.vocab = positive_int(n, "vocab");
          require_absent({"patch_size", "channels"});
        }
        if (auto p = n.find("max_positions")) m.max_positions = static_cast<int>(p->as_int_at_least(1));
        require_absent({"max_image_size"});
      }
      if (auto e = n.find("embed_dim")) m.embed_dim = static_cast<int>(e->as_int_at_least(1));
      require_absent({"downsample", "latent_downsample", "loss"});
      break;
    }
    case Role::projector: {
      m.layers = positive_int(n, "layers");
      m.hidden = positive_int(n, "hidden");
      m.ffn = n.has("ffn") ? static_cast<int>(n.at("ffn").as_int_at_least(1)) : m.hidden;
      if (auto d = n.find("downsample")) m.downsample = static_cast<int>(d->as_int_at_least(1));
      if (m.inputs.size() != 1) n.at("inputs").fail("a projector takes exactly one input module");
      require_absent({"heads", "kv_groups", "vocab", "patch_size", "embed_dim", "causal", "loss", "max_positions",
                      "max_image_size"});
      break;
    }
    case Role::llm: {
      read_transformer(n, m);
      m.vocab = positive_int(n, "vocab");
      m.causal = n.has("causal") ? n.at("causal").as_bool() : true;
      m.modality = Modality::text;
      if (auto p = n.find("max_positions")) m.max_positions = static_cast<int>(p->as_int_at_least(1));
      require_absent(
          {"patch_size", "embed_dim", "downsample", "latent_downsample", "loss", "modality", "max_image_size"});
      break;
    }
    case Role::generator: {
      std::string mod = n.at("modality").as_choice({"image"});
      m.modality = mod == "image" ? Modality::image : Modality::none;
      read_transformer(n, m);
      m.patch_size = static_cast<int>(n.at("patch_size").as_int_at_least(1));
      m.channels = n.has("channels") ? static_cast<int>(n.at("channels").as_int_at_least(1)) : 4;
      if (auto d = n.find("latent_downsample")) m.latent_downsample = static_cast<int>(d->as_int_at_least(1));
      if (m.inputs.size() != 1) n.at("inputs").fail("a generator takes exactly one input module (the llm)");
      require_absent({"vocab", "embed_dim", "downsample", "loss", "causal", "max_positions", "max_image_size"});
      break;
    }
    case Role::loss: {
      m.loss = n.at("loss").as_choice({"contrastive"});
      if (m.inputs.size() < 2) n.at("inputs").fail("a contrastive loss joins at least two encoders");
      require_absent({"layers", "hidden", "ffn", "heads", "kv_groups", "vocab", "patch_size", "embed_dim", "downsample",
                      "latent_downsample", "modality", "mlp", "causal", "dropout", "frozen", "max_positions",
                      "max_image_size"});
      break;
    }
  }
  return m;
}

// Checks the wiring between modules and decides the topology.
void check_wiring(const Node& root, ModelSpec& model) {
  const Node list = root.at("modules");
  const auto entries = list.items();
  std::set<std::string> seen;
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const auto& m = model.modules[i];
    if (!seen.insert(m.name).second) entries[i].at("name").fail("duplicate module name '" + m.name + "'");
  }
  int llms = 0, losses = 0;
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const auto& m = model.modules[i];
    for (std::size_t k = 0; k < m.inputs.size(); ++k) {
      const Node input = entries[i].at("inputs").items()[k];
      int j = model.index_of(m.inputs[k]);
      if (j < 0) input.fail("no module named '" + m.inputs[k] + "'");
      // Inputs must come earlier in the file: the list is the data-flow order, and that rules out cycles.
      if (j >= static_cast<int>(i)) input.fail("module '" + m.inputs[k] + "' must be listed before '" + m.name + "'");
      const auto& producer = model.modules[static_cast<std::size_t>(j)];
      bool ok = false;
      switch (m.role) {
        case Role::encoder:
          ok = false;
          break;
        case Role::projector:
          ok = producer.role == Role::encoder;
          break;
        case Role::llm:
          ok = producer.role == Role::projector || producer.role == Role::encoder;
          break;
        case Role::generator:
          ok = producer.role == Role::llm;
          break;
        case Role::loss:
          ok = producer.role == Role::encoder;
          break;
      }
      if (!ok) {
        input.fail(std::string("a ") + role_name(m.role) + " cannot take input from the " + role_name(producer.role) +
                   " '" + producer.name + "'");
      }
      if (m.role == Role::llm && producer.role == Role::encoder && producer.hidden != m.hidden) {
        input.fail("encoder '" + producer.name + "' (hidden " + std::to_string(producer.hidden) +
                   ") feeds the llm (hidden " + std::to_string(m.hidden) + ") without a projector");
      }
      if (m.role == Role::loss && producer.embed_dim == 0) {
        input.fail("encoder '" + producer.name + "' needs an embed_dim to feed a contrastive loss");
      }
    }
    if (m.role == Role::llm) ++llms;
    if (m.role == Role::loss) ++losses;
    if (m.role == Role::loss) {
      int dim = model.modules[static_cast<std::size_t>(model.index_of(m.inputs[0]))].embed_dim;
      for (const auto& in : m.inputs) {
        if (model.find(in)->embed_dim != dim) {
          entries[i].at("inputs").fail("encoders joined by a contrastive loss need the same embed_dim");
        }
      }
    }
    if (m.role == Role::projector) {
      for (std::size_t c = 0; c < model.modules.size(); ++c) {
        const auto& consumer = model.modules[c];
        for (const auto& in : consumer.inputs) {
          if (in == m.name && consumer.hidden != m.hidden) {
            entries[i].at("hidden").fail("projector output " + std::to_string(m.hidden) +
                                         " does not match the hidden size " + std::to_string(consumer.hidden) +
                                         " of '" + consumer.name + "'");
          }
        }
      }
    }
  }
  if (llms > 1) list.fail("a model has at most one llm module");
  if (llms == 1 && losses > 0) list.fail("a model has either an llm or a contrastive loss, not both");
  // Every non-final module must be consumed, or its work would be wasted.
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const auto& m = model.modules[i];
    if (m.role == Role::llm || m.role == Role::generator || m.role == Role::loss) continue;
    bool consumed = false;
    for (const auto& other : model.modules) {
      for (const auto& in : other.inputs) consumed = consumed || in == m.name;
    }
    if (!consumed) {
      entries[i].fail(std::string("the ") + role_name(m.role) + " '" + m.name +
                      "' feeds nothing: list it in the inputs of an llm, projector or loss");
    }
  }
  if (losses > 0) {
    model.topology = Topology::contrastive;
  } else if (llms == 1) {
    model.topology = model.modules.size() == 1 ? Topology::llm_only : Topology::chain;
  } else {
    list.fail("a model needs an llm module or a contrastive loss");
  }
}

}  // namespace

ModelSpec parse_model(const Node& root) {
  root.expect_keys({"name", "description", "modules"});
  ModelSpec model;
  model.source = root.source();
  model.name = root.at("name").as_string();
  auto entries = root.at("modules").items();
  if (entries.empty()) root.at("modules").fail("a model needs at least one module");
  for (const auto& e : entries) model.modules.push_back(parse_module(e));
  check_wiring(root, model);
  return model;
}

namespace {

// One pre-LN block: q, k, v and fc1 (weights and biases) column-parallel, attention out and fc2
// row-parallel (weights split, biases added once after the sum), both norms replicated.
ParameterCount transformer_block_parameters(const ModuleSpec& m) {
  const double h = m.hidden, f = m.ffn;
  const double kv = h * m.kv_groups / m.heads;
  const double mlp_in = m.mlp == Mlp::swiglu ? 2.0 : 1.0;  // fc1 (+ gate): one bias either way
  ParameterCount p;
  p.split = h * (h + 2 * kv) + (h + 2 * kv)  // q, k, v
            + h * h                          // attention out
            + mlp_in * h * f + f             // fc1
            + h * f;                         // fc2
  p.replicated = 2 * h + 4 * h;              // attention out and fc2 biases; ln1, ln2
  return p;
}

// A projector's linears in Megatron pairs: layer 2i column-parallel (weight and bias split),
// layer 2i + 1 row-parallel (weight split, bias replicated); a last unpaired layer row-parallel.
ParameterCount projector_parameters(const ModelSpec& model, const ModuleSpec& m) {
  const ModuleSpec* producer = model.find(m.inputs.front());
  double width = producer ? producer->hidden : m.hidden;
  ParameterCount p;
  for (int l = 0; l < m.layers; ++l) {
    const double out = (l + 1 == m.layers) ? m.hidden : m.ffn;
    const bool column = l % 2 == 0 && l + 1 < m.layers;
    p.split += width * out;
    (column ? p.split : p.replicated) += out;
    width = out;
  }
  return p;
}

}  // namespace

ParameterCount ModuleParameters::total() const {
  ParameterCount t = first;
  t += last;
  t.split += blocks * block.split;
  t.replicated += blocks * block.replicated;
  return t;
}

ModuleParameters module_parameter_split(const ModelSpec& model, const ModuleSpec& m) {
  ModuleParameters p;
  switch (m.role) {
    case Role::loss:
      p.first.replicated = 1;  // the learnable temperature
      return p;
    case Role::projector:
      p.first = projector_parameters(model, m);
      return p;
    default:
      break;
  }
  const double h = m.hidden;
  p.blocks = m.layers;
  p.block = transformer_block_parameters(m);
  // First stage: the vocabulary-parallel token table; a patchify GEMM (weight and bias) and
  // learned position tables, replicated. An image encoder has one table for patch rows and
  // one for patch columns (core/nn); a table the model file does not size is absent.
  if (m.vocab > 0) p.first.split += double(m.vocab) * h;
  if (m.patch_size > 0) p.first.replicated += double(m.patch_size) * m.patch_size * m.channels * h + h;
  p.first.replicated += double(m.max_positions) * h;
  if (m.max_image_size > 0) p.first.replicated += 2.0 * (m.max_image_size / m.patch_size) * h;
  // Last stage: the final norm; the untied vocabulary-parallel LM head, the contrastive
  // projection (no bias) or the unpatchify projection, replicated.
  p.last.replicated = 2 * h;
  if (m.role == Role::llm) p.last.split += double(m.vocab) * h;
  if (m.embed_dim > 0) p.last.replicated += h * m.embed_dim;
  if (m.role == Role::generator) p.last.replicated += double(m.patch_size) * m.patch_size * m.channels * h;
  return p;
}

double module_parameters(const ModelSpec& model, const ModuleSpec& m) {
  return module_parameter_split(model, m).total().total();
}

double model_parameters(const ModelSpec& model) {
  double total = 0;
  for (const auto& m : model.modules) total += module_parameters(model, m);
  return total;
}

}  // namespace braid::spec
