"""Planning (braid_plan_*): per-module placement and the cost model's estimate."""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _loader
from . import _structs as S
from . import vocab
from ._handles import OwnedHandle, c_string, count, int_arg, name_arg, read, text_out
from .config import Config
from .errors import invalid_argument
from .records import Alternative, Estimate, ModuleInfo

__all__ = ["Plan", "plan"]


class Plan(OwnedHandle):
    """A plan (braid_plan): per-module placement and the cost model's estimate.

    Made by :func:`plan` (or :meth:`Config.plan`). Keeps its :class:`Config` alive.
    ``close()`` (or leaving a ``with`` block) frees it; reading a closed plan raises
    :class:`~braid.InvalidArgumentError`."""

    _destroy = "braid_plan_destroy"

    def __init__(self, handle: "S.PlanPtr", config: Config) -> None:
        self._lib = config._lib
        self._handle = handle
        self._config = self._owner = config  # the C plan points into the config: keep it alive

    @property
    def config(self) -> Config:
        return self._config

    @property
    def strategy(self) -> str:
        """The strategy that produced the plan (for auto: the winner), a name of
        :func:`braid.vocab.strategies`."""
        out = S.enum_t()
        _loader._check(self._lib, self._lib.braid_plan_strategy(self._ptr(), ctypes.byref(out)))
        return vocab.name_of(S.VOCABULARY_STRATEGY, out.value)

    @property
    def modules(self) -> Tuple[Any, ...]:
        """Per module, in plan order (the index every ``module`` field uses): a
        :class:`~braid.records.ModuleInfo` (name, role, devices, tp, pp, dp, first_device,
        first_stage, microbatch_size, layers_per_stage)."""
        lib, ptr = self._lib, self._ptr()
        n = count(lib, lib.braid_plan_module_count, ptr)
        return tuple(ModuleInfo.from_struct(read(lib, lib.braid_plan_module, S.braid_module_info, ptr, i))
                     for i in range(n))

    @property
    def estimate(self) -> Any:
        """The cost model's :class:`~braid.records.Estimate`: iteration_time_s,
        samples_per_s, tflops_per_device, mfu, peak_memory_gib, bubble_fraction, devices
        (the devices the plan uses)."""
        return Estimate.from_struct(read(self._lib, self._lib.braid_plan_estimate, S.braid_estimate, self._ptr()))

    @property
    def alternatives(self) -> Tuple[Any, ...]:
        """With strategy auto: every strategy tried, ranked (the first is the winner), as
        :class:`~braid.records.Alternative` records (strategy, feasible, iteration_time_s
        (0 when not feasible), reason)."""
        lib, ptr = self._lib, self._ptr()
        n = count(lib, lib.braid_plan_alternative_count, ptr)
        return tuple(Alternative.from_struct(read(lib, lib.braid_plan_alternative, S.braid_alternative, ptr, i))
                     for i in range(n))

    def to_json(self) -> Dict[str, Any]:
        """The plan as `braid plan --format json` prints it, parsed."""
        return json.loads(text_out(self._lib, self._lib.braid_plan_to_json, self._ptr()))

    def to_yaml(self) -> str:
        """The plan as `braid plan --format yaml` prints it; plan(config, "fixed",
        plan_yaml=...) evaluates it again."""
        return text_out(self._lib, self._lib.braid_plan_to_yaml, self._ptr())

    def program(self, schedule: Optional[str] = None) -> "Any":
        """The pipeline :class:`~braid.Program` this plan's devices run in one step, with
        ``schedule`` (one of :func:`braid.vocab.schedules`; None or "": the plan's own).
        Raises :class:`~braid.UnsupportedError` when the plan's layout cannot run it."""
        from .program import Program

        name = name_arg(schedule, "schedule", vocab.schedules)
        out = S.ProgramPtr()
        _loader._check(self._lib, self._lib.braid_program_create(self._ptr(), name, ctypes.byref(out)))
        return Program(out, self)

    def groups(self, world_size: Optional[int] = None) -> "Any":
        """The process :class:`~braid.Groups` of this plan on a world of ``world_size``
        ranks (default: the plan's devices, :attr:`estimate`.devices, which it must be)."""
        from .groups import Groups

        return Groups(self, world_size)

    def bubble_scheduler(self) -> "Any":
        """The Optimus :class:`~braid.BubbleScheduler` of this plan, which must be colocated
        (strategy optimus, or an auto plan that optimus won); call its ``run()``. Raises
        :class:`~braid.UnsupportedError` for any other plan."""
        from .bubble import BubbleScheduler

        return BubbleScheduler._create(self)

    def reorder(self, image_resolution: Optional[Sequence[int]] = None, text_tokens: Optional[Sequence[int]] = None,
                audio_tokens: Optional[Sequence[int]] = None,
                generated_image_resolution: Optional[Sequence[int]] = None,
                module_costs: Optional[Sequence[Sequence[float]]] = None, reordering: str = "intra_inter",
                max_evaluations: int = 0) -> "Any":
        """Where each sample of one global batch goes on this plan: a
        :class:`~braid.records.ReorderedBatch` (see :func:`braid.reorder.reorder`)."""
        from .reorder import reorder

        return reorder(self, image_resolution=image_resolution, text_tokens=text_tokens, audio_tokens=audio_tokens,
                       generated_image_resolution=generated_image_resolution, module_costs=module_costs,
                       reordering=reordering, max_evaluations=max_evaluations)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Plan (closed)>"
        return f"<braid.Plan {self.strategy} on {self.estimate.devices} devices>"


