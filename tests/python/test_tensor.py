"""braid.tensor: the distributed contrastive loss (braid_contrastive_forward / _backward)
on numpy arrays and torch CPU tensors equals a naive CLIP loss written here in float64
numpy, with its gradients derived by hand, to 1e-5: for a rank holding every row
(n == N), a rank holding a slice (n < N, tiles that do not divide N), local and gathered
rows in the same memory, strided rows, and absent gradients. Views borrow the arrays
(no copy), and what the library cannot take is refused with the status that says so.
Where PyTorch sees a CUDA GPU, the same ops on CUDA tensors (the CUDA plugin, on the current
or a given stream) equal the CPU's; elsewhere those tests skip, saying why.

Environment: BRAID_LIBRARY (the libbraid.so to test; required). Needs numpy (Debian's
python3-numpy, under /usr/bin/python3): skipped with the reason printed without it.
"""

import sys
import unittest

from _support import braid
from _support import require_library

try:
    import numpy as np
except ImportError as e:  # pragma: no cover - depends on the machine
    np = None
    NUMPY_MISSING = f"numpy is not importable under {sys.executable} ({e}); install python3-numpy"

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

TOLERANCE = 1e-5


def setUpModule():
    require_library()
    if np is None:
        print(f"\nskipping test_tensor: {NUMPY_MISSING}", file=sys.stderr)
        raise unittest.SkipTest(NUMPY_MISSING)


