"""Python binding of braid's C ABI (``capi/include/braid/braid.h``) through ctypes.

A thin shim: every call goes to ``libbraid.so``; no planning happens in Python.

    import braid
    with braid.Config.from_file("configs/runs/clip-vit-l14-64gpu.yaml") as config:
        with braid.plan(config, strategy="auto") as p:
            print(p.strategy, p.estimate["iteration_time_s"])
            with p.program() as program, program.simulate(trace=True) as sim:
                print(program.schedule, sim.result["step_time_s"])
                print(sim.gantt())
            # A data loader: where each sample of a global batch goes (DistTrain reordering).
            batch = p.reorder(text_tokens=[...], image_resolution=[...])
            print(batch["ranks"]["llm"], batch["microbatches"])
        # A colocated plan: encoder work scheduled into the llm's bubbles (Optimus).
        with braid.plan(config, strategy="optimus") as p, p.bubble_scheduler() as s:
            print(s.run()["fine_step_s"])
            with s.program("optimus-fine") as program:
                print(program.stages[0]["instructions"][:4])

The library is looked up, once per process, in this order:

1. ``libbraid.so`` in the directory of this package;
2. the path in the environment variable ``BRAID_LIBRARY``;
3. the system loader (``ctypes.util.find_library("braid")``, then ``libbraid.so``).

The first candidate that exists is used; a library whose ``braid_abi_version()``
is not :data:`ABI_VERSION` is refused with an :class:`AbiMismatchError`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import json
import operator
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

__all__ = [
    "ABI_VERSION",
    "STRATEGIES",
    "SCHEDULES",
    "OPCODES",
    "BUBBLE_CAUSES",
    "REORDERINGS",
    "BraidError",
    "InvalidArgumentError",
    "BadConfigError",
    "InfeasibleError",
    "BraidIOError",
    "UnsupportedError",
    "InternalError",
    "OutOfHostMemoryError",
    "PluginError",
    "LibraryNotFoundError",
    "AbiMismatchError",
    "Config",
    "Plan",
    "Program",
    "Simulation",
    "BubbleScheduler",
    "BUBBLE_SCHEDULES",
    "plan",
    "version",
    "abi_version",
    "status_string",
    "load_library",
]

#: The BRAID_ABI_VERSION of the braid.h this binding mirrors.
ABI_VERSION = 1

#: The braid_strategy names; the index is the C enum value.
STRATEGIES = ("auto", "megatron", "distmm", "disttrain", "optimus", "fixed")

#: The schedules a program can run (braid_program_create); which ones a plan can run
#: depends on its layout.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "batch-sync", "distmm-pipe", "two-phase")

#: The braid_opcode names (without BRAID_OP_); the index is the C enum value.
OPCODES = ("LOAD_MICROBATCH", "FORWARD", "BACKWARD", "SEND_ACTIVATION", "RECV_ACTIVATION", "SEND_GRAD",
           "RECV_GRAD", "BATCH_SYNC", "REDUCE_GRADS", "OPTIMIZER_STEP", "ENCODER_TASK")

#: The braid_bubble_cause names: why devices were idle; the index is the C enum value.
BUBBLE_CAUSES = ("dp_start", "dp_end", "dp_shard", "pp_warmup", "pp_cooldown", "pp_other", "tp", "batch_sync",
                 "imbalance")

#: The braid_reordering names; the index is the C enum value.
REORDERINGS = ("none", "intra", "intra_inter")

#: The programs of the bubble scheduler (braid_bubble_scheduler_program), the first
#: being the default.
BUBBLE_SCHEDULES = ("optimus-fine", "optimus-coarse", "encoder-first")

# braid_instruction.flags bits.
FLAG_NO_STORE = 1
FLAG_RECOMPUTE = 2
FLAG_BACKWARD_TASK = 4

_PLAN_OPTIONS_VERSION = 1  # BRAID_PLAN_OPTIONS_VERSION
_SIMULATION_OPTIONS_VERSION = 1  # BRAID_SIMULATION_OPTIONS_VERSION
_REORDER_OPTIONS_VERSION = 1  # BRAID_REORDER_OPTIONS_VERSION

# braid_status values.
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_BAD_CONFIG = 2
ERR_INFEASIBLE = 3
ERR_IO = 4
ERR_UNSUPPORTED = 5
ERR_INTERNAL = 6
ERR_OUT_OF_MEMORY = 7
ERR_PLUGIN = 8

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# ---- errors ---------------------------------------------------------------------------


class BraidError(Exception):
    """A failed braid call. ``status`` is the braid_status (see the ERR_* constants),
    ``message`` the whole message of braid_last_error(); ``str(error)`` is the message.

    ``BraidError(status, message)`` builds the subclass that matches ``status``
    (``BraidError(3, "...")`` is an :class:`InfeasibleError`)."""

    status: int = ERR_INTERNAL

    def __new__(cls, status: int = ERR_INTERNAL, message: str = "", *args: Any, **kwargs: Any):
        if cls is BraidError:
            cls = _ERROR_CLASSES.get(status, BraidError)
        return super().__new__(cls)

    def __init__(self, status: int = ERR_INTERNAL, message: str = "") -> None:
        super().__init__(status, message)
        self.status = int(status)
        self.message = message

    @property
    def status_name(self) -> str:
        """The library's short description of the status ("bad configuration")."""
        return _STATUS_NAMES.get(self.status, "unknown status")

    def __str__(self) -> str:
        return self.message or self.status_name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status!r}, {self.message!r})"

    def __reduce__(self):  # pickles as BraidError(status, message)
        return (BraidError, (self.status, self.message))


class InvalidArgumentError(BraidError):
    """BRAID_ERR_INVALID_ARGUMENT (1): a bad argument or option."""

    status = ERR_INVALID_ARGUMENT


class BadConfigError(BraidError):
    """BRAID_ERR_BAD_CONFIG (2): the YAML or plan given is malformed or inconsistent."""

    status = ERR_BAD_CONFIG


class InfeasibleError(BraidError):
    """BRAID_ERR_INFEASIBLE (3): valid input, but nothing fits (the message says what would)."""

    status = ERR_INFEASIBLE


class BraidIOError(BraidError):
    """BRAID_ERR_IO (4): a file could not be read."""

    status = ERR_IO


class UnsupportedError(BraidError):
    """BRAID_ERR_UNSUPPORTED (5): a valid request this build or strategy does not handle."""

    status = ERR_UNSUPPORTED


