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

    def __reduce__(self):  # pickles as its own class (LibraryNotFoundError stays one)
        return (type(self), (self.status, self.message))


# BraidError(status, ...) builds the class of that status, registered by _status_class.
_ERROR_CLASSES: dict = {}


def _status_class(status: int, name: str, meaning: str) -> type:
    """The BraidError subclass `name` of `status`, documented as "BRAID_ERR_<X> (<status>):
    <meaning>"."""
    constant = next(k for k, v in globals().items() if k.startswith("ERR_") and v == status)
    doc = f"BRAID_{constant} ({status}): {meaning}"
    cls = type(name, (BraidError,), {"__doc__": doc, "__module__": __name__, "status": status})
    _ERROR_CLASSES[status] = cls
    return cls


# One class per braid_status but OK.
InvalidArgumentError = _status_class(ERR_INVALID_ARGUMENT, "InvalidArgumentError", "a bad argument or option.")
BadConfigError = _status_class(ERR_BAD_CONFIG, "BadConfigError", "the YAML or plan given is malformed or inconsistent.")
InfeasibleError = _status_class(
    ERR_INFEASIBLE, "InfeasibleError", "valid input, but nothing fits (the message says what would)."
)
BraidIOError = _status_class(ERR_IO, "BraidIOError", "a file could not be read.")
UnsupportedError = _status_class(
    ERR_UNSUPPORTED, "UnsupportedError", "a valid request this build or strategy does not handle."
)
InternalError = _status_class(ERR_INTERNAL, "InternalError", "a bug in braid.")
OutOfHostMemoryError = _status_class(ERR_OUT_OF_MEMORY, "OutOfHostMemoryError", "host allocation failed.")
PluginError = _status_class(ERR_PLUGIN, "PluginError", "a plugin could not be loaded or is incompatible.")


class LibraryNotFoundError(BraidIOError):
    """libbraid.so could not be found or loaded (status BRAID_ERR_IO)."""


class AbiMismatchError(UnsupportedError):
    """The loaded libbraid.so implements another ABI version, or lacks an entry point
    the binding needs (status BRAID_ERR_UNSUPPORTED)."""


def invalid_argument(message: str) -> InvalidArgumentError:
    """An :class:`InvalidArgumentError` raised by the binding itself (before any C call)."""
    return InvalidArgumentError(ERR_INVALID_ARGUMENT, message)
