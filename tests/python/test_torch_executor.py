"""braid.torch.ProgramExecutor runs each rank's slice of braid's program over PyTorch
layers on real gloo processes, and reproduces single-process training: with SGD, every
parameter after 5 steps equals a single-process reference (<= 1e-5), and every rank
executed exactly its instructions of the program.

Layouts, on 4 processes: DistMM (two CLIP towers on their own ranks, joined by a
contrastive batch-sync; one and two contrastive groups per step), DistTrain (vision +
projector on their ranks, the llm on others; and 2 vision replicas fanning in to an llm
of 2 pipeline stages), Optimus (encoder and llm on every rank, the encoder run by the program's
encoder tasks) and Megatron (one grid for the whole model).

Environment: BRAID_LIBRARY, BRAID_SOURCE_DIR, PYTHONPATH with integrations/python.
"""

import os
import tempfile
import unittest

from _models import LOGIT_SCALE, caption_loss, clip_layers, clip_loss, dataset, dist, mllm_layers, mp, torch
from _models import TORCH_REASON as REASON

SOURCE_DIR = os.environ.get("BRAID_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
STEPS, LR, TOLERANCE = 5, 0.5, 1e-5

# DistMM with towers of unequal DP widths (image 2 replicas, text 1) on 3 ranks.
UNEQUAL_TOWERS = """\
strategy: distmm
layout: branches
devices: 3
schedule: batch-sync
virtual_stages: 1
modules:
  - {name: image_encoder, role: encoder, tp: 1, pp: 1, dp: 2, first_device: 0, devices: 2, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [2]}
  - {name: text_encoder, role: encoder, tp: 1, pp: 1, dp: 1, first_device: 2, devices: 1, first_stage: 0,
     microbatch_size: 16, layers_per_stage: [2]}
"""
DATA_SEED = 5


def reference(kind, global_batch, contrastive_batch=0):
    """Single-process SGD on the whole model and the whole batch (CLIP: the mean of its
    contrastive groups' losses, group g being samples [g C, (g+1) C))."""
    layers = clip_layers() if kind == "clip" else mllm_layers("none")
    params = [p for module in layers.values() for layer in module for p in layer.parameters()]
    optimizer = torch.optim.SGD(params, lr=LR)
    data = dataset(kind, global_batch, DATA_SEED)
    for _ in range(STEPS):
        optimizer.zero_grad()
        if kind == "clip":
            image = layers["image_encoder"][1](layers["image_encoder"][0](None, data))
            text = layers["text_encoder"][1](layers["text_encoder"][0](None, data))
            size = contrastive_batch or global_batch
            loss = sum(clip_loss(image[g:g + size], text[g:g + size]) for g in range(0, global_batch, size))
            loss = loss / (global_batch // size)
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


def worker(rank, world, init_file, run, strategy, kind, options, settings, results):
    import braid
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", run))
    if settings:
        config.set_run_settings(**settings)
    plan = config.plan(strategy=strategy, **options)
    program = plan.program()
    groups = bt.Groups(plan.groups(world))
    layers = clip_layers() if kind == "clip" else mllm_layers("none")
    executor = bt.ProgramExecutor(program, groups, layers, loss_fn=caption_loss, logit_scale=LOGIT_SCALE,
                                  make_optimizer=lambda params: torch.optim.SGD(params, lr=LR))
    data = dataset(kind, executor.global_batch, DATA_SEED)
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
                     "global_batch": executor.global_batch, "stages": len(program.stages),
                     "replicas": [stage.replicas for stage in program.stages]}
    dist.barrier()
    dist.destroy_process_group()


@unittest.skipIf(torch is None, REASON)
class ExecutorReproducesOneProcess(unittest.TestCase):

    def train(self, run, strategy, kind, world=4, options=None, settings=None):
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), run, strategy, kind, options or {}, settings or {},
                                   results), nprocs=world, join=True)
            results = dict(results)
        want = reference(kind, results[0]["global_batch"], (settings or {}).get("contrastive_batch", 0))
        seen = set()
        for rank, got in results.items():
            self.assertEqual(got["executed"], got["planned"], f"rank {rank} executed other instructions")
            for name, value in got["params"].items():
                err = float((value - want[name]).abs().max())
                self.assertLessEqual(err, TOLERANCE, f"rank {rank}: {name} differs by {err}")
                seen.add(name)
        self.assertEqual(seen, set(want), "some parameters were trained by no rank")
        return results[0]

    def test_distmm_clip_towers_with_batch_sync(self):
        self.train("tiny-clip.yaml", "distmm", "clip")

    def test_distmm_two_contrastive_groups(self):
        self.train("tiny-clip.yaml", "distmm", "clip", settings={"contrastive_batch": 64})

    def test_distmm_unequal_towers_two_groups(self):
        # Each group pairs the same samples on both towers though their replicas split it differently.
        shape = self.train("tiny-clip.yaml", "fixed", "clip", world=3, options={"plan_yaml": UNEQUAL_TOWERS},
                           settings={"contrastive_batch": 64})
        self.assertEqual(shape["replicas"], [2, 1])

    def test_disttrain_vision_projector_then_llm(self):
        self.train("tiny-mllm-4px.yaml", "disttrain", "mllm")

    def test_disttrain_fan_in_into_a_two_stage_llm(self):
        # The llm on one replica of 2 stages: the 2 vision + projector replicas fan in to it.
        shape = self.train("tiny-mllm-4px.yaml", "disttrain", "mllm", options={"tp": 1, "dp": 1})
        self.assertEqual(shape["replicas"], [2, 1, 1], "not the fan-in layout this test is about")

    def test_optimus_colocated_encoder_tasks(self):
        self.train("tiny-mllm-4px.yaml", "optimus", "mllm")

    def test_megatron_one_grid(self):
        self.train("tiny-mllm-4px.yaml", "megatron", "mllm")


if __name__ == "__main__":
    unittest.main(verbosity=2)
