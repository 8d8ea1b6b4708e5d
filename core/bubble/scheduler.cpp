#include "core/bubble/scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/bubble/emit.hpp"
#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::bubble {
namespace {

using pipeline::Op;
using pipeline::Program;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Pass { plain, coarse, fine };

// A window of a stage's timeline that encoder tasks may fill.
struct Gap {
  int slot = 0;           // emitted before llm instruction `slot` (or inside its TP waits)
  bool in_tp = false;     // the TP-collective waits of llm instruction `slot`
  bool warmup = false;    // before the stage's first llm instruction
  bool cooldown = false;  // after its last
  double a = 0, b = 0;    // when it opens and closes
  double bubble = 0;      // TP gaps: one collective's wait, the largest kernel that fits
  int bins = 0;           // TP gaps: collectives
  double used = 0;        // normal gaps: seconds already filled
  int bin = 0;            // TP gaps: the bin being filled ...
  double bin_used = 0;    // ... and how full it is
  double shift = 0;       // forced work placed before it on this stage (delays it)
};

// The llm's compute instructions of one stage on a simulated timeline.
struct StageTimeline {
  std::vector<int> compute;              // llm instruction indices (forward/backward)
  std::vector<double> start, end, tp_s;  // of each
};

std::vector<StageTimeline> timeline_of(const Colocated& c, const Emitted& e, const sim::Result& r) {
  std::vector<StageTimeline> out(static_cast<std::size_t>(c.stages()));
  std::vector<std::vector<std::pair<double, double>>> at(static_cast<std::size_t>(c.stages()));
  for (int s = 0; s < c.stages(); ++s)
    at[static_cast<std::size_t>(s)].assign(e.program.stages[static_cast<std::size_t>(s)].instructions.size(),
                                           {-1.0, -1.0});
  for (const auto& ev : r.trace) {
    if (ev.lane == 0)
      at[static_cast<std::size_t>(ev.stage)][static_cast<std::size_t>(ev.instruction)] = {ev.start,
                                                                                          ev.start + ev.duration};
  }
  for (int s = 0; s < c.stages(); ++s) {
    const auto& st = c.llm.stages[static_cast<std::size_t>(s)];
    auto& t = out[static_cast<std::size_t>(s)];
    for (std::size_t n = 0; n < st.instructions.size(); ++n) {
      const auto& i = st.instructions[n];
      if (i.op != Op::forward && i.op != Op::backward) continue;
      auto [a, b] = at[static_cast<std::size_t>(s)][static_cast<std::size_t>(e.llm_pc[static_cast<std::size_t>(s)][n])];
      if (a < 0) continue;  // took no time
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      t.compute.push_back(static_cast<int>(n));
      t.start.push_back(a);
      t.end.push_back(b);
      t.tp_s.push_back(u.tp_seconds(i.op));
    }
  }
  return out;
}

// The windows of stage `s` a pass may fill, in time order.
std::vector<Gap> gaps_of(const Colocated& c, int s, const StageTimeline& t, Pass pass) {
  const auto& st = c.llm.stages[static_cast<std::size_t>(s)];
  const auto& ins = st.instructions;
  std::vector<Gap> g;
  Gap first;
  first.warmup = true;
  first.b = t.compute.empty() ? kInf : t.start.front();
  g.push_back(first);
  for (std::size_t q = 0; q < t.compute.size(); ++q) {
    const int n = t.compute[q];
    const auto& i = ins[static_cast<std::size_t>(n)];
    const int collectives = st.units[static_cast<std::size_t>(i.unit)].tp_collectives(i.op);
    if (pass == Pass::fine && collectives > 0 && t.tp_s[q] > 0) {
      Gap tp;
      tp.slot = n;
      tp.in_tp = true;
      tp.a = t.end[q] - t.tp_s[q];
      tp.b = t.end[q];
      tp.bins = collectives;
      tp.bubble = t.tp_s[q] / collectives;
      g.push_back(tp);
    }
    // After the instruction's sends (so they leave on time), before the next one.
    int slot = n + 1;
    while (slot < static_cast<int>(ins.size()) && (ins[static_cast<std::size_t>(slot)].op == Op::send_activation ||
                                                   ins[static_cast<std::size_t>(slot)].op == Op::send_grad))
      ++slot;
    Gap next;
    next.slot = slot;
    next.a = t.end[q];
    next.b = q + 1 < t.compute.size() ? t.start[q + 1] : kInf;
    next.cooldown = q + 1 == t.compute.size();
    g.push_back(next);
  }
  if (t.compute.empty()) g.front().slot = static_cast<int>(ins.size());
  return g;
}

// Whether a pass lets forward (or backward) tasks fill gap `g` by choice.
bool fills(const Gap& g, Pass pass, bool backward) {
  if (pass == Pass::fine) return true;
  return backward ? g.cooldown : g.warmup;
}

struct Chunk {
  int encoder = 0, microbatch = 0;
  int key = 0;  // deadline (forward) or release (backward) llm microbatch, for ordering
};

// Chunks of a stage's hosts in the order they run: by the llm microbatch that needs
// them (forward) or feeds them (backward), then encoder, then microbatch.
std::vector<Chunk> chunks_of(const Colocated& c, int s, bool backward) {
  std::vector<Chunk> out;
  for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
    for (int j = 0; j < c.encoders[static_cast<std::size_t>(h.encoder)].microbatches; ++j)
      out.push_back(
          {h.encoder, j, backward ? c.last_feeding(h.encoder, h.lane, j) : c.first_needing(h.encoder, h.lane, j)});
  }
  std::stable_sort(out.begin(), out.end(), [](const Chunk& x, const Chunk& y) {
    return std::tie(x.key, x.encoder, x.microbatch) < std::tie(y.key, y.encoder, y.microbatch);
  });
  return out;
}

