"""Pipeline programs (braid_program_*) and their simulation (braid_simulat*)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from . import _loader
from . import _structs as S
from ._handles import OwnedHandle, PathLike, SharedHandle, count, int_arg, path_arg, read, text_out
from .errors import invalid_argument
from .records import Instruction, RankProgram, SimulationResult, StageInfo, StagePart, StageResult

__all__ = ["Program", "Simulation"]


class Program(SharedHandle):
    """A pipeline program (braid_program): per stage, the ordered instructions its
    devices execute in one training step. Made by :meth:`Plan.program` and
    :meth:`BubbleScheduler.program`.

    The C program is self-contained; this object also keeps its :class:`~braid.Plan` (and
    so its :class:`~braid.Config`) alive. ``close()`` (or leaving a ``with`` block) frees
    it once no :class:`Simulation` of it is still open; simulations keep it alive."""

    _destroy = "braid_program_destroy"

    def __init__(self, handle: "S.ProgramPtr", plan: Any) -> None:
        self._lib = plan._lib
        self._handle = handle
        self._plan = plan
        self._init_shared()

    @property
    def plan(self) -> Any:
        return self._plan

    @property
    def schedule(self) -> str:
        """The schedule's name ("1f1b", "distmm-pipe", ...)."""
        return text_out(self._lib, self._lib.braid_program_schedule, self._ptr())

    def _live(self) -> "S.ProgramPtr":
        """The handle while it exists: closed, but kept for open simulations, still reads."""
        if not self._handle:
            raise invalid_argument("the braid Program is closed")
        return self._handle

    def _stage_count(self, handle: "Optional[S.ProgramPtr]" = None) -> int:
        return count(self._lib, self._lib.braid_program_stage_count, handle or self._ptr())

    def _stage(self, index: int, handle: "Optional[S.ProgramPtr]" = None) -> Any:
        lib, ptr = self._lib, handle or self._ptr()
        info = read(lib, lib.braid_program_stage, S.braid_stage_info, ptr, index)
        parts = ()
        if info.part_count:
            part = _loader.require(lib, "braid_program_stage_part")
            parts = tuple(StagePart.from_struct(read(lib, part, S.braid_stage_part, ptr, index, k))
                          for k in range(info.part_count))
        return StageInfo.from_struct(info, parts=parts)

    @property
    def stages(self) -> Tuple[Any, ...]:
        """Per stage, a :class:`~braid.records.StageInfo`: name, module (-1 for a global
        stage of several modules), replicas, devices_per_replica, first_device,
        device_stride, depth, instruction_count, prev and next (stage indices),
        gradient_scale, and parts (:class:`~braid.records.StagePart`: module,
        module_stage, first_layer, layer_count)."""
        return tuple(self._stage(s) for s in range(self._stage_count()))

    def instructions(self, stage: int) -> Tuple[Any, ...]:
        """The instructions of stage ``stage`` in order, as
        :class:`~braid.records.Instruction` records (opcode is a name of
        :func:`braid.vocab.opcodes`)."""
        lib, ptr = self._lib, self._ptr()
        stage = int_arg("stage", stage, 0, 2**63 - 1)
        info = read(lib, lib.braid_program_stage, S.braid_stage_info, ptr, stage)
        return tuple(Instruction.from_struct(read(lib, lib.braid_program_instruction, S.braid_instruction, ptr,
                                                  stage, i))
                     for i in range(info.instruction_count))

    @property
    def microbatches(self) -> int:
        """Microbatches each DP replica runs per step (braid_program_microbatches)."""
        fn = _loader.require(self._lib, "braid_program_microbatches")
        out = ctypes.c_int32()
        _loader._check(self._lib, fn(self._ptr(), ctypes.byref(out)))
        return out.value

    def rank(self, rank: int) -> Any:
        """What device rank ``rank`` runs (braid_program_rank): a
        :class:`~braid.records.RankProgram` with stage, replica, tp_rank and its
        instructions (those of its stage)."""
        lib, ptr = self._lib, self._ptr()
        fn = _loader.require(lib, "braid_program_rank")
        at = _loader.require(lib, "braid_program_rank_instruction")
        rank = int_arg("rank", rank)
        info = read(lib, fn, S.braid_program_rank_info, ptr, rank)
        instructions = tuple(Instruction.from_struct(read(lib, at, S.braid_instruction, ptr, rank, i))
                             for i in range(info.instruction_count))
        return RankProgram.from_struct(info, instructions=instructions)

    def simulate(self, trace: bool = False, trace_replicas: int = 1) -> "Simulation":
        """Simulates one step. ``trace``: keep the events, for :meth:`Simulation.write_trace`
        and :meth:`Simulation.gantt`; ``trace_replicas``: DP replicas per stage to record
        (-1: all). A program that deadlocks raises :class:`~braid.InvalidArgumentError`
        naming the stuck instruction of every blocked stage."""
        options = S.new(S.braid_simulation_options)
        options.version = S.SIMULATION_OPTIONS_VERSION
        options.record_trace = 1 if trace else 0
        options.trace_replicas = int_arg("trace_replicas", trace_replicas)
        lib = self._lib
        self._retain()
        out = S.SimulationPtr()
        try:
            _loader._check(lib, lib.braid_simulate(self._ptr(), ctypes.byref(options), ctypes.byref(out)))
        except BaseException:
            self._release()
            raise
        return Simulation(out, self)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Program (closed)>"
        return f"<braid.Program {self.schedule}, {self._stage_count()} stages>"