class InternalError(BraidError):
    """BRAID_ERR_INTERNAL (6): a bug in braid."""

    status = ERR_INTERNAL


class OutOfHostMemoryError(BraidError):
    """BRAID_ERR_OUT_OF_MEMORY (7): host allocation failed."""

    status = ERR_OUT_OF_MEMORY


class PluginError(BraidError):
    """BRAID_ERR_PLUGIN (8): a plugin could not be loaded or is incompatible."""

    status = ERR_PLUGIN


class LibraryNotFoundError(BraidIOError):
    """libbraid.so could not be found or loaded (status BRAID_ERR_IO)."""


class AbiMismatchError(UnsupportedError):
    """The loaded libbraid.so implements another ABI version (status BRAID_ERR_UNSUPPORTED)."""


_ERROR_CLASSES = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_BAD_CONFIG: BadConfigError,
    ERR_INFEASIBLE: InfeasibleError,
    ERR_IO: BraidIOError,
    ERR_UNSUPPORTED: UnsupportedError,
    ERR_INTERNAL: InternalError,
    ERR_OUT_OF_MEMORY: OutOfHostMemoryError,
    ERR_PLUGIN: PluginError,
}

# The library's braid_status_string() texts, for errors raised before it is loaded.
_STATUS_NAMES = {
    OK: "ok",
    ERR_INVALID_ARGUMENT: "invalid argument",
    ERR_BAD_CONFIG: "bad configuration",
    ERR_INFEASIBLE: "infeasible",
    ERR_IO: "i/o error",
    ERR_UNSUPPORTED: "unsupported",
    ERR_INTERNAL: "internal error",
    ERR_OUT_OF_MEMORY: "out of memory",
    ERR_PLUGIN: "plugin error",
}

# ---- C types ----------------------------------------------------------------------------


class _ConfigStruct(ctypes.Structure):
    """Opaque braid_config."""


class _PlanStruct(ctypes.Structure):
    """Opaque braid_plan."""


class _ProgramStruct(ctypes.Structure):
    """Opaque braid_program."""


class _SimulationStruct(ctypes.Structure):
    """Opaque braid_simulation."""


class _ReorderStruct(ctypes.Structure):
    """Opaque braid_reorder."""


class _BubbleSchedulerStruct(ctypes.Structure):
    """Opaque braid_bubble_scheduler."""


_ConfigPtr = ctypes.POINTER(_ConfigStruct)
_PlanPtr = ctypes.POINTER(_PlanStruct)
_ProgramPtr = ctypes.POINTER(_ProgramStruct)
_SimulationPtr = ctypes.POINTER(_SimulationStruct)
_ReorderPtr = ctypes.POINTER(_ReorderStruct)
_BubbleSchedulerPtr = ctypes.POINTER(_BubbleSchedulerStruct)
_status_t = ctypes.c_int  # braid_status (a C enum)
_strategy_t = ctypes.c_int  # braid_strategy (a C enum)
_opcode_t = ctypes.c_int  # braid_opcode (a C enum)
_BUBBLE_COUNT = len(BUBBLE_CAUSES)  # BRAID_BUBBLE_COUNT


class braid_plan_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("strategy", _strategy_t),
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("dp", ctypes.c_int32),
        ("plan_yaml", ctypes.c_char_p),
    ]


class braid_module_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("role", ctypes.c_char_p),
        ("devices", ctypes.c_int32),
        ("tp", ctypes.c_int32),
        ("pp", ctypes.c_int32),
        ("dp", ctypes.c_int32),
        ("first_device", ctypes.c_int32),
        ("first_stage", ctypes.c_int32),
        ("microbatch_size", ctypes.c_int32),
        ("stage_count", ctypes.c_int32),
        ("layers_per_stage", ctypes.POINTER(ctypes.c_int32)),
    ]


class braid_estimate(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("iteration_time_s", ctypes.c_double),
        ("samples_per_s", ctypes.c_double),
        ("tflops_per_device", ctypes.c_double),
        ("mfu", ctypes.c_double),
        ("peak_memory_gib", ctypes.c_double),
        ("bubble_fraction", ctypes.c_double),
        ("devices", ctypes.c_int32),
    ]


class braid_alternative(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("strategy", _strategy_t),
        ("feasible", ctypes.c_int32),
        ("iteration_time_s", ctypes.c_double),
        ("reason", ctypes.c_char_p),
    ]


class braid_stage_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("module", ctypes.c_int32),
        ("replicas", ctypes.c_int32),
        ("devices_per_replica", ctypes.c_int32),
        ("first_device", ctypes.c_int32),
        ("device_stride", ctypes.c_int32),
        ("depth", ctypes.c_int32),
        ("instruction_count", ctypes.c_size_t),
        ("prev_count", ctypes.c_size_t),
        ("prev", ctypes.POINTER(ctypes.c_int32)),
        ("next_count", ctypes.c_size_t),
        ("next", ctypes.POINTER(ctypes.c_int32)),
    ]


class braid_instruction(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("opcode", _opcode_t),
        ("microbatch", ctypes.c_int32),
        ("chunk", ctypes.c_int32),
        ("peer", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("unit", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    ]


class braid_simulation_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("record_trace", ctypes.c_int32),
        ("trace_replicas", ctypes.c_int32),
    ]


class braid_simulation_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("step_time_s", ctypes.c_double),
        ("bubble_fraction", ctypes.c_double),
        ("bubbles_s", ctypes.c_double * _BUBBLE_COUNT),
        ("peak_memory_gib", ctypes.c_double),
        ("mfu", ctypes.c_double),
        ("devices", ctypes.c_int32),
        ("ranks", ctypes.c_int32),
        ("events", ctypes.c_int64),
    ]


class braid_sample_batch(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("samples", ctypes.c_size_t),
        ("image_resolution", ctypes.POINTER(ctypes.c_int32)),
        ("text_tokens", ctypes.POINTER(ctypes.c_int32)),
        ("audio_tokens", ctypes.POINTER(ctypes.c_int32)),
        ("generated_image_resolution", ctypes.POINTER(ctypes.c_int32)),
        ("module_costs", ctypes.POINTER(ctypes.c_double)),
    ]


class braid_reorder_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("reordering", ctypes.c_int),
        ("max_evaluations", ctypes.c_int64),
    ]


