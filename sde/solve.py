"""Entry point: solve the covariance SDE for many paths into the shared Dataset contract."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from shapedtx._validation import (
    check_bool,
    check_device,
    check_dtype,
    check_int,
    check_positive,
    check_progress,
)
from shapedtx.config import ModelConfig, check_config
from shapedtx.covariance import check_covariance
from shapedtx.options import RunOptions
from shapedtx.results import covariance_dataset

from .coefficients import sde_constants
from .options import SOLVERS, Solver
from .solvers import STEPPERS, gaussian_noise, integrate
from .time_grid import time_grid
from .torchsde_solver import solve_torchsde

METHODS: tuple[str, ...] = tuple(SOLVERS)
"""Solver names accepted by :func:`solve` (see :mod:`sde.options`)."""
SEED_MAX = 2**64 - 1
"""Largest seed (torch generators take an unsigned 64-bit seed)."""
DEFAULT_BOUND = 1e8
"""Default blow-up bound: a path beyond ``DEFAULT_BOUND * max_a V0^{aa}`` is flagged."""


def solve(
    config: ModelConfig,
    V0: Tensor,
    samples: int,
    *,
    T: float | None = None,
    dt: float | None = None,
    method: str | Solver = "euler",
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    save_every: int | None = None,
    bound: float = DEFAULT_BOUND,
    progress: bool | None = None,
    options: RunOptions | None = None,
    warn: bool = True,
) -> xr.Dataset:
    """Solve ``dV = b dt + Sigma^{1/2} dB`` (docs/theory.md#sde and #causal-sde) for ``samples``
    paths.

    Args:
        config: the model; must have an SDE limit (see :func:`sde.sde_constants`); causal
            shaped attention uses the causal SDE of docs/theory.md#causal-sde.
        V0: (m, m) positive-definite initial covariance.
        samples: number of independent paths.
        T: time horizon (default ``config.T = depth / width``).
        dt: largest step (default 0.01, or the solver object's); the actual step is
            ``T / ceil(T / dt)`` (:func:`sde.time_grid`; stored in attrs).
        method: a solver object (:class:`sde.FactoredEuler`, :class:`sde.EulerMaruyama`,
            :class:`sde.TorchSDE`, each with its ``dt``) or its name: ``"euler"`` (PSD-safe
            factored Euler, weak order 1), ``"em"`` (plain Euler-Maruyama, may leave the PSD
            cone: flagged) or ``"torchsde"``.
        save_every: save every this many steps (default: about 200 saved times) and at T.
        bound: a path exceeding ``bound * max_a V0^{aa}`` (or non-finite) is frozen and flagged.
        progress: tqdm progress bar (None: automatic, False: off).
        options: a :class:`shapedtx.options.RunOptions` (seed, device, dtype, progress)
            replacing those keyword arguments.
        warn: a RuntimeWarning with the number of exploded paths, if any (False for callers
            that report them themselves, e.g. :func:`simulations.run_comparison`).

    Returns:
        Dataset ``V (sample, t, token_a, token_b)`` per ``shapedtx.results`` with
        ``source="sde"`` and data variables ``exploded (sample)`` (bool) and
        ``t_explode (sample)`` (NaN where not exploded); attrs include ``dt``, ``solver``,
        ``steps``, ``bound`` and ``exploded_fraction``.
    """
    if options is not None:
        seed, device, dtype, progress = (
            options.seed,
            options.device,
            options.dtype,
            options.progress,
        )
    if isinstance(method, Solver):
        if dt is not None and dt != method.dt:
            raise ValueError(f"dt={dt!r} conflicts with the solver's dt={method.dt!r}; give one")
        solver = method
    elif isinstance(method, str) and method in SOLVERS:
        solver = SOLVERS[method](0.01 if dt is None else dt)
    else:
        raise ValueError(
            f"method must be one of {', '.join(map(repr, METHODS))} or a solver object "
            f"(sde.FactoredEuler, ...), got {method!r}"
        )
    method = solver.name
    check_config(config)
    check_int("samples", samples, 1)
    check_int("seed", seed, 0, SEED_MAX)
    check_positive("bound", bound)
    check_progress(progress)
    check_bool("warn", warn)
    check_dtype(dtype)
    device = check_device(device) if device is not None else None
    grid = time_grid(config, solver.dt, T=T, save_every=save_every)
    T, steps, step, every, saved = grid.T, grid.steps, grid.dt, grid.save_every, grid.saved
    V0 = check_covariance(V0).to(dtype=dtype, device=device)
    m = V0.shape[-1]
    sde_constants(config, m)  # raises for configurations without an SDE limit
    times = torch.as_tensor(grid.times, dtype=dtype)
    V0s = V0.expand(samples, m, m).contiguous()
    if method == "torchsde":
        # every step is evaluated (blow-ups are dated on the step grid, as for the other
        # solvers); the saved steps are kept
        all_times = torch.arange(steps + 1, dtype=dtype, device=V0.device) * step
        V, exploded, t_explode = solve_torchsde(
            config, V0s, all_times, dt=step, bound=bound, seed=seed
        )
        V = V[:, list(saved)]
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
    if fraction and warn:
        warnings.warn(
            f"sde.solve: {int(exploded_np.sum())} of {samples} paths exploded before T = "
            f"{float(T):.4g} (exceeded bound * max V0^aa or became non-finite; method="
            f"{method!r}, dt={step:.4g}); they are frozen and flagged: see the 'exploded' "
            "variable and the 'exploded_fraction' attribute",
            RuntimeWarning,
            stacklevel=2,
        )
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