class Placer {
 public:
  Placer(const Colocated& c, const std::vector<StageTimeline>& t, Pass pass) : c_(c), t_(t), pass_(pass) {
    const auto P = static_cast<std::size_t>(c.stages());
    gaps_.resize(P);
    for (int s = 0; s < c.stages(); ++s)
      gaps_[static_cast<std::size_t>(s)] = gaps_of(c, s, t[static_cast<std::size_t>(s)], pass);
    fwd_done_.assign(P, std::vector<std::vector<double>>(c.encoders.size()));
    bwd_done_.assign(P, std::vector<std::vector<double>>(c.encoders.size()));
    placement_.resize(P);
  }

  Placement run() {
    // Stage 0 first: its shifted llm forwards are everyone's deadlines.
    for (int s = 0; s < c_.stages(); ++s) place_forward(s);
    for (int s = c_.stages() - 1; s >= 0; --s) place_backward(s);
    return placement_;
  }

 private:
  const Host& host(int s, int e) const { return c_.hosts[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)]; }

  // When stage 0's llm instruction `q` (index into its timeline) starts/ends once
  // stage 0's own forced work is in.
  double stage0_shifted(int n, bool end) const {
    const auto& t = t_[0];
    const auto& g = gaps_[0];
    for (std::size_t q = 0; q < t.compute.size(); ++q) {
      if (t.compute[q] != n) continue;
      double shift = 0;
      for (const auto& x : g)
        if (!x.in_tp && x.slot <= n) shift = std::max(shift, x.shift);
      return (end ? t.end[q] : t.start[q]) + shift;
    }
    return kInf;
  }

  // Stage 0's llm instruction index of the forward (backward) of llm microbatch i.
  int llm_index(int i, bool backward) const {
    const auto& ins = c_.llm.stages[0].instructions;
    for (std::size_t n = 0; n < ins.size(); ++n) {
      if (ins[n].microbatch == i && ins[n].op == (backward ? Op::backward : Op::forward)) return static_cast<int>(n);
    }
    return -1;
  }

  double deadline(int s, const Chunk& ch) const {
    const Host& h = host(s, ch.encoder);
    const int i = c_.first_needing(ch.encoder, h.lane, ch.microbatch);
    double d = s == 0 ? kInf : stage0_shifted(llm_index(i, false), false);
    // Earlier stages of a pipelined encoder leave time for the later ones.
    const auto& enc = c_.encoders[static_cast<std::size_t>(ch.encoder)];
    for (int k = h.encoder_stage + 1; k < enc.stages; ++k) d -= host(k * enc.span + h.lane, ch.encoder).forward_s;
    return d;
  }

  // Appends a task at gap `g`, starting no earlier than `from`; returns its end.
  double put(int s, std::size_t gi, const Chunk& ch, int task, bool backward, double from, double seconds) {
    auto& g = gaps_[static_cast<std::size_t>(s)];
    Gap& gap = g[gi];
    // Before the stage's first llm instruction, a forward task runs while the llm's parameters
    // are all-gathered; after its last llm backward, a backward one while its gradients reduce.
    placement_[static_cast<std::size_t>(s)].push_back({gap.slot, gap.in_tp, backward, ch.encoder, ch.microbatch, task,
                                                       backward ? gap.cooldown : gap.warmup && !gap.in_tp});
    if (gap.in_tp) {
      if (gap.bin_used + seconds > gap.bubble) {
        ++gap.bin;
        gap.bin_used = 0;
      }
      gap.bin_used += seconds;
      return gap.b + gap.shift;
    }
    const double start = std::max(from, gap.a + gap.shift + gap.used);
    const double end = start + seconds;
    gap.used = end - (gap.a + gap.shift);
    const double over = end - (gap.b + gap.shift);
    if (over > 0) {  // forced: the stage's later work moves
      for (std::size_t k = gi + 1; k < g.size(); ++k) g[k].shift += over;
      gap.b += over;
    }
    return end;
  }

  // Whether gap `gi` is the last normal gap where a task of `seconds` can still start in
  // time (before llm instruction `limit_slot`, and ending by `due`): it must go there.
  static bool last_chance_at(const std::vector<Gap>& g, std::size_t gi, int limit_slot, double due, double seconds) {
    for (std::size_t k = gi + 1; k < g.size(); ++k) {
      if (g[k].in_tp) continue;
      return g[k].slot > limit_slot || g[k].a + g[k].shift + seconds > due;
    }
    return true;
  }

  bool tp_fits(const Gap& gap, const Task& t) const {
    if (t.communication || t.seconds > gap.bubble) return false;
    return gap.bin_used + t.seconds <= gap.bubble || gap.bin + 1 < gap.bins;
  }

  void place_forward(int s) {
    auto& g = gaps_[static_cast<std::size_t>(s)];
    std::size_t gi = 0;
    double clock = 0;
    const bool self_deadline = s == 0;
    for (const Chunk& ch : chunks_of(c_, s, false)) {
      const Host& h = host(s, ch.encoder);
      double release = 0;
      if (h.encoder_stage > 0) {
        const int prev = s - c_.encoders[static_cast<std::size_t>(ch.encoder)].span;
        release = fwd_done_[static_cast<std::size_t>(prev)][static_cast<std::size_t>(ch.encoder)]
                           [static_cast<std::size_t>(ch.microbatch)];
      }
      // Stage 0's own tasks (of any encoder stage) must precede the llm forward that needs them.
      const int limit_slot = self_deadline ? llm_index(c_.first_needing(ch.encoder, h.lane, ch.microbatch), false)
                                           : std::numeric_limits<int>::max();
      const double due = deadline(s, ch);
      double end = 0;
      for (std::size_t k = 0; k < h.forward.size(); ++k) {
        const Task& t = h.forward[k];
        const bool needs_recv = k == 0 && h.encoder_stage > 0;
        for (;; ++gi) {
          Gap& gap = g[gi];
          // Forced work still waits for its input: never in a gap that closes before it arrives.
          const bool last_chance =
              last_chance_at(g, gi, limit_slot, due, t.seconds) && (gap.b + gap.shift >= release || gi + 1 == g.size());
          if (gap.in_tp) {
            if (fills(gap, pass_, false) && !needs_recv && tp_fits(gap, t) && gap.b + gap.shift <= due &&
                std::max(clock, release) <= gap.b + gap.shift) {
              end = put(s, gi, ch, static_cast<int>(k), false, clock, t.seconds);
              break;
            }
            continue;
          }
          const double start = std::max({clock, release, gap.a + gap.shift + gap.used});
          const bool fits = start + t.seconds <= gap.b + gap.shift && start + t.seconds <= due;
          if ((fits && fills(gap, pass_, false)) || last_chance) {
            end = put(s, gi, ch, static_cast<int>(k), false, std::max(clock, release), t.seconds);
            break;
          }
        }
        clock = end;
      }
      fwd_done_[static_cast<std::size_t>(s)][static_cast<std::size_t>(ch.encoder)].push_back(end);
    }
  }

  void place_backward(int s) {
    auto& g = gaps_[static_cast<std::size_t>(s)];
    std::size_t gi = 0;
    double clock = 0;
    auto& done = bwd_done_[static_cast<std::size_t>(s)];
    for (auto& d : done) d.clear();
    for (const Chunk& ch : chunks_of(c_, s, true)) {
      const Host& h = host(s, ch.encoder);
      const auto& enc = c_.encoders[static_cast<std::size_t>(ch.encoder)];
      double release;
      int after_slot = -1;  // structurally after this llm instruction of the stage
      if (c_.last_encoder_stage(h)) {
        const int n0 = llm_index(c_.last_feeding(ch.encoder, h.lane, ch.microbatch), true);
        release = stage0_shifted(n0, true);
        if (s == 0) after_slot = n0;
      } else {
        const int next = s + enc.span;
        release = bwd_done_[static_cast<std::size_t>(next)][static_cast<std::size_t>(ch.encoder)]
                           [static_cast<std::size_t>(ch.microbatch)];
      }
      double end = 0;
      for (std::size_t k = 0; k < h.backward.size(); ++k) {
        const Task& t = h.backward[k];
        for (;; ++gi) {
          Gap& gap = g[gi];
          if (gap.slot <= after_slot) continue;  // the llm backward that feeds it must have finished
          const bool last = gi + 1 == g.size();
          if (gap.in_tp) {
            if (fills(gap, pass_, true) && k > 0 && tp_fits(gap, t) && std::max(clock, release) <= gap.a + gap.shift) {
              end = put(s, gi, ch, static_cast<int>(k), true, clock, t.seconds);
              break;
            }
            continue;
          }
          const double start = std::max({clock, release, gap.a + gap.shift + gap.used});
          const bool fits = start + t.seconds <= gap.b + gap.shift;
          if ((fits && fills(gap, pass_, true)) || last) {
            end = put(s, gi, ch, static_cast<int>(k), true, std::max(clock, release), t.seconds);
            break;
          }
        }
        clock = end;
      }
      done[static_cast<std::size_t>(ch.encoder)].resize(static_cast<std::size_t>(enc.microbatches));
      done[static_cast<std::size_t>(ch.encoder)][static_cast<std::size_t>(ch.microbatch)] = end;
    }
  }

  const Colocated& c_;
  const std::vector<StageTimeline>& t_;
  Pass pass_;
  std::vector<std::vector<Gap>> gaps_;
  std::vector<std::vector<std::vector<double>>> fwd_done_, bwd_done_;  // [stage][encoder][microbatch] -> end
  Placement placement_;
};

