#include "core/cost/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"

namespace braid::cost {

using spec::Role;

std::vector<TrainedSample> at_sides(const std::vector<int>& sides) {
  std::vector<TrainedSample> out;
  for (int side : sides) out.push_back({side, 0});
  return out;
}

CostModel::CostModel(const spec::RunSpec& run) : CostModel(run, TrainedSamples{}) {}

CostModel::CostModel(const spec::RunSpec& run, TrainedSamples trained, Kernels kernels)
    : run_(&run),
      device_(run.cluster, run.training.precision, run.training.fp8),
      comm_(run.cluster),
      trained_(std::move(trained)),
      kernels_(kernels) {
  const auto& model = run.model;
  const auto& data = run.data;
  const std::size_t n = model.modules.size();
  tokens_.assign(n, 0);
  grads_.assign(n, GradNeeds{});
  params_.assign(n, 0);
  sees_images_.assign(n, false);
  sees_text_.assign(n, false);
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
    // A generator's tokens come from the image it generates, not from the input images.
    sees_images_[i] = m.role == Role::encoder && m.modality == spec::Modality::image;
    sees_text_[i] = (m.role == Role::encoder && m.modality == spec::Modality::text) || m.role == Role::llm;
    if (m.role != Role::loss && m.role != Role::generator)
      for (const auto& in : m.inputs)
        sees_images_[i] = sees_images_[i] || sees_images_[static_cast<std::size_t>(model.index_of(in))];
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
  return cache_.emplace(key, by_sample(m) ? build_by_sample(m, tp, samples, g) : build(m, tp, samples, g))
      .first->second;
}

bool CostModel::by_sample(int m) const {
  const auto i = static_cast<std::size_t>(m);
  return !trained_.samples.empty() && (sees_images_[i] || sees_text_[i]);
}

std::vector<std::map<int, std::pair<int, int>>> CostModel::microbatch_passes(int m, int samples) const {
  // Up to 64 microbatches of consecutive samples: enough for a mean within a few percent.
  constexpr std::size_t kMicrobatches = 64;
  const bool images = sees_images_[static_cast<std::size_t>(m)], text = sees_text_[static_cast<std::size_t>(m)];
  const auto& trained = trained_.samples;
  const std::size_t per = static_cast<std::size_t>(std::max(1, samples));
  std::vector<std::map<int, std::pair<int, int>>> out;
  for (std::size_t start = 0; start + per <= trained.size() && out.size() < kMicrobatches; start += per) {
    // Side (0: one pass whatever the images) -> samples of this microbatch at it, and their
    // longest caption (0: the nominal text, for a module that sees none).
    auto& passes = out.emplace_back();
    for (std::size_t i = start; i < start + per; ++i) {
      auto& [members, longest] = passes[images ? trained[i].side : 0];
      ++members;
      if (text) longest = std::max(longest, trained[i].caption);
    }
  }
  return out;
}

std::size_t CostModel::most_passes(int m, int samples) const {
  std::size_t most = 1;
  if (by_sample(m))
    for (const auto& passes : microbatch_passes(m, samples)) most = std::max(most, passes.size());
  return most;
}

std::size_t CostModel::for_each_pass(
    int m, int samples,
    const std::function<void(const CostModel& at_size, int members, std::size_t microbatch)>& visit) const {
  const auto microbatches = microbatch_passes(m, samples);
  for (std::size_t count = 0; count < microbatches.size(); ++count) {
    for (const auto& [side, pass] : microbatches[count]) {
      const CostModel* at_size = nullptr;
      {
        std::lock_guard<std::mutex> lock(size_mutex_);
        auto& slot = at_size_[{side, pass.second}];
        if (!slot.second) {
          slot.first = std::make_unique<spec::RunSpec>(*run_);
          if (side > 0) slot.first->data.image_resolution = side;
          if (pass.second > 0) slot.first->data.text_tokens = pass.second;
          slot.second = std::make_unique<CostModel>(*slot.first, TrainedSamples{}, kernels_);
        }
        at_size = slot.second.get();
      }
      visit(*at_size, pass.first, count);
    }
  }
  return microbatches.size();
}

ModuleCost CostModel::build_by_sample(int mi, int tp, int samples, const GroupShape& tp_group) const {
  ModuleCost mean;
  // Activations are kept for the largest microbatch, not the mean one: per microbatch, the
  // sum of its passes'; the most of any.
  std::size_t current = 0;
  double layer = 0, first = 0, last = 0, most_layer = 0, most_first = 0, most_last = 0;
  double recomputed = 0, most_recomputed = 0;  // ... and of what one layer's recomputation holds
  const std::size_t count = for_each_pass(mi, samples, [&](const CostModel& at_side, int n, std::size_t microbatch) {
    if (microbatch != current) {
      current = microbatch;
      layer = first = last = recomputed = 0;
    }
    const ModuleCost& pass = at_side.module(mi, tp, n, tp_group);
    mean.layers = pass.layers;
    mean.layer += pass.layer;
    mean.first += pass.first;
    mean.last += pass.last;
    mean.output_bytes += pass.output_bytes;
    most_layer = std::max(most_layer, layer += pass.layer.activation_bytes);
    most_first = std::max(most_first, first += pass.first.activation_bytes);
    most_last = std::max(most_last, last += pass.last.activation_bytes);
    most_recomputed = std::max(most_recomputed, recomputed += pass.layer.recompute_bytes);
  });
  if (count == 0) return build(mi, tp, samples, tp_group);  // fewer trained sides than one microbatch
  const double w = 1.0 / static_cast<double>(count);
  mean.layer = mean.layer.times(w);
  mean.first = mean.first.times(w);
  mean.last = mean.last.times(w);
  mean.output_bytes *= w;
  mean.layer.activation_bytes = most_layer;
  mean.first.activation_bytes = most_first;
  mean.last.activation_bytes = most_last;
  mean.recompute_bytes_all_passes = most_recomputed;
  // What a device holds does not depend on the images: the nominal build's parameters.
  const ModuleCost held = build(mi, tp, samples, tp_group);
  mean.layer.parameters = held.layer.parameters;
  mean.first.parameters = held.first.parameters;
  mean.last.parameters = held.last.parameters;
  return mean;
}

ModuleCost CostModel::build(int mi, int tp, int samples, const GroupShape& tp_group) const {
  const auto& model = run_->model;
  const auto& m = model.modules[static_cast<std::size_t>(mi)];
  if (tp < 1) throw Error(Status::internal, "tensor-parallel width must be positive");
  BlockContext ctx{&device_, &comm_, &run_->training, tp, tp_group, grads(mi), kernels_};
  const double s = tokens(mi), b = samples, E = device_.element_bytes();
  ModuleCost c;
  switch (m.role) {
    case Role::encoder: {
      const bool image = m.modality == spec::Modality::image;
      c.layers = m.layers;
      c.layer = transformer_layer(m, s, b, ctx);
      c.first = image ? patch_embedding(m, s, b, ctx) : token_embedding(m, s, b, ctx);
      c.first += position_tables(image ? 2 : 1, s, b, m.hidden, ctx);  // an image's row and column tables
      c.last = encoder_tail(m, s, b, ctx);
      if (m.embed_dim > 0) c.last += embedding_projection(m, b, ctx);
      c.output_bytes = m.embed_dim > 0 ? b * m.embed_dim * E : b * s * m.hidden * E;
      break;
    }
    case Role::projector: {
      const auto& producer = model.modules[static_cast<std::size_t>(model.index_of(m.inputs.front()))];
      // Projectors are small: their work is priced as if each TP rank ran all of it.
      BlockContext whole = ctx;
      whole.tp = 1;
      c.first = linear_stack(m, producer.hidden, s, b, whole);
      c.output_bytes = b * s * m.hidden * E;
      break;
    }
    case Role::llm: {
      const double text = run_->data.text_tokens;
      c.layers = m.layers;
      c.layer = transformer_layer(m, s, b, ctx);
      c.first = token_embedding(m, text, b, ctx);
      c.first += decoder_input(s, text, b, m.hidden, ctx);
      c.first += position_tables(1, s, b, m.hidden, ctx);
      c.last = lm_head(m, s, text, b, ctx);
      c.output_bytes = b * s * m.hidden * E;
      break;
    }
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
  c.recompute_bytes_all_passes = c.layer.recompute_bytes;
  return c;
}

const CostModel& CostModel::colocated_encoder_model() const {
  if (kernels_ != Kernels::reference || !run_->training.sequence_parallel) return *this;
  std::lock_guard<std::mutex> lock(whole_sequences_mutex_);
  auto& [run, model] = whole_sequences_;
  if (!model) {
    run = std::make_unique<spec::RunSpec>(*run_);
    run->training.sequence_parallel = false;
    run->training.tp_comm_overlap = false;  // userbuffers need sequence parallelism
    model = std::make_unique<CostModel>(*run, trained_, kernels_);
  }
  return *model;
}

std::vector<LayerKernel> CostModel::layer_kernels(int mi, int tp, int samples) const {
  const auto& m = run_->model.modules[static_cast<std::size_t>(mi)];
  if (m.role == Role::projector || m.role == Role::loss || tp < 1)
    throw Error(Status::internal, m.name + " has no transformer layers to split into kernels");
  if (by_sample(mi)) {
    std::vector<LayerKernel> mean;
    const std::size_t count = for_each_pass(mi, samples, [&](const CostModel& at_side, int n, std::size_t) {
      const auto pass = at_side.layer_kernels(mi, tp, n);
      if (mean.empty()) mean = std::vector<LayerKernel>(pass.size());
      for (std::size_t k = 0; k < pass.size(); ++k) {
        mean[k].name = pass[k].name;
        mean[k].communication = pass[k].communication;
        mean[k].cost += pass[k].cost;
      }
    });
    for (auto& k : mean) k.cost = k.cost.times(1.0 / static_cast<double>(count));
    if (count > 0) return mean;
  }
  BlockContext ctx{&device_,  &comm_,  &run_->training, tp, group_shape(0, 1, tp, run_->cluster.devices_per_node),
                   grads(mi), kernels_};
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

StateBytes CostModel::in_instruction_bytes(int m, int samples, int layers, double layer_params, double rest_params,
                                           int dp) const {
  const int zero = run_->training.zero_stage;
  const StateBytes whole = state_bytes(m, 1);
  StateBytes s;
  if (zero < 2 || dp <= 1 || whole.gradients == 0) return s;  // frozen: neither sharded nor gathered
  const double layer = layers > 0 ? layer_params : 0, part = layers * layer + rest_params;
  double weights = std::max(layer, rest_params), gradients = weights;  // one unit at a time
  if (kernels_ == Kernels::reference) {
    // A stage-3 backward gathers every unit as it starts. A unit's gradient is reduced after its
    // last call of the instruction: with one call (one image side) the rest's, held through the
    // call, and one layer's at a time; with several, the whole part's.
    weights = part;
    gradients = most_passes(m, samples) > 1 ? part : rest_params + layer;
  }
  s.gradients = gradients * whole.gradients;
  if (zero >= 3) s.weights = weights * whole.weights;
  return s;
}

CostModel::HeldBeside CostModel::held_beside(int m, int samples) const {
  if (kernels_ != Kernels::reference) return {};
  return {true, most_passes(m, samples) > 1};
}

CostModel::CollectiveBuffers CostModel::collective_buffer_bytes(int m, int layers, double layer_params,
                                                                double rest_params, int dp) const {
  const int zero = run_->training.zero_stage;
  CollectiveBuffers b;
  // Without ZeRO the all-reduce sums the gradients where they lie, laid out end to end
  // (train::post_allreduce_gradients), as Megatron's contiguous buffer does: nothing beside.
  if (kernels_ != Kernels::reference || dp <= 1 || zero == 0 || state_bytes(m, 1).gradients == 0) return b;
  const auto unit = [dp](double params) {
    const double shard = std::ceil(params / dp);
    return params > 0 ? (shard * dp + shard) * sizeof(float) : 0.0;
  };
  const double layer = layers > 0 ? unit(layer_params) : 0.0, rest = unit(rest_params);
  if (zero >= 2) b.inside = std::max(layer, rest);
  if (zero <= 2) b.step_end = std::max(layer, rest);
  return b;
}

double adamw_bytes_per_parameter(spec::Precision precision) {
  // AdamW reads master weight, moments and gradient, writes them back (+ the bf16 copy).
  return precision == spec::Precision::fp32 ? 32 : 28;
}

double CostModel::optimizer_seconds(int m, double params, int dp) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  if (mod.frozen) return 0;
  double local = run_->training.zero_stage >= 1 ? params / dp : params;
  double s = device_.optimizer_memory_seconds(local * adamw_bytes_per_parameter(run_->training.precision));
  if (kernels_ == Kernels::reference) {  // the trainer's gradient norm and zeroing, a pass each over its gradients
    s += squared_norm_seconds(params, kernel_context()) + zero_seconds(params, kernel_context());
  }
  return s;
}

double CostModel::data_seconds(const std::vector<int>& rendered_sides, std::int64_t described) const {
  const spec::SampleRates& d = run_->cluster.data;
  double s = d.describe_sample_s * static_cast<double>(described);
  for (int side : rendered_sides) s += d.render_sample_s + d.render_pixel_s * double(side) * side;
  return s;
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

double CostModel::param_gather_seconds(int m, double params, const GroupShape& dp_group) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  const int zero = run_->training.zero_stage;
  if (mod.frozen || dp_group.size <= 1 || zero < 1 || zero > 2) return 0;
  return comm_.all_gather(params * device_.element_bytes(), dp_group);
}

double CostModel::sharded_traffic_seconds(int m, double params, const GroupShape& dp_group) const {
  const auto& mod = run_->model.modules[static_cast<std::size_t>(m)];
  const int zero = run_->training.zero_stage;
  // A frozen module is not sharded (state_bytes keeps its whole weights; the trainer makes it
  // no ZeRO units): nothing to gather, no gradient to reduce.
  if (mod.frozen || dp_group.size <= 1 || zero < 2) return 0;
  const double bytes = params * device_.element_bytes();
  double t = comm_.reduce_scatter(bytes, dp_group);
  if (zero == 3) t += 2 * comm_.all_gather(bytes, dp_group);
  return t;
}

}  // namespace braid::cost
