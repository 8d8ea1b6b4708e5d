#include "core/train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

// The score best_matches ranks by: the float products summed in double, in column order.
double double_dot(const float* q, const float* k, std::int64_t e) {
  double s = 0;
  for (std::int64_t c = 0; c < e; ++c) s += static_cast<double>(q[c]) * k[c];
  return s;
}

// The index of the best double_dot score of row q against the rows of `keys` among `candidates`
// (ascending), ties to the lower index: a scan of all rows when candidates is null.
std::int64_t best_exact(const float* q, const nn::Tensor& keys, const std::vector<std::int64_t>* candidates) {
  const std::int64_t n = keys.dim(0), e = keys.dim(1);
  std::int64_t best = 0;
  double best_score = -1e300;
  auto consider = [&](std::int64_t j) {
    const double s = double_dot(q, keys.ptr() + j * e, e);
    if (s > best_score) {
      best_score = s;
      best = j;
    }
  };
  if (candidates) {
    for (auto j : *candidates) consider(j);
  } else {
    for (std::int64_t j = 0; j < n; ++j) consider(j);
  }
  return best;
}

double row_norm(const float* r, std::int64_t e) { return std::sqrt(double_dot(r, r, e)); }

// Forward passes of evaluation take this many samples at a time, so that activations stay
// bounded however many samples are evaluated. A sample's outputs depend on the others in its
// pass only in float rounding (no batch statistics; text is padded as in the whole batch, but
// BLAS rounds a row's sums differently as the row count changes: about 2e-7 on the tiny CLIP's
// unit-norm embeddings).
constexpr std::size_t kEvalChunk = 256;

// The most tokens of a caption among the samples.
std::int64_t longest_caption(std::span<const data::Sample> samples) {
  std::size_t longest = 0;
  for (const auto& s : samples) longest = std::max(longest, s.tokens.size());
  return static_cast<std::int64_t>(longest);
}

// best_matches on rows as given: a float GEMM in blocks of queries selects candidates, which
// are rescored with double_dot.
std::vector<std::int64_t> gemm_best_matches(const nn::Tensor& queries, const nn::Tensor& keys) {
  constexpr std::int64_t kBlock = 256;
  const std::int64_t nq = queries.dim(0), n = keys.dim(0), e = keys.dim(1);
  std::vector<std::int64_t> best(static_cast<std::size_t>(nq), 0);
  if (nq == 0 || n == 0) return best;
  // |float dot - exact dot| <= gamma_e(float) * sum |q_c k_c| <= gamma_e(float) |q| |k| for any
  // summation order (FMA or not), plus what products, sums or inputs below the normal float
  // range lose (even flushed to zero); the double scores err by gamma_e(double) likewise. A key
  // whose double score could beat the best float score's is within twice that of it; the
  // threshold below takes four times.
  const double ef = static_cast<double>(e);
  const double u_float = std::ldexp(1.0, -24), u_double = std::ldexp(1.0, -53);
  const double gamma = ef * u_float / (1 - ef * u_float) + ef * u_double / (1 - ef * u_double);
  const double tiny = (ef + 1) * static_cast<double>(std::numeric_limits<float>::min());
  double key_norm = 0;
  bool finite = true;
  for (std::int64_t j = 0; j < n; ++j) {
    const double k = row_norm(keys.ptr() + j * e, e);
    finite = finite && std::isfinite(k);
    key_norm = std::max(key_norm, k);
  }
  std::vector<float> scores(static_cast<std::size_t>(std::min(kBlock, nq) * n));
  std::vector<std::int64_t> candidates;
  for (std::int64_t a = 0; a < nq; a += kBlock) {
    const std::int64_t m = std::min(kBlock, nq - a);
    nn::gemm(false, true, m, n, e, 1.0f, queries.ptr() + a * e, e, keys.ptr(), e, 0.0f, scores.data(), n);
    for (std::int64_t i = 0; i < m; ++i) {
      const float* q = queries.ptr() + (a + i) * e;
      const double query_norm = row_norm(q, e);
      const double bound = query_norm * key_norm;
      // Non-finite rows, or scores near the float range: the exhaustive scan.
      if (!finite || !std::isfinite(query_norm) || bound > 1e36) {
        best[static_cast<std::size_t>(a + i)] = best_exact(q, keys, nullptr);
        continue;
      }
      const float* s = scores.data() + i * n;
      float top[8];
      std::int64_t j = 0;
      for (int l = 0; l < 8; ++l) top[l] = s[0];
      for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) top[l] = std::max(top[l], s[j + l]);
      float max_score = top[0];
      for (int l = 1; l < 8; ++l) max_score = std::max(max_score, top[l]);
      for (; j < n; ++j) max_score = std::max(max_score, s[j]);
      // The threshold in double, rounded down to a float, so that comparing in float keeps
      // every score at or above it.
      const double cut = static_cast<double>(max_score) - 4 * (gamma * bound + tiny * (1 + query_norm + key_norm));
      auto threshold = static_cast<float>(cut);
      if (static_cast<double>(threshold) > cut) threshold = std::nextafter(threshold, -HUGE_VALF);
      candidates.clear();
      for (j = 0; j < n; ++j)
        if (s[j] >= threshold) candidates.push_back(j);
      best[static_cast<std::size_t>(a + i)] = candidates.size() == 1 ? candidates[0] : best_exact(q, keys, &candidates);
    }
  }
  return best;
}

