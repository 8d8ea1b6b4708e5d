"""torch.distributed process groups made from braid's groups (braid_groups_*).

``dist.new_group`` is collective over the whole world: every rank must create every
group, in the same order, even those it is not in. braid lists its groups in one order
every rank agrees on, so building them here, in that order, is safe on every rank.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch.distributed as dist


class Groups:
    """Every group of a ``braid.Groups`` as a torch.distributed group.

    ``groups[name]`` is the group braid names ``name`` ("vision.dp[pp=0,tp=0]");
    :meth:`of` finds the group of a rank along an axis of a module; ``batch_syncs[i]``
    is the group the i-th contrastive batch-sync of braid's list gathers over. Groups
    this rank is not in are created too (torch requires it) but hold no communicator
    here."""

    def __init__(self, braid_groups, backend: Optional[str] = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("braid.torch.Groups: call torch.distributed.init_process_group first")
        if dist.get_world_size() != braid_groups.world_size:
            raise ValueError(f"braid.torch.Groups: torch.distributed has {dist.get_world_size()} ranks but braid's "
                             f"groups were built for a world of {braid_groups.world_size}")
        self.braid = braid_groups
        self.rank = dist.get_rank()
        self.groups: Dict[str, object] = {}
        self._ranks: Dict[str, Tuple[int, ...]] = {}
        self._by_axis: Dict[Tuple[int, str, int], str] = {}
        for g in braid_groups.groups:
            ranks = tuple(int(r) for r in g.ranks)
            self.groups[g.name] = dist.new_group(list(ranks), backend=backend)
            self._ranks[g.name] = ranks
            for r in ranks:
                self._by_axis[(g.module, g.axis, r)] = g.name
        self.batch_syncs: List[object] = []
        self.batch_sync_ranks: List[Tuple[int, ...]] = []
        for b in braid_groups.batch_syncs:
            ranks = tuple(int(r) for r in b.ranks)
            self.batch_syncs.append(dist.new_group(list(ranks), backend=backend))
            self.batch_sync_ranks.append(ranks)

    def name_of(self, module: int, axis: str, rank: Optional[int] = None) -> str:
        """The name of the ``axis`` ("tp", "dp", "pp") group of ``module`` (a plan module
        index) that holds ``rank`` (default: this rank)."""
        key = (module, axis, self.rank if rank is None else rank)
        if key not in self._by_axis:
            raise KeyError(f"rank {key[2]} holds no {axis} group of plan module {module}")
        return self._by_axis[key]

    def of(self, module: int, axis: str, rank: Optional[int] = None):
        """The torch group of :meth:`name_of`."""
        return self.groups[self.name_of(module, axis, rank)]

    def ranks(self, name: str) -> Tuple[int, ...]:
        """The global ranks of group ``name``, in braid's order."""
        return self._ranks[name]