// Encoder first: all forward tasks before the llm, all backward tasks after it.
Placement plain_placement(const Colocated& c) {
  Placement p(static_cast<std::size_t>(c.stages()));
  for (int s = 0; s < c.stages(); ++s) {
    const int end = static_cast<int>(c.llm.stages[static_cast<std::size_t>(s)].instructions.size());
    for (bool backward : {false, true}) {
      for (const Chunk& ch : chunks_of(c, s, backward)) {
        const Host& h = c.hosts[static_cast<std::size_t>(s)][static_cast<std::size_t>(ch.encoder)];
        const auto n = (backward ? h.backward : h.forward).size();
        for (std::size_t k = 0; k < n; ++k)
          p[static_cast<std::size_t>(s)].push_back(
              {backward ? end : 0, false, backward, ch.encoder, ch.microbatch, static_cast<int>(k)});
      }
    }
  }
  return p;
}

struct Tried {
  Placement placement;
  Emitted emitted;
  sim::Result result;
  bool ok = false;
};

Tried attempt(const Colocated& c, Placement placement, int* rounds) {
  Tried t;
  t.placement = std::move(placement);
  t.emitted = emit(c, t.placement);
  ++*rounds;
  try {
    sim::Options o;
    o.trace = true;
    o.trace_replicas = 1;
    t.result = sim::simulate(simulated_replicas(t.emitted.program), o);
    t.ok = true;
  } catch (const Error&) {
    t.ok = false;  // a placement the timeline misjudged into a deadlock: not a candidate
  }
  return t;
}

