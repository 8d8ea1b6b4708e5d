"""The PyTorch peer of bench/contrastive_bench.cpp: open_clip's ClipLoss, forward + backward.

contrastive_bench writes the raw (unnormalised) embeddings to DIR/image.bin and DIR/text.bin
(float32, N x D, row-major) and runs this script with the same sizes and thread count. It
computes, as open_clip does (open_clip/loss.py, ClipLoss):

  single device: logits = exp(t) * normalize(image) @ normalize(text).T,
                 loss = (CE(logits, labels) + CE(logits.T, labels)) / 2
                 (open_clip computes the text logits with a second GEMM when world_size is 1,
                 and takes logits.T for gathered features without local_loss: the peer uses
                 the cheaper form)
  one rank of R: rows [o, o + n) against all N gathered rows (local_loss=True,
                 gather_with_grad=True); the gathered tensor holds this rank's normalised rows
                 (so their gradient flows back to them) and the other ranks' as constants.

It writes loss, d loss/dt, d loss/d image and d loss/d text of each (float32) to
DIR/single.bin and DIR/local.bin for the bench to compare with braid's, and prints one line:
  peer single_median_s=<s> local_median_s=<s> torch=<version> threads=<T> peak_mib=<single> <local>
With --device cuda everything runs on the GPU (TF32 off unless --tf32, as braid's cuBLAS handles), each
step ends with a synchronize, and peak_mib is torch.cuda.max_memory_allocated beyond the
inputs; on the CPU it is 0.
"""

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


DEVICE = torch.device("cpu")


def read(path, rows, dim):
    return torch.from_numpy(np.fromfile(path, dtype=np.float32).reshape(rows, dim)).to(DEVICE)


def write(path, loss, dt, *grads):
    with open(path, "wb") as f:
        np.array([loss.item(), dt.item()], dtype=np.float32).tofile(f)
        for g in grads:
            g.detach().contiguous().cpu().numpy().astype(np.float32).tofile(f)


def single_step(image, text, t):
    """open_clip ClipLoss with world_size 1; fills .grad of image, text and t."""
    image_n = F.normalize(image, dim=-1)
    text_n = F.normalize(text, dim=-1)
    logit_scale = t.exp()
    logits_per_image = logit_scale * image_n @ text_n.T
    logits_per_text = logits_per_image.T
    labels = torch.arange(image.shape[0], device=DEVICE)
    loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
    loss.backward()
    return loss


def local_step(image, text, t, others_image, others_text, offset):
    """One rank's ClipLoss(local_loss=True, gather_with_grad=True): image and text are its rows."""
    n = image.shape[0]
    image_n = F.normalize(image, dim=-1)
    text_n = F.normalize(text, dim=-1)
    # What torch.distributed.nn.all_gather returns here: every rank's rows, this one's with grad.
    all_image = torch.cat([others_image[:offset], image_n, others_image[offset:]])
    all_text = torch.cat([others_text[:offset], text_n, others_text[offset:]])
    logit_scale = t.exp()
    logits_per_image = logit_scale * image_n @ all_text.T
    logits_per_text = logit_scale * text_n @ all_image.T
    labels = torch.arange(n, device=DEVICE) + offset
    loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
    loss.backward()
    return loss


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(step, leaves, reps, warmup):
    """Median wall time of step() over reps runs after warmup runs; returns (median, last
    loss, peak MiB allocated beyond what was allocated before)."""
    times = []
    loss = None
    sync()
    base = torch.cuda.memory_allocated() if DEVICE.type == "cuda" else 0
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + reps):
        for leaf in leaves:
            leaf.grad = None
        start = time.perf_counter()
        loss = step()
        sync()
        took = time.perf_counter() - start
        if i >= warmup:
            times.append(took)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if DEVICE.type == "cuda" else 0.0
    return statistics.median(times), loss, peak


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--t", type=float, required=True, help="logit scale parameter: scale = exp(t)")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--tf32", action="store_true", help="TF32 tensor-core matmuls (cuda), as braid's BRAID_CUDA_TF32=1")
    a = p.parse_args()
    global DEVICE
    DEVICE = torch.device(a.device)
    if DEVICE.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32  # as braid's cuBLAS handles: strict fp32 unless --tf32
    if a.n % a.ranks != 0 or not 0 <= a.rank < a.ranks:
        sys.exit(f"contrastive_peer: rank {a.rank} of {a.ranks} does not split {a.n} rows")
    torch.set_num_threads(a.threads)

    raw_image = read(f"{a.dir}/image.bin", a.n, a.dim)
    raw_text = read(f"{a.dir}/text.bin", a.n, a.dim)
    image = raw_image.clone().requires_grad_()
    text = raw_text.clone().requires_grad_()
    t = torch.tensor(a.t, dtype=torch.float32, device=DEVICE, requires_grad=True)
    single_s, loss, single_peak = timed(lambda: single_step(image, text, t), [image, text, t], a.reps, a.warmup)
    write(f"{a.dir}/single.bin", loss, t.grad, image.grad, text.grad)

    n = a.n // a.ranks
    offset = a.rank * n
    with torch.no_grad():  # the other ranks' rows, normalised on their ranks
        others_image = torch.cat([F.normalize(raw_image[:offset], dim=-1), F.normalize(raw_image[offset + n :], dim=-1)])
        others_text = torch.cat([F.normalize(raw_text[:offset], dim=-1), F.normalize(raw_text[offset + n :], dim=-1)])
    local_image = raw_image[offset : offset + n].clone().requires_grad_()
    local_text = raw_text[offset : offset + n].clone().requires_grad_()
    t_local = torch.tensor(a.t, dtype=torch.float32, device=DEVICE, requires_grad=True)
    local_s, loss, local_peak = timed(
        lambda: local_step(local_image, local_text, t_local, others_image, others_text, offset),
        [local_image, local_text, t_local],
        a.reps,
        a.warmup,
    )
    write(f"{a.dir}/local.bin", loss, t_local.grad, local_image.grad, local_text.grad)
    print(f"peer single_median_s={single_s:.6f} local_median_s={local_s:.6f} torch={torch.__version__} "
          f"threads={torch.get_num_threads()} peak_mib={single_peak:.1f} {local_peak:.1f}")


if __name__ == "__main__":
    main()
