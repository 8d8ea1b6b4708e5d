#include "core/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <unordered_map>

#include "core/common/error.hpp"
#include "core/pipeline/validate.hpp"
#include "core/sim/shared_cores.hpp"

namespace braid::sim {

using pipeline::Instruction;
using pipeline::Op;
using pipeline::Program;
using pipeline::StageProgram;

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::dp_start:
      return "dp_start";
    case Cause::dp_end:
      return "dp_end";
    case Cause::dp_shard:
      return "dp_shard";
    case Cause::pp_warmup:
      return "pp_warmup";
    case Cause::pp_cooldown:
      return "pp_cooldown";
    case Cause::pp_other:
      return "pp_other";
    case Cause::tp:
      return "tp";
    case Cause::batch_sync:
      return "batch_sync";
    case Cause::imbalance:
      return "imbalance";
  }
  return "?";
}

namespace {

enum class Wait { recv, dp, sync };

struct Idle {
  double start, end;
  Wait kind;
};

struct Rank {
  int stage = 0, replica = 0;
  std::size_t pc = 0;
  double compute = 0, send = 0;  // when each stream is free
  double busy = 0;
  std::array<double, kCauseCount> direct{};  // tp, dp_shard: known when they happen
  std::vector<Idle> idle;                    // classified once the timeline is known
  double first_forward = -1, last_backward = 0;
  double tp_slack = 0;      // TP-collective wait of the last forward/backward not yet filled by encoder tasks
  double dp_issued = -1;    // when the llm's gradient reduction was issued early (kInDpWait tasks); -1: not
  double gather_slack = 0;  // the llm's parameter all-gather at the step's start not yet filled by tasks
  double last_comm = 0;     // when it last communicated (spec::LinkSpec::after_compute's gap starts there)
  double live = 0, peak = 0;
  std::unordered_map<long long, double> stored;  // (microbatch, chunk) -> activation bytes
  bool waiting_recv = false;                     // woken by a message
  bool done = false;
};

// A message queue between a sending stage and a receiving rank.
long long message_key(int to_rank, int from_stage, bool grad, int microbatch) {
  return (static_cast<long long>(to_rank) << 40) | (static_cast<long long>(from_stage) << 28) |
         (static_cast<long long>(grad) << 27) | static_cast<long long>(microbatch & ((1 << 27) - 1));
}

struct Collective {
  int expected = 0, arrived = 0;
  double latest = 0;
  double issued = 0;                            // the latest early issue of the arrivals' llm reductions ...
  bool all_issued = true;                       // ... when every arrival issued one
  std::vector<std::pair<int, double>> waiting;  // rank, arrival
};

class Simulation {
 public:
  // `slow`: multipliers of each compute instruction's time (shared cores), or null;
  // `spans`: record when each compute instruction ran (spans()).
  Simulation(const Program& p, const Options& o, const Slowdowns* slow = nullptr, bool spans = false)
      : p_(p), o_(o), slow_(slow) {
    for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
      first_rank_.push_back(static_cast<int>(ranks_.size()));
      for (int r = 0; r < p.stages[static_cast<std::size_t>(s)].replicas; ++r) {
        Rank k;
        k.stage = s;
        k.replica = r;
        ranks_.push_back(std::move(k));
        if (spans) spans_.emplace_back(p.stages[static_cast<std::size_t>(s)].instructions.size());
      }
    }
    // Members of every collective, known before anyone arrives.
    for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
      const auto& st = p.stages[static_cast<std::size_t>(s)];
      reduce_[s].expected = st.replicas;
      std::vector<int> seen;
      for (const auto& i : st.instructions) {
        if (i.op == Op::batch_sync && std::find(seen.begin(), seen.end(), i.group) == seen.end()) {
          seen.push_back(i.group);
          sync_[i.group].expected += st.replicas;
        }
      }
    }
  }

  Result run() {
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      // A rank makes its samples when that is in the step's time; then a colocated stage's
      // step starts with the llm's parameter all-gather.
      Rank& k = ranks_[static_cast<std::size_t>(r)];
      const auto& data = stage_of(k).data_s;
      k.gather_slack = stage_of(k).gather_s;
      k.compute = (data.empty() ? 0.0 : data[static_cast<std::size_t>(k.replica)]) + k.gather_slack;
      if (k.gather_slack > 0) k.last_comm = k.compute;  // the all-gather
      runnable_.push_back(r);
    }
    while (!runnable_.empty()) {
      int r = runnable_.front();
      runnable_.pop_front();
      advance(r);
    }
    for (const auto& k : ranks_) {
      if (!k.done) deadlock();
    }
    for (const auto& [key, q] : messages_) {
      if (!q.empty()) unmatched(key);
    }
    return collect();
  }

  const Spans& spans() const { return spans_; }

 private:
  const StageProgram& stage_of(const Rank& k) const { return p_.stages[static_cast<std::size_t>(k.stage)]; }

  // Ranks of stage `to` that replica `from_replica` of stage `from` sends to.
  std::pair<int, int> targets(int from, int from_replica, int to) const {
    const int a = p_.stages[static_cast<std::size_t>(from)].replicas,
              b = p_.stages[static_cast<std::size_t>(to)].replicas;
    if (a % b != 0 && b % a != 0) {
      throw Error(Status::invalid_argument,
                  "stages '" + p_.stages[static_cast<std::size_t>(from)].name + "' (" + std::to_string(a) +
                      " replicas) and '" + p_.stages[static_cast<std::size_t>(to)].name + "' (" + std::to_string(b) +
                      " replicas) cannot exchange data: neither width divides the other");
    }
    if (a >= b) return {from_replica / (a / b), 1};
    return {from_replica * (b / a), b / a};
  }
  int expected_messages(int from, int to) const {
    const int a = p_.stages[static_cast<std::size_t>(from)].replicas,
              b = p_.stages[static_cast<std::size_t>(to)].replicas;
    return a > b ? a / b : 1;
  }

  void record(int r, int lane, double start, double duration, double waited = 0) {
    const Rank& k = ranks_[static_cast<std::size_t>(r)];
    if (!o_.trace || duration <= 0) return;
    if (o_.trace_replicas >= 0 && k.replica >= o_.trace_replicas) return;
    trace_.push_back({r, lane, k.stage, static_cast<int>(k.pc), start, duration, waited});
  }

  void compute(int r, const Instruction& i) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    const auto& st = stage_of(k);
    double busy = 0, tp = 0, shard = 0;
    if (i.op == Op::optimizer_step) {
      busy = st.optimizer_s;
    } else {
      if (i.unit < 0 || i.unit >= static_cast<int>(st.units.size())) {
        throw Error(Status::invalid_argument, "stage '" + st.name + "' instruction " + std::to_string(k.pc) + " (" +
                                                  pipeline::op_name(i.op) + ") names work unit " +
                                                  std::to_string(i.unit) + " of " + std::to_string(st.units.size()));
      }
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      const bool backward = pipeline::work_kind(i) == pipeline::WorkKind::backward;
      const long long key = (static_cast<long long>(i.microbatch) << 24) | ((i.unit & 0xfff) << 12) | (i.chunk & 0xfff);
      if (backward) {
        busy = u.backward_s;
        tp = u.backward_tp_s;
        shard = u.shard_comm_s;
        k.peak = std::max(k.peak, k.live + u.recompute_bytes);  // the recomputed layer, beside what is kept
        auto it = k.stored.find(key);
        if (it != k.stored.end()) {
          k.live -= it->second;
          k.stored.erase(it);
        }
      } else {
        busy = (i.flags & pipeline::kRecompute) ? u.recompute_s : u.forward_s;
        tp = u.forward_tp_s;
        double keep = (i.flags & pipeline::kNoStore) ? u.input_bytes : u.activation_bytes;
        if (i.op == Op::forward || i.op == Op::encoder_task) {
          k.stored[key] += keep;
          k.live += keep;
          k.peak = std::max(k.peak, k.live);
        }
        if (i.op == Op::forward && k.first_forward < 0) k.first_forward = k.compute;
      }
    }
    if (i.op == Op::forward || i.op == Op::backward || i.op == Op::encoder_task) {
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      const double scale = i.op != Op::encoder_task                      ? load_scale(k, st.work_scale, i.microbatch)
                           : u.kind != pipeline::UnitKind::encoder_shard ? load_scale(k, st.task_scale, i.microbatch)
                                                                         : 1.0;
      busy *= scale;
      tp *= scale;
    }
    if (slow_ && !slow_->empty()) busy *= (*slow_)[static_cast<std::size_t>(r)][k.pc];
    // The first task in the DP wait issues the llm's gradient reduction, whose gradients
    // were final when the stage's last llm backward ended.
    if (i.op == Op::encoder_task && (i.flags & pipeline::kInDpWait) && (i.flags & pipeline::kBackwardTask) &&
        k.dp_issued < 0)
      k.dp_issued = k.last_backward;
    if (behind_gather(i)) {  // the llm's parameter all-gather is in flight
      fill_wait(r, k.gather_slack, busy, tp);
      k.direct[static_cast<int>(Cause::tp)] += tp;
      return;
    }
    if (i.op == Op::encoder_task && (i.flags & pipeline::kInTpBubble)) {  // the previous instruction's TP collectives
      k.direct[static_cast<int>(Cause::tp)] += tp - fill_wait(r, k.tp_slack, busy, tp);
      return;
    }
    if (i.op == Op::backward) k.last_backward = k.compute + busy + tp + shard;
    record(r, 0, k.compute, busy + tp + shard, tp + shard);
    span(r, k.compute, busy);
    k.busy += busy;
    k.direct[static_cast<int>(Cause::tp)] += tp;
    k.direct[static_cast<int>(Cause::dp_shard)] += shard;
    k.compute += busy + tp + shard;
    if (tp + shard > 0) k.last_comm = k.compute;  // its collectives ran inside it
    k.tp_slack = (i.op == Op::forward || i.op == Op::backward) ? tp : 0;
  }

  // Runs a task of `busy` compute and `tp` collectives on the compute units inside a wait
  // already charged, `slack` of which is left before the rank's clock: that wait turns into
  // work; only what does not fit delays. Returns the seconds of the wait it filled.
  double fill_wait(int r, double& slack, double busy, double tp) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    const double absorbed = std::min(busy + tp, slack);
    if (tp > 0) k.last_comm = std::max(k.last_comm, k.compute - slack + busy + tp);  // its collectives
    record(r, 0, k.compute - slack, busy + tp, tp);
    span(r, k.compute - slack, busy);
    slack -= absorbed;
    k.busy += busy;
    k.compute += busy + tp - absorbed;
    return absorbed;
  }

  static bool behind_gather(const Instruction& i) {
    return i.op == Op::encoder_task && (i.flags & pipeline::kInDpWait) && !(i.flags & pipeline::kBackwardTask);
  }

  // What is left of the parameter all-gather's wait is idle (DP, before the first forward).
  static void settle_gather(Rank& k) {
    if (k.gather_slack > 0) k.idle.push_back({k.compute - k.gather_slack, k.compute, Wait::dp});
    k.gather_slack = 0;
  }

  void span(int r, double start, double busy) {
    if (spans_.empty() || busy <= 0) return;
    spans_[static_cast<std::size_t>(r)][ranks_[static_cast<std::size_t>(r)].pc] = {start, start + busy};
  }

  // The data-dependent load of microbatch `mb` on this rank in `loads` (a stage's work_scale
  // or task_scale): 1 without per-sample sizes.
  double load_scale(const Rank& k, const std::vector<double>& loads, int mb) const {
    if (loads.empty() || mb < 0) return 1;
    const std::size_t slots = loads.size() / static_cast<std::size_t>(stage_of(k).replicas);
    const std::size_t at = static_cast<std::size_t>(k.replica) * slots + static_cast<std::size_t>(mb);
    return static_cast<std::size_t>(mb) < slots ? loads[at] : 1;
  }

  void send(int r, const Instruction& i) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    const auto& st = stage_of(k);
    const bool grad = i.op == Op::send_grad;
    if (i.peer < 0 || i.peer >= static_cast<int>(p_.stages.size())) {
      throw Error(Status::invalid_argument, "stage '" + st.name + "' instruction " + std::to_string(k.pc) + " (" +
                                                pipeline::op_name(i.op) + ") has no valid peer stage");
    }
    const double start = std::max(k.send, k.compute);
    // An ordering-only message: its transfer is charged inside the work it orders.
    const double cost = (i.flags & pipeline::kSyncOnly) ? 0 : grad ? st.send_grad_s : st.send_activation_s;
    const double end = start + cost;
    record(r, 1, start, end - start);
    k.send = end;
    k.last_comm = k.compute;
    auto [first, count] = targets(k.stage, k.replica, i.peer);
    for (int t = first; t < first + count; ++t) {
      const int to = first_rank_[static_cast<std::size_t>(i.peer)] + t;
      auto& q = messages_[message_key(to, k.stage, grad, i.microbatch)];
      q.push_back(end);
      Rank& dest = ranks_[static_cast<std::size_t>(to)];
      if (dest.waiting_recv) {
        dest.waiting_recv = false;
        runnable_.push_back(to);
      }
    }
  }

  // True when the receive completed; false when the rank must wait.
  bool receive(int r, const Instruction& i) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    if (i.peer < 0 || i.peer >= static_cast<int>(p_.stages.size())) {
      throw Error(Status::invalid_argument, "stage '" + stage_of(k).name + "' instruction " + std::to_string(k.pc) +
                                                " (" + pipeline::op_name(i.op) + ") has no valid peer stage");
    }
    const bool grad = i.op == Op::recv_grad;
    const int need = expected_messages(i.peer, k.stage);
    auto it = messages_.find(message_key(r, i.peer, grad, i.microbatch));
    if (it == messages_.end() || static_cast<int>(it->second.size()) < need) return false;
    double arrival = 0;
    for (int n = 0; n < need; ++n) {
      arrival = std::max(arrival, it->second.front());
      it->second.pop_front();
    }
    if (arrival > k.compute) {
      k.idle.push_back({k.compute, arrival, Wait::recv});
      k.compute = arrival;
      k.tp_slack = 0;
    }
    k.last_comm = k.compute;
    return true;
  }

  // Arrives at a collective; true when this arrival completed it (everyone released).
  // `comm`: the part of `duration` that is collectives (spec::LinkSpec::after_compute);
  // `early`: the part of `duration` that ran from its early issue (a DP reduction).
  void arrive(int r, Collective& c, double duration, double comm, Wait kind, int lane, double early = 0) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    c.arrived++;
    c.latest = std::max(c.latest, k.compute);
    c.issued = std::max(c.issued, k.dp_issued);
    c.all_issued = c.all_issued && k.dp_issued >= 0;
    c.waiting.emplace_back(r, k.compute);
    if (c.arrived < c.expected) return;
    // Collectives entered after a stretch of compute run slower than back to back
    // (spec::LinkSpec::after_compute): at the longest stretch among the members.
    if (comm > 0 && !p_.dp_link.after_compute.empty()) {
      double gap = 0;
      for (auto [w, at] : c.waiting) {
        const Rank& m = ranks_[static_cast<std::size_t>(w)];
        // A reduction issued early entered the link then, before the tasks in its wait.
        const double entered = early > 0 && m.dp_issued >= 0 ? m.dp_issued : at;
        gap = std::max(gap, entered - m.last_comm);
      }
      duration += p_.dp_link.after_compute_seconds(comm, gap) - comm;
    }
    // Issued early, the llm's reduction ran behind the tasks in its wait; the rest follows it.
    const double end =
        early > 0 && c.all_issued ? std::max(c.latest, c.issued + early) + duration - early : c.latest + duration;
    for (auto [w, at] : c.waiting) {
      Rank& m = ranks_[static_cast<std::size_t>(w)];
      m.idle.push_back({at, end, kind});
      record(w, lane, c.latest, end - c.latest);
      m.compute = end;
      m.last_comm = end;
      m.tp_slack = 0;
      m.pc++;
      runnable_.push_back(w);
    }
    c.waiting.clear();
  }

  void advance(int r) {
    Rank& k = ranks_[static_cast<std::size_t>(r)];
    const auto& ins = stage_of(k).instructions;
    while (k.pc < ins.size()) {
      const Instruction& i = ins[k.pc];
      ++events_;
      // Only tasks behind the all-gather (and sends, which leave no earlier) fill its wait.
      if (k.gather_slack > 0 && !behind_gather(i) && i.op != Op::send_activation && i.op != Op::send_grad &&
          i.op != Op::load_microbatch)
        settle_gather(k);
      switch (i.op) {
        case Op::load_microbatch:
          break;
        case Op::forward:
        case Op::backward:
        case Op::encoder_task:
        case Op::optimizer_step:
          compute(r, i);
          break;
        case Op::send_activation:
        case Op::send_grad:
          send(r, i);
          break;
        case Op::recv_activation:
        case Op::recv_grad:
          if (!receive(r, i)) {
            --events_;
            k.waiting_recv = true;
            return;
          }
          break;
        case Op::reduce_grads:
          arrive(r, reduce_[k.stage], stage_of(k).reduce_grads_s, stage_of(k).reduce_grads_s, Wait::dp, 2,
                 std::min(stage_of(k).early_reduce_s, stage_of(k).reduce_grads_s));
          return;  // resumed by the collective
        case Op::batch_sync:
          arrive(r, sync_[i.group], p_.batch_sync_s, p_.batch_sync_comm_s, Wait::sync, 2);
          return;
      }
      ++k.pc;
    }
    settle_gather(k);
    k.done = true;
  }

  std::string describe(const Rank& k) const {
    const auto& st = stage_of(k);
    const auto& i = st.instructions[k.pc];
    std::string s = "stage '" + st.name + "' (replica " + std::to_string(k.replica) + ") waits at instruction " +
                    std::to_string(k.pc) + ": " + pipeline::op_name(i.op);
    if (i.microbatch >= 0) s += " microbatch " + std::to_string(i.microbatch);
    if (i.peer >= 0 && i.peer < static_cast<int>(p_.stages.size())) {
      s += (i.op == Op::recv_activation || i.op == Op::recv_grad ? " from '" : " to '") +
           p_.stages[static_cast<std::size_t>(i.peer)].name + "'";
    }
    if (i.group >= 0) s += " group " + std::to_string(i.group);
    return s;
  }

  [[noreturn]] void deadlock() const {
    std::string msg = "the program deadlocks; stuck instructions:";
    int shown = 0;
    std::vector<int> stages_shown;
    for (const auto& k : ranks_) {
      if (k.done || std::find(stages_shown.begin(), stages_shown.end(), k.stage) != stages_shown.end()) continue;
      stages_shown.push_back(k.stage);
      if (++shown > 16) {
        msg += "\n  ...";
        break;
      }
      msg += "\n  " + describe(k);
    }
    throw Error(Status::invalid_argument, msg);
  }

  [[noreturn]] void unmatched(long long key) const {
    const int to = static_cast<int>(key >> 40), from = static_cast<int>((key >> 28) & 0xfff);
    const bool grad = (key >> 27) & 1;
    const int mb = static_cast<int>(key & ((1 << 27) - 1));
    const auto& dest = ranks_[static_cast<std::size_t>(to)];
    throw Error(Status::invalid_argument, std::string(grad ? "SendGrad" : "SendActivation") + " of microbatch " +
                                              std::to_string(mb) + " from stage '" +
                                              p_.stages[static_cast<std::size_t>(from)].name + "' to stage '" +
                                              stage_of(dest).name + "' has no matching receive");
  }

  Result collect() {
    Result res;
    double end = 0;
    for (const auto& k : ranks_) end = std::max(end, k.compute);
    res.step_time_s = end;
    res.ranks = static_cast<int>(ranks_.size());
    res.events = events_;
    res.stages.resize(p_.stages.size());
    double busy_devices = 0;
    int devices = 0;
    for (std::size_t s = 0; s < p_.stages.size(); ++s) {
      const auto& st = p_.stages[s];
      res.stages[s].name = st.name;
      res.stages[s].replicas = st.replicas;
      res.stages[s].devices_per_replica = st.devices_per_replica;
      devices += st.replicas * st.devices_per_replica;
    }
    for (auto& k : ranks_) {
      std::array<double, kCauseCount> b = k.direct;
      const auto& st = p_.stages[static_cast<std::size_t>(k.stage)];
      for (const auto& w : k.idle) {
        const double d = w.end - w.start;
        Cause c = Cause::pp_other;
        if (w.kind == Wait::sync) {
          c = Cause::batch_sync;
        } else if (w.kind == Wait::dp) {
          c = k.first_forward < 0 || w.start < k.first_forward ? Cause::dp_start : Cause::dp_end;
        } else if (k.first_forward < 0 || w.end <= k.first_forward) {
          c = Cause::pp_warmup;  // before this stage's first forward
        } else if (w.start >= k.last_backward) {
          c = Cause::pp_cooldown;  // after this stage's last backward
        }
        b[static_cast<int>(c)] += d;
      }
      // Done early: a pipeline stage waits for its pipeline to drain; a stage in no
      // pipeline (a one-stage branch) waits for slower branches.
      const bool piped = !st.prev.empty() || !st.next.empty();
      b[static_cast<int>(piped ? Cause::pp_cooldown : Cause::imbalance)] += end - k.compute;
      auto& out = res.stages[static_cast<std::size_t>(k.stage)];
      const double weight = double(st.devices_per_replica) / devices;
      for (int c = 0; c < kCauseCount; ++c) {
        res.bubbles[static_cast<std::size_t>(c)] += b[static_cast<std::size_t>(c)] * weight;
        out.bubbles[static_cast<std::size_t>(c)] += b[static_cast<std::size_t>(c)] / st.replicas;
      }
      out.busy_s += k.busy / st.replicas;
      out.idle_s += (end - k.busy) / st.replicas;
      plan::MemoryBreakdown held = st.memory;
      held.activations = k.peak;
      out.peak_memory_bytes = std::max(out.peak_memory_bytes, held.total());
      out.finish_s = std::max(out.finish_s, k.compute);
      busy_devices += k.busy * st.devices_per_replica;
      res.rank_stage.push_back(k.stage);
      res.rank_replica.push_back(k.replica);
    }
    res.devices = devices;
    res.bubble_fraction = end > 0 ? std::clamp(1 - busy_devices / (end * devices), 0.0, 1.0) : 0;
    for (const auto& s : res.stages)
      res.peak_memory_gib = std::max(res.peak_memory_gib, s.peak_memory_bytes / (1024.0 * 1024 * 1024));
    if (end > 0 && p_.peak_flops > 0) res.mfu = p_.model_flops / (end * devices * p_.peak_flops);
    res.trace = std::move(trace_);
    return res;
  }

  const Program& p_;
  Options o_;
  const Slowdowns* slow_;
  Spans spans_;
  std::vector<Rank> ranks_;
  std::vector<int> first_rank_;
  std::deque<int> runnable_;
  std::unordered_map<long long, std::deque<double>> messages_;
  std::unordered_map<int, Collective> reduce_, sync_;
  std::vector<TraceEvent> trace_;
  long long events_ = 0;
};