class braid_reorder_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("samples", ctypes.c_size_t),
        ("cells", ctypes.c_int32),
        ("pipeline_groups", ctypes.c_int32),
        ("microbatches", ctypes.c_int32),
        ("cell_microbatch", ctypes.c_int32),
        ("straggler_before", ctypes.c_double),
        ("straggler_after", ctypes.c_double),
        ("evaluations", ctypes.c_int64),
    ]


class braid_stage_result(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("busy_s", ctypes.c_double),
        ("idle_s", ctypes.c_double),
        ("bubbles_s", ctypes.c_double * _BUBBLE_COUNT),
        ("peak_memory_gib", ctypes.c_double),
        ("finish_s", ctypes.c_double),
    ]


class braid_bubble_report(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("plain_step_s", ctypes.c_double),
        ("coarse_step_s", ctypes.c_double),
        ("fine_step_s", ctypes.c_double),
        ("recovered_coarse", ctypes.c_double),
        ("recovered_fine", ctypes.c_double),
        ("bubbles_before_s", ctypes.c_double * _BUBBLE_COUNT),
        ("bubbles_after_s", ctypes.c_double * _BUBBLE_COUNT),
        ("scheduler_time_s", ctypes.c_double),
        ("placements", ctypes.c_int32),
        ("encoder_tasks", ctypes.c_int64),
        ("tp_bubble_tasks", ctypes.c_int64),
    ]


_P = ctypes.POINTER
# name: (restype, argtypes), one entry per function of braid.h.
_SIGNATURES = {
    "braid_abi_version": (ctypes.c_uint32, []),
    "braid_version_string": (ctypes.c_char_p, []),
    "braid_status_string": (ctypes.c_char_p, [_status_t]),
    "braid_last_error": (ctypes.c_char_p, []),
    "braid_config_load_file": (_status_t, [ctypes.c_char_p, _P(_ConfigPtr)]),
    "braid_config_load_string": (_status_t, [ctypes.c_char_p, ctypes.c_char_p, _P(_ConfigPtr)]),
    "braid_config_destroy": (_status_t, [_ConfigPtr]),
    "braid_config_devices": (_status_t, [_ConfigPtr, _P(ctypes.c_int32)]),
    "braid_plan_create": (_status_t, [_ConfigPtr, _P(braid_plan_options), _P(_PlanPtr)]),
    "braid_plan_destroy": (_status_t, [_PlanPtr]),
    "braid_plan_strategy": (_status_t, [_PlanPtr, _P(_strategy_t)]),
    "braid_plan_module_count": (_status_t, [_PlanPtr, _P(ctypes.c_size_t)]),
    "braid_plan_module": (_status_t, [_PlanPtr, ctypes.c_size_t, _P(braid_module_info)]),
    "braid_plan_estimate": (_status_t, [_PlanPtr, _P(braid_estimate)]),
    "braid_plan_to_json": (_status_t, [_PlanPtr, _P(ctypes.c_char_p)]),
    "braid_plan_to_yaml": (_status_t, [_PlanPtr, _P(ctypes.c_char_p)]),
    "braid_plan_alternative_count": (_status_t, [_PlanPtr, _P(ctypes.c_size_t)]),
    "braid_plan_alternative": (_status_t, [_PlanPtr, ctypes.c_size_t, _P(braid_alternative)]),
    "braid_program_create": (_status_t, [_PlanPtr, ctypes.c_char_p, _P(_ProgramPtr)]),
    "braid_program_destroy": (_status_t, [_ProgramPtr]),
    "braid_program_schedule": (_status_t, [_ProgramPtr, _P(ctypes.c_char_p)]),
    "braid_program_stage_count": (_status_t, [_ProgramPtr, _P(ctypes.c_size_t)]),
    "braid_program_stage": (_status_t, [_ProgramPtr, ctypes.c_size_t, _P(braid_stage_info)]),
    "braid_program_instruction": (_status_t, [_ProgramPtr, ctypes.c_size_t, ctypes.c_size_t, _P(braid_instruction)]),
    "braid_simulate": (_status_t, [_ProgramPtr, _P(braid_simulation_options), _P(_SimulationPtr)]),
    "braid_simulation_destroy": (_status_t, [_SimulationPtr]),
    "braid_simulation_result_get": (_status_t, [_SimulationPtr, _P(braid_simulation_result)]),
    "braid_simulation_stage": (_status_t, [_SimulationPtr, ctypes.c_size_t, _P(braid_stage_result)]),
    "braid_simulation_write_trace": (_status_t, [_SimulationPtr, ctypes.c_char_p]),
    "braid_simulation_gantt": (_status_t, [_SimulationPtr, ctypes.c_int32, _P(ctypes.c_char_p)]),
    "braid_reorder_create": (_status_t, [_PlanPtr, _P(braid_sample_batch), _P(braid_reorder_options), _P(_ReorderPtr)]),
    "braid_reorder_destroy": (_status_t, [_ReorderPtr]),
    "braid_reorder_info_get": (_status_t, [_ReorderPtr, _P(braid_reorder_info)]),
    "braid_reorder_ranks": (_status_t, [_ReorderPtr, ctypes.c_size_t, _P(ctypes.c_int32), ctypes.c_size_t]),
    "braid_reorder_cells": (_status_t, [_ReorderPtr, _P(ctypes.c_int32), ctypes.c_size_t]),
    "braid_reorder_microbatches": (_status_t, [_ReorderPtr, _P(ctypes.c_int32), ctypes.c_size_t]),
    "braid_reorder_order": (_status_t, [_ReorderPtr, ctypes.c_size_t, _P(ctypes.c_int32), ctypes.c_size_t]),
    "braid_bubble_scheduler_create": (_status_t, [_PlanPtr, _P(_BubbleSchedulerPtr)]),
    "braid_bubble_scheduler_destroy": (_status_t, [_BubbleSchedulerPtr]),
    "braid_bubble_scheduler_run": (_status_t, [_BubbleSchedulerPtr]),
    "braid_bubble_scheduler_report": (_status_t, [_BubbleSchedulerPtr, _P(braid_bubble_report)]),
    "braid_bubble_scheduler_program": (_status_t, [_BubbleSchedulerPtr, ctypes.c_char_p, _P(_ProgramPtr)]),
}

# ---- loading the library ------------------------------------------------------------------

_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def _check_abi(found: int, expected: Optional[int] = None, path: str = "libbraid.so") -> None:
    """Raises AbiMismatchError unless ``found`` (a library's braid_abi_version()) is
    ``expected`` (default: :data:`ABI_VERSION`)."""
    if expected is None:
        expected = ABI_VERSION
    if found != expected:
        raise AbiMismatchError(
            ERR_UNSUPPORTED,
            f"{path} implements braid ABI version {found}, but this binding was written for ABI "
            f"version {expected}; use a libbraid.so of the same braid release (set BRAID_LIBRARY)",
        )


