"""A LLaVA-style tiny multimodal LLM (vision encoder -> projector -> llm) trained by
DeepSpeed with braid's DistTrain or Optimus plan.

    python3 -m torch.distributed.run --nproc_per_node 4 examples/deepspeed_mllm.py --strategy disttrain
    python3 -m torch.distributed.run --nproc_per_node 4 examples/deepspeed_mllm.py --strategy optimus

braid plans configs/runs/tiny-mllm-4px.yaml. DistTrain (with --tp 1 --dp 1, the default)
puts vision + projector on ranks 0-1, whose activations fan in to one llm replica
pipelined over ranks 2-3. Optimus puts every module on every rank and runs the vision's
work as encoder tasks that braid's bubble scheduler placed in the llm pipeline's
bubbles. The data are synthetic: each image is 4 patches, and the caption's first token
is read off the image, so the loss falls below chance only if the llm learns to use the
vision encoder's output. On CPU (gloo); see examples/README.md.
"""

import argparse
import logging
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCHES, PATCH, HIDDEN, VOCAB, TOKENS = 4, 12, 64, 32, 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", choices=("disttrain", "optimus"), default="disttrain")
    parser.add_argument("--run", default=os.path.join(ROOT, "configs", "runs", "tiny-mllm-4px.yaml"))
    parser.add_argument("--tp", type=int, default=1, help="braid planner constraint on the llm (0: free)")
    parser.add_argument("--pp", type=int, default=0, help="braid planner constraint on the llm (0: free)")
    parser.add_argument("--dp", type=int, default=None,
                        help="braid planner constraint on the llm (0: free; default 1 for disttrain, 0 for optimus)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
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

    class Dense(torch.nn.Module):
        def __init__(self, seed, d_in, d_out, gelu=True, source=None):
            super().__init__()
            torch.manual_seed(seed)  # every rank builds the same weights
            self.linear = torch.nn.Linear(d_in, d_out)
            self.gelu, self.source = gelu, source

        def forward(self, x, batch=None):
            if self.source is not None and x is None:
                x = batch[self.source]
            y = self.linear(x)
            return F.gelu(y) if self.gelu else y

    class LlmInput(torch.nn.Module):
        """The llm's first layer: the projected image tokens, then the caption's embeddings."""

        def __init__(self, seed):
            super().__init__()
            torch.manual_seed(seed)
            self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
            self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

        def forward(self, image_tokens, batch):
            return F.gelu(self.linear(torch.cat([image_tokens, self.embed(batch["text"])], dim=1)))

    def caption_loss(logits, batch):
        """Per-sample loss: each caption token predicted from the position before it."""
        predicted = logits[:, PATCHES - 1:-1, :]
        ce = F.cross_entropy(predicted.reshape(-1, VOCAB), batch["text"].reshape(-1), reduction="none")
        return ce.view(batch["text"].shape).mean(dim=1)

    # configs/models/tiny-mllm-4px.yaml: vision, projector and llm of 2 layers each.
    modules = {
        "vision": [Dense(1, PATCH, HIDDEN, source="image"), Dense(2, HIDDEN, HIDDEN)],
        "projector": [Dense(3, HIDDEN, HIDDEN), Dense(4, HIDDEN, HIDDEN, gelu=False)],
        "llm": [LlmInput(5), Dense(6, HIDDEN, VOCAB, gelu=False)],
    }
    dp = args.dp if args.dp is not None else (1 if args.strategy == "disttrain" else 0)
    config = {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "torch_adam": True}},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "braid": {"enabled": True, "run": args.run, "strategy": args.strategy, "tp": args.tp, "pp": args.pp,
                  "dp": dp},
    }
    engine, _, _, _ = braid.deepspeed.initialize(config=config, modules=modules, loss_fn=caption_loss)
    rank = torch.distributed.get_rank()
    if rank == 0:
        print(f"braid plan: {engine.braid_plan.strategy}, schedule {engine.braid_program.schedule}")
        for m in engine.braid_plan.modules:
            print(f"  {m.name}: {m.devices} ranks from {m.first_device}, tp {m.tp} pp {m.pp} dp {m.dp}, "
                  f"microbatch {m.microbatch_size}")
    for step in range(args.steps):
        # The step's global batch, the same on every rank; braid picks each rank's samples.
        g = torch.Generator().manual_seed(1000 + step)
        image = torch.randn(engine.train_batch_size(), PATCHES, PATCH, generator=g)
        # The caption: its first token is the strongest feature of the last patch (what the
        # llm sees where it predicts it: these layers mix no positions), each next token a
        # fixed function of the one before.
        tokens = [image[:, -1, :].argmax(dim=-1)]
        for _ in range(TOKENS - 1):
            tokens.append((tokens[-1] * 3 + 1) % VOCAB)
        text = torch.stack(tokens, dim=1)
        loss = engine.train_batch({"image": image, "text": text})
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps}: loss {float(loss):.4f}", flush=True)
    kinds = {}
    for cmd in engine.braid_trace:
        kinds[type(cmd).__name__] = kinds.get(type(cmd).__name__, 0) + 1
    print(f"rank {rank}: {engine.executor.stage.name}, DP {engine.dp_world_size}, last step ran "
          + ", ".join(f"{n} x{c}" for n, c in kinds.items()), flush=True)


if __name__ == "__main__":
    main()
