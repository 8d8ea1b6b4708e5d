"""The ``"braid"`` section of a DeepSpeed config, and DeepSpeed's batch keys against the
braid run it names.

    {
      "train_batch_size": 128,
      "train_micro_batch_size_per_gpu": 16,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
      "braid": {"enabled": true, "run": "configs/runs/tiny-clip.yaml", "strategy": "distmm"}
    }

The section is validated as DeepSpeed validates its own sections (a pydantic model with
``extra = "forbid"``, like ``deepspeed.runtime.config_utils.DeepSpeedConfigModel``): an
unknown or misspelled key is refused with its name and the closest known key, a value of
the wrong type or outside its choices with the key's dotted name. Unlike DeepSpeed's
models, ``"auto"`` is never dropped silently: ``"strategy": "auto"`` asks braid's planner
for the best strategy, ``"schedule": "auto"`` for the plan's own schedule, and any other
key refuses it.

The names of strategies, schedules and reorderings are braid's own (asked from the
library through the ``braid`` package), never a list kept here.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

try:  # pydantic 2 ships the 1.x API as pydantic.v1 (as deepspeed.pydantic_v1 does)
    from pydantic.v1 import BaseModel, Extra, StrictBool, StrictInt, StrictStr, ValidationError, validator
except ImportError:
    from pydantic import BaseModel, Extra, StrictBool, StrictInt, StrictStr, ValidationError, validator

import braid
from braid import vocab

__all__ = [
    "SECTION",
    "BATCH_KEYS",
    "BraidSection",
    "RunBatch",
    "parse_section",
    "load_deepspeed_config",
    "run_batch",
    "check_batch_keys",
    "section_error",
]

#: The key of braid's section in a DeepSpeed config.
SECTION = "braid"

#: DeepSpeed's batch keys, in the order DeepSpeed derives them.
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# "auto" means "let braid choose" where braid has a choice to make.
_AUTO = "auto"


def section_error(message: str) -> braid.BadConfigError:
    """A :class:`braid.BadConfigError` about the DeepSpeed config (status BRAID_ERR_BAD_CONFIG)."""
    return braid.BadConfigError(braid.BadConfigError.status, message)


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    guess = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{guess[0]}'?)" if guess else ""


def _choice(key: str, value: str, choices: Sequence[str]) -> str:
    if value in choices:
        return value
    raise ValueError(f"unknown value '{value}'{_did_you_mean(value, choices)}; choose one of {', '.join(choices)}")


def _strategies() -> Tuple[str, ...]:
    return tuple(vocab.strategies())


def _schedules() -> Tuple[str, ...]:
    names = list(vocab.schedules())
    return tuple(names + [s for s in vocab.bubble_schedules() if s not in names])


def _reorderings() -> Tuple[str, ...]:
    return tuple(vocab.reorderings())


class BraidSection(BaseModel):
    """The ``"braid"`` section, typed, with its defaults.

    enabled   run the model under braid's plan (default false: the section is only checked)
    run       the braid run file (model, cluster, batch sizes); relative paths are relative
              to the DeepSpeed config file, or to the working directory for a dict config
    strategy  braid's planning strategy: auto (the planner's best), megatron, distmm,
              disttrain, optimus, or fixed (with ``plan``)
    schedule  the program's schedule; auto (default): the plan's own (optimus-fine for
              colocated plans)
    reorder   DistTrain data reordering of each global batch: none (default), intra,
              intra_inter
    tp, pp, dp  planner constraints, as ``braid plan --tp/--pp/--dp`` (0: free)
    plan      with strategy fixed: a plan file as ``braid plan --format yaml`` writes it
    """

    enabled: StrictBool = False
    run: Optional[StrictStr] = None
    strategy: StrictStr = _AUTO
    schedule: StrictStr = _AUTO
    reorder: StrictStr = "none"
    tp: StrictInt = 0
    pp: StrictInt = 0
    dp: StrictInt = 0
    plan: Optional[StrictStr] = None

    class Config:
        extra = Extra.forbid
        validate_all = True
        validate_assignment = True
        allow_mutation = False

    @validator("strategy")
    def _strategy(cls, value: str) -> str:
        return _choice("strategy", value, _strategies())

    @validator("schedule")
    def _schedule(cls, value: str) -> str:
        return _choice("schedule", value, (_AUTO,) + _schedules())

    @validator("reorder")
    def _reorder(cls, value: str) -> str:
        return _choice("reorder", value, _reorderings())

    @validator("tp", "pp", "dp")
    def _constraint(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"must be 0 (free) or a positive width, not {value}")
        return value

    @validator("plan", always=True)
    def _plan(cls, value: Optional[str], values: Dict[str, Any]) -> Optional[str]:
        strategy = values.get("strategy")
        if value is not None and strategy not in (None, "fixed"):
            raise ValueError(f"is only read with \"strategy\": \"fixed\" (the strategy is '{strategy}')")
        if value is None and strategy == "fixed":
            raise ValueError("is required with \"strategy\": \"fixed\" (a plan file, as `braid plan --format yaml` writes)")
        return value

    @validator("run", always=True)
    def _run(cls, value: Optional[str], values: Dict[str, Any]) -> Optional[str]:
        if values.get("enabled") and not value:
            raise ValueError("is required when \"enabled\" is true: the braid run file (model, cluster, batch sizes)")
        return value

    @property
    def schedule_name(self) -> Optional[str]:
        """The schedule to ask braid for: None for the plan's own."""
        return None if self.schedule == _AUTO else self.schedule


