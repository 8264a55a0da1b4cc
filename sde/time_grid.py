"""The one time-grid rule of the covariance SDE: steps, step size and saved times for a
horizon ``T`` (default ``depth / width``; docs/theory.md#notation), used by :func:`sde.solve`, the
sweeps and the comparison with finite networks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shapedtx._validation import ParameterError, check_int, check_positive
from shapedtx.config import ModelConfig, check_config

MAX_SAVED = 200
"""Default number of saved times (about; the last step is always saved)."""
MAX_STEPS = 10**7
"""Most steps of one solve: a larger ``T / dt`` is refused (at about a microsecond per path
and step it would run for days); raise dt or lower T."""


def save_steps(steps: int, save_every: int) -> list[int]:
    """Saved step indices: 0, save_every, 2 save_every, ... and always the last step."""
    out = list(range(0, steps + 1, save_every))
    if out[-1] != steps:
        out.append(steps)
    return out


@dataclass(frozen=True)
class TimeGrid:
    """``steps`` steps of size ``dt = T / steps``; states saved at the step indices ``saved``.

    ``times`` are the saved times ``saved * dt`` (0 and T included).
    """

    T: float
    steps: int
    dt: float
    save_every: int
    saved: tuple[int, ...]

    @property
    def times(self) -> np.ndarray:
        return np.asarray(self.saved, dtype=np.float64) * self.dt


def time_grid(
    config: ModelConfig, dt: float, *, T: float | None = None, save_every: int | None = None
) -> TimeGrid:
    """The SDE's time grid: ``steps = ceil(T / dt)`` (so the step ``T / steps`` is at most
    ``dt`` and the grid ends exactly at T), saving every ``save_every`` steps (default about
    :data:`MAX_SAVED` times) and at T. ParameterError names a bad argument."""
    T = check_config(config).T if T is None else T
    check_positive("dt", dt)
    check_positive("T", T)
    if save_every is not None:
        check_int("save_every", save_every, 1)
    steps = max(1, math.ceil(T / dt - 1e-9))
    if steps > MAX_STEPS:
        raise ParameterError(
            "dt",
            f"T / dt must be at most {MAX_STEPS:.0e} steps, got T = {T:g}, dt = {dt:g} "
            f"({steps:.3g} steps): raise dt or lower T (T = depth / width)",
        )
    every = save_every or max(1, steps // MAX_SAVED)
    return TimeGrid(float(T), steps, T / steps, every, tuple(save_steps(steps, every)))
