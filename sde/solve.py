"""Entry point: solve the covariance SDE for many paths into the shared Dataset contract."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from shapedtx._validation import (
    ParameterError,
    check_bool,
    check_device,
    check_dtype,
    check_int,
    check_positive,
    check_progress,
)
from shapedtx.config import ModelConfig, check_config
from shapedtx.covariance import check_covariance
from shapedtx.results import covariance_dataset

from .coefficients import SDEConstants, sde_constants
from .options import FactoredEuler, Solver, as_solver
from .solvers import _integrate, gaussian_noise
from .time_grid import TimeGrid, time_grid

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
    warn: bool = True,
    step_error: bool = False,
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
        warn: a RuntimeWarning with the number of exploded paths, if any (False for callers
            that report them themselves, e.g. :func:`simulations.run_comparison`).
        step_error: also solve at ``dt / 2`` on the same Brownian paths (the half steps'
            increments add up to the step's; docs/theory.md#step-error), for the step-error
            estimate of :func:`simulations.compare`. ``V`` is unchanged (the same numbers as
            without); the solve costs about 3 times as much. Needs ``"euler"`` or ``"em"``.

    Returns:
        Dataset ``V (sample, t, token_a, token_b)`` per ``shapedtx.results`` with
        ``source="sde"`` and data variables ``exploded (sample)`` (bool) and
        ``t_explode (sample)`` (NaN where not exploded); attrs include ``dt``, ``solver``,
        ``steps``, ``bound`` and ``exploded_fraction``. With ``step_error``: also
        ``V_half`` (the solution at ``dt / 2`` at the same times), ``exploded_half``,
        ``t_explode_half`` and attrs ``dt_half``, ``step_error = "paired dt/2"``.
    """
    solver = as_solver(method, dt)
    check_config(config)
    check_int("samples", samples, 1)
    check_int("seed", seed, 0, SEED_MAX)
    check_positive("bound", bound)
    check_progress(progress)
    check_bool("warn", warn)
    check_bool("step_error", step_error)
    check_dtype(dtype)
    device = check_device(device) if device is not None else None
    grid = time_grid(config, solver.dt, T=T, save_every=save_every)
    V0 = check_covariance(V0).to(dtype=dtype, device=device)
    constants = sde_constants(config, V0.shape[-1])  # raises for models without an SDE limit
    return solve_resolved(
        config, V0, samples, solver=solver, grid=grid, constants=constants, seed=seed,
        bound=bound, progress=progress, warn=warn, step_error=step_error,
    )  # fmt: skip


def solve_resolved(
    config: ModelConfig,
    V0: Tensor,
    samples: int,
    *,
    solver: Solver,
    grid: TimeGrid,
    constants: SDEConstants,
    seed: int,
    bound: float,
    progress: bool | None,
    warn: bool,
    step_error: bool,
) -> xr.Dataset:
    """:func:`solve` on arguments its caller has checked and resolved once: ``config`` checked,
    ``V0`` (m, m) checked, in the run's dtype and on its device, the solver object, its time grid
    (:func:`sde.time_grid`) and ``config``'s constants for m tokens (:func:`sde.sde_constants`).
    Nothing is checked again: for library verbs that validate once and solve as one of their
    stages (:func:`simulations.run_comparison`); everyone else calls :func:`solve`.

    Returns:
        the Dataset of :func:`solve`.
    """
    method, T, steps, step, every = solver.name, grid.T, grid.steps, grid.dt, grid.save_every
    m = V0.shape[-1]
    dtype = V0.dtype
    times = torch.as_tensor(grid.times, dtype=dtype)
    V0s = V0.expand(samples, m, m).contiguous()
    extra_vars: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    extra_attrs: dict[str, object] = {}
    if step_error:
        V, V_half, exploded, exploded_half, t_explode, t_half = solver.paired_paths(
            config, V0s, grid, seed=seed, bound=bound, progress=progress, constants=constants
        )
        extra_vars = {
            "V_half": (("sample", "t", "token_a", "token_b"), V_half.cpu().numpy()),
            "exploded_half": (("sample",), exploded_half.cpu().numpy().astype(bool)),
            "t_explode_half": (("sample",), t_half.cpu().numpy().astype(np.float64)),
        }
        extra_attrs = {"step_error": "paired dt/2", "dt_half": step / 2}
    else:
        V, exploded, t_explode = solver.paths(
            config, V0s, grid, seed=seed, bound=bound, progress=progress, constants=constants
        )
    exploded_np = exploded.cpu().numpy()
    fraction = float(exploded_np.mean())
    half = int(extra_vars["exploded_half"][1].sum()) if step_error else 0
    if (fraction or half) and warn:
        at_half = f" ({half} at dt / 2)" if step_error else ""
        warnings.warn(
            f"sde.solve: {int(exploded_np.sum())}{at_half} of {samples} paths exploded before "
            f"T = {float(T):.4g} (exceeded bound * max V0^aa or became non-finite; method="
            f"{method!r}, dt={step:.4g}); they are frozen and flagged: see the 'exploded' "
            "variable and the 'exploded_fraction' attribute",
            RuntimeWarning,
            stacklevel=3,  # the caller of sde.solve
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
            **extra_attrs,
        },
        data_vars={
            "exploded": (("sample",), exploded_np.astype(bool)),
            "t_explode": (("sample",), np.asarray(t_explode.cpu().numpy(), dtype=np.float64)),
            **extra_vars,
        },
    )