def _candidates():
    """(how it was found, what to pass to CDLL, whether to stop here if it fails)."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libbraid.so")
    if os.path.exists(here):
        yield "next to the package", here, True
    env = os.environ.get("BRAID_LIBRARY")
    if env:
        yield "BRAID_LIBRARY", env, True
    found = ctypes.util.find_library("braid")
    if found:
        yield "the system loader", found, False
    yield "the system loader", "libbraid.so", False


def _open(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    try:
        abi = lib.braid_abi_version
    except AttributeError:
        raise AbiMismatchError(ERR_UNSUPPORTED, f"{path} does not export braid_abi_version; is it libbraid.so?") from None
    abi.restype, abi.argtypes = ctypes.c_uint32, []
    _check_abi(int(abi()), path=path)
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise AbiMismatchError(
                ERR_UNSUPPORTED, f"{path} does not export {name}, which braid ABI version {ABI_VERSION} has"
            ) from None
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def load_library() -> ctypes.CDLL:
    """The loaded libbraid.so (found and checked on the first call, then cached)."""
    global _lib
    lib = _lib
    if lib is not None:
        return lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for how, path, definitive in _candidates():
            try:
                lib = _open(path)
            except OSError as e:
                if definitive:
                    raise LibraryNotFoundError(ERR_IO, f"cannot load libbraid.so from {path} (found via {how}): {e}") from e
                tried.append(f"{path} ({how}): {e}")
                continue
            _lib = lib
            return lib
        raise LibraryNotFoundError(
            ERR_IO,
            "cannot find libbraid.so; build braid and set BRAID_LIBRARY to build/capi/libbraid.so "
            "(tried: " + "; ".join(tried) + ")",
        )


def _reset_library() -> None:
    """Forgets the cached library, so that the next call looks it up again (for tests)."""
    global _lib
    with _lib_lock:
        _lib = None


def _text(value: Optional[bytes]) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != OK:
        message = _text(lib.braid_last_error())
        raise BraidError(int(status), message)


def _path_arg(path: PathLike) -> bytes:
    return os.fsencode(path)


def version() -> str:
    """The library's version string ("0.1.0")."""
    return _text(load_library().braid_version_string())


def abi_version() -> int:
    """The ABI version of the loaded library (equal to :data:`ABI_VERSION`)."""
    return int(load_library().braid_abi_version())


def status_string(status: int) -> str:
    """The library's short description of a braid_status."""
    return _text(load_library().braid_status_string(int(status)))


# ---- handles ------------------------------------------------------------------------------


class _Handle:
    """A C handle freed deterministically: ``close()``, leaving a ``with`` block, or
    garbage collection, whichever comes first."""

    def __enter__(self):
        self._ptr()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _SharedHandle(_Handle):
    """A handle others point into (a Config for its plans, a Program for its
    simulations): ``close()`` frees it once the last of them is closed."""

    def _init_shared(self) -> None:
        self._closed = False
        self._dependents = 0
        self._lock = threading.Lock()

    def _ptr(self):
        if self._closed or not self._handle:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"the braid {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._closed

    def _retain(self) -> None:
        with self._lock:
            self._ptr()
            self._dependents += 1

    def _release(self) -> None:
        with self._lock:
            self._dependents -= 1
            self._destroy_if_unused()

    def _destroy_if_unused(self) -> None:
        if self._closed and self._dependents == 0 and self._handle:
            handle, self._handle = self._handle, type(self._handle)()
            self._free(handle)

    def close(self) -> None:
        """Frees the handle now, or when the last object made from it is closed."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ did not finish
            return
        with lock:
            self._closed = True
            self._destroy_if_unused()


class _OwnedHandle(_Handle):
    """A handle that points into its owner (a Plan into its Config, a Simulation into
    its Program) and keeps it alive until closed."""

    def _ptr(self):
        if not self._handle:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"the braid {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return not self._handle

    def close(self) -> None:
        """Frees the handle (idempotent)."""
        handle = getattr(self, "_handle", None)
        if not handle:
            return
        self._handle = type(handle)()
        self._free(handle)
        self._owner._release()


class Config(_SharedHandle):
    """A loaded and validated run (braid_config). Use :meth:`from_file` or :meth:`from_string`.

    ``close()`` (or leaving a ``with`` block) frees it once no :class:`Plan` made from it
    is still open; plans keep their config alive."""

    def __init__(self, handle: "_ConfigPtr", lib: ctypes.CDLL, source: str) -> None:
        self._lib = lib
        self._handle = handle
        self._source = source
        self._init_shared()

    def _free(self, handle: "_ConfigPtr") -> None:
        self._lib.braid_config_destroy(handle)

    @classmethod
    def from_file(cls, path: PathLike) -> "Config":
        """Loads a run file; its model:/cluster: paths are relative to the file."""
        lib = load_library()
        out = _ConfigPtr()
        _check(lib, lib.braid_config_load_file(_path_arg(path), ctypes.byref(out)))
        return cls(out, lib, os.fsdecode(path))

    @classmethod
    def from_string(cls, yaml: str, base_dir: Optional[PathLike] = None) -> "Config":
        """Loads a run from YAML text; relative model:/cluster: paths resolve against
        ``base_dir`` (default: the current directory). Errors name the text "<string>"."""
        if not isinstance(yaml, (str, bytes)):
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"yaml must be str, not {type(yaml).__name__}")
        lib = load_library()
        text = yaml.encode("utf-8") if isinstance(yaml, str) else yaml
        base = None if base_dir is None else _path_arg(base_dir)
        out = _ConfigPtr()
        _check(lib, lib.braid_config_load_string(text, base, ctypes.byref(out)))
        return cls(out, lib, "<string>")


    @property
    def devices(self) -> int:
        """Devices of the run's cluster (nodes x devices per node)."""
        out = ctypes.c_int32()
        _check(self._lib, self._lib.braid_config_devices(self._ptr(), ctypes.byref(out)))
        return out.value

    def plan(self, strategy: Union[str, int] = "auto", tp: int = 0, pp: int = 0, dp: int = 0,
             plan_yaml: Optional[str] = None) -> "Plan":
        """Same as :func:`plan` (config, ...)."""
        return plan(self, strategy=strategy, tp=tp, pp=pp, dp=dp, plan_yaml=plan_yaml)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<braid.Config {self._source!r} ({state})>"


