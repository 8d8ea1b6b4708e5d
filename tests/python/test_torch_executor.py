"""braid.torch.ProgramExecutor runs each rank's slice of braid's program over PyTorch
layers on real gloo processes, and reproduces single-process training: with SGD, every
parameter after 5 steps equals a single-process reference (<= 1e-5), and every rank
executed exactly its instructions of the program.

Layouts, on 4 processes: DistMM (two CLIP towers on their own ranks, joined by a
contrastive batch-sync; one and two contrastive groups per step), DistTrain (vision +
projector on their ranks, the llm on others; and 2 vision replicas fanning in to an llm
of 2 pipeline stages), Optimus (encoder and llm on every rank, the encoder run by the program's
encoder tasks) and Megatron (one grid for the whole model).

Also, each against one process: tied weights and gradients accumulated over two steps
at DP 2; float64 and bfloat16 models across two pipeline stages; and what is refused
(frozen parameters untouched, a mean loss, a global batch that does not split, layer
lists of another length than the plan's, no loss_fn, a layer that detaches its input).

Environment: BRAID_LIBRARY, BRAID_SOURCE_DIR, PYTHONPATH with integrations/python.
"""

import os
import tempfile
import unittest

from _models import LOGIT_SCALE, VOCAB, Dense, LlmInput, caption_loss, clip_layers, clip_loss, dataset, dist
from _models import mllm_layers, mp, torch
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
MLLM_RUN = "tiny-mllm-4px.yaml"

# Every module on one stage of {d} replicas (4 microbatches of 4 per replica at d = 1).
ONE_STAGE = """\
strategy: megatron
layout: monolithic
devices: {d}
schedule: 1f1b
virtual_stages: 1
modules:
  - {{name: vision, role: encoder, tp: 1, pp: 1, dp: {d}, first_device: 0, devices: {d}, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}}
  - {{name: projector, role: projector, tp: 1, pp: 1, dp: {d}, first_device: 0, devices: {d}, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}}
  - {{name: llm, role: llm, tp: 1, pp: 1, dp: {d}, first_device: 0, devices: {d}, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}}
"""
# Vision + projector on rank 0, the llm on rank 1: activations and gradients cross ranks.
TWO_STAGES = """\
strategy: disttrain
layout: chain
devices: 2
schedule: 1f1b
virtual_stages: 1
modules:
  - {name: vision, role: encoder, tp: 1, pp: 1, dp: 1, first_device: 0, devices: 1, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}
  - {name: llm, role: llm, tp: 1, pp: 1, dp: 1, first_device: 1, devices: 1, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}
  - {name: projector, role: projector, tp: 1, pp: 1, dp: 1, first_device: 0, devices: 1, first_stage: 0,
     microbatch_size: 4, layers_per_stage: [2]}
"""


def freeze(layers, frozen):
    """Freezes the layers named in ``frozen``: a module ("vision") or one layer ("vision.0")."""
    for name, module in layers.items():
        for i, layer in enumerate(module):
            if name in frozen or f"{name}.{i}" in frozen:
                for p in layer.parameters():
                    p.requires_grad_(False)
    return layers


def reference(kind, global_batch, contrastive_batch=0, frozen=()):
    """Single-process SGD on the whole model and the whole batch (CLIP: the mean of its
    contrastive groups' losses, group g being samples [g C, (g+1) C))."""
    layers = freeze(clip_layers() if kind == "clip" else mllm_layers("none"), frozen)
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
            loss = caption_loss(mllm_output(layers, data), data).mean()
        loss.backward()
        optimizer.step()
    return named(layers)


def mllm_output(layers, data):
    x = None
    for name in ("vision", "projector", "llm"):
        for i, layer in enumerate(layers[name]):
            x = layer(x, data) if i == 0 else layer(x)
    return x


def mllm_reference(layers, data, steps, make_optimizer=None):
    """Single-process ``steps`` backward passes of the mean caption loss over the whole
    batch, each followed by an SGD step when ``make_optimizer`` is given (else the
    gradients accumulate)."""
    params = list({id(p): p for module in layers.values() for layer in module for p in layer.parameters()}.values())
    optimizer = make_optimizer(params) if make_optimizer else None
    for _ in range(steps):
        if optimizer:
            optimizer.zero_grad()
        caption_loss(mllm_output(layers, data), data).mean().backward()
        if optimizer:
            optimizer.step()


