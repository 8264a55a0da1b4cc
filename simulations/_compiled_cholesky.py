"""The Cholesky factors of a stack of small matrices, compiled, for the gram sampler: on
CPU faster than LAPACK's batched call for m <= 32, most for m <= 8 (where LAPACK's
per-matrix overhead dominates); the ratios, from ``benchmarks/bench_kernels.py``:
benchmarks/HISTORY.md, "Gram sampler"."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from shapedtx._numba import compile_kernel

MAX_SIZE = 32
"""Largest m computed by the compiled kernel; LAPACK's blocked algorithm wins above."""


def _factor(V: np.ndarray, L: np.ndarray, bad: np.ndarray) -> None:
    """L: (S, m, m) lower triangular with ``L L^T = V`` for each V: (S, m, m) (its lower
    triangle is read), and ``bad[s]`` where a pivot is not positive (or NaN): L is then
    unspecified for that s."""
    S, m = V.shape[0], V.shape[1]
    for s in range(S):
        bad[s] = False
        for j in range(m):
            d = V[s, j, j]
            for p in range(j):
                d -= L[s, j, p] * L[s, j, p]
            if not d > 0.0:
                bad[s] = True
                break
            d = math.sqrt(d)
            L[s, j, j] = d
            for i in range(j):
                L[s, i, j] = 0.0
            for i in range(j + 1, m):
                x = V[s, i, j]
                for p in range(j):
                    x -= L[s, i, p] * L[s, j, p]
                L[s, i, j] = x / d


@functools.cache
def _compiled() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """:func:`_factor` compiled on first use (then cached on disk)."""
    return compile_kernel(_factor)


def applies(V: Tensor) -> bool:
    """Whether :func:`cholesky` takes V: CPU float32/64, (S, m, m), m <= :data:`MAX_SIZE`."""
    return (
        V.device.type == "cpu"
        and V.dtype in (torch.float32, torch.float64)
        and V.dim() == 3
        and V.shape[-1] == V.shape[-2] <= MAX_SIZE
        and not V.requires_grad
    )


def cholesky(V: Tensor, out: Tensor) -> Tensor:
    """Lower Cholesky factors of V: (S, m, m) into ``out`` (C-contiguous, V's shape and
    dtype); returns where a factor does not exist (bool, (S,)), as ``cholesky_ex``'s
    ``info != 0`` (those rows of out are unspecified)."""
    if not applies(V) or not out.is_contiguous() or out.shape != V.shape or out.dtype != V.dtype:
        raise ValueError(
            "cholesky needs V: (S, m, m) on CPU (float32/64, m <= 32) and a "
            "C-contiguous out of the same shape and dtype"
        )
    bad = np.empty(V.shape[0], dtype=np.bool_)
    _compiled()(V.numpy(), out.numpy(), bad)
    return torch.from_numpy(bad)