// The bitwise distinct rows of a (N, E) tensor, in order of first appearance.
struct DistinctRows {
  nn::Tensor rows;                  // (D, E)
  std::vector<std::int64_t> first;  // D: the first index of each in the tensor, ascending
  std::vector<std::int64_t> of;     // N: which distinct row each row is
};

DistinctRows distinct_rows(const nn::Tensor& t) {
  const std::int64_t n = t.dim(0), e = t.dim(1);
  const auto bytes = static_cast<std::size_t>(e) * sizeof(float);
  DistinctRows d;
  d.of.resize(static_cast<std::size_t>(n));
  std::unordered_map<std::string_view, std::int64_t> seen;
  seen.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::string_view row(reinterpret_cast<const char*>(t.ptr() + i * e), bytes);
    const auto [it, added] = seen.emplace(row, static_cast<std::int64_t>(d.first.size()));
    if (added) d.first.push_back(i);
    d.of[static_cast<std::size_t>(i)] = it->second;
  }
  nn::reset(d.rows, {static_cast<std::int64_t>(d.first.size()), e});
  if (bytes > 0)
    for (std::size_t k = 0; k < d.first.size(); ++k)
      std::memcpy(d.rows.ptr() + static_cast<std::int64_t>(k) * e, t.ptr() + d.first[k] * e, bytes);
  return d;
}

}  // namespace

std::vector<std::int64_t> best_matches(const nn::Tensor& queries, const nn::Tensor& keys) {
  if (queries.rank() != 2 || keys.rank() != 2 || queries.dim(1) != keys.dim(1))
    throw Error(Status::invalid_argument, "best matches: queries " + nn::shape_string(queries.shape) + ", keys " +
                                              nn::shape_string(keys.shape) + "; need (Q, E) and (K, E)");
  std::vector<std::int64_t> out(static_cast<std::size_t>(queries.dim(0)), 0);
  if (out.empty() || keys.dim(0) == 0) return out;
  // Bitwise equal keys score alike against any query, so only the first of them can win a tie,
  // and bitwise equal queries have one answer: rank the distinct rows only (samples of one
  // scene share a caption, so far fewer distinct texts than samples).
  const DistinctRows q = distinct_rows(queries), k = distinct_rows(keys);
  const std::vector<std::int64_t> best = gemm_best_matches(q.rows, k.rows);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = k.first[static_cast<std::size_t>(best[static_cast<std::size_t>(q.of[i])])];
  return out;
}

std::vector<data::Sample> heldout_samples(const data::ShapesDataset& dataset, std::int64_t count) {
  if (count < 0)
    throw Error(Status::invalid_argument, "held-out samples: count is " + std::to_string(count) + "; use 0 or more");
  std::vector<data::Sample> out;
  out.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) out.push_back(dataset.get(i, data::Split::heldout));
  return out;
}

Retrieval retrieval_top1(const nn::Tensor& image, const nn::Tensor& text, std::span<const std::int64_t> scene_ids) {
  if (image.rank() != 2 || image.shape != text.shape || image.dim(0) != static_cast<std::int64_t>(scene_ids.size()))
    throw Error(Status::invalid_argument, "retrieval: image embeddings " + nn::shape_string(image.shape) + ", text " +
                                              nn::shape_string(text.shape) + ", " + std::to_string(scene_ids.size()) +
                                              " scene ids");
  const std::int64_t n = image.dim(0);
  if (n == 0) throw Error(Status::invalid_argument, "retrieval: no embeddings to rank");
  const std::vector<std::int64_t> to_text = best_matches(image, text), to_image = best_matches(text, image);
  std::int64_t i2t = 0, t2i = 0;
  for (std::size_t i = 0; i < scene_ids.size(); ++i) {
    i2t += scene_ids[static_cast<std::size_t>(to_text[i])] == scene_ids[i];
    t2i += scene_ids[static_cast<std::size_t>(to_image[i])] == scene_ids[i];
  }
  return {static_cast<double>(i2t) / static_cast<double>(n), static_cast<double>(t2i) / static_cast<double>(n)};
}

