#include "core/train/stage_work.hpp"

#include <algorithm>
#include <memory>

#include "core/common/error.hpp"

namespace braid::train {

void check_sequence_parallel(const spec::RunSpec& run, int tp) {
  if (run.training.sequence_parallel && tp > 1)
    throw Error(Status::unsupported, run.source +
                                         ": training.sequence_parallel: braid train runs tensor parallelism without "
                                         "sequence parallelism (the planner prices it); set it to false to train "
                                         "this plan here");
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

Pending blocked_for(double seconds) {
  return {[] { return true; }, [seconds] { return seconds; }};
}

Pending pending_requests(std::vector<runtime::Request> requests, std::function<void()> then) {
  auto shared = std::make_shared<std::vector<runtime::Request>>(std::move(requests));
  Pending p;
  p.test = [shared] {
    return std::all_of(shared->begin(), shared->end(), [](runtime::Request& r) { return r.test(); });
  };
  p.finish = [shared, then = std::move(then)] {
    double waited = 0;
    for (auto& r : *shared) waited += r.wait();
    if (then) then();
    return waited;
  };
  return p;
}

double allreduce_gradients(runtime::Communicator& comm, const std::vector<nn::Parameter*>& params) {
  std::size_t total = 0;
  for (auto* p : params)
    if (p->trainable) total += p->grad.data.size();
  std::vector<float> flat;
  flat.reserve(total);
  for (auto* p : params)
    if (p->trainable) flat.insert(flat.end(), p->grad.data.begin(), p->grad.data.end());
  auto req = comm.iallreduce(std::span<float>(flat));
  const double waited = req.wait();
  std::size_t at = 0;
  for (auto* p : params) {
    if (!p->trainable) continue;
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
              flat.begin() + static_cast<std::ptrdiff_t>(at + p->grad.data.size()), p->grad.data.begin());
    at += p->grad.data.size();
  }
  return waited;
}

}  // namespace braid::train