def solve_batch(
    configs: Sequence[ModelConfig],
    V0: Tensor,
    samples: int | Sequence[int],
    *,
    T: float,
    steps: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    bound: float = DEFAULT_BOUND,
    progress: bool | None = False,
) -> list[tuple[Tensor, Tensor]]:
    """``(V_T (samples_i, m, m), exploded (samples_i,))`` for each of many configurations,
    integrated together: the factored Euler scheme of :func:`solve` (``method="euler"``) with
    each configuration's constants on its own rows (:class:`sde.solvers.FactoredEulerStep`
    with ``paths``), for screening many (gamma, tau0) at once (``simulations.advise``).

    Args:
        configs: the models (each with an SDE limit); causal and non-causal ones are
            integrated as two batches (non-causal first).
        V0: (m, m) positive-definite initial covariance, shared.
        samples: paths per configuration, one int for all or one per configuration.
        T, steps: ``steps`` equal steps of ``T / steps`` (no time grid; only V_T is kept).
        seed: the non-causal batch's normals come from a generator seeded with ``seed``, the
            causal batch's with ``seed + 1`` (:func:`sde.solvers.gaussian_noise`, shape
            ``(sum of the batch's samples, 2, m, m)`` per step).
        dtype, device: of the computation (default float32 on V0's device).
        bound, progress: as for :func:`solve` (progress: a bar over each batch's steps).

    A configuration alone in a batch gets the same numbers as :func:`solve` with
    ``method="euler"``, ``dt = T / steps``, the same seed and dtype, at its last time.
    """
    configs = list(configs)
    if not configs:
        raise ParameterError("configs", "configs must not be empty")
    if not isinstance(samples, Sequence):  # one count for all (checked as each one)
        samples = [samples] * len(configs)
    counts = [check_int("samples", n, 1) for n in samples]
    if len(counts) != len(configs):
        raise ParameterError(
            "samples",
            f"samples must be one int or one per configuration ({len(configs)}), got {len(counts)}",
        )
    for config in configs:
        check_config(config)
    check_int("steps", steps, 1)
    check_positive("T", T)
    check_int("seed", seed, 0, SEED_MAX - 1)
    check_dtype(dtype)
    device = check_device(device) if device is not None else None
    V0 = check_covariance(V0).to(dtype=dtype, device=device)
    m = V0.shape[-1]
    out: list[tuple[Tensor, Tensor] | None] = [None] * len(configs)
    for offset, causal in enumerate((False, True)):
        batch = [i for i, c in enumerate(configs) if c.causal == causal]
        if not batch:
            continue
        rows = [counts[i] for i in batch]
        stepper = FactoredEuler().stepper([configs[i] for i in batch], m, paths=rows)
        B = sum(rows)
        V0s = V0.expand(B, m, m).contiguous()
        generator = torch.Generator(device=V0.device).manual_seed(seed + offset)
        sol = _integrate(
            stepper,
            V0s,
            steps=steps,
            dt=T / steps,
            save_every=steps,
            noise=gaussian_noise((B, 2, m, m), generator, dtype, V0.device),
            bound=bound,
            progress=progress,
        )
        VT = sol.V[:, -1].split(rows)
        exploded = sol.exploded.split(rows)
        for j, i in enumerate(batch):
            out[i] = (VT[j], exploded[j])
    solved = [o for o in out if o is not None]
    assert len(solved) == len(out)  # every configuration is in one of the two batches
    return solved