def _strategy_value(strategy: Union[str, int]) -> int:
    if isinstance(strategy, str):
        name = strategy.strip().lower()
        if name in STRATEGIES:
            return STRATEGIES.index(name)
        guess = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f" (did you mean '{guess[0]}'?)" if guess else ""
        raise InvalidArgumentError(
            ERR_INVALID_ARGUMENT, f"unknown strategy '{strategy}'{hint}; choose one of {', '.join(STRATEGIES)}"
        )
    try:
        value = operator.index(strategy)
    except TypeError:
        raise InvalidArgumentError(
            ERR_INVALID_ARGUMENT, f"strategy must be a name ({', '.join(STRATEGIES)}), not {type(strategy).__name__}"
        ) from None
    if not 0 <= value < len(STRATEGIES):
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"strategy {value} is not a braid_strategy")
    return value


def _int_arg(name: str, value: int) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"{name} must be an int, not {type(value).__name__}") from None
    if not -(2**31) <= value < 2**31:
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"{name} {value} does not fit an int32")
    return value


class Plan(_OwnedHandle):
    """A plan (braid_plan): per-module placement and the cost model's estimate.

    Made by :func:`plan`. Keeps its :class:`Config` alive. ``close()`` (or leaving a
    ``with`` block) frees it; reading a closed plan raises :class:`InvalidArgumentError`."""

    def __init__(self, handle: "_PlanPtr", config: Config) -> None:
        self._lib = config._lib
        self._handle = handle
        self._config = self._owner = config  # the C plan points into the config: keep it alive

    def _free(self, handle: "_PlanPtr") -> None:
        self._lib.braid_plan_destroy(handle)

    @property
    def config(self) -> Config:
        return self._config

    @property
    def strategy(self) -> str:
        """The strategy that produced the plan (for auto: the winner)."""
        out = _strategy_t()
        _check(self._lib, self._lib.braid_plan_strategy(self._ptr(), ctypes.byref(out)))
        return STRATEGIES[out.value] if 0 <= out.value < len(STRATEGIES) else str(out.value)

    @property
    def modules(self) -> List[Dict[str, Any]]:
        """Per module: name, role, devices, tp, pp, dp, first_device, first_stage,
        microbatch_size, layers_per_stage (a list of pp ints)."""
        lib, ptr = self._lib, self._ptr()
        count = ctypes.c_size_t()
        _check(lib, lib.braid_plan_module_count(ptr, ctypes.byref(count)))
        modules = []
        for i in range(count.value):
            info = braid_module_info()
            info.struct_size = ctypes.sizeof(braid_module_info)
            _check(lib, lib.braid_plan_module(ptr, i, ctypes.byref(info)))
            layers = [int(info.layers_per_stage[s]) for s in range(info.stage_count)] if info.layers_per_stage else []
            modules.append({
                "name": _text(info.name),
                "role": _text(info.role),
                "devices": info.devices,
                "tp": info.tp,
                "pp": info.pp,
                "dp": info.dp,
                "first_device": info.first_device,
                "first_stage": info.first_stage,
                "microbatch_size": info.microbatch_size,
                "layers_per_stage": layers,
            })
        return modules

    @property
    def estimate(self) -> Dict[str, Any]:
        """iteration_time_s, samples_per_s, tflops_per_device, mfu, peak_memory_gib,
        bubble_fraction and devices (the devices the plan uses)."""
        est = braid_estimate()
        est.struct_size = ctypes.sizeof(braid_estimate)
        _check(self._lib, self._lib.braid_plan_estimate(self._ptr(), ctypes.byref(est)))
        return {name: getattr(est, name) for name, _ in braid_estimate._fields_ if name != "struct_size"}

    @property
    def alternatives(self) -> List[Dict[str, Any]]:
        """With strategy auto: every strategy tried, ranked (the first is the winner).
        Each: strategy, feasible (bool), iteration_time_s (None when not feasible), reason."""
        lib, ptr = self._lib, self._ptr()
        count = ctypes.c_size_t()
        _check(lib, lib.braid_plan_alternative_count(ptr, ctypes.byref(count)))
        alternatives = []
        for i in range(count.value):
            alt = braid_alternative()
            alt.struct_size = ctypes.sizeof(braid_alternative)
            _check(lib, lib.braid_plan_alternative(ptr, i, ctypes.byref(alt)))
            feasible = bool(alt.feasible)
            alternatives.append({
                "strategy": STRATEGIES[alt.strategy] if 0 <= alt.strategy < len(STRATEGIES) else str(alt.strategy),
                "feasible": feasible,
                "iteration_time_s": alt.iteration_time_s if feasible else None,
                "reason": _text(alt.reason),
            })
        return alternatives

    def to_json(self) -> Dict[str, Any]:
        """The plan as `braid plan --format json` prints it, parsed."""
        text = ctypes.c_char_p()
        _check(self._lib, self._lib.braid_plan_to_json(self._ptr(), ctypes.byref(text)))
        return json.loads(_text(text.value))

    def to_yaml(self) -> str:
        """The plan as `braid plan --format yaml` prints it; plan(config, "fixed",
        plan_yaml=...) evaluates it again."""
        text = ctypes.c_char_p()
        _check(self._lib, self._lib.braid_plan_to_yaml(self._ptr(), ctypes.byref(text)))
        return _text(text.value)

    def program(self, schedule: Optional[str] = None) -> "Program":
        """The pipeline program this plan's devices run in one step, with ``schedule``
        (one of :data:`SCHEDULES`; None or "": the plan's own). Raises
        :class:`UnsupportedError` when the plan's layout cannot run that schedule."""
        if schedule is not None and not isinstance(schedule, (str, bytes)):
            raise InvalidArgumentError(
                ERR_INVALID_ARGUMENT, f"schedule must be a name ({', '.join(SCHEDULES)}), not {type(schedule).__name__}"
            )
        name = None if schedule is None else (schedule.encode("utf-8") if isinstance(schedule, str) else schedule)
        out = _ProgramPtr()
        _check(self._lib, self._lib.braid_program_create(self._ptr(), name, ctypes.byref(out)))
        return Program(out, self)

    def bubble_scheduler(self) -> "BubbleScheduler":
        """The Optimus bubble scheduler of this plan, which must be colocated (strategy
        optimus, or an auto plan that optimus won); call :meth:`BubbleScheduler.run`.
        Raises :class:`UnsupportedError` for any other plan."""
        ptr = self._ptr()
        config = self._config
        with config._lock:  # the C scheduler uses the config's cost model: keep it alive, even once closed
            config._dependents += 1
        out = _BubbleSchedulerPtr()
        try:
            _check(self._lib, self._lib.braid_bubble_scheduler_create(ptr, ctypes.byref(out)))
        except BaseException:
            config._release()
            raise
        return BubbleScheduler(out, self)

    def reorder(self, image_resolution: Optional[Sequence[int]] = None, text_tokens: Optional[Sequence[int]] = None,
                audio_tokens: Optional[Sequence[int]] = None,
                generated_image_resolution: Optional[Sequence[int]] = None,
                module_costs: Optional[Sequence[Sequence[float]]] = None, reordering: str = "intra_inter",
                max_evaluations: int = 0) -> Dict[str, Any]:
        """Where each sample of one global batch goes on this plan (braid_reorder_*):
        DistTrain's intra-microbatch reordering (LPT over the data-parallel ranks, equal
        counts) and, with ``reordering="intra_inter"``, each pipeline's microbatches in
        their best 1F1B order. Deterministic: every rank gets the same answer.

        Give per-sample sizes (lists of equal length; None: the run's nominal size), or
        ``module_costs``: per sample, one cost per plan module (any unit, ratios matter).
        ``reordering``: one of :data:`REORDERINGS`.

        Returns a dict: ``ranks`` (module name -> each sample's DP rank; modules off the
        grid, such as colocated encoders, are left out), ``cells`` and ``microbatches``
        (each sample's grid cell and schedule position), ``orders`` (per pipeline group,
        the microbatch run k-th), and samples, cells_count, pipeline_groups,
        microbatches_per_pipeline, cell_microbatch, straggler_before, straggler_after,
        evaluations."""
        if reordering not in REORDERINGS:
            guess = difflib.get_close_matches(str(reordering), REORDERINGS, n=1)
            hint = f" (did you mean '{guess[0]}'?)" if guess else ""
            raise InvalidArgumentError(
                ERR_INVALID_ARGUMENT, f"unknown reordering '{reordering}'{hint}; choose one of {', '.join(REORDERINGS)}"
            )
        columns = {"image_resolution": image_resolution, "text_tokens": text_tokens, "audio_tokens": audio_tokens,
                   "generated_image_resolution": generated_image_resolution}
        lengths = {name: len(v) for name, v in columns.items() if v is not None}
        if module_costs is not None:
            lengths["module_costs"] = len(module_costs)
        if not lengths:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, "give per-sample sizes or module_costs")
        if len(set(lengths.values())) != 1:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"per-sample lists differ in length: {lengths}")
        samples = next(iter(lengths.values()))
        names = [m["name"] for m in self.modules]
        batch = braid_sample_batch()
        batch.struct_size = ctypes.sizeof(braid_sample_batch)
        batch.samples = samples
        keep = []  # the arrays must live until the call returns
        for name, values in columns.items():
            if values is not None:
                array = (ctypes.c_int32 * samples)(*[_int_arg(name, v) for v in values])
                keep.append(array)
                setattr(batch, name, ctypes.cast(array, ctypes.POINTER(ctypes.c_int32)))
        if module_costs is not None:
            flat = []
            for i, row in enumerate(module_costs):
                if len(row) != len(names):
                    raise InvalidArgumentError(
                        ERR_INVALID_ARGUMENT, f"module_costs[{i}] has {len(row)} costs; the plan has {len(names)} modules"
                    )
                flat.extend(float(c) for c in row)
            array = (ctypes.c_double * len(flat))(*flat)
            keep.append(array)
            batch.module_costs = ctypes.cast(array, ctypes.POINTER(ctypes.c_double))
        options = braid_reorder_options()
        options.struct_size = ctypes.sizeof(braid_reorder_options)
        options.version = _REORDER_OPTIONS_VERSION
        options.reordering = REORDERINGS.index(reordering)
        options.max_evaluations = operator.index(max_evaluations)
        lib = self._lib
        handle = _ReorderPtr()
        _check(lib, lib.braid_reorder_create(self._ptr(), ctypes.byref(batch), ctypes.byref(options),
                                             ctypes.byref(handle)))
        try:
            info = braid_reorder_info()
            info.struct_size = ctypes.sizeof(braid_reorder_info)
            _check(lib, lib.braid_reorder_info_get(handle, ctypes.byref(info)))
            per_sample = ctypes.c_int32 * samples
            cells, microbatches = per_sample(), per_sample()
            _check(lib, lib.braid_reorder_cells(handle, cells, samples))
            _check(lib, lib.braid_reorder_microbatches(handle, microbatches, samples))
            ranks = {}
            for m, name in enumerate(names):
                out = per_sample()
                status = lib.braid_reorder_ranks(handle, m, out, samples)
                if status == ERR_UNSUPPORTED:
                    continue  # off the grid: a colocated encoder
                _check(lib, status)
                ranks[name] = list(out)
            orders = []
            for g in range(info.pipeline_groups):
                out = (ctypes.c_int32 * info.microbatches)()
                _check(lib, lib.braid_reorder_order(handle, g, out, info.microbatches))
                orders.append(list(out))
        finally:
            lib.braid_reorder_destroy(handle)
        return {
            "samples": info.samples,
            "cells_count": info.cells,
            "pipeline_groups": info.pipeline_groups,
            "microbatches_per_pipeline": info.microbatches,
            "cell_microbatch": info.cell_microbatch,
            "straggler_before": info.straggler_before,
            "straggler_after": info.straggler_after,
            "evaluations": info.evaluations,
            "ranks": ranks,
            "cells": list(cells),
            "microbatches": list(microbatches),
            "orders": orders,
        }

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Plan (closed)>"
        return f"<braid.Plan {self.strategy} on {self.estimate['devices']} devices>"


