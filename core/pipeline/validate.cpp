#include "core/pipeline/validate.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/common/error.hpp"

namespace braid::pipeline {
namespace {

[[noreturn]] void fail(const Program& p, int s, std::size_t pc, const std::string& what) {
  const auto& st = p.stages[static_cast<std::size_t>(s)];
  const auto& i = st.instructions[pc];
  throw Error(Status::invalid_argument,
              "stage '" + st.name + "' instruction " + std::to_string(pc) + " (" + op_name(i.op) + "): " + what);
}

}  // namespace

void validate(const Program& p) {
  const int n = static_cast<int>(p.stages.size());
  if (n == 0) throw Error(Status::invalid_argument, "the program has no stages");
  // (from, to, grad?, microbatch) -> sends minus receives
  std::map<std::tuple<int, int, bool, int>, int> balance;
  std::set<int> groups;
  for (int s = 0; s < n; ++s) {
    const auto& st = p.stages[static_cast<std::size_t>(s)];
    if (st.replicas < 1 || st.devices_per_replica < 1) {
      throw Error(Status::invalid_argument, "stage '" + st.name + "' needs at least one replica of one device");
    }
    for (const auto& [name, loads] :
         {std::pair{"work_scale", &st.work_scale}, std::pair{"task_scale", &st.task_scale}}) {
      if (loads->size() % static_cast<std::size_t>(st.replicas) != 0) {
        throw Error(Status::invalid_argument, "stage '" + st.name + "': " + name + " holds " +
                                                  std::to_string(loads->size()) + " loads, not a multiple of its " +
                                                  std::to_string(st.replicas) + " replicas");
      }
      for (double w : *loads) {
        if (!(w >= 0 && w < kMaxWorkScale))
          throw Error(Status::invalid_argument, "stage '" + st.name + "': a " + name + " is not a load");
      }
    }
    if (!st.data_s.empty() && st.data_s.size() != static_cast<std::size_t>(st.replicas))
      throw Error(Status::invalid_argument, "stage '" + st.name + "': data_s holds " +
                                                std::to_string(st.data_s.size()) + " times for its " +
                                                std::to_string(st.replicas) + " replicas");
    for (double d : st.data_s)
      if (!(d >= 0 && d < 1e9))
        throw Error(Status::invalid_argument, "stage '" + st.name + "': a data_s is not a time");
    if (!(st.early_reduce_s >= 0 && st.early_reduce_s < 1e9 && st.gather_s >= 0 && st.gather_s < 1e9))
      throw Error(Status::invalid_argument, "stage '" + st.name + "': its DP collectives take no valid time");
    Op last_compute = Op::load_microbatch;  // what a TP-bubble task would fill
    bool in_dp_wait = false, reduced = false, llm_started = false;
    for (std::size_t pc = 0; pc < st.instructions.size(); ++pc) {
      const auto& i = st.instructions[pc];
      if (i.flags & kInDpWait) {
        if (i.op != Op::encoder_task) fail(p, s, pc, "runs in a DP wait but is no encoder task");
        if (!(i.flags & kBackwardTask) && llm_started)
          fail(p, s, pc, "runs in the parameter all-gather's wait after the stage's first llm instruction");
        if (i.flags & kBackwardTask) {
          if (reduced) fail(p, s, pc, "runs in the DP wait of a reduction already done");
          in_dp_wait = true;
        }
      }
      if (in_dp_wait && (i.op == Op::forward || i.op == Op::backward))
        fail(p, s, pc, "follows a task in the DP wait, which the stage's last llm backward issues");
      llm_started = llm_started || i.op == Op::forward || i.op == Op::backward;
      reduced = reduced || i.op == Op::reduce_grads;
      if (i.op == Op::encoder_task && (i.flags & kInTpBubble)) {
        if (last_compute != Op::forward && last_compute != Op::backward)
          fail(p, s, pc, "fills a TP bubble but follows no forward or backward");
      } else if (i.op != Op::send_activation && i.op != Op::send_grad && i.op != Op::load_microbatch) {
        last_compute = i.op;
      }
      const bool p2p =
          i.op == Op::send_activation || i.op == Op::recv_activation || i.op == Op::send_grad || i.op == Op::recv_grad;
      if (p2p && (i.peer < 0 || i.peer >= n || i.peer == s)) fail(p, s, pc, "has no valid peer stage");
      if (p2p && i.microbatch < 0) fail(p, s, pc, "needs a microbatch");
      // Bounds the simulator's keys rely on.
      if (i.microbatch >= kMaxMicrobatch)
        fail(p, s, pc, "microbatch " + std::to_string(i.microbatch) + " is too large");
      if (i.chunk < 0 || i.chunk >= kMaxChunk) fail(p, s, pc, "chunk " + std::to_string(i.chunk) + " is out of range");
      const bool work = i.op == Op::forward || i.op == Op::backward || i.op == Op::encoder_task;
      if (work && (i.unit < 0 || i.unit >= static_cast<int>(st.units.size()) || i.unit >= kMaxChunk)) {
        fail(p, s, pc, "names work unit " + std::to_string(i.unit) + " of " + std::to_string(st.units.size()));
      }
      if (i.op == Op::send_activation) balance[{s, i.peer, false, i.microbatch}]++;
      if (i.op == Op::send_grad) balance[{s, i.peer, true, i.microbatch}]++;
      if (i.op == Op::recv_activation) balance[{i.peer, s, false, i.microbatch}]--;
      if (i.op == Op::recv_grad) balance[{i.peer, s, true, i.microbatch}]--;
      if (i.op == Op::batch_sync) {
        if (i.group < 0) fail(p, s, pc, "needs a group");
        groups.insert(i.group);
      }
    }
  }
  for (const auto& [key, count] : balance) {
    if (count == 0) continue;
    auto [from, to, grad, mb] = key;
    throw Error(Status::invalid_argument,
                std::string(grad ? "gradients" : "activations") + " of microbatch " + std::to_string(mb) + " from '" +
                    p.stages[static_cast<std::size_t>(from)].name + "' to '" +
                    p.stages[static_cast<std::size_t>(to)].name + "': " + std::to_string(count > 0 ? count : -count) +
                    (count > 0 ? " send(s) without a matching receive" : " receive(s) without a matching send"));
  }
  if (groups.empty()) return;
  // The loss needs every branch: each last stage syncs each group once, before that group's backwards.
  for (int s = 0; s < n; ++s) {
    const auto& st = p.stages[static_cast<std::size_t>(s)];
    if (!st.next.empty()) continue;
    const int per_group = std::max(1, st.microbatches_per_group(p.group_microbatches));
    std::set<int> synced;
    for (std::size_t pc = 0; pc < st.instructions.size(); ++pc) {
      const auto& i = st.instructions[pc];
      if (i.op == Op::batch_sync && !synced.insert(i.group).second) fail(p, s, pc, "syncs its group twice");
      if (i.op == Op::backward && !synced.count(i.microbatch / per_group)) {
        fail(p, s, pc,
             "backward of microbatch " + std::to_string(i.microbatch) + " comes before the BatchSync of its group " +
                 std::to_string(i.microbatch / per_group));
      }
    }
    for (int g : groups) {
      if (!synced.count(g)) {
        throw Error(Status::invalid_argument, "stage '" + st.name +
                                                  "' ends a branch but never joins the BatchSync of group " +
                                                  std::to_string(g) + " (the contrastive loss needs every branch)");
      }
    }
  }
}

}  // namespace braid::pipeline