class Simulation(OwnedHandle):
    """A simulated step (braid_simulation) of a :class:`Program`, which it keeps alive.
    Made by :meth:`Program.simulate`. ``close()`` (or leaving a ``with`` block) frees it."""

    _destroy = "braid_simulation_destroy"

    def __init__(self, handle: "S.SimulationPtr", program: Program) -> None:
        self._lib = program._lib
        self._handle = handle
        self._program = self._owner = program  # the C simulation points into the program: keep it alive

    @property
    def program(self) -> Program:
        return self._program

    @property
    def result(self) -> Any:
        """A :class:`~braid.records.SimulationResult`: step_time_s, bubble_fraction (idle
        share of device time), bubbles_s (idle seconds per device by cause; see
        :func:`braid.vocab.by_cause`), peak_memory_gib, mfu, devices, ranks (simulated
        stage replicas) and events (instructions executed)."""
        lib = self._lib
        return SimulationResult.from_struct(read(lib, lib.braid_simulation_result_get, S.braid_simulation_result,
                                                 self._ptr()))

    @property
    def stages(self) -> Tuple[Any, ...]:
        """Per stage of the program (in :attr:`Program.stages` order), a
        :class:`~braid.records.StageResult`: busy_s and idle_s (per device, mean over the
        stage's replicas), bubbles_s (idle seconds by cause), peak_memory_gib, finish_s."""
        lib, ptr = self._lib, self._ptr()
        program = self._program
        stages = program._stage_count(program._live())  # closed, it lives while this simulation does
        return tuple(StageResult.from_struct(read(lib, lib.braid_simulation_stage, S.braid_stage_result, ptr, s))
                     for s in range(stages))

    def write_trace(self, path: PathLike) -> None:
        """Writes the Chrome trace (open it in ui.perfetto.dev or chrome://tracing) to
        ``path``, atomically. Needs ``simulate(trace=True)``."""
        _loader._check(self._lib, self._lib.braid_simulation_write_trace(self._ptr(), path_arg(path)))

    def gantt(self, width: int = 0) -> str:
        """A text Gantt chart of each stage's first replica, ``width`` columns (0:
        automatic). Needs ``simulate(trace=True)``."""
        return text_out(self._lib, self._lib.braid_simulation_gantt, self._ptr(), int_arg("width", width))

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Simulation (closed)>"
        return f"<braid.Simulation step {self.result.step_time_s:.3f} s>"
