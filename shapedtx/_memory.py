"""Large CPU tensors backed by transparent huge pages where the OS offers them.

A fresh CPU tensor is paged in on first touch, one 4 KB page at a time: a measurable part of
the gram sampler's time per sample and block (its workspace and the result;
benchmarks/HISTORY.md, "Gram sampler", has the figures). Into anonymous memory advised
``MADV_HUGEPAGE``, Linux maps 2 MB pages instead (when
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``), paged in
faster. Elsewhere (other systems, other devices, tensors below 2 MB) :func:`empty` and
:func:`zeros` are ``torch.empty`` and ``torch.zeros``. ``simulate`` asks for huge pages on
one thread only: with two, its gram sampler was measured slower with them on the benchmark
machine, a virtual machine whose free-page reporting hands free high-order blocks back to the
host, so that huge pages there are more often cold memory (benchmarks/HISTORY.md, "Gram
sampler").
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

HUGE_PAGE_BYTES = 2**21
"""The size of a transparent huge page on x86-64 and most arm64 kernels; tensors from this
size up are mapped as whole multiples of it (Linux then aligns the mapping to it)."""


def empty(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    *,
    huge_pages: bool = True,
) -> Tensor:
    """An uninitialised C-contiguous tensor of ``shape``, ``dtype`` on ``device`` (default
    CPU). With ``huge_pages``, on CPU from :data:`HUGE_PAGE_BYTES` up, in private anonymous
    memory advised for huge pages, rounded up to whole huge pages (the tensor keeps the
    mapping alive; it is unmapped with the last reference)."""
    return _allocate(torch.empty, shape, dtype, device, huge_pages)


def zeros(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    *,
    huge_pages: bool = True,
) -> Tensor:
    """:func:`empty`, zero-filled (a fresh mapping is zero already: no pass over it)."""
    return _allocate(torch.zeros, shape, dtype, device, huge_pages)


def _allocate(
    factory: Callable[..., Tensor],
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | None,
    huge_pages: bool,
) -> Tensor:
    """A huge-page mapping where it applies (zero when fresh), else ``factory`` (torch.empty
    or torch.zeros)."""
    mapped = _mapped(shape, dtype, device) if huge_pages else None
    return factory(tuple(shape), dtype=dtype, device=device) if mapped is None else mapped


def _mapped(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device | str | None
) -> Tensor | None:
    """The tensor in a fresh huge-page mapping, or None where it does not apply or the
    mapping fails (e.g. too large: torch's allocator then says so in its own words)."""
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if torch.device(device or "cpu").type != "cpu" or nbytes < HUGE_PAGE_BYTES or advice is None:
        return None
    size = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    with contextlib.suppress(OSError):  # a kernel without huge pages: ordinary pages
        mapping.madvise(advice)
    return torch.frombuffer(mapping, dtype=dtype, count=count).view(tuple(shape))
