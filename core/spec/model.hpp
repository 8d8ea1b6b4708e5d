// What the user describes: the submodules of a multimodal model and how they connect.
#pragma once

#include <string>
#include <vector>

#include "core/spec/yaml_reader.hpp"

namespace braid::spec {

enum class Role { encoder, projector, llm, generator, loss };
enum class Modality { none, image, text, audio };
enum class Mlp { gelu, swiglu };

// How the modules connect, which decides which layouts apply.
enum class Topology {
  llm_only,     // a single language model
  chain,        // encoders -> projectors -> llm [-> generators]
  contrastive,  // parallel encoders joined by a contrastive loss (CLIP)
};

const char* role_name(Role role);
const char* modality_name(Modality modality);
const char* topology_name(Topology topology);

struct ModuleSpec {
  std::string name;
  Role role = Role::encoder;
  Modality modality = Modality::none;
  // Transformer shape (encoders, llm, generator). A projector is an MLP of `layers`
  // linear layers: producer hidden -> ffn -> ... -> hidden.
  int layers = 0;
  int hidden = 0;
  int ffn = 0;
  int heads = 0;
  int kv_groups = 0;  // grouped-query attention; == heads for plain multi-head attention
  Mlp mlp = Mlp::gelu;
  bool causal = false;
  double dropout = 0.0;
  int vocab = 0;       // text embedding / LM head size
  int patch_size = 0;  // image encoders and generators
  int channels = 3;    // image channels (generators: latent channels)
  int embed_dim = 0;   // contrastive embedding width (output projection)
  int downsample = 1;  // projector: input tokens per output token
  // Sizes of learned position tables, needed only by the reference models (core/nn):
  // 0 when not given. Text encoders and the llm: positions per sequence (for the llm,
  // image tokens + text tokens); image encoders: the largest image side in pixels.
  int max_positions = 0;
  int max_image_size = 0;
  int latent_downsample = 8;  // generator: VAE spatial reduction
  bool frozen = false;
  std::string loss;  // role loss: "contrastive"
  std::vector<std::string> inputs;
  std::string where;  // "file:line:col" of the module entry, for messages raised later
  std::string path;   // its field path, e.g. "model.modules[0]", for the same messages
};

struct ModelSpec {
  std::string name;
  std::string source;
  std::vector<ModuleSpec> modules;
  Topology topology = Topology::llm_only;

  const ModuleSpec* find(const std::string& name) const;
  int index_of(const std::string& name) const;  // -1 when absent
  // Index of the llm module, or -1.
  int llm_index() const;
};

ModelSpec parse_model(const Node& root);

// Parameters as Megatron tensor parallelism places them: `split` are sharded over the TP
// group (each rank holds split / tp of them), `replicated` are whole on every rank.
struct ParameterCount {
  double split = 0;
  double replicated = 0;

  double total() const { return split + replicated; }
  // What one rank of a TP group of `tp` holds.
  double per_rank(int tp) const { return split / tp + replicated; }
  ParameterCount& operator+=(const ParameterCount& o) {
    split += o.split;
    replicated += o.replicated;
    return *this;
  }
};

// A module's parameters by the pipeline stage that holds them, tensor by tensor as the
// reference models (core/nn) build and shard them: `block` in each of its `blocks`
// transformer blocks, `first` with its first stage (token table, patch embedding, position
// tables; the whole of a projector; a loss's temperature), `last` with its last stage (final
// norm, LM head, contrastive projection, unpatchify). The one count behind
// module_parameters and the cost model's per-device weights, gradients and optimizer state.
struct ModuleParameters {
  int blocks = 0;
  ParameterCount block, first, last;

  ParameterCount total() const;
};
ModuleParameters module_parameter_split(const ModelSpec& model, const ModuleSpec& module);

// Parameter counts (whole module, unsharded), for memory and reports.
double module_parameters(const ModelSpec& model, const ModuleSpec& module);
double model_parameters(const ModelSpec& model);

}  // namespace braid::spec
