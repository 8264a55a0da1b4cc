"""The limiting neural covariance SDE of shaped Transformers (docs/theory.md#sde; causal shaped
attention: docs/theory.md#causal-sde).

``drift(config, V)`` and ``diffusion(config, V)`` are the coefficients, ``sample_noise`` draws
increments with covariance ``diffusion`` without an (m^2 x m^2) square root, and ``solve``
integrates many paths into the shared covariance Dataset (``shapedtx.results``; ``solve_resolved``
is its core on arguments checked once by a caller);
``solve_batch`` integrates many configurations together (their final states only).
"""

from .coefficients import (
    SDEConstants,
    arccos_kernel,
    diffusion,
    drift,
    mlp_k_lin,
    nu,
    sde_constants,
)
from .kernel_map import kernel_nonlinearity, mlp_block_mean, mlp_kernel
from .noise import psd_factor, sample_noise
from .options import SOLVERS, EulerMaruyama, FactoredEuler, Solver, TorchSDE
from .solve import solve, solve_batch, solve_resolved
from .solvers import integrate
from .time_grid import TimeGrid, time_grid
from .torchsde_solver import CovarianceSDE, solve_torchsde

__all__ = [
    "SOLVERS",
    "CovarianceSDE",
    "EulerMaruyama",
    "FactoredEuler",
    "SDEConstants",
    "Solver",
    "TimeGrid",
    "TorchSDE",
    "arccos_kernel",
    "diffusion",
    "drift",
    "integrate",
    "kernel_nonlinearity",
    "mlp_block_mean",
    "mlp_k_lin",
    "mlp_kernel",
    "nu",
    "psd_factor",
    "sample_noise",
    "sde_constants",
    "solve",
    "solve_batch",
    "solve_resolved",
    "solve_torchsde",
    "time_grid",
]
