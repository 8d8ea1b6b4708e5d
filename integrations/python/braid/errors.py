"""The exceptions of the binding: one class per ``braid_status`` (braid.h).

Every failed call raises a :class:`BraidError` whose ``status`` is the C status and whose
``str()`` is the library's whole message (``braid_last_error()``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "OK",
    "ERR_INVALID_ARGUMENT",
    "ERR_BAD_CONFIG",
    "ERR_INFEASIBLE",
    "ERR_IO",
    "ERR_UNSUPPORTED",
    "ERR_INTERNAL",
    "ERR_OUT_OF_MEMORY",
    "ERR_PLUGIN",
    "BraidError",
    "InvalidArgumentError",
    "BadConfigError",
    "InfeasibleError",
    "BraidIOError",
    "UnsupportedError",
    "InternalError",
    "OutOfHostMemoryError",
    "PluginError",
    "LibraryNotFoundError",
    "AbiMismatchError",
]

# The braid_status values of braid.h (C enum values are not readable through ctypes).
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_BAD_CONFIG = 2
ERR_INFEASIBLE = 3
ERR_IO = 4
ERR_UNSUPPORTED = 5
ERR_INTERNAL = 6
ERR_OUT_OF_MEMORY = 7
ERR_PLUGIN = 8


class BraidError(Exception):
    """A failed braid call. ``status`` is the braid_status (see the ERR_* constants),
    ``message`` the whole message of braid_last_error(); ``str(error)`` is the message.

    ``BraidError(status, message)`` builds the subclass that matches ``status``
    (``BraidError(3, "...")`` is an :class:`InfeasibleError`)."""

    status: int = ERR_INTERNAL

    def __new__(cls, status: int = ERR_INTERNAL, message: str = "", *args: Any, **kwargs: Any):
        if cls is BraidError:
            cls = _ERROR_CLASSES.get(status, BraidError)
        return super().__new__(cls)

    def __init__(self, status: int = ERR_INTERNAL, message: str = "") -> None:
        super().__init__(status, message)
        self.status = int(status)
        self.message = message

    @property
    def status_name(self) -> str:
        """The library's short description of the status (braid_status_string: "bad
        configuration"), or "status N" when no library can be loaded."""
        from . import _loader

        try:
            return _loader.status_string(self.status)
        except BraidError:
            return f"status {self.status}"

    def __str__(self) -> str:
        return self.message or self.status_name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status!r}, {self.message!r})"

    def __reduce__(self):  # pickles as BraidError(status, message)
        return (BraidError, (self.status, self.message))


class InvalidArgumentError(BraidError):
    """BRAID_ERR_INVALID_ARGUMENT (1): a bad argument or option."""

    status = ERR_INVALID_ARGUMENT


class BadConfigError(BraidError):
    """BRAID_ERR_BAD_CONFIG (2): the YAML or plan given is malformed or inconsistent."""

    status = ERR_BAD_CONFIG


class InfeasibleError(BraidError):
    """BRAID_ERR_INFEASIBLE (3): valid input, but nothing fits (the message says what would)."""

    status = ERR_INFEASIBLE


class BraidIOError(BraidError):
    """BRAID_ERR_IO (4): a file could not be read."""

    status = ERR_IO


class UnsupportedError(BraidError):
    """BRAID_ERR_UNSUPPORTED (5): a valid request this build or strategy does not handle."""

    status = ERR_UNSUPPORTED


class InternalError(BraidError):
    """BRAID_ERR_INTERNAL (6): a bug in braid."""

    status = ERR_INTERNAL


class OutOfHostMemoryError(BraidError):
    """BRAID_ERR_OUT_OF_MEMORY (7): host allocation failed."""

    status = ERR_OUT_OF_MEMORY


class PluginError(BraidError):
    """BRAID_ERR_PLUGIN (8): a plugin could not be loaded or is incompatible."""

    status = ERR_PLUGIN


class LibraryNotFoundError(BraidIOError):
    """libbraid.so could not be found or loaded (status BRAID_ERR_IO)."""


class AbiMismatchError(UnsupportedError):
    """The loaded libbraid.so implements another ABI version, or lacks an entry point
    the binding needs (status BRAID_ERR_UNSUPPORTED)."""


_ERROR_CLASSES = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_BAD_CONFIG: BadConfigError,
    ERR_INFEASIBLE: InfeasibleError,
    ERR_IO: BraidIOError,
    ERR_UNSUPPORTED: UnsupportedError,
    ERR_INTERNAL: InternalError,
    ERR_OUT_OF_MEMORY: OutOfHostMemoryError,
    ERR_PLUGIN: PluginError,
}


def invalid_argument(message: str) -> InvalidArgumentError:
    """An :class:`InvalidArgumentError` raised by the binding itself (before any C call)."""
    return InvalidArgumentError(ERR_INVALID_ARGUMENT, message)
