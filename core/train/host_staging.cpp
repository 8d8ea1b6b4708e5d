#include "core/train/host_staging.hpp"

#include <set>
#include <span>
#include <utility>

namespace braid::train {

nn::Tensor host_tensor(nn::Ops& ops, nn::Tensor&& t) { return t.device().is_host() ? std::move(t) : ops.to_host(t); }

void edit_on_host(nn::Ops& ops, nn::Tensor& t, const std::function<void(nn::Tensor&)>& edit) {
  if (t.device().is_host()) {
    edit(t);
    return;
  }
  nn::Tensor host = ops.to_host(t);
  edit(host);
  ops.assign_from_host(t, std::move(host));
}

HostBuffer release_to_host(nn::Ops& ops, nn::Tensor& t) {
  if (t.device().is_host()) return t.data.release();
  HostBuffer out = ops.to_host(t).data.release();
  t = nn::Tensor();
  return out;
}

namespace {

void place(nn::Ops& ops, nn::Tensor& t) {
  if (!t.data.empty()) t = ops.from_host(std::move(t));
}

}  // namespace

void place_training_state(nn::Ops& ops, const std::vector<nn::Parameter*>& held,
                          std::vector<TrainedParameter>& trained) {
  for (nn::Parameter* p : held) {
    place(ops, p->value);
    place(ops, p->grad);
  }
  for (TrainedParameter& t : trained) {
    place(ops, t.state.m);
    place(ops, t.state.v);
    place(ops, t.grad_shard);
    place(ops, t.value_shard);
  }
}

void place_all_values(nn::Ops& ops, nn::ParameterStore& store) {
  for (nn::Parameter* p : store.all()) place(ops, p->value);
}

void release_unheld_values(nn::Ops& ops, nn::ParameterStore& store, const std::vector<nn::Parameter*>& held) {
  const std::set<const nn::Parameter*> keep(held.begin(), held.end());
  for (nn::Parameter* p : store.all())
    if (!keep.count(p)) p->value = host_tensor(ops, std::move(p->value));
}

void broadcast(nn::Ops& ops, runtime::Communicator& comm, nn::Tensor& t, int root) {
  edit_on_host(ops, t,
               [&](nn::Tensor& host) { comm.broadcast(std::as_writable_bytes(std::span<float>(host.data)), root); });
}

}  // namespace braid::train