def _bubbles(values: Any) -> Dict[str, float]:
    return {cause: float(values[c]) for c, cause in enumerate(BUBBLE_CAUSES)}


class Program(_SharedHandle):
    """A pipeline program (braid_program): per stage, the ordered instructions its
    devices execute in one training step. Made by :meth:`Plan.program` and
    :meth:`BubbleScheduler.program`.

    The C program is self-contained; this object also keeps its :class:`Plan` (and so
    its :class:`Config`) alive. ``close()`` (or leaving a ``with`` block) frees it once
    no :class:`Simulation` of it is still open; simulations keep their program alive."""

    def __init__(self, handle: "_ProgramPtr", plan: Plan) -> None:
        self._lib = plan._lib
        self._handle = handle
        self._plan = plan
        self._init_shared()

    def _free(self, handle: "_ProgramPtr") -> None:
        self._lib.braid_program_destroy(handle)

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def schedule(self) -> str:
        """The schedule's name ("1f1b", "distmm-pipe", ...)."""
        text = ctypes.c_char_p()
        _check(self._lib, self._lib.braid_program_schedule(self._ptr(), ctypes.byref(text)))
        return _text(text.value)

    def _live(self) -> "_ProgramPtr":
        """The handle while it exists: closed, but kept for open simulations, still reads."""
        if not self._handle:
            raise InvalidArgumentError(ERR_INVALID_ARGUMENT, "the braid Program is closed")
        return self._handle

    def _stage_count(self, handle: "Optional[_ProgramPtr]" = None) -> int:
        count = ctypes.c_size_t()
        _check(self._lib, self._lib.braid_program_stage_count(handle or self._ptr(), ctypes.byref(count)))
        return count.value

    def _stage_info(self, index: int, handle: "Optional[_ProgramPtr]" = None) -> braid_stage_info:
        info = braid_stage_info()
        info.struct_size = ctypes.sizeof(braid_stage_info)
        _check(self._lib, self._lib.braid_program_stage(handle or self._ptr(), index, ctypes.byref(info)))
        return info

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """Per stage: name, module (-1 when it holds several), replicas,
        devices_per_replica, first_device, device_stride, depth, prev and next (stage
        indices), and instructions: a list of dicts with op (a name of :data:`OPCODES`),
        microbatch, chunk, peer, group, unit and flags."""
        lib, ptr = self._lib, self._ptr()
        stages = []
        for s in range(self._stage_count()):
            info = self._stage_info(s)
            instructions = []
            for i in range(info.instruction_count):
                ins = braid_instruction()
                ins.struct_size = ctypes.sizeof(braid_instruction)
                _check(lib, lib.braid_program_instruction(ptr, s, i, ctypes.byref(ins)))
                instructions.append({
                    "op": OPCODES[ins.opcode] if 0 <= ins.opcode < len(OPCODES) else str(ins.opcode),
                    "microbatch": ins.microbatch,
                    "chunk": ins.chunk,
                    "peer": ins.peer,
                    "group": ins.group,
                    "unit": ins.unit,
                    "flags": ins.flags,
                })
            stages.append({
                "name": _text(info.name),
                "module": info.module,
                "replicas": info.replicas,
                "devices_per_replica": info.devices_per_replica,
                "first_device": info.first_device,
                "device_stride": info.device_stride,
                "depth": info.depth,
                "prev": [int(info.prev[k]) for k in range(info.prev_count)] if info.prev else [],
                "next": [int(info.next[k]) for k in range(info.next_count)] if info.next else [],
                "instructions": instructions,
            })
        return stages

    def simulate(self, trace: bool = False, trace_replicas: int = 1) -> "Simulation":
        """Simulates one step. ``trace``: keep the events, for :meth:`Simulation.write_trace`
        and :meth:`Simulation.gantt`; ``trace_replicas``: DP replicas per stage to record
        (-1: all). A program that deadlocks raises :class:`InvalidArgumentError` naming
        the stuck instruction of every blocked stage."""
        options = braid_simulation_options()
        options.struct_size = ctypes.sizeof(braid_simulation_options)
        options.version = _SIMULATION_OPTIONS_VERSION
        options.record_trace = 1 if trace else 0
        options.trace_replicas = _int_arg("trace_replicas", trace_replicas)
        lib = self._lib
        self._retain()
        out = _SimulationPtr()
        try:
            _check(lib, lib.braid_simulate(self._ptr(), ctypes.byref(options), ctypes.byref(out)))
        except BaseException:
            self._release()
            raise
        return Simulation(out, self)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Program (closed)>"
        return f"<braid.Program {self.schedule}, {self._stage_count()} stages>"


