"""Chunk-invariant random numbers: one generator per fixed-size group of samples.

Samples ``[g G, (g + 1) G)`` form group ``g``, whose generators are seeded from ``(seed, g)``
only. A chunk of the simulation is a whole number of consecutive groups, so every sample sees
the same random numbers whatever the chunking (and whatever the number of samples after it).

Each group has a torch generator (:attr:`GroupedNormal.generators`) and, for bulk normals,
a fast stream (:meth:`GroupedNormal.fill_normal`): on CPU numpy's SFC64 bit generator with
its ziggurat normal sampler, seeded from ``(seed, g, 1)``, float64 normals drawn by a compiled
copy of that sampler (:mod:`simulations._compiled_random`: numpy's numbers, faster than
numpy's own call and than float64 ``torch.randn``; chi-square variables likewise; the
figures, from ``benchmarks/bench_kernels.py``: benchmarks/HISTORY.md, "Gram sampler");
on other devices the group's torch generator.

On CPU the groups of a bulk draw can be filled by several threads at once (``workers``;
the fills release the GIL). Each group still draws from its own stream
in its own order, so the numbers do not depend on the number of threads.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor

from ._compiled_random import random_fill

T = TypeVar("T")
Draw = tuple[list[Tensor], Tensor | None]
"""(the filled normal buffers, chi-square variables or None) of :meth:`GroupedNormal.start`."""


def group_seed(seed: int, group: int) -> int:
    """A 64-bit seed for group ``group`` of a run with seed ``seed`` (numpy SeedSequence)."""
    return int(np.random.SeedSequence([seed, group]).generate_state(1, dtype=np.uint64)[0])


_POOL: tuple[int, int, ThreadPoolExecutor] | None = None
"""(process id, threads, pool) of the helper threads; a forked child makes its own."""


def _pool(threads: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < threads:
        _POOL = (os.getpid(), threads, ThreadPoolExecutor(threads, "shapedtx-rng"))
    return _POOL[2]


PARALLEL_NUMBERS = 2**16
"""Bulk draws of fewer numbers than this are filled by the thread that asks for them (the
hand-off to a helper costs tens of microseconds; this many normals take about 0.5 ms)."""


class PendingDraw(Generic[T]):
    """Per-group work under way (:meth:`GroupedNormal.start`, :func:`run_parallel`):
    helper threads take the groups one by one from a shared counter; :meth:`result` makes
    the calling thread take the groups still left, waits for the helpers and returns
    ``finish()`` (for a draw: ``(normals, chi2)``)."""

    def __init__(
        self, task: Callable[[int], None], groups: int, helpers: int, finish: Callable[[], T]
    ) -> None:
        self._task, self._groups, self._next = task, groups, 0
        self._finish = finish
        self._lock = threading.Lock()
        self._futures = [_pool(helpers).submit(self._run) for _ in range(helpers)]

    def _claim(self) -> int | None:
        with self._lock:
            if self._next >= self._groups:
                return None
            self._next += 1
            return self._next - 1

    def _run(self) -> None:
        while (i := self._claim()) is not None:
            self._task(i)

    def result(self) -> T:
        try:
            self._run()
        except BaseException:  # e.g. Ctrl-C: the helpers take no further group, and what
            with self._lock:  # they raise then (e.g. on a half-done import) is a consequence
                self._next = self._groups
            wait(self._futures)
            raise
        for future in self._futures:
            future.result()
        return self._finish()


def run_parallel(task: Callable[[int], None], count: int, threads: int) -> None:
    """``task(i)`` for ``i < count``, taken in order by the calling thread and up to
    ``threads - 1`` helper threads (:class:`PendingDraw`); returns when all are done."""
    PendingDraw(task, count, max(0, min(threads, count) - 1), lambda: None).result()


class GroupedNormal:
    """Standard normal draws for a chunk made of consecutive groups of samples.

    Args:
        seed: the run's seed (integer >= 0).
        groups: indices of the groups in this chunk (consecutive).
        sizes: number of samples of each group (``group_size``, or fewer for the last group).
        device: device of the generators and of every draw.
        workers: threads that fill the groups of a bulk CPU draw (:meth:`start`); the
            numbers do not depend on it.
    """

    def __init__(
        self,
        seed: int,
        groups: Sequence[int],
        sizes: Sequence[int],
        device: torch.device,
        workers: int = 1,
    ) -> None:
        self.device = torch.device(device)
        self.workers = workers
        self.seed, self.groups = seed, list(groups)
        self._numpy: list[np.random.Generator] | None = None
        self.generators = [
            torch.Generator(device=self.device).manual_seed(group_seed(seed, g)) for g in groups
        ]
        bounds = np.cumsum([0, *sizes]).tolist()
        self.slices = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.samples = bounds[-1]

    def normal(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """Draws of shape ``(samples, *shape)``: each group's rows from its own generator."""
        draws = [
            torch.randn((s.stop - s.start, *shape), generator=gen, dtype=dtype, device=self.device)
            for gen, s in zip(self.generators, self.slices, strict=True)
        ]
        return draws[0] if len(draws) == 1 else torch.cat(draws)

    def fill_normal(self, buf: Tensor) -> Tensor:
        """Fill ``buf: (samples, ...)`` (contiguous, float32/64) in place with iid N(0, 1), one
        call per group: group g's rows from group g's fast stream (module doc); returns buf."""
        return self.start([buf]).result()[0][0]

    def chi2(self, dof: Tensor, dtype: torch.dtype) -> Tensor:
        """Chi-square variables (samples, K) with ``dof: (K,)`` degrees of freedom (> 0), one
        call per group from the group's fast stream (numpy's exact ``chisquare`` on CPU,
        :func:`simulations.wishart.chi2` from the torch generator elsewhere)."""
        chi = self.start([], dof, dtype).result()[1]
        assert chi is not None
        return chi

    def start(
        self,
        normals: Sequence[Tensor],
        chi2_dof: Tensor | None = None,
        chi2_dtype: torch.dtype | None = None,
    ) -> PendingDraw[Draw]:
        """Start filling the buffers ``normals``, each ``(samples, ...)`` (contiguous,
        float32/64), with iid N(0, 1) and drawing chi-square variables (samples, K) with
        ``chi2_dof: (K,)`` degrees of freedom (or None): each group from its fast stream, the
        buffers in order, then the chi-square variables (the numbers of one
        :meth:`fill_normal` per buffer, then :meth:`chi2`).

        On CPU with :attr:`workers` > 1 and a large draw, ``workers - 1`` helper threads start
        on it at once; the caller may compute meanwhile (drawing nothing else from these
        generators) and takes the numbers with ``.result()``, filling what is left itself.
        Elsewhere everything is drawn before this returns. Either way each group's generator
        sees the same calls in the same order: the same numbers.
        """
        if isinstance(normals, Tensor):
            raise TypeError("normals must be a sequence of buffers, not one tensor")
        for buf in normals:
            if not buf.is_contiguous() or buf.shape[0] != self.samples:
                raise ValueError("normal buffers must be contiguous with one row per sample")
        default = normals[0].dtype if normals else torch.float64
        dtype = chi2_dtype or default
        if self.device.type != "cpu":
            return self._start_torch(normals, chi2_dof, dtype)
        gens, slices = self._numpy_generators(), self.slices
        arrays = [buf.numpy() for buf in normals]
        half = None if chi2_dof is None else chi2_dof.detach().cpu().double().numpy() / 2
        chi = None if half is None else np.empty((self.samples, half.shape[0]))

        def task(i: int) -> None:  # chi^2_k = 2 Gamma(k / 2): numpy's ``chisquare``
            rows = slices[i]
            chi_rows = None if chi is None else chi[rows]
            random_fill(gens[i], [array[rows] for array in arrays], half, chi_rows)

        def finish() -> Draw:
            chi2 = None if chi is None else torch.from_numpy(chi).to(dtype)
            return list(normals), chi2

        numbers = sum(array.size for array in arrays) + (0 if chi is None else chi.size)
        helpers = min(self.workers, len(slices)) - 1 if numbers >= PARALLEL_NUMBERS else 0
        return PendingDraw(task, len(slices), helpers, finish)

    def _start_torch(
        self, normals: Sequence[Tensor], chi2_dof: Tensor | None, dtype: torch.dtype
    ) -> PendingDraw[Draw]:
        """:meth:`start` on a non-CPU device: the groups' torch generators, drawn now."""
        from .wishart import chi2

        for buf in normals:
            for gen, s in zip(self.generators, self.slices, strict=True):
                buf[s].normal_(generator=gen)
        chi = None
        if chi2_dof is not None:
            dof = chi2_dof.to(device=self.device, dtype=torch.float64)
            draws = [
                chi2(dof.expand(s.stop - s.start, -1).contiguous(), gen)
                for gen, s in zip(self.generators, self.slices, strict=True)
            ]
            chi = torch.cat(draws).to(dtype)
        return PendingDraw(lambda i: None, 0, 0, lambda: (list(normals), chi))

    def _numpy_generators(self) -> list[np.random.Generator]:
        """The groups' numpy generators (fast CPU streams), created on first use."""
        if self._numpy is None:
            self._numpy = [
                np.random.Generator(np.random.SFC64(np.random.SeedSequence([self.seed, g, 1])))
                for g in self.groups
            ]
        return self._numpy

    def split(self) -> list[tuple[slice, GroupedNormal]]:
        """(rows of the chunk, a GroupedNormal of that one group sharing its generators) for
        every group: per-group work with bounded memory that still draws from the group's
        fast stream."""
        if self.device.type == "cpu":
            self._numpy_generators()
        out = []
        for i, s in enumerate(self.slices):
            sub = GroupedNormal.__new__(GroupedNormal)
            sub.device, sub.seed, sub.groups = self.device, self.seed, [self.groups[i]]
            sub.workers = 1
            sub.generators = [self.generators[i]]
            sub._numpy = None if self._numpy is None else [self._numpy[i]]
            sub.slices, sub.samples = [slice(0, s.stop - s.start)], s.stop - s.start
            out.append((s, sub))
        return out

    def per_group(self, fn: Callable[[Tensor, torch.Generator], Tensor], x: Tensor) -> Tensor:
        """``cat_g fn(x[group g], generator of group g)``; x: (samples, ...)."""
        outs = [fn(x[s], gen) for gen, s in zip(self.generators, self.slices, strict=True)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def map(
        self, fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, shape: Sequence[int]
    ) -> Tensor:
        """``cat_g fn(x[group g], Z_g)`` with ``Z_g: (group size, *shape)`` iid N(0, 1) drawn
        from group g's generator; x: (samples, ...). Only one group's draws are alive at a
        time."""

        def draw(x_g: Tensor, gen: torch.Generator) -> Tensor:
            Z = torch.randn((x_g.shape[0], *shape), generator=gen, dtype=x.dtype, device=x.device)
            return fn(x_g, Z)

        return self.per_group(draw, x)
