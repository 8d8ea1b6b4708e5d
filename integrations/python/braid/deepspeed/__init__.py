"""braid under DeepSpeed: a DeepSpeed config with a ``"braid"`` section trains the model
with braid's plan and program (the C ABI's host-driven mode).

    import braid.deepspeed
    engine, optimizer, _, scheduler = braid.deepspeed.initialize(
        config="ds_config.json",   # {"train_batch_size": ..., "braid": {"enabled": true, "run": ...}}
        modules={"image_encoder": [...], "text_encoder": [...]},   # each module's layers, in order
        loss_fn=...)
    loss = engine.train_batch(batch)

The engine is a DeepSpeed ``PipelineEngine`` that runs this rank's share of braid's
program: each braid instruction maps to a DeepSpeed ``PipeInstruction`` (plus
``BatchSync`` and ``EncoderTask``), over this rank's layers and braid's process groups;
DeepSpeed keeps its optimizer, precision, ZeRO-1 and LR scheduler.

This package imports without DeepSpeed (the config checks need only pydantic); the
engine checks the DeepSpeed release (:data:`DEEPSPEED_VERSION`) when it is imported.
"""

from typing import Any, Callable, Mapping, Optional, Union

from braid.deepspeed._version import DEEPSPEED_VERSION, DeepSpeedVersionError, check_deepspeed_version, deepspeed_version
from braid.deepspeed.config import (
    BATCH_KEYS,
    SECTION,
    BraidSection,
    RunBatch,
    check_batch_keys,
    load_deepspeed_config,
    parse_section,
    run_batch,
    section_error,
)

__all__ = [
    "DEEPSPEED_VERSION",
    "DeepSpeedVersionError",
    "check_deepspeed_version",
    "deepspeed_version",
    "SECTION",
    "BATCH_KEYS",
    "BraidSection",
    "RunBatch",
    "parse_section",
    "load_deepspeed_config",
    "run_batch",
    "check_batch_keys",
    "initialize",
]


def initialize(config: Union[str, Mapping[str, Any]], modules: Mapping[str, Any], loss_fn: Optional[Callable] = None,
               **kwargs: Any):
    """Builds the DeepSpeed engine that runs braid's program for this rank.

    ``config``: the DeepSpeed config (a path or a dict) with an enabled ``"braid"``
    section; ``modules``: each module of the run's model (its name in the model file) ->
    its layers, see :class:`braid.deepspeed.engine.BraidPipelineEngine`; ``loss_fn``: the
    model's loss. Other keyword arguments go to
    :func:`braid.deepspeed.engine.initialize`.

    Returns DeepSpeed's tuple ``(engine, optimizer, training_dataloader, lr_scheduler)``.
    The ``"braid"`` section is checked before DeepSpeed is imported: a wrong key is refused
    (:class:`braid.BadConfigError`, naming it) on any machine."""
    ds_config, base_dir = load_deepspeed_config(config)
    section = parse_section(ds_config.get(SECTION), base_dir)
    if not section.enabled:
        raise section_error(
            f"DeepSpeed config: \"{SECTION}.enabled\" is not true; braid.deepspeed.initialize trains with braid's "
            "plan only when it is (use deepspeed.initialize otherwise)")
    from braid.deepspeed.engine import initialize as _initialize

    return _initialize(ds_config, section, modules, loss_fn=loss_fn, **kwargs)
