"""The compiled batched Cholesky factor (simulations/_compiled_cholesky.py) against LAPACK."""

from __future__ import annotations

import math

import pytest
import torch

from simulations import _compiled_cholesky as compiled
from simulations.gram import _cholesky


def _spd(samples: int, m: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    M = torch.randn(samples, m, 2 * m, generator=torch.Generator().manual_seed(seed))
    return (M @ M.mT / (2 * m)).to(dtype)


@pytest.mark.parametrize("m", [1, 2, 8, 32])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_lapack(m, dtype):
    """Lower factors equal LAPACK's to rounding (the same recurrence, another summation
    order), the upper triangle zero even over stale memory, no sample flagged."""
    V = _spd(50, m, dtype)
    out = torch.full_like(V, math.nan)
    bad = compiled.cholesky(V, out)
    ref = torch.linalg.cholesky(V.double())
    tol = 1e-13 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol * float(ref.abs().max()))
    assert torch.equal(out.triu(1), torch.zeros_like(out))
    assert not bool(bad.any()) and bad.shape == (50,)
    assert compiled.applies(V)


def test_flags_what_lapack_flags():
    """Indefinite, singular, zero and NaN matrices are flagged exactly where LAPACK's
    ``info`` is non-zero; the other samples still get their factors."""
    V = _spd(6, 8, torch.float64)
    V[1, 3, 3] = -1.0  # indefinite
    V[2] = 1.0  # rank 1, with an exactly zero second pivot
    V[3] = 0.0
    V[4, 5, 2] = math.nan
    V[4, 2, 5] = math.nan
    out = torch.empty_like(V)
    bad = compiled.cholesky(V, out)
    info = torch.linalg.cholesky_ex(V).info
    assert bad.tolist() == (info != 0).tolist() == [False, True, True, True, True, False]
    good = ~bad
    torch.testing.assert_close(out[good], torch.linalg.cholesky(V[good]), rtol=0, atol=1e-14)


def test_gram_factor_uses_it_up_to_32_tokens():
    """The gram sampler's factor: compiled for m <= 32 on CPU, LAPACK above and for autograd
    or non-batched inputs; both give the same factors."""
    assert compiled.MAX_SIZE == 32
    for m in (32, 33):
        V = _spd(4, m, torch.float64, seed=m)
        assert compiled.applies(V) == (m <= 32)
        L, bad = _cholesky(V)
        torch.testing.assert_close(L, torch.linalg.cholesky(V), rtol=0, atol=1e-13)
        assert not bool(bad.any())
    V = _spd(4, 8, torch.float64)
    assert not compiled.applies(V[0])
    assert not compiled.applies(V.clone().requires_grad_())
    assert not compiled.applies(V.to(torch.bfloat16))
    assert not compiled.applies(V[:, :, :7]) and not compiled.applies(V[:, :7, :])  # square
    with pytest.raises(ValueError, match="C-contiguous out"):
        compiled.cholesky(V, torch.empty_like(V).mT)
    with pytest.raises(ValueError, match="m <= 32"):
        compiled.cholesky(V[0], torch.empty_like(V[0]))
