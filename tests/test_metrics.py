import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapedtx import detect_collapse
from shapedtx.metrics import (
    correlation,
    covariance,
    covariance_residual,
    eigenvalue_ratio,
    mean_correlation,
    stable_rank,
    token_residual,
)

from strategies import covariances

pytestmark = pytest.mark.usefixtures("float64_default")


def equicorrelated(m: int, rho: float) -> torch.Tensor:
    return (1 - rho) * torch.eye(m) + rho * torch.ones(m, m)


def test_correlation_and_mean_correlation():
    V = torch.diag(torch.tensor([4.0, 1.0])) + torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    torch.testing.assert_close(correlation(V), torch.tensor([[1.0, 0.5], [0.5, 1.0]]))
    assert mean_correlation(equicorrelated(5, 0.3)).item() == pytest.approx(0.3)


def test_rank_measures_on_known_matrices():
    m = 4
    assert stable_rank(torch.eye(m)).item() == pytest.approx(m)
    # equicorrelated: eigenvalues 1 + (m-1) rho (once) and 1 - rho (m-1 times)
    V = equicorrelated(m, 0.5)
    assert stable_rank(V).item() == pytest.approx((2.5**2 + 3 * 0.25) / 2.5**2)
    assert eigenvalue_ratio(V).item() == pytest.approx(0.5 / 2.5)
    collapsed = torch.ones(m, m)
    assert stable_rank(collapsed).item() == pytest.approx(1.0)
    assert eigenvalue_ratio(collapsed).item() == pytest.approx(0.0, abs=1e-12)


def test_token_residual_matches_covariance_form():
    X = torch.randn(3, 6, 50)
    torch.testing.assert_close(token_residual(X), covariance_residual(covariance(X)))
    same = torch.randn(1, 50).expand(6, 50)
    assert token_residual(same).item() == pytest.approx(0.0, abs=1e-12)