def plan(config: Config, strategy: Union[str, int] = "auto", tp: int = 0, pp: int = 0, dp: int = 0,
         plan_yaml: Optional[str] = None, schedule: Optional[str] = None, virtual_stages: int = 0,
         microbatch_size: int = 0) -> Plan:
    """Plans ``config`` with ``strategy`` (one of :func:`braid.vocab.strategies`).

    ``tp``, ``pp``, ``dp``: constraints, 0 = free (megatron applies all three to its one
    grid; the other strategies apply tp and pp to the llm or the largest encoder).
    ``plan_yaml``: with strategy "fixed", a plan as :meth:`Plan.to_yaml` prints it.
    ``schedule``, ``virtual_stages``, ``microbatch_size``: this plan's overrides of the
    run's settings (None / 0: the run's own; braid_plan_options version 2): the schedule
    its programs run (any of :func:`braid.vocab.schedules` the plan's layout runs), the
    interleaved schedule's virtual stages, the samples per microbatch and DP replica.

    Raises :class:`~braid.InfeasibleError` when no layout fits (the message says what
    would)."""
    if not isinstance(config, Config):
        raise invalid_argument(f"config must be a braid.Config, not {type(config).__name__}")
    value = vocab.value_of(S.VOCABULARY_STRATEGY, strategy, "strategy")
    strategies = vocab.strategies()
    if plan_yaml is not None and strategies[value] != "fixed":
        raise invalid_argument(f"plan_yaml is only read with strategy 'fixed' (got '{strategies[value]}')")
    options = S.new(S.braid_plan_options)
    options.strategy = value
    options.tp = int_arg("tp", tp)
    options.pp = int_arg("pp", pp)
    options.dp = int_arg("dp", dp)
    yaml_bytes = None
    if plan_yaml is not None:
        if not isinstance(plan_yaml, (str, bytes)):
            raise invalid_argument(f"plan_yaml must be str or bytes, not {type(plan_yaml).__name__}")
        yaml_bytes = c_string(plan_yaml.encode("utf-8") if isinstance(plan_yaml, str) else plan_yaml, "plan_yaml")
    options.plan_yaml = yaml_bytes  # referenced until the call returns
    schedule_bytes = name_arg(schedule, "schedule", vocab.schedules)
    options.schedule = schedule_bytes
    options.virtual_stages = int_arg("virtual_stages", virtual_stages)
    options.microbatch_size = int_arg("microbatch_size", microbatch_size)
    # Version 1 unless a version-2 field is used: a library of the first release refuses
    # version 2 (BRAID_ERR_UNSUPPORTED), and need not when nothing of it is asked for.
    uses_v2 = schedule_bytes is not None or options.virtual_stages != 0 or options.microbatch_size != 0
    options.version = S.PLAN_OPTIONS_VERSION_2 if uses_v2 else S.PLAN_OPTIONS_VERSION_1

    lib = config._lib
    config._retain()
    out = S.PlanPtr()
    try:
        _loader._check(lib, lib.braid_plan_create(config._ptr(), ctypes.byref(options), ctypes.byref(out)))
    except BaseException:
        config._release()
        raise
    return Plan(out, config)