class BubbleScheduler(_OwnedHandle):
    """The Optimus bubble scheduler (braid_bubble_scheduler) of a colocated plan: the
    encoders' work, cut into kernel-sized tasks, placed into the llm pipeline's bubbles.
    Made by :meth:`Plan.bubble_scheduler`. Keeps the plan's :class:`Config` alive (the
    plan itself may be closed first). ``close()`` (or leaving a ``with`` block) frees it."""

    def __init__(self, handle: "_BubbleSchedulerPtr", plan: Plan) -> None:
        self._lib = plan._lib
        self._handle = handle
        self._plan = plan
        self._owner = plan._config  # retained by Plan.bubble_scheduler

    def _free(self, handle: "_BubbleSchedulerPtr") -> None:
        self._lib.braid_bubble_scheduler_destroy(handle)

    @property
    def plan(self) -> Plan:
        return self._plan

    def run(self) -> Dict[str, Any]:
        """Schedules the plan (once: later calls return at once) and returns :attr:`report`.
        Raises :class:`BadConfigError` when the plan cannot run as a colocated program."""
        _check(self._lib, self._lib.braid_bubble_scheduler_run(self._ptr()))
        return self.report

    @property
    def report(self) -> Dict[str, Any]:
        """plain_step_s, coarse_step_s, fine_step_s (simulated step of "encoder-first",
        "optimus-coarse", "optimus-fine"), recovered_coarse and recovered_fine (share of
        encoder-first's idle time each pass turned into work), bubbles_before and
        bubbles_after (idle seconds per device by cause, keyed by :data:`BUBBLE_CAUSES`, of
        encoder-first and optimus-fine), scheduler_time_s, placements (placements
        simulated), encoder_tasks (per step on the busiest device) and tp_bubble_tasks
        (optimus-fine's tasks inside TP collective waits). Raises
        :class:`InvalidArgumentError` before :meth:`run`."""
        r = braid_bubble_report()
        r.struct_size = ctypes.sizeof(braid_bubble_report)
        _check(self._lib, self._lib.braid_bubble_scheduler_report(self._ptr(), ctypes.byref(r)))
        return {
            "plain_step_s": r.plain_step_s,
            "coarse_step_s": r.coarse_step_s,
            "fine_step_s": r.fine_step_s,
            "recovered_coarse": r.recovered_coarse,
            "recovered_fine": r.recovered_fine,
            "bubbles_before": _bubbles(r.bubbles_before_s),
            "bubbles_after": _bubbles(r.bubbles_after_s),
            "scheduler_time_s": r.scheduler_time_s,
            "placements": r.placements,
            "encoder_tasks": r.encoder_tasks,
            "tp_bubble_tasks": r.tp_bubble_tasks,
        }

    def program(self, schedule: Optional[str] = None) -> Program:
        """The scheduled step as a :class:`Program`: ``schedule`` is one of
        :data:`BUBBLE_SCHEDULES` (None or "": "optimus-fine"). Its ENCODER_TASK
        instructions say which encoder work runs where. Needs :meth:`run` first."""
        if schedule is not None and not isinstance(schedule, (str, bytes)):
            raise InvalidArgumentError(
                ERR_INVALID_ARGUMENT,
                f"schedule must be a name ({', '.join(BUBBLE_SCHEDULES)}), not {type(schedule).__name__}",
            )
        name = None if schedule is None else (schedule.encode("utf-8") if isinstance(schedule, str) else schedule)
        out = _ProgramPtr()
        _check(self._lib, self._lib.braid_bubble_scheduler_program(self._ptr(), name, ctypes.byref(out)))
        return Program(out, self._plan)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.BubbleScheduler (closed)>"
        return f"<braid.BubbleScheduler of {self._plan!r}>"


