#include "core/nn/modules/model.hpp"

#include <string>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

using spec::ModuleSpec;
using spec::Role;

// "file:line:col: model.modules[i].field: message", as the spec reader words its errors.
[[noreturn]] void fail(const ModuleSpec& m, const std::string& field, Status status, const std::string& message) {
  std::string path = m.path.empty() ? "module '" + m.name + "'" : m.path;
  if (!field.empty()) path += "." + field;
  throw Error(status, (m.where.empty() ? std::string() : m.where + ": ") + path + ": " + message);
}

void check_supported(const ModuleSpec& m) {
  const std::string who = std::string("the reference ") + spec::role_name(m.role) + " '" + m.name + "'";
  if (m.role == Role::generator)
    fail(m, "role", Status::unsupported, "the reference models have no generator (planning handles it)");
  if (m.role == Role::encoder && m.modality == spec::Modality::audio)
    fail(m, "modality", Status::unsupported, "the reference models have image and text encoders, no audio encoder");
  if (m.role == Role::encoder || m.role == Role::llm) {
    if (m.mlp != spec::Mlp::gelu) fail(m, "mlp", Status::unsupported, who + " has a GELU MLP only, not swiglu");
    if (m.kv_groups != m.heads)
      fail(m, "kv_groups", Status::unsupported,
           who + " has plain multi-head attention: kv_groups must equal heads (" + std::to_string(m.heads) + ")");
    if (m.dropout > 0) fail(m, "dropout", Status::unsupported, who + " has no dropout: remove it or set 0");
  }
  if (m.role == Role::projector && m.downsample != 1)
    fail(m, "downsample", Status::unsupported, who + " maps every token: downsample must be 1");
  if (m.role == Role::llm && !m.causal)
    fail(m, "causal", Status::unsupported, who + " is a causal decoder trained on next tokens");
}

void require(const ModuleSpec& m, int value, const char* field, const std::string& what) {
  if (value <= 0)
    fail(m, field, Status::bad_config,
         std::string("missing: the reference ") + spec::role_name(m.role) + " '" + m.name + "' needs " + field + " (" +
             what + ")");
}

TransformerShape transformer_shape(const ModuleSpec& m) { return {m.hidden, m.heads, m.ffn, m.layers, m.causal}; }

std::unique_ptr<ImageEncoder> make_image_encoder(ParameterStore& store, const ModuleSpec& m) {
  return std::make_unique<ImageEncoder>(
      store, m.name, ImageEncoderShape{transformer_shape(m), m.patch_size, m.channels, m.max_image_size}, m.frozen);
}

std::unique_ptr<TextEncoder> make_text_encoder(ParameterStore& store, const ModuleSpec& m) {
  return std::make_unique<TextEncoder>(store, m.name, TextEncoderShape{transformer_shape(m), m.vocab, m.max_positions},
                                       m.frozen);
}

void build_clip(const spec::ModelSpec& spec, Model& model) {
  auto clip = std::make_unique<ClipModel>();
  for (const auto& m : spec.modules) {
    if (m.role == Role::loss) {
      clip->loss = std::make_unique<ContrastiveLoss>(model.store, m.name);
    } else if (m.role == Role::encoder && m.modality == spec::Modality::image) {
      clip->image_encoder = make_image_encoder(model.store, m);
      clip->image_head = std::make_unique<ClipHead>(model.store, m.name + ".proj", m.hidden, m.embed_dim, m.frozen);
    } else if (m.role == Role::encoder && m.modality == spec::Modality::text) {
      clip->text_encoder = make_text_encoder(model.store, m);
      clip->text_head = std::make_unique<ClipHead>(model.store, m.name + ".proj", m.hidden, m.embed_dim, m.frozen);
    }
  }
  model.clip = std::move(clip);
}

void build_chain(const spec::ModelSpec& spec, Model& model) {
  auto chain = std::make_unique<ChainModel>();
  for (const auto& m : spec.modules) {
    if (m.role == Role::encoder) {
      chain->vision = make_image_encoder(model.store, m);
    } else if (m.role == Role::projector) {
      const ModuleSpec* producer = spec.find(m.inputs.front());
      chain->projector =
          std::make_unique<Projector>(model.store, m.name, producer->hidden, m.ffn, m.hidden, m.layers, m.frozen);
    } else if (m.role == Role::llm) {
      chain->llm = std::make_unique<Decoder>(model.store, m.name,
                                             DecoderShape{transformer_shape(m), m.vocab, m.max_positions}, m.frozen);
    }
  }
  model.chain = std::move(chain);
}

}  // namespace

