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


def run_settings(
    options: RunOptions | None, *, chunking: bool = True, **given: Any
) -> dict[str, Any]:
    """The run settings of a call that takes both keyword arguments and ``options``: the
    keywords ``given`` (by name) when ``options`` is None, else ``options``'s values of the
    same names. One way only: a keyword that differs from its default beside ``options`` is
    refused, and so is an ``options.chunk_size`` where the call has no chunking
    (``chunking=False``), instead of either being silently dropped."""
    if options is None:
        return given
    if not isinstance(options, RunOptions):
        raise ParameterError(
            "options", f"options must be a RunOptions or None, got {type(options).__name__}"
        )
    defaults = {f.name: f.default for f in fields(RunOptions)}
    clash = [k for k, v in given.items() if not (v is defaults[k] or v == defaults[k])]
    if clash:
        raise ParameterError(
            "options",
            f"{', '.join(clash)} given both as a keyword and through options: pass the run "
            "settings one way",
        )
    if not chunking and options.chunk_size is not None:
        raise ParameterError(
            "options",
            f"options.chunk_size must be None here (this call has no chunking), got "
            f"{options.chunk_size}",
        )
    return {k: getattr(options, k) for k in given}