def normalised(rng, rows, width):
    x = rng.standard_normal((rows, width))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def logsumexp(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def clip_reference(local_image, local_text, all_image, all_text, scale, offset, grad_loss=1.0):
    """CLIP's local loss, float64: mean over the 2n local rows of the image->text and
    text->image cross-entropies against the gathered rows, labels offset + i; and the
    gradients of grad_loss * loss, by hand: d loss / d logits = (softmax - onehot) / 2n."""
    li, lt, ai, at = (np.asarray(x, dtype=np.float64) for x in (local_image, local_text, all_image, all_text))
    n = li.shape[0]
    labels = offset + np.arange(n)
    rows = np.arange(n)
    image_logits = scale * li @ at.T  # (n, N): local images against every text
    text_logits = scale * lt @ ai.T  # local texts against every image
    lse_image, lse_text = logsumexp(image_logits), logsumexp(text_logits)
    loss = ((lse_image - image_logits[rows, labels]).sum() + (lse_text - text_logits[rows, labels]).sum()) / (2 * n)
    d_image = np.exp(image_logits - lse_image[:, None])
    d_image[rows, labels] -= 1
    d_image *= grad_loss / (2 * n)
    d_text = np.exp(text_logits - lse_text[:, None])
    d_text[rows, labels] -= 1
    d_text *= grad_loss / (2 * n)
    grads = {
        "local_image": scale * d_image @ at,
        "all_text": scale * d_image.T @ li,
        "local_text": scale * d_text @ ai,
        "all_image": scale * d_text.T @ lt,
        "scale": float((d_image * image_logits).sum() / scale + (d_text * text_logits).sum() / scale),
    }
    return float(loss), np.stack([lse_image, lse_text]), grads


class ContrastiveNumpyTest(unittest.TestCase):
    N, E, SCALE = 32, 16, 14.3

    def setUp(self):
        rng = np.random.default_rng(7)
        self.image = normalised(rng, self.N, self.E)
        self.text = normalised(rng, self.N, self.E)

    def close(self, got, expected, what):
        got = np.asarray(got, dtype=np.float64)
        error = float(np.max(np.abs(got - expected))) if got.size else 0.0
        self.assertLessEqual(error, TOLERANCE, f"{what}: max |error| {error:.3g}")

    def run_both(self, local_image, local_text, all_image, all_text, offset, tile=0, grad_loss=0.7):
        loss, stats = braid.tensor.contrastive_forward(local_image, local_text, all_image, all_text, self.SCALE,
                                                       offset, tile)
        n, N = local_image.shape[0], all_image.shape[0]
        grads = {"local_image": np.full((n, self.E), np.nan, np.float32),
                 "local_text": np.full((n, self.E), np.nan, np.float32),
                 "all_image": np.full((N, self.E), np.nan, np.float32),
                 "all_text": np.full((N, self.E), np.nan, np.float32)}
        grad_scale = braid.tensor.contrastive_backward(local_image, local_text, all_image, all_text, self.SCALE,
                                                       offset, stats, grad_loss, grads["local_image"],
                                                       grads["local_text"], grads["all_image"], grads["all_text"],
                                                       tile)
        grads["scale"] = grad_scale
        return loss, stats, grads

    def check(self, offset, n, tile=0, grad_loss=0.7):
        rows = slice(offset, offset + n)
        local_image, local_text = self.image[rows].copy(), self.text[rows].copy()
        loss, stats, grads = self.run_both(local_image, local_text, self.image, self.text, offset, tile, grad_loss)
        ref_loss, ref_stats, ref = clip_reference(local_image, local_text, self.image, self.text, self.SCALE, offset,
                                                  grad_loss)
        self.assertIsInstance(loss, float)
        self.assertIsInstance(stats, np.ndarray)
        self.assertEqual((stats.shape, stats.dtype), ((2, n), np.float32))
        self.assertLessEqual(abs(loss - ref_loss), TOLERANCE)
        self.close(stats, ref_stats, "stats")
        for key in ("local_image", "local_text", "all_image", "all_text"):
            self.close(grads[key], ref[key], key)
        self.assertLessEqual(abs(grads["scale"] - ref["scale"]), TOLERANCE)

    def test_every_row_on_one_rank(self):  # n == N
        self.check(offset=0, n=self.N)

    def test_a_slice_of_the_rows(self):  # n < N
        self.check(offset=8, n=8)
        self.check(offset=24, n=8, tile=5)  # tiles that do not divide N
        self.check(offset=3, n=1, tile=1)

    def test_default_tile_equals_small_tiles(self):
        a = self.run_both(self.image[8:16].copy(), self.text[8:16].copy(), self.image, self.text, 8)
        b = self.run_both(self.image[8:16].copy(), self.text[8:16].copy(), self.image, self.text, 8, tile=3)
        self.assertAlmostEqual(a[0], b[0], delta=TOLERANCE)
        for key in ("local_image", "all_text"):
            self.close(a[2][key], b[2][key].astype(np.float64), key)

    def test_local_and_gathered_in_the_same_memory(self):
        # One process: each modality's whole gradient goes to grad_local_*, grad_all_* is zeroed.
        loss, _, grads = self.run_both(self.image, self.text, self.image, self.text, 0)
        ref_loss, _, ref = clip_reference(self.image, self.text, self.image, self.text, self.SCALE, 0, 0.7)
        self.assertLessEqual(abs(loss - ref_loss), TOLERANCE)
        self.close(grads["local_image"], ref["local_image"] + ref["all_image"], "image")
        self.close(grads["local_text"], ref["local_text"] + ref["all_text"], "text")
        self.assertFalse(np.any(grads["all_image"]) or np.any(grads["all_text"]))

    def test_strided_rows(self):
        wide = np.zeros((8, 2 * self.E), np.float32)
        wide[:, :self.E] = self.image[8:16]
        local_image = wide[:, :self.E]  # row stride 2E, rows contiguous
        self.assertFalse(local_image.flags.c_contiguous)
        loss, _, _ = self.run_both(local_image, self.text[8:16].copy(), self.image, self.text, 8)
        ref_loss, _, _ = clip_reference(local_image, self.text[8:16], self.image, self.text, self.SCALE, 8)
        self.assertLessEqual(abs(loss - ref_loss), TOLERANCE)

    def test_absent_gradients(self):
        local_image, local_text = self.image[:8].copy(), self.text[:8].copy()
        _, stats = braid.tensor.contrastive_forward(local_image, local_text, self.image, self.text, self.SCALE, 0)
        grad = np.zeros_like(local_image)
        braid.tensor.contrastive_backward(local_image, local_text, self.image, self.text, self.SCALE, 0, stats, 1.0,
                                          grad, None, None, None)
        _, _, ref = clip_reference(local_image, local_text, self.image, self.text, self.SCALE, 0)
        self.close(grad, ref["local_image"], "local_image")

    def test_views_borrow_the_arrays(self):
        v = braid.tensor.view(self.image)
        self.assertEqual(v.struct.data, self.image.ctypes.data)
        self.assertEqual((v.struct.ndim, v.struct.shape[0], v.struct.shape[1]), (2, self.N, self.E))
        self.assertEqual((v.struct.dtype.code, v.struct.dtype.bits, v.struct.dtype.lanes), (2, 32, 1))
        self.assertIs(v.obj, self.image)

    def test_refusals(self):
        with self.assertRaises(braid.UnsupportedError) as cm:  # float64: not supported (yet)
            braid.tensor.contrastive_forward(self.image.astype(np.float64), self.text, self.image, self.text, 1.0, 0)
        self.assertIn("float32", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError):  # embedding widths differ
            braid.tensor.contrastive_forward(self.image[:, :8].copy(), self.text, self.image, self.text, 1.0, 0)
        with self.assertRaises(braid.InvalidArgumentError):  # rows outside [0, N)
            braid.tensor.contrastive_forward(self.image[:8].copy(), self.text[:8].copy(), self.image, self.text, 1.0,
                                             30)
        with self.assertRaises(braid.InvalidArgumentError):
            braid.tensor.contrastive_forward([[1.0]], [[1.0]], self.image, self.text, 1.0, 0)
        with self.assertRaises(braid.InvalidArgumentError):  # a datetime's typestr is "<M8[ns]"
            braid.tensor.view(np.zeros((2, 4), "M8[ns]"))
        _, stats = braid.tensor.contrastive_forward(self.image, self.text, self.image, self.text, 1.0, 0)
        frozen = np.zeros_like(self.image)
        frozen.setflags(write=False)
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.tensor.contrastive_backward(self.image, self.text, self.image, self.text, 1.0, 0, stats, 1.0,
                                              frozen, None, None, None)
        self.assertIn("read-only", str(cm.exception))
        # Gradients sharing memory were written over one another: refused, naming both.
        shared = np.zeros_like(self.image)
        with self.assertRaises(braid.InvalidArgumentError) as cm:
            braid.tensor.contrastive_backward(self.image, self.text, self.image, self.text, 1.0, 0, stats, 1.0,
                                              shared, shared, None, None)
        self.assertIn("grad_local_image overlaps grad_local_text", str(cm.exception))
        with self.assertRaises(braid.InvalidArgumentError) as cm:  # a gradient over an input
            braid.tensor.contrastive_backward(self.image, self.text, self.image, self.text, 1.0, 0, stats, 1.0,
                                              self.image, None, None, None)
        self.assertIn("grad_local_image overlaps local_image", str(cm.exception))
        # Bad arguments name themselves (were bare TypeError / ValueError).
        for kwargs, fragment in [({"logit_scale": "abc"}, "logit_scale must be a number, not str"),
                                 ({"all_text": None}, "all_text: cannot view a builtins.NoneType"),
                                 ({"stream": "x"}, "stream must be a cudaStream_t address")]:
            with self.subTest(kwargs=kwargs), self.assertRaises(braid.InvalidArgumentError) as cm:
                args = {"local_image": self.image, "local_text": self.text, "all_image": self.image,
                        "all_text": self.text, "logit_scale": 1.0, "row_offset": 0, **kwargs}
                braid.tensor.contrastive_forward(**args)
            self.assertIn(fragment, str(cm.exception))


@unittest.skipIf(torch is None, "PyTorch is not importable; install python3-torch")
class ContrastiveTorchTest(unittest.TestCase):
    def test_torch_cpu_tensors_equal_numpy(self):
        rng = np.random.default_rng(3)
        image, text = normalised(rng, 12, 8), normalised(rng, 12, 8)
        ti, tt = torch.from_numpy(image), torch.from_numpy(text)
        loss, stats = braid.tensor.contrastive_forward(ti[4:8], tt[4:8], ti, tt, 9.0, 4)
        self.assertTrue(torch.is_tensor(stats))
        self.assertEqual((tuple(stats.shape), stats.dtype), ((2, 4), torch.float32))
        ref_loss, ref_stats, ref = clip_reference(image[4:8], text[4:8], image, text, 9.0, 4, 0.5)
        self.assertLessEqual(abs(loss - ref_loss), TOLERANCE)
        self.assertLessEqual(float(np.max(np.abs(stats.numpy() - ref_stats))), TOLERANCE)
        grads = [torch.empty(4, 8), torch.empty(4, 8), torch.empty(12, 8), torch.empty(12, 8)]
        grad_scale = braid.tensor.contrastive_backward(ti[4:8], tt[4:8], ti, tt, 9.0, 4, stats, 0.5, *grads)
        for got, key in zip(grads, ("local_image", "local_text", "all_image", "all_text")):
            self.assertLessEqual(float(np.max(np.abs(got.numpy() - ref[key]))), TOLERANCE, key)
        self.assertLessEqual(abs(grad_scale - ref["scale"]), TOLERANCE)

    def test_a_torch_view_with_storage_offset(self):
        base = torch.zeros(6, 4)
        v = braid.tensor.view(base[2:])
        self.assertEqual(v.struct.data, base.data_ptr() + 2 * 4 * 4)
        self.assertEqual((v.struct.strides[0], v.struct.strides[1]), (4, 1))


def no_cuda():
    """Why the CUDA tests cannot run under this Python, or None when they can."""
    if torch is None:
        return "PyTorch is not importable"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA GPU"
    return None


@unittest.skipIf(no_cuda(), f"CUDA tests: {no_cuda()}")
class ContrastiveCudaTest(unittest.TestCase):
    """CUDA torch tensors go to the CUDA plugin (libbraid-cuda.so) on the current stream, or
    the one passed: the same loss, statistics and gradients as the same tensors on the CPU,
    within 1e-5."""

    def run_on(self, device, image, text, offset, n, stream=None, shared=False):
        ti, tt = torch.from_numpy(image).to(device), torch.from_numpy(text).to(device)
        li, lt = (ti, tt) if shared else (ti[offset:offset + n], tt[offset:offset + n])
        grads = [torch.full(li.shape, float("nan"), device=device), torch.full(lt.shape, float("nan"), device=device),
                 torch.full(ti.shape, float("nan"), device=device), torch.full(tt.shape, float("nan"), device=device)]
        if stream is not None:  # the caller orders its inputs before a stream it names, as with any CUDA library
            stream.wait_stream(torch.cuda.current_stream())
        loss, stats = braid.tensor.contrastive_forward(li, lt, ti, tt, 11.0, offset, 8, stream)
        grad_scale = braid.tensor.contrastive_backward(li, lt, ti, tt, 11.0, offset, stats, 0.5, *grads, 8, stream)
        if device == "cuda":
            torch.cuda.synchronize()  # the gradients may still be in flight on the stream
        self.assertEqual(stats.device.type, device)
        return loss, stats.cpu(), [g.cpu() for g in grads], grad_scale

    def same(self, cpu, cuda):
        self.assertLessEqual(abs(cpu[0] - cuda[0]), TOLERANCE, "loss")
        self.assertLessEqual(abs(cpu[3] - cuda[3]), TOLERANCE, "d logit_scale")
        self.assertLessEqual(float((cpu[1] - cuda[1]).abs().max()), TOLERANCE, "stats")
        for got, want, key in zip(cuda[2], cpu[2], ("local_image", "local_text", "all_image", "all_text")):
            self.assertLessEqual(float((got - want).abs().max()), TOLERANCE, key)

    def test_a_slice_of_the_rows_on_the_current_and_a_given_stream(self):
        rng = np.random.default_rng(11)
        image, text = normalised(rng, 40, 16), normalised(rng, 40, 16)  # tiles of 8 over 40 rows
        cpu = self.run_on("cpu", image, text, 16, 12)
        self.same(cpu, self.run_on("cuda", image, text, 16, 12))
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the current stream: what the binding passes
            self.same(cpu, self.run_on("cuda", image, text, 16, 12))
        self.same(cpu, self.run_on("cuda", image, text, 16, 12, stream=side))

    def test_local_and_gathered_in_the_same_memory(self):
        rng = np.random.default_rng(12)
        image, text = normalised(rng, 24, 16), normalised(rng, 24, 16)
        cpu = self.run_on("cpu", image, text, 0, 24, shared=True)
        self.same(cpu, self.run_on("cuda", image, text, 0, 24, shared=True))
        self.assertFalse(bool(cpu[2][2].any()) or bool(cpu[2][3].any()), "one process: grad_all_* zeroed")


if __name__ == "__main__":
    unittest.main()
