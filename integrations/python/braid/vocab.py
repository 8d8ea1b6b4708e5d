"""The library's names for its enums and schedules (braid/vocabulary.h), read once from
libbraid.so at first use: the binding repeats none of them.

Each function returns a tuple of names; for an enum the index is the C value
(``opcodes()[BRAID_OP_FORWARD] == "Forward"``)::

    braid.vocab.strategies()        # ('auto', 'megatron', 'distmm', 'disttrain', 'optimus', 'fixed')
    braid.vocab.opcodes()           # ('LoadMicrobatch', 'Forward', ...)
    braid.vocab.bubble_schedules()  # the bubble scheduler's programs, the default first

The upper-case names of earlier releases (``braid.STRATEGIES``, ``braid.vocab.OPCODES``,
...) still work: they are the same tuples.
"""

from __future__ import annotations

import ctypes
import difflib
import operator
import threading
from typing import Dict, Iterable, Sequence, Tuple, Union

from . import _loader
from . import _structs as S
from .errors import ERR_INVALID_ARGUMENT, InvalidArgumentError

__all__ = [
    "strategies",
    "schedules",
    "opcodes",
    "bubble_causes",
    "reorderings",
    "axes",
    "bubble_schedules",
    "precisions",
    "recomputes",
    "attentions",
    "names",
    "name_of",
    "value_of",
    "by_cause",
    "FLAG_NO_STORE",
    "FLAG_RECOMPUTE",
    "FLAG_BACKWARD_TASK",
    "FLAG_SYNC_ONLY",
    "FLAG_IN_TP_BUBBLE",
    "FLAG_IN_DP_WAIT",
    "FLAG_ALL",
]

# Macros of braid/pipeline.h, which ctypes cannot read (tests/python/test_vocab.py checks
# these against the header). braid_instruction.flags bits (BRAID_FLAG_*):
FLAG_NO_STORE = 1  # two-phase batch-sync: a forward that keeps no activations
FLAG_RECOMPUTE = 2  # two-phase batch-sync: the forward re-run before its backward
FLAG_BACKWARD_TASK = 4  # ENCODER_TASK: a backward task
FLAG_SYNC_ONLY = 8  # a send/receive that only orders work
FLAG_IN_TP_BUBBLE = 16  # ENCODER_TASK placed inside the TP collective waits of the compute before it
FLAG_IN_DP_WAIT = 32  # ENCODER_TASK in the llm's DP waits: gradient reduction (backward), parameter all-gather (forward)
FLAG_ALL = 63  # every flag a program may carry

# ENCODER_TASK units of a colocated stage (braid/pipeline.h, BRAID_ENCODER_*): unit =
# 1 + e * ENCODER_UNITS + one of these for encoder e.
ENCODER_UNIT_EMBEDDING = 0  # patch/token embedding (the encoder's first stage)
ENCODER_UNIT_FIRST_KERNEL = 1  # then ENCODER_LAYER_KERNELS kernels per transformer layer
ENCODER_LAYER_KERNELS = 9
ENCODER_UNIT_HEAD = 10  # final norm and projection (the encoder's last stage)
ENCODER_UNIT_TRANSFER = 11  # hand-over to the llm's first stage, or the next encoder stage
ENCODER_UNIT_SHARD = 12  # ZeRO-2/3 traffic of the encoder's gradients (backward)
ENCODER_UNITS = 13  # units per encoder on a colocated stage
ENCODER_MESSAGE_BASE = 1 << 24  # sync-only messages of an encoder's own pipeline: base + (e << 16) + j

_cache: Dict[int, Tuple[str, ...]] = {}
_cache_lock = threading.Lock()
_loader.on_reset(_cache.clear)


def names(vocabulary: int) -> Tuple[str, ...]:
    """Every name of ``vocabulary`` (a braid_vocabulary value), in C value order."""
    try:
        if isinstance(vocabulary, bool):
            raise TypeError
        vocabulary = operator.index(vocabulary)
    except TypeError:
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, "vocabulary must be an int (a braid_vocabulary value), not "
                                   f"{type(vocabulary).__name__}") from None
    found = _cache.get(vocabulary)
    if found is not None:
        return found
    lib = _loader.load_library()
    size = ctypes.c_size_t()
    _loader._check(lib, lib.braid_vocabulary_size(vocabulary, ctypes.byref(size)))
    out = []
    for v in range(size.value):
        text = ctypes.c_char_p()
        _loader._check(lib, lib.braid_vocabulary_name(vocabulary, v, ctypes.byref(text)))
        out.append(_loader.text(text.value))
    found = tuple(out)
    with _cache_lock:
        _cache[vocabulary] = found
    return found


