"""A DataLoader batch sampler that orders each global batch with braid's reordering
(DistTrain): which data-parallel replica takes each sample (intra-microbatch balance)
and in which order a pipeline runs its microbatches (inter-microbatch). Every rank asks
the library the same question and gets the same answer, so no communication is needed.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import torch


class ReorderingBatchSampler(torch.utils.data.Sampler):
    """Yields this rank's microbatches (lists of dataset indices), in run order.

    ``plan``: the ``braid.Plan`` being trained; ``sizes(index)``: a sample's sizes, a
    mapping with any of ``image_resolution``, ``text_tokens``, ``audio_tokens``,
    ``generated_image_resolution``; ``module``: the plan module whose data-parallel
    replica ``replica`` this rank is (its stage's first module, ``0 <= replica < dp``);
    ``global_batch``: the plan's (``plan.config.run_settings.global_batch``: braid splits
    it into the plan's microbatches). ``reordering``: "none", "intra" or "intra_inter".
    Dataset order is ``range(len(dataset_size))``, shuffled with ``seed`` each epoch when
    ``shuffle``; a last partial global batch is dropped (braid balances whole batches)."""

    def __init__(self, plan, dataset_size: int, sizes: Callable[[int], Mapping[str, int]], module: str,
                 replica: int, global_batch: int, reordering: str = "intra_inter", shuffle: bool = False,
                 seed: int = 0) -> None:
        names = [m.name for m in plan.modules]
        if module not in names:
            raise ValueError(f"ReorderingBatchSampler: the plan has no module '{module}' (it has {', '.join(names)})")
        replicas = plan.modules[names.index(module)].dp
        if not 0 <= int(replica) < replicas:
            raise ValueError(f"ReorderingBatchSampler: replica {replica} is out of range: module '{module}' has "
                             f"{replicas} data-parallel replicas")
        planned = plan.config.run_settings.global_batch
        if int(global_batch) != planned:  # another batch would reorder into microbatches of another size
            raise ValueError(f"ReorderingBatchSampler: global_batch {global_batch} is not the plan's {planned}")
        self.plan, self.dataset_size, self.sizes = plan, int(dataset_size), sizes
        self.module, self.replica, self.global_batch = module, int(replica), int(global_batch)
        self.reordering, self.shuffle, self.seed, self.epoch = reordering, bool(shuffle), int(seed), 0
        if self.dataset_size >= self.global_batch:  # the first batch, asked now: a module braid places
            placed = _field(self._reorder(list(range(self.global_batch))), "ranks")
            if module not in placed:
                raise ValueError(f"ReorderingBatchSampler: braid's reordering places no samples on module '{module}' "
                                 f"of this plan (it places {', '.join(placed)}; a colocated encoder's tasks take the "
                                 "samples of the llm replica they share devices with): give one of those")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        batches = self.dataset_size // self.global_batch  # a last partial batch is dropped
        return batches * len(self.assignment(list(range(self.global_batch)))) if batches else 0

    def assignment(self, batch: Sequence[int]) -> List[List[int]]:
        """This rank's microbatches of the global batch ``batch`` (dataset indices), in run order."""
        answer = self._reorder(batch)
        ranks = _field(answer, "ranks")[self.module]
        # A sample's microbatch is its position in its pipeline's run, the inter-microbatch
        # order already applied (braid_reorder_microbatches): run order is ascending.
        microbatches = _field(answer, "microbatches")
        mine: Dict[int, List[int]] = {}
        for k, index in enumerate(batch):
            if ranks[k] == self.replica:
                mine.setdefault(microbatches[k], []).append(index)
        return [mine[m] for m in sorted(mine)]

    def _reorder(self, batch: Sequence[int]):
        columns: Dict[str, List[int]] = {}
        per_sample = [self.sizes(i) for i in batch]
        for key in ("image_resolution", "text_tokens", "audio_tokens", "generated_image_resolution"):
            if any(key in s for s in per_sample):
                columns[key] = [int(s[key]) for s in per_sample]
        return self.plan.reorder(reordering=self.reordering, **columns)

    def __iter__(self) -> Iterator[List[int]]:
        order = list(range(self.dataset_size))
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=g).tolist()
        for start in range(0, self.dataset_size - self.global_batch + 1, self.global_batch):
            yield from self.assignment(order[start:start + self.global_batch])


def _field(answer, name):
    return answer[name] if isinstance(answer, Mapping) else getattr(answer, name)
