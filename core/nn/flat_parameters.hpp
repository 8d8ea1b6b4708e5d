// Trainable parameters laid out end to end: one buffer each for their values, gradients and
// AdamW moments, where the ops keep tensors, and every parameter's tensors slices of them.
// Zeroing the gradients is then one call, and AdamW one call per group and weight decay,
// where it was one per parameter: on a GPU the tiny reference models are launch-bound, and
// those calls were a fifth of their step. Both are elementwise, so the bits are those of the
// per-parameter calls. The gradients' global norm is one call per run too. A group (a
// module part) is laid out together, so its data-parallel all-reduce sums it in place.
//
// Code elsewhere may still give a parameter a new tensor (a checkpoint's moments, a value
// edited on the host, the CLIP scale's gradient). That member is then no longer a slice and
// is zeroed and stepped on its own, so a result never depends on who holds the memory;
// `slices()` says how many still are, `group_apart()` whether a reduction group lost its
// memory end to end, and building anew brings the others back.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "core/nn/modules/parameter.hpp"
#include "core/nn/ops.hpp"

namespace braid::nn {

struct FlatMember {
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // value's element count
  AdamWState* state = nullptr;
  bool decay = true;    // AdamW's weight decay applies
  bool in_norm = true;  // its gradient counts in the global norm (a tensor held on several ranks: one of them)
  int group = 0;        // the gradient reduction it is summed in (a module part): laid out together
};

// The trainable ones of `params`, each with its state: states[i] is params[i]'s.
std::vector<FlatMember> trainable_members(const std::vector<Parameter*>& params, std::vector<AdamWState>& states);

// The trainable ones of `params` (one group) in the order FlatParameters lays them out: those
// with weight decay first, each kind in the order given. Data-parallel replicas sum a
// module's gradients in this order, which depends on the parameters alone, so every replica
// makes the same collective whatever its memory holds; laid out, the gradients are then one
// span, summed in place (train::post_allreduce_gradients).
std::vector<Parameter*> layout_order(const std::vector<Parameter*>& params);
// Where the gradients of `ordered` begin when each lies right after the one before in the
// memory of `device`; null when they do not, or hold nothing.
float* end_to_end_gradients(const std::vector<Parameter*>& ordered, const Device& device);
// What keeps the gradients of `params` alive (their buffers' keepers, each once): held by a
// collective that works on them in place, so a new layout cannot free them under it.
std::vector<std::shared_ptr<void>> gradient_keepers(const std::vector<Parameter*>& params);

class FlatParameters {
 public:
  FlatParameters() = default;
  // Copies every member's value, gradient and moments (zero where it has none yet) into the
  // buffers, group by group in the order of their first members, each group in layout_order,
  // and points the member's tensors at its slices. Throws
  // Error(invalid_argument) for a member without a value, gradient or state, or whose
  // gradient's or moments' element count is not its value's.
  FlatParameters(Ops& ops, std::vector<FlatMember> members);

  std::size_t size() const { return placed_.size(); }
  // Members whose value, gradient and moments all still are their slices.
  std::size_t slices() const;
  // Whether a member that shares its group with others is no longer all slices: that
  // group's gradients are then not end to end, and its reduction copies them through a
  // buffer until laid out anew. (A member alone in its group, CLIP's logit scale, whose
  // gradient is a new tensor every step, does not count.)
  bool group_apart() const;
  // Zeroes every member's gradient.
  void zero_grads(Ops& ops);
  // The sum of the squares of the gradients that count in the norm, one call per run of
  // consecutive slices that do (on a GPU each call waits for its result), summed in layout
  // order: the same sum on every run of the same layout, not the bits of per-member calls.
  double squared_grad_norm(Ops& ops) const;
  // Every member's gradient times `factor` (global-norm clipping): one call per run.
  void scale_grads(Ops& ops, float factor);
  // One AdamW step of every member: `config`'s weight decay on decayed members, none on the
  // others.
  void adamw_step(Ops& ops, const AdamWConfig& config);

 private:
  enum Part : std::size_t { kValue, kGrad, kM, kV, kParts };
  struct Placed {
    FlatMember member;
    std::size_t offset = 0, count = 0;
  };
  // Members [first, last) in layout order, one call for them all when `whole`, else the one
  // member `first` on its own.
  struct Run {
    std::size_t first = 0, last = 0;
    bool whole = false;
  };

  // Whether every one of `parts` of the member still is its slice.
  bool is_slice(const Placed& p, std::initializer_list<Part> parts) const;
  // Consecutive members that are slices in `parts` and that `same` keeps together.
  template <class Same>
  std::vector<Run> runs(std::initializer_list<Part> parts, Same same) const;
  // `f` on each gradient run as one tensor, and on each gradient that is no slice alone;
  // `op` names what f does, for the in-place check.
  template <class F>
  void each_grad_run(Ops& ops, const char* op, F f);
  Tensor view(Part part, std::size_t offset, std::size_t count) const;
  Tensor view(Part part, const Run& run) const;  // the slices of a whole run, end to end

  std::vector<Placed> placed_;
  std::shared_ptr<std::array<Tensor, kParts>> buffers_;  // kept alive by every slice
};

}  // namespace braid::nn
