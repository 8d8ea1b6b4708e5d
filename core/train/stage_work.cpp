#include "core/train/stage_work.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "core/common/error.hpp"
#include "core/nn/flat_parameters.hpp"
#include "core/train/device_collectives.hpp"
#include "core/train/host_staging.hpp"
#include "core/train/zero.hpp"

namespace braid::train {

nn::TensorParallel tensor_parallel_group(nn::Ops& ops, runtime::Communicator& group, int rank, bool sequence_parallel,
                                         std::function<void(double)> waited, DeviceGroup* on_device) {
  nn::TensorParallel tp(rank, group.size(), [&ops, &group, waited, on_device](nn::Tensor& t) {
    if (on_device && !t.device().is_host()) {
      waited(on_device->allreduce_sum(t));
      return;
    }
    edit_on_host(ops, t, [&](nn::Tensor& host) {
      auto req = group.iallreduce(std::span<float>(host.data));
      waited(req.wait());
    });
  });
  tp.ops = &ops;  // the sequence splits and the vocabulary-parallel loss stage through host memory
  if (!sequence_parallel) return tp;
  tp.sequence_parallel = true;
  tp.allgather = [&group, waited](std::span<const float> mine, std::span<float> all) {
    auto req = group.iallgather(std::as_bytes(mine), std::as_writable_bytes(all));
    waited(req.wait());
  };
  tp.reduce_scatter = [&group, waited](std::span<const float> all, std::span<float> mine) {
    auto req = group.ireduce_scatter(all, mine);
    waited(req.wait());
  };
  return tp;
}

void install_messages(Interpreter& in, std::function<Pending(const pipeline::Instruction&)> receive,
                      std::function<void(const pipeline::Instruction&)> send) {
  in.set(pipeline::Op::recv_activation, receive);
  in.set(pipeline::Op::recv_grad, receive);
  auto sent = [send](const pipeline::Instruction& i) {
    send(i);
    return Pending{};
  };
  in.set(pipeline::Op::send_activation, sent);
  in.set(pipeline::Op::send_grad, sent);
}

std::vector<data::Sample> take_samples(Prefetcher& prefetch, std::int64_t step, StepResult& r) {
  // The whole call, not only its wait: where every core holds a rank, the worker it wakes for
  // the next steps takes this rank's core before the call returns.
  const double start = now_seconds();
  std::vector<data::Sample> samples = prefetch.take(step);
  r.data_seconds += now_seconds() - start;
  for (const data::Sample& s : samples) {
    if (s.pixels.empty())
      ++r.described;
    else
      r.rendered_sides.push_back(s.side);
  }
  return samples;
}

Pending blocked_for(double seconds) {
  return {[] { return true; }, [seconds] { return seconds; }};
}

Pending pending_requests(std::vector<runtime::Request> requests, std::function<void()> then) {
  struct Posted {
    std::function<void()> then;              // may own the requests' buffers
    std::vector<runtime::Request> requests;  // declared after: dropped unfinished, they wait first
  };
  auto shared = std::make_shared<Posted>(Posted{std::move(then), std::move(requests)});
  Pending p;
  p.test = [shared] {
    return std::all_of(shared->requests.begin(), shared->requests.end(), [](runtime::Request& r) { return r.test(); });
  };
  p.finish = [shared] {
    double waited = 0;
    for (auto& r : shared->requests) waited += r.wait();
    if (shared->then) std::exchange(shared->then, {})();
    return waited;
  };
  return p;
}

Pending post_allreduce_gradients(nn::Ops& ops, runtime::Communicator& comm, std::vector<nn::Parameter*> params,
                                 CommBytes& bytes) {
  params = nn::layout_order(params);
  std::size_t total = 0;
  for (auto* p : params) total += p->grad.data.size();
  std::vector<runtime::Request> requests;
  const nn::Device device = params.empty() ? nn::Device{} : params.front()->grad.device();
  float* laid_out = nn::end_to_end_gradients(params, device);
  if (laid_out && device.is_host()) {  // no copy, the layout kept alive until it is done
    requests.push_back(comm.iallreduce(std::span<float>(laid_out, total)));
    return pending_requests(std::move(requests), [keep = nn::gradient_keepers(params)] {});
  }
  if (laid_out) {
    // Laid out on a device whose collectives stage through host memory (processes sharing a
    // GPU): one download and one upload, where each gradient took its own.
    struct Staged {
      nn::Tensor on_device, on_host;
      std::optional<CountedBytes> counted;
    };
    auto staged = std::make_shared<Staged>();
    staged->on_device.shape = {static_cast<std::int64_t>(total)};
    staged->on_device.data = nn::Storage::borrow(laid_out, total, device);
    staged->on_host = ops.to_host(staged->on_device);
    staged->counted.emplace(total * sizeof(float), bytes.in_flight);
    bytes.sample();  // the gradients and their copy
    requests.push_back(comm.iallreduce(std::span<float>(staged->on_host.data)));
    return pending_requests(std::move(requests), [&ops, staged, laid_out] {
      ops.assign_from_host(staged->on_device, std::move(staged->on_host));
      if (staged->on_device.ptr() != laid_out)
        throw Error(Status::internal, ops.name() + " put the summed gradients elsewhere instead of in place");
    });
  }
  auto flat = std::make_shared<CommBuffer>(total, bytes.in_flight);
  std::size_t at = 0;
  for (auto* p : params) {
    nn::Tensor scratch;
    const nn::Tensor& grad = on_host(ops, p->grad, scratch);
    std::copy(grad.data.begin(), grad.data.end(), flat->data.begin() + static_cast<std::ptrdiff_t>(at));
    at += grad.data.size();
  }
  bytes.sample();  // the gradients and their copy
  requests.push_back(comm.iallreduce(std::span<float>(flat->data)));
  return pending_requests(std::move(requests), [&ops, flat, params = std::move(params)] {
    std::size_t at = 0;
    for (auto* p : params) {
      const auto n = p->grad.data.size();
      edit_on_host(ops, p->grad, [&](nn::Tensor& grad) {
        std::copy(flat->data.begin() + static_cast<std::ptrdiff_t>(at),
                  flat->data.begin() + static_cast<std::ptrdiff_t>(at + n), grad.data.begin());
      });
      at += n;
    }
  });
}

double allreduce_gradients(nn::Ops& ops, runtime::Communicator& comm, const std::vector<nn::Parameter*>& params,
                           CommBytes& bytes) {
  return post_allreduce_gradients(ops, comm, params, bytes).finish();
}

double reduce_module_gradients(nn::Ops& ops, ZeroModule* zero, DeviceGroup* on_device, runtime::Communicator& dp,
                               const std::vector<nn::Parameter*>& params, CommBytes& bytes) {
  if (zero) return zero->reduce();
  if (on_device) return on_device->allreduce_gradients(params, bytes);
  return allreduce_gradients(ops, dp, params, bytes);
}

}  // namespace braid::train
