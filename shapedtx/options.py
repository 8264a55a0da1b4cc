"""One run-options object shared by the simulator and the SDE solver (seed, device, dtype,
progress bar, chunking): ``simulate(..., options=RunOptions(seed=1))``,
``sde.solve(..., options=RunOptions(seed=1))``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ._validation import (
    ParameterError,
    check_device,
    check_dtype,
    check_int,
    check_progress,
)

DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}
"""The simulation and SDE dtypes by name (the one table; training also takes bfloat16)."""


@dataclass(frozen=True)
class RunOptions:
    """Seed, device, dtype, progress bar and chunking of one run (validated)."""

    seed: int = 0
    device: str | None = None
    dtype: torch.dtype = torch.float64
    progress: bool | None = None
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        if self.device is not None:
            check_device(self.device)
        check_dtype(self.dtype)
        check_progress(self.progress)
        if self.chunk_size is not None:
            check_int("chunk_size", self.chunk_size, 1)


def run_settings(options: RunOptions | None, **given: Any) -> dict[str, Any]:
    """The run settings of a call that takes both keyword arguments and ``options``: the
    keywords ``given`` (by name: the settings the call honours) when ``options`` is None, else
    ``options``'s values of the same names. One way only, nothing dropped: a keyword that
    differs from its default beside ``options`` is refused, and so is an ``options`` field the
    call does not honour (not among ``given``, e.g. ``chunk_size`` for ``sde.solve``, which
    has no chunking) unless it is at its default (ParameterError naming ``options``)."""
    if options is None:
        return given
    if not isinstance(options, RunOptions):
        raise ParameterError(
            "options", f"options must be a RunOptions or None, got {type(options).__name__}"
        )
    defaults = {f.name: f.default for f in fields(RunOptions)}
    clash = [k for k, v in given.items() if v != defaults[k]]
    if clash:
        raise ParameterError(
            "options",
            f"{', '.join(clash)} given both as a keyword and through options: pass the run "
            "settings one way",
        )
    for name, default in defaults.items():
        value = getattr(options, name)
        if name not in given and value != default:
            raise ParameterError(
                "options",
                f"options.{name} must be {default!r} here (this call does not use it), got "
                f"{value!r}",
            )
    return {k: getattr(options, k) for k in given}
