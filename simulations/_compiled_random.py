"""numpy's float64 normals and chi-square variables, compiled: the same numbers, faster.

numba compiles ``numpy.random.Generator.standard_normal`` from numpy's own ziggurat
algorithm over the generator's bit generator; the gamma variables are numpy's sampler
(for shapes above 1 Marsaglia and Tsang's method on those normals and ``Generator.random``,
written out in :func:`_fill`; numba's port of numpy's sampler for shapes up to 1). So
:func:`random_fill` gives exactly the numbers (and leaves the generator in exactly the
state) of one ``gen.standard_normal(out=a)`` per array in turn, then ``2
gen.standard_gamma(half, out=chi)`` (numpy's ``chisquare(2 half)``). It draws in one
compiled call with the GIL released: several threads fill their own generators' arrays at
once, faster than numpy per normal and per chi-square variable (the times, from
``benchmarks/bench_kernels.py``: benchmarks/HISTORY.md, "Gram sampler"). Only float64
normals are compiled (numba's float32 sampler is slower than numpy's here); other arrays go to
numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from shapedtx._numba import compile_kernel

_Fill = Callable[[np.random.Generator, tuple[np.ndarray, ...], np.ndarray, np.ndarray], None]


def _fill(
    gen: np.random.Generator, arrays: tuple[np.ndarray, ...], half: np.ndarray, chi: np.ndarray
) -> None:
    """Each of ``arrays`` (flat) in turn with N(0, 1), then ``chi: (rows, K)`` row by row
    with ``2 Gamma(half)``, ``half: (K,)``: numpy's sampler (for shape > 1 Marsaglia and
    Tsang's, with ``b``, ``c`` computed once per shape rather than once per variable)."""
    for a in arrays:
        for i in range(a.size):
            a[i] = gen.standard_normal()
    b = half - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * np.where(half > 1.0, b, 1.0))  # used for shape > 1 only
    for r in range(chi.shape[0]):
        for j in range(half.size):
            if half[j] <= 1.0:
                chi[r, j] = 2.0 * gen.standard_gamma(half[j])
                continue
            while True:
                while True:
                    x = gen.standard_normal()
                    v = 1.0 + c[j] * x
                    if v > 0.0:
                        break
                v = v * v * v
                u = gen.random()
                if u < 1.0 - 0.0331 * (x * x) * (x * x):
                    break
                if math.log(u) < 0.5 * x * x + b[j] * (1.0 - v + math.log(v)):
                    break
            chi[r, j] = 2.0 * (b[j] * v)


@functools.cache
def _compiled() -> _Fill:
    """:func:`_fill` compiled on first use (about 1 s, then cached on disk)."""
    return compile_kernel(_fill)


def random_fill(
    gen: np.random.Generator,
    arrays: Sequence[np.ndarray],
    half: np.ndarray | None = None,
    chi: np.ndarray | None = None,
) -> None:
    """Fill each of ``arrays`` (C-contiguous, float32/64) in turn with iid N(0, 1) from
    ``gen``, then (if given) ``chi: (rows, K)`` (C-contiguous float64) with chi-square
    variables of ``2 half: (K,)`` degrees of freedom: the numbers of
    ``gen.standard_normal(out=a, dtype=a.dtype)`` for each a, then
    ``2 gen.standard_gamma(half, out=chi)``."""
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("random_fill needs C-contiguous arrays")
    if (half is None) != (chi is None):
        raise ValueError("random_fill needs both half and chi, or neither")
    if half is None or chi is None:
        half, chi = np.ones(0), np.empty((0, 0))
    elif not chi.flags.c_contiguous or chi.dtype != np.float64 or chi.shape[1:] != half.shape:
        raise ValueError("chi must be C-contiguous float64 of shape (rows, len(half))")
    flat = tuple(a.reshape(-1) for a in arrays)
    if not all(a.dtype == np.float64 for a in arrays):
        for a in arrays:
            gen.standard_normal(out=a, dtype=a.dtype)
        flat = ()
    _compiled()(gen, flat or (np.empty(0),), np.asarray(half, np.float64), chi)  # typed tuple
