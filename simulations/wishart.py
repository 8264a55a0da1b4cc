"""Exact Wishart(k, I_m) draws from an explicit generator (docs/theory.md#samplers).

``W = Z Z^T`` with ``Z: (m, k)`` iid N(0, 1) is drawn through a factor ``F`` (``F F^T = W`` in
law) at a cost independent of ``k``:

- ``k >= m``: the Bartlett decomposition. ``F = T`` lower triangular with
  ``T_ii = sqrt(chi^2_{k - i})`` (i = 0..m-1) and ``T_ij ~ N(0, 1)`` for ``i > j``, all
  independent; T is the Cholesky factor of a Wishart(k, I_m) matrix.
- ``k < m`` (singular Wishart): ``F = Z`` itself, ``m x k`` iid N(0, 1) (O(m^2) numbers).

Reproducibility: every random number comes from the ``generator`` argument: normals from
``torch.randn(generator=...)``, chi-square variables as ``2 Gamma(dof / 2, 1)`` from
``torch._standard_gamma(..., generator=...)`` (an exact Marsaglia-Tsang rejection sampler on
CPU and CUDA, in float64 whatever the output dtype; ``torch.distributions.Chi2`` cannot take
a generator). Draw order per call: normals first, then the m chi-square variables.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from shapedtx._validation import check_int


def chi2(dof: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Chi-square variables with ``dof`` (> 0, any shape) degrees of freedom, one per entry:
    ``2 Gamma(dof / 2, 1)`` drawn from ``generator``; same shape, dtype and device as dof."""
    return 2.0 * torch._standard_gamma(dof / 2, generator=generator)


@functools.lru_cache(maxsize=64)
def bartlett_dof(
    k: int, m: int, batch: int = 1, device: torch.device | str | None = None
) -> Tensor:
    """Degrees of freedom ``k - i`` (i = 0..m-1) of the chi-square variables on the diagonal
    of a Bartlett factor of Wishart(k, I_m), repeated for ``batch`` factors: (batch m,),
    float64 (k may exceed float32's 2^24). Cached: a shared tensor, not to be modified."""
    return (k - torch.arange(m, dtype=torch.float64, device=device)).repeat(batch)


def bartlett(normals: Tensor, diagonal: Tensor) -> Tensor:
    """The lower-triangular Bartlett factor from ``normals: (..., m, m)`` (only the entries
    below the diagonal are used) and ``diagonal: (..., m)`` (the ``sqrt(chi^2_{k - i})``)."""
    return normals.tril(-1) + torch.diag_embed(diagonal)


def wishart_factor(
    k: int,
    m: int,
    batch: int,
    generator: torch.Generator | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    """F: (batch, m, min(k, m)) with ``F F^T ~ Wishart(k, I_m)``, independently per batch entry.

    Lower-triangular Bartlett factor when ``k >= m`` (then F is the Cholesky factor of the
    Wishart matrix), iid N(0, 1) when ``k < m`` (``k = 0`` gives an empty last dimension).
    Exact for every k; cost O(m^2) numbers, independent of k.
    """
    check_int("k (degrees of freedom)", k, 0)
    check_int("m", m)
    check_int("batch", batch, 0)
    if k < m:
        return torch.randn((batch, m, k), generator=generator, dtype=dtype, device=device)
    normals = torch.randn((batch, m, m), generator=generator, dtype=dtype, device=device)
    # chi-square draws in float64 (k may exceed float32's 2^24)
    dof = bartlett_dof(k, m, device=device).expand(batch, m).contiguous()
    return bartlett(normals, chi2(dof, generator).sqrt().to(dtype))


def wishart(
    k: int,
    m: int,
    batch: int,
    generator: torch.Generator | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    """W: (batch, m, m) iid Wishart(k, I_m) matrices (``E W = k I``,
    ``Var W_ij = k (1 + delta_ij)``), via :func:`wishart_factor`."""
    F = wishart_factor(k, m, batch, generator, dtype=dtype, device=device)
    return F @ F.mT