class Simulation(_OwnedHandle):
    """A simulated step (braid_simulation) of a :class:`Program`, which it keeps alive.
    Made by :meth:`Program.simulate`. ``close()`` (or leaving a ``with`` block) frees it."""

    def __init__(self, handle: "_SimulationPtr", program: Program) -> None:
        self._lib = program._lib
        self._handle = handle
        self._program = self._owner = program  # the C simulation points into the program: keep it alive

    def _free(self, handle: "_SimulationPtr") -> None:
        self._lib.braid_simulation_destroy(handle)

    @property
    def program(self) -> Program:
        return self._program

    @property
    def result(self) -> Dict[str, Any]:
        """step_time_s, bubble_fraction (idle share of device time), bubbles (idle seconds
        per device by cause, keyed by :data:`BUBBLE_CAUSES`), peak_memory_gib, mfu,
        devices, ranks (simulated stage replicas) and events (instructions executed)."""
        r = braid_simulation_result()
        r.struct_size = ctypes.sizeof(braid_simulation_result)
        _check(self._lib, self._lib.braid_simulation_result_get(self._ptr(), ctypes.byref(r)))
        return {
            "step_time_s": r.step_time_s,
            "bubble_fraction": r.bubble_fraction,
            "bubbles": _bubbles(r.bubbles_s),
            "peak_memory_gib": r.peak_memory_gib,
            "mfu": r.mfu,
            "devices": r.devices,
            "ranks": r.ranks,
            "events": r.events,
        }

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """Per stage of the program: name, busy_s and idle_s (per device, mean over the
        stage's replicas), bubbles (idle seconds by cause), peak_memory_gib, finish_s."""
        lib, ptr = self._lib, self._ptr()
        program = self._program
        handle = program._live()  # may be closed by its owner, but lives while this simulation does
        stages = []
        for s in range(program._stage_count(handle)):
            name = _text(program._stage_info(s, handle).name)
            r = braid_stage_result()
            r.struct_size = ctypes.sizeof(braid_stage_result)
            _check(lib, lib.braid_simulation_stage(ptr, s, ctypes.byref(r)))
            stages.append({
                "name": name,
                "busy_s": r.busy_s,
                "idle_s": r.idle_s,
                "bubbles": _bubbles(r.bubbles_s),
                "peak_memory_gib": r.peak_memory_gib,
                "finish_s": r.finish_s,
            })
        return stages

    def write_trace(self, path: PathLike) -> None:
        """Writes the Chrome trace (open it in ui.perfetto.dev or chrome://tracing) to
        ``path``, atomically. Needs ``simulate(trace=True)``."""
        _check(self._lib, self._lib.braid_simulation_write_trace(self._ptr(), _path_arg(path)))

    def gantt(self, width: int = 0) -> str:
        """A text Gantt chart of each stage's first replica, ``width`` columns (0:
        automatic). Needs ``simulate(trace=True)``."""
        text = ctypes.c_char_p()
        _check(self._lib, self._lib.braid_simulation_gantt(self._ptr(), _int_arg("width", width), ctypes.byref(text)))
        return _text(text.value)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Simulation (closed)>"
        return f"<braid.Simulation step {self.result['step_time_s']:.3f} s>"


def plan(config: Config, strategy: Union[str, int] = "auto", tp: int = 0, pp: int = 0, dp: int = 0,
         plan_yaml: Optional[str] = None) -> Plan:
    """Plans ``config`` with ``strategy`` (one of :data:`STRATEGIES`).

    ``tp``, ``pp``, ``dp``: constraints, 0 = free (megatron applies all three to its one
    grid; the other strategies apply tp and pp to the llm or the largest encoder).
    ``plan_yaml``: with strategy "fixed", a plan as :meth:`Plan.to_yaml` prints it.

    Raises :class:`InfeasibleError` when no layout fits (the message says what would)."""
    if not isinstance(config, Config):
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"config must be a braid.Config, not {type(config).__name__}")
    value = _strategy_value(strategy)
    if plan_yaml is not None and value != STRATEGIES.index("fixed"):
        raise InvalidArgumentError(
            ERR_INVALID_ARGUMENT, f"plan_yaml is only read with strategy 'fixed' (got '{STRATEGIES[value]}')"
        )
    options = braid_plan_options()
    options.struct_size = ctypes.sizeof(braid_plan_options)
    options.version = _PLAN_OPTIONS_VERSION
    options.strategy = value
    options.tp = _int_arg("tp", tp)
    options.pp = _int_arg("pp", pp)
    options.dp = _int_arg("dp", dp)
    yaml_bytes = None
    if plan_yaml is not None:
        yaml_bytes = plan_yaml.encode("utf-8") if isinstance(plan_yaml, str) else bytes(plan_yaml)
    options.plan_yaml = yaml_bytes  # yaml_bytes stays referenced until the call returns

    lib = config._lib
    config._retain()
    out = _PlanPtr()
    try:
        _check(lib, lib.braid_plan_create(config._ptr(), ctypes.byref(options), ctypes.byref(out)))
    except BaseException:
        config._release()
        raise
    return Plan(out, config)
