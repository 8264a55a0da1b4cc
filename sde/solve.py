"""Entry point: solve the covariance SDE for many paths into the shared Dataset contract."""

from __future__ import annotations

import math

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from shapedtx.config import ModelConfig
from shapedtx.covariance import check_covariance
from shapedtx.results import covariance_dataset

from .coefficients import sde_constants
from .solvers import STEPPERS, gaussian_noise, integrate, save_steps
from .torchsde_solver import solve_torchsde

METHODS: tuple[str, ...] = ("euler", "em", "torchsde")
DEFAULT_BOUND = 1e8


def _check_positive(name: str, value: object, kind: type = float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok or not math.isfinite(value) or value <= 0:  # type: ignore[arg-type]
        what = "an integer" if kind is int else "a finite number"
        raise ValueError(f"{name} must be {what} > 0, got {value!r}")


def solve(
    config: ModelConfig,
    V0: Tensor,
    samples: int,
    *,
    T: float | None = None,
    dt: float = 0.01,
    method: str = "euler",
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    save_every: int | None = None,
    bound: float = DEFAULT_BOUND,
    progress: bool | None = None,
) -> xr.Dataset:
    """Solve ``dV = b dt + Sigma^{1/2} dB`` (THEORY sections 3 and 3b) for ``samples`` paths.

    Args:
        config: the model; must have an SDE limit (see :func:`sde.sde_constants`); causal
            shaped attention uses the causal SDE of THEORY section 3b.
        V0: (m, m) positive-definite initial covariance.
        samples: number of independent paths.
        T: time horizon (default ``config.T = depth / width``).
        dt: step size; the actual step is ``T / ceil(T / dt)`` (stored in attrs).
        method: ``"euler"`` (PSD-safe factored Euler, weak order 1), ``"em"`` (plain
            Euler-Maruyama, may leave the PSD cone: flagged) or ``"torchsde"``.
        save_every: save every this many steps (default: about 200 saved times) and at T.
        bound: a path exceeding ``bound * max_a V0^{aa}`` (or non-finite) is frozen and flagged.
        progress: tqdm progress bar (None: automatic, False: off).

    Returns:
        Dataset ``V (sample, t, token_a, token_b)`` per ``shapedtx.results`` with
        ``source="sde"`` and data variables ``exploded (sample)`` (bool) and
        ``t_explode (sample)`` (NaN where not exploded); attrs include ``dt``, ``solver``,
        ``steps``, ``bound`` and ``exploded_fraction``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    _check_positive("samples", samples, int)
    _check_positive("dt", dt)
    _check_positive("bound", bound)
    T = config.T if T is None else T
    _check_positive("T", T)
    if save_every is not None:
        _check_positive("save_every", save_every, int)
    V0 = check_covariance(torch.as_tensor(V0).to(dtype=dtype, device=device))
    m = V0.shape[-1]
    sde_constants(config, m)  # raises for configurations without an SDE limit
    steps = max(1, math.ceil(T / dt - 1e-9))
    step = T / steps
    every = save_every or max(1, steps // 200)
    saved = save_steps(steps, every)
    times = torch.tensor(saved, dtype=dtype) * step
    V0s = V0.expand(samples, m, m).contiguous()
    if method == "torchsde":
        V, exploded, t_explode = solve_torchsde(
            config, V0s, times.to(V0.device), dt=step, bound=bound, seed=seed
        )
    else:
        generator = torch.Generator(device=V0.device).manual_seed(seed)
        noise = gaussian_noise((samples, 2, m, m), generator, dtype, V0.device)
        sol = integrate(
            STEPPERS[method](config, m),
            V0s,
            steps=steps,
            dt=step,
            save_every=every,
            noise=noise,
            bound=bound,
            progress=progress,
        )
        V, exploded, t_explode = sol.V, sol.exploded, sol.t_explode
    exploded_np = exploded.cpu().numpy()
    fraction = float(exploded_np.mean())
    return covariance_dataset(
        V,
        times.numpy(),
        config,
        source="sde",
        method=method,
        seed=seed,
        attrs={
            "solver": method,
            "dt": step,
            "T": float(T),
            "steps": steps,
            "save_every": every,
            "bound": float(bound),
            "exploded_fraction": fraction,
        },
        data_vars={
            "exploded": (("sample",), exploded_np.astype(bool)),
            "t_explode": (("sample",), np.asarray(t_explode.cpu().numpy(), dtype=np.float64)),
        },
    )
