"""The DeepSpeed release braid.deepspeed was written against, and the check of the one
imported. The engine subclasses private parts of DeepSpeed's PipelineEngine
(``_INSTRUCTION_MAP``, ``_exec_*``, ``pipe_buffers``), which change between releases
without notice: another release is refused rather than half-working."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

#: The DeepSpeed release the engine subclasses.
DEEPSPEED_VERSION = "0.14.5"


class DeepSpeedVersionError(ImportError):
    """The DeepSpeed imported is not :data:`DEEPSPEED_VERSION`."""


def deepspeed_version(deepspeed: ModuleType) -> str:
    """The release of an imported ``deepspeed`` package.

    An installed DeepSpeed reports it as ``__version__``. A source tree used through
    PYTHONPATH reports "0.0.0" unless the working directory holds its version.txt; its
    release is then the version.txt next to the package folder."""
    version = str(getattr(deepspeed, "__version__", "") or "")
    if version and not version.startswith("0.0.0"):
        return version
    path = _version_txt(deepspeed)
    if path:
        with open(path, "r", encoding="utf-8") as f:
            return f.read().strip()
    return version or "unknown"


def _version_txt(deepspeed: ModuleType) -> Optional[str]:
    package = getattr(deepspeed, "__file__", None)
    if not package:
        return None
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(package))), "version.txt")
    return path if os.path.isfile(path) else None


def _release(version: str) -> str:
    return version.split("+", 1)[0].strip()  # "0.14.5+abc123" is a build of 0.14.5


def check_deepspeed_version(deepspeed: ModuleType, expected: str = DEEPSPEED_VERSION) -> str:
    """Returns the release of ``deepspeed``, or raises :class:`DeepSpeedVersionError` naming
    both releases when it is not ``expected``."""
    found = deepspeed_version(deepspeed)
    if _release(found) != expected:
        where = os.path.dirname(os.path.abspath(getattr(deepspeed, "__file__", "") or "deepspeed"))
        raise DeepSpeedVersionError(
            f"braid.deepspeed was written against DeepSpeed {expected} (it subclasses private parts of its "
            f"PipelineEngine), but the DeepSpeed imported from {where} is {found}; "
            f"install deepspeed=={expected}, or put a DeepSpeed {expected} tree on PYTHONPATH (BRAID_DEEPSPEED_PATH in the tests)"
        )
    return found
