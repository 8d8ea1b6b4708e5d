"""A DeepSpeed PipelineEngine that runs braid's program (the C ABI's host-driven mode).

DeepSpeed's own pipeline engine runs one uniform grid: every stage has the same data
parallelism, a stage talks to the stages next to it, and ``TrainSchedule`` decides the
order. braid plans each module on its own devices with its own DP width (DistMM's
towers, DistTrain's encoder fan-in into the llm, Optimus' colocated encoders), and its
program says what each rank does. This engine keeps DeepSpeed for what DeepSpeed does —
the optimizer, precision bookkeeping, ZeRO-1, the LR scheduler, the DP gradient
reduction — and takes the rest from braid:

* the model (:class:`BraidPipelineModule`) is this rank's layers: the parts of the
  modules its program stage runs, as braid's plan splits them;
* the mpu (:class:`BraidGrid`) is braid's groups: the data-parallel group DeepSpeed
  reduces gradients and shards ZeRO-1 states over is this rank's module DP group, and to
  DeepSpeed every rank is a one-stage pipeline (point-to-point traffic is braid's);
* the schedule is braid's program for this rank: ``braid.torch.ProgramExecutor`` walks it
  and every instruction goes through this engine's ``_INSTRUCTION_MAP`` as a DeepSpeed
  ``PipeInstruction`` (``ForwardPass``, ``SendActivation``, ...; plus :class:`BatchSync`
  and :class:`EncoderTask`), whose ``_exec_*`` method runs it: braid's semantics (peers
  with fan-in/fan-out, the contrastive batch-sync, the loss) from the executor,
  ``ReduceGrads`` and ``OptimizerStep`` from DeepSpeed. ``braid_trace`` records every
  instruction executed, so "executed = planned" is checkable.

Gradients: braid defines each microbatch's loss as its share of the step's loss, so the
plain sum of a stage's gradients over its DP replicas is the step's gradient (also for a
fan-in producer, whose consumer's loss spans all its producers); DeepSpeed *averages*
over the DP group. Before DeepSpeed reduces, ``ReduceGrads`` multiplies the stage's
gradients by its DP width (and braid's ``gradient_scale``, 1 today), which makes
DeepSpeed's average braid's sum, whatever DeepSpeed reduces with (plain all-reduce or
ZeRO-1). With ``gradient_clipping``, the norm is the whole model's, over every rank.

Written against DeepSpeed 0.14.5 (:data:`braid.deepspeed.DEEPSPEED_VERSION`), whose
private parts it uses (``PipelineEngine._INSTRUCTION_MAP`` and ``_exec_*``,
``PipelineModule`` internals); importing this module under another release raises
:class:`braid.deepspeed.DeepSpeedVersionError`.
"""

from __future__ import annotations

import deepspeed as _deepspeed

from braid.deepspeed._version import check_deepspeed_version

check_deepspeed_version(_deepspeed)  # before touching any private part

import os  # noqa: E402
from types import MethodType  # noqa: E402
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.pipe import schedule as _schedule  # noqa: E402
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402
from deepspeed.runtime.pipe.module import PipelineError, PipelineModule  # noqa: E402

import braid  # noqa: E402
import braid.torch as _bt  # noqa: E402
from braid.deepspeed.config import BraidSection, check_batch_keys, run_batch, section_error  # noqa: E402

__all__ = ["BatchSync", "EncoderTask", "BraidGrid", "BraidPipelineModule", "BraidPipelineEngine", "initialize"]


# ---- the instructions DeepSpeed lacks ----------------------------------------------------


class BatchSync(_schedule.PipeInstruction):
    """braid's BATCH_SYNC (DistMM): the contrastive group's embeddings are gathered over
    every tower and DP replica, the loss and every embedding's gradient computed once, and
    this rank keeps its rows' gradients; its microbatches' backwards follow.

    Keyword arguments: ``instruction`` (braid's)."""


class EncoderTask(_schedule.PipeInstruction):
    """braid's ENCODER_TASK (Optimus): colocated encoder work unit ``unit`` of
    ``microbatch`` (a backward with BRAID_FLAG_BACKWARD_TASK), placed by braid's bubble
    scheduler into the llm pipeline's bubbles.

    Keyword arguments: ``instruction`` (braid's)."""


