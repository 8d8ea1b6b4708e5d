// A piece of work on one device for one microbatch (a transformer layer, an
// embedding, an LM head...): FLOPs, time, exposed TP communication, the
// activations it keeps for backward and the parameters it holds.
#pragma once

namespace braid::cost {

struct BlockCost {
  double flops_forward = 0;    // model FLOPs
  double flops_backward = 0;   // model FLOPs (2x forward for trainable GEMMs)
  double flops_recompute = 0;  // extra forward FLOPs spent by activation recomputation
  double forward_s = 0;        // compute time
  double backward_s = 0;       // compute time, without recomputation
  double recompute_s = 0;      // compute time of the recomputed forward
  double comm_forward_s = 0;   // exposed tensor-parallel collectives in forward
  double comm_backward_s = 0;  // ... in backward, including the recomputed forward's
  // How many collectives those are, counted where they are priced: each is a wait on the
  // device, and Optimus' fine pass fills each with encoder work (its TP bubbles).
  double collectives_forward = 0;
  double collectives_backward = 0;
  double activation_bytes = 0;  // kept from forward to backward, per microbatch
  // Activations that recomputation re-creates for a backward, one layer at a time: held on top
  // of what is kept while that layer's backward runs. Not a sum: a block's parts run one after
  // another, so it is the largest of theirs (and n layers hold one layer's).
  double recompute_bytes = 0;
  double parameters = 0;  // held on this device (CostModel sets it from spec::module_parameter_split)

  BlockCost& operator+=(const BlockCost& o) {
    flops_forward += o.flops_forward;
    flops_backward += o.flops_backward;
    flops_recompute += o.flops_recompute;
    forward_s += o.forward_s;
    backward_s += o.backward_s;
    recompute_s += o.recompute_s;
    comm_forward_s += o.comm_forward_s;
    comm_backward_s += o.comm_backward_s;
    collectives_forward += o.collectives_forward;
    collectives_backward += o.collectives_backward;
    activation_bytes += o.activation_bytes;
    recompute_bytes = recompute_bytes > o.recompute_bytes ? recompute_bytes : o.recompute_bytes;
    parameters += o.parameters;
    return *this;
  }
  BlockCost times(double n) const {
    BlockCost c = *this;
    c.flops_forward *= n;
    c.flops_backward *= n;
    c.flops_recompute *= n;
    c.forward_s *= n;
    c.backward_s *= n;
    c.recompute_s *= n;
    c.comm_forward_s *= n;
    c.comm_backward_s *= n;
    c.collectives_forward *= n;
    c.collectives_backward *= n;
    c.activation_bytes *= n;
    if (n == 0) c.recompute_bytes = 0;
    c.parameters *= n;
    return c;
  }
  // Wall time of the forward and of the backward (with recomputation) of this block.
  double forward_time() const { return forward_s + comm_forward_s; }
  double backward_time() const { return backward_s + recompute_s + comm_backward_s; }
  double compute_time() const { return forward_s + backward_s + recompute_s; }
  double hardware_flops() const { return flops_forward + flops_backward + flops_recompute; }
};

}  // namespace braid::cost