def strategies() -> Tuple[str, ...]:
    """The braid_strategy names ("auto", "megatron", ...)."""
    return names(S.VOCABULARY_STRATEGY)


def schedules() -> Tuple[str, ...]:
    """Every schedule braid_program_create knows; which ones a plan runs depends on its layout."""
    return names(S.VOCABULARY_SCHEDULE)


def opcodes() -> Tuple[str, ...]:
    """The braid_opcode names ("LoadMicrobatch", "Forward", ...)."""
    return names(S.VOCABULARY_OPCODE)


def bubble_causes() -> Tuple[str, ...]:
    """The braid_bubble_cause names: why devices were idle ("dp_start", ...)."""
    return names(S.VOCABULARY_BUBBLE_CAUSE)


def reorderings() -> Tuple[str, ...]:
    """The braid_reordering names ("none", "intra", "intra_inter")."""
    return names(S.VOCABULARY_REORDERING)


def axes() -> Tuple[str, ...]:
    """The braid_axis names ("tp", "dp", "pp")."""
    return names(S.VOCABULARY_AXIS)


def bubble_schedules() -> Tuple[str, ...]:
    """The bubble scheduler's programs (braid_bubble_scheduler_program), the default first."""
    return names(S.VOCABULARY_BUBBLE_SCHEDULE)


def precisions() -> Tuple[str, ...]:
    """The braid_precision names ("bf16", "fp16", "fp32")."""
    return names(S.VOCABULARY_PRECISION)


def recomputes() -> Tuple[str, ...]:
    """The braid_recompute names ("none", "selective", "full")."""
    return names(S.VOCABULARY_RECOMPUTE)


def attentions() -> Tuple[str, ...]:
    """The braid_attention names ("flash", "standard")."""
    return names(S.VOCABULARY_ATTENTION)


def name_of(vocabulary: int, value: int) -> Union[str, int]:
    """The name of C value ``value`` in ``vocabulary``; the value itself when the library
    has no name for it."""
    all_names = names(vocabulary)
    return all_names[value] if 0 <= value < len(all_names) else value


def value_of(vocabulary: int, name: Union[str, int], what: str) -> int:
    """The C value of ``name`` (or of an int already a value) in ``vocabulary``;
    InvalidArgumentError naming ``what``, the choices and the closest one otherwise."""
    choices = names(vocabulary)
    if isinstance(name, bool):
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"{what} must be a name ({', '.join(choices)}), not bool")
    if not isinstance(name, (str, bytes)) and hasattr(name, "__index__"):  # int, numpy.int64, ...
        name = operator.index(name)
        if 0 <= name < len(choices):
            return name
        raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"{what} {name} is not one of 0..{len(choices) - 1}")
    if isinstance(name, bytes):
        name = name.decode("utf-8", errors="replace")
    if not isinstance(name, str):
        raise InvalidArgumentError(
            ERR_INVALID_ARGUMENT, f"{what} must be a name ({', '.join(choices)}), not {type(name).__name__}"
        )
    key = name.strip()
    if key in choices:
        return choices.index(key)
    folded = [c.lower() for c in choices]
    if key.lower() in folded:
        return folded.index(key.lower())
    guess = difflib.get_close_matches(key, choices, n=1)
    hint = f" (did you mean '{guess[0]}'?)" if guess else ""
    raise InvalidArgumentError(ERR_INVALID_ARGUMENT, f"unknown {what} '{name}'{hint}; choose one of {', '.join(choices)}")


def by_cause(values: Sequence[float]) -> Dict[str, float]:
    """An array indexed by braid_bubble_cause (``bubbles_s``) as a dict keyed by cause name."""
    return {cause: float(v) for cause, v in zip(bubble_causes(), values)}


# The upper-case tuples of earlier releases, resolved at first use.
_LEGACY = {
    "STRATEGIES": strategies,
    "SCHEDULES": schedules,
    "OPCODES": opcodes,
    "BUBBLE_CAUSES": bubble_causes,
    "REORDERINGS": reorderings,
    "AXES": axes,
    "BUBBLE_SCHEDULES": bubble_schedules,
}


def __getattr__(name: str):
    try:
        return _LEGACY[name]()
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> Iterable[str]:
    return sorted(list(globals()) + list(_LEGACY))
