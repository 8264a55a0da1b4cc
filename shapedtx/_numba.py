"""numba, imported only when a compiled kernel is first used (importing it takes about
0.13 s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

F = TypeVar("F", bound=Callable[..., object])


def compile_kernel(fn: F) -> F:
    """``fn`` compiled by numba with the GIL released (threads run kernels at once), cached
    on disk where a cache folder is writable, else compiled in memory."""
    import numba

    try:
        return cast(F, numba.njit(nogil=True, cache=True)(fn))
    except RuntimeError:  # numba found no writable cache location: compile in memory
        return cast(F, numba.njit(nogil=True)(fn))
