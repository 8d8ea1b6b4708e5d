"""CLIP trained by DeepSpeed with braid's DistMM plan: each tower on its own ranks with its
own data parallelism, the towers joined by braid's contrastive batch-sync.

    python3 -m torch.distributed.run --nproc_per_node 4 examples/deepspeed_clip_distmm.py

The DeepSpeed config below is an ordinary one plus a "braid" section; braid plans
configs/runs/tiny-clip.yaml (2 ranks per tower, 4 microbatches of 16 per tower replica,
one contrastive group of 128) and the engine runs each rank's share of braid's program
as DeepSpeed PipeInstructions. The data are synthetic image/caption feature pairs (the
image a fixed noisy transform of its caption), so the loss falls as the towers learn
to match them. On CPU (gloo); see examples/README.md.
"""

import argparse
import json
import logging
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES, HIDDEN, EMBED = 16, 64, 32  # tiny-clip: hidden 64, embed_dim 32


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=os.path.join(ROOT, "configs", "runs", "tiny-clip.yaml"),
                        help="braid run file (model, cluster, batch sizes)")
    parser.add_argument("--schedule", default="auto", help="braid schedule: auto (the plan's own), batch-sync, "
                        "distmm-pipe, two-phase")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--print-every", type=int, default=10)
    return parser.parse_args()


def main():
    args = parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.nn.functional as F
    import deepspeed
    import braid.deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)

    class Layer(torch.nn.Module):
        """A tower layer: Linear + GELU; the tower's first reads its input from the batch,
        its last projects to the shared embedding and normalises."""

        def __init__(self, seed, d_in, d_out, source=None, last=False):
            super().__init__()
            torch.manual_seed(seed)  # every rank builds the same weights
            self.linear = torch.nn.Linear(d_in, d_out)
            self.source, self.last = source, last

        def forward(self, x, batch=None):
            if self.source is not None and x is None:
                x = batch[self.source]
            y = self.linear(x)
            return F.normalize(y, dim=-1) if self.last else F.gelu(y)

    # configs/models/tiny-clip.yaml: two towers of 2 layers each.
    modules = {
        "image_encoder": [Layer(1, FEATURES, HIDDEN, source="image"), Layer(2, HIDDEN, EMBED, last=True)],
        "text_encoder": [Layer(3, FEATURES, HIDDEN, source="text"), Layer(4, HIDDEN, EMBED, last=True)],
    }
    config = {
        "train_batch_size": 128,
        "train_micro_batch_size_per_gpu": 16,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 1000,
        "braid": {"enabled": True, "run": args.run, "strategy": "distmm", "schedule": args.schedule},
    }
    engine, _, _, _ = braid.deepspeed.initialize(config=config, modules=modules, logit_scale=10.0)
    rank = torch.distributed.get_rank()
    if rank == 0:
        print("DeepSpeed config:", json.dumps(config["braid"]))
        print(f"braid plan: {engine.braid_plan.strategy}, schedule {engine.braid_program.schedule}")
        for m in engine.braid_plan.modules:
            print(f"  {m.name}: {m.devices} ranks from {m.first_device}, dp {m.dp}, microbatch {m.microbatch_size}")
    kinds = {}
    mix = torch.randn(FEATURES, FEATURES, generator=torch.Generator().manual_seed(0))
    for step in range(args.steps):
        # The step's global batch, the same on every rank; braid picks each rank's samples.
        g = torch.Generator().manual_seed(1000 + step)
        text = torch.randn(engine.train_batch_size(), FEATURES, generator=g)
        image = text @ mix + 0.1 * torch.randn(text.shape, generator=g)
        loss = engine.train_batch({"image": image, "text": text})
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps}: loss {float(loss):.4f}", flush=True)
    for cmd in engine.braid_trace:
        kinds[type(cmd).__name__] = kinds.get(type(cmd).__name__, 0) + 1
    print(f"rank {rank}: {engine.executor.stage.name}, DP {engine.dp_world_size}, last step ran "
          + ", ".join(f"{n} x{c}" for n, c in kinds.items()), flush=True)


if __name__ == "__main__":
    main()
