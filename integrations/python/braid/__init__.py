"""Python binding of braid's C ABI (``capi/include/braid/braid.h``) through ctypes.

A thin shim: every call goes to ``libbraid.so``; no planning happens in Python. The
areas live in their own modules; this package re-exports them:

* :mod:`braid.config` (:class:`Config`), :mod:`braid.plan` (:class:`Plan`, :func:`plan`),
  :mod:`braid.program` (:class:`Program`, :class:`Simulation`), :mod:`braid.groups`
  (:class:`Groups`), :mod:`braid.bubble` (:class:`BubbleScheduler`),
  :mod:`braid.reorder`, :mod:`braid.tensor` (contrastive loss on numpy / torch arrays);
* :mod:`braid.records`: the typed results (C field names), :mod:`braid.vocab`: the
  library's names for its enums and schedules, :mod:`braid.errors`: the exceptions.

::

    import braid
    with braid.Config.from_file("configs/runs/clip-vit-l14-64gpu.yaml") as config:
        with config.plan(strategy="auto") as p:
            print(p.strategy, p.estimate.iteration_time_s, p.modules[0].tp)
            with p.program() as program, program.simulate(trace=True) as sim:
                print(program.schedule, sim.result.step_time_s)
                print(program.instructions(0)[:4])   # Instruction(opcode='LoadMicrobatch', ...)
            groups = p.groups()                     # process groups, one per module and axis
            print(groups.groups[0].name, groups.rank(0))

The library is looked up once per process: ``libbraid.so`` next to this package, then
``$BRAID_LIBRARY``, then the system loader (see :mod:`braid._loader`); a library of
another ABI version is refused with :class:`AbiMismatchError`.
"""

from __future__ import annotations

from . import errors, records, reorder, tensor, vocab
from ._loader import (  # noqa: F401 (_check_abi, _reset_library: for tests)
    ABI_VERSION,
    _check_abi,
    _reset_library,
    abi_version,
    load_library,
    status_string,
    version,
)
from .bubble import BubbleScheduler
from .config import Config
from .errors import *  # noqa: F401,F403 (the statuses and exceptions, errors.__all__)
from .groups import Groups
from .plan import Plan, plan
from .program import Program, Simulation
from .vocab import (
    FLAG_ALL,
    FLAG_BACKWARD_TASK,
    FLAG_IN_DP_WAIT,
    FLAG_IN_TP_BUBBLE,
    FLAG_NO_STORE,
    FLAG_RECOMPUTE,
    FLAG_SYNC_ONLY,
)

__all__ = [
    "ABI_VERSION",
    *errors.__all__,
    "Config",
    "Plan",
    "Program",
    "Simulation",
    "Groups",
    "BubbleScheduler",
    "plan",
    "version",
    "abi_version",
    "status_string",
    "load_library",
    "errors",
    "records",
    "reorder",
    "tensor",
    "vocab",
    "FLAG_NO_STORE",
    "FLAG_RECOMPUTE",
    "FLAG_BACKWARD_TASK",
    "FLAG_SYNC_ONLY",
    "FLAG_IN_TP_BUBBLE",
    "FLAG_IN_DP_WAIT",
    "FLAG_ALL",
]


def __getattr__(name: str):
    # STRATEGIES, SCHEDULES, OPCODES, BUBBLE_CAUSES, REORDERINGS, AXES, BUBBLE_SCHEDULES:
    # the library's vocabularies, read at first use (braid.vocab).
    if name.isupper() and name in vocab._LEGACY:
        return vocab._LEGACY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
