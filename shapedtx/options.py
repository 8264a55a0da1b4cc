"""One run-options object shared by the simulator and the SDE solver (seed, device, dtype,
progress bar, chunking): ``simulate(..., options=RunOptions(seed=1))``,
``sde.solve(..., options=RunOptions(seed=1))``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ._validation import check_device, check_dtype, check_int, check_progress

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

    def as_kwargs(self, *, chunking: bool = True) -> dict[str, Any]:
        """The keyword arguments of :func:`simulations.simulate` (``chunking=False``: of
        :func:`sde.solve`, which has no chunking)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not chunking:
            out.pop("chunk_size")
        return out
