"""Typed, immutable results: one record type per C struct the library fills, with the
struct's field names, built generically from the ctypes mirror (:mod:`braid._structs`).

Reading a struct: ``struct_size`` (and a settings struct's ``version``) is left out;
``const char*`` becomes ``str``; a pointer and its count become one tuple under the
pointer's name (the count is left out); fixed arrays (``bubbles_s``) become tuples, indexed by the C enum (see
:func:`braid.vocab.by_cause`); enum fields become their names from the library's
vocabulary (``Instruction.opcode == "Forward"``); 0/1 flags become bool. Some records
carry what further calls return in place of a count (``StageInfo.parts`` for
``part_count``, ``RankInfo.holdings`` for ``holding_count``, ...).

Records are frozen dataclasses: compare them with ``==``, copy with
``dataclasses.replace``, and turn them into JSON-ready dicts with ``_asdict()``.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from . import _structs as S
from . import vocab

__all__ = [
    "Record",
    "RunSettings",
    "ModuleInfo",
    "Estimate",
    "Alternative",
    "StageInfo",
    "StagePart",
    "Instruction",
    "RankProgram",
    "SimulationResult",
    "StageResult",
    "Group",
    "RankInfo",
    "Holding",
    "Link",
    "LinkPair",
    "BatchSync",
    "BatchSyncMember",
    "ReorderInfo",
    "ReorderedBatch",
    "BubbleReport",
    "record_type",
]


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value._asdict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Record:
    """Base of every record type (a frozen dataclass)."""

    __slots__ = ()

    def _asdict(self) -> Dict[str, Any]:
        """The record as a dict of plain values (nested records as dicts, tuples as
        lists), ready for json.dumps."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _count_field(struct: type, pointer: str, names: Sequence[str]) -> str:
    override = getattr(struct, "_counts_", {}).get(pointer)
    if override:
        return override
    for candidate in (pointer + "_count", pointer[:-1] + "_count" if pointer.endswith("s") else None):
        if candidate and candidate in names:
            return candidate
    raise TypeError(f"{struct.__name__}.{pointer}: no count field for the pointer")


def _layout(struct: type, replaces: Mapping[str, Optional[str]]):
    """(record fields in order, how to read each) for a ctypes struct."""
    names = [n for n, _ in struct._fields_]
    types = dict(struct._fields_)
    counts = {}
    for name, ctype in struct._fields_:
        if isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer):
            counts[name] = _count_field(struct, name, names)
    skipped = {"struct_size", "version"} | set(counts.values()) | {c for c in replaces.values() if c}
    fields = []
    for name in names:
        if name in skipped:
            continue
        ctype = types[name]
        if name in counts:
            fields.append((name, "pointer", counts[name]))
        elif isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
            fields.append((name, "array", None))
        elif ctype is ctypes.c_char_p:
            fields.append((name, "text", None))
        elif name in getattr(struct, "_enums_", {}):
            fields.append((name, "enum", struct._enums_[name]))
        elif name in getattr(struct, "_bools_", ()):
            fields.append((name, "bool", None))
        else:
            fields.append((name, "value", None))
    return fields


def record_type(struct: type, name: str, doc: str, extra: Optional[Mapping[str, Optional[str]]] = None) -> type:
    """A frozen dataclass named ``name`` mirroring ctypes ``struct``.

    ``extra``: fields added after the struct's (values given to ``from_struct``), each
    with the count field of the struct it stands for (left out), or None."""
    extra = dict(extra or {})
    layout = _layout(struct, extra)
    names = [f for f, _, _ in layout] + list(extra)
    cls = dataclasses.make_dataclass(name, names, bases=(Record,), frozen=True, namespace={"__doc__": doc})
    cls.__module__ = __name__
    cls._struct = struct
    cls._layout = layout

    def from_struct(klass, value: ctypes.Structure, **extras: Any):
        out = {}
        for field, kind, arg in klass._layout:
            raw = getattr(value, field)
            if kind == "pointer":
                n = getattr(value, arg)
                out[field] = tuple(raw[k] for k in range(n)) if raw and n else ()
            elif kind == "array":
                out[field] = tuple(raw)
            elif kind == "text":
                out[field] = "" if raw is None else raw.decode("utf-8", errors="replace")
            elif kind == "enum":
                out[field] = vocab.name_of(arg, raw)
            elif kind == "bool":
                out[field] = bool(raw)
            else:
                out[field] = raw
        out.update(extras)
        return klass(**out)

    cls.from_struct = classmethod(from_struct)
    return cls


RunSettings = record_type(
    S.braid_run_settings, "RunSettings",
    "A run's training settings and nominal input sizes (braid_run_settings): each field names its "
    "run-file key in braid.h. precision, recompute and attention are names ('bf16', 'full', 'flash').")
