"""numpy's float64 standard normals, compiled: the same numbers, about 2.5x faster on CPU.

numba compiles ``numpy.random.Generator.standard_normal`` from numpy's own ziggurat
algorithm over the generator's bit generator, so :func:`standard_normal_fill` gives exactly
the numbers (and leaves the generator in exactly the state) of one
``gen.standard_normal(out=a)`` per array in turn. It fills in one compiled loop, with the
GIL released: several threads fill their own generators' arrays at once. Only float64 is
compiled (numba's float32 sampler is slower than numpy's here: ``benchmarks/RESULTS.md``);
other arrays go to numpy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np


def _fill(gen: np.random.Generator, arrays: tuple[np.ndarray, ...]) -> None:
    for a in arrays:
        for i in range(a.size):
            a[i] = gen.standard_normal()


@functools.cache
def _compiled() -> Callable[[np.random.Generator, tuple[np.ndarray, ...]], None]:
    """:func:`_fill` compiled on first use (numba is imported only then: it is slow to
    import), cached on disk when a cache folder is writable (about 0.5 s to compile)."""
    import numba

    try:
        return numba.njit(nogil=True, cache=True)(_fill)
    except RuntimeError:  # numba found no writable cache location: compile in memory
        return numba.njit(nogil=True)(_fill)


def standard_normal_fill(gen: np.random.Generator, arrays: Sequence[np.ndarray]) -> None:
    """Fill each of ``arrays`` (C-contiguous, float32/64) in turn with iid N(0, 1) from
    ``gen``: the numbers of ``gen.standard_normal(out=a, dtype=a.dtype)`` for each a."""
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("standard_normal_fill needs C-contiguous arrays")
    if arrays and all(a.dtype == np.float64 for a in arrays):
        _compiled()(gen, tuple(a.reshape(-1) for a in arrays))
        return
    for a in arrays:
        gen.standard_normal(out=a, dtype=a.dtype)