def test_detect_collapse_first_index_per_sample():
    rhos = torch.tensor([[0.2, 0.5, 0.995, 0.999], [0.2, 0.3, 0.4, 0.5]])
    V = torch.stack([torch.stack([equicorrelated(3, r) for r in row]) for row in rhos])
    result = detect_collapse(V, threshold=0.99)
    assert result.collapsed.tolist() == [True, False]
    assert result.first_index.tolist() == [2, -1]
    assert detect_collapse(V, threshold=0.45).first_index.tolist() == [1, 3]
    with pytest.raises(ValueError, match="threshold"):
        detect_collapse(V, threshold=1.5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_overflowed_covariance_counts_as_collapsed(bad):
    """A non-finite V at some time is a degenerate representation: collapsed from there on,
    even if the finite times were far from the threshold."""
    V = torch.stack([equicorrelated(3, 0.1)] * 4).unsqueeze(0).repeat(2, 1, 1, 1)
    V[0, 2] = bad
    V[1, 3, 0, 1] = V[1, 3, 1, 0] = bad
    result = detect_collapse(V, threshold=0.99)
    assert result.collapsed.tolist() == [True, True]
    assert result.first_index.tolist() == [2, 3]


# Laws for every input (property-based) ---------------------------------------------------------
@settings(deadline=None)
@given(covariances(max_m=8), st.integers(0, 2**31 - 1))
def test_metric_ranges_and_invariances(V, seed):
    """rho in [-1, 1] with unit diagonal; stable rank in [1, m]; eigenvalue ratio in [0, 1];
    correlations and mean correlation invariant under positive rescaling of the tokens
    (D V D) and equivariant under permuting them; stable rank invariant under c V."""
    m = V.shape[-1]
    g = torch.Generator().manual_seed(seed)
    rho = correlation(V)
    assert ((rho >= -1 - 1e-12) & (rho <= 1 + 1e-12)).all()
    torch.testing.assert_close(torch.diagonal(rho), torch.ones(m))
    r = stable_rank(V).item()
    assert 1 - 1e-9 <= r <= m + 1e-9
    assert -1e-12 <= eigenvalue_ratio(V).item() <= 1 + 1e-12
    assert -1 / (m - 1) - 1e-9 <= mean_correlation(V).item() <= 1 + 1e-9
    d = torch.rand(m, generator=g, dtype=V.dtype) * 10 + 0.1
    scaled = d[:, None] * V * d[None, :]
    torch.testing.assert_close(correlation(scaled), rho)
    torch.testing.assert_close(mean_correlation(scaled), mean_correlation(V))
    perm = torch.randperm(m, generator=g)
    torch.testing.assert_close(correlation(V[perm][:, perm]), rho[perm][:, perm])
    torch.testing.assert_close(stable_rank(3.7 * V), stable_rank(V))
    assert 0 <= covariance_residual(V).item() <= 1 + 1e-12


@settings(deadline=None)
@given(st.integers(2, 6), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_stable_rank_bounds_are_attained_only_by_rank_one_and_isotropic(m, n, seed):
    """stable rank = m for V = c I, = 1 for rank one, and <= rank(V) always."""
    X = torch.randn(m, n, generator=torch.Generator().manual_seed(seed))
    V = covariance(X)
    rank = torch.linalg.matrix_rank(V).item()
    assert stable_rank(V).item() <= rank + 1e-9
    assert stable_rank(2.5 * torch.eye(m)).item() == pytest.approx(m)
    assert stable_rank(covariance(X[:, :1])).item() == pytest.approx(1.0)


def test_metrics_batch_over_leading_dimensions_against_numpy():
    """Every metric on a (2, 3, m, n) batch equals the textbook formula computed with numpy
    matrix by matrix: V = X X^T / n, rho = V / sqrt(diag diag^T), stable rank = sum l^2 /
    max l^2, eigenvalue ratio = l_min / l_max, residual = ||X - 1 xbar^T||_F / ||X||_F."""
    import numpy as np

    g = torch.Generator().manual_seed(5)
    m, n = 4, 7
    X = torch.randn(2, 3, m, n, generator=g) * torch.tensor([1.0, 2.0, 0.5, 3.0])[:, None]
    V = covariance(X)
    assert V.shape == (2, 3, m, m)
    for i in range(2):
        for j in range(3):
            x = X[i, j].numpy()
            v = x @ x.T / n
            np.testing.assert_allclose(V[i, j].numpy(), v, rtol=1e-12)
            d = np.sqrt(np.diag(v))
            rho = v / np.outer(d, d)
            np.testing.assert_allclose(correlation(V)[i, j].numpy(), rho, rtol=1e-12)
            off = rho[~np.eye(m, dtype=bool)].mean()
            assert mean_correlation(V)[i, j].item() == pytest.approx(off, rel=1e-12)
            lam = np.linalg.eigvalsh(v)  # distinct eigenvalues (generic X)
            assert stable_rank(V)[i, j].item() == pytest.approx((lam**2).sum() / lam[-1] ** 2)
            assert eigenvalue_ratio(V)[i, j].item() == pytest.approx(lam[0] / lam[-1])
            res = np.linalg.norm(x - x.mean(0)) / np.linalg.norm(x)
            assert token_residual(X)[i, j].item() == pytest.approx(res, rel=1e-12)
            assert covariance_residual(V)[i, j].item() == pytest.approx(res, rel=1e-10)


def test_detect_collapse_batches_over_leading_dimensions_and_uses_the_default_threshold():
    """V (2, 3, t, m, m): each (i, j) path is judged on its own time axis; default 0.99; the
    threshold itself is not 'above' (strict >); thresholds 0 and 1 are invalid."""
    rhos = torch.tensor([0.2, 0.5, 0.98, 0.995, 0.999])
    paths = [[[0, 1, 2, 3, 4], [0, 0, 0, 0, 0], [3, 0, 0, 4, 0]],
             [[1, 1, 1, 1, 1], [2, 2, 2, 2, 2], [0, 1, 4, 4, 4]]]  # fmt: skip
    V = torch.stack(
        [torch.stack([torch.stack([equicorrelated(3, rhos[k]) for k in p]) for p in row])
         for row in paths]
    )  # fmt: skip
    result = detect_collapse(V)
    assert result.collapsed.tolist() == [[True, False, True], [False, False, True]]
    assert result.first_index.tolist() == [[3, -1, 0], [-1, -1, 2]]
    exact = detect_collapse(V, threshold=0.5)
    assert exact.first_index.tolist() == [[2, -1, 0], [-1, 0, 2]]  # 0.5 itself is not above
    assert detect_collapse(V[0, 0]).first_index.item() == 3  # (t, m, m): no batch
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="threshold"):
            detect_collapse(V, threshold=bad)
    with pytest.raises(ValueError, match="shape"):
        detect_collapse(V[0, 0, 0])


def test_residual_of_nearly_collapsed_tokens():
    """Tokens 1e-3 apart: residual ~ 1e-3 from X and from V alike (the centred trace is
    tiny, not clamped to anything but 0)."""
    g = torch.Generator().manual_seed(6)
    X = torch.randn(1, 40, generator=g) + 1e-3 * torch.randn(5, 40, generator=g)
    r = token_residual(X).item()
    assert 1e-4 < r < 1e-2
    assert covariance_residual(covariance(X)).item() == pytest.approx(r, rel=1e-6)
    assert covariance_residual(torch.ones(3, 3)).item() == 0.0


def _covariance_dataset():
    """A tiny covariance Dataset as the library writes it (``simulations.simulate``)."""
    from shapedtx import ModelConfig
    from shapedtx import equicorrelated as equi
    from simulations import simulate

    return simulate(ModelConfig(width=8, depth=3), equi(3, 0.2), 4, progress=False)


def test_metrics_take_the_librarys_datasets_and_dataarrays():
    """Issue 39: a covariance Dataset (its V) or a DataArray of V, keeping the named dims."""
    import xarray as xr

    ds = _covariance_dataset()
    V = torch.from_numpy(ds["V"].values)
    for source in (ds, ds["V"]):
        rho = mean_correlation(source)
        assert isinstance(rho, xr.DataArray) and rho.dims == ("sample", "t")
        assert "layer" in rho.coords
        torch.testing.assert_close(torch.from_numpy(rho.values), mean_correlation(V))
        assert stable_rank(source).dims == ("sample", "t")
        assert correlation(source).dims == ds["V"].dims
    assert eigenvalue_ratio(ds["V"].isel(t=-1)).dims == ("sample",)
    torch.testing.assert_close(covariance_residual(ds["V"].values), covariance_residual(V))
    with pytest.raises(ValueError, match="'V'"):
        mean_correlation(ds.rename({"V": "W"}))


def test_detect_collapse_takes_a_dataset_and_keeps_the_sample_dimension():
    ds = _covariance_dataset()
    expected = detect_collapse(torch.from_numpy(ds["V"].values), threshold=0.3)
    for source in (ds, ds["V"]):
        result = detect_collapse(source, threshold=0.3)
        assert result.first_index.dims == result.collapsed.dims == ("sample",)
        assert result.first_index.values.tolist() == expected.first_index.tolist()
    from shapedtx import check_covariance, check_covariance_batch

    assert check_covariance(ds["V"].isel(sample=0, t=0)).shape == (3, 3)
    assert check_covariance_batch(ds["V"].isel(t=-1)).shape == (4, 3, 3)


def test_never_collapsed_is_one_marker():
    """-1 (NEVER) in detect_collapse, collapse_report and the printed table alike."""
    from shapedtx.metrics import NEVER
    from simulations import collapse_report, format_collapse

    assert NEVER == -1
    ds = _covariance_dataset()
    assert (detect_collapse(ds).first_index == NEVER).all()
    report = collapse_report({"model": ds})
    assert report["median_collapse_layer"].item() == report["median_collapse_t"].item() == NEVER
    table = format_collapse(report)
    assert "median layer -1: never" in table
    assert table.splitlines()[-1].split()[2] == "-1"