def named(layers, what=lambda p: p):
    """``what`` of every parameter, keyed "<module>.<layer>.<parameter>"."""
    return {f"{name}.{i}.{n}": what(p).detach().clone() for name, module in layers.items()
            for i, layer in enumerate(module) for n, p in layer.named_parameters()}


def sgd(params):
    return torch.optim.SGD(params, lr=LR)


def tied_layers():
    """mllm_layers with the projector's last linear tied to the vision's last one."""
    layers = mllm_layers("none")
    layers["projector"][1].linear = layers["vision"][1].linear
    return layers


def in_dtype(layers, dtype):
    return {name: [layer.to(dtype) for layer in module] for name, module in layers.items()}


def batch_of(data, dtype=None):
    """The executor's ``data``: the samples at ``indices``, floating tensors in ``dtype``."""
    def read(indices):
        return {k: v[indices].to(dtype) if dtype and v.is_floating_point() else v[indices] for k, v in data.items()}
    return read


class DetachingInput(LlmInput):
    """An llm first layer that cuts its input from the graph (a host bug)."""

    def forward(self, image_tokens, batch):
        return super().forward(image_tokens.detach(), batch)


def owned(executor, layers):
    """The parameters of the layers ``executor`` runs, keyed "<module>.<layer>.<parameter>"."""
    params = {}
    for part in executor.stage.parts:
        name = executor.modules[part.module].name
        for i in range(part.first_layer, part.first_layer + part.layer_count):
            for n, p in layers[name][i].named_parameters():
                params[f"{name}.{i}.{n}"] = p.detach().clone()
    return params


def worker(rank, world, init_file, run, strategy, kind, options, settings, extra, results):
    import braid
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", run))
    if settings:
        config.set_run_settings(**settings)
    plan = config.plan(strategy=strategy, **options)
    program = plan.program()
    groups = bt.Groups(plan.groups(world))
    layers = freeze(clip_layers() if kind == "clip" else mllm_layers("none"), extra.get("frozen", ()))
    executor = bt.ProgramExecutor(program, groups, layers, loss_fn=caption_loss, logit_scale=LOGIT_SCALE,
                                  make_optimizer=lambda params: torch.optim.SGD(params, lr=LR),
                                  global_batch=extra.get("global_batch"))
    data = dataset(kind, executor.global_batch, DATA_SEED)
    executed = None
    for _ in range(STEPS):
        out = executor.step(lambda indices: {k: v[indices] for k, v in data.items()})
        executed = out["executed"]
    results[rank] = {"params": owned(executor, layers), "executed": [i._asdict() for i in executed],
                     "planned": [i._asdict() for i in program.rank(rank).instructions],
                     "global_batch": executor.global_batch, "stages": len(program.stages),
                     "replicas": [stage.replicas for stage in program.stages]}
    dist.barrier()
    dist.destroy_process_group()


@unittest.skipIf(torch is None, REASON)
class ExecutorReproducesOneProcess(unittest.TestCase):

    def train(self, run, strategy, kind, world=4, options=None, settings=None, **extra):
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), run, strategy, kind, options or {}, settings or {},
                                   extra, results), nprocs=world, join=True)
            results = dict(results)
        want = reference(kind, results[0]["global_batch"], (settings or {}).get("contrastive_batch", 0),
                         extra.get("frozen", ()))
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

    # Frozen layers whose outputs need no gradient: a stage's backward, a tower's, an encoder
    # task's had nothing to run backward on and raised.
    def test_disttrain_frozen_vision_and_projector_stage(self):
        self.train("tiny-mllm-4px.yaml", "disttrain", "mllm", frozen=("vision", "projector"))

    def test_distmm_locked_image_tower(self):
        self.train("tiny-clip.yaml", "distmm", "clip", frozen=("image_encoder",))

    def test_optimus_frozen_first_encoder_layer(self):
        self.train("tiny-mllm-4px.yaml", "optimus", "mllm", frozen=("vision.0",))

    def test_optimus_with_another_global_batch(self):
        # The colocated encoder's tasks took the plan's microbatch size, not this batch's.
        self.assertEqual(self.train("tiny-mllm-4px.yaml", "optimus", "mllm", global_batch=32)["global_batch"], 32)


def spawn(fn, world):
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(fn, args=(world, os.path.join(tmp, "init"), results), nprocs=world, join=True)
        return dict(results)


def mllm_plan(plan_yaml):
    import braid

    return braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", MLLM_RUN)).plan(
        strategy="fixed", plan_yaml=plan_yaml)


