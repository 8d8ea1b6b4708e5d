// Host staging: the trainer sends, reduces, checkpoints and inspects tensors in host memory
// (the MPI plugin, files, metrics), while its ops may keep them on a device (`braid train
// --device cuda`, or the emulated device). These cross at exactly those places, and cost
// nothing where a tensor already is host memory (the host ops).
#pragma once

#include <functional>
#include <vector>

#include "core/nn/ops.hpp"
#include "core/nn/tensor.hpp"
#include "core/runtime/communicator.hpp"
#include "core/train/stage_work.hpp"

namespace braid::train {

using nn::on_host;  // `t` itself when it is host memory, else its host copy in `scratch`
// `t` moved out when it is host memory; else its copy on the host.
nn::Tensor host_tensor(nn::Ops& ops, nn::Tensor&& t);
// Runs `edit` on `t`'s elements in host memory, then puts them back where `t` lives.
void edit_on_host(nn::Ops& ops, nn::Tensor& t, const std::function<void(nn::Tensor&)>& edit);
// `t`'s elements in host memory (for a send): moved out of host memory, copied from a device.
// `t` is left empty.
HostBuffer release_to_host(nn::Ops& ops, nn::Tensor& t);
// The parameters this rank holds (their values; the gradients of trainable ones) and the
// optimizer state of `trained` moved to where `ops` keeps tensors: after building or
// restoring them. The rest of the model stays in host memory.
void place_training_state(nn::Ops& ops, const std::vector<nn::Parameter*>& held,
                          std::vector<TrainedParameter>& trained);
// Every parameter value of `store` where `ops` keeps tensors (to evaluate the whole model);
// `release_unheld` puts back in host memory those this rank does not hold.
void place_all_values(nn::Ops& ops, nn::ParameterStore& store);
void release_unheld_values(nn::Ops& ops, nn::ParameterStore& store, const std::vector<nn::Parameter*>& held);
// Rank `root`'s `t` to every rank of `comm` (each holds a tensor of its shape already).
void broadcast(nn::Ops& ops, runtime::Communicator& comm, nn::Tensor& t, int root);

}  // namespace braid::train