Model build_model(const spec::ModelSpec& spec, std::uint64_t seed) {
  // Every refusal before the first allocation.
  for (const auto& m : spec.modules) {
    check_supported(m);
    if (m.role == Role::loss &&
        (m.inputs.size() != 2 || spec.find(m.inputs[0])->modality == spec.find(m.inputs[1])->modality))
      fail(m, "inputs", Status::unsupported, "the reference CLIP joins one image encoder and one text encoder");
    if (m.role == Role::llm && m.inputs.size() > 1)
      fail(m, "inputs", Status::unsupported, "the reference MLLM takes one input path (an image encoder)");
    if (spec.topology != spec::Topology::contrastive && m.role == Role::encoder && m.modality != spec::Modality::image)
      fail(m, "modality", Status::unsupported, "the reference MLLM's encoder is an image encoder");
    if (m.role == Role::encoder && m.modality == spec::Modality::image)
      require(m, m.max_image_size, "max_image_size", "the largest image side in pixels, for its position tables");
    if ((m.role == Role::encoder && m.modality == spec::Modality::text) || m.role == Role::llm)
      require(m, m.max_positions, "max_positions",
              m.role == Role::llm ? "prefix (image) tokens + text tokens, for its position table"
                                  : "the longest token sequence, for its position table");
  }
  Model model;
  model.topology = spec.topology;
  model.store = ParameterStore(seed);
  if (spec.topology == spec::Topology::contrastive)
    build_clip(spec, model);
  else
    build_chain(spec, model);
  return model;
}

float ClipModel::step(Ops& ops, const Tensor& images, const Tokens& text, bool backward) const {
  if (images.rank() != 4 || images.dim(0) != text.batch)
    throw Error(Status::invalid_argument,
                "clip step: " + shape_string(images.shape) + " images for " + std::to_string(text.batch) + " captions");
  ImageEncoderCache image_cache;
  ClipHeadCache image_head_cache;
  const EncoderOutput image_out = image_encoder->forward(ops, images, image_cache);
  const Tensor image_embeddings = image_head->forward(ops, image_out.pooled, image_head_cache);
  TextEncoderCache text_cache;
  ClipHeadCache text_head_cache;
  const EncoderOutput text_out = text_encoder->forward(ops, text, text_cache);
  const Tensor text_embeddings = text_head->forward(ops, text_out.pooled, text_head_cache);

  ContrastiveGrads grads;
  const float value = loss->loss(ops, image_embeddings, text_embeddings, image_embeddings, text_embeddings, 0,
                                 backward ? &grads : nullptr);
  if (!backward) return value;
  // One process: the gathered rows are the local rows, so their gradients add up.
  ops.add(grads.local_image, grads.all_image);
  ops.add(grads.local_text, grads.all_text);
  if (!image_encoder->frozen()) {
    const Tensor d_pooled = image_head->backward(ops, grads.local_image, image_head_cache);
    image_encoder->backward(ops, nullptr, &d_pooled, image_cache);
  }
  if (!text_encoder->frozen()) {
    const Tensor d_pooled = text_head->backward(ops, grads.local_text, text_head_cache);
    text_encoder->backward(ops, nullptr, &d_pooled, text_cache);
  }
  return value;
}

float ChainModel::step(Ops& ops, const Tensor* images, const Tokens& text, int64_t normalizer, bool backward) const {
  if (vision && !images)
    throw Error(Status::invalid_argument, "mllm step: the model has an image encoder: give images");
  if (!vision && images)
    throw Error(Status::invalid_argument, "mllm step: images given to a model without an image encoder");
  ImageEncoderCache vision_cache;
  ProjectorCache projector_cache;
  Tensor prefix;
  if (vision) {
    prefix = vision->forward(ops, *images, vision_cache).tokens;
    if (projector) prefix = projector->forward(ops, prefix, projector_cache);
  }
  DecoderCache llm_cache;
  const Tensor logits = llm->forward(ops, vision ? &prefix : nullptr, text, llm_cache);
  Tensor dlogits;
  const float value = lm_loss(ops, logits, text, normalizer, backward ? &dlogits : nullptr);
  if (!backward) return value;
  Tensor d_prefix = llm->backward(ops, dlogits, llm_cache);
  const bool vision_trains = vision && !vision->frozen();
  if (projector && (vision_trains || !projector->frozen()))
    d_prefix = projector->backward(ops, d_prefix, projector_cache, vision_trains);
  if (vision_trains) vision->backward(ops, &d_prefix, nullptr, vision_cache);
  return value;
}

void Model::set_recompute(spec::Recompute recompute) {
  if (clip) {
    clip->image_encoder->set_recompute(recompute);
    clip->text_encoder->set_recompute(recompute);
  }
  if (chain) {
    if (chain->vision) chain->vision->set_recompute(recompute);
    chain->llm->set_recompute(recompute);
  }
}

}  // namespace braid::nn
