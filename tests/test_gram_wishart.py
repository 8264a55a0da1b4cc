"""The Wishart sampler of the gram method (simulations/wishart.py): moments, law, seeds."""

import pytest
import torch

from simulations import wishart, wishart_factor

from mc_stats import assert_mean_within_se, two_sample_pvalue

BATCH = 40_000


def _moment_checks(W: torch.Tensor, k: int) -> None:
    """E W = k I and Var W_ij = k (1 + delta_ij), within 5 MC standard errors."""
    m = W.shape[-1]
    eye = torch.eye(m, dtype=W.dtype)
    assert_mean_within_se(W, k * eye)
    assert_mean_within_se((W - k * eye) ** 2, k * (1 + eye))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 9, 1000])
def test_wishart_moments(k):
    """Bartlett (k >= m = 3) and direct (k < m) factors have the Wishart(k, I_3) moments."""
    gen = torch.Generator().manual_seed(10 + k)
    F = wishart_factor(k, 3, BATCH, gen)
    assert F.shape == (BATCH, 3, min(k, 3))
    if k >= 3:
        assert torch.equal(F, F.tril()), "the Bartlett factor is lower triangular"
        assert bool((F.diagonal(dim1=-2, dim2=-1) > 0).all())
    _moment_checks(F @ F.mT, k)


def test_wishart_moment_check_has_power():
    """The same checks reject Bartlett's classic off-by-one (chi^2 with k - i + 1 dof for
    0-based i, i.e. Wishart(k + 1) on the diagonal only)."""
    k, m = 3, 3
    gen = torch.Generator().manual_seed(5)
    normals = torch.randn((BATCH, m, m), generator=gen, dtype=torch.float64)
    dof = (k + 1 - torch.arange(m, dtype=torch.float64)).expand(BATCH, m).contiguous()
    diag = (2 * torch._standard_gamma(dof / 2, generator=gen)).sqrt()
    T = normals.tril(-1) + torch.diag_embed(diag)
    with pytest.raises(AssertionError):
        _moment_checks(T @ T.mT, k)


@pytest.mark.parametrize("k", [2, 3])
def test_wishart_small_k_law(k):
    """Small k (= m, and m + 1): the Bartlett draw has the law of Z Z^T (Z: m x k Gaussian).

    Two-sample KS on each entry, the determinant and the smallest eigenvalue; fixed seeds.
    """
    m, N = 2, 20_000
    W = wishart(k, m, N, torch.Generator().manual_seed(1))
    Z = torch.randn((N, m, k), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref = Z @ Z.mT
    stats = {
        "W00": (W[:, 0, 0], ref[:, 0, 0]),
        "W01": (W[:, 0, 1], ref[:, 0, 1]),
        "W11": (W[:, 1, 1], ref[:, 1, 1]),
        "det": (torch.linalg.det(W), torch.linalg.det(ref)),
        "lambda_min": (torch.linalg.eigvalsh(W)[:, 0], torch.linalg.eigvalsh(ref)[:, 0]),
    }
    for name, (a, b) in stats.items():
        p = two_sample_pvalue(a, b)
        assert p > 1e-3, f"k={k}: {name} differs from Z Z^T (KS p = {p:.2g})"
    # power: Wishart(k + 1) is rejected by the same statistics
    wrong = wishart(k + 1, m, N, torch.Generator().manual_seed(3))
    assert two_sample_pvalue(torch.linalg.det(wrong), stats["det"][1]) < 1e-3


def test_wishart_reproducible_and_typed():
    def draw(seed, dtype=torch.float64):
        return wishart(50, 4, 8, torch.Generator().manual_seed(seed), dtype=dtype)

    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    W = draw(0, torch.float32)
    assert W.dtype == torch.float32 and W.shape == (8, 4, 4)
    assert wishart_factor(0, 3, 5).shape == (5, 3, 0)


@pytest.mark.parametrize(
    "args, name", [((-1, 3, 2), "k"), ((2, 0, 2), "m"), ((2, 3, -1), "batch"), ((2.5, 3, 1), "k")]
)
def test_wishart_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        wishart_factor(*args)


@pytest.mark.parametrize("k", [2, 7])
def test_wishart_factor_draws_in_the_documented_order(k):
    """Every number comes from ``generator`` in the documented order: the normals of
    ``torch.randn`` first (F itself when k < m, its strictly lower triangle when k >= m), then
    the m chi-square variables ``2 Gamma((k - i) / 2)`` of the Bartlett diagonal."""
    m, batch = 4, 3
    F = wishart_factor(k, m, batch, torch.Generator().manual_seed(9))
    gen = torch.Generator().manual_seed(9)
    normals = torch.randn((batch, m, min(k, m)), generator=gen, dtype=torch.float64)
    if k < m:
        assert torch.equal(F, normals)
        return
    assert torch.equal(F.tril(-1), normals.tril(-1))
    assert bool((F.triu(1) == 0).all())  # lower triangular
    dof = torch.tensor([k - i for i in range(m)], dtype=torch.float64).expand(batch, m)
    chi = 2.0 * torch._standard_gamma(dof.contiguous() / 2, generator=gen)
    torch.testing.assert_close(F.diagonal(dim1=-2, dim2=-1) ** 2, chi, rtol=1e-12, atol=0)


def test_wishart_of_an_empty_batch():
    """batch = 0 is allowed (an empty draw), as k = 0 is."""
    assert wishart_factor(5, 3, 0).shape == (0, 3, 3)
    assert wishart(2, 3, 0).shape == (0, 3, 3)
