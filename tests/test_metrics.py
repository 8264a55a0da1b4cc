import pytest
import torch

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
