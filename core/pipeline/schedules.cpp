#include "core/pipeline/schedules.hpp"

#include <algorithm>

#include "core/common/error.hpp"

namespace braid::pipeline {
namespace {

const StageProgram& stage(const Program& p, int s) { return p.stages[static_cast<std::size_t>(s)]; }

// Stages after s on the longest path to a stage with no successor. 1F1B runs that
// many warm-up forwards (Megatron's p - rank - 1 on a linear pipeline); branches of
// different depths each count their own.
std::vector<int> stages_after(const Program& p) {
  const int n = static_cast<int>(p.stages.size());
  std::vector<int> after(static_cast<std::size_t>(n), -1);
  // Deepest first, so successors are known (depth grows along `next`).
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) order[static_cast<std::size_t>(s)] = s;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return stage(p, a).depth > stage(p, b).depth; });
  for (int s : order) {
    int a = 0;
    for (int t : stage(p, s).next) a = std::max(a, 1 + std::max(0, after[static_cast<std::size_t>(t)]));
    after[static_cast<std::size_t>(s)] = a;
  }
  return after;
}

Instruction make(Op op, int microbatch, int chunk = 0, int peer = -1) {
  Instruction i;
  i.op = op;
  i.microbatch = microbatch;
  i.chunk = chunk;
  i.peer = peer;
  i.unit = chunk;
  return i;
}

// In an interleaved linear pipeline, where chunk c of stage s gets its input from.
// Returns the stage, or -1 for the data loader.
int interleaved_source(int s, int c, int stages) {
  if (s > 0) return s - 1;
  return c > 0 ? stages - 1 : -1;
}
int interleaved_sink(int s, int c, int stages, int v) {
  if (s + 1 < stages) return s + 1;
  return c + 1 < v ? 0 : -1;
}

}  // namespace

void emit_forward(Program& p, int s, int mb, int chunk, std::uint8_t flags) {
  const auto& st = stage(p, s);
  if (st.prev.empty()) emit(p, s, make(Op::load_microbatch, mb, chunk));
  for (int from : st.prev) emit(p, s, make(Op::recv_activation, mb, chunk, from));
  Instruction f = make(Op::forward, mb, chunk);
  f.flags = flags;
  emit(p, s, f);
  for (int to : st.next) emit(p, s, make(Op::send_activation, mb, chunk, to));
}

void emit_backward(Program& p, int s, int mb, int chunk) {
  const auto& st = stage(p, s);
  for (int from : st.next) emit(p, s, make(Op::recv_grad, mb, chunk, from));
  emit(p, s, make(Op::backward, mb, chunk));
  for (int to : st.prev) emit(p, s, make(Op::send_grad, mb, chunk, to));
}

void gpipe(Program& p, int m) {
  for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
    for (int i = 0; i < m; ++i) emit_forward(p, s, i);
    for (int i = 0; i < m; ++i) emit_backward(p, s, i);
  }
  p.schedule = spec::Schedule::gpipe;
  p.microbatches = m;
}

void one_f_one_b(Program& p, int m) {
  const auto after = stages_after(p);
  for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
    const int warmup = std::min(after[static_cast<std::size_t>(s)], m);
    for (int i = 0; i < warmup; ++i) emit_forward(p, s, i);
    for (int i = 0; i < m - warmup; ++i) {
      emit_forward(p, s, warmup + i);
      emit_backward(p, s, i);
    }
    for (int i = m - warmup; i < m; ++i) emit_backward(p, s, i);
  }
  p.schedule = spec::Schedule::one_f_one_b;
  p.microbatches = m;
}

