"""Runs one rank's braid program over PyTorch modules (braid-driven mode).

The program (``braid.Program``) is the only description of a step: this executor walks
this rank's instruction list through one dispatch table keyed by opcode name, as braid's
own interpreter and DeepSpeed's ``_INSTRUCTION_MAP`` do, and records what it executed so
that "executed = planned" can be checked.

What the host provides:

* ``layers``: plan module name -> that module's layers, a sequence of ``nn.Module`` or a
  callable ``layer_index -> nn.Module`` (only the layers this rank runs are built).
  A module's first layer is called as ``layer(inputs, batch)``: ``inputs`` is the
  upstream module's output (None for a module that starts the model) and ``batch`` the
  microbatch's data; every other layer as ``layer(x)``.
* ``loss_fn(output, batch)``: per-sample losses (shape ``[samples]``) of the model's last
  module; the step's loss is their mean over the global batch. Required on a stage that
  ends the model; any other shape is refused (a mean would be divided again).
* a contrastive model's towers end in a BATCH_SYNC: CLIP's loss over the group's
  samples, with ``logit_scale`` (the exponentiated scale) — the step's loss is the mean
  of the groups' losses weighted by their sample counts.
* ``data(indices)``: the step's samples ``indices`` (positions in its global batch) as a
  dict of tensors, batch dimension first.

Gradients: every backward starts from the step's loss as defined above, so a rank's
gradients are its partial derivatives of that loss; REDUCE_GRADS sums them over the
module's DP group (fan-in producers included, whose consumers' losses already span all
of them) and scales by the stage's ``gradient_scale``. Each parameter is reduced once
however many layers share it; one with ``requires_grad=False`` is left alone. Gradients
accumulate as in PyTorch: what ``p.grad`` held when ``step`` began (a host that steps its
optimizer itself, every other step) is kept, and only this step's part is reduced.

Messages between stages carry their tensors' dtype: a stage receives activations and
gradients in the dtype its peer sent (float32, float64, float16 or bfloat16).

Samples (positions in the step's global batch G): the step's contrastive groups (G / C,
C the contrastive batch; one group without a contrastive loss) are consecutive blocks of
C positions; replica r of a stage that starts the model, with D replicas and K
microbatches per group, holds positions [g C + r C/D + k C/(D K), ...) in microbatch
g K + k, so every tower of a contrastive model holds the same samples in group g however
its replicas split it. A stage fed by another holds what it receives (fan-in: its
producers' microbatches concatenated in replica order; fan-out: an equal slice of its
producer's); a colocated encoder's replicas hold their llm replica's samples.

``step`` returns what the handlers ran: each records, under its own opcode, the
instruction it executed, so a test can compare that with the program.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .. import tensor as _tensor
from .. import vocab
from ..vocab import ENCODER_UNIT_FIRST_KERNEL, ENCODER_UNITS, FLAG_BACKWARD_TASK, FLAG_SYNC_ONLY

LayerSource = Union[Sequence[torch.nn.Module], Callable[[int], torch.nn.Module]]

# Message kinds, part of the point-to-point tag (with the microbatch).
_ACTIVATION, _GRADIENT = 0, 1
_HEADER = 8  # int64 slots: dtype (its index in _DTYPES), ndim, then the shape
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _replica_peers(my_replicas: int, my_replica: int, peer_replicas: int) -> List[int]:
    """The peer stage's replicas that replica ``my_replica`` exchanges with (braid/pipeline.h:
    fan-in r -> r/(A/B), fan-out r -> r*(B/A) .. r*(B/A)+B/A-1)."""
    if my_replicas == peer_replicas:
        return [my_replica]
    if my_replicas > peer_replicas:
        return [my_replica // (my_replicas // peer_replicas)]
    k = peer_replicas // my_replicas
    return list(range(my_replica * k, my_replica * k + k))


def _check_groups_of(plan, groups) -> None:
    """Groups made from another plan would pair ranks the program does not: each would wait
    in a collective the others never join."""
    def layout(g):
        return ([(x.name, tuple(int(r) for r in x.ranks)) for x in g.groups],
                [tuple(int(r) for r in b.ranks) for b in g.batch_syncs])

    mine = plan.groups(groups.braid.world_size)
    try:
        if layout(mine) != layout(groups.braid):
            raise ValueError("braid.torch: groups were not made from the program's plan (their process groups or "
                             "batch-sync groups differ from plan.groups()): make both from one plan")
    finally:
        mine.close()


def _all_reduce_sum(tensor: torch.Tensor, group) -> None:
    """All-reduce (sum) in place; gloo has no bfloat16 all-reduce, so it sums a float32 copy."""
    if tensor.dtype == torch.bfloat16 and dist.get_backend(group) == "gloo":
        wide = tensor.to(torch.float32)
        dist.all_reduce(wide, group=group)
        tensor.copy_(wide)
    else:
        dist.all_reduce(tensor, group=group)


class ProgramExecutor:
    """Executes one rank's slice of a braid program.

    ``program``: the ``braid.Program`` every rank built from the same plan;
    ``groups``: a :class:`braid.torch.Groups` of that plan; ``rank``: this process's
    rank (default: torch.distributed's); ``make_optimizer(params)``: builds the optimizer
    over :meth:`parameters`, stepped at each OptimizerStep (None: the host steps its own).
    ``global_batch`` (default: the run's) is any multiple of the contrastive batch that
    makes the program's contrastive groups and splits evenly over every stage."""

    def __init__(self, program, groups, layers: Mapping[str, LayerSource], loss_fn: Optional[Callable] = None,
                 global_batch: Optional[int] = None, logit_scale: float = 1.0, rank: Optional[int] = None,
                 make_optimizer: Optional[Callable] = None) -> None:
        self.program = program
        self.groups = groups
        _check_groups_of(program.plan, groups)
        self.rank = dist.get_rank() if rank is None else int(rank)
        self.loss_fn = loss_fn
        self.logit_scale = float(logit_scale)
        plan = program.plan
        self.modules = plan.modules
        settings = plan.config.run_settings
        self.global_batch = int(global_batch if global_batch is not None else settings.global_batch)
        self.stages = program.stages
        me = program.rank(self.rank)
        self.stage_index, self.replica = me.stage, me.replica
        self.stage = self.stages[self.stage_index]
        self.instructions = tuple(me.instructions)
        self.layers: List[Tuple[int, bool, torch.nn.Module]] = []  # (plan module, first of its module, layer)
        self.module_parameters: Dict[int, List[torch.nn.Parameter]] = {}
        colocated = any(i.opcode == "EncoderTask" for i in self.instructions)
        self.encoders = [m for m, info in enumerate(self.modules) if info.role == "encoder"]
        self.encoder_layers: Dict[int, Dict[int, torch.nn.Module]] = {}  # plan module -> layer index -> layer
        for part in self.stage.parts:
            name = self.modules[part.module].name
            if name not in layers:
                raise KeyError(f"braid.torch: stage '{self.stage.name}' runs module '{name}' but no layers were given "
                               f"for it (given: {', '.join(sorted(layers)) or 'none'})")
            source = layers[name]
            built_on_demand = callable(source) and not isinstance(source, torch.nn.Module)
            if not built_on_demand:
                self._check_layer_count(part.module, source)
            for i in range(part.first_layer, part.first_layer + part.layer_count):
                layer = source(i) if built_on_demand else source[i]
                if colocated and part.module in self.encoders:
                    self.encoder_layers.setdefault(part.module, {})[i] = layer
                else:
                    self.layers.append((part.module, i == 0, layer))
                self._hold_parameters(part.module, layer)
        self._check_supported()
        self.microbatches = sorted({i.microbatch for i in self.instructions if i.opcode == "Forward"})
        # Contrastive groups per step (BATCH_SYNC group g is the step's g-th contrastive batch).
        self.contrastive_groups = self._check_global_batch(int(settings.contrastive_batch))
        self._check_fan_outs()
        self.terminal = not self.stage.next and not any(i.opcode == "BatchSync" for i in self.instructions)
        if self.terminal and loss_fn is None:
            raise ValueError(f"braid.torch: stage '{self.stage.name}' ends the model: give loss_fn (per-sample losses)")
        self.optimizer = make_optimizer(self.parameters()) if make_optimizer else None
        # The dispatch table: opcode name -> handler. A host engine may rebind entries to
        # run an opcode its own way (braid.deepspeed routes every opcode through DeepSpeed's
        # instruction map and calls these handlers for braid's semantics).
        # Each handler records, under its own opcode, the instruction it ran: the step's
        # `executed` is what the handlers did, not what the loop handed out.
        self.dispatch = {op: self._recording(op, handler) for op, handler in (
            ("LoadMicrobatch", self._load_microbatch),
            ("Forward", self._forward),
            ("Backward", self._backward),
            ("SendActivation", self._send_activation),
            ("RecvActivation", self._recv_activation),
            ("SendGrad", self._send_grad),
            ("RecvGrad", self._recv_grad),
            ("BatchSync", self._batch_sync),
            ("ReduceGrads", self._reduce_grads),
            ("OptimizerStep", self._optimizer_step),
            ("EncoderTask", self._encoder_task),
        )}
        unknown = [op for op in vocab.opcodes() if op not in self.dispatch]
        if unknown:
            raise RuntimeError(f"braid.torch: the library has opcodes this executor does not know: {unknown}")

    def _recording(self, opcode: str, handler: Callable) -> Callable:
        def run(instruction) -> None:
            handler(instruction)
            self._executed.append(dataclasses.replace(instruction, opcode=opcode))

        return run

    # ---- what this executor runs --------------------------------------------------------

    def _check_layer_count(self, module: int, source: Sequence[torch.nn.Module]) -> None:
        name = self.modules[module].name
        planned = sum(self.modules[module].layers_per_stage)
        if len(source) != planned:
            raise ValueError(f"braid.torch: layers['{name}'] has {len(source)} layers but the plan's module '{name}' "
                             f"has {planned}")

    def _hold_parameters(self, module: int, layer: torch.nn.Module) -> None:
        """Files ``layer``'s parameters under ``module`` for REDUCE_GRADS, each parameter
        once on this rank (tied weights would otherwise be summed twice)."""
        held = {id(p) for params in self.module_parameters.values() for p in params}
        fresh = [p for p in layer.parameters() if id(p) not in held]
        self.module_parameters.setdefault(module, []).extend(fresh)

    def _check_global_batch(self, contrastive_batch: int) -> int:
        """Checks that ``global_batch`` splits evenly everywhere samples() splits it;
        returns the step's number of contrastive groups."""
        batch = self.global_batch
        if batch <= 0:
            raise ValueError(f"braid.torch: global_batch must be positive, got {batch}")
        contrastive = contrastive_batch or batch
        if batch % contrastive:
            raise ValueError(f"braid.torch: global_batch {batch} is not a multiple of the contrastive batch "
                             f"{contrastive}")
        groups = batch // contrastive
        syncs = {i.group for stage in range(len(self.stages)) for i in self.program.instructions(stage)
                 if i.opcode == "BatchSync"}
        if syncs and len(syncs) != groups:
            raise ValueError(f"braid.torch: global_batch {batch} makes {groups} contrastive groups of {contrastive} "
                             f"samples, but the program batch-syncs {len(syncs)}: give global_batch "
                             f"{len(syncs) * contrastive}, or plan with this batch")
        for index, stage in enumerate(self.stages):
            if self._upstream(index) is not None:
                continue  # holds what its producers send
            split = stage.replicas * self._stage_microbatches(index)
            if batch % split or (syncs and self._stage_microbatches(index) % groups):
                raise ValueError(f"braid.torch: global_batch {batch} does not split evenly over stage '{stage.name}' "
                                 f"({stage.replicas} replicas x {self._stage_microbatches(index)} microbatches)")
        for module in self.encoder_layers:
            split = self.modules[module].dp * len(self._encoder_microbatches(module))
            if batch % split:
                raise ValueError(f"braid.torch: global_batch {batch} does not split evenly over colocated encoder "
                                 f"'{self.modules[module].name}' ({self.modules[module].dp} replicas x "
                                 f"{len(self._encoder_microbatches(module))} microbatches)")
        return groups

    def _check_fan_outs(self) -> None:
        """A stage fed by fewer replicas takes an equal slice of each producer microbatch's rows."""
        for index, stage in enumerate(self.stages):
            up = self._upstream(index)
            if up is None or self.stages[up].replicas >= stage.replicas:
                continue
            share = stage.replicas // self.stages[up].replicas
            first = min(i.microbatch for i in self.program.instructions(up) if i.opcode == "Forward")
            rows = len(self.samples(up, 0, first))
            if rows % share:
                raise ValueError(f"braid.torch: global_batch {self.global_batch} gives stage "
                                 f"'{self.stages[up].name}' microbatches of {rows} samples, which do not split evenly "
                                 f"over the {share} replicas of stage '{stage.name}' each feeds (fan-out)")

    def _encoder_microbatches(self, module: int) -> List[int]:
        """The microbatches of the colocated encoder ``module``'s tasks on this rank."""
        encoder = self.encoders.index(module)
        return sorted({i.microbatch for i in self.instructions
                       if i.opcode == "EncoderTask" and (i.unit - 1) // ENCODER_UNITS == encoder})

    def _check_supported(self) -> None:
        for module in self.encoder_layers:
            if self.modules[module].pp != 1:
                raise NotImplementedError(
                    f"braid.torch: colocated encoder '{self.modules[module].name}' is pipelined "
                    f"(pp={self.modules[module].pp}); this executor runs colocated encoders with pp=1")
        if len(self.encoder_layers) > 1:
            raise NotImplementedError("braid.torch: a colocated stage with several encoders (their outputs' order "
                                      "into the llm is the host model's business); run one encoder")
        if self.stage.devices_per_replica != 1:
            raise NotImplementedError(
                f"braid.torch: stage '{self.stage.name}' is tensor-parallel ({self.stage.devices_per_replica} devices "
                "per replica); the PyTorch executor runs user modules unsharded, so plan with tp=1")
        for module in self.encoder_layers:
            held = next(h for h in self.groups.braid.rank(self.rank).holdings if h.module == module)
            if self.modules[module].dp != self.stage.replicas or held.dp != self.replica:
                raise NotImplementedError(
                    f"braid.torch: colocated encoder '{self.modules[module].name}' has {self.modules[module].dp} DP "
                    f"replicas and stage '{self.stage.name}' {self.stage.replicas}: this executor runs a colocated "
                    "encoder whose replicas hold the llm replicas' samples (equal DP widths)")
        for i in self.instructions:
            if i.flags & FLAG_SYNC_ONLY:
                raise NotImplementedError(
                    f"braid.torch: stage '{self.stage.name}' hands colocated encoder outputs to another stage "
                    f"({i.opcode} of microbatch {i.microbatch}, an ordering-only message); this executor runs "
                    "colocated plans whose llm is one pipeline stage")
            if i.chunk != 0 and i.opcode != "EncoderTask":
                raise NotImplementedError(
                    f"braid.torch: stage '{self.stage.name}' runs model chunk {i.chunk} (schedule "
                    f"'{self.program.schedule}'); this executor runs one chunk per stage")

    def named_layers(self) -> List[Tuple[str, torch.nn.Module]]:
        """Every layer this rank runs, named "<module>_<layer index>", in the order of its
        stage's parts (colocated encoders' layers included)."""
        model_layers = iter(layer for _, _, layer in self.layers)
        named = []
        for part in self.stage.parts:
            name = self.modules[part.module].name
            for i in range(part.first_layer, part.first_layer + part.layer_count):
                encoder = self.encoder_layers.get(part.module)
                named.append((f"{name}_{i}", encoder[i] if encoder is not None else next(model_layers)))
        return named

    def parameters(self) -> List[torch.nn.Parameter]:
        """This rank's parameters, each once, in layer order (colocated encoders last)."""
        seen, out = set(), []
        encoder_layers = [layer for layers in self.encoder_layers.values() for _, layer in sorted(layers.items())]
        for layer in [layer for _, _, layer in self.layers] + encoder_layers:
            for p in layer.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    # ---- samples --------------------------------------------------------------------------

    def _upstream(self, stage: int) -> Optional[int]:
        """The stage that feeds ``stage`` its activations (the shallowest of its prev)."""
        info = self.stages[stage]
        feeders = [p for p in info.prev if self.stages[p].depth < info.depth]
        return min(feeders, key=lambda p: self.stages[p].depth) if feeders else None

    def _stage_microbatches(self, stage: int) -> int:
        if stage == self.stage_index:
            return len(self.microbatches)
        return len({i.microbatch for i in self.program.instructions(stage) if i.opcode == "Forward"})

    def samples(self, stage: int, replica: int, microbatch: int) -> List[int]:
        """Positions in the step's global batch of ``microbatch`` of ``replica`` of ``stage``."""
        up = self._upstream(stage)
        replicas = self.stages[stage].replicas
        if up is None:
            # Contrastive group g holds positions [g C, (g+1) C), C the contrastive batch
            # (the whole batch without one); its K microbatches per replica split it.
            groups = self.contrastive_groups
            per_group = self._stage_microbatches(stage) // groups
            size = self.global_batch // groups
            per = size // (replicas * per_group)
            group, k = divmod(microbatch, per_group)
            first = group * size + replica * (size // replicas) + k * per
            return list(range(first, first + per))
        producers = self.stages[up].replicas
        peers = _replica_peers(replicas, replica, producers)
        if producers < replicas:  # fan-out: an equal slice of the one producer's rows
            k = replicas // producers
            rows = self.samples(up, peers[0], microbatch)
            size = len(rows) // k
            return rows[(replica % k) * size:(replica % k + 1) * size]
        return [s for p in peers for s in self.samples(up, p, microbatch)]  # fan-in: concatenated

    # ---- the step -------------------------------------------------------------------------

    def step(self, data: Callable[[List[int]], Mapping[str, torch.Tensor]]) -> Dict[str, Any]:
        """Runs this rank's instructions for one step. Returns ``loss`` (this rank's share
        of the step's loss; their sum over the ranks is the step's loss) and ``executed``
        (the instructions run, in order)."""
        if not callable(data):
            raise TypeError(f"braid.torch: step(data): data must be a callable of sample positions, got "
                            f"{type(data).__name__}")
        if not torch.is_grad_enabled():
            raise RuntimeError("braid.torch: step() runs the backward passes too: call it with gradients enabled "
                               "(not under torch.no_grad() or inference_mode())")
        self._data = data
        self._batches: Dict[int, Mapping[str, torch.Tensor]] = {}
        self._inputs: Dict[int, Optional[torch.Tensor]] = {}
        self._outputs: Dict[int, torch.Tensor] = {}
        self._grads: Dict[int, torch.Tensor] = {}
        self._pending: List[Any] = []  # sends in flight, with their buffers
        self._encoder: Dict[Tuple[int, int], Dict[str, Any]] = {}  # (plan module, encoder microbatch) -> state
        self.loss = 0.0
        self._executed: List[Any] = []
        # Gradients left from earlier steps are already reduced: only this step's part is.
        self._grads_at_entry = {id(p): p.grad.detach().clone() for p in self._trained_parameters()
                                if p.grad is not None and bool(p.grad.any())}
        for instruction in self.instructions:
            self.dispatch[instruction.opcode](instruction)
        for work, _ in self._pending:
            work.wait()
        return {"loss": self.loss, "executed": list(self._executed)}

    def _batch(self, microbatch: int) -> Mapping[str, torch.Tensor]:
        if microbatch not in self._batches:
            self._batches[microbatch] = self._data(self.samples(self.stage_index, self.replica, microbatch))
        return self._batches[microbatch]

    def _load_microbatch(self, ins) -> None:
        self._batch(ins.microbatch)
        self._inputs.setdefault(ins.microbatch, None)

    def _forward(self, ins) -> None:
        m = ins.microbatch
        if self.encoder_layers and self._inputs.get(m) is None:
            self._inputs[m] = self._encoder_output(m)
        x = self._inputs.get(m)
        batch = self._batch(m)
        for _, first, layer in self.layers:
            x = layer(x, batch) if first else layer(x)
        if self.terminal:
            x = self._loss(x, batch, m)
        self._outputs[m] = x

    def _loss(self, output: torch.Tensor, batch: Mapping[str, torch.Tensor], microbatch: int) -> torch.Tensor:
        """The microbatch's share of the step's loss: its per-sample losses over the global batch."""
        losses = self.loss_fn(output, batch)
        samples = len(self.samples(self.stage_index, self.replica, microbatch))
        if not torch.is_tensor(losses) or tuple(losses.shape) != (samples,):
            got = tuple(losses.shape) if torch.is_tensor(losses) else type(losses).__name__
            raise ValueError(f"braid.torch: loss_fn must return per-sample losses, shape ({samples},) for microbatch "
                             f"{microbatch}, got {got}")
        share = losses.sum() / self.global_batch
        self.loss += float(share)
        return share

    def _backward(self, ins) -> None:
        m = ins.microbatch
        out = self._outputs.pop(m)
        grad = None if self.terminal else self._grads.pop(m)
        if out.requires_grad:  # else frozen layers on inputs that need no gradient: nothing to do
            out.backward(grad)
        if self.encoder_layers:
            self._encoder_gradient(m, self._inputs.pop(m))

    def _input_grad(self, x: torch.Tensor, microbatch: int, layers: str) -> torch.Tensor:
        """The gradient of a received input: None when a layer cut it from the loss."""
        if x.grad is None:
            raise ValueError(f"braid.torch: layers {layers} of stage '{self.stage.name}' pass no gradient back to "
                             f"their input of microbatch {microbatch}: one detaches or ignores its input")
        return x.grad

    def _stage_layer_names(self) -> str:
        """The layers a received input flows through (colocated encoders' aside)."""
        mine = {id(layer) for _, _, layer in self.layers}
        names = [name for name, layer in self.named_layers() if id(layer) in mine]
        return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"

    # ---- point to point -------------------------------------------------------------------

    def _peer_ranks(self, peer_stage: int) -> List[int]:
        peer = self.stages[peer_stage]
        return [peer.first_device + r * peer.device_stride
                for r in _replica_peers(self.stage.replicas, self.replica, peer.replicas)]

    @staticmethod
    def _tag(kind: int, microbatch: int) -> int:
        return microbatch * 2 + kind

    def _send(self, tensor: torch.Tensor, peer_stage: int, kind: int, microbatch: int) -> None:
        ranks = self._peer_ranks(peer_stage)
        rows = tensor.shape[0]
        if rows % len(ranks):
            raise RuntimeError(f"braid.torch: {rows} rows cannot be split evenly over the {len(ranks)} replicas of "
                               f"stage '{self.stages[peer_stage].name}' (fan-out)")
        if tensor.dtype not in _DTYPES or tensor.dim() > _HEADER - 2:
            raise TypeError(f"braid.torch: stage '{self.stage.name}' sends a {tensor.dtype} tensor of {tensor.dim()} "
                            f"dimensions to stage '{self.stages[peer_stage].name}'; messages carry "
                            f"{', '.join(str(d) for d in _DTYPES)} tensors of up to {_HEADER - 2} dimensions")
        for part, dst in zip(tensor.detach().split(rows // len(ranks), dim=0), ranks):
            part = part.contiguous()
            header = torch.zeros(_HEADER, dtype=torch.int64)
            header[0] = _DTYPES.index(part.dtype)
            header[1] = part.dim()
            header[2:2 + part.dim()] = torch.tensor(part.shape, dtype=torch.int64)
            tag = self._tag(kind, microbatch)
            self._pending.append((dist.isend(header, dst, tag=tag), header))
            self._pending.append((dist.isend(part, dst, tag=tag), part))

    def _recv(self, peer_stage: int, kind: int, microbatch: int) -> torch.Tensor:
        parts = []
        for src in self._peer_ranks(peer_stage):
            header = torch.zeros(_HEADER, dtype=torch.int64)
            tag = self._tag(kind, microbatch)
            dist.recv(header, src, tag=tag)
            shape = tuple(int(v) for v in header[2:2 + int(header[1])])
            part = torch.empty(shape, dtype=_DTYPES[int(header[0])])
            dist.recv(part, src, tag=tag)
            parts.append(part)
        return torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]

    def _send_activation(self, ins) -> None:
        self._send(self._outputs[ins.microbatch], ins.peer, _ACTIVATION, ins.microbatch)

    def _recv_activation(self, ins) -> None:
        self._inputs[ins.microbatch] = self._recv(ins.peer, _ACTIVATION, ins.microbatch).requires_grad_(True)

    def _send_grad(self, ins) -> None:
        x = self._inputs.pop(ins.microbatch)
        self._send(self._input_grad(x, ins.microbatch, self._stage_layer_names()), ins.peer, _GRADIENT,
                   ins.microbatch)

    def _recv_grad(self, ins) -> None:
        self._grads[ins.microbatch] = self._recv(ins.peer, _GRADIENT, ins.microbatch)

    # ---- contrastive batch-sync -----------------------------------------------------------

    def _batch_sync(self, ins) -> None:
        """CLIP's loss over the samples of the contrastive group: every member writes its
        tower's rows of the group's embeddings, one all-reduce assembles them, each member
        computes the loss of its own rows with braid's kernel and the gradients of every
        row, a second all-reduce sums those, and each keeps its tower's rows."""
        per_group = len(self.microbatches) // self.contrastive_groups
        mine = [m for m in self.microbatches if m // per_group == ins.group]
        missing = [m for m in mine if m not in self._outputs]
        if missing:
            raise RuntimeError(f"braid.torch: BatchSync of group {ins.group} before the forwards of microbatches "
                               f"{missing}")
        index, members = self._batch_sync_group()
        group = self.groups.batch_syncs[index]
        self._check_embedding_widths(index, ins.group, [self._outputs[m] for m in mine])
        towers = sorted({member.module for member in members})
        tower = towers.index(self.stage.parts[-1].module)
        # The group's rows are positions [g C, (g+1) C) of the batch, on every tower.
        total = self.global_batch // self.contrastive_groups
        own = [s - ins.group * total for m in mine for s in self.samples(self.stage_index, self.replica, m)]
        rows = torch.tensor(own)
        if rows.numel() and not torch.equal(rows, torch.arange(int(rows[0]), int(rows[0]) + rows.numel())):
            raise RuntimeError("braid.torch: a batch-sync member's rows are not contiguous in its group")
        embeddings = torch.cat([self._outputs[m] for m in mine], dim=0)
        n, width = embeddings.shape
        gathered = torch.zeros(len(towers), total, width)
        gathered[tower, rows] = embeddings.detach().to(torch.float32)
        dist.all_reduce(gathered, group=group)
        if len(towers) != 2:
            raise NotImplementedError(f"braid.torch: a contrastive loss over {len(towers)} towers")
        offset = int(rows[0]) if n else 0
        local = [gathered[t, offset:offset + n].contiguous() for t in range(2)]
        loss, stats = _tensor.contrastive_forward(local[0], local[1], gathered[0].contiguous(),
                                                  gathered[1].contiguous(), self.logit_scale, offset)
        # Each sample's loss is computed once per tower (by the member of each tower holding it).
        weight = n / (self.global_batch * len(towers))
        grads = [torch.empty_like(local[0]), torch.empty_like(local[1])]
        grad_all = torch.empty(2, total, width)
        _tensor.contrastive_backward(local[0], local[1], gathered[0].contiguous(), gathered[1].contiguous(),
                                     self.logit_scale, offset, stats, weight, grads[0], grads[1], grad_all[0],
                                     grad_all[1])
        grad_all[0, offset:offset + n] += grads[0]
        grad_all[1, offset:offset + n] += grads[1]
        dist.all_reduce(grad_all, group=group)
        self.loss += loss * weight
        mine_grad = grad_all[tower, rows]
        at = 0
        for m in mine:
            size = self._outputs[m].shape[0]
            self._grads[m] = mine_grad[at:at + size].to(self._outputs[m].dtype)
            at += size

    def _check_embedding_widths(self, index: int, group: int, outputs: List[torch.Tensor]) -> None:
        """Every member's embeddings are (rows, width) of one width, compared before the
        all-reduce (gloo aborts the process on tensors of different shapes); a mismatch is a
        ValueError on every member."""
        two_d = all(o.dim() == 2 for o in outputs)
        widths = {int(o.shape[1]) for o in outputs} if two_d else set()
        mine = torch.tensor([widths.pop() if len(widths) == 1 else -1], dtype=torch.int64)
        ranks = self.groups.batch_sync_ranks[index]
        every = [torch.zeros_like(mine) for _ in ranks]
        dist.all_gather(every, mine, group=self.groups.batch_syncs[index])
        said = [int(w) for w in every]
        if min(said) < 0 or len(set(said)) > 1:
            raise ValueError(f"braid.torch: BatchSync of group {group} joins the towers' embeddings, each (rows, width) "
                             "of one width; got " + ", ".join(
                                 f"rank {r}: " + (f"width {w}" if w >= 0 else "not (rows, width) of one width")
                                 for r, w in zip(ranks, said)))

    def _batch_sync_group(self):
        for index, sync in enumerate(self.groups.braid.batch_syncs):
            if self.rank in sync.ranks:
                return index, sync.members
        raise RuntimeError(f"braid.torch: rank {self.rank} runs a BatchSync but is in no batch-sync group")

    # ---- colocated encoder tasks (Optimus) -------------------------------------------------
    #
    # Layer granularity: layer L of an encoder runs its forward (and later its backward) at
    # the task of L's first kernel; the layer's other kernels, the embedding and head
    # (inside the host's first and last layers), the hand-over to the llm (on this device)
    # and the shard traffic are inside that work, so their tasks only mark its place.

    def _encoder_samples(self, module: int, microbatch: int) -> List[int]:
        info = self.modules[module]
        replica = next(h.dp for h in self.groups.braid.rank(self.rank).holdings if h.module == module)
        per = self.global_batch // (info.dp * len(self._encoder_microbatches(module)))
        first = replica * (self.global_batch // info.dp) + microbatch * per
        return list(range(first, first + per))

    def _encoder_task(self, ins) -> None:
        encoder, slot = divmod(ins.unit - 1, ENCODER_UNITS)
        module = self.encoders[encoder]
        if slot != ENCODER_UNIT_FIRST_KERNEL or module not in self.encoder_layers:
            return
        layer_index = min(self.encoder_layers[module]) + ins.chunk  # chunk: the layer within the stage's range
        state = self._encoder.setdefault((module, ins.microbatch), {"inputs": {}, "outputs": {}, "grads": {}})
        layers = self.encoder_layers[module]
        if not ins.flags & FLAG_BACKWARD_TASK:
            if layer_index == 0:
                samples = self._encoder_samples(module, ins.microbatch)
                state["samples"] = samples
                y = layers[0](None, self._data(samples))
            else:
                x = state["outputs"][layer_index - 1].detach().requires_grad_(True)
                state["inputs"][layer_index] = x
                y = layers[layer_index](x)
            state["outputs"][layer_index] = y
            return
        out = state["outputs"].pop(layer_index)
        if layer_index + 1 in state["inputs"]:
            name = f"{self.modules[module].name}_{layer_index + 1}"
            grad = self._input_grad(state["inputs"].pop(layer_index + 1), ins.microbatch, name)
        else:
            grad = state["grads"].pop("output")
        if out.requires_grad:  # a frozen first layer has nothing to give back
            out.backward(grad)

    def _encoder_output(self, microbatch: int) -> torch.Tensor:
        """The llm microbatch's input: its samples' rows of the encoder's outputs."""
        module = next(iter(self.encoder_layers))
        last = max(self.encoder_layers[module])
        rows = {}
        for (mod, _), state in self._encoder.items():
            if mod == module and last in state["outputs"]:
                out = state["outputs"][last]
                rows.update({s: out[k] for k, s in enumerate(state["samples"])})
        samples = self.samples(self.stage_index, self.replica, microbatch)
        missing = [s for s in samples if s not in rows]
        if missing:
            raise RuntimeError(f"braid.torch: llm microbatch {microbatch} needs samples {missing} that no encoder task "
                               "of this rank produced (the colocated encoder must hold the llm replica's samples)")
        return torch.stack([rows[s].detach() for s in samples]).requires_grad_(True)

    def _encoder_gradient(self, microbatch: int, x: torch.Tensor) -> None:
        """Hands the llm input's gradient back to the encoder microbatches its rows came from."""
        module = next(iter(self.encoder_layers))
        at = {s: k for k, s in enumerate(self.samples(self.stage_index, self.replica, microbatch))}
        grad_x = self._input_grad(x, microbatch, self._stage_layer_names())
        for (mod, _), state in self._encoder.items():
            if mod != module or "samples" not in state or not any(s in at for s in state["samples"]):
                continue
            grad = state["grads"].setdefault("output", torch.zeros_like(state["outputs"][max(state["outputs"])]))
            for k, s in enumerate(state["samples"]):
                if s in at:
                    grad[k] += grad_x[at[s]]

    # ---- gradients and the optimizer ------------------------------------------------------

    def _trained_parameters(self) -> List[torch.nn.Parameter]:
        return [p for params in self.module_parameters.values() for p in params if p.requires_grad]

    def _reduce_grads(self, ins) -> None:
        scale = self.stage.gradient_scale
        for module, params in self.module_parameters.items():
            name = self.groups.name_of(module, "dp")
            group = self.groups.groups[name] if len(self.groups.ranks(name)) > 1 else None
            for p in params:
                if p.requires_grad:  # a frozen parameter gets no gradient, so no update
                    self._reduce_grad(p, group, scale)

    def _reduce_grad(self, p: torch.nn.Parameter, group, scale: float) -> None:
        """Sums this step's gradient of ``p`` over ``group`` (None: not replicated) and
        scales it; the part accumulated before the step is already reduced."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        before = self._grads_at_entry.get(id(p))
        grad = p.grad if before is None else p.grad - before
        if group is not None:
            _all_reduce_sum(grad, group)
        if scale != 1.0:
            grad.mul_(scale)
        if before is not None:
            p.grad.copy_(before + grad)

    def _optimizer_step(self, ins) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
