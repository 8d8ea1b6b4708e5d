"""braid.torch.ContrastiveLoss on real gloo process groups: after DDP averages the
gradients, the loss and every gradient equal a single-process CLIP loss written here
(open_clip's formulation), on 1, 2 and 4 processes and on sub-groups of the world, and on
CUDA tensors in one process where PyTorch sees a GPU (elsewhere that case skips, saying
why). Ranks that disagree on the features' shape, and a rank outside the loss's group, get
a ValueError instead of gloo aborting the process or a torch error.

Environment: BRAID_LIBRARY (the libbraid.so to test), PYTHONPATH with integrations/python.
Needs PyTorch (Debian's python3-torch): skipped with the reason printed without it.
"""

import os
import socket
import sys
import tempfile
import unittest

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    torch = None
    REASON = f"PyTorch is not importable ({e}); install python3-torch"

ROWS, FEATURES, EMBED = 6, 5, 4
TOLERANCE = 1e-6


class Clip(torch.nn.Module if torch else object):
    """Two linear towers and a learnable temperature: every parameter gets a gradient."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.image = torch.nn.Linear(FEATURES, EMBED)
        self.text = torch.nn.Linear(FEATURES, EMBED)
        self.log_scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, images, texts):
        return (F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1),
                self.log_scale.exp())


def make_model():
    return Clip()


def make_data(group_index, ranks):
    g = torch.Generator().manual_seed(100 + group_index)
    return torch.randn(ROWS * ranks, FEATURES, generator=g), torch.randn(ROWS * ranks, FEATURES, generator=g)


def reference(group_index, ranks):
    """The single-device CLIP loss and gradients on the group's whole batch."""
    model = make_model()
    images, texts = make_data(group_index, ranks)
    image, text, scale = model(images, texts)
    logits = scale * image @ text.t()
    labels = torch.arange(logits.shape[0])
    loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    loss.backward()
    return float(loss), {name: p.grad.clone() for name, p in model.named_parameters()}


def worker(rank, world, init_file, group_size, results):
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    groups = [dist.new_group(list(range(s, s + group_size))) for s in range(0, world, group_size)]
    index = rank // group_size
    group = groups[index] if group_size < world else None
    local_rank = rank % group_size
    model = torch.nn.parallel.DistributedDataParallel(make_model(), process_group=groups[index])
    images, texts = make_data(index, group_size)
    rows = slice(local_rank * ROWS, (local_rank + 1) * ROWS)
    image, text, scale = model(images[rows], texts[rows])
    loss = bt.ContrastiveLoss(group=group, tile=4)(image, text, scale)
    loss.backward()
    # DDP's hooks averaged the gradients over the group during backward.
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, group=groups[index])
    results[rank] = (float(mean_loss) / group_size,
                     {name: p.grad.clone() for name, p in model.module.named_parameters()})
    dist.barrier()
    dist.destroy_process_group()


def error_of(call):
    try:
        call()
        return "no error"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def mismatch_worker(rank, world, init_file, results):
    """Rank 1 passes one feature more than rank 0, then calls the loss of a group it is not in."""
    import braid.torch as bt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    outside = dist.new_group([0])
    features = F.normalize(torch.randn(ROWS, EMBED + rank), dim=-1)
    scale = torch.tensor(2.0)
    got = {"width": error_of(lambda: bt.ContrastiveLoss()(features, features, scale))}
    # Rank 1's text features lack a row, then its scale holds two values: wrong there only (its
    # error was raised there while rank 0 waited in the all-gather).
    text = features[:-1] if rank == 1 else features
    got["rows"] = error_of(lambda: bt.ContrastiveLoss()(features, text, scale))
    got["scale"] = error_of(lambda: bt.ContrastiveLoss()(features, features, torch.ones(2) if rank else scale))
    if rank == 1:
        got["outside"] = error_of(lambda: bt.ContrastiveLoss(group=outside)(features, features, scale))
    results[rank] = got
    dist.barrier()
    dist.destroy_process_group()


def no_cuda():
    """Why the CUDA case cannot run under this Python, or None when it can."""
    if torch is None:
        return REASON
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA GPU"
    return None


@unittest.skipIf(no_cuda(), f"CUDA case: {no_cuda()}")
class ContrastiveLossOnCuda(unittest.TestCase):
    """The module on CUDA tensors (braid's CUDA plugin, on the tensors' current stream)
    equals the single-device CLIP loss computed on the CPU, within 1e-5, on the default
    stream and on a side stream. One process: a second rank would need a second GPU (NCCL
    refuses two ranks on one, and gloo has no all_gather of CUDA tensors)."""

    def run_on_cuda(self, stream):
        import braid.torch as bt
        model = make_model().cuda()
        images, texts = (x.cuda() for x in make_data(0, 1))
        with torch.cuda.stream(stream):
            stream.wait_stream(torch.cuda.default_stream())  # the model and data were made on the default stream
            image, text, scale = model(images, texts)
            loss = bt.ContrastiveLoss(tile=4)(image, text, scale)
            loss.backward()
        torch.cuda.synchronize()
        self.assertEqual(loss.device.type, "cuda")
        want_loss, want_grads = reference(0, 1)
        self.assertAlmostEqual(float(loss), want_loss, delta=1e-5)
        for name, p in model.named_parameters():
            self.assertEqual(p.grad.device.type, "cuda", name)
            err = float((p.grad.cpu() - want_grads[name]).abs().max())
            self.assertLessEqual(err, 1e-5, f"gradient of {name}: max error {err}")

    def test_the_default_stream(self):
        self.run_on_cuda(torch.cuda.default_stream())

    def test_a_side_stream(self):
        self.run_on_cuda(torch.cuda.Stream())


