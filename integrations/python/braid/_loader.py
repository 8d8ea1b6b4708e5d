"""Finding, checking and caching libbraid.so, and the C prototypes of every function
the binding calls (:data:`_SIGNATURES`: nothing else declares one).

The library is looked up once per process, in this order:

1. ``libbraid.so`` in the directory of the ``braid`` package;
2. the path in the environment variable ``BRAID_LIBRARY``;
3. the system loader (``ctypes.util.find_library("braid")``, then ``libbraid.so``).

The first candidate that exists is used (a failure to load it is an error, except for
the system loader's guesses); a library whose ``braid_abi_version()`` is not
:data:`ABI_VERSION`, or that lacks an entry point of that ABI, is refused with
:class:`AbiMismatchError`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Callable, Iterator, List, Mapping, Optional, Tuple

from . import _structs as S
from .errors import OK, ERR_IO, ERR_UNSUPPORTED, AbiMismatchError, BraidError, LibraryNotFoundError, UnsupportedError

#: The BRAID_ABI_VERSION of the headers this binding mirrors.
ABI_VERSION = 1

_P = ctypes.POINTER
_st = S.status_t
_size = ctypes.c_size_t
_i32 = ctypes.c_int32
_str = ctypes.c_char_p

# name: (restype, argtypes), one entry per function the binding calls.
_SIGNATURES = {
    # braid.h
    "braid_abi_version": (ctypes.c_uint32, []),
    "braid_version_string": (_str, []),
    "braid_status_string": (_str, [_st]),
    "braid_last_error": (_str, []),
    "braid_config_load_file": (_st, [_str, _P(S.ConfigPtr)]),
    "braid_config_load_string": (_st, [_str, _str, _P(S.ConfigPtr)]),
    "braid_config_destroy": (_st, [S.ConfigPtr]),
    "braid_config_devices": (_st, [S.ConfigPtr, _P(_i32)]),
    "braid_config_run_settings": (_st, [S.ConfigPtr, _P(S.braid_run_settings)]),
    "braid_config_set_run_settings": (_st, [S.ConfigPtr, _P(S.braid_run_settings)]),
    "braid_plan_create": (_st, [S.ConfigPtr, _P(S.braid_plan_options), _P(S.PlanPtr)]),
    "braid_plan_destroy": (_st, [S.PlanPtr]),
    "braid_plan_strategy": (_st, [S.PlanPtr, _P(S.enum_t)]),
    "braid_plan_module_count": (_st, [S.PlanPtr, _P(_size)]),
    "braid_plan_module": (_st, [S.PlanPtr, _size, _P(S.braid_module_info)]),
    "braid_plan_estimate": (_st, [S.PlanPtr, _P(S.braid_estimate)]),
    "braid_plan_to_json": (_st, [S.PlanPtr, _P(_str)]),
    "braid_plan_to_yaml": (_st, [S.PlanPtr, _P(_str)]),
    "braid_plan_alternative_count": (_st, [S.PlanPtr, _P(_size)]),
    "braid_plan_alternative": (_st, [S.PlanPtr, _size, _P(S.braid_alternative)]),
    # braid/pipeline.h
    "braid_program_create": (_st, [S.PlanPtr, _str, _P(S.ProgramPtr)]),
    "braid_program_destroy": (_st, [S.ProgramPtr]),
    "braid_program_schedule": (_st, [S.ProgramPtr, _P(_str)]),
    "braid_program_stage_count": (_st, [S.ProgramPtr, _P(_size)]),
    "braid_program_stage": (_st, [S.ProgramPtr, _size, _P(S.braid_stage_info)]),
    "braid_program_stage_part": (_st, [S.ProgramPtr, _size, _size, _P(S.braid_stage_part)]),
    "braid_program_instruction": (_st, [S.ProgramPtr, _size, _size, _P(S.braid_instruction)]),
    "braid_program_microbatches": (_st, [S.ProgramPtr, _P(_i32)]),
    "braid_program_rank": (_st, [S.ProgramPtr, _i32, _P(S.braid_program_rank_info)]),
    "braid_program_rank_instruction": (_st, [S.ProgramPtr, _i32, _size, _P(S.braid_instruction)]),
    "braid_simulate": (_st, [S.ProgramPtr, _P(S.braid_simulation_options), _P(S.SimulationPtr)]),
    "braid_simulation_destroy": (_st, [S.SimulationPtr]),
    "braid_simulation_result_get": (_st, [S.SimulationPtr, _P(S.braid_simulation_result)]),
    "braid_simulation_stage": (_st, [S.SimulationPtr, _size, _P(S.braid_stage_result)]),
    "braid_simulation_write_trace": (_st, [S.SimulationPtr, _str]),
    "braid_simulation_gantt": (_st, [S.SimulationPtr, _i32, _P(_str)]),
    # braid/groups.h
    "braid_groups_create": (_st, [S.PlanPtr, _i32, _P(S.GroupsPtr)]),
    "braid_groups_destroy": (_st, [S.GroupsPtr]),
    "braid_groups_world_size": (_st, [S.GroupsPtr, _P(_i32)]),
    "braid_groups_count": (_st, [S.GroupsPtr, _P(_size)]),
    "braid_groups_group": (_st, [S.GroupsPtr, _size, _P(S.braid_group_info)]),
    "braid_groups_rank": (_st, [S.GroupsPtr, _i32, _P(S.braid_rank_info)]),
    "braid_groups_holding": (_st, [S.GroupsPtr, _i32, _size, _P(S.braid_holding)]),
    "braid_groups_link_count": (_st, [S.GroupsPtr, _P(_size)]),
    "braid_groups_link": (_st, [S.GroupsPtr, _size, _P(S.braid_link_info)]),
    "braid_groups_link_pair": (_st, [S.GroupsPtr, _size, _size, _P(S.braid_link_pair)]),
    "braid_groups_batch_sync_count": (_st, [S.GroupsPtr, _P(_size)]),
    "braid_groups_batch_sync": (_st, [S.GroupsPtr, _size, _P(S.braid_batch_sync_info)]),
    "braid_groups_batch_sync_member": (_st, [S.GroupsPtr, _size, _size, _P(S.braid_batch_sync_member)]),
    # braid/data.h
    "braid_reorder_create": (_st, [S.PlanPtr, _P(S.braid_sample_batch), _P(S.braid_reorder_options),
                                   _P(S.ReorderPtr)]),
    "braid_reorder_destroy": (_st, [S.ReorderPtr]),
    "braid_reorder_info_get": (_st, [S.ReorderPtr, _P(S.braid_reorder_info)]),
    "braid_reorder_ranks": (_st, [S.ReorderPtr, _size, _P(_i32), _size]),
    "braid_reorder_cells": (_st, [S.ReorderPtr, _P(_i32), _size]),
    "braid_reorder_microbatches": (_st, [S.ReorderPtr, _P(_i32), _size]),
    "braid_reorder_order": (_st, [S.ReorderPtr, _size, _P(_i32), _size]),
    # braid/bubble.h
    "braid_bubble_scheduler_create": (_st, [S.PlanPtr, _P(S.BubbleSchedulerPtr)]),
    "braid_bubble_scheduler_destroy": (_st, [S.BubbleSchedulerPtr]),
    "braid_bubble_scheduler_run": (_st, [S.BubbleSchedulerPtr]),
    "braid_bubble_scheduler_report": (_st, [S.BubbleSchedulerPtr, _P(S.braid_bubble_report)]),
    "braid_bubble_scheduler_program": (_st, [S.BubbleSchedulerPtr, _str, _P(S.ProgramPtr)]),
    # braid/tensor.h
    "braid_contrastive_forward": (_st, [_P(S.braid_tensor)] * 4 + [ctypes.c_float, _P(S.braid_contrastive_options),
                                                                     _P(S.braid_tensor), _P(ctypes.c_float),
                                                                     ctypes.c_void_p]),
    "braid_contrastive_backward": (_st, [_P(S.braid_tensor)] * 4 + [ctypes.c_float, _P(S.braid_contrastive_options),
                                                                      _P(S.braid_tensor), ctypes.c_float]
                                   + [_P(S.braid_tensor)] * 4 + [_P(ctypes.c_float), ctypes.c_void_p]),
    # braid/vocabulary.h
    "braid_vocabulary_size": (_st, [S.enum_t, _P(_size)]),
    "braid_vocabulary_name": (_st, [S.enum_t, _size, _P(_str)]),
}

# Entry points added after the first release of ABI version 1: a library of that ABI
# may lack them, and only the calls that need one fail (UnsupportedError, naming it).
_ADDED = frozenset({
    "braid_config_run_settings",
    "braid_config_set_run_settings",
    "braid_program_stage_part",
    "braid_program_microbatches",
    "braid_program_rank",
    "braid_program_rank_instruction",
    "braid_groups_create",
    "braid_groups_destroy",
    "braid_groups_world_size",
    "braid_groups_count",
    "braid_groups_group",
    "braid_groups_rank",
    "braid_groups_holding",
    "braid_groups_link_count",
    "braid_groups_link",
    "braid_groups_link_pair",
    "braid_groups_batch_sync_count",
    "braid_groups_batch_sync",
    "braid_groups_batch_sync_member",
    "braid_contrastive_forward",
    "braid_contrastive_backward",
})

_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()
_reset_hooks: List[Callable[[], None]] = []


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


def package_dir() -> str:
    """The directory of the braid package (where a bundled libbraid.so goes)."""
    return os.path.dirname(os.path.abspath(__file__))


def _candidates(package: Optional[str] = None,
                environ: Optional[Mapping[str, str]] = None) -> Iterator[Tuple[str, str, bool]]:
    """(how it was found, what to pass to CDLL, whether a failure to load it is final),
    in lookup order. ``package`` and ``environ`` default to this package's directory and
    os.environ."""
    here = os.path.join(package if package is not None else package_dir(), "libbraid.so")
    if os.path.exists(here):
        yield "next to the package", here, True
    env = (os.environ if environ is None else environ).get("BRAID_LIBRARY")
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
    missing = []
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name not in _ADDED:
                raise AbiMismatchError(
                    ERR_UNSUPPORTED, f"{path} does not export {name}, which braid ABI version {ABI_VERSION} has"
                ) from None
            missing.append(name)
            continue
        fn.restype, fn.argtypes = restype, argtypes
    lib._braid_missing = frozenset(missing)
    # The struct arrays indexed by braid_bubble_cause are sized by BRAID_BUBBLE_COUNT.
    count = ctypes.c_size_t()
    _check(lib, lib.braid_vocabulary_size(S.VOCABULARY_BUBBLE_CAUSE, ctypes.byref(count)))
    if count.value != S.BUBBLE_COUNT:
        raise AbiMismatchError(
            ERR_UNSUPPORTED, f"{path} has {count.value} bubble causes; this binding's structs hold {S.BUBBLE_COUNT}"
        )
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
            lib._braid_found_via = how
            _lib = lib
            return lib
        raise LibraryNotFoundError(
            ERR_IO,
            "cannot find libbraid.so; build braid and set BRAID_LIBRARY to build/capi/libbraid.so, or "
            "install it next to the braid package (tried: " + "; ".join(tried) + ")",
        )


def _reset_library() -> None:
    """Forgets the cached library (and everything read from it), so that the next call
    looks it up again (for tests)."""
    global _lib
    with _lib_lock:
        _lib = None
    for hook in _reset_hooks:
        hook()


def on_reset(hook: Callable[[], None]) -> None:
    """Calls ``hook`` whenever the cached library is forgotten (caches of its answers)."""
    _reset_hooks.append(hook)


def has(name: str, lib: Optional[ctypes.CDLL] = None) -> bool:
    """Whether the loaded library exports entry point ``name`` of :data:`_SIGNATURES`."""
    lib = lib or load_library()
    return name in _SIGNATURES and name not in getattr(lib, "_braid_missing", frozenset())


def require(lib: ctypes.CDLL, name: str):
    """The bound entry point ``name``, or UnsupportedError when this library predates it."""
    if name in getattr(lib, "_braid_missing", frozenset()):
        raise UnsupportedError(
            ERR_UNSUPPORTED,
            f"{lib._name} does not export {name}: it is older than this binding; use the libbraid.so of the "
            "same braid release",
        )
    return getattr(lib, name)


def text(value: Optional[bytes]) -> str:
    """A C string as str ("" for NULL)."""
    return "" if value is None else value.decode("utf-8", errors="replace")


def _check(lib: ctypes.CDLL, status: int) -> None:
    """Raises the BraidError of a failed call, with braid_last_error()'s message."""
    if status != OK:
        raise BraidError(int(status), text(lib.braid_last_error()))


def version() -> str:
    """The library's version string ("0.1.0")."""
    return text(load_library().braid_version_string())


def abi_version() -> int:
    """The ABI version of the loaded library (equal to :data:`ABI_VERSION`)."""
    return int(load_library().braid_abi_version())


def status_string(status: int) -> str:
    """The library's short description of a braid_status."""
    return text(load_library().braid_status_string(int(status)))
