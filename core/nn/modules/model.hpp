// The reference models built from a model file (core/spec): a CLIP-like dual encoder
// (image encoder + text encoder + contrastive loss) or an MLLM chain (image encoder ->
// projector -> decoder LLM, or the LLM alone).
//
// build_model reads what the planner reads plus the position-table sizes only the
// reference models need (max_image_size, max_positions), and refuses, naming the file,
// line and field, what they do not implement (SwiGLU, grouped-query attention, dropout,
// token downsampling, audio encoders, generators).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/modules/clip.hpp"
#include "core/nn/modules/decoder.hpp"
#include "core/nn/modules/image_encoder.hpp"
#include "core/nn/modules/projector.hpp"
#include "core/nn/modules/text_encoder.hpp"
#include "core/spec/model.hpp"

namespace braid::nn {

struct ClipModel {
  std::unique_ptr<ImageEncoder> image_encoder;
  std::unique_ptr<ClipHead> image_head;
  std::unique_ptr<TextEncoder> text_encoder;
  std::unique_ptr<ClipHead> text_head;
  std::unique_ptr<ContrastiveLoss> loss;

  // One process, one batch: images (B, C, H, W) and their captions (B sequences). Returns
  // the CLIP loss; with `backward`, adds every trainable parameter's gradient.
  float step(Ops& ops, const Tensor& images, const Tokens& text, bool backward) const;
};

struct ChainModel {
  std::unique_ptr<ImageEncoder> vision;  // null for a language model alone
  std::unique_ptr<Projector> projector;  // null when the encoder feeds the llm directly
  std::unique_ptr<Decoder> llm;

  // One process, one batch: images (B, C, H, W) (null without a vision encoder) and texts
  // (B sequences). Returns the LM loss over the text positions divided by `normalizer`
  // (0: their count here); with `backward`, adds every trainable parameter's gradient.
  float step(Ops& ops, const Tensor* images, const Tokens& text, int64_t normalizer, bool backward) const;
};

struct Model {
  spec::Topology topology = spec::Topology::llm_only;
  ParameterStore store;               // every parameter, in the model file's module order
  std::unique_ptr<ClipModel> clip;    // contrastive topology
  std::unique_ptr<ChainModel> chain;  // chain and llm_only topologies

  const std::vector<Parameter*>& parameters() const { return store.all(); }
  // Every transformer block's recomputation (TransformerBlock::set_recompute).
  void set_recompute(spec::Recompute recompute);
};

// Builds and initialises the model; the same (spec, seed) gives the same weights on every
// rank. Throws Error(bad_config) for a missing field, Error(unsupported) for a feature the
// reference models lack, each with the module's file:line:column and field.
Model build_model(const spec::ModelSpec& spec, std::uint64_t seed);

}  // namespace braid::nn
