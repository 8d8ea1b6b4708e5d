// The encoder work of one rank of a colocated (Optimus) plan: the bubble scheduler's
// EncoderTask instructions, run kernel by kernel (the embedding, each layer's norm, QKV,
// attention, output projection and MLP kernels, the final norm; forward, and backward in
// reverse) on this rank's encoder microbatches.
//
// Whose samples: as the scheduler lays them out (bubble::Colocated), the stages of the llm
// pipeline are the encoder's lanes, and each lane encodes the samples of its own llm
// microbatches (of the stage replica's llm replica), cut in order into the encoder's K
// microbatches. When the llm's TP group holds several encoder replicas (encoder tp below the
// llm's), each takes every c-th sample of those microbatches. Outputs go into the step's
// TokenStore, from which the llm's first stage takes them (the ordering messages of the
// program carry them between ranks); gradients come back the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/bubble/encoder_tasks.hpp"
#include "core/cost/cost_model.hpp"
#include "core/data/shapes.hpp"
#include "core/nn/modules/image_encoder.hpp"
#include "core/pipeline/program.hpp"
#include "core/train/token_store.hpp"

namespace braid::train {

class ColocatedEncoder {
 public:
  // `share` of `shares`: this rank's encoder replica among those of its llm TP group.
  // Throws Error(unsupported) for what the reference encoder does not run this way (several
  // encoders, an encoder pipeline, llm microbatches that do not split over the lanes).
  ColocatedEncoder(const bubble::Colocated& layout, int stage, const pipeline::StageProgram& program,
                   const nn::ImageEncoder& vision, nn::Ops& ops, std::int64_t llm_microbatch, int share, int shares);

  // The llm microbatches this rank encodes (in full or its share), ascending.
  const std::vector<int>& lane() const { return lane_; }
  // This rank's positions of an llm microbatch.
  const std::vector<std::size_t>& positions() const { return positions_; }

  // The step's samples (the llm replica's, in microbatch order) and where outputs go.
  // `llm_samples` stays the caller's, alive and unchanged until the next begin_step.
  void begin_step(std::span<const data::Sample> llm_samples, TokenStore& store);
  // The image sides of each of this step's encoder microbatches (an EncoderTask's microbatch).
  std::vector<std::vector<cost::TrainedSample>> microbatch_samples() const;
  // One EncoderTask.
  void run(const pipeline::Instruction& task);
  // Whether a task's inputs are there (a backward needs its tokens' gradients in the store).
  bool ready(const pipeline::Instruction& task) const;

 private:
  struct Group {
    int side = 0;
    std::vector<std::size_t> members;  // indices into the microbatch's entries
    nn::Tensor images;
    nn::ImageEncoderSteps steps;
  };
  struct Microbatch {
    std::vector<std::pair<int, std::size_t>> entries;  // (llm microbatch, position) per sample
    std::vector<Group> groups;
    bool backward_started = false;
  };
  bool grads_ready(const Microbatch& mb) const;  // the llm has returned its tokens' gradients
  void finish(Microbatch& mb);
  void start_backward(Microbatch& mb);

  const pipeline::StageProgram& program_;
  const nn::ImageEncoder& vision_;
  nn::Ops& ops_;
  std::vector<int> lane_;
  std::vector<std::size_t> positions_;
  int microbatches_ = 1;  // K
  bool has_head_ = false;
  std::int64_t llm_microbatch_ = 1;
  // Per step.
  TokenStore* store_ = nullptr;
  std::span<const data::Sample> samples_;
  std::vector<Microbatch> mbs_;
};

}  // namespace braid::train