void interleaved(Program& p, int m, int v) {
  const int stages = static_cast<int>(p.stages.size());
  if (v < 2) throw Error(Status::invalid_argument, "the interleaved schedule needs at least 2 virtual stages");
  if (m % stages != 0) {
    throw Error(Status::invalid_argument, "the interleaved schedule needs microbatches (" + std::to_string(m) +
                                              ") divisible by the pipeline stages (" + std::to_string(stages) + ")");
  }
  const int total = m * v;
  // Megatron: virtual microbatch k -> model chunk and microbatch.
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % (stages * v)) / stages;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (stages * v)) * stages + k % stages; };
  auto fwd = [&](int s, int k) {
    const int c = chunk_of(k, true), mb = microbatch_of(k);
    const int from = interleaved_source(s, c, stages), to = interleaved_sink(s, c, stages, v);
    if (from < 0) emit(p, s, make(Op::load_microbatch, mb, c));
    if (from >= 0) emit(p, s, make(Op::recv_activation, mb, c, from));
    emit(p, s, make(Op::forward, mb, c));
    if (to >= 0) emit(p, s, make(Op::send_activation, mb, c, to));
  };
  auto bwd = [&](int s, int k) {
    const int c = chunk_of(k, false), mb = microbatch_of(k);
    const int from = interleaved_sink(s, c, stages, v), to = interleaved_source(s, c, stages);
    if (from >= 0) emit(p, s, make(Op::recv_grad, mb, c, from));
    emit(p, s, make(Op::backward, mb, c));
    if (to >= 0) emit(p, s, make(Op::send_grad, mb, c, to));
  };
  for (int s = 0; s < stages; ++s) {
    // Megatron runs everything as warm-up when there are exactly as many microbatches as stages.
    int warmup = m == stages ? total : std::min((stages - s - 1) * 2 + (v - 1) * stages, total);
    for (int k = 0; k < warmup; ++k) fwd(s, k);
    for (int k = 0; k < total - warmup; ++k) {
      fwd(s, warmup + k);
      bwd(s, k);
    }
    for (int k = total - warmup; k < total; ++k) bwd(s, k);
  }
  p.schedule = spec::Schedule::interleaved;
  p.microbatches = m;
  p.virtual_stages = v;
}

void batch_sync(Program& p, int groups, int default_k, spec::Schedule kind) {
  if (kind != spec::Schedule::batch_sync && kind != spec::Schedule::distmm_pipe && kind != spec::Schedule::two_phase) {
    throw Error(Status::invalid_argument,
                std::string("'") + spec::schedule_name(kind) + "' is not a batch-sync schedule");
  }
  const auto after = stages_after(p);
  for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
    const bool last = stage(p, s).next.empty();
    // Branches with other DP widths split a group into other numbers of microbatches.
    const int K = stage(p, s).microbatches_per_group(default_k);
    auto sync = [&](int g) {
      if (!last) return;
      Instruction b;
      b.op = Op::batch_sync;
      b.group = g;
      emit(p, s, b);
    };
    auto forwards = [&](int g, std::uint8_t flags = 0) {
      for (int j = 0; j < K; ++j) emit_forward(p, s, g * K + j, 0, flags);
    };
    auto backwards = [&](int g) {
      for (int j = 0; j < K; ++j) emit_backward(p, s, g * K + j);
    };
    switch (kind) {
      case spec::Schedule::batch_sync:
        for (int g = 0; g < groups; ++g) {
          forwards(g);
          sync(g);
          backwards(g);
        }
        break;
      case spec::Schedule::distmm_pipe: {
        // Like 1F1B with group g's forwards as the warm-up and steady-state forwards
        // and group g-1's backwards as its backwards: while g-1's gradients travel back
        // from the sync, this stage already runs g's forwards.
        const int warmup = std::min(after[static_cast<std::size_t>(s)], K);
        forwards(0);
        sync(0);
        for (int g = 1; g < groups; ++g) {
          for (int j = 0; j < warmup; ++j) emit_forward(p, s, g * K + j);
          for (int j = 0; j < K - warmup; ++j) {
            emit_backward(p, s, (g - 1) * K + j);
            emit_forward(p, s, g * K + warmup + j);
          }
          for (int j = K - warmup; j < K; ++j) emit_backward(p, s, (g - 1) * K + j);
          sync(g);
        }
        backwards(groups - 1);
        break;
      }
      case spec::Schedule::two_phase:
        for (int g = 0; g < groups; ++g) {
          forwards(g, kNoStore);
          sync(g);
          // Recompute-forward + backward of the group in 1F1B order. Each stage
          // recomputes from the input it kept: no activation travels again.
          const int warmup = std::min(after[static_cast<std::size_t>(s)], K);
          auto recompute = [&](int mb) {
            Instruction f = make(Op::forward, mb);
            f.flags = kRecompute;
            emit(p, s, f);
          };
          for (int j = 0; j < warmup; ++j) recompute(g * K + j);
          for (int j = 0; j < K - warmup; ++j) {
            recompute(g * K + warmup + j);
            emit_backward(p, s, g * K + j);
          }
          for (int j = K - warmup; j < K; ++j) emit_backward(p, s, g * K + j);
        }
        break;
      default:
        break;  // refused above
    }
  }
  p.schedule = kind;
  p.groups = groups;
  p.group_microbatches = default_k;
  p.microbatches = groups * default_k;
}

void finish_step(Program& p) {
  for (int s = 0; s < static_cast<int>(p.stages.size()); ++s) {
    Instruction r;
    r.op = Op::reduce_grads;
    emit(p, s, r);
    Instruction o;
    o.op = Op::optimizer_step;
    emit(p, s, o);
  }
}

}  // namespace braid::pipeline
