#include "core/train/clip_work.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/common/error.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/inputs.hpp"

namespace braid::train {
namespace {

std::vector<std::int64_t> ids_of(std::span<const data::Sample> samples) {
  std::vector<std::int64_t> ids;
  ids.reserve(samples.size());
  for (const auto& s : samples) ids.push_back(s.index);
  return ids;
}

// Copies row `from` of `src` (rows of `width`) to row `to` of `dst`.
void copy_row(const nn::Tensor& src, std::size_t from, nn::Tensor& dst, std::size_t to, std::int64_t width) {
  std::memcpy(dst.ptr() + to * static_cast<std::size_t>(width), src.ptr() + from * static_cast<std::size_t>(width),
              static_cast<std::size_t>(width) * sizeof(float));
}

// The fixed-size record each rank contributes to a batch-sync all-gather.
struct Record {
  static constexpr std::size_t kHeader = 4 * sizeof(std::int64_t);  // flags, image replica, image rows, text rows
  std::int64_t rows = 0, width = 0;                                 // bound and embedding width
  std::size_t bytes() const {
    return kHeader + 2 * static_cast<std::size_t>(rows) * sizeof(std::int64_t) +
           2 * static_cast<std::size_t>(rows * width) * sizeof(float);
  }
};

struct Rows {
  std::vector<std::int64_t> ids;
  std::vector<float> values;  // ids.size() x width
};

Rows concatenate(const std::vector<TowerMicrobatch*>& mbs) {
  Rows r;
  for (const auto* mb : mbs) {
    r.ids.insert(r.ids.end(), mb->ids.begin(), mb->ids.end());
    r.values.insert(r.values.end(), mb->embeddings.data.begin(), mb->embeddings.data.end());
  }
  return r;
}

void put(std::vector<std::byte>& buf, std::size_t& at, const void* src, std::size_t n) {
  std::memcpy(buf.data() + at, src, n);
  at += n;
}
void get(const std::byte* buf, std::size_t& at, void* dst, std::size_t n) {
  std::memcpy(dst, buf + at, n);
  at += n;
}

}  // namespace

std::vector<nn::Shape> clip_image_hidden_shapes(const nn::ClipModel& clip, std::span<const data::Sample> samples,
                                                TowerMicrobatch& mb) {
  mb.ids = ids_of(samples);
  mb.group_rows.clear();
  mb.group_sides.clear();
  std::vector<nn::Shape> shapes;
  const auto& shape = clip.image_encoder->shape();
  for (auto& g : data::sides_of(samples)) {  // a later stage's samples have no pixels
    const std::int64_t grid = g.side / shape.patch;
    shapes.push_back({static_cast<std::int64_t>(g.members.size()), grid * grid, shape.transformer.hidden});
    mb.group_sides.push_back(g.side);
    mb.group_rows.push_back(std::move(g.members));
  }
  return shapes;
}

std::vector<nn::Shape> clip_text_hidden_shapes(const nn::ClipModel& clip, std::span<const data::Sample> samples,
                                               TowerMicrobatch& mb) {
  mb.ids = ids_of(samples);
  mb.text = tokens_of(samples);
  return {{mb.text.batch, mb.text.length, clip.text_encoder->shape().transformer.hidden}};
}

void clip_image_forward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part,
                        std::span<const data::Sample> samples, TowerMicrobatch& mb) {
  const bool first = part.first == 0, last = part.last == clip.image_encoder->layers();
  std::vector<SideGroup> groups;
  if (first) {
    groups = side_groups(samples);
    mb.ids = ids_of(samples);
    mb.group_rows.clear();
    mb.group_sides.clear();
    for (const auto& g : groups) {
      mb.group_rows.push_back(g.members);
      mb.group_sides.push_back(g.side);
    }
    mb.hidden.assign(groups.size(), {});
    for (auto& g : groups) g.images = ops.from_host(std::move(g.images));
  }
  const std::size_t n_groups = mb.group_rows.size();
  mb.image_caches.assign(n_groups, {});
  mb.image_head_caches.assign(last ? n_groups : 0, {});
  std::vector<nn::Tensor> heads(last ? n_groups : 0);
  for (std::size_t g = 0; g < n_groups; ++g) {
    const nn::EncoderOutput out = clip.image_encoder->forward_part(ops, part, first ? &groups[g].images : nullptr,
                                                                   first ? nullptr : &mb.hidden[g], mb.image_caches[g]);
    if (last)
      heads[g] = clip.image_head->forward(ops, out.pooled, mb.image_head_caches[g]);
    else
      mb.hidden[g] = out.tokens;
  }
  if (!last) return;
  // The embeddings go to host memory, every group's at once: the batch-sync sends them.
  const std::vector<nn::Tensor> embs = ops.to_host_all(heads);
  for (std::size_t g = 0; g < n_groups; ++g) {
    const std::int64_t width = embs[g].dim(1);
    if (g == 0) nn::reset(mb.embeddings, {static_cast<std::int64_t>(mb.ids.size()), width});
    for (std::size_t i = 0; i < mb.group_rows[g].size(); ++i)
      copy_row(embs[g], i, mb.embeddings, mb.group_rows[g][i], width);
  }
  mb.hidden.clear();
}