// Re-places against each new timeline while that helps; returns the best tried.
Tried improve(const Colocated& c, Pass pass, std::vector<Tried> starts, Tried best, int* rounds) {
  constexpr int kRounds = 8;
  for (auto& from : starts) {
    if (!from.ok) continue;
    Tried cur = std::move(from);
    int stale = 0;
    for (int r = 0; r < kRounds && stale < 2; ++r) {
      Tried next = attempt(c, Placer(c, timeline_of(c, cur.emitted, cur.result), pass).run(), rounds);
      if (!next.ok) break;
      if (next.result.step_time_s < best.result.step_time_s - 1e-12) {
        best = next;
        stale = 0;
      } else {
        ++stale;
      }
      cur = std::move(next);
    }
  }
  return best;
}

double idle(const std::array<double, sim::kCauseCount>& b) {
  double t = 0;
  for (double x : b) t += x;
  return t;
}

// Encoder task seconds per device per step, mean over the llm's stages (every stage has
// the same devices): what each device's encoder work takes on its own.
double encoder_seconds(const Colocated& c) {
  double total = 0;
  for (const auto& st : c.hosts)
    for (const auto& h : st)
      total += (h.forward_s + h.backward_s) * c.encoders[static_cast<std::size_t>(h.encoder)].microbatches;
  return c.stages() > 0 ? total / c.stages() : 0;
}

}  // namespace

