// How a rank's slices of the training state are named in checkpoints and gradient dumps, and
// how the whole tensors come back from the slices of every rank, whatever layout wrote them
// (resharding on load).
//
// A tensor is "<kind>/<parameter>" (kind: param, adam_m, adam_v, grad) when the rank holds the
// whole parameter, and "<kind>/<parameter>@<axis>:<index>/<count>" when it holds tensor-parallel
// slice `index` of `count` along `axis` (Parameter::slice). Replicated tensors are written by
// every rank that holds them; the copies are the same. The optimizer's step count is the int
// blob "adam_step/<parameter>". A tensor with no elements (shape (0)) is optimizer state not
// created yet.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/modules/parameter.hpp"
#include "core/nn/ops.hpp"
#include "core/train/checkpoint.hpp"

namespace braid::train {

// The entry name of `kind` of parameter `p` as this rank holds it.
std::string state_name(const std::string& kind, const nn::Parameter& p);

struct StateName {
  std::string key;  // "<kind>/<parameter>": the whole tensor's name
  nn::TensorSlice slice;
};
// nullopt when `name` is not of the form state_name writes.
std::optional<StateName> parse_state_name(const std::string& name);

// Every whole tensor the shards hold, by "<kind>/<parameter>": slices joined (copied, bit for
// bit), a whole tensor taken from the first shard that has it. A tensor whose every copy and
// slice has no elements comes back empty (Tensor{}). Throws Error(bad_config) naming the
// checkpoint (`label`; default: the first shard's file) when the slices of a tensor do not
// cover it, disagree in shape or count, or are no slices along their axis.
std::map<std::string, nn::Tensor> whole_tensors(const std::vector<CheckpointContents>& shards,
                                                const std::string& label = "");

// The part of `whole` (of parameter `p`'s full shape) that `p` holds under its slice.
nn::Tensor slice_of(const nn::Tensor& whole, const nn::Parameter& p);

// A parameter's value and AdamW state as one rank holds them.
struct HeldState {
  nn::Tensor value;
  nn::AdamWState adam;  // m and v empty: no optimizer step taken yet
};

// The training state of a checkpoint written under any layout, whole, for cutting the slices
// of another layout's parameters (resharding on load).
class WholeState {
 public:
  // `file` names the checkpoint in errors (its commit record).
  WholeState(const std::vector<CheckpointContents>& shards, std::string file);
  // `p`'s value and AdamW state under p's slice. Error(bad_config) naming the parameter and the
  // file when the checkpoint lacks its value, its moments or its step, or holds another shape.
  HeldState held_by(const nn::Parameter& p) const;

 private:
  std::map<std::string, nn::Tensor> whole_;
  std::map<std::string, std::int64_t> steps_;  // by parameter name
  std::string file_;
};

}  // namespace braid::train