ModuleInfo = record_type(
    S.braid_module_info, "ModuleInfo",
    "A module's placement in a plan (braid_module_info): name, role, devices, tp, pp, dp, first_device, "
    "first_stage, microbatch_size, layers_per_stage (a tuple of pp ints).")
Estimate = record_type(
    S.braid_estimate, "Estimate",
    "The cost model's estimate of a plan (braid_estimate).")
Alternative = record_type(
    S.braid_alternative, "Alternative",
    "A strategy tried by auto (braid_alternative): strategy (a name), feasible (bool), "
    "iteration_time_s (0 when not feasible), reason.")
StagePart = record_type(
    S.braid_stage_part, "StagePart",
    "A range of layers of one module stage that a program stage runs (braid_stage_part).")
StageInfo = record_type(
    S.braid_stage_info, "StageInfo",
    "A program stage (braid_stage_info): name, module (-1 for a global stage of several), replicas, "
    "devices_per_replica, first_device, device_stride, depth, instruction_count, prev and next "
    "(stage indices), gradient_scale, and parts (StagePart records).",
    extra={"parts": "part_count"})
Instruction = record_type(
    S.braid_instruction, "Instruction",
    "One instruction of a stage (braid_instruction): opcode (its name, one of braid.vocab.opcodes()), "
    "microbatch, chunk, peer, group, unit, flags (FLAG_* bits).")
RankProgram = record_type(
    S.braid_program_rank_info, "RankProgram",
    "What one rank runs (braid_program_rank_info): stage, replica, tp_rank, and its instructions "
    "(Instruction records; the stage's).",
    extra={"instructions": "instruction_count"})
SimulationResult = record_type(
    S.braid_simulation_result, "SimulationResult",
    "A simulated step (braid_simulation_result); bubbles_s is indexed by bubble cause "
    "(braid.vocab.by_cause turns it into a dict).")
StageResult = record_type(
    S.braid_stage_result, "StageResult",
    "One stage of a simulated step (braid_stage_result).")
Group = record_type(
    S.braid_group_info, "Group",
    "A process group of one module along one axis (braid_group_info): name, module (a plan module "
    "index), axis ('tp', 'dp' or 'pp'), ranks (ascending).")
Holding = record_type(
    S.braid_holding, "Holding",
    "What a rank holds of one module (braid_holding): module, stage (the module's own), tp, dp.")
RankInfo = record_type(
    S.braid_rank_info, "RankInfo",
    "Where a rank runs (braid_rank_info): stage, replica, tp_rank, and holdings (Holding records).",
    extra={"holdings": "holding_count"})
LinkPair = record_type(
    S.braid_link_pair, "LinkPair",
    "One (producer replica, consumer replica) pair of a link (braid_link_pair), with their ranks.")
Link = record_type(
    S.braid_link_info, "Link",
    "A cross-module link (braid_link_info): from_module, to_module, from_stage, to_stage, local, and "
    "pairs (LinkPair records).",
    extra={"pairs": "pair_count"})
BatchSyncMember = record_type(
    S.braid_batch_sync_member, "BatchSyncMember",
    "One (tower, replica) member of a batch-sync group (braid_batch_sync_member).")
BatchSync = record_type(
    S.braid_batch_sync_info, "BatchSync",
    "A contrastive batch-sync group (braid_batch_sync_info): name, ranks, members (BatchSyncMember "
    "records).",
    extra={"members": "member_count"})
ReorderInfo = record_type(
    S.braid_reorder_info, "ReorderInfo",
    "The shape of a reordered batch (braid_reorder_info): samples, cells, pipeline_groups, "
    "microbatches (per pipeline), cell_microbatch, straggler_before, straggler_after, evaluations.")
BubbleReport = record_type(
    S.braid_bubble_report, "BubbleReport",
    "What the bubble scheduler found (braid_bubble_report); bubbles_before_s and bubbles_after_s are "
    "indexed by bubble cause.")


@dataclasses.dataclass(frozen=True)
class ReorderedBatch(Record):
    """One global batch assigned to a plan's ranks and microbatches (braid_reorder_*).

    ``info``: the :class:`ReorderInfo`; per sample, in batch order: ``ranks`` (plan module
    name -> each sample's DP rank in that module, braid_reorder_ranks; modules off the
    grid, such as colocated encoders, are left out), ``cells`` (braid_reorder_cells) and
    ``microbatches`` (the position in its pipeline's schedule, braid_reorder_microbatches);
    ``orders``: per pipeline group, the microbatch run k-th (braid_reorder_order)."""

    info: Any
    ranks: Dict[str, Tuple[int, ...]]
    cells: Tuple[int, ...]
    microbatches: Tuple[int, ...]
    orders: Tuple[Tuple[int, ...], ...]

    __hash__ = None  # ranks is a dict