def data_parallel_worker(rank, world, init_file, results):
    """Tied weights trained for STEPS steps, then gradients accumulated over two steps
    with no optimizer (the host steps itself), on one stage of ``world`` replicas."""
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    plan = mllm_plan(ONE_STAGE.format(d=world))
    groups = bt.Groups(plan.groups(world))
    batch = batch_of(dataset("mllm", plan.config.run_settings.global_batch, DATA_SEED))
    layers = tied_layers()
    executor = bt.ProgramExecutor(plan.program(), groups, layers, loss_fn=caption_loss, make_optimizer=sgd)
    for _ in range(STEPS):
        executor.step(batch)
    tied = named(layers)
    layers = mllm_layers("none")
    executor = bt.ProgramExecutor(plan.program(), groups, layers, loss_fn=caption_loss)
    for _ in range(2):
        executor.step(batch)
    results[rank] = {"tied": tied, "accumulated": named(layers, lambda p: p.grad)}
    dist.barrier()
    dist.destroy_process_group()


def two_stage_worker(rank, world, init_file, results):
    """float64 trained for STEPS steps, one bfloat16 step, then a layer that detaches its
    input (last: its error ends the world) across the two stages of TWO_STAGES."""
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    plan = mllm_plan(TWO_STAGES)
    groups = bt.Groups(plan.groups(world))
    data = dataset("mllm", plan.config.run_settings.global_batch, DATA_SEED)
    got = {}
    layers = in_dtype(mllm_layers("none"), torch.float64)
    executor = bt.ProgramExecutor(plan.program(), groups, layers, loss_fn=caption_loss, make_optimizer=sgd)
    for _ in range(STEPS):
        executor.step(batch_of(data, torch.float64))
    got["float64"] = owned(executor, layers)
    layers = in_dtype(mllm_layers("none"), torch.bfloat16)
    executor = bt.ProgramExecutor(plan.program(), groups, layers, loss_fn=caption_loss)
    got["bfloat16"] = executor.step(batch_of(data, torch.bfloat16))["loss"]
    layers = mllm_layers("none")
    layers["llm"][0] = DetachingInput(51)
    executor = bt.ProgramExecutor(plan.program(), groups, layers, loss_fn=caption_loss)
    try:
        executor.step(batch_of(data))
        got["detached"] = "no error"
    except Exception as e:  # the llm rank's error; the peer's recv then fails
        got["detached"] = f"{type(e).__name__}: {e}"
    results[rank] = got


@unittest.skipIf(torch is None, REASON)
class DataParallelGradients(unittest.TestCase):
    """At DP 2: a weight shared by two layers is reduced once, and gradients the host
    accumulates over two steps equal one process's."""

    @classmethod
    def setUpClass(cls):
        cls.results = spawn(data_parallel_worker, 2)
        cls.data = dataset("mllm", 16, DATA_SEED)

    def assertClose(self, got, want, what):
        for name, value in want.items():
            err = float((got[name] - value).abs().max())
            self.assertLessEqual(err, TOLERANCE, f"{what}: {name} differs by {err}")

    def test_tied_weights_train_as_in_one_process(self):
        layers = tied_layers()
        mllm_reference(layers, self.data, STEPS, sgd)
        for rank, got in self.results.items():
            self.assertClose(got["tied"], named(layers), f"rank {rank}")

    def test_gradients_accumulate_over_two_steps_as_in_one_process(self):
        layers = mllm_layers("none")
        mllm_reference(layers, self.data, 2)
        for rank, got in self.results.items():
            self.assertClose(got["accumulated"], named(layers, lambda p: p.grad), f"rank {rank}")