std::vector<spec::Schedule> colocated_schedules() {
  using spec::Schedule;
  return {Schedule::optimus_fine, Schedule::optimus_coarse, Schedule::encoder_first, Schedule::optimus_online};
}

const pipeline::Program& program_named(const Schedules& s, spec::Schedule schedule) {
  switch (schedule) {
    case spec::Schedule::optimus_fine:
      return s.fine;
    case spec::Schedule::optimus_coarse:
      return s.coarse;
    case spec::Schedule::encoder_first:
      return s.plain;
    case spec::Schedule::optimus_online:
      return s.online;
    default:
      break;
  }
  throw Error(Status::unsupported, std::string("the bubble scheduler makes no '") + spec::schedule_name(schedule) +
                                       "' program; it makes " +
                                       join_choices(spec::schedule_names(colocated_schedules())));
}

Schedules schedule(const cost::CostModel& cost, const plan::Plan& plan) {
  const auto started = std::chrono::steady_clock::now();
  Schedules out;
  out.layout = decompose(cost, plan);
  const Colocated& c = out.layout;
  int rounds = 0;

  Tried plain = attempt(c, plain_placement(c), &rounds);
  if (!plain.ok) throw Error(Status::internal, "the encoder-first colocated program does not simulate");
  // The llm alone: the timeline whose bubbles the passes aim at.
  Tried llm_only;
  llm_only.placement.resize(static_cast<std::size_t>(c.stages()));
  llm_only.emitted = emit(c, llm_only.placement, /*without_encoders=*/true);
  {
    sim::Options o;
    o.trace = true;
    llm_only.result = sim::simulate(simulated_replicas(llm_only.emitted.program), o);
    llm_only.ok = true;
  }
  Tried coarse = improve(c, Pass::coarse, {llm_only, plain}, plain, &rounds);
  Tried fine = improve(c, Pass::fine, {llm_only, coarse, plain}, coarse, &rounds);

  auto full = [&](const Placement& p) { return emit(c, p).program; };
  out.plain = full(plain.placement);
  out.coarse = full(coarse.placement);
  out.fine = full(fine.placement);
  out.plain.schedule = spec::Schedule::encoder_first;
  out.coarse.schedule = spec::Schedule::optimus_coarse;
  out.fine.schedule = spec::Schedule::optimus_fine;
  out.online = out.fine;
  out.online.schedule = spec::Schedule::optimus_online;
  Report& r = out.report;
  r.plain_step_s = plain.result.step_time_s;
  r.coarse_step_s = coarse.result.step_time_s;
  r.fine_step_s = fine.result.step_time_s;
  r.bubbles_before = plain.result.bubbles;
  r.bubbles_after = fine.result.bubbles;
  const double before = idle(plain.result.bubbles);
  if (before > 0) {
    r.recovered_coarse = (before - idle(coarse.result.bubbles)) / before;
    r.recovered_fine = (before - idle(fine.result.bubbles)) / before;
  }
  // Against the llm alone: H = encoder seconds that do not lengthen the step.
  r.llm_step_s = llm_only.result.step_time_s;
  r.llm_idle_s = idle(llm_only.result.bubbles);
  r.encoder_s = encoder_seconds(c);
  auto exploited = [&](const Tried& t, double* filled, double* hidden) {
    const double h = std::max(0.0, r.encoder_s - (t.result.step_time_s - r.llm_step_s));
    *filled = r.llm_idle_s > 0 ? h / r.llm_idle_s : 0;
    *hidden = r.encoder_s > 0 ? h / r.encoder_s : 0;
  };
  exploited(plain, &r.bubble_filled.plain, &r.encoder_hidden.plain);
  exploited(coarse, &r.bubble_filled.coarse, &r.encoder_hidden.coarse);
  exploited(fine, &r.bubble_filled.fine, &r.encoder_hidden.fine);
  for (std::size_t s = 0; s < c.hosts.size(); ++s) {
    long long n = 0;
    for (const auto& h : c.hosts[s])
      n += static_cast<long long>(h.forward.size() + h.backward.size()) *
           c.encoders[static_cast<std::size_t>(h.encoder)].microbatches;
    r.encoder_tasks = std::max(r.encoder_tasks, n);
  }
  for (const auto& st : fine.placement)
    for (const auto& e : st) {
      r.tp_bubble_tasks += e.in_tp;
      r.dp_wait_tasks += e.in_dp;
    }
  r.rounds = rounds;
  r.scheduler_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

}  // namespace braid::bubble
