"""A loaded run (braid_config): model, cluster, training settings, input sizes."""

from __future__ import annotations

import ctypes
import difflib
import os
from typing import Any, Optional, Union

from . import _loader
from . import _structs as S
from . import vocab
from ._handles import PathLike, SharedHandle, c_string, int_arg, path_arg
from .errors import invalid_argument
from .records import RunSettings

__all__ = ["Config"]

_SETTABLE = [name for name, _ in S.braid_run_settings._fields_ if name not in ("struct_size", "version")]


class Config(SharedHandle):
    """A loaded and validated run (braid_config). Use :meth:`from_file` or :meth:`from_string`.

    ``close()`` (or leaving a ``with`` block) frees it once no :class:`~braid.Plan` made
    from it is still open; plans keep their config alive."""

    _destroy = "braid_config_destroy"

    def __init__(self, handle: "S.ConfigPtr", lib: ctypes.CDLL, source: str) -> None:
        self._lib = lib
        self._handle = handle
        self._source = source
        self._init_shared()

    @classmethod
    def from_file(cls, path: PathLike) -> "Config":
        """Loads a run file; its model:/cluster: paths are relative to the file."""
        lib = _loader.load_library()
        out = S.ConfigPtr()
        _loader._check(lib, lib.braid_config_load_file(path_arg(path), ctypes.byref(out)))
        return cls(out, lib, os.fsdecode(path))

    @classmethod
    def from_string(cls, yaml: Union[str, bytes], base_dir: Optional[PathLike] = None) -> "Config":
        """Loads a run from YAML text; relative model:/cluster: paths resolve against
        ``base_dir`` (default: the current directory). Errors name the text "<string>"."""
        if not isinstance(yaml, (str, bytes)):
            raise invalid_argument(f"yaml must be str, not {type(yaml).__name__}")
        lib = _loader.load_library()
        text = c_string(yaml.encode("utf-8") if isinstance(yaml, str) else yaml, "yaml")
        base = None if base_dir is None else path_arg(base_dir)
        out = S.ConfigPtr()
        _loader._check(lib, lib.braid_config_load_string(text, base, ctypes.byref(out)))
        return cls(out, lib, "<string>")

    @property
    def devices(self) -> int:
        """Devices of the run's cluster (nodes x devices per node)."""
        out = ctypes.c_int32()
        _loader._check(self._lib, self._lib.braid_config_devices(self._ptr(), ctypes.byref(out)))
        return out.value

    def _settings_struct(self) -> S.braid_run_settings:
        fn = _loader.require(self._lib, "braid_config_run_settings")
        settings = S.new(S.braid_run_settings)
        settings.version = S.RUN_SETTINGS_VERSION
        _loader._check(self._lib, fn(self._ptr(), ctypes.byref(settings)))
        return settings

    @property
    def run_settings(self) -> Any:
        """The run's training settings and nominal input sizes, a :class:`~braid.records.RunSettings`
        (braid_config_run_settings): global_batch, microbatch_size, contrastive_batch,
        precision, zero_stage, recompute, attention, sequence_parallel, schedule,
        virtual_stages, overlap_grad_reduce, image_resolution, text_tokens, audio_tokens,
        generated_image_resolution, overlap_param_gather, tp_comm_overlap, fused_kernels, fp8."""
        return RunSettings.from_struct(self._settings_struct())

    def set_run_settings(self, **fields: Any) -> Any:
        """Changes some of the run's settings (braid_config_set_run_settings), by their
        :attr:`run_settings` names: ``config.set_run_settings(microbatch_size=2,
        recompute="full")``. The library checks them as it checks the run file
        (:class:`~braid.InvalidArgumentError` names the field and its run-file key) and
        leaves the config unchanged on error. Plans made before keep their settings.
        Returns the new :attr:`run_settings`."""
        setter = _loader.require(self._lib, "braid_config_set_run_settings")
        settings = self._settings_struct()
        enums = getattr(S.braid_run_settings, "_enums_", {})
        keep = []  # strings must live until the call returns
        for name, value in fields.items():
            if name not in _SETTABLE:
                guess = difflib.get_close_matches(name, _SETTABLE, n=1)
                hint = f" (did you mean '{guess[0]}'?)" if guess else ""
                raise invalid_argument(f"unknown run setting '{name}'{hint}; the settings are {', '.join(_SETTABLE)}")
            ctype = dict(S.braid_run_settings._fields_)[name]
            if name in enums:
                setattr(settings, name, vocab.value_of(enums[name], value, name))
            elif ctype is ctypes.c_char_p:
                if value is not None and not isinstance(value, (str, bytes)):
                    raise invalid_argument(f"{name} must be a str, not {type(value).__name__}")
                encoded = value.encode("utf-8") if isinstance(value, str) else value
                if encoded is not None:
                    encoded = c_string(encoded, name)
                keep.append(encoded)
                setattr(settings, name, encoded)
            elif ctype is ctypes.c_int64:
                setattr(settings, name, int_arg(name, int(value) if isinstance(value, bool) else value,
                                                -(2**63), 2**63 - 1))
            else:
                setattr(settings, name, int_arg(name, int(value) if isinstance(value, bool) else value))
        _loader._check(self._lib, setter(self._ptr(), ctypes.byref(settings)))
        return self.run_settings

    def plan(self, strategy: Union[str, int] = "auto", tp: int = 0, pp: int = 0, dp: int = 0,
             plan_yaml: Optional[str] = None, schedule: Optional[str] = None, virtual_stages: int = 0,
             microbatch_size: int = 0) -> "Any":
        """Plans this run: the same as :func:`braid.plan` (config, ...)."""
        from .plan import plan

        return plan(self, strategy=strategy, tp=tp, pp=pp, dp=dp, plan_yaml=plan_yaml, schedule=schedule,
                    virtual_stages=virtual_stages, microbatch_size=microbatch_size)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<braid.Config {self._source!r} ({state})>"
