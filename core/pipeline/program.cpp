#include "core/pipeline/program.hpp"

#include <algorithm>

#include "core/common/error.hpp"

namespace braid::pipeline {

const char* work_kind_name(WorkKind kind) {
  switch (kind) {
    case WorkKind::forward:
      return "forward";
    case WorkKind::backward:
      return "backward";
    case WorkKind::other:
      return "other";
    case WorkKind::communication:
      break;
  }
  return "communication";
}

WorkKind work_kind(const Instruction& i) {
  switch (i.op) {
    case Op::forward:
      return WorkKind::forward;
    case Op::backward:
      return WorkKind::backward;
    case Op::encoder_task:
      return (i.flags & kBackwardTask) ? WorkKind::backward : WorkKind::forward;
    case Op::load_microbatch:
    case Op::optimizer_step:
      return WorkKind::other;
    default:
      return WorkKind::communication;
  }
}

const char* op_name(Op op) {
  switch (op) {
    case Op::load_microbatch:
      return "LoadMicrobatch";
    case Op::forward:
      return "Forward";
    case Op::backward:
      return "Backward";
    case Op::send_activation:
      return "SendActivation";
    case Op::recv_activation:
      return "RecvActivation";
    case Op::send_grad:
      return "SendGrad";
    case Op::recv_grad:
      return "RecvGrad";
    case Op::batch_sync:
      return "BatchSync";
    case Op::reduce_grads:
      return "ReduceGrads";
    case Op::optimizer_step:
      return "OptimizerStep";
    case Op::encoder_task:
      return "EncoderTask";
  }
  return "?";
}

DevicePlace Program::place_of(int device) const {
  if (device < 0 || device >= devices) {
    throw Error(Status::invalid_argument, "rank " + std::to_string(device) + " is out of range (the program runs on " +
                                              std::to_string(devices) + (devices == 1 ? " device)" : " devices)"));
  }
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const StageProgram& st = stages[s];
    const int offset = device - st.first_device;
    if (offset < 0 || st.device_stride < 1) continue;
    const int replica = offset / st.device_stride, tp = offset % st.device_stride;
    if (replica < st.replicas && tp < st.devices_per_replica) return {static_cast<int>(s), replica, tp};
  }
  throw Error(Status::invalid_argument, "rank " + std::to_string(device) + " runs no stage of the program (its " +
                                            std::to_string(stages.size()) + " stages leave device " +
                                            std::to_string(device) + " idle)");
}

double gradient_scale(const Program& program, std::size_t stage) {
  if (stage >= program.stages.size()) {
    throw Error(Status::invalid_argument, "stage " + std::to_string(stage) + " is out of range (the program has " +
                                              std::to_string(program.stages.size()) + " stages)");
  }
  return 1.0;
}

MessagePeers message_peers(const StageProgram& stage) {
  MessagePeers out;
  for (const auto& i : stage.instructions) {
    if (i.op == Op::recv_activation || i.op == Op::send_grad) out.prev.push_back(i.peer);
    if (i.op == Op::send_activation || i.op == Op::recv_grad) out.next.push_back(i.peer);
  }
  for (auto* v : {&out.prev, &out.next}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  return out;
}

}  // namespace braid::pipeline
