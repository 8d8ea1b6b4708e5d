"""Data reordering (DistTrain) for a host data loader (braid/data.h)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence

from . import _loader
from . import _structs as S
from . import vocab
from ._handles import int_arg, read
from .errors import ERR_UNSUPPORTED, invalid_argument
from .records import ReorderedBatch, ReorderInfo

__all__ = ["reorder"]

_SIZES = ("image_resolution", "text_tokens", "audio_tokens", "generated_image_resolution")


def reorder(plan: Any, image_resolution: Optional[Sequence[int]] = None, text_tokens: Optional[Sequence[int]] = None,
            audio_tokens: Optional[Sequence[int]] = None, generated_image_resolution: Optional[Sequence[int]] = None,
            module_costs: Optional[Sequence[Sequence[float]]] = None, reordering: str = "intra_inter",
            max_evaluations: int = 0) -> ReorderedBatch:
    """Where each sample of one global batch goes on ``plan`` (braid_reorder_*):
    DistTrain's intra-microbatch reordering (LPT over the data-parallel ranks, equal
    counts) and, with ``reordering="intra_inter"``, each pipeline's microbatches in their
    best 1F1B order. Deterministic: every rank gets the same answer.

    Give per-sample sizes (sequences of equal length; None: the run's nominal size), or
    ``module_costs``: per sample, one cost per plan module (any unit, ratios matter).
    ``reordering``: one of :func:`braid.vocab.reorderings`.

    Returns a :class:`~braid.records.ReorderedBatch`: ``info`` (samples, cells,
    pipeline_groups, microbatches per pipeline, cell_microbatch, straggler_before,
    straggler_after, evaluations), and per sample ``ranks`` (module name -> DP rank;
    modules off the grid, such as colocated encoders, are left out), ``cells`` and
    ``microbatches`` (schedule position); ``orders`` per pipeline group."""
    from .plan import Plan  # plan.py calls this module

    if not isinstance(plan, Plan):
        raise invalid_argument(f"reorder takes a braid.Plan, not {type(plan).__name__}")
    how = vocab.value_of(S.VOCABULARY_REORDERING, reordering, "reordering")
    columns = {"image_resolution": image_resolution, "text_tokens": text_tokens, "audio_tokens": audio_tokens,
               "generated_image_resolution": generated_image_resolution}
    lengths = {name: len(v) for name, v in columns.items() if v is not None}
    if module_costs is not None:
        lengths["module_costs"] = len(module_costs)
    if not lengths:
        raise invalid_argument("give per-sample sizes or module_costs")
    if len(set(lengths.values())) != 1:
        raise invalid_argument(f"per-sample lists differ in length: {lengths}")
    samples = next(iter(lengths.values()))
    names = [m.name for m in plan.modules]
    batch = S.new(S.braid_sample_batch)
    batch.samples = samples
    keep = []  # the arrays must live until the call returns
    for name, values in columns.items():
        if values is not None:
            array = (ctypes.c_int32 * samples)(*[int_arg(name, v) for v in values])
            keep.append(array)
            setattr(batch, name, ctypes.cast(array, ctypes.POINTER(ctypes.c_int32)))
    if module_costs is not None:
        flat = []
        for i, row in enumerate(module_costs):
            if len(row) != len(names):
                raise invalid_argument(f"module_costs[{i}] has {len(row)} costs; the plan has {len(names)} modules")
            flat.extend(float(c) for c in row)
        array = (ctypes.c_double * len(flat))(*flat)
        keep.append(array)
        batch.module_costs = ctypes.cast(array, ctypes.POINTER(ctypes.c_double))
    options = S.new(S.braid_reorder_options)
    options.version = S.REORDER_OPTIONS_VERSION
    options.reordering = how
    options.max_evaluations = int_arg("max_evaluations", max_evaluations, 0, 2**63 - 1)
    lib = plan._lib
    handle = S.ReorderPtr()
    _loader._check(lib, lib.braid_reorder_create(plan._ptr(), ctypes.byref(batch), ctypes.byref(options),
                                                 ctypes.byref(handle)))
    try:
        info = read(lib, lib.braid_reorder_info_get, S.braid_reorder_info, handle)
        per_sample = ctypes.c_int32 * samples
        cells, microbatches = per_sample(), per_sample()
        _loader._check(lib, lib.braid_reorder_cells(handle, cells, samples))
        _loader._check(lib, lib.braid_reorder_microbatches(handle, microbatches, samples))
        ranks = {}
        for m, name in enumerate(names):
            out = per_sample()
            status = lib.braid_reorder_ranks(handle, m, out, samples)
            if status == ERR_UNSUPPORTED:
                continue  # off the grid: a colocated encoder
            _loader._check(lib, status)
            ranks[name] = tuple(out)
        orders = []
        for g in range(info.pipeline_groups):
            out = (ctypes.c_int32 * info.microbatches)()
            _loader._check(lib, lib.braid_reorder_order(handle, g, out, info.microbatches))
            orders.append(tuple(out))
    finally:
        lib.braid_reorder_destroy(handle)
    return ReorderedBatch(info=ReorderInfo.from_struct(info), ranks=ranks, cells=tuple(cells),
                          microbatches=tuple(microbatches), orders=tuple(orders))