# braid opcode -> the DeepSpeed instruction that stands for it. Keys are the library's
# opcode names, compared without case or underscores ("Forward" or "FORWARD").
_BUFFER_OPS = {
    "loadmicrobatch": _schedule.LoadMicroBatch,
    "forward": _schedule.ForwardPass,
    "backward": _schedule.BackwardPass,
    "sendactivation": _schedule.SendActivation,
    "recvactivation": _schedule.RecvActivation,
    "sendgrad": _schedule.SendGrad,
    "recvgrad": _schedule.RecvGrad,
}
_STEP_OPS = {
    "batchsync": BatchSync,
    "reducegrads": _schedule.ReduceGrads,
    "optimizerstep": _schedule.OptimizerStep,
    "encodertask": EncoderTask,
}


def _key(opcode: str) -> str:
    return str(opcode).replace("_", "").lower()


def pipe_instruction(instruction) -> _schedule.PipeInstruction:
    """The DeepSpeed ``PipeInstruction`` of one braid instruction (its ``instruction``
    keyword holds braid's; buffer operations use the microbatch as ``buffer_id``)."""
    key = _key(instruction.opcode)
    if key in _BUFFER_OPS:
        return _BUFFER_OPS[key](buffer_id=instruction.microbatch, instruction=instruction)
    if key in _STEP_OPS:
        return _STEP_OPS[key](instruction=instruction)
    raise PipelineError(f"braid.deepspeed: braid opcode '{instruction.opcode}' has no DeepSpeed instruction")


# ---- braid's groups as DeepSpeed's mpu ---------------------------------------------------


class BraidGrid:
    """DeepSpeed's grid / mpu interface (``PipelineParallelGrid``'s methods) over braid's
    groups, for one rank.

    Data parallelism is the DP group of the modules this rank's stage runs (braid's, of
    that module's own width); to DeepSpeed every rank is a one-stage pipeline without
    tensor slicing (braid's program carries the point-to-point traffic), so its pipe,
    model and slice groups are this rank alone."""

    def __init__(self, rank: int, world_size: int, dp_ranks: Sequence[int], dp_group, self_group) -> None:
        self.global_rank = int(rank)
        self.world_size = int(world_size)
        self.dp_group = [int(r) for r in dp_ranks]
        self.dp_proc_group = dp_group
        self.data_parallel_size = len(self.dp_group)
        self.data_parallel_id = self.dp_group.index(self.global_rank)
        self.pipe_parallel_size = self.model_parallel_size = self.slice_parallel_size = 1
        self.stage_id = 0
        self.is_first_stage = self.is_last_stage = True
        self.pp_group = self.slice_group = [self.global_rank]
        self.pp_proc_group = self.slice_proc_group = self.ds_model_proc_group = self_group
        self.ds_model_rank, self.ds_model_world_size = 0, 1
        self.p2p_groups: List[List[int]] = []

    def get_stage_id(self) -> int:
        return 0

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    def stage_to_global(self, stage_id: int, **kwargs) -> int:
        if stage_id != 0:
            raise PipelineError("braid.deepspeed: every rank is a one-stage pipeline to DeepSpeed")
        return self.global_rank

    def topology(self):
        return None

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return 0

    def get_pipe_parallel_world_size(self) -> int:
        return 1

    def get_pipe_parallel_group(self):
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_group(self):
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self) -> int:
        return 0

    def get_slice_parallel_world_size(self) -> int:
        return 1

    def get_slice_parallel_group(self):
        return self.slice_proc_group


# ---- this rank's layers as a PipelineModule ----------------------------------------------