@unittest.skipIf(torch is None, REASON)
class TwoStageMessages(unittest.TestCase):
    """Activations and gradients cross stages in the model's dtype."""

    @classmethod
    def setUpClass(cls):
        cls.results = spawn(two_stage_worker, 2)
        cls.data = dataset("mllm", 16, DATA_SEED)

    def test_float64_trains_to_float64_precision(self):
        layers = in_dtype(mllm_layers("none"), torch.float64)
        data = batch_of(self.data, torch.float64)(list(range(16)))
        mllm_reference(layers, data, STEPS, sgd)
        want = named(layers)
        got = {**self.results[0]["float64"], **self.results[1]["float64"]}
        self.assertEqual(set(got), set(want), "some parameters were trained by no rank")
        for name, value in got.items():
            self.assertEqual(value.dtype, torch.float64, name)
            err = float((value - want[name]).abs().max())
            self.assertLessEqual(err, 1e-12, f"{name} differs by {err} (float32 messages lose ~1e-7)")

    def test_bfloat16_runs_across_stages(self):
        layers = in_dtype(mllm_layers("none"), torch.bfloat16)
        data = batch_of(self.data, torch.bfloat16)(list(range(16)))
        with torch.no_grad():
            want = float(caption_loss(mllm_output(layers, data), data).mean())
        got = self.results[0]["bfloat16"] + self.results[1]["bfloat16"]
        self.assertAlmostEqual(got, want, delta=0.02 * abs(want))

    def test_a_layer_that_detaches_its_input_is_named(self):
        self.assertRegex(self.results[1]["detached"],
                         r"ValueError: braid.torch: layers llm_0..llm_1 of stage 'llm stage 0' pass no gradient "
                         r"back to their input of microbatch 0")


def refusing_worker(rank, world, init_file, case, results):
    """Builds the executor of ``case`` on every rank: what each raised, or "built"."""
    import braid
    import braid.torch as bt

    import datetime

    # A rank left waiting on one that raised fails when that one exits, or at this timeout.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))

    def plan(run, strategy, settings=None, **options):
        config = braid.Config.from_file(os.path.join(SOURCE_DIR, "configs", "runs", run))
        if settings:
            config.set_run_settings(**settings)
        return config.plan(strategy=strategy, **options)

    try:
        if case == "contrastive_groups":
            clip = plan("tiny-clip.yaml", "distmm", {"contrastive_batch": 64})
            bt.ProgramExecutor(clip.program(), bt.Groups(clip.groups(world)), clip_layers(), global_batch=256)
        elif case == "fan_out":
            fan_out = plan("tiny-mllm-4px.yaml", "fixed", plan_yaml=FAN_OUT)
            bt.ProgramExecutor(fan_out.program(), bt.Groups(fan_out.groups(world)), mllm_layers("none"),
                               loss_fn=caption_loss, global_batch=20)
        elif case == "widths":  # the text tower's embeddings 2 wider than the image tower's
            clip = plan("tiny-clip.yaml", "distmm")
            layers = clip_layers()
            width = layers["text_encoder"][1].linear.out_features
            layers["text_encoder"][1] = Dense(22, width, width + 2, False, normalize=True)
            executor = bt.ProgramExecutor(clip.program(), bt.Groups(clip.groups(world)), layers,
                                          logit_scale=LOGIT_SCALE)
            try:
                executor.step(batch_of(dataset("clip", 128, DATA_SEED)))
                results[rank] = "stepped"
            except Exception as e:  # the members' ValueError; the others' lost peer
                results[rank] = f"{type(e).__name__}: {e}"
            return  # no barrier: a rank may still wait on a peer that raised
        else:  # groups of another plan
            mine, other = plan("tiny-mllm-4px.yaml", "disttrain"), plan("tiny-mllm-4px.yaml", "megatron")
            bt.ProgramExecutor(mine.program(), bt.Groups(other.groups(world)), mllm_layers("none"),
                               loss_fn=caption_loss)
        results[rank] = "built"
    except ValueError as e:
        results[rank] = str(e)
    dist.barrier()
    dist.destroy_process_group()


# Vision + projector on rank 0 feed an llm of 2 replicas (ranks 1, 2).
FAN_OUT = TWO_STAGES.replace("devices: 2\n", "devices: 3\n").replace(
    "dp: 1, first_device: 1, devices: 1, first_stage: 0,\n     microbatch_size: 4",
    "dp: 2, first_device: 1, devices: 2, first_stage: 0,\n     microbatch_size: 2")


