"""Chunk-invariant random numbers: one generator per fixed-size group of samples.

Samples ``[g G, (g + 1) G)`` form group ``g``, whose generators are seeded from ``(seed, g)``
only. A chunk of the simulation is a whole number of consecutive groups, so every sample sees
the same random numbers whatever the chunking (and whatever the number of samples after it).

Each group has a torch generator (:attr:`GroupedNormal.generators`) and, for bulk normals,
a fast stream (:meth:`GroupedNormal.fill_normal`): on CPU numpy's SFC64 bit generator with
its ziggurat normal sampler (about 2.3x faster than float64 ``torch.randn`` on CPU), seeded
from ``(seed, g, 1)``; on other devices the group's torch generator.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor


def group_seed(seed: int, group: int) -> int:
    """A 64-bit seed for group ``group`` of a run with seed ``seed`` (numpy SeedSequence)."""
    return int(np.random.SeedSequence([seed, group]).generate_state(1, dtype=np.uint64)[0])


class GroupedNormal:
    """Standard normal draws for a chunk made of consecutive groups of samples.

    Args:
        seed: the run's seed (integer >= 0).
        groups: indices of the groups in this chunk (consecutive).
        sizes: number of samples of each group (``group_size``, or fewer for the last group).
        device: device of the generators and of every draw.
    """

    def __init__(
        self, seed: int, groups: Sequence[int], sizes: Sequence[int], device: torch.device
    ) -> None:
        self.device = torch.device(device)
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
        if not buf.is_contiguous() or buf.shape[0] != self.samples:
            raise ValueError("fill_normal needs a contiguous buffer with one row per sample")
        if self.device.type != "cpu":
            for gen, s in zip(self.generators, self.slices, strict=True):
                buf[s].normal_(generator=gen)
            return buf
        array = buf.numpy()
        dtype = np.float64 if buf.dtype == torch.float64 else np.float32
        for np_gen, s in zip(self._numpy_generators(), self.slices, strict=True):
            np_gen.standard_normal(out=array[s], dtype=dtype)
        return buf

    def chi2(self, dof: Tensor, dtype: torch.dtype) -> Tensor:
        """Chi-square variables (samples, K) with ``dof: (K,)`` degrees of freedom (> 0), one
        call per group from the group's fast stream (numpy's exact ``chisquare`` on CPU,
        :func:`simulations.wishart.chi2` from the torch generator elsewhere)."""
        from .wishart import chi2

        if self.device.type != "cpu":
            dof = dof.to(device=self.device, dtype=torch.float64)
            draws = [
                chi2(dof.expand(s.stop - s.start, -1).contiguous(), gen)
                for gen, s in zip(self.generators, self.slices, strict=True)
            ]
            return torch.cat(draws).to(dtype)
        half = dof.detach().cpu().double().numpy() / 2
        out = np.empty((self.samples, half.shape[0]))
        for np_gen, s in zip(self._numpy_generators(), self.slices, strict=True):
            # chi^2_k = 2 Gamma(k / 2): the numbers of ``np_gen.chisquare``, written in place
            np_gen.standard_gamma(half, size=out[s].shape, out=out[s])
        return torch.from_numpy(out).mul_(2.0).to(dtype)

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