class BraidPipelineModule(PipelineModule):
    """This rank's layers (those braid's executor runs: the parts of the modules of its
    program stage) as a DeepSpeed ``PipelineModule``, so that DeepSpeed's engine, optimizer
    and checkpoints see exactly this rank's parameters.

    ``PipelineModule.__init__`` is not run: it would build DeepSpeed's uniform grid over
    the world and partition the layers itself; braid's plan has done both. The attributes
    DeepSpeed 0.14.5's engine reads are set here. The layers run through braid's
    executor (:meth:`BraidPipelineEngine.train_batch`), never through :meth:`forward`."""

    def __init__(self, executor, grid: BraidGrid, loss_fn: Optional[Callable] = None) -> None:
        torch.nn.Module.__init__(self)
        self._grid = grid
        self._topo = None
        self.loss_fn = loss_fn
        self.micro_offset = 0
        self.global_rank, self.world_size = grid.global_rank, grid.world_size
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.num_stages, self.stage_id = 1, 0
        self.seed_layers, self.seed_fn, self.base_seed = False, None, 1234
        self.forward_funcs: List[torch.nn.Module] = []
        self.fwd_map: Dict[str, int] = {}
        for name, layer in executor.named_layers():
            self.fwd_map[name] = len(self.forward_funcs)
            self.forward_funcs.append(layer)
            self.add_module(name, layer)
        self._layer_specs = list(self.forward_funcs)
        self._num_layers = len(self._layer_specs)
        self._local_start, self._local_stop = 0, self._num_layers
        self.tied_modules = torch.nn.ModuleDict()
        self.tied_weight_attrs: Dict[str, Any] = {}
        self.tied_comms: Dict[str, Any] = {}
        self.activation_checkpoint_interval = 0
        self.activation_checkpoint_func = None
        self.checkpointable_layers = None
        self.is_checkpointable_results: List[bool] = []
        self.is_checkpointable_results_interval = None
        for p in self.parameters():
            p.ds_pipe_replicated = False

    def forward(self, *args, **kwargs):
        raise PipelineError("braid.deepspeed: braid's program runs these layers; train with engine.train_batch()")


# ---- the engine ------------------------------------------------------------------------------


