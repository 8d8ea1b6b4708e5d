"""The Optimus bubble scheduler of colocated plans (braid/bubble.h)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from . import _loader
from . import _structs as S
from . import vocab
from ._handles import OwnedHandle, name_arg, read
from .program import Program
from .records import BubbleReport

__all__ = ["BubbleScheduler"]


class BubbleScheduler(OwnedHandle):
    """The Optimus bubble scheduler (braid_bubble_scheduler) of a colocated plan: the
    encoders' work, cut into kernel-sized tasks, placed into the llm pipeline's bubbles.
    Made by :meth:`Plan.bubble_scheduler`. Keeps the plan's :class:`~braid.Config` alive
    (the plan itself may be closed first). ``close()`` (or leaving a ``with`` block)
    frees it."""

    _destroy = "braid_bubble_scheduler_destroy"

    def __init__(self, handle: "S.BubbleSchedulerPtr", plan: Any) -> None:
        self._lib = plan._lib
        self._handle = handle
        self._plan = plan
        self._owner = plan._config  # retained by _create

    @classmethod
    def _create(cls, plan: Any) -> "BubbleScheduler":
        ptr = plan._ptr()
        config = plan._config
        with config._lock:  # the C scheduler uses the config's cost model: keep it alive, even once closed
            config._dependents += 1
        out = S.BubbleSchedulerPtr()
        try:
            _loader._check(plan._lib, plan._lib.braid_bubble_scheduler_create(ptr, ctypes.byref(out)))
        except BaseException:
            config._release()
            raise
        return cls(out, plan)

    @property
    def plan(self) -> Any:
        return self._plan

    def run(self) -> Any:
        """Schedules the plan (once: later calls return at once) and returns :attr:`report`.
        Raises :class:`~braid.BadConfigError` when the plan cannot run as a colocated program."""
        _loader._check(self._lib, self._lib.braid_bubble_scheduler_run(self._ptr()))
        return self.report

    @property
    def report(self) -> Any:
        """A :class:`~braid.records.BubbleReport`: plain_step_s, coarse_step_s, fine_step_s
        (simulated step of "encoder-first", "optimus-coarse", "optimus-fine"),
        recovered_coarse and recovered_fine (share of encoder-first's idle time each pass
        turned into work), bubbles_before_s and bubbles_after_s (idle seconds per device by
        cause, of encoder-first and optimus-fine; see :func:`braid.vocab.by_cause`),
        scheduler_time_s, placements, encoder_tasks (per step on the busiest device),
        tp_bubble_tasks, and Optimus' metric against the llm alone: llm_step_s, llm_idle_s,
        encoder_s and, per schedule (encoder-first, coarse, fine), bubble_filled and
        encoder_hidden (docs/bubble-scheduler.md); dp_wait_tasks (optimus-fine's tasks in the
        llm's DP waits). Raises :class:`~braid.InvalidArgumentError` before :meth:`run`."""
        lib = self._lib
        return BubbleReport.from_struct(read(lib, lib.braid_bubble_scheduler_report, S.braid_bubble_report,
                                             self._ptr()))

    def program(self, schedule: Optional[str] = None) -> Program:
        """The scheduled step as a :class:`~braid.Program`: ``schedule`` is one of
        :func:`braid.vocab.bubble_schedules` (None or "": the first, the default). Its
        EncoderTask instructions say which encoder work runs where. Needs :meth:`run` first."""
        name = name_arg(schedule, "schedule", vocab.bubble_schedules)
        out = S.ProgramPtr()
        _loader._check(self._lib, self._lib.braid_bubble_scheduler_program(self._ptr(), name, ctypes.byref(out)))
        return Program(out, self._plan)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.BubbleScheduler (closed)>"
        return f"<braid.BubbleScheduler of {self._plan!r}>"
