#include "core/nn/flat_parameters.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

// Copies `t` (anywhere) into `host` from `offset`.
void gather(Ops& ops, const Tensor& t, Tensor& host, std::size_t offset) {
  const Tensor here = ops.to_host(t);
  std::copy(here.data.begin(), here.data.end(), host.data.begin() + static_cast<std::ptrdiff_t>(offset));
}

// An Ops that gave an output a new tensor instead of overwriting it would leave the buffer
// as it was: every Ops writes in place (DeviceOps, HostOps and StagedOps do).
void expect_in_place(const Ops& ops, const Tensor& t, const float* where, const char* op) {
  if (t.ptr() != where)
    throw Error(Status::internal, "flat parameters: " + ops.name() + "'s " + op +
                                      " gave its output a new tensor instead of writing it in place");
}

}  // namespace

std::vector<FlatMember> trainable_members(const std::vector<Parameter*>& params, std::vector<AdamWState>& states) {
  if (states.size() != params.size())
    throw Error(Status::invalid_argument, "flat parameters: " + std::to_string(params.size()) + " parameters but " +
                                              std::to_string(states.size()) + " optimizer states");
  std::vector<FlatMember> out;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i]->trainable) out.push_back({&params[i]->value, &params[i]->grad, &states[i], params[i]->decay});
  return out;
}

std::vector<Parameter*> layout_order(const std::vector<Parameter*>& params) {
  std::vector<Parameter*> out;
  for (Parameter* p : params)
    if (p->trainable) out.push_back(p);
  std::stable_partition(out.begin(), out.end(), [](const Parameter* p) { return p->decay; });
  return out;
}

float* end_to_end_gradients(const std::vector<Parameter*>& ordered, const Device& device) {
  float* first = nullptr;
  const float* next = nullptr;
  for (Parameter* p : ordered) {
    Tensor& g = p->grad;
    if (g.data.empty()) continue;
    if (!(g.device() == device) || (first && g.ptr() != next)) return nullptr;
    if (!first) first = g.ptr();
    next = g.ptr() + g.data.size();
  }
  return first;
}