def _explain(error: ValidationError) -> str:
    known = list(BraidSection.__fields__)
    lines = []
    for e in error.errors():
        key = ".".join(str(part) for part in e["loc"])
        where = f"\"{SECTION}.{key}\""
        if e["type"] == "value_error.extra":
            lines.append(f"unknown key {where}{_did_you_mean(key, known)}; the section's keys are {', '.join(known)}")
        else:
            lines.append(f"{where}: {e['msg']}")
    return "DeepSpeed config: " + "; ".join(lines)


def parse_section(section: Optional[Mapping[str, Any]], base_dir: Optional[str] = None) -> BraidSection:
    """The ``"braid"`` section (a mapping, or None for an absent one) as a :class:`BraidSection`.

    ``base_dir``: where relative ``run`` and ``plan`` paths start (the DeepSpeed config's
    directory); None: the working directory. Raises :class:`braid.BadConfigError` naming
    every wrong key."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise section_error(f"DeepSpeed config: \"{SECTION}\" must be an object of keys, not {type(section).__name__}")
    try:
        parsed = BraidSection(**dict(section))
    except ValidationError as e:
        raise section_error(_explain(e)) from None
    paths = {}
    for key in ("run", "plan"):
        value = getattr(parsed, key)
        if value and base_dir and not os.path.isabs(value):
            paths[key] = os.path.normpath(os.path.join(base_dir, value))
    return parsed.copy(update=paths) if paths else parsed


def load_deepspeed_config(config: Union[str, "os.PathLike[str]", Mapping[str, Any]]) -> Tuple[Dict[str, Any], Optional[str]]:
    """The DeepSpeed config as a dict, and the directory relative paths in it start from
    (None for a dict). A path is read as JSON (hjson when installed, as DeepSpeed does)."""
    if isinstance(config, Mapping):
        return dict(config), None
    path = os.fspath(config)
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise braid.BraidIOError(braid.BraidIOError.status, f"cannot read the DeepSpeed config {path}: {e}") from None
    try:
        import hjson  # DeepSpeed's own reader

        data = hjson.loads(text)
    except ImportError:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise section_error(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    except Exception as e:  # hjson.HjsonDecodeError
        raise section_error(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, Mapping):
        raise section_error(f"{path}: a DeepSpeed config is a JSON object, not {type(data).__name__}")
    return dict(data), os.path.dirname(os.path.abspath(path))


@dataclass(frozen=True)
class RunBatch:
    """What braid's run fixes of DeepSpeed's batch keys.

    global_batch: samples per optimizer step (training.global_batch);
    microbatch: samples per microbatch and DP replica (training.microbatch);
    microbatches: microbatches per pipeline and step, once planned (None before);
    source: where the figures come from, for messages."""

    global_batch: int
    microbatch: int
    microbatches: Optional[int]
    source: str

    def expected(self, key: str) -> Optional[int]:
        return {
            "train_batch_size": self.global_batch,
            "train_micro_batch_size_per_gpu": self.microbatch,
            "gradient_accumulation_steps": self.microbatches,
        }[key]

    def braid_name(self, key: str) -> str:
        return {
            "train_batch_size": "training.global_batch",
            "train_micro_batch_size_per_gpu": "training.microbatch",
            "gradient_accumulation_steps": "microbatches per pipeline of the plan",
        }[key]


def run_batch(config: "braid.Config", plan: Optional["braid.Plan"] = None, run_path: str = "") -> RunBatch:
    """The batch figures of a braid run (``config.run_settings``), and with ``plan`` its
    microbatches per pipeline (``plan.to_json()["microbatches"]``, as `braid plan` prints)."""
    settings = config.run_settings
    microbatches = int(plan.to_json()["microbatches"]) if plan is not None else None
    where = run_path or getattr(config, "_source", "") or "the braid run"
    return RunBatch(int(settings.global_batch), int(settings.microbatch_size), microbatches, where)


def check_batch_keys(ds_config: Mapping[str, Any], batch: RunBatch) -> Dict[str, int]:
    """Checks DeepSpeed's batch keys against the braid run and returns all three as braid
    fixes them. A key that is absent or ``"auto"`` takes braid's value; a key given must
    equal it, else :class:`braid.BadConfigError` names the key and both values.
    gradient_accumulation_steps is checked once planned (``batch.microbatches`` set)."""
    resolved: Dict[str, int] = {}
    for key in BATCH_KEYS:
        expected = batch.expected(key)
        value = ds_config.get(key)
        if value is None or value == _AUTO:
            if expected is not None:
                resolved[key] = expected
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise section_error(f"DeepSpeed config: \"{key}\" must be an integer or \"auto\", not {value!r}")
        if expected is not None and value != expected:
            raise section_error(
                f"DeepSpeed config: \"{key}\" is {value}, but braid's run {batch.source} has "
                f"{batch.braid_name(key)} = {expected}; make them equal (or set \"{key}\": \"auto\")"
            )
        resolved[key] = value
    return resolved
