"""The exact one-step mean of an MLP sub-block (docs/theory.md#kernel-map): the kernel map of
shaped, plain and trained-slope ReLUs and of GELU against one-step Monte Carlo of the
library's block, with tolerances from the Monte Carlo standard error; a wrong constant fails."""

from __future__ import annotations

import math

import pytest
import torch

from sde import arccos_kernel, drift, kernel_nonlinearity, mlp_block_mean, mlp_kernel
from shapedtx import ModelConfig, ParameterError
from shapedtx.blocks import block, gaussian_linear

WIDTH, M, SAMPLES = 64, 3, 3000


def _config(mlp: str, **changes) -> ModelConfig:
    fields = {"width": WIDTH, "depth": 4, "attention": "none", "mlp": mlp, "mlp_ratio": 4}
    return ModelConfig(**{**fields, "gamma": 0.6, **changes})


def _input() -> torch.Tensor:
    X = torch.randn(M, WIDTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    X[1] = 0.8 * X[0] + 0.6 * X[1]  # correlated tokens, unequal norms
    X[2] *= 1.5
    return X


def _one_step(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """V, the Monte Carlo mean of V' over fresh weights, and its standard error."""
    X = _input()
    gen = torch.Generator().manual_seed(1)
    Xs = X.expand(SAMPLES, M, WIDTH)
    out = block(Xs, config, gaussian_linear(gen, config))
    Vp = out @ out.transpose(-1, -2) / WIDTH
    return X @ X.T / WIDTH, Vp.mean(0), Vp.std(0) / math.sqrt(SAMPLES)


CASES = {
    "relu": {"mlp": "relu"},
    "gelu": {"mlp": "gelu"},
    "shaped relu": {"mlp": "shaped_relu"},
    "trained slopes": {"mlp": "shaped_relu", "c_plus": 2.4, "c_minus": -6.4},  # 1.3, 0.2
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_mean_is_the_kernel_map(case: str) -> None:
    config = _config(**CASES[case])
    V, mean, se = _one_step(config)
    expected = mlp_block_mean(config, V)
    z = ((mean - expected) / se).abs().max()
    assert z < 4.5, f"max |z| = {z:.2f}"
    # power: a kernel with half its nonlinear part, or 1.5 times it, is rejected (the shaped
    # ReLU is nearly linear at width 64: its constant is tested against the SDE's drift below)
    if case != "shaped relu":
        K = mlp_kernel(config, V)
        for factor in (0.5, 1.5):
            wrong = V + config.gamma**2 * factor * (K - V)
            assert ((mean - wrong) / se).abs().max() > 6


def test_relu_kernel_closed_form() -> None:
    """kappa = 1/2 for the plain ReLU: K = (V + J) / 2, and 2 E[relu relu] by quadrature."""
    V = _input() @ _input().T / WIDTH
    K = mlp_kernel(_config("relu"), V)
    torch.testing.assert_close(K, (V + arccos_kernel(V)) / 2)
    assert kernel_nonlinearity(1.0, 0.0) == 0.5
    assert kernel_nonlinearity(1.0, 1.0) == 0.0
    assert kernel_nonlinearity(1.0, -1.0) == 1.0
    torch.testing.assert_close(torch.diagonal(K), torch.diagonal(V))  # c = 2 keeps norms


def test_gelu_kernel_against_monte_carlo_of_the_activation() -> None:
    V = torch.tensor([[1.0, 0.3, -0.5], [0.3, 0.5, 0.1], [-0.5, 0.1, 2.0]], dtype=torch.float64)
    h = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=torch.float64), V)
    x = torch.nn.functional.gelu(h.sample((200_000,)))
    mc = x.T @ x / x.shape[0]
    se = (x[:, :, None] * x[:, None, :]).std(0) / math.sqrt(x.shape[0])
    K = mlp_kernel(_config("gelu"), V)
    assert ((K - mc) / se).abs().max() < 4.5


def test_shaped_relu_kernel_gives_the_sde_drift() -> None:
    """n (K - V) -> (c_+ - c_-)^2 / 4 (J - V): the shaped MLP's drift per unit SDE time
    (docs/theory.md#sde-mlp) is the kernel map's leading order; the plain ReLU's is n/2."""
    X = _input()
    V = X @ X.T / WIDTH
    for width in (256, 4096, 65536):
        config = _config("shaped_relu", width=width, gamma=0.5)
        per_time = width * (mlp_block_mean(config, V) - V)
        torch.testing.assert_close(per_time, drift(config, V), rtol=4 / math.sqrt(width), atol=0)
    relu = _config("relu", gamma=0.5)
    per_layer = mlp_block_mean(relu, V) - V
    torch.testing.assert_close(per_layer, 0.25 * 0.5 * (arccos_kernel(V) - V))


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"mlp": "none", "attention": "shaped"}, "mlp"),
        ({"init": "gpt2"}, "init"),
        ({"residual": "unit"}, "residual"),
    ],
)
def test_kernel_map_refuses_what_it_does_not_cover(changes: dict, parameter: str) -> None:
    config = _config("relu").replace(**changes)
    with pytest.raises(ParameterError) as err:
        mlp_kernel(config, torch.eye(2))
    assert err.value.parameter == parameter
