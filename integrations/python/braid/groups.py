"""The process groups of a plan (braid/groups.h): per-module tp/dp/pp groups, where
each rank runs, cross-module links and contrastive batch-sync groups.

Rank r is device r of the plan. Groups are listed in one order, the same for every
rank and every handle made from the same plan, so hosts can create their communicators
collectively in list order (``torch.distributed.new_group`` for each, in turn).
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Tuple

from . import _loader
from . import _structs as S
from ._handles import OwnedHandle, count, int_arg, read
from .errors import invalid_argument
from .records import BatchSync, BatchSyncMember, Group, Holding, Link, LinkPair, RankInfo

__all__ = ["Groups"]


def _nested(lib: ctypes.CDLL, ptr: Any, index: int, record: Any, fn, struct: type, field: str, part: Any, part_fn,
            part_struct: type) -> Any:
    """``record`` of ``fn(ptr, index)`` with ``field``: the ``part`` records of
    ``part_fn(ptr, index, k)`` for each k below the info's ``<field>_count`` (field minus its s)."""
    info = read(lib, fn, struct, ptr, index)
    parts = tuple(part.from_struct(read(lib, part_fn, part_struct, ptr, index, k))
                  for k in range(getattr(info, field[:-1] + "_count")))
    return record.from_struct(info, **{field: parts})


class Groups(OwnedHandle):
    """The groups of ``plan`` on a world of ``world_size`` ranks (braid_groups_create;
    default: the plan's devices, which it must be). Also made by :meth:`Plan.groups`.
    Self-contained: it may outlive the plan. ``close()`` (or leaving a ``with`` block)
    frees it. Its answers never change, so they are read once and kept."""

    _destroy = "braid_groups_destroy"

    def __init__(self, plan: Any, world_size: Optional[int] = None) -> None:
        from .plan import Plan  # plan.py makes Groups too

        if not isinstance(plan, Plan):
            raise invalid_argument(f"Groups takes a braid.Plan, not {type(plan).__name__}")
        lib = plan._lib
        create = _loader.require(lib, "braid_groups_create")
        if world_size is None:
            world_size = plan.estimate.devices
        out = S.GroupsPtr()
        _loader._check(lib, create(plan._ptr(), int_arg("world_size", world_size), ctypes.byref(out)))
        self._lib = lib
        self._handle = out
        self._cache: Dict[str, Any] = {}

    def _kept(self, key: str, make):
        self._ptr()  # closed: refuse, as every other call does
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = make()
        return found

    @property
    def world_size(self) -> int:
        """The ranks of the world the groups were made for."""
        out = ctypes.c_int32()
        _loader._check(self._lib, self._lib.braid_groups_world_size(self._ptr(), ctypes.byref(out)))
        return out.value

    @property
    def groups(self) -> Tuple[Any, ...]:
        """Every group of every module along every axis, in braid's order, as
        :class:`~braid.records.Group` records: name ("vision.dp[pp=0,tp=1]"), module (a
        plan module index), axis ("tp", "dp" or "pp"), ranks (ascending)."""

        def make():
            lib, ptr = self._lib, self._ptr()
            n = count(lib, lib.braid_groups_count, ptr)
            return tuple(Group.from_struct(read(lib, lib.braid_groups_group, S.braid_group_info, ptr, i))
                         for i in range(n))

        return self._kept("groups", make)

    def rank(self, rank: int) -> Any:
        """Where ``rank`` runs, a :class:`~braid.records.RankInfo`: stage (program stage
        index), replica, tp_rank, and holdings (:class:`~braid.records.Holding`: module,
        stage (the module's own), tp, dp for each module stage it holds)."""
        lib, ptr = self._lib, self._ptr()
        rank = int_arg("rank", rank)
        return _nested(lib, ptr, rank, RankInfo, lib.braid_groups_rank, S.braid_rank_info, "holdings", Holding,
                       lib.braid_groups_holding, S.braid_holding)

    @property
    def links(self) -> Tuple[Any, ...]:
        """Cross-module links (producers before consumers), as :class:`~braid.records.Link`
        records: from_module, to_module, from_stage, to_stage, local (bool), and pairs
        (:class:`~braid.records.LinkPair`: from_replica, to_replica, from_ranks, to_ranks)."""

        def make():
            lib, ptr = self._lib, self._ptr()
            return tuple(_nested(lib, ptr, i, Link, lib.braid_groups_link, S.braid_link_info, "pairs", LinkPair,
                                 lib.braid_groups_link_pair, S.braid_link_pair)
                         for i in range(count(lib, lib.braid_groups_link_count, ptr)))

        return self._kept("links", make)

    @property
    def batch_syncs(self) -> Tuple[Any, ...]:
        """One group per contrastive loss, as :class:`~braid.records.BatchSync` records:
        name, ranks (each once, in member order), members
        (:class:`~braid.records.BatchSyncMember`: module, stage, replica, ranks)."""

        def make():
            lib, ptr = self._lib, self._ptr()
            return tuple(_nested(lib, ptr, i, BatchSync, lib.braid_groups_batch_sync, S.braid_batch_sync_info,
                                 "members", BatchSyncMember, lib.braid_groups_batch_sync_member,
                                 S.braid_batch_sync_member)
                         for i in range(count(lib, lib.braid_groups_batch_sync_count, ptr)))

        return self._kept("batch_syncs", make)

    def __repr__(self) -> str:
        if self.closed:
            return "<braid.Groups (closed)>"
        return f"<braid.Groups of {self.world_size} ranks, {len(self.groups)} groups>"
