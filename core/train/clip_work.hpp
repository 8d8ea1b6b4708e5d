// The CLIP work of one rank inside a training step: each held tower's forward and backward
// of a microbatch (the image tower one dense batch per image side), and the batch-sync of a
// contrastive group: every tower's embeddings gathered over the batch-sync ranks, this
// rank's share of the loss, and the gradients of its own rows.
//
// Batch-sync, for DP-colocated towers and DistMM's disjoint ones alike: each rank sends a
// record (which towers it holds, its replica, its rows' sample ids, their embeddings) to
// every rank of the group (one all-gather). The group's rows are the image replicas' rows
// in replica order; text rows are matched to them by sample id, so the towers may split
// the batch differently. A rank holding the image tower computes the local-loss share of
// its rows (core/nn host_contrastive: the shares sum to the loss) with the gradients of
// every gathered row; the sum over the group (one all-reduce of the (N, E) image and text
// gradients: a reduce-scatter written as an all-reduce, 16 KiB at N = 64, E = 32) gives
// each rank the gradient of the rows it computed.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/data/shapes.hpp"
#include "core/nn/modules/model.hpp"
#include "core/runtime/communicator.hpp"

namespace braid::train {

// One microbatch of one tower on this rank, from forward to backward. A tower may be split
// into pipeline parts (nn::EncoderPart): the first embeds, the last pools and projects; in
// between, hidden states travel as one tensor per image side (the text tower: one).
struct TowerMicrobatch {
  std::vector<std::int64_t> ids;     // sample indices, in row order
  nn::Tensor embeddings;             // (n, E), unit norm (last part)
  nn::Tensor d_embeddings;           // (n, E), set by the batch-sync (last part)
  std::vector<nn::Tensor> hidden;    // per group: the input from the previous part, then the output to the next
  std::vector<nn::Tensor> d_hidden;  // per group: the gradient from the next part, then the one to the previous
  // Image tower: one cache per side group, and the rows each group's samples hold.
  std::vector<nn::ImageEncoderCache> image_caches;
  std::vector<nn::ClipHeadCache> image_head_caches;
  std::vector<std::vector<std::size_t>> group_rows;
  std::vector<int> group_sides;
  // Text tower.
  nn::TextEncoderCache text_cache;
  nn::ClipHeadCache text_head_cache;
  nn::Tokens text;
};

// The tensors a part receives: per group (batch, sequence) of its hidden input, before forward.
// Sets ids, group_rows, group_sides (image) or text (text tower) from the samples.
std::vector<nn::Shape> clip_image_hidden_shapes(const nn::ClipModel& clip, std::span<const data::Sample> samples,
                                                TowerMicrobatch& mb);
std::vector<nn::Shape> clip_text_hidden_shapes(const nn::ClipModel& clip, std::span<const data::Sample> samples,
                                               TowerMicrobatch& mb);

// Forward of `part`: the first part from the samples, the others from mb.hidden; leaves
// mb.hidden = the outputs for the next part, or mb.embeddings on the last part.
void clip_image_forward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part,
                        std::span<const data::Sample> samples, TowerMicrobatch& mb);
void clip_text_forward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part,
                       std::span<const data::Sample> samples, TowerMicrobatch& mb);
// Adds the part's parameter gradients from mb.d_embeddings (last part) or mb.d_hidden, and
// leaves mb.d_hidden = the gradients for the previous part (none on the first). Nothing when
// the tower is frozen.
void clip_image_backward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part, TowerMicrobatch& mb);
void clip_text_backward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part, TowerMicrobatch& mb);

struct BatchSyncResult {
  double loss = 0;              // the group's contrastive loss (every rank gets it)
  double logit_scale_grad = 0;  // d loss / d t, this rank's share (sum over the group for the total)
  double wait_seconds = 0;      // blocked in the all-gather and all-reduce
};

// One contrastive group's batch-sync. `image` and `text` are this rank's microbatches of the
// group for each tower it holds (null: not held), rows concatenated in order. `image_replica`
// orders the image rows; `rows_per_replica` bounds the record size (the largest row count a
// rank of either tower has). `scale` multiplies the loss and its gradients (1 / groups per
// step). Fills d_embeddings of every given microbatch.
BatchSyncResult batch_sync(nn::Ops& ops, const nn::ClipModel& clip, runtime::Communicator& group,
                           std::vector<TowerMicrobatch*> image, std::vector<TowerMicrobatch*> text, int image_replica,
                           std::int64_t rows_per_replica, double scale);

}  // namespace braid::train