@unittest.skipIf(torch is None, REASON if torch is None else "")
class ContrastiveLossRefusesMismatches(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as tmp:
            results = mp.Manager().dict()
            mp.spawn(mismatch_worker, args=(2, os.path.join(tmp, "init"), results), nprocs=2, join=True)
            cls.results = dict(results)

    def test_ranks_with_different_feature_widths_all_get_a_value_error(self):
        want = (f"ValueError: ContrastiveLoss: every rank of the group must pass image_features and text_features "
                f"of the same shape (rows, features), got ({ROWS}, {EMBED}), ({ROWS}, {EMBED + 1})")
        for rank in range(2):
            self.assertEqual(self.results[rank]["width"], want, f"rank {rank}")

    def test_a_mistake_on_one_rank_is_an_error_on_every_rank(self):
        self.assertEqual(self.results[1]["rows"], f"ValueError: ContrastiveLoss: image features ({ROWS}, {EMBED + 1}) "
                                                  f"and text features ({ROWS - 1}, {EMBED + 1}) differ in shape")
        self.assertEqual(self.results[1]["scale"],
                         "ValueError: ContrastiveLoss: logit_scale must hold one value, got shape (2,)")
        for case in ("rows", "scale"):
            self.assertEqual(self.results[0][case], "ValueError: ContrastiveLoss: rank(s) [1] of the group passed "
                                                    "arguments the loss cannot take (their error says which)", case)

    def test_a_rank_outside_the_group_gets_a_value_error(self):
        self.assertEqual(self.results[1]["outside"], "ValueError: ContrastiveLoss: rank 1 is not a member of its "
                                                     "group; call the loss on the group's ranks only")


@unittest.skipIf(torch is None, REASON if torch is None else "")
class ContrastiveLossOnGloo(unittest.TestCase):
    """The distributed loss equals the single-device one, within float32 rounding."""

    def run_world(self, world, group_size):
        with tempfile.TemporaryDirectory() as tmp:
            manager = mp.Manager()
            results = manager.dict()
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), group_size, results), nprocs=world, join=True)
            results = dict(results)
        for rank in range(world):
            want_loss, want_grads = reference(rank // group_size, group_size)
            got_loss, got_grads = results[rank]
            self.assertAlmostEqual(got_loss, want_loss, delta=TOLERANCE * max(1.0, abs(want_loss)),
                                   msg=f"loss of rank {rank}")
            for name, want in want_grads.items():
                err = float((got_grads[name] - want).abs().max())
                self.assertLessEqual(err, TOLERANCE, f"rank {rank}, gradient of {name}: max error {err}")

    def test_one_process_equals_reference(self):
        import braid.torch as bt
        model = make_model()
        images, texts = make_data(0, 1)
        image, text, scale = model(images, texts)
        loss = bt.ContrastiveLoss()(image, text, scale)
        loss.backward()
        want_loss, want_grads = reference(0, 1)
        self.assertAlmostEqual(float(loss), want_loss, delta=TOLERANCE)
        for name, p in model.named_parameters():
            self.assertLessEqual(float((p.grad - want_grads[name]).abs().max()), TOLERANCE, name)

    def test_integer_features_are_refused(self):
        import braid.torch as bt
        features = torch.ones(4, 8, dtype=torch.int64)
        with self.assertRaises(TypeError) as cm:  # not a loss truncated to an int
            bt.ContrastiveLoss()(features, features, torch.tensor(1.0))
        self.assertIn("must be floating point, got torch.int64", str(cm.exception))

    def test_a_scale_of_shape_one_gets_a_gradient_of_its_shape(self):
        import braid.torch as bt
        image = torch.nn.functional.normalize(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), dim=1)
        scale = torch.full((1,), 2.0, requires_grad=True)
        bt.ContrastiveLoss()(image, image.flip(0), scale).backward()
        flat = torch.tensor(2.0, requires_grad=True)
        bt.ContrastiveLoss()(image, image.flip(0), flat).backward()
        self.assertEqual(tuple(scale.grad.shape), (1,))
        self.assertEqual(float(scale.grad[0]), float(flat.grad))

    def test_two_processes(self):
        self.run_world(2, 2)

    def test_four_processes(self):
        self.run_world(4, 4)

    def test_two_sub_groups_of_four(self):
        self.run_world(4, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
