"""The causal centring of shaped attention in training, compiled (docs/theory.md#layers).

On CPU, in float32 and float64, :class:`shapedtx.attention._CentredSum` computes
``(I - C) v + attended`` and its backward ``(I - C)^T g`` (C the causal uniform matrix,
``C_ij = 1 / (i + 1)`` for ``j <= i``) with these kernels: one running sum over tokens per
feature, each input read once or twice and the result written once, instead of torch's
batched block products and elementwise passes, faster than the torch form on one thread (the
ratio, from ``benchmarks/bench_kernels.py``: benchmarks/RESULTS.md, "Shaped attention in
training: fused centring"). The running sums are kept in float64 whatever the input's
precision, so float32 results are rounded once. The kernels run on the calling thread.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ._numba import compile_kernel


def _centred_sum(x: np.ndarray, a: np.ndarray, out: np.ndarray) -> None:
    """``out[s] = (I - C) x[s] + a[s]``; x, a, out: (S, m, d)."""
    S, m, d = x.shape
    running = np.empty(d, np.float64)
    for s in range(S):
        running[:] = 0.0
        for i in range(m):
            w = 1.0 / (i + 1)
            for c in range(d):
                xi = x[s, i, c]
                running[c] += xi
                out[s, i, c] = xi - running[c] * w + a[s, i, c]


def _centring_transpose(g: np.ndarray, out: np.ndarray) -> None:
    """``out[s] = (I - C)^T g[s]``, i.e. ``out_i = g_i - sum_{j >= i} g_j / (j + 1)``;
    g, out: (S, m, d). Two ascending passes (the weighted total, then subtracting the
    terms already passed): memory read in descending order was slower above the caches
    (benchmarks/HISTORY.md, "Shaped attention in training: fused centring")."""
    S, m, d = g.shape
    after = np.empty(d, np.float64)
    for s in range(S):
        after[:] = 0.0
        for i in range(m):
            w = 1.0 / (i + 1)
            for c in range(d):
                after[c] += g[s, i, c] * w
        for i in range(m):
            w = 1.0 / (i + 1)
            for c in range(d):
                gi = g[s, i, c]
                out[s, i, c] = gi - after[c]
                after[c] -= gi * w


@functools.cache
def _compiled(kernel: Callable[..., None]) -> Callable[..., None]:
    """``kernel`` compiled on first use (then cached on disk)."""
    return compile_kernel(kernel)


def applies(x: Tensor, *others: Tensor) -> bool:
    """Whether the compiled kernels take x and the other operands: CPU tensors of x's dtype,
    float32 or float64, (..., m, d), outside ``torch.compile`` (which traces and fuses the
    torch form instead; the check imports nothing, unlike ``torch.compiler.disable``, which
    costs every import of shapedtx the 4 s of ``torch._dynamo``)."""
    return (
        not torch.compiler.is_compiling()
        and x.dtype in (torch.float32, torch.float64)
        and x.dim() >= 2
        and all(t.device.type == "cpu" and t.dtype == x.dtype for t in (x, *others))
    )


def _rows(x: Tensor) -> np.ndarray:
    """x: (..., m, d) as a C-contiguous (S, m, d) array sharing x's memory when it can."""
    return x.detach().contiguous().reshape(math.prod(x.shape[:-2]), *x.shape[-2:]).numpy()


def causal_centred_sum(attended: Tensor, v: Tensor) -> Tensor:
    """``(I - C) v + attended`` as a fresh contiguous tensor; v: (..., m, d), attended: any
    shape with v's number of elements that reshapes to v's (e.g. (..., m, h, d / h))."""
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _compiled(_centred_sum)(_rows(v), _rows(attended.reshape(v.shape)), _rows(out))
    return out


def causal_centring_transpose(g: Tensor) -> Tensor:
    """``(I - C)^T g`` as a fresh contiguous tensor; g: (..., m, d)."""
    out = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    _compiled(_centring_transpose)(_rows(g), _rows(out))
    return out