std::vector<std::shared_ptr<void>> gradient_keepers(const std::vector<Parameter*>& params) {
  std::vector<std::shared_ptr<void>> out;
  for (const Parameter* p : params) {
    const std::shared_ptr<void>& k = p->grad.data.keeper();
    if (k && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  return out;
}

FlatParameters::FlatParameters(Ops& ops, std::vector<FlatMember> members) {
  for (std::size_t k = 0; k < members.size(); ++k) {  // numbered as given
    const FlatMember& m = members[k];
    const std::string which = "flat parameters: member " + std::to_string(k);
    if (!m.value || !m.grad || !m.state)
      throw Error(Status::invalid_argument, which + " lacks a value, a gradient or an optimizer state");
    const int64_t count = m.value->numel();
    auto expect_count = [&](const Tensor& t, const char* what) {
      if (t.numel() != count)
        throw Error(Status::invalid_argument,
                    which + " has " + std::to_string(count) + " values but " + std::to_string(t.numel()) + " " + what);
    };
    expect_count(*m.grad, "gradients");
    if (!m.state->m.data.empty()) expect_count(m.state->m, "first moments");
    if (!m.state->v.data.empty()) expect_count(m.state->v, "second moments");
  }
  // Groups in the order they first appear, then layout_order's rule within each.
  std::vector<int> groups;
  for (const FlatMember& m : members)
    if (std::find(groups.begin(), groups.end(), m.group) == groups.end()) groups.push_back(m.group);
  auto rank_of = [&](const FlatMember& m) {
    const auto g = std::find(groups.begin(), groups.end(), m.group) - groups.begin();
    return 2 * g + (m.decay ? 0 : 1);
  };
  std::stable_sort(members.begin(), members.end(),
                   [&](const FlatMember& a, const FlatMember& b) { return rank_of(a) < rank_of(b); });
  std::size_t total = 0;
  for (const FlatMember& m : members) {
    const auto count = static_cast<std::size_t>(m.value->numel());
    placed_.push_back({m, total, count});
    total += count;
  }
  if (total == 0) return;  // nothing to lay out: every member (if any) is stepped on its own
  std::array<Tensor, kParts> host;
  for (Tensor& t : host) t = Tensor({static_cast<int64_t>(total)});
  for (const Placed& p : placed_) {
    gather(ops, *p.member.value, host[kValue], p.offset);
    gather(ops, *p.member.grad, host[kGrad], p.offset);
    const AdamWState& s = *p.member.state;
    if (!s.m.data.empty()) gather(ops, s.m, host[kM], p.offset);
    if (!s.v.data.empty()) gather(ops, s.v, host[kV], p.offset);
  }
  buffers_ = std::make_shared<std::array<Tensor, kParts>>();
  for (std::size_t part = 0; part < kParts; ++part) (*buffers_)[part] = ops.from_host(std::move(host[part]));
  for (Placed& p : placed_) {
    auto slice_as = [&](Part part, const Shape& shape) {
      Tensor t = view(part, p.offset, p.count);
      t.shape = shape;
      return t;
    };
    const Shape shape = p.member.value->shape;
    *p.member.value = slice_as(kValue, shape);
    *p.member.grad = slice_as(kGrad, p.member.grad->shape);
    p.member.state->m = slice_as(kM, shape);
    p.member.state->v = slice_as(kV, shape);
  }
}

Tensor FlatParameters::view(Part part, std::size_t offset, std::size_t count) const {
  Tensor t;
  t.shape = {static_cast<int64_t>(count)};
  t.data = (*buffers_)[part].data.slice(offset, count, buffers_);
  return t;
}

Tensor FlatParameters::view(Part part, const Run& run) const {
  const Placed &first = placed_[run.first], &last = placed_[run.last - 1];
  return view(part, first.offset, last.offset + last.count - first.offset);
}

bool FlatParameters::is_slice(const Placed& p, std::initializer_list<Part> parts) const {
  if (!buffers_) return false;
  return std::all_of(parts.begin(), parts.end(), [&](Part part) {
    const Tensor* t = part == kValue  ? p.member.value
                      : part == kGrad ? p.member.grad
                      : part == kM    ? &p.member.state->m
                                      : &p.member.state->v;
    return t->ptr() == (*buffers_)[part].ptr() + p.offset && t->data.size() == p.count;
  });
}

bool FlatParameters::group_apart() const {
  std::map<int, std::size_t> members;
  for (const Placed& p : placed_) ++members[p.member.group];
  return std::any_of(placed_.begin(), placed_.end(), [&](const Placed& p) {
    return members[p.member.group] > 1 && !is_slice(p, {kValue, kGrad, kM, kV});
  });
}

std::size_t FlatParameters::slices() const {
  return static_cast<std::size_t>(std::count_if(placed_.begin(), placed_.end(), [&](const Placed& p) {
    return is_slice(p, {kValue, kGrad, kM, kV});
  }));
}

template <class Same>
std::vector<FlatParameters::Run> FlatParameters::runs(std::initializer_list<Part> parts, Same same) const {
  auto fits = [&](const Placed& p) { return is_slice(p, parts); };
  std::vector<Run> out;
  for (std::size_t k = 0; k < placed_.size();) {
    if (!fits(placed_[k])) {
      out.push_back({k, k + 1, false});
      ++k;
      continue;
    }
    std::size_t end = k + 1;
    while (end < placed_.size() && fits(placed_[end]) && same(placed_[k], placed_[end])) ++end;
    out.push_back({k, end, true});
    k = end;
  }
  return out;
}

template <class F>
void FlatParameters::each_grad_run(Ops& ops, const char* op, F f) {
  for (const Run& r : runs({kGrad}, [](const Placed&, const Placed&) { return true; })) {
    if (!r.whole) {
      f(*placed_[r.first].member.grad);
      continue;
    }
    Tensor g = view(kGrad, r);
    const float* where = g.ptr();
    f(g);
    expect_in_place(ops, g, where, op);
  }
}

void FlatParameters::zero_grads(Ops& ops) {
  each_grad_run(ops, "zero", [&](Tensor& g) { ops.zero(g, g.shape); });
}

double FlatParameters::squared_grad_norm(Ops& ops) const {
  double sum = 0.0;
  auto same = [](const Placed& a, const Placed& b) { return a.member.in_norm == b.member.in_norm; };
  for (const Run& r : runs({kGrad}, same)) {
    if (!placed_[r.first].member.in_norm) continue;
    sum += ops.squared_norm(r.whole ? view(kGrad, r) : *placed_[r.first].member.grad);
  }
  return sum;
}

void FlatParameters::scale_grads(Ops& ops, float factor) {
  each_grad_run(ops, "scale", [&](Tensor& g) { ops.scale(g, factor); });
}

void FlatParameters::adamw_step(Ops& ops, const AdamWConfig& config) {
  auto same = [](const Placed& a, const Placed& b) {
    return a.member.decay == b.member.decay && a.member.state->step == b.member.state->step;
  };
  for (const Run& r : runs({kValue, kGrad, kM, kV}, same)) {
    const FlatMember& first = placed_[r.first].member;
    AdamWConfig c = config;
    if (!first.decay) c.weight_decay = 0.0;
    if (!r.whole) {
      ops.adamw_step(*first.value, *first.grad, *first.state, c);
      continue;
    }
    Tensor value = view(kValue, r);
    const Tensor grad = view(kGrad, r);
    AdamWState state{view(kM, r), view(kV, r), first.state->step};
    const float *where = value.ptr(), *m = state.m.ptr(), *v = state.v.ptr();
    ops.adamw_step(value, grad, state, c);
    expect_in_place(ops, value, where, "adamw_step");
    expect_in_place(ops, state.m, m, "adamw_step");
    expect_in_place(ops, state.v, v, "adamw_step");
    for (std::size_t k = r.first; k < r.last; ++k) placed_[k].member.state->step = state.step;
  }
}

}  // namespace braid::nn
