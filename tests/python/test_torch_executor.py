"""braid.torch.ProgramExecutor runs each rank's slice of braid's program over PyTorch
layers on real gloo processes, and reproduces single-process training: with SGD, every
parameter after 5 steps equals a single-process reference (<= 1e-5), and every rank
executed exactly its instructions of the program.

Layouts, on 4 processes: DistMM (two CLIP towers on their own ranks, joined by a
contrastive batch-sync), DistTrain (vision + projector on their ranks, the llm on
others), Optimus (encoder and llm on every rank, the encoder run by the program's
encoder tasks) and Megatron (one grid for the whole model).

Environment: BRAID_LIBRARY, BRAID_SOURCE_DIR, PYTHONPATH with integrations/python.
"""

import os
import tempfile
import unittest

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    REASON = ""
except ImportError as e:  # pragma: no cover - depends on the machine
    torch = None
    REASON = f"PyTorch is not importable ({e}); install python3-torch"

SOURCE_DIR = os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
STEPS, LR, TOLERANCE = 5, 0.5, 1e-5
IMAGE_PATCHES, PATCH, HIDDEN, TOKENS, VOCAB = 4, 6, 8, 3, 5
LOGIT_SCALE = 3.0


class Linear(torch.nn.Module if torch else object):
    """A layer with its own seed, so every process builds the same weights for it."""

    def __init__(self, seed, d_in, d_out, activate=True, source=None, normalize=False):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(d_in, d_out)
        self.activate, self.source, self.normalize = activate, source, normalize

    def forward(self, x, batch=None):
        if self.source is not None:  # a module's first layer reads its own input
            x = batch[self.source] if x is None else x
        y = self.linear(x)
        y = F.gelu(y) if self.activate else y
        return F.normalize(y, dim=-1) if self.normalize else y


class LlmInput(torch.nn.Module if torch else object):
    """The llm's first layer: projected image tokens followed by the caption's embeddings."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.linear = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, image_tokens, batch):
        x = torch.cat([image_tokens, self.embed(batch["text"])], dim=1)
        return F.gelu(self.linear(x))


def clip_layers():
    return {
        "image_encoder": [Linear(11, PATCH, HIDDEN, source="image"), Linear(12, HIDDEN, HIDDEN, False, normalize=True)],
        "text_encoder": [Linear(21, PATCH, HIDDEN, source="text"), Linear(22, HIDDEN, HIDDEN, False, normalize=True)],
    }


def mllm_layers():
    return {
        "vision": [Linear(31, PATCH, HIDDEN, source="image"), Linear(32, HIDDEN, HIDDEN)],
        "projector": [Linear(41, HIDDEN, HIDDEN, source="none"), Linear(42, HIDDEN, HIDDEN, False)],
        "llm": [LlmInput(51), Linear(52, HIDDEN, VOCAB, False)],
    }


def dataset(kind, size):
    g = torch.Generator().manual_seed(5)
    if kind == "clip":
        return {"image": torch.randn(size, PATCH, generator=g), "text": torch.randn(size, PATCH, generator=g)}
    return {"image": torch.randn(size, IMAGE_PATCHES, PATCH, generator=g),
            "text": torch.randint(0, VOCAB, (size, TOKENS), generator=g)}


def caption_loss(logits, batch):
    """Per-sample loss: mean cross-entropy of the caption tokens (read from the image tokens' end)."""
    text_logits = logits[:, IMAGE_PATCHES - 1:-1, :]
    ce = F.cross_entropy(text_logits.reshape(-1, VOCAB), batch["text"].reshape(-1), reduction="none")
    return ce.view(batch["text"].shape).mean(dim=1)


def clip_loss(image, text):
    logits = LOGIT_SCALE * image @ text.t()
    labels = torch.arange(logits.shape[0])
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def reference(kind, global_batch):
    """Single-process SGD on the whole model and the whole batch."""
    layers = clip_layers() if kind == "clip" else mllm_layers()
    params = [p for module in layers.values() for layer in module for p in layer.parameters()]
    optimizer = torch.optim.SGD(params, lr=LR)
    data = dataset(kind, global_batch)
    for _ in range(STEPS):
        optimizer.zero_grad()
        if kind == "clip":
            image = layers["image_encoder"][1](layers["image_encoder"][0](None, data))
            text = layers["text_encoder"][1](layers["text_encoder"][0](None, data))
            loss = clip_loss(image, text)
        else:
            x = None
            for name in ("vision", "projector", "llm"):
                for i, layer in enumerate(layers[name]):
                    x = layer(x, data) if i == 0 else layer(x)
            loss = caption_loss(x, data).mean()
        loss.backward()
        optimizer.step()
    return {f"{name}.{i}.{n}": p.detach().clone() for name, module in layers.items()
            for i, layer in enumerate(module) for n, p in layer.named_parameters()}


def worker(rank, world, init_file, run, strategy, kind, results):
    import braid
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", run))
    plan = config.plan(strategy=strategy)
    program = plan.program()
    groups = bt.Groups(plan.groups(world))
    layers = clip_layers() if kind == "clip" else mllm_layers()
    executor = bt.ProgramExecutor(program, groups, layers, loss_fn=caption_loss, logit_scale=LOGIT_SCALE,
                                  make_optimizer=lambda params: torch.optim.SGD(params, lr=LR))
    data = dataset(kind, executor.global_batch)
    executed = None
    for _ in range(STEPS):
        out = executor.step(lambda indices: {k: v[indices] for k, v in data.items()})
        executed = out["executed"]
    owned = {}
    for part in executor.stage.parts:
        name = plan.modules[part.module].name
        for i in range(part.first_layer, part.first_layer + part.layer_count):
            for n, p in layers[name][i].named_parameters():
                owned[f"{name}.{i}.{n}"] = p.detach().clone()
    results[rank] = {"params": owned, "executed": [i._asdict() for i in executed],
                     "planned": [i._asdict() for i in program.rank(rank).instructions],
                     "global_batch": executor.global_batch}
    dist.barrier()
    dist.destroy_process_group()


@unittest.skipIf(torch is None, REASON)
class ExecutorReproducesOneProcess(unittest.TestCase):

    def train(self, run, strategy, kind, world=4):
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), run, strategy, kind, results), nprocs=world,
                     join=True)
            results = dict(results)
        want = reference(kind, results[0]["global_batch"])
        seen = set()
        for rank, got in results.items():
            self.assertEqual(got["executed"], got["planned"], f"rank {rank} executed other instructions")
            for name, value in got["params"].items():
                err = float((value - want[name]).abs().max())
                self.assertLessEqual(err, TOLERANCE, f"rank {rank}: {name} differs by {err}")
                seen.add(name)
        self.assertEqual(seen, set(want), "some parameters were trained by no rank")

    def test_distmm_clip_towers_with_batch_sync(self):
        self.train("tiny-clip.yaml", "distmm", "clip")

    def test_disttrain_vision_projector_then_llm(self):
        self.train("tiny-mllm-4px.yaml", "disttrain", "mllm")

    def test_optimus_colocated_encoder_tasks(self):
        self.train("tiny-mllm-4px.yaml", "optimus", "mllm")

    def test_megatron_one_grid(self):
        self.train("tiny-mllm-4px.yaml", "megatron", "mllm")


if __name__ == "__main__":
    unittest.main(verbosity=2)
