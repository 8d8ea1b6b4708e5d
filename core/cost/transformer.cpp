#include "core/cost/transformer.hpp"

#include <algorithm>

namespace braid::cost {
namespace {

// Adds C[m,n] = A[m,k] B[k,n] to `c`, `batch` times, with its backward: the gradient
// of A (always, once anything needs gradients) and of B (when B is a trained weight,
// or when B is itself an activation, as in attention).
void add_gemm(BlockCost& c, double m, double n, double k, double batch, bool weight, const BlockContext& ctx) {
  const DeviceModel& dev = *ctx.device;
  double flops = 2 * m * n * k * batch;
  c.flops_forward += flops;
  c.forward_s += dev.gemm_seconds(m, n, k, batch);
  if (!ctx.grads.any()) return;
  c.flops_backward += flops;
  c.backward_s += dev.gemm_seconds(m, k, n, batch);
  if (!weight || ctx.grads.weights) {
    c.flops_backward += flops;
    c.backward_s += dev.gemm_seconds(k, n, m, batch);
  }
}

// Memory-bound kernels: `bytes` in forward, twice that in backward (read saved
// inputs and incoming gradients, write outgoing gradients), each at its own measured rate.
void add_elementwise(BlockCost& c, double bytes, const BlockContext& ctx) {
  c.forward_s += ctx.device->memory_seconds(bytes);
  if (ctx.grads.any()) c.backward_s += ctx.device->backward_memory_seconds(2 * bytes);
}

// A residual add: a pure stream (two arrays read, one written), at the streaming rate (the
// measured add's, else the triad's), both ways. On a host the element-wise table is that of
// norms and activations, whose math bounds them at a fraction of the add's rate (GELU's
// tanh, a norm's reductions); on a GPU both are memory_bandwidth x efficiency.memory unless
// measured.
void add_residual(BlockCost& c, double bytes, const BlockContext& ctx) {
  c.forward_s += ctx.device->streaming_seconds(bytes);
  if (ctx.grads.any()) c.backward_s += ctx.device->streaming_seconds(2 * bytes);
}

// A linear layer of a transformer block, activations [m,k] x weight [k,n]: as add_gemm,
// but with the run's FP8 setting. Under FP8 (TransformerEngine's Linear/LayerNormLinear)
// its three GEMMs run at the FP8 peak and each input is first cast to FP8, read at the
// training precision: the activation [m,k] in forward, the incoming gradient [m,n] in
// backward. Hopper's FP8 GEMMs take only the TN layout, so where the weight's gradient is
// computed the cast also writes the transpose its GEMM reads (TE's fused cast-transpose,
// `fp8_cast_transpose_fused`): two bytes out, else one. The weight's cast is cached across
// the microbatches of a step (TE's `is_first_microbatch`), so free here.
void add_linear(BlockCost& c, double m, double n, double k, const BlockContext& ctx) {
  const DeviceModel& dev = *ctx.device;
  if (!dev.fp8()) return add_gemm(c, m, n, k, 1, true, ctx);
  double flops = 2 * m * n * k;
  c.flops_forward += flops;
  c.forward_s += dev.linear_gemm_seconds(m, n, k);
  if (ctx.grads.any()) {
    c.flops_backward += flops;
    c.backward_s += dev.linear_gemm_seconds(m, k, n);
    if (ctx.grads.weights) {
      c.flops_backward += flops;
      c.backward_s += dev.linear_gemm_seconds(k, n, m);
    }
  }
  const double cast_bytes = dev.element_bytes() + (ctx.grads.weights ? 2 : 1);  // per element
  c.forward_s += dev.memory_seconds(m * k * cast_bytes);
  if (ctx.grads.any()) c.backward_s += dev.memory_seconds(m * n * cast_bytes);
}

// Exposed part of a TP collective of `comm` seconds that userbuffers overlap with a
// GEMM of `gemm` seconds: split into one chunk per TP rank, each chunk's transfer runs
// under the GEMM of the previous one (TransformerEngine's split pipelined / ring-exchange
// overlap, transformer_engine/pytorch/module/base.py `initialize_ub`), so the first
// (all-gather) or last (reduce-scatter) chunk is never hidden, nor what the GEMM is too
// short to cover.
double overlapped(double comm, double gemm, double tp) { return std::max(comm / tp, comm - gemm); }

double tp_all_reduce(double bytes, const BlockContext& ctx) {
  return ctx.tp > 1 ? ctx.comm->all_reduce(bytes, ctx.tp_group) : 0.0;
}

// The backward collectives of one half of a layer under sequence parallelism (`reduce` has
// them; `norm`, `column` and `row` are the half's norm and its two parallel linears). The
// column-parallel layer kept only its sequence shard of its input, so its backward
// all-gathers it again for the weight gradient before it reduce-scatters its input gradient;
// before that the row-parallel layer all-gathers its output gradient (the reduce-scatter's
// backward). braid's nn::TransformerBlock runs the three one after another, and all-reduces
// the norm's weight gradients (its shards saw a part of the sequence each). Megatron-LM's
// column-parallel linear (LinearWithGradAccumulationAndAsyncCommunication, and
// TransformerEngine's bulk overlaps alike) runs the gather under the input-gradient GEMM and
// the reduce-scatter under the weight-gradient GEMM, each about half of that layer's
// backward; with userbuffers (--tp-comm-overlap) the output gradient's gather runs under the
// row-parallel layer's input-gradient GEMM. Megatron all-reduces the norms' gradients once a
// step, over every layer (not priced). `ag` and `rs` price the whole sequence's all-gather
// and reduce-scatter, `hidden` is the layer's width.
void add_sequence_parallel_backward(LayerKernel& norm, const LayerKernel& column, const LayerKernel& row,
                                    LayerKernel& reduce, double ag, double rs, double hidden, const BlockContext& ctx) {
  const double t = ctx.tp;
  if (ctx.kernels == Kernels::reference) {
    reduce.cost.comm_backward_s = 2 * ag + rs;
    reduce.cost.collectives_backward = 3;
    if (ctx.grads.weights) {  // a frozen norm's gradients are not summed
      norm.cost.comm_backward_s += tp_all_reduce(2.0 * hidden * sizeof(float), ctx);  // gamma and beta, float
      norm.cost.collectives_backward += 1;
    }
    return;
  }
  const double dgrad = column.cost.backward_s / 2, wgrad = column.cost.backward_s / 2;
  const double gather_dy = ctx.training->tp_comm_overlap ? overlapped(ag, row.cost.backward_s / 2, t) : ag;
  // A frozen layer (Megatron's linear_with_frozen_weight) computes no weight gradient: it
  // gathers nothing again, and has no GEMM left to hide its input gradient's reduce-scatter.
  reduce.cost.comm_backward_s =
      gather_dy + (ctx.grads.weights ? overlapped(ag, dgrad, t) + overlapped(rs, wgrad, t) : rs);
  reduce.cost.collectives_backward = ctx.grads.weights ? 3 : 2;  // each leaves a part exposed
}

}  // namespace

BlockCost elementwise_op(double bytes, const BlockContext& ctx) {
  BlockCost c;
  add_elementwise(c, bytes, ctx);
  return c;
}

BlockCost residual_op(double bytes, const BlockContext& ctx) {
  BlockCost c;
  add_residual(c, bytes, ctx);
  return c;
}

double rows_copy_seconds(double rows, double width, const BlockContext& ctx) {
  return ctx.device->stream_seconds(embedding_bytes(rows, width, ctx.device->element_bytes()));
}

double zero_seconds(double elements, const BlockContext& ctx) {
  return ctx.device->streaming_seconds(elements * ctx.device->element_bytes());
}

double scale_seconds(double elements, const BlockContext& ctx) {
  return ctx.device->streaming_seconds(2 * elements * ctx.device->element_bytes());
}

double squared_norm_seconds(double elements, const BlockContext& ctx) {
  return ctx.device->stream_seconds(elements * ctx.device->element_bytes());
}

BlockCost embedding_op(double rows, double width, const BlockContext& ctx) {
  BlockCost c;
  c.forward_s = rows_copy_seconds(rows, width, ctx);
  if (ctx.grads.weights) c.backward_s = rows_copy_seconds(rows, width, ctx);  // the scatter-add
  return c;
}

BlockCost patch_projection_op(double m, double n, double k, const BlockContext& ctx) {
  BlockCost c;
  const double flops = 2 * m * n * k;
  // braid's patch embedding copies each patch's pixels into a row before the GEMM, again
  // for the weight's gradient (a convolution reads them in place).
  const double patchify = ctx.kernels == Kernels::reference ? rows_copy_seconds(m, k, ctx) : 0.0;
  c.flops_forward = flops;
  c.forward_s = ctx.device->gemm_seconds(m, n, k) + patchify;
  if (ctx.grads.weights) {  // the weight's gradient alone: pixels need none
    c.flops_backward = flops;
    c.backward_s = ctx.device->gemm_seconds(k, n, m) + patchify;
  }
  return c;
}

BlockCost contrastive_loss_op(double local, double all, double dim, const BlockContext& ctx) {
  // With a share of the rows each direction has its own local x all logits, and the gradients
  // take four GEMMs: the local rows' and the gathered rows' (open_clip's local loss). With every
  // row on one device, one all x all logit matrix serves both directions and its gradients take
  // two GEMMs: a single-process CLIP loss. braid's batch-sync always hands its op the gathered
  // rows apart from the local ones (core/train/clip_work.cpp), so its op takes the first form
  // even then (core/nn/host_contrastive.cpp: the second needs them to be the same memory).
  const bool whole = local >= all && ctx.kernels == Kernels::megatron;
  const double gemm = ctx.device->gemm_seconds(local, all, dim), flops = 2 * local * all * dim;
  // Two softmaxes of local x all logits either way (the matrix's rows and columns, or each
  // direction's rows): charged as attention's softmax is, read and written once each way.
  const BlockCost softmaxes = elementwise_op(2 * (2 * local * all) * ctx.device->element_bytes(), ctx);
  BlockCost c;
  c.flops_forward = (whole ? 1 : 2) * flops;
  c.forward_s = (whole ? 1 : 2) * gemm + softmaxes.forward_s;
  if (ctx.grads.any()) {
    c.flops_backward = (whole ? 2 : 4) * flops;
    c.backward_s = (whole ? 2 : 4) * gemm + softmaxes.backward_s;
  }
  return c;
}

BlockCost attention_core(double sq, double sk, double d, double heads, bool causal, bool dropout,
                         const BlockContext& ctx) {
  const auto& train = *ctx.training;
  const double E = ctx.device->element_bytes();
  BlockCost c;
  // braid's own attention op, timed by size on this cluster: one call each way. Its GEMMs
  // compute every score, causal or not; calibrate times it bidirectional, so a causal one
  // (which skips the masked keys' exponentials) is priced a little long.
  const bool measured_op = ctx.kernels == Kernels::reference && ctx.device->measured_attention();
  if (train.attention == spec::Attention::flash || measured_op) {
    double fl = 4 * sq * sk * d * heads * (causal && !measured_op ? 0.5 : 1.0);
    c.flops_forward = fl;
    c.forward_s = ctx.device->flash_attention_seconds(fl, false, heads);
    if (ctx.grads.any()) {
      c.flops_backward = 2 * fl;
      // The fused backward recomputes the scores: 5 matmuls against the forward's 2.
      c.backward_s = ctx.device->flash_attention_seconds(2.5 * fl, true, heads);
    }
    return c;
  }
  add_gemm(c, sq, sk, d, heads, false, ctx);  // scores
  add_gemm(c, sq, d, sk, heads, false, ctx);  // context
  const double probs = heads * sq * sk;
  add_elementwise(c, 2 * probs * E + (dropout ? probs * (2 * E + 1) : 0), ctx);  // softmax (+ dropout)
  // Unfused: scale, mask and softmax as three kernels (Megatron's --no-masked-softmax-fusion).
  if (!train.fused_kernels) add_elementwise(c, 4 * probs * E, ctx);
  return c;
}

double transformer_layer_forward_flops(const spec::ModuleSpec& m, double s, spec::Attention attention) {
  const double h = m.hidden, f = m.ffn, kv = double(m.hidden) * m.kv_groups / m.heads;
  double gemms = 2 * s * h * (h + 2 * kv) + 2 * s * h * h + (m.mlp == spec::Mlp::swiglu ? 3.0 : 2.0) * 2 * s * h * f;
  double core = 4 * s * s * h;
  if (attention == spec::Attention::flash && m.causal) core *= 0.5;
  return gemms + core;
}

std::vector<LayerKernel> transformer_layer_kernels(const spec::ModuleSpec& m, double s, double b,
                                                   const BlockContext& ctx) {
  const auto& train = *ctx.training;
  const double t = ctx.tp, E = ctx.device->element_bytes();
  const double h = m.hidden, f = m.ffn, a = m.heads, d = h / a;
  const double kv = h * m.kv_groups / m.heads;
  const double M = s * b, sbh = M * h;
  const double sp = (train.sequence_parallel && t > 1) ? t : 1;
  const bool dropout = m.dropout > 0;
  const bool swiglu = m.mlp == spec::Mlp::swiglu;

  auto kernel = [](const char* name, bool communication = false) {
    LayerKernel k;
    k.name = name;
    k.communication = communication;
    return k;
  };
  LayerKernel norm_attention = kernel("norm+residual (attention)"), qkv = kernel("qkv"), core = kernel("attention"),
              out = kernel("attention out"), reduce_attention = kernel("tp all-reduce (attention)", true),
              norm_mlp = kernel("norm+residual+activation (mlp)"), up = kernel("mlp up"), down = kernel("mlp down"),
              reduce_mlp = kernel("tp all-reduce (mlp)", true);
  if (ctx.kernels == Kernels::reference) {  // nn::TransformerBlock: q, k and v apart...
    add_linear(qkv.cost, M, h / t, h, ctx);
    add_linear(qkv.cost, M, kv / t, h, ctx);
    add_linear(qkv.cost, M, kv / t, h, ctx);
    // ...so their input's gradient is three GEMMs' outputs, added
    if (ctx.grads.any()) qkv.cost.backward_s += 2 * residual_op(residual_bytes(sbh, E), ctx).forward_s;
  } else {
    add_linear(qkv.cost, M, (h + 2 * kv) / t, h, ctx);  // fused QKV projection (column parallel)
  }
  add_linear(out.cost, M, h, h / t, ctx);                    // attention output (row parallel)
  add_linear(up.cost, M, (swiglu ? 2 : 1) * f / t, h, ctx);  // MLP up (+ gate)
  add_linear(down.cost, M, h, f / t, ctx);                   // MLP down

  // Attention core: softmax(QK^T) V over the local heads.
  const double heads_local = a / t * b;
  core.cost = attention_core(s, s, d, heads_local, m.causal, dropout, ctx);

  // Layer norms and residual adds (+ dropout), one of each per half; the MLP activation.
  // This is the fused pricing (Megatron-LM since SC'21, sec. 4.2: bias+GeLU and
  // bias+dropout+add fused, one pass each). Unfused, the bias add is its own pass
  // (read + write) before the activation and before dropout, and dropout is a pass of its
  // own before the residual add: 4 more element passes per half, 2 more on the MLP
  // intermediate.
  double norm = (norm_bytes(sbh, E) + (dropout ? sbh : 0)) / sp;
  const double residual = residual_bytes(sbh, E) / sp;
  double activation = activation_bytes(M * f / t, swiglu, E);
  if (!train.fused_kernels) {
    norm += 4 * sbh * E / sp;
    activation += 2 * M * f / t * E;
  }
  add_elementwise(norm_attention.cost, norm, ctx);
  add_residual(norm_attention.cost, residual, ctx);
  add_elementwise(norm_mlp.cost, norm, ctx);  // two kernels, each at its own size's rate
  add_elementwise(norm_mlp.cost, activation, ctx);
  add_residual(norm_mlp.cost, residual, ctx);

  // Two TP all-reduces each way (attention out, MLP out; their input gradients); with
  // sequence parallelism, an all-gather before the column-parallel GEMM and a
  // reduce-scatter after the row-parallel one, the same bytes.
  const double ar = tp_all_reduce(sbh * E, ctx);
  for (LayerKernel* k : {&reduce_attention, &reduce_mlp}) {
    k->cost.comm_forward_s = ar;
    k->cost.collectives_forward = t > 1 ? (sp > 1 ? 2 : 1) : 0;  // an all-reduce, or an all-gather and a reduce-scatter
    if (ctx.grads.any()) {
      k->cost.comm_backward_s = ar;
      k->cost.collectives_backward = t > 1 ? 1 : 0;  // under sequence parallelism: below
    }
  }
  if (sp > 1) {
    const double ag = ctx.comm->all_gather(sbh * E, ctx.tp_group);
    const double rs = ctx.comm->reduce_scatter(sbh * E, ctx.tp_group);
    if (ctx.grads.any()) {
      add_sequence_parallel_backward(norm_attention, qkv, out, reduce_attention, ag, rs, h, ctx);
      add_sequence_parallel_backward(norm_mlp, up, down, reduce_mlp, ag, rs, h, ctx);
    }
    // Userbuffers (Megatron-Core --tp-comm-overlap, TransformerEngine): the all-gather runs
    // under the column-parallel GEMM that consumes it, the reduce-scatter under the
    // row-parallel GEMM that produces it.
    if (train.tp_comm_overlap) {
      auto hide = [&](LayerKernel& k, const LayerKernel& column, const LayerKernel& row) {
        k.cost.comm_forward_s = overlapped(ag, column.cost.forward_s, t) + overlapped(rs, row.cost.forward_s, t);
      };
      hide(reduce_attention, qkv, out);
      hide(reduce_mlp, up, down);
    }
  }
  std::vector<LayerKernel> ks = {norm_attention, qkv, core, out, reduce_attention, norm_mlp, up, down, reduce_mlp};
  static_assert(kLayerKernels == 9, "the kernels of a layer, as nn::TransformerBlock runs them");
  // Recomputation, kernel by kernel: full re-runs every forward (and its collectives)
  // before the backward; selective re-runs the attention core when its scores are not kept.
  for (auto& k : ks) {
    if (!ctx.grads.any()) break;
    if (train.recompute == spec::Recompute::full) {
      k.cost.recompute_s = k.cost.forward_s;
      k.cost.flops_recompute = k.cost.flops_forward;
      k.cost.comm_backward_s += k.cost.comm_forward_s;
      k.cost.collectives_backward += k.cost.collectives_forward;
    } else if (recomputed(train) == spec::Recompute::selective && &k == &ks[2]) {
      k.cost.recompute_s = k.cost.forward_s;
      k.cost.flops_recompute = k.cost.flops_forward;
    }
  }
  return ks;
}

spec::Recompute recomputed(const spec::TrainingSpec& training) {
  if (training.recompute == spec::Recompute::selective && training.attention != spec::Attention::standard)
    return spec::Recompute::none;
  return training.recompute;
}

BlockCost transformer_layer(const spec::ModuleSpec& m, double s, double b, const BlockContext& ctx) {
  BlockCost c;
  for (const auto& k : transformer_layer_kernels(m, s, b, ctx)) c += k.cost;
  const auto& train = *ctx.training;
  const double t = ctx.tp, E = ctx.device->element_bytes();
  const double h = m.hidden, f = m.ffn, a = m.heads;
  const double kv = h * m.kv_groups / m.heads;
  const double M = s * b, sbh = M * h;
  const double sp = (train.sequence_parallel && t > 1) ? t : 1;
  const bool dropout = m.dropout > 0;
  const bool swiglu = m.mlp == spec::Mlp::swiglu;
  const double heads_local = a / t * b;

  // Stored activations, after Korthikanti et al. 2022 ("Reducing Activation
  // Recomputation in Large Transformer Models", sec. 4), generalised to GQA/SwiGLU:
  // norm and linear inputs + dropout masks (replicated over TP unless sequence
  // parallel), Q/K/V and MLP intermediates (split), attention probabilities.
  double replicated = (4 * sbh * E + (dropout ? 2 * sbh : 0)) / sp;
  double split = ((2 + 2 * kv / h) * sbh * E + (swiglu ? 3 : 2) * M * f * E) / t;
  const double scores = train.attention == spec::Attention::flash ? 4 * heads_local * s  // fp32 log-sum-exp per row
                                                                  : heads_local * s * s * (E + (dropout ? E + 1 : 0));
  const bool selective = recomputed(train) == spec::Recompute::selective;
  c.activation_bytes = replicated + split + (selective ? 0 : scores);
  // The recomputed forward re-creates what it did not keep, and the layer's backward holds it
  // until it ends: Megatron's full recomputation checkpoints each layer's input and re-runs
  // the layer (all of the above but that input), the selective one the attention core (its scores).
  c.recompute_bytes = selective ? scores : 0;
  if (train.recompute == spec::Recompute::full) {
    const double input = sbh * E / sp;  // kept: the checkpoint the layer re-runs from
    c.recompute_bytes = c.activation_bytes - input;
    c.activation_bytes = input;
  }
  if (!ctx.grads.any()) c.activation_bytes = c.recompute_bytes = 0;  // nothing runs backward: nothing to keep
  return c;
}

BlockCost token_embedding(const spec::ModuleSpec& m, double s, double b, const BlockContext& ctx) {
  const double E = ctx.device->element_bytes(), M = s * b, h = m.hidden;
  // Gather rows, then all-reduce the vocab-parallel partial results.
  BlockCost c = embedding_op(M, h, ctx);
  c.comm_forward_s = tp_all_reduce(M * h * E, ctx);
  c.collectives_forward = ctx.tp > 1 ? 1 : 0;
  return c;
}

BlockCost patch_embedding(const spec::ModuleSpec& m, double s, double b, const BlockContext& ctx) {
  const double E = ctx.device->element_bytes(), M = s * b;
  const double patch = double(m.patch_size) * m.patch_size * m.channels;
  BlockCost c = patch_projection_op(M, m.hidden, patch, ctx);
  if (ctx.grads.weights) c.activation_bytes = M * patch * E;
  return c;
}

BlockCost lm_head(const spec::ModuleSpec& m, double s, double text, double b, const BlockContext& ctx) {
  const double E = ctx.device->element_bytes(), M = s * b, h = m.hidden, v = double(m.vocab) / ctx.tp;
  const bool reference = ctx.kernels == Kernels::reference;
  const double R = reference ? text * b : M;  // the rows scored
  BlockCost c;
  add_elementwise(c, norm_bytes(M * h, E), ctx);  // final norm
  if (reference) {  // the text's rows out of the sequence, and their gradients back into a zeroed one
    c.forward_s += rows_copy_seconds(R, h, ctx);
    if (ctx.grads.any()) c.backward_s += zero_seconds(M * h, ctx) + rows_copy_seconds(R, h, ctx);
  }
  add_gemm(c, R, v, h, 1, true, ctx);
  add_elementwise(c, cross_entropy_bytes(R, v, E), ctx);
  c.comm_forward_s = 2 * tp_all_reduce(R * 4, ctx);  // row max and row sum across vocab shards
  c.collectives_forward = ctx.tp > 1 ? 2 : 0;
  if (ctx.grads.any()) {
    c.comm_backward_s = tp_all_reduce(R * h * E, ctx);  // gradient of the head's input
    c.collectives_backward = ctx.tp > 1 ? 1 : 0;
    c.activation_bytes = R * v * 4 + M * h * E;
  }
  return c;
}

BlockCost embedding_projection(const spec::ModuleSpec& m, double b, const BlockContext& ctx) {
  BlockCost c;
  add_gemm(c, b, m.embed_dim, m.hidden, 1, true, ctx);
  if (ctx.kernels == Kernels::reference)  // nn::ClipHead's L2 normalisation
    add_elementwise(c, norm_bytes(b * m.embed_dim, ctx.device->element_bytes()), ctx);
  if (ctx.grads.any()) c.activation_bytes = b * m.hidden * ctx.device->element_bytes();
  return c;
}

BlockCost position_tables(double tables, double s, double b, double h, const BlockContext& ctx) {
  BlockCost c;
  if (ctx.kernels != Kernels::reference) return c;
  const double M = s * b;
  const double added = residual_op(residual_bytes(M * h, ctx.device->element_bytes()), ctx).forward_s;
  const double lookup = rows_copy_seconds(M, h, ctx) + added;
  c.forward_s = tables * lookup;
  if (ctx.grads.weights) c.backward_s = tables * rows_copy_seconds(M, h, ctx);  // scatter-adds into the tables
  return c;
}

BlockCost encoder_tail(const spec::ModuleSpec& m, double s, double b, const BlockContext& ctx) {
  BlockCost c;
  if (ctx.kernels != Kernels::reference) return c;
  const double E = ctx.device->element_bytes(), M = s * b, h = m.hidden;
  add_elementwise(c, norm_bytes(M * h, E), ctx);  // the final norm, over every token
  if (m.modality == spec::Modality::image) {
    // The mean over each image's patches: rows scatter-added into a zeroed (b, h), scaled;
    // backward each patch gets its image's gradient row, scaled.
    c.forward_s += zero_seconds(b * h, ctx) + rows_copy_seconds(M, h, ctx) + scale_seconds(b * h, ctx);
    if (ctx.grads.any()) c.backward_s += rows_copy_seconds(M, h, ctx) + scale_seconds(M * h, ctx);
  } else {
    // The last token's row of each sequence; backward scattered into a zeroed sequence.
    c.forward_s += rows_copy_seconds(b, h, ctx);
    if (ctx.grads.any()) c.backward_s += zero_seconds(M * h, ctx) + rows_copy_seconds(b, h, ctx);
  }
  return c;
}

BlockCost decoder_input(double s, double text, double b, double h, const BlockContext& ctx) {
  BlockCost c;
  if (ctx.kernels != Kernels::reference) return c;
  const double prefix = (s - text) * b, words = text * b;
  // [prefix ; text] scattered into a zeroed sequence; backward both gathered out of its gradient.
  c.forward_s = zero_seconds(s * b * h, ctx) + rows_copy_seconds(prefix, h, ctx) + rows_copy_seconds(words, h, ctx);
  if (ctx.grads.any()) c.backward_s = rows_copy_seconds(words, h, ctx) + rows_copy_seconds(prefix, h, ctx);
  return c;
}

BlockCost generator_head(const spec::ModuleSpec& m, double s, double b, const BlockContext& ctx) {
  const double E = ctx.device->element_bytes(), M = s * b;
  const double patch = double(m.patch_size) * m.patch_size * m.channels;
  BlockCost c;
  add_gemm(c, M, patch, m.hidden, 1, true, ctx);
  add_elementwise(c, 3 * M * patch * E, ctx);  // noise-prediction regression loss
  if (ctx.grads.any()) c.activation_bytes = M * m.hidden * E;
  return c;
}

BlockCost linear_stack(const spec::ModuleSpec& m, double in_width, double s, double b, const BlockContext& ctx) {
  const double E = ctx.device->element_bytes(), M = s * b;
  BlockCost c;
  double width = in_width;
  for (int l = 0; l < m.layers; ++l) {
    double out = (l + 1 == m.layers) ? m.hidden : m.ffn;
    add_gemm(c, M, out, width, 1, true, ctx);
    if (l + 1 < m.layers) add_elementwise(c, activation_bytes(M * out, false, E), ctx);  // GELU
    if (ctx.grads.any()) c.activation_bytes += M * width * E + (l + 1 < m.layers ? M * out * E : 0);
    width = out;
  }
  return c;
}

}  // namespace braid::cost
