#include "core/bubble/checker.hpp"

#include <map>
#include <tuple>

#include "core/bubble/emit.hpp"
#include "core/common/error.hpp"
#include "core/sim/simulator.hpp"

namespace braid::bubble {
namespace {

using pipeline::Op;

constexpr double kSlack = 1e-9;

[[noreturn]] void violated(const std::string& what) {
  throw Error(Status::invalid_argument, "bubble schedule check: " + what);
}

struct Span {
  double start = -1, end = -1;  // -1: not seen (or took no time)
};

// Where each encoder microbatch's first and last task ran on one host.
struct ChunkTimes {
  Span first_forward, last_forward, first_backward, last_backward;
};

std::string chunk_name(const Colocated& c, int s, int e, int j) {
  return c.encoders[static_cast<std::size_t>(e)].name + " microbatch " + std::to_string(j) + " on '" +
         c.llm.stages[static_cast<std::size_t>(s)].name + "'";
}

}  // namespace

void check(const Colocated& c, const pipeline::Program& program) {
  const int P = c.stages();
  if (static_cast<int>(program.stages.size()) != P) violated("the program has a different number of stages");
  // Structure, stage by stage: completeness, order, TP bubbles.
  for (int s = 0; s < P; ++s) {
    const auto& st = program.stages[static_cast<std::size_t>(s)];
    // (unit, layer, backward) -> (encoder, position in the host's list)
    std::map<std::tuple<int, int, bool>, std::pair<int, int>> where;
    for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
      for (bool backward : {false, true}) {
        const auto& list = backward ? h.backward : h.forward;
        for (std::size_t k = 0; k < list.size(); ++k)
          where[{list[k].unit, list[k].layer, backward}] = {h.encoder, static_cast<int>(k)};
      }
    }
    std::map<std::tuple<int, int, bool>, int> next;  // (encoder, microbatch, backward) -> next position
    const pipeline::Instruction* host = nullptr;     // the llm compute a TP-bubble task fills
    double tp_left = 0;
    for (std::size_t pc = 0; pc < st.instructions.size(); ++pc) {
      const auto& i = st.instructions[pc];
      if (i.op == Op::forward || i.op == Op::backward) {
        host = &i;
        const auto& u = st.units[static_cast<std::size_t>(i.unit)];
        tp_left = u.tp_seconds(i.op);
      }
      if (i.op != Op::encoder_task) continue;
      const bool backward = i.flags & pipeline::kBackwardTask;
      auto it = where.find({i.unit, i.chunk, backward});
      if (it == where.end())
        violated("stage '" + st.name + "' instruction " + std::to_string(pc) + " runs no known encoder task");
      const auto [e, pos] = it->second;
      int& expect = next[{e, i.microbatch, backward}];
      if (pos != expect) {
        violated(std::string(backward ? "backward" : "forward") + " task " + std::to_string(pos) + " of " +
                 chunk_name(c, s, e, i.microbatch) + " runs out of the encoder's order (expected task " +
                 std::to_string(expect) + ")");
      }
      ++expect;
      if (i.flags & pipeline::kInTpBubble) {
        const auto& u = st.units[static_cast<std::size_t>(i.unit)];
        const auto& hu = st.units[static_cast<std::size_t>(host ? host->unit : 0)];
        const double seconds =
            backward ? u.backward_s + u.backward_tp_s + u.shard_comm_s : u.forward_s + u.forward_tp_s;
        const int collectives = host ? hu.tp_collectives(host->op) : 0;
        const double bubble = collectives > 0 ? tp_left / collectives : 0;
        if (u.communication)
          violated("'" + u.label + "' of " + chunk_name(c, s, e, i.microbatch) +
                   " is communication placed inside a TP collective's wait");
        if (collectives <= 0 || seconds > hu.tp_seconds(host->op) / collectives + kSlack) {
          violated("'" + u.label + "' of " + chunk_name(c, s, e, i.microbatch) + " (" + std::to_string(seconds) +
                   " s) does not fit one TP collective's wait (" + std::to_string(bubble) + " s)");
        }
      }
    }
    for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
      for (int j = 0; j < c.encoders[static_cast<std::size_t>(h.encoder)].microbatches; ++j) {
        for (bool backward : {false, true}) {
          const auto want = static_cast<int>((backward ? h.backward : h.forward).size());
          auto it = next.find({h.encoder, j, backward});
          if ((it == next.end() ? 0 : it->second) != want)
            violated(chunk_name(c, s, h.encoder, j) + " does not run all its " + (backward ? "backward" : "forward") +
                     " tasks exactly once");
        }
      }
    }
  }

  // Timing, on the simulated step (replica 0 of each stage traced: replicas run alike).
  const pipeline::Program lean = simulated_replicas(program);
  sim::Options o;
  o.trace = true;
  const sim::Result r = sim::simulate(lean, o);
  std::vector<std::vector<Span>> at(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s)
    at[static_cast<std::size_t>(s)].resize(lean.stages[static_cast<std::size_t>(s)].instructions.size());
  for (const auto& ev : r.trace)
    if (ev.lane == 0)
      at[static_cast<std::size_t>(ev.stage)][static_cast<std::size_t>(ev.instruction)] = {ev.start,
                                                                                          ev.start + ev.duration};
  // [stage][encoder][microbatch]
  std::vector<std::vector<std::vector<ChunkTimes>>> chunks(static_cast<std::size_t>(P));
  std::map<int, Span> llm_forward, llm_backward;  // stage 0, by llm microbatch
  for (int s = 0; s < P; ++s) {
    auto& cs = chunks[static_cast<std::size_t>(s)];
    cs.resize(c.encoders.size());
    for (std::size_t e = 0; e < c.encoders.size(); ++e)
      cs[e].resize(static_cast<std::size_t>(c.encoders[e].microbatches));
    const auto& st = lean.stages[static_cast<std::size_t>(s)];
    for (std::size_t pc = 0; pc < st.instructions.size(); ++pc) {
      const auto& i = st.instructions[pc];
      const Span t = at[static_cast<std::size_t>(s)][pc];
      if (t.start < 0) continue;
      if (s == 0 && i.op == Op::forward) llm_forward[i.microbatch] = t;
      if (s == 0 && i.op == Op::backward) llm_backward[i.microbatch] = t;
      if (i.op != Op::encoder_task) continue;
      for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
        bool mine = false;
        for (const auto& list : {h.forward, h.backward})
          for (const auto& task : list) mine = mine || task.unit == i.unit;
        if (!mine) continue;
        auto& ct = cs[static_cast<std::size_t>(h.encoder)][static_cast<std::size_t>(i.microbatch)];
        const bool backward = i.flags & pipeline::kBackwardTask;
        Span& first = backward ? ct.first_backward : ct.first_forward;
        Span& last = backward ? ct.last_backward : ct.last_forward;
        if (first.start < 0) first = t;
        last = t;
      }
    }
  }
  for (int s = 0; s < P; ++s) {
    for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
      const auto& enc = c.encoders[static_cast<std::size_t>(h.encoder)];
      for (int j = 0; j < enc.microbatches; ++j) {
        const auto& ct =
            chunks[static_cast<std::size_t>(s)][static_cast<std::size_t>(h.encoder)][static_cast<std::size_t>(j)];
        if (c.last_encoder_stage(h)) {
          const int i = c.first_needing(h.encoder, h.lane, j);
          const Span llm = llm_forward[i];
          if (ct.last_forward.end > llm.start + kSlack)
            violated("the forward of " + chunk_name(c, s, h.encoder, j) + " ends at " +
                     std::to_string(ct.last_forward.end) + " s, after the llm forward of microbatch " +
                     std::to_string(i) + " that needs it starts (" + std::to_string(llm.start) + " s)");
          const int f = c.last_feeding(h.encoder, h.lane, j);
          const Span back = llm_backward[f];
          if (ct.first_backward.start >= 0 && ct.first_backward.start < back.end - kSlack)
            violated("the backward of " + chunk_name(c, s, h.encoder, j) + " starts at " +
                     std::to_string(ct.first_backward.start) + " s, before the llm backward of microbatch " +
                     std::to_string(f) + " that feeds it ends (" + std::to_string(back.end) + " s)");
        } else {
          const auto& after = chunks[static_cast<std::size_t>(s + enc.span)][static_cast<std::size_t>(h.encoder)]
                                    [static_cast<std::size_t>(j)];
          if (ct.first_backward.start >= 0 && ct.first_backward.start < after.last_backward.end - kSlack)
            violated("the backward of " + chunk_name(c, s, h.encoder, j) +
                     " starts before the next encoder stage has finished its own");
        }
        if (h.encoder_stage > 0) {
          const auto& before = chunks[static_cast<std::size_t>(s - enc.span)][static_cast<std::size_t>(h.encoder)]
                                     [static_cast<std::size_t>(j)];
          if (ct.first_forward.start >= 0 && ct.first_forward.start < before.last_forward.end - kSlack)
            violated("the forward of " + chunk_name(c, s, h.encoder, j) +
                     " starts before the previous encoder stage has finished its own");
        }
      }
    }
  }
}

}  // namespace braid::bubble
