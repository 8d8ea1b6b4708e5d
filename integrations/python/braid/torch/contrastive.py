"""CLIP's contrastive loss over a torch.distributed group, computed by braid's tiled
kernel (braid_contrastive_forward / _backward: O(n x tile) memory, never N x N).

The contract is open_clip's ``ClipLoss(local_loss=True, gather_with_grad=True)``: each
rank passes its own normalised features and the exponentiated logit scale and gets its
local mean loss back. The backward hands each rank, for its rows, the sum of every
rank's gradient with respect to them (an all-reduce of the gathered rows' gradients,
then this rank's slice: torch 1.13's differentiable all-gather resolves sub-group ranks
as global ones, and gloo has no reduce-scatter). After DDP averages the parameters'
gradients over the ranks, they equal the single-device CLIP loss's.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .. import tensor as _tensor


def _gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=0)


def _problem(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor):
    """What is wrong with this rank's arguments (an exception to raise), or None."""
    if logit_scale.numel() != 1:
        return ValueError(f"ContrastiveLoss: logit_scale must hold one value, got shape {tuple(logit_scale.shape)}")
    if image.shape != text.shape:
        return ValueError(f"ContrastiveLoss: image features {tuple(image.shape)} and text features "
                          f"{tuple(text.shape)} differ in shape")
    for x, name in ((image, "image_features"), (text, "text_features")):
        if x.dim() != 2:
            return ValueError(f"ContrastiveLoss: {name} must be (rows, features), got shape {tuple(x.shape)}")
        if x.device.type not in ("cpu", "cuda"):
            return NotImplementedError(f"ContrastiveLoss: {name} is on {x.device}; braid runs on cpu and cuda tensors")
        if not x.dtype.is_floating_point:  # as torch's matmul of open_clip's loss: features are floats
            return TypeError(f"ContrastiveLoss: {name} must be floating point, got {x.dtype}")
    return None


def _float32_rows(x: torch.Tensor) -> torch.Tensor:
    """Dense float32 rows on the tensor's own device: host memory runs braid's host kernel,
    CUDA memory the CUDA plugin's, on the tensor's current stream."""
    return x.detach().to(torch.float32).contiguous()


def _check_every_rank(image: torch.Tensor, problem, group) -> None:
    """Every rank's (rows, features), or that it has none to give, compared before the
    all-gather: gloo aborts the process on tensors of different shapes, and a rank that
    raised alone would leave the others waiting. Every rank raises, the one at fault its
    own error."""
    on = image.device if image.device.type in ("cpu", "cuda") else torch.device("cpu")
    shape = (-1, -1) if problem is not None else tuple(image.shape)
    mine = torch.tensor(shape, dtype=torch.int64, device=on)
    shapes = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shapes, mine, group=group)
    if problem is not None:
        raise problem
    faulty = [k for k, s in enumerate(shapes) if int(s[0]) < 0]
    if faulty:
        raise ValueError(f"ContrastiveLoss: rank(s) {faulty} of the group passed arguments the loss cannot take "
                         "(their error says which)")
    if any(not torch.equal(s, mine) for s in shapes):
        raise ValueError("ContrastiveLoss: every rank of the group must pass image_features and text_features of "
                         "the same shape (rows, features), got " + ", ".join(str(tuple(s.tolist())) for s in shapes))


class _ContrastiveFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor, group, tile: int):
        problem = _problem(image, text, logit_scale)
        distributed = group is not None or (dist.is_available() and dist.is_initialized())
        if distributed:
            if dist.get_rank(group) < 0:
                raise ValueError(f"ContrastiveLoss: rank {dist.get_rank()} is not a member of its group; call the "
                                 "loss on the group's ranks only")
            _check_every_rank(image, problem, group)
        elif problem is not None:
            raise problem
        local_image = _float32_rows(image)
        local_text = _float32_rows(text)
        if distributed:
            all_image = _gather_rows(local_image, group)
            all_text = _gather_rows(local_text, group)
            offset = dist.get_rank(group) * local_image.shape[0]
        else:
            all_image, all_text, offset = local_image, local_text, 0
        scale = float(logit_scale)
        loss, stats = _tensor.contrastive_forward(local_image, local_text, all_image, all_text, scale, offset, tile)
        ctx.save_for_backward(local_image, local_text, all_image, all_text, stats)
        ctx.scale, ctx.offset, ctx.group, ctx.tile, ctx.distributed = scale, offset, group, tile, distributed
        ctx.dtypes = (image.dtype, text.dtype, logit_scale.dtype)
        ctx.scale_shape = logit_scale.shape
        ctx.scale_device = logit_scale.device
        return torch.tensor(loss, dtype=image.dtype, device=image.device)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        local_image, local_text, all_image, all_text, stats = ctx.saved_tensors
        n = local_image.shape[0]
        grad_local_image = torch.empty_like(local_image)
        grad_local_text = torch.empty_like(local_text)
        grad_all_image = torch.empty_like(all_image)
        grad_all_text = torch.empty_like(all_text)
        grad_scale = _tensor.contrastive_backward(local_image, local_text, all_image, all_text, ctx.scale, ctx.offset,
                                                  stats, float(grad_loss), grad_local_image, grad_local_text,
                                                  grad_all_image, grad_all_text, ctx.tile)
        if ctx.distributed:
            # Every rank's gradient of its own loss with respect to every gathered row, summed
            # over the group; this rank keeps its rows.
            both = torch.stack([grad_all_image, grad_all_text])
            dist.all_reduce(both, group=ctx.group)
            rows = slice(ctx.offset, ctx.offset + n)
            grad_image = grad_local_image + both[0, rows]
            grad_text = grad_local_text + both[1, rows]
        else:  # local and gathered rows are the same tensor
            grad_image = grad_local_image + grad_all_image
            grad_text = grad_local_text + grad_all_text
        image_dtype, text_dtype, scale_dtype = ctx.dtypes
        return (grad_image.to(image_dtype), grad_text.to(text_dtype),
                torch.full(ctx.scale_shape, grad_scale, dtype=scale_dtype, device=ctx.scale_device), None, None)


class ContrastiveLoss(torch.nn.Module):
    """CLIP's symmetric InfoNCE loss over the ranks of ``group`` (a torch.distributed
    group; None: the world, or one process when torch.distributed is not initialised).

    ``loss_fn(image_features, text_features, logit_scale)``: this rank's L2-normalised
    features (n, E), every rank the same n and E, and the exponentiated scale (a tensor of
    one value, whose gradient takes its shape); returns this rank's local mean loss. Every
    rank of ``group`` calls it, and only those. ``tile``: rows and columns per tile of
    braid's kernel (0: its default)."""

    def __init__(self, group=None, tile: int = 0) -> None:
        super().__init__()
        self.group = group
        self.tile = int(tile)

    def forward(self, image_features: torch.Tensor, text_features: torch.Tensor,
                logit_scale: torch.Tensor) -> torch.Tensor:
        if not torch.is_tensor(logit_scale):
            logit_scale = torch.tensor(float(logit_scale))
        return _ContrastiveFunction.apply(image_features, text_features, logit_scale, self.group, self.tile)
