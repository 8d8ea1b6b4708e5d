#include "core/cost/cost_model.hpp"

#include <cmath>

#include "core/common/error.hpp"

namespace braid::cost {

using spec::Role;

CostModel::CostModel(const spec::RunSpec& run)
    : run_(&run), device_(run.cluster, run.training.precision), comm_(run.cluster) {
  const auto& model = run.model;
  const auto& data = run.data;
  const std::size_t n = model.modules.size();
  tokens_.assign(n, 0);
  grads_.assign(n, GradNeeds{});
  params_.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = model.modules[i];
    params_[i] = spec::module_parameters(model, m);
    double t = 0;
    switch (m.role) {
      case Role::encoder:
        if (m.modality == spec::Modality::image) {
          double side = double(data.image_resolution) / m.patch_size;
          t = side * side;
        } else if (m.modality == spec::Modality::text) {
          t = data.text_tokens;
        } else {
          t = data.audio_tokens;
        }
        break;
      case Role::projector:
        t = std::ceil(tokens_[static_cast<std::size_t>(model.index_of(m.inputs.front()))] / m.downsample);
        break;
      case Role::llm:
        t = data.text_tokens;
        for (const auto& in : m.inputs) t += tokens_[static_cast<std::size_t>(model.index_of(in))];
        break;
      case Role::generator: {
        double side = double(data.generated_image_resolution) / (m.latent_downsample * m.patch_size);
        t = side * side;
        break;
      }
      case Role::loss:
        t = 1;
        break;
    }
    tokens_[i] = t;
    // Backward runs where the module trains, or where an upstream module trains.
    bool upstream = false;
    for (const auto& in : m.inputs) {
      const auto& g = grads_[static_cast<std::size_t>(model.index_of(in))];
      upstream = upstream || g.any();
    }
    bool trains = !m.frozen && m.role != Role::loss;
    grads_[i] = GradNeeds{trains, upstream};
  }
  // Model FLOPs per sample, from the same blocks the planner uses, at TP=1.
  for (std::size_t i = 0; i < n; ++i) {
    if (model.modules[i].role == Role::loss) continue;
    const ModuleCost& c = module(static_cast<int>(i), 1, 1);
    BlockCost all = c.stage(c.layers, true, true);
    model_flops_per_sample_ += all.flops_forward + all.flops_backward;
  }
}

const ModuleCost& CostModel::module(int m, int tp, int samples) const {
  return module(m, tp, samples, group_shape(0, 1, tp, run_->cluster.devices_per_node));
}

const ModuleCost& CostModel::module(int m, int tp, int samples, const GroupShape& g) const {
  auto key = std::make_tuple(m, tp, samples, g.nodes, g.per_node);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  return cache_.emplace(key, build(m, tp, samples, g)).first->second;
}

ModuleCost CostModel::build(int mi, int tp, int samples, const GroupShape& tp_group) const {
  const auto& model = run_->model;
  const auto& m = model.modules[static_cast<std::size_t>(mi)];
  if (tp < 1) throw Error(Status::internal, "tensor-parallel width must be positive");
  BlockContext ctx{&device_, &comm_, &run_->training, tp, tp_group, grads(mi)};
  const double s = tokens(mi), b = samples, E = device_.element_bytes();
  ModuleCost c;
  switch (m.role) {
    case Role::encoder:
      c.layers = m.layers;
      c.layer = transformer_layer(m, s, b, ctx);
      c.first = m.modality == spec::Modality::image ? patch_embedding(m, s, b, ctx) : token_embedding(m, s, b, ctx);
      if (m.embed_dim > 0) c.last = embedding_projection(m, b, ctx);
      c.output_bytes = m.embed_dim > 0 ? b * m.embed_dim * E : b * s * m.hidden * E;
      break;
    case Role::projector: {
      const auto& producer = model.modules[static_cast<std::size_t>(model.index_of(m.inputs.front()))];
      // Projectors are small: their work is priced as if each TP rank ran all of it.
      BlockContext whole = ctx;
      whole.tp = 1;
      c.first = linear_stack(m, producer.hidden, s, b, whole);
      c.output_bytes = b * s * m.hidden * E;
      break;
    }
    case Role::llm:
      c.layers = m.layers;
      c.layer = transformer_layer(m, s, b, ctx);
      c.first = token_embedding(m, double(run_->data.text_tokens), b, ctx);
      c.last = lm_head(m, s, b, ctx);
      c.output_bytes = b * s * m.hidden * E;
      break;
    case Role::generator:
      c.layers = m.layers;
      c.layer = transformer_layer(m, s, b, ctx);
      c.first = patch_embedding(m, s, b, ctx);
      c.last = generator_head(m, s, b, ctx);
      c.output_bytes = 0;
      break;
    case Role::loss:
      return c;  // computed where its inputs are: no placement, nothing held
  }
  // What this device holds: the reference models' tensors, split ones over the TP group.
  // The projector's too (Megatron pairs), though its work above is priced whole.
  const spec::ModuleParameters held = spec::module_parameter_split(model, m);
  c.layer.parameters = held.block.per_rank(tp);
  c.first.parameters = held.first.per_rank(tp);
  c.last.parameters = held.last.per_rank(tp);
  return c;
}