// Fixed-point rounds of a shared-cores simulation (tiny CPU runs converge in 5-15).
constexpr int kSharingRounds = 40;

}  // namespace

Result simulate(const Program& program, const Options& options) {
  pipeline::validate(program);
  if (program.stages.size() >= (1u << 12)) throw Error(Status::invalid_argument, "a program has at most 4095 stages");
  if (!SharedCores::applies(program)) return Simulation(program, options).run();
  // Ranks sharing cores: each compute instruction's time depends on what computes beside
  // it, which depends on the timeline. Iterate to the fixed point: simulate, take every
  // instruction's slowdown from the load it overlapped, simulate again with half of the
  // change (damping keeps two ranks that trade places from oscillating), until the step
  // stops moving.
  const SharedCores cores(program);
  Slowdowns slow;
  Result result;
  double previous = -1;
  for (int round = 0; round < kSharingRounds; ++round) {
    Simulation s(program, options, &slow, true);
    result = s.run();
    if (std::abs(result.step_time_s - previous) <= 1e-4 * result.step_time_s) break;
    previous = result.step_time_s;
    Slowdowns next = cores.slowdowns(s.spans());
    if (!slow.empty()) {
      for (std::size_t r = 0; r < next.size(); ++r)
        for (std::size_t i = 0; i < next[r].size(); ++i) next[r][i] = 0.5 * (next[r][i] + slow[r][i]);
    }
    slow = std::move(next);
  }
  return result;
}

}  // namespace braid::sim