@unittest.skipIf(torch is None, REASON)
class ExecutorRefusesOnEveryRank(unittest.TestCase):
    """A batch or groups the program cannot run are refused on every rank as the executor is
    built (they failed on some ranks in the step while the others waited, or hung)."""

    def refusals(self, case, world):
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(refusing_worker, args=(world, os.path.join(tmp, "init"), case, results), nprocs=world,
                     join=True)
            return dict(results)

    def test_a_global_batch_of_other_contrastive_groups(self):
        for rank, said in self.refusals("contrastive_groups", 4).items():
            self.assertIn("global_batch 256 makes 4 contrastive groups of 64 samples, but the program batch-syncs 2: "
                          "give global_batch 128", said, f"rank {rank}")

    def test_a_fan_out_that_does_not_split(self):
        self.assertEqual(FAN_OUT.count("dp: 2"), 1)
        for rank, said in self.refusals("fan_out", 3).items():
            self.assertIn("global_batch 20 gives stage 'vision stage 0' microbatches of 5 samples, which do not split "
                          "evenly over the 2 replicas of stage 'llm stage 0' each feeds (fan-out)", said, f"rank {rank}")

    def test_batch_sync_towers_of_other_widths(self):
        # gloo aborted the processes on the all-reduce of tensors of other shapes.
        said = self.refusals("widths", 4)
        members = [rank for rank, text in said.items() if "BatchSync" in text]
        self.assertGreaterEqual(len(members), 2, said)
        for rank in members:
            self.assertRegex(said[rank], r"ValueError: braid.torch: BatchSync of group 0 joins the towers' embeddings, "
                                         r"each \(rows, width\) of one width; got rank \d: width 8, .*width 10")

    def test_groups_of_another_plan(self):
        for rank, said in self.refusals("other_groups", 4).items():
            self.assertIn("groups were not made from the program's plan", said, f"rank {rank}")


@unittest.skipIf(torch is None, REASON)
class ExecutorRefusesBadInput(unittest.TestCase):
    """What the host gets wrong is refused with a ValueError naming it (on one process)."""

    @classmethod
    def setUpClass(cls):
        import braid.torch as bt

        cls.tmp = tempfile.TemporaryDirectory()
        dist.init_process_group("gloo", init_method=f"file://{cls.tmp.name}/init", rank=0, world_size=1)
        cls.plan = mllm_plan(ONE_STAGE.format(d=1))
        cls.groups = bt.Groups(cls.plan.groups(1))
        cls.data = dataset("mllm", 16, DATA_SEED)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        cls.tmp.cleanup()

    def executor(self, layers=None, **options):
        import braid.torch as bt

        options.setdefault("loss_fn", caption_loss)
        return bt.ProgramExecutor(self.plan.program(), self.groups, layers or mllm_layers("none"), **options)

    def test_frozen_parameters_get_no_gradient_and_no_update(self):
        layers = mllm_layers("none")
        frozen = [p for layer in layers["vision"] for p in layer.parameters()]
        for p in frozen:
            p.requires_grad_(False)
        before = [p.detach().clone() for p in frozen]
        executor = self.executor(layers, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=LR, weight_decay=0.1))
        executor.step(batch_of(self.data))
        for p, was in zip(frozen, before):
            self.assertIsNone(p.grad)
            self.assertTrue(torch.equal(p, was), "weight decay moved a frozen weight")

    def test_a_mean_loss_is_refused(self):
        executor = self.executor(loss_fn=lambda output, batch: caption_loss(output, batch).mean())
        with self.assertRaisesRegex(ValueError, r"loss_fn must return per-sample losses, shape \(4,\) for "
                                                r"microbatch 0, got \(\)"):
            executor.step(batch_of(self.data))

    def test_a_global_batch_that_does_not_split_is_refused(self):
        for bad, why in ((0, "global_batch must be positive, got 0"), (-16, "global_batch must be positive"),
                         (10, r"global_batch 10 does not split evenly over stage .* \(1 replicas x 4 microbatches\)")):
            with self.subTest(global_batch=bad), self.assertRaisesRegex(ValueError, why):
                self.executor(global_batch=bad)

    def test_layer_lists_must_have_the_plans_length(self):
        for count in (1, 3):
            layers = mllm_layers("none")
            layers["llm"] = (layers["llm"] + [Dense(53, VOCAB, VOCAB, False)])[:count]
            with self.subTest(layers=count), self.assertRaisesRegex(
                    ValueError, rf"layers\['llm'\] has {count} layers but the plan's module 'llm' has 2"):
                self.executor(layers)

    def test_the_last_stage_needs_loss_fn(self):
        with self.assertRaisesRegex(ValueError, r"stage 'stage 0 .*' ends the model: give loss_fn"):
            self.executor(loss_fn=None)

    def test_a_step_needs_data_and_gradients(self):
        executor = self.executor()
        with self.assertRaisesRegex(TypeError, r"step\(data\): data must be a callable of sample positions, got "
                                               r"NoneType"):
            executor.step(None)
        with torch.no_grad(), self.assertRaisesRegex(RuntimeError, r"call it with gradients enabled"):
            executor.step(batch_of(self.data))


if __name__ == "__main__":
    unittest.main(verbosity=2)
