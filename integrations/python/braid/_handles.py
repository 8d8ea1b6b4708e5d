"""Lifetimes of the C handles, and the argument checks every area shares."""

from __future__ import annotations

import ctypes
import operator
import os
import threading
from typing import Any, Optional, Union

from . import _loader
from . import _structs as S
from .errors import invalid_argument

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class Handle:
    """A C handle freed deterministically: ``close()``, leaving a ``with`` block, or
    garbage collection, whichever comes first. ``_destroy``: the name of the C function
    that frees it (braid_<area>_destroy), resolved on ``_lib``."""

    _destroy = ""

    def _free(self, handle: Any) -> None:
        getattr(self._lib, self._destroy)(handle)

    def __enter__(self):
        self._ptr()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class SharedHandle(Handle):
    """A handle others point into (a Config for its plans, a Program for its
    simulations): ``close()`` frees it once the last of them is closed."""

    def _init_shared(self) -> None:
        self._closed = False
        self._dependents = 0
        # Reentrant: a garbage collection inside a locked section (building an exception)
        # may close a dependent whose _release takes this lock on the same thread.
        self._lock = threading.RLock()

    def _ptr(self):
        if self._closed or not self._handle:
            raise invalid_argument(f"the braid {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._closed

    def _retain(self) -> None:
        with self._lock:
            self._ptr()
            self._dependents += 1

    def _release(self) -> None:
        with self._lock:
            self._dependents -= 1
            self._destroy_if_unused()

    def _destroy_if_unused(self) -> None:
        if self._closed and self._dependents == 0 and self._handle:
            handle, self._handle = self._handle, type(self._handle)()
            self._free(handle)

    def close(self) -> None:
        """Frees the handle now, or when the last object made from it is closed."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ did not finish
            return
        with lock:
            self._closed = True
            self._destroy_if_unused()


class OwnedHandle(Handle):
    """A handle that points into its owner (a Plan into its Config, a Simulation into
    its Program) and keeps it alive until closed; ``_owner`` None: self-contained."""

    _owner = None

    def _ptr(self):
        if not self._handle:
            raise invalid_argument(f"the braid {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return not self._handle

    def close(self) -> None:
        """Frees the handle (idempotent)."""
        handle = getattr(self, "_handle", None)
        if not handle:
            return
        self._handle = type(handle)()
        self._free(handle)
        if self._owner is not None:
            self._owner._release()


def int_arg(name: str, value: Any, low: int = -(2**31), high: int = 2**31 - 1) -> int:
    """``value`` as an int in [low, high] (default: an int32), else InvalidArgumentError."""
    if isinstance(value, bool):
        raise invalid_argument(f"{name} must be an int, not bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise invalid_argument(f"{name} must be an int, not {type(value).__name__}") from None
    if not low <= value <= high:
        if (low, high) == (-(2**31), 2**31 - 1):
            raise invalid_argument(f"{name} {value} does not fit an int32")
        raise invalid_argument(f"{name} {value} is out of range ({low}..{high})")
    return value


def c_string(text: bytes, what: str) -> bytes:
    """``text`` for a C string argument: a NUL inside it would end it early, and the library
    would silently read another path, name or document than the one given."""
    at = text.find(b"\0")
    if at >= 0:
        raise invalid_argument(f"{what} holds a NUL byte at offset {at}")
    return text


def path_arg(path: PathLike) -> bytes:
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise invalid_argument(f"path must be a str, bytes or os.PathLike, not {type(path).__name__}")
    return c_string(os.fsencode(path), "path")


def name_arg(name: Optional[Union[str, bytes]], what: str, choices=None) -> Optional[bytes]:
    """An optional name (a schedule) as bytes for the C call; None stays NULL."""
    if name is None:
        return None
    if isinstance(name, str):
        return c_string(name.encode("utf-8"), what)
    if isinstance(name, bytes):
        return c_string(name, what)
    listed = f" ({', '.join(choices())})" if choices else ""
    raise invalid_argument(f"{what} must be a name{listed}, not {type(name).__name__}")


def read(lib: ctypes.CDLL, fn, struct_type, *args):
    """Calls ``fn(*args, &out)`` with a fresh ``struct_type`` and returns it."""
    out = S.new(struct_type)
    _loader._check(lib, fn(*args, ctypes.byref(out)))
    return out


def count(lib: ctypes.CDLL, fn, *args) -> int:
    """Calls ``fn(*args, &size_t)`` and returns the count."""
    n = ctypes.c_size_t()
    _loader._check(lib, fn(*args, ctypes.byref(n)))
    return n.value


def text_out(lib: ctypes.CDLL, fn, *args) -> str:
    """Calls ``fn(*args, &const char*)`` and returns the text."""
    out = ctypes.c_char_p()
    _loader._check(lib, fn(*args, ctypes.byref(out)))
    return _loader.text(out.value)
