"""braid for PyTorch: thin shims over braid's C ABI.

* :class:`ContrastiveLoss`: CLIP's loss over a torch.distributed group, on braid's tiled
  kernel (open_clip's local-loss, gather-with-grad contract).
* :class:`Groups`: torch.distributed groups made from braid's groups, in braid's order.
* :class:`ReorderingBatchSampler`: DistTrain's reordering as a DataLoader batch sampler.
* :class:`ProgramExecutor`: runs this rank's braid program over the host's modules.

``import braid.torch`` needs PyTorch; ``import braid`` does not.
"""

from .contrastive import ContrastiveLoss
from .executor import ProgramExecutor
from .groups import Groups
from .sampler import ReorderingBatchSampler

__all__ = ["ContrastiveLoss", "Groups", "ProgramExecutor", "ReorderingBatchSampler"]