class BraidPipelineEngine(PipelineEngine):
    """DeepSpeed's PipelineEngine running this rank's share of braid's program. Made by
    :func:`initialize`.

    :meth:`train_batch` runs one step (the global batch, see there) and returns the step's
    loss; :attr:`braid_trace` lists the DeepSpeed instructions of the last step, each with
    the braid instruction it stands for (``cmd.kwargs["instruction"]``); :attr:`executor`
    is the ``braid.torch.ProgramExecutor`` whose instruction semantics it uses;
    :attr:`braid_plan` and :attr:`braid_program` are the plan and program."""

    def __init__(self, executor, braid_plan, braid_program, section: BraidSection, *super_args,
                 **super_kwargs) -> None:
        # Plain attributes only before nn.Module.__init__ (run by DeepSpeedEngine).
        self._braid = {"executor": executor, "plan": braid_plan, "program": braid_program, "section": section}
        super().__init__(False, *super_args, **super_kwargs)
        self.braid_trace: List[_schedule.PipeInstruction] = []
        self.braid_executed: List[Any] = []
        self.braid_arrangement: Optional[List[int]] = None
        self._braid_ops = dict(executor.dispatch)  # braid's semantics of each opcode
        unknown = [op for op in self._braid_ops if _key(op) not in _BUFFER_OPS and _key(op) not in _STEP_OPS]
        if unknown:
            raise PipelineError(f"braid.deepspeed: opcodes without a DeepSpeed instruction: {unknown}")
        for op in list(executor.dispatch):
            executor.dispatch[op] = self._run_braid_instruction

    @property
    def executor(self):
        return self._braid["executor"]

    @property
    def braid_plan(self):
        return self._braid["plan"]

    @property
    def braid_program(self):
        return self._braid["program"]

    # ---- one step ------------------------------------------------------------------------

    def train_batch(self, data_iter=None, sizes: Optional[Mapping[str, Sequence[int]]] = None):
        """Runs one training step of braid's program on this rank and returns the step's
        loss (the same on every rank).

        ``data_iter``: the step's global batch, as a mapping of tensors (batch dimension
        first, ``train_batch_size`` samples), as a callable ``indices -> mapping`` over
        positions in the global batch, or an iterator yielding either (one per step; the
        default is the iterator set with ``set_dataiterator``). braid decides which
        samples each rank loads: a rank only reads its own.

        ``sizes``: with ``"reorder"`` other than "none", the samples' sizes, by braid's
        names (``image_resolution``, ``text_tokens``, ...: one int per sample of the
        global batch); braid's reordering then decides which replica and microbatch runs
        each sample (:attr:`braid_arrangement`)."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled")
        if data_iter is not None and not _is_batch(data_iter):
            self.set_dataiterator(data_iter)
            data_iter = None
        batch = data_iter if data_iter is not None else self._next_batch()
        if batch is None:
            raise PipelineError("braid.deepspeed: train_batch() needs the step's global batch (or set_dataiterator)")
        data = _sampler(batch, self.executor.global_batch)  # checked before the step's state changes
        self.module.train()
        self.total_loss = None
        self._compute_loss = True
        self.braid_trace = []
        self.fwd_outputs = []
        self.timers("train_batch").start()
        result = self.executor.step(self._arranged(data, sizes))
        self.braid_executed = result["executed"]  # as the executor's handlers recorded them
        share = torch.tensor([float(result["loss"])], dtype=torch.float64)
        dist.all_reduce(share)  # every rank's share of the step's loss
        self.agg_train_loss = share.to(torch.float32)[0]
        self.timers("train_batch").stop()
        if self.global_steps % self.steps_per_print() == 0:
            elapsed = self.timers("train_batch").elapsed(reset=True) / 1000.0
            if self.global_rank == 0:
                iter_time = elapsed / self.steps_per_print()
                print(f"steps: {self.global_steps} loss: {float(self.agg_train_loss):0.4f} "
                      f"iter time (s): {iter_time:0.3f} samples/sec: {self.train_batch_size() / iter_time:0.3f}")
        return self.agg_train_loss

    def _arranged(self, data: Callable, sizes: Optional[Mapping[str, Sequence[int]]]) -> Callable:
        """The step's data as the executor reads it (positions of its fixed arrangement:
        replica r of a stage that starts the model holds the r-th block of the global batch,
        its k-th microbatch the k-th piece of that block), reordered by braid (DistTrain):
        position p holds sample ``braid_arrangement[p]``, each replica's microbatches from
        ``braid.torch.ReorderingBatchSampler``."""
        reordering = self._braid["section"].reorder
        if reordering == "none":
            self.braid_arrangement = None
            return data
        if not sizes:
            raise section_error(f"DeepSpeed config: \"braid.reorder\" is \"{reordering}\": give train_batch the "
                                "samples' sizes (sizes={\"image_resolution\": [...], \"text_tokens\": [...]})")
        executor = self.executor
        total = executor.global_batch
        start = min(executor.stages, key=lambda stage: stage.depth)
        colocated = executor.encoder_layers
        module = next(executor.modules[part.module].name for part in start.parts if part.module not in colocated)
        for name, values in sizes.items():
            if len(values) != total:
                raise PipelineError(f"braid.deepspeed: sizes[{name!r}] has {len(values)} samples, the global batch "
                                    f"{total}")

        def size_of(index: int) -> Dict[str, int]:
            return {name: int(values[index]) for name, values in sizes.items()}

        arrangement: List[int] = []
        counts = set()
        for replica in range(start.replicas):
            sampler = _bt.ReorderingBatchSampler(self.braid_plan, total, size_of, module, replica, total,
                                                 reordering=reordering)
            for microbatch in sampler.assignment(list(range(total))):
                arrangement.extend(microbatch)
                counts.add(len(microbatch))
        if sorted(arrangement) != list(range(total)) or len(counts) != 1:
            raise braid.InternalError(braid.InternalError.status,
                                      f"braid.deepspeed: braid's reordering of module '{module}' is not an "
                                      f"arrangement of equal microbatches (microbatch sizes {sorted(counts)})")
        self.braid_arrangement = arrangement
        return lambda positions: data([arrangement[p] for p in positions])

    def eval_batch(self, *args, **kwargs):
        raise PipelineError("braid.deepspeed: eval_batch is not supported yet; braid's programs are training steps")

    def save_checkpoint(self, *args, **kwargs):
        # DeepSpeed names a pipeline's checkpoint files by layer index within one
        # PipelineModule; a braid rank holds its part of several modules, so the files of
        # different modules would share names. Refused alike on every rank, before any collective.
        raise PipelineError("braid.deepspeed: save_checkpoint is not supported yet (DeepSpeed's files name layers "
                            "of one pipeline module; a braid rank holds parts of several): save each rank's "
                            "engine.module.state_dict() and engine.optimizer.state_dict() instead")

    def load_checkpoint(self, *args, **kwargs):
        raise PipelineError("braid.deepspeed: load_checkpoint is not supported yet (see save_checkpoint): load each "
                            "rank's engine.module.state_dict() and engine.optimizer.state_dict() instead")

    def set_dataiterator(self, iterator):
        """The iterator :meth:`train_batch` takes each step's global batch from."""
        self.training_dataloader = None
        self.data_iterator = iterator

    def _run_braid_instruction(self, instruction) -> None:
        """The executor's dispatch entry for every opcode: the braid instruction as a
        DeepSpeed PipeInstruction, through this engine's _INSTRUCTION_MAP (as
        PipelineEngine._exec_schedule runs DeepSpeed's own schedules)."""
        cmd = pipe_instruction(instruction)
        if type(cmd) not in self._INSTRUCTION_MAP:
            raise RuntimeError(f"{self.__class__.__name__} does not understand instruction {cmd!r}")
        self.braid_trace.append(cmd)
        self._exec_instr = MethodType(self._INSTRUCTION_MAP[type(cmd)], self)
        self._exec_instr(**cmd.kwargs)

    # ---- the _exec_* methods of braid's instructions -----------------------------------------

    def _exec_braid(self, instruction) -> None:
        """braid's semantics of ``instruction`` (the executor's handler)."""
        self._braid_ops[instruction.opcode](instruction)

    def _exec_braid_load_micro_batch(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_forward_pass(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_backward_pass(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_send_activations(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_recv_activations(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_send_grads(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_braid_recv_grads(self, buffer_id, instruction):
        self._exec_braid(instruction)

    def _exec_batch_sync(self, instruction):
        self._exec_braid(instruction)

    def _exec_encoder_task(self, instruction):
        self._exec_braid(instruction)

    def _exec_braid_reduce_grads(self, instruction):
        """braid's gradients sum over the DP group; DeepSpeed averages: scale by the DP
        width (and braid's gradient_scale) first, then DeepSpeed reduces its own way."""
        factor = float(self.grid.data_parallel_size) * float(getattr(self.executor.stage, "gradient_scale", 1.0))
        if factor != 1.0:
            with torch.no_grad():
                for p in self.module.parameters():
                    if p.grad is not None:
                        p.grad.mul_(factor)
        PipelineEngine._exec_reduce_grads(self)

    def _exec_braid_optimizer_step(self, instruction):
        PipelineEngine._exec_optimizer_step(self)

    _INSTRUCTION_MAP = {
        **PipelineEngine._INSTRUCTION_MAP,
        _schedule.LoadMicroBatch: _exec_braid_load_micro_batch,
        _schedule.ForwardPass: _exec_braid_forward_pass,
        _schedule.BackwardPass: _exec_braid_backward_pass,
        _schedule.SendActivation: _exec_braid_send_activations,
        _schedule.RecvActivation: _exec_braid_recv_activations,
        _schedule.SendGrad: _exec_braid_send_grads,
        _schedule.RecvGrad: _exec_braid_recv_grads,
        BatchSync: _exec_batch_sync,
        _schedule.ReduceGrads: _exec_braid_reduce_grads,
        _schedule.OptimizerStep: _exec_braid_optimizer_step,
        EncoderTask: _exec_encoder_task,
    }

    # ---- the whole model's gradient norm -----------------------------------------------------

    def clip_fp32_gradients(self):
        """``gradient_clipping`` over the whole model: after ReduceGrads every DP replica of a
        stage holds the same gradients, so each rank adds its squared norm divided by its DP
        width, and one all-reduce over the world gives the model's squared norm."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        square = torch.zeros(1, dtype=torch.float64)
        for p in params:
            square += p.grad.detach().double().pow(2).sum()
        square /= self.grid.data_parallel_size
        dist.all_reduce(square)
        norm = float(square.sqrt())
        clip = self.gradient_clipping()
        if norm > clip:
            with torch.no_grad():
                for p in params:
                    p.grad.mul_(clip / (norm + 1e-6))
        self._global_grad_norm = norm
        return norm


def _is_batch(data) -> bool:
    return isinstance(data, Mapping) or callable(data) and not hasattr(data, "__next__")


def _sampler(batch, global_batch: int) -> Callable[[List[int]], Mapping[str, torch.Tensor]]:
    """The executor's data callable (positions in the global batch -> tensors). A mapping
    holds the whole global batch on every rank: another length would train on part of it
    (longer) or fail on the ranks reading past its end (shorter), so it is refused alike
    everywhere, before any collective."""
    if isinstance(batch, Mapping):
        for key, value in batch.items():
            try:
                length = len(value)
            except TypeError:
                length = None
            if length != global_batch:
                held = "no batch dimension" if length is None else f"{length} samples"
                raise PipelineError(f"braid.deepspeed: train_batch(): '{key}' holds {held}; a step takes the whole "
                                    f"global batch, train_batch_size = {global_batch} samples, on every rank")
        return lambda indices: {k: v[indices] for k, v in batch.items()}
    if callable(batch):
        return batch
    raise PipelineError(f"braid.deepspeed: a global batch is a mapping of tensors or a callable, not {type(batch).__name__}")


# ---- building it -----------------------------------------------------------------------------


def _init_distributed(dist_init_required: Optional[bool]) -> None:
    from deepspeed.accelerator import get_accelerator

    backend = get_accelerator().communication_backend_name()
    if get_accelerator().device_name() == "cpu":
        # DeepSpeed 0.14.2+ builds (JIT-compiles) a shared-memory all-reduce op when its torch
        # backend starts on CPU; gloo needs none.
        _deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    _deepspeed.init_distributed(dist_backend=backend, dist_init_required=dist_init_required)
    if dist.get_backend() == "gloo":
        # DeepSpeed picks all_gather_into_tensor / reduce_scatter_tensor whenever torch has
        # them, but gloo implements neither in torch 1.13 ("no support for _allgather_base");
        # without them DeepSpeed falls back on list collectives (ZeRO-1's parameter all-gather).
        from deepspeed.comm import comm as _ds_comm

        _ds_comm.cdb.all_gather_function = None
        _ds_comm.cdb.reduce_scatter_function = None


def _program(plan, section: BraidSection):
    """The program the plan's devices run: the section's schedule, or the plan's own (a
    colocated plan's is braid's bubble scheduler's, with its encoder tasks)."""
    return plan.program(section.schedule_name)


def _dp_group(executor, groups, rank: int):
    """This rank's DP ranks and group: those of the modules its stage runs, which must agree."""
    names = {}
    for part in executor.stage.parts:
        name = groups.name_of(part.module, "dp", rank)
        names[executor.modules[part.module].name] = name
    ranks = {module: groups.ranks(name) for module, name in names.items()}
    if len(set(ranks.values())) != 1:
        raise braid.UnsupportedError(
            braid.UnsupportedError.status,
            f"braid.deepspeed: rank {rank} runs modules with different data-parallel groups ("
            + ", ".join(f"{m}: {list(r)}" for m, r in ranks.items())
            + "); DeepSpeed reduces one DP group per engine: plan them with equal DP widths")
    first = next(iter(names.values()))
    return list(ranks[next(iter(ranks))]), groups.groups[first]


def _self_group(executor, groups, rank: int):
    """A group of this rank alone (DeepSpeed's pipe/model/slice groups): a module's tp group
    of width 1 (the executor runs tp = 1 only)."""
    for part in executor.stage.parts:
        name = groups.name_of(part.module, "tp", rank)
        if tuple(groups.ranks(name)) == (rank,):
            return groups.groups[name]
    raise braid.UnsupportedError(braid.UnsupportedError.status,
                                 f"braid.deepspeed: rank {rank} is tensor-parallel; plan with tp = 1")


def _check_deepspeed_features(config: DeepSpeedConfig) -> None:
    refused = []
    if config.fp16_enabled or config.bfloat16_enabled or getattr(config, "amp_enabled", False):
        refused.append("fp16/bf16/amp (braid's executor runs its layers, messages and losses in float32 and "
                       "its own backward, without DeepSpeed's loss scaling)")
    if config.zero_optimization_stage > 1:
        refused.append(f"ZeRO stage {config.zero_optimization_stage} (pipeline engines run ZeRO 0 or 1)")
    if config.gradient_clipping > 0 and config.zero_optimization_stage > 0:
        refused.append("gradient_clipping with ZeRO (the ZeRO optimizer's norm would cover one stage only)")
    if config.pipeline.get("activation_checkpoint_interval", 0) > 0:
        refused.append("pipeline.activation_checkpoint_interval (braid's executor runs the layers)")
    if refused:
        raise section_error("DeepSpeed config: braid.deepspeed does not run " + "; ".join(refused))


def initialize(ds_config: Dict[str, Any], section: BraidSection, modules: Mapping[str, Any],
               loss_fn: Optional[Callable] = None, logit_scale: float = 1.0, optimizer=None, model_parameters=None,
               lr_scheduler=None, args=None, dist_init_required: Optional[bool] = None):
    """The engine of this rank (see :func:`braid.deepspeed.initialize`, which checks the
    section first).

    ``modules``: each module of the run's model file -> its layers, a sequence of
    ``nn.Module`` or a callable ``layer_index -> nn.Module`` (only this rank's are built),
    as many as the model file's ``layers``. A module's first layer is called
    ``layer(inputs, batch)`` (``inputs``: the upstream module's output, None where the
    model starts; ``batch``: the microbatch's tensors), the others ``layer(x)``.
    ``loss_fn(output, batch)``: per-sample losses of the model's last module (the step's
    loss is their mean over the global batch); a contrastive model's towers end in braid's
    batch-sync instead, with ``logit_scale``. ``optimizer``, ``model_parameters``,
    ``lr_scheduler``, ``args``: as ``deepspeed.initialize``'s (the optimizer may also come
    from the config). Every rank must call it, in the same order as its other collectives.

    Returns ``(engine, optimizer, None, lr_scheduler)``, as ``deepspeed.initialize``."""
    _init_distributed(dist_init_required)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = braid.Config.from_file(section.run)
    plan_yaml = None
    if section.plan:
        with open(section.plan, "r", encoding="utf-8") as f:
            plan_yaml = f.read()
    plan = config.plan(strategy=section.strategy, tp=section.tp, pp=section.pp, dp=section.dp, plan_yaml=plan_yaml)
    program = _program(plan, section)
    batch = run_batch(config, plan, section.run)
    keys = check_batch_keys(ds_config, batch)
    groups = _bt.Groups(plan.groups(world))
    executor = _bt.ProgramExecutor(program, groups, modules, loss_fn=loss_fn, global_batch=batch.global_batch,
                                   logit_scale=logit_scale, rank=rank)
    dp_ranks, dp_group = _dp_group(executor, groups, rank)
    grid = BraidGrid(rank, world, dp_ranks, dp_group, _self_group(executor, groups, rank))
    module = BraidPipelineModule(executor, grid, loss_fn)

    # DeepSpeed's batch keys for this rank: its module's microbatch, its stage's microbatch
    # count, its DP width; their product is the global batch on every rank.
    microbatches = len(executor.microbatches)
    width = grid.data_parallel_size
    if batch.global_batch % (microbatches * width):
        raise braid.InternalError(braid.InternalError.status,
                                  f"braid.deepspeed: stage '{executor.stage.name}' splits a global batch of "
                                  f"{batch.global_batch} into {microbatches} microbatches on {width} replicas")
    rank_config = dict(ds_config)
    rank_config.update({
        "train_batch_size": keys.get("train_batch_size", batch.global_batch),
        "train_micro_batch_size_per_gpu": batch.global_batch // (microbatches * width),
        "gradient_accumulation_steps": microbatches,
    })
    config_class = DeepSpeedConfig(rank_config, mpu=grid)
    _check_deepspeed_features(config_class)
    engine = BraidPipelineEngine(executor, plan, program, section, args=args, model=module, optimizer=optimizer,
                                 model_parameters=model_parameters, lr_scheduler=lr_scheduler, mpu=grid,
                                 dist_init_required=False, config=rank_config, config_class=config_class)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
