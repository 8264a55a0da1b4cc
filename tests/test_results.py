"""Initial covariances and the covariance Dataset contract."""

import numpy as np
import pytest
import torch

from shapedtx import (
    ModelConfig,
    check_covariance,
    config_of,
    covariance_dataset,
    equicorrelated,
    initial_tokens,
    load_dataset,
    save_dataset,
    with_metrics,
    with_rho,
)
from shapedtx.metrics import covariance


def test_initial_tokens_reproduce_V0_exactly():
    V0 = equicorrelated(4, 0.3, scale=2.0)
    X = initial_tokens(V0, 32, 6, torch.Generator().manual_seed(0))
    assert X.shape == (6, 4, 32)
    torch.testing.assert_close(covariance(X), V0.expand(6, 4, 4), rtol=0, atol=1e-12)


def test_initial_tokens_from_given_normals():
    """``normals=G`` gives the tokens that ``generator`` gives when it would draw G; a wrong
    shape is a ValueError naming the expected one."""
    V0 = equicorrelated(3, 0.2)
    G = torch.randn(5, 16, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = initial_tokens(V0, 16, 5, torch.Generator().manual_seed(1))
    torch.testing.assert_close(initial_tokens(V0, 16, 5, normals=G), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"normals must have shape .*\(5, 16, 3\)"):
        initial_tokens(V0, 16, 5, normals=G[:, :8])
    with pytest.raises(ValueError, match="normals must have V0's dtype"):
        initial_tokens(V0, 16, 5, normals=G.float())
    with pytest.raises(ValueError, match="generator or normals, not both"):
        initial_tokens(V0, 16, 5, torch.Generator(), normals=G)


@pytest.mark.parametrize(
    "V0, message",
    [
        (torch.ones(3, 3), "positive definite"),
        (torch.tensor([[1.0, 0.5], [0.0, 1.0]]), "symmetric"),
        (torch.eye(1), "m >= 2"),
        (torch.ones(2, 3), "square"),
        (torch.full((2, 2), float("nan")), "finite"),
    ],
)
def test_invalid_V0(V0, message):
    with pytest.raises(ValueError, match=message):
        check_covariance(V0.double())


@pytest.mark.parametrize(
    "V0, message",
    [
        ("x", "V0 must be a real"),
        (torch.eye(2, dtype=torch.complex128), "V0 must be a real"),
        (torch.eye(2, dtype=torch.bool), "V0 must be a real"),
    ],
)
def test_V0_that_is_not_a_real_matrix(V0, message):
    with pytest.raises(ValueError, match=message):
        check_covariance(V0)


def test_V0_of_other_real_dtypes_is_checked_in_float64():
    expected = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    for V0 in ([[2, 1], [1, 2]], torch.tensor([[2, 1], [1, 2]]), expected.half()):
        assert torch.equal(check_covariance(V0), expected)
    assert check_covariance(expected.float()).dtype == torch.float32


def test_V0_near_the_float_max_is_checked_without_overflow():
    """Entries near the float64 maximum: symmetrised and tested positive definite without
    overflowing (eigh failed, and (V0 + V0^T) / 2 became inf)."""
    V0 = equicorrelated(3, 0.2, scale=1e308)
    assert torch.equal(check_covariance(V0), V0)
    with pytest.raises(ValueError, match="positive definite"):
        check_covariance(torch.full((3, 3), 1e308, dtype=torch.float64))
    small = torch.tensor([[1.0, 0.3], [0.3, 1.0]], dtype=torch.float64)
    V1 = small + torch.tensor([[0.0, 1e-17], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(check_covariance(V1), (V1 + V1.T) / 2, rtol=0, atol=0)


def test_V0_whose_eigenvalues_cannot_be_computed_is_refused(monkeypatch):
    def fail(_):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigvalsh", fail)
    with pytest.raises(ValueError, match="eigenvalues could not be computed"):
        check_covariance(equicorrelated(3, 0.2))


def test_initial_tokens_check_their_arguments():
    V0 = equicorrelated(3, 0.2)
    with pytest.raises(ValueError, match="positive definite"):
        initial_tokens(torch.ones(3, 3, dtype=torch.float64), 8, 2)
    with pytest.raises(ValueError, match="width must be an integer >= 3"):
        initial_tokens(V0, 2, 2)
    with pytest.raises(ValueError, match="width must be an integer >= 3"):
        initial_tokens(V0, 4.0, 2)
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        initial_tokens(V0, 8, 0)


def test_equicorrelated_range():
    with pytest.raises(ValueError, match="rho0"):
        equicorrelated(3, -0.6)
    with pytest.raises(ValueError, match="m "):
        equicorrelated(1, 0.2)
    with pytest.raises(ValueError, match="dtype must be"):
        equicorrelated(3, 0.2, dtype=torch.int64)
    with pytest.raises(ValueError, match="device"):
        equicorrelated(3, 0.2, device="foo")


def test_dataset_contract_round_trip(tmp_path):
    config = ModelConfig(width=16, depth=2)
    V = covariance(initial_tokens(equicorrelated(3, 0.2), 16, 5)).unsqueeze(1).repeat(1, 3, 1, 1)
    V[0, 2] = float("nan")  # a broken path: metrics must report NaN, not crash
    ds = covariance_dataset(
        V, [0.0, 1 / 16, 2 / 16], config, source="network", method="test", seed=3, layer=[0, 1, 2]
    )
    assert ds["V"].dims == ("sample", "t", "token_a", "token_b")
    assert ds.attrs["source"] == "network" and ds.attrs["seed"] == 3
    ds = with_metrics(with_rho(ds))
    np.testing.assert_allclose(ds["mean_rho"].values[1:], 0.2)
    assert np.isnan(ds["mean_rho"].values[0, 2]) and np.isfinite(ds["mean_rho"].values[0, 1])
    back = load_dataset(save_dataset(ds, tmp_path / "r.nc"))
    assert config_of(back) == config
    np.testing.assert_array_equal(back["layer"].values, [0, 1, 2])