void clip_text_forward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part,
                       std::span<const data::Sample> samples, TowerMicrobatch& mb) {
  const bool first = part.first == 0, last = part.last == clip.text_encoder->layers();
  if (first) {
    mb.ids = ids_of(samples);
    mb.text = tokens_of(samples);
    mb.hidden.assign(1, {});
  }
  const nn::EncoderOutput out =
      clip.text_encoder->forward_part(ops, part, mb.text, first ? nullptr : &mb.hidden[0], mb.text_cache);
  if (!last) {
    mb.hidden[0] = out.tokens;
    return;
  }
  mb.embeddings = host_tensor(ops, clip.text_head->forward(ops, out.pooled, mb.text_head_cache));
  mb.hidden.clear();
}

void clip_image_backward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part, TowerMicrobatch& mb) {
  if (clip.image_encoder->frozen()) return;
  const bool first = part.first == 0, last = part.last == clip.image_encoder->layers();
  const std::size_t n_groups = mb.group_rows.size();
  std::vector<nn::Tensor> d_in(n_groups);
  for (std::size_t g = 0; g < n_groups; ++g) {
    if (last) {
      const auto& rows = mb.group_rows[g];
      const std::int64_t width = mb.d_embeddings.dim(1);
      nn::Tensor d({static_cast<std::int64_t>(rows.size()), width});
      for (std::size_t i = 0; i < rows.size(); ++i) copy_row(mb.d_embeddings, rows[i], d, i, width);
      d = ops.from_host(std::move(d));
      const nn::Tensor d_pooled = clip.image_head->backward(ops, d, mb.image_head_caches[g]);
      d_in[g] = clip.image_encoder->backward_part(ops, part, nullptr, &d_pooled, mb.image_caches[g]);
    } else {
      d_in[g] = clip.image_encoder->backward_part(ops, part, &mb.d_hidden[g], nullptr, mb.image_caches[g]);
    }
  }
  mb.d_hidden = first ? std::vector<nn::Tensor>{} : std::move(d_in);
}

void clip_text_backward(nn::Ops& ops, const nn::ClipModel& clip, const nn::EncoderPart& part, TowerMicrobatch& mb) {
  if (clip.text_encoder->frozen()) return;
  const bool first = part.first == 0, last = part.last == clip.text_encoder->layers();
  nn::Tensor d_in;
  if (last) {
    const nn::Tensor d_pooled =
        clip.text_head->backward(ops, ops.from_host(std::move(mb.d_embeddings)), mb.text_head_cache);
    d_in = clip.text_encoder->backward_part(ops, part, nullptr, &d_pooled, mb.text_cache);
  } else {
    d_in = clip.text_encoder->backward_part(ops, part, &mb.d_hidden[0], nullptr, mb.text_cache);
  }
  mb.d_hidden.clear();
  if (!first) mb.d_hidden.push_back(std::move(d_in));
}

