// Held-out evaluation of the reference models: top-1 retrieval for CLIP, caption loss and
// token accuracy for an MLLM, on the held-out split of the generated dataset (scenes never
// seen in training).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/data/shapes.hpp"
#include "core/nn/modules/model.hpp"

namespace braid::train {

// Held-out samples 0 .. count-1 (Split::heldout), rendered. Throws Error(invalid_argument) for
// a negative count.
std::vector<data::Sample> heldout_samples(const data::ShapesDataset& dataset, std::int64_t count);

struct Retrieval {
  double image_to_text = 0, text_to_image = 0;
};
// Top-1 retrieval over unit-norm embeddings (N, E): image i retrieves argmax_j <img_i, txt_j>,
// correct when scene_ids[j] == scene_ids[i] (two samples of one scene have one caption, so no
// model can tell them apart); text to image likewise. Ties go to the lower index. Throws
// Error(invalid_argument) for no rows or shapes that disagree.
Retrieval retrieval_top1(const nn::Tensor& image_embeddings, const nn::Tensor& text_embeddings,
                         std::span<const std::int64_t> scene_ids);
// For each row i of queries (Q, E), the row j of keys (K, E) with the largest dot product
// sum_c double(q_ic) * double(k_jc) (summed in double, in column order), the lower index on
// ties: the answer of an exhaustive double-precision scan, in O(256 K + (Q + K) E) memory.
// Bitwise duplicate rows are ranked once; a float GEMM scores blocks of 256 queries and only
// the keys within its rounding bound of a row's best float score are rescored in double. Rows
// with non-finite values are scanned exhaustively. Throws Error(invalid_argument) unless both
// are rank 2 of one width.
std::vector<std::int64_t> best_matches(const nn::Tensor& queries, const nn::Tensor& keys);

// CLIP embeddings of the samples, in sample order (the image tower per side group), computed
// 256 samples at a time.
nn::Tensor image_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples);
nn::Tensor text_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples);

struct CaptionMetrics {
  double loss = 0;            // next-token cross-entropy, mean over counted text positions
  double token_accuracy = 0;  // share of those positions whose argmax logit is the target
  std::int64_t tokens = 0;    // counted positions
};
// The MLLM on the samples (per side group: image-token counts differ by side), 256 samples at
// a time.
CaptionMetrics caption_metrics(nn::Ops& ops, const nn::ChainModel& chain, std::span<const data::Sample> samples);

}  // namespace braid::train
