#include "core/bubble/emit.hpp"

#include <algorithm>
#include <tuple>

#include "core/pipeline/schedules.hpp"
#include "core/sim/shared_cores.hpp"

namespace braid::bubble {
namespace {

using pipeline::Instruction;
using pipeline::Op;

Instruction sync(Op op, int peer, int microbatch) {
  Instruction i;
  i.op = op;
  i.peer = peer;
  i.microbatch = microbatch;
  i.flags = pipeline::kSyncOnly;
  return i;
}

// Per llm microbatch, the stages other than the first whose devices encode (the last
// encoder stage of) its samples: their outputs go to the llm's first stage.
std::vector<std::vector<int>> feeding_stages(const Colocated& c) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(c.microbatches));
  for (int s = 1; s < c.stages(); ++s) {
    for (const auto& h : c.hosts[static_cast<std::size_t>(s)]) {
      if (!c.last_encoder_stage(h)) continue;
      for (int i : c.lane_list(h.encoder, h.lane)) {
        auto& f = out[static_cast<std::size_t>(i)];
        if (std::find(f.begin(), f.end(), s) == f.end()) f.push_back(s);
      }
    }
  }
  return out;
}

class StageEmitter {
 public:
  StageEmitter(const Colocated& c, int s, const std::vector<std::vector<int>>& feeders, pipeline::StageProgram& out)
      : c_(c), s_(s), out_(out) {
    done_.assign(c.encoders.size(), 0);
    for (int i = 0; i < c.microbatches; ++i) {
      const auto& f = feeders[static_cast<std::size_t>(i)];
      if (std::find(f.begin(), f.end(), s) != f.end()) fed_.push_back(i);
    }
  }

  void task(const Entry& e) {
    const Host& h = c_.hosts[static_cast<std::size_t>(s_)][static_cast<std::size_t>(e.encoder)];
    const auto& enc = c_.encoders[static_cast<std::size_t>(e.encoder)];
    const auto& list = e.backward ? h.backward : h.forward;
    const Task& t = list[static_cast<std::size_t>(e.task)];
    const bool last_host = c_.last_encoder_stage(h);
    if (e.task == 0 && !e.backward && h.encoder_stage > 0)
      put(sync(Op::recv_activation, s_ - enc.span, encoder_tag(e.encoder, e.microbatch)));
    if (e.task == 0 && e.backward) {
      if (!last_host) {
        put(sync(Op::recv_grad, s_ + enc.span, encoder_tag(e.encoder, e.microbatch)));
      } else if (s_ != 0) {
        // The llm's first stage has finished the backwards that feed this microbatch.
        const int through = c_.last_feeding(e.encoder, h.lane, e.microbatch);
        for (; received_ < fed_.size() && fed_[received_] <= through; ++received_)
          put(sync(Op::recv_grad, 0, fed_[received_]));
      }
    }
    Instruction i;
    i.op = Op::encoder_task;
    i.unit = t.unit;
    i.chunk = t.layer;
    i.microbatch = e.microbatch;
    i.flags = static_cast<std::uint8_t>((e.backward ? pipeline::kBackwardTask : 0) |
                                        (e.in_tp ? pipeline::kInTpBubble : 0) | (e.in_dp ? pipeline::kInDpWait : 0));
    put(i);
    if (e.task + 1 != static_cast<int>(list.size())) return;
    if (!e.backward && !last_host) {
      put(sync(Op::send_activation, s_ + enc.span, encoder_tag(e.encoder, e.microbatch)));
    } else if (!e.backward) {
      done_[static_cast<std::size_t>(e.encoder)] = e.microbatch + 1;
      if (s_ != 0) {
        for (; sent_ < fed_.size() && ready(fed_[sent_]); ++sent_) put(sync(Op::send_activation, 0, fed_[sent_]));
      }
    } else if (h.encoder_stage > 0) {
      put(sync(Op::send_grad, s_ - enc.span, encoder_tag(e.encoder, e.microbatch)));
    }
  }

  void put(const Instruction& i) { out_.instructions.push_back(i); }

 private:
  // Whether this stage has produced all it owes llm microbatch `i`.
  bool ready(int i) const {
    for (const auto& h : c_.hosts[static_cast<std::size_t>(s_)]) {
      if (!c_.last_encoder_stage(h)) continue;
      const auto& l = c_.lane_list(h.encoder, h.lane);
      const auto at = std::find(l.begin(), l.end(), i);
      if (at == l.end()) continue;
      if (done_[static_cast<std::size_t>(h.encoder)] <=
          c_.last_needed(h.encoder, h.lane, static_cast<int>(at - l.begin())))
        return false;
    }
    return true;
  }

  const Colocated& c_;
  int s_;
  pipeline::StageProgram& out_;
  std::vector<int> done_;  // per encoder: forward microbatches finished (last-stage hosts)
  std::vector<int> fed_;   // llm microbatches this stage feeds, ascending
  std::size_t sent_ = 0, received_ = 0;
};

}  // namespace

Emitted emit(const Colocated& c, const Placement& placement, bool without_encoders) {
  Emitted out;
  out.program = c.llm;
  const auto feeders =
      without_encoders ? std::vector<std::vector<int>>(static_cast<std::size_t>(c.microbatches)) : feeding_stages(c);
  out.llm_pc.resize(static_cast<std::size_t>(c.stages()));
  for (int s = 0; s < c.stages(); ++s) {
    auto& st = out.program.stages[static_cast<std::size_t>(s)];
    const auto& llm = c.llm.stages[static_cast<std::size_t>(s)].instructions;
    st.instructions.clear();
    std::vector<Entry> entries =
        s < static_cast<int>(placement.size()) ? placement[static_cast<std::size_t>(s)] : std::vector<Entry>{};
    std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.slot, a.in_tp, a.backward) < std::tie(b.slot, b.in_tp, b.backward);
    });
    StageEmitter em(c, s, feeders, st);
    std::size_t k = 0;
    auto& pcs = out.llm_pc[static_cast<std::size_t>(s)];
    for (int n = 0; n <= static_cast<int>(llm.size()); ++n) {
      for (; k < entries.size() && entries[k].slot == n && !entries[k].in_tp; ++k) em.task(entries[k]);
      if (n == static_cast<int>(llm.size())) break;
      const auto& ins = llm[static_cast<std::size_t>(n)];
      if (s == 0 && ins.op == Op::forward)
        for (int t : feeders[static_cast<std::size_t>(ins.microbatch)])
          em.put(sync(Op::recv_activation, t, ins.microbatch));
      pcs.push_back(static_cast<int>(st.instructions.size()));
      em.put(ins);
      if (s == 0 && ins.op == Op::backward)
        for (int t : feeders[static_cast<std::size_t>(ins.microbatch)]) em.put(sync(Op::send_grad, t, ins.microbatch));
      for (; k < entries.size() && entries[k].slot == n && entries[k].in_tp; ++k) em.task(entries[k]);
    }
  }
  pipeline::finish_step(out.program);
  return out;
}

pipeline::Program simulated_replicas(pipeline::Program p) {
  if (sim::SharedCores::applies(p)) return p;
  for (auto& st : p.stages) st.replicas = 1;
  return p;
}

}  // namespace braid::bubble