std::vector<LayerKernel> CostModel::layer_kernels(int mi, int tp, int samples) const {
  const auto& m = run_->model.modules[static_cast<std::size_t>(mi)];
  if (m.role == Role::projector || m.role == Role::loss || tp < 1)
    throw Error(Status::internal, m.name + " has no transformer layers to split into kernels");
  BlockContext ctx{&device_, &comm_, &run_->training, tp, group_shape(0, 1, tp, run_->cluster.devices_per_node),
                   grads(mi)};
  return transformer_layer_kernels(m, tokens(mi), samples, ctx);
}

StateBytes CostModel::state_bytes(int m, int dp) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  const int zero = run_->training.zero_stage;
  const bool mixed = run_->training.precision != spec::Precision::fp32;
  // Mixed precision (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1): 2-byte weights and
  // gradients, 12 bytes of fp32 master weights + Adam moments. fp32: 4 + 4 + 8.
  StateBytes s;
  s.weights = mixed ? 2 : 4;
  if (mod.frozen || mod.role == Role::loss) return s;
  s.gradients = mixed ? 2 : 4;
  s.optimizer = mixed ? 12 : 8;
  if (zero >= 1) s.optimizer /= dp;
  if (zero >= 2) s.gradients /= dp;
  if (zero >= 3) s.weights /= dp;
  return s;
}

double CostModel::optimizer_seconds(int m, double params, int dp) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  if (mod.frozen) return 0;
  const bool mixed = run_->training.precision != spec::Precision::fp32;
  double local = run_->training.zero_stage >= 1 ? params / dp : params;
  // AdamW reads master weight, moments and gradient, writes them back (+ the bf16 copy).
  double bytes = mixed ? 28 : 32;
  return device_.memory_seconds(local * bytes);
}

double CostModel::gradient_sync_seconds(int m, double params, const GroupShape& dp_group) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  if (mod.frozen || dp_group.size <= 1) return 0;
  const double bytes = params * device_.element_bytes();
  switch (run_->training.zero_stage) {
    case 0:
      return comm_.all_reduce(bytes, dp_group);
    case 1:
      return comm_.reduce_scatter(bytes, dp_group) + comm_.all_gather(bytes, dp_group);
    case 2:
      return comm_.all_gather(bytes, dp_group);
    default:
      return 0;
  }
}

double CostModel::sharded_traffic_seconds(int m, double params, const GroupShape& dp_group) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  const int zero = run_->training.zero_stage;
  if (dp_group.size <= 1 || zero < 2) return 0;
  const double bytes = params * device_.element_bytes();
  double t = mod.frozen ? 0 : comm_.reduce_scatter(bytes, dp_group);
  if (zero == 3) t += 2 * comm_.all_gather(bytes, dp_group);
  return t;
}

}  // namespace braid::cost