BatchSyncResult batch_sync(nn::Ops& ops, const nn::ClipModel& clip, runtime::Communicator& group,
                           std::vector<TowerMicrobatch*> image, std::vector<TowerMicrobatch*> text, int image_replica,
                           std::int64_t rows_per_replica, double scale) {
  const TowerMicrobatch* any = !image.empty() ? image.front() : !text.empty() ? text.front() : nullptr;
  if (!any) throw Error(Status::invalid_argument, "batch-sync: this rank holds no tower");
  const std::int64_t width = any->embeddings.dim(1);
  const Record layout{rows_per_replica, width};
  const Rows mine_image = concatenate(image), mine_text = concatenate(text);
  if (static_cast<std::int64_t>(std::max(mine_image.ids.size(), mine_text.ids.size())) > rows_per_replica)
    throw Error(Status::invalid_argument, "batch-sync: more rows than the record holds");

  // Pack this rank's record.
  std::vector<std::byte> send(layout.bytes());
  std::size_t at = 0;
  const std::int64_t header[4] = {(image.empty() ? 0 : 1) | (text.empty() ? 0 : 2), image_replica,
                                  static_cast<std::int64_t>(mine_image.ids.size()),
                                  static_cast<std::int64_t>(mine_text.ids.size())};
  put(send, at, header, sizeof header);
  put(send, at, mine_image.ids.data(), mine_image.ids.size() * sizeof(std::int64_t));
  put(send, at, mine_text.ids.data(), mine_text.ids.size() * sizeof(std::int64_t));
  put(send, at, mine_image.values.data(), mine_image.values.size() * sizeof(float));
  put(send, at, mine_text.values.data(), mine_text.values.size() * sizeof(float));

  BatchSyncResult result;
  std::vector<std::byte> all(send.size() * static_cast<std::size_t>(group.size()));
  {
    auto request = group.iallgather(send, all);
    result.wait_seconds += request.wait();
  }

  // Unpack: image rows by replica; text rows by sample id.
  std::map<std::int64_t, Rows> image_by_replica;
  std::map<std::int64_t, std::vector<float>> text_by_id;
  for (int r = 0; r < group.size(); ++r) {
    const std::byte* rec = all.data() + static_cast<std::size_t>(r) * send.size();
    std::size_t p = 0;
    std::int64_t h[4];
    get(rec, p, h, sizeof h);
    Rows img, txt;
    img.ids.resize(static_cast<std::size_t>(h[2]));
    txt.ids.resize(static_cast<std::size_t>(h[3]));
    img.values.resize(static_cast<std::size_t>(h[2] * width));
    txt.values.resize(static_cast<std::size_t>(h[3] * width));
    get(rec, p, img.ids.data(), img.ids.size() * sizeof(std::int64_t));
    get(rec, p, txt.ids.data(), txt.ids.size() * sizeof(std::int64_t));
    get(rec, p, img.values.data(), img.values.size() * sizeof(float));
    get(rec, p, txt.values.data(), txt.values.size() * sizeof(float));
    if (h[0] & 1) image_by_replica[h[1]] = std::move(img);  // DP replicas of one tower hold distinct rows
    if (h[0] & 2)
      for (std::size_t i = 0; i < txt.ids.size(); ++i)
        text_by_id[txt.ids[i]].assign(txt.values.begin() + static_cast<std::ptrdiff_t>(i * width),
                                      txt.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * width));
  }
  std::vector<std::int64_t> ids;
  std::vector<float> image_values;
  std::int64_t offset = -1;
  for (auto& [replica, rows] : image_by_replica) {
    if (replica == image_replica && !image.empty()) offset = static_cast<std::int64_t>(ids.size());
    ids.insert(ids.end(), rows.ids.begin(), rows.ids.end());
    image_values.insert(image_values.end(), rows.values.begin(), rows.values.end());
  }
  const auto n_all = static_cast<std::int64_t>(ids.size());
  if (n_all == 0 || static_cast<std::int64_t>(text_by_id.size()) != n_all)
    throw Error(Status::internal, "batch-sync: " + std::to_string(n_all) + " image rows but " +
                                      std::to_string(text_by_id.size()) + " text rows in the group");
  nn::Tensor all_image({n_all, width}, std::move(image_values));
  nn::Tensor all_text({n_all, width});
  std::map<std::int64_t, std::size_t> row_of;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = text_by_id.find(ids[i]);
    if (it == text_by_id.end())
      throw Error(Status::internal, "batch-sync: no text row for sample " + std::to_string(ids[i]));
    std::memcpy(all_text.ptr() + i * static_cast<std::size_t>(width), it->second.data(),
                static_cast<std::size_t>(width) * sizeof(float));
    row_of[ids[i]] = i;
  }

  // This rank's loss share and the gradients of every row, summed over the group.
  const std::size_t matrix = static_cast<std::size_t>(n_all * width);
  std::vector<float> grads(2 * matrix, 0.0f);
  double share[1] = {0};
  if (!image.empty()) {
    const auto n = static_cast<std::int64_t>(mine_image.ids.size());
    nn::Tensor local_image({n, width}, mine_image.values);
    nn::Tensor local_text({n, width});
    std::memcpy(local_text.ptr(), all_text.ptr() + offset * width, static_cast<std::size_t>(n * width) * sizeof(float));
    nn::ContrastiveGrads g;
    share[0] = scale * ops.contrastive_loss(ops.from_host(std::move(local_image)), ops.from_host(std::move(local_text)),
                                            ops.from_host(std::move(all_image)), ops.from_host(std::move(all_text)),
                                            offset, clip.loss->logit_scale_param(ops), &g);
    for (nn::Tensor* t : {&g.local_image, &g.local_text, &g.all_image, &g.all_text})
      *t = host_tensor(ops, std::move(*t));
    result.logit_scale_grad = scale * g.logit_scale_param;
    for (std::size_t i = 0; i < matrix; ++i) {
      grads[i] = g.all_image.data[i];
      grads[matrix + i] = g.all_text.data[i];
    }
    for (std::int64_t i = 0; i < n * width; ++i) {
      grads[static_cast<std::size_t>(offset * width + i)] += g.local_image.data[static_cast<std::size_t>(i)];
      grads[matrix + static_cast<std::size_t>(offset * width + i)] += g.local_text.data[static_cast<std::size_t>(i)];
    }
    for (auto& v : grads) v = static_cast<float>(v * scale);
  }
  {
    auto r1 = group.iallreduce(std::span<float>(grads));
    auto r2 = group.iallreduce(std::span<double>(share));
    result.wait_seconds += r1.wait() + r2.wait();
  }
  result.loss = share[0];

  auto fill = [&](TowerMicrobatch& mb, std::size_t base) {
    nn::reset(mb.d_embeddings, mb.embeddings.shape);
    for (std::size_t i = 0; i < mb.ids.size(); ++i)
      std::memcpy(mb.d_embeddings.ptr() + i * static_cast<std::size_t>(width),
                  grads.data() + base + row_of.at(mb.ids[i]) * static_cast<std::size_t>(width),
                  static_cast<std::size_t>(width) * sizeof(float));
  };
  for (auto* mb : image) fill(*mb, 0);
  for (auto* mb : text) fill(*mb, matrix);
  return result;
}

}  // namespace braid::train