nn::Tensor image_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples) {
  nn::Tensor out;
  for (std::size_t first = 0; first < samples.size(); first += kEvalChunk) {
    const auto chunk = samples.subspan(first, std::min(kEvalChunk, samples.size() - first));
    for (auto& g : side_groups(chunk)) {
      nn::ImageEncoderCache cache;
      nn::ClipHeadCache head;
      const nn::Tensor emb = host_tensor(
          ops, clip.image_head->forward(
                   ops, clip.image_encoder->forward(ops, ops.from_host(std::move(g.images)), cache).pooled, head));
      const std::size_t e = static_cast<std::size_t>(emb.dim(1));
      if (out.data.empty()) nn::reset(out, {static_cast<std::int64_t>(samples.size()), emb.dim(1)});
      for (std::size_t m = 0; m < g.members.size(); ++m)
        std::memcpy(out.ptr() + (first + g.members[m]) * e, emb.ptr() + m * e, e * sizeof(float));
    }
  }
  return out;
}

nn::Tensor text_embeddings(nn::Ops& ops, const nn::ClipModel& clip, std::span<const data::Sample> samples) {
  // Every chunk padded as the whole batch would be.
  const std::int64_t pad_to = longest_caption(samples);
  nn::Tensor out;
  for (std::size_t first = 0; first < samples.size(); first += kEvalChunk) {
    const auto chunk = samples.subspan(first, std::min(kEvalChunk, samples.size() - first));
    nn::TextEncoderCache cache;
    nn::ClipHeadCache head;
    const nn::Tensor emb = host_tensor(
        ops,
        clip.text_head->forward(ops, clip.text_encoder->forward(ops, tokens_of(chunk, pad_to), cache).pooled, head));
    const std::size_t e = static_cast<std::size_t>(emb.dim(1));
    if (out.data.empty()) nn::reset(out, {static_cast<std::int64_t>(samples.size()), emb.dim(1)});
    std::memcpy(out.ptr() + first * e, emb.ptr(), chunk.size() * e * sizeof(float));
  }
  return out;
}

CaptionMetrics caption_metrics(nn::Ops& ops, const nn::ChainModel& chain, std::span<const data::Sample> samples) {
  CaptionMetrics m;
  double loss_sum = 0;
  std::int64_t correct = 0;
  auto run = [&](const nn::Tensor* images, const nn::Tokens& text) {
    nn::ImageEncoderCache vision;
    nn::ProjectorCache projector;
    nn::DecoderCache llm;
    nn::Tensor prefix;
    if (images) {
      prefix = chain.vision->forward(ops, ops.from_host(*images), vision).tokens;
      if (chain.projector) prefix = chain.projector->forward(ops, prefix, projector);
    }
    nn::Tensor logits = chain.llm->forward(ops, images ? &prefix : nullptr, text, llm);
    const auto targets = nn::next_token_targets(text);
    std::int64_t counted = 0;
    for (auto t : targets) counted += t >= 0;
    if (counted == 0) return;
    // lm_loss with normalizer 1 gives the sum over counted positions.
    loss_sum += nn::lm_loss(ops, logits, text, 1, nullptr);
    logits = host_tensor(ops, std::move(logits));
    const std::int64_t vocab = logits.dim(2);
    for (std::size_t p = 0; p < targets.size(); ++p) {
      if (targets[p] < 0) continue;
      const float* row = logits.ptr() + p * static_cast<std::size_t>(vocab);
      std::int64_t arg = 0;
      for (std::int64_t v = 1; v < vocab; ++v)
        if (row[v] > row[arg]) arg = v;
      correct += arg == targets[p];
    }
    m.tokens += counted;
  };
  // Chunks of the batch, each padded as its text would be in the whole batch (per side group
  // with images: image-token counts differ by side).
  std::int64_t pad_all = 0;
  std::map<int, std::int64_t> pad_side;
  for (const auto& s : samples) {
    const auto tokens = static_cast<std::int64_t>(s.tokens.size());
    pad_all = std::max(pad_all, tokens);
    pad_side[s.side] = std::max(pad_side[s.side], tokens);
  }
  for (std::size_t first = 0; first < samples.size(); first += kEvalChunk) {
    const auto chunk = samples.subspan(first, std::min(kEvalChunk, samples.size() - first));
    if (!chain.vision) {
      run(nullptr, tokens_of(chunk, pad_all));
    } else {
      for (const auto& g : side_groups(chunk)) run(&g.images, tokens_of(chunk, g.members, pad_side.at(g.side)));
    }
  }
  if (m.tokens > 0) {
    m.loss = loss_sum / static_cast<double>(m.tokens);
    m.token_accuracy = static_cast<double>(correct) / static_cast<double>(m.tokens);
  }
  return m;
}

}  // namespace braid::train
