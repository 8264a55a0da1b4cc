"""The simulation and SDE dtypes by name, shared by the simulator, the SDE solver, their
command-line options and :class:`simulations.Experiment`. Run settings (seed, device, dtype,
progress bar, chunking) are keyword arguments of the verbs:
``simulate(..., seed=1, dtype=torch.float32)``, ``sde.solve(..., seed=1)``."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}
"""The simulation and SDE dtypes by name (the one table; training also takes bfloat16)."""
