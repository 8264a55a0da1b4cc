"""Chunk-invariant random numbers: one generator per fixed-size group of samples.

Samples ``[g G, (g + 1) G)`` form group ``g``, whose generator is seeded from ``(seed, g)``
only. A chunk of the simulation is a whole number of consecutive groups, so every sample sees
the same random numbers whatever the chunking (and whatever the number of samples after it).
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
