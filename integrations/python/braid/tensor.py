"""Tensor views (braid_tensor, braid/tensor.h) of host framework arrays, and the ops
that take them: CLIP's distributed contrastive loss (braid_contrastive_forward /
_backward, tiled: O(n x tile) memory, never n x N).

Arrays are borrowed, never copied: (a) objects with the NumPy array interface
(``__array_interface__``: numpy arrays) and (b) objects with ``data_ptr()``, ``dtype``,
``shape``, ``stride()`` and ``device`` (torch tensors). Neither numpy nor torch is
imported by this module; the library says which dtypes and devices it supports (float32
in CPU memory, rows contiguous, for now) and refuses others with
:class:`~braid.UnsupportedError`.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, List, Optional, Tuple

from . import _loader
from . import _structs as S
from ._handles import int_arg
from .errors import BraidError, invalid_argument

__all__ = ["TensorView", "view", "contrastive_forward", "contrastive_backward"]

# numpy typestr kinds and torch dtype names -> braid_dtype code (DLPack's).
_KINDS = {"f": S.DTYPE_FLOAT, "i": S.DTYPE_INT, "u": S.DTYPE_UINT, "b": S.DTYPE_UINT}
_TORCH_DTYPES = {
    "float32": (S.DTYPE_FLOAT, 32), "float": (S.DTYPE_FLOAT, 32),
    "float64": (S.DTYPE_FLOAT, 64), "double": (S.DTYPE_FLOAT, 64),
    "float16": (S.DTYPE_FLOAT, 16), "half": (S.DTYPE_FLOAT, 16),
    "bfloat16": (S.DTYPE_BFLOAT, 16),
    "int8": (S.DTYPE_INT, 8), "int16": (S.DTYPE_INT, 16), "short": (S.DTYPE_INT, 16),
    "int32": (S.DTYPE_INT, 32), "int": (S.DTYPE_INT, 32),
    "int64": (S.DTYPE_INT, 64), "long": (S.DTYPE_INT, 64),
    "uint8": (S.DTYPE_UINT, 8), "bool": (S.DTYPE_UINT, 8),
}
_DEVICES = {"cpu": S.DEVICE_CPU, "cuda": S.DEVICE_CUDA}


class TensorView:
    """A braid_tensor describing ``obj``'s memory. ``struct`` is the ctypes struct to
    pass (``ctypes.byref(v.struct)``); the view keeps ``obj`` and the shape and stride
    arrays alive while it lives, so keep the view until the call returns."""

    __slots__ = ("obj", "struct", "_shape", "_strides", "writable", "is_torch")

    def __init__(self, obj: Any, name: Optional[str] = None) -> None:
        self.obj = obj
        self.struct = S.braid_tensor()
        if callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "stride", None)):
            self._from_torch(obj)
        elif hasattr(obj, "__array_interface__"):
            self._from_array_interface(obj)
        else:
            raise invalid_argument(
                (f"{name}: " if name else "") +
                f"cannot view a {type(obj).__module__}.{type(obj).__name__} as a braid_tensor: pass a numpy array or "
                "an object with data_ptr(), dtype, shape, stride() and device (a torch tensor)"
            )

    def _set(self, data: int, device: Tuple[int, int], code: int, bits: int, shape, strides) -> None:
        t = self.struct
        t.data = data or None
        t.device.type, t.device.index = device
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        if strides is None:
            self._strides = None
            t.strides = None
        else:
            self._strides = (ctypes.c_int64 * max(len(strides), 1))(*strides)
            t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = 0

    def _from_array_interface(self, obj: Any) -> None:
        face = obj.__array_interface__
        data, readonly = face["data"]
        typestr = face["typestr"]  # "<f4": byte order, kind, bytes
        kind = typestr[1]
        if kind not in _KINDS or typestr[0] == ">" or not typestr[2:].isdigit():  # "<M8[ns]": a datetime
            raise invalid_argument(f"cannot view an array of type {typestr!r} as a braid_tensor")
        size = int(typestr[2:])
        shape = tuple(int(d) for d in face["shape"])
        strides = face.get("strides")
        if strides is not None:
            if any(s % size for s in strides):
                raise invalid_argument(f"array strides {tuple(strides)} are not whole elements of {size} bytes")
            strides = tuple(int(s) // size for s in strides)
        self.writable = not readonly
        self.is_torch = False
        self._set(int(data or 0), (S.DEVICE_CPU, 0), _KINDS[kind], 8 * size, shape, strides)

    def _from_torch(self, obj: Any) -> None:
        name = str(obj.dtype).rsplit(".", 1)[-1]  # "torch.float32"
        if name not in _TORCH_DTYPES:
            raise invalid_argument(f"cannot view a tensor of dtype {obj.dtype} as a braid_tensor")
        code, bits = _TORCH_DTYPES[name]
        device = obj.device
        kind = getattr(device, "type", str(device))
        if kind not in _DEVICES:
            raise invalid_argument(f"cannot view a tensor on device {device} as a braid_tensor (cpu or cuda)")
        index = getattr(device, "index", None) or 0
        self.writable = True
        self.is_torch = True
        # data_ptr() already points at the first element (the storage offset included).
        self._set(int(obj.data_ptr()), (_DEVICES[kind], index), code, bits, tuple(int(d) for d in obj.shape),
                  tuple(int(s) for s in obj.stride()))

    @property
    def ref(self):
        """A pointer to the struct, for a C call."""
        return ctypes.byref(self.struct)


def view(obj: Any, name: Optional[str] = None) -> TensorView:
    """A :class:`TensorView` of a numpy array or torch tensor (``name``: the argument, for errors)."""
    return obj if isinstance(obj, TensorView) else TensorView(obj, name)


def _number(name: str, value: Any) -> float:
    """``value`` as a float, else InvalidArgumentError naming the argument."""
    if isinstance(value, (str, bytes)) or value is None:
        raise invalid_argument(f"{name} must be a number, not {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise invalid_argument(f"{name} must be a number, not {type(value).__name__}") from None


def _output(obj: Any, name: str) -> Optional[TensorView]:
    if obj is None:
        return None
    v = view(obj, name)
    if not v.writable:
        raise invalid_argument(f"{name} is read-only; braid writes the result into it")
    return v


def _stream(views: List[Optional[TensorView]], stream: Any) -> Optional[int]:
    """The stream handle for the call: ``stream`` (an int, or an object with
    ``cuda_stream``), else the current CUDA stream of the first CUDA torch tensor, else NULL."""
    if stream is not None:
        native = getattr(stream, "cuda_stream", stream)
        try:
            return int_arg("stream", native, 0, 2**64 - 1) or None
        except BraidError:
            raise invalid_argument(f"stream must be a cudaStream_t address (an int) or have .cuda_stream, not "
                                   f"{type(stream).__name__}") from None
    for v in views:
        if v is not None and v.is_torch and v.struct.device.type == S.DEVICE_CUDA:
            torch = sys.modules.get("torch")
            if torch is not None:
                return int(torch.cuda.current_stream(v.obj.device).cuda_stream) or None
    return None


def _options(row_offset: int, tile: int) -> S.braid_contrastive_options:
    options = S.new(S.braid_contrastive_options)
    options.version = S.CONTRASTIVE_OPTIONS_VERSION
    options.row_offset = int_arg("row_offset", row_offset, -(2**63), 2**63 - 1)
    options.tile = int_arg("tile", tile)
    return options


def _new_stats(like: Any, n: int) -> Any:
    """A (2, n) float32 array of the same kind as ``like`` (numpy or torch)."""
    if callable(getattr(like, "new_empty", None)):
        torch = sys.modules.get("torch") or __import__("torch")
        return like.new_empty((2, n), dtype=torch.float32)
    import numpy

    return numpy.empty((2, n), dtype=numpy.float32)


def _rows(v: TensorView, name: str) -> int:
    if v.struct.ndim < 1:
        raise invalid_argument(f"{name} must be (rows, features), not a scalar")
    return int(v.struct.shape[0])


def contrastive_forward(local_image: Any, local_text: Any, all_image: Any, all_text: Any, logit_scale: float,
                        row_offset: int, tile: int = 0, stream: Any = None) -> Tuple[float, Any]:
    """CLIP's local loss on this rank's rows (braid_contrastive_forward).

    ``local_image``, ``local_text``: (n, E), this rank's L2-normalised embeddings;
    ``all_image``, ``all_text``: (N, E), every rank's, this rank's at rows
    [row_offset, row_offset + n); ``logit_scale``: the exponentiated scale; ``tile``:
    gathered rows per tile (0: the library's default). numpy arrays or torch tensors
    (float32; CPU, or CUDA through the CUDA plugin). Returns (loss, stats): the mean over the 2n local rows of the
    image->text and text->image cross-entropies, and the (2, n) float32 log-sum-exp
    statistics (an array of the inputs' kind) :func:`contrastive_backward` needs."""
    lib = _loader.load_library()
    fn = _loader.require(lib, "braid_contrastive_forward")
    views = [view(local_image, "local_image"), view(local_text, "local_text"), view(all_image, "all_image"),
             view(all_text, "all_text")]
    stats = _new_stats(views[0].obj, _rows(views[0], "local_image"))
    out = _output(stats, "stats")
    options = _options(row_offset, tile)
    loss = ctypes.c_float()
    _loader._check(lib, fn(*[v.ref for v in views], _number("logit_scale", logit_scale), ctypes.byref(options), out.ref,
                           ctypes.byref(loss), _stream(views, stream)))
    return float(loss.value), stats


def contrastive_backward(local_image: Any, local_text: Any, all_image: Any, all_text: Any, logit_scale: float,
                         row_offset: int, stats: Any, grad_loss: float, grad_local_image: Any, grad_local_text: Any,
                         grad_all_image: Any, grad_all_text: Any, tile: int = 0, stream: Any = None) -> float:
    """The backward of ``grad_loss * loss`` (braid_contrastive_backward), given the
    forward's inputs and ``stats``. Writes, in place, the caller-allocated gradients:
    ``grad_local_image``, ``grad_local_text`` (n, E), the local rows'; ``grad_all_image``,
    ``grad_all_text`` (N, E), the gathered rows', which the host reduce-scatters (sum) to
    their owners (any of the four may be None; they must not share memory with each other or
    the inputs: refused with InvalidArgumentError). When local and all are the same arrays,
    each modality's whole gradient goes to grad_local_* and grad_all_* is zeroed. Returns
    d(grad_loss * loss)/d logit_scale."""
    lib = _loader.load_library()
    fn = _loader.require(lib, "braid_contrastive_backward")
    inputs = [view(local_image, "local_image"), view(local_text, "local_text"), view(all_image, "all_image"),
              view(all_text, "all_text")]
    stats_view = view(stats, "stats")
    grads = [_output(grad_local_image, "grad_local_image"), _output(grad_local_text, "grad_local_text"),
             _output(grad_all_image, "grad_all_image"), _output(grad_all_text, "grad_all_text")]
    options = _options(row_offset, tile)
    grad_scale = ctypes.c_float()
    _loader._check(lib, fn(*[v.ref for v in inputs], _number("logit_scale", logit_scale), ctypes.byref(options),
                           stats_view.ref, _number("grad_loss", grad_loss),
                           *[g.ref if g is not None else None for g in grads],
                           ctypes.byref(grad_scale), _stream(inputs + grads, stream)))
    return float(grad_scale.value)
