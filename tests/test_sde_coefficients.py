"""Coefficients of the covariance SDE: closed forms, constants, refusals, noise law."""

from __future__ import annotations

import math

import pytest
import torch

import sde
from sde.coefficients import attention_drift_factor, attention_sigma, sigma_lin
from shapedtx import ModelConfig, equicorrelated

ATT = ModelConfig(width=2048, gamma=0.8, tau0=0.7)


def random_V(m: int, batch: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, m, m + 2, generator=g, dtype=torch.float64)
    return X @ X.transpose(-1, -2) / (m + 2)


def test_m2_closed_form():
    """docs/theory.md#sde: m = 2 gives b_att = (gamma^2 e^2 / (16 tau0^2)) V."""
    V = random_V(2, (5,))
    e = V[:, 0, 0] + V[:, 1, 1] - 2 * V[:, 0, 1]
    expected = (ATT.gamma**2 * e**2 / (16 * ATT.tau0**2))[:, None, None] * V
    torch.testing.assert_close(sde.drift(ATT, V), expected, rtol=1e-12, atol=1e-14)


def test_attention_drift_is_factored():
    """b_att = H V + V H^T with H = (gamma^2/tau0^2)[Q/(2m^2) I + v u^T/(2m)] (the PSD scheme)."""
    V = random_V(5, (3,), seed=1)
    H = attention_drift_factor(V, ATT.gamma**2 / ATT.tau0**2)
    torch.testing.assert_close(H @ V + V @ H.mT, sde.drift(ATT, V), rtol=1e-12, atol=1e-13)
    # the direct formula of docs/theory.md#sde
    m = 5
    P = torch.eye(m, dtype=V.dtype) - 1 / m
    Vbar = P @ V @ P
    Q = torch.einsum("bij,bji->b", Vbar, V)
    d = torch.diagonal(Vbar, dim1=-2, dim2=-1)
    u = d - d.mean(-1, keepdim=True)
    v = torch.diagonal(V, dim1=-2, dim2=-1)
    Vu = (V @ u[..., None])[..., 0]
    direct = (ATT.gamma**2 / ATT.tau0**2) * (
        Q[:, None, None] / m**2 * V
        + (v[:, :, None] * Vu[:, None, :] + Vu[:, :, None] * v[:, None, :]) / (2 * m)
    )
    torch.testing.assert_close(sde.drift(ATT, V), direct, rtol=1e-12, atol=1e-13)


def test_tau0_to_infinity_recovers_linear_network():
    V = random_V(4, (3,))
    small = sde.drift(ATT.replace(tau0=1e6), V)
    assert small.abs().max() < 1e-10 * V.abs().max() ** 3
    diff = sde.diffusion(ATT.replace(tau0=1e6), V)
    k_lin = ATT.gamma**2 * (2 - ATT.gamma**2)
    torch.testing.assert_close(diff, k_lin * sigma_lin(V), rtol=1e-10, atol=1e-12)


def test_mlp_drift_nu_and_arccos_kernel():
    """gamma^2 nu(rho) sqrt(V^aa V^bb) = k_mlp (J(V) - V); nu(1) = 0 (diagonal drift 0)."""
    cfg = ModelConfig(attention="none", mlp="shaped_relu", c_plus=0.3, c_minus=-1.2)
    V = random_V(4, (3,), seed=2)
    b = sde.drift(cfg, V)
    const = sde.sde_constants(cfg, 4)
    torch.testing.assert_close(b, const.k_mlp * (sde.arccos_kernel(V) - V), rtol=1e-10, atol=1e-12)
    assert torch.diagonal(b, dim1=-2, dim2=-1).abs().max() < 1e-12
    rho = torch.tensor([-0.5, 0.0, 0.3, 1.0], dtype=torch.float64)
    expected = (1.5**2 / (2 * math.pi)) * (torch.sqrt(1 - rho**2) - rho * torch.acos(rho))
    torch.testing.assert_close(sde.nu(rho, 0.3, -1.2), expected)
    assert sde.nu(torch.tensor(0.0), 0.0, -1.0) > 0  # the sign docs/theory.md warns about


def test_block_adds_sub_blocks():
    block = ModelConfig(mlp="shaped_relu", gamma=0.6, tau0=0.8)
    att, mlp = block.replace(mlp="none"), block.replace(attention="none")
    V = random_V(3, (2,), seed=3)
    torch.testing.assert_close(sde.drift(block, V), sde.drift(att, V) + sde.drift(mlp, V))
    torch.testing.assert_close(
        sde.diffusion(block, V), sde.diffusion(att, V) + sde.diffusion(mlp, V)
    )
    g2 = block.gamma**2
    const = sde.sde_constants(block, 3)
    assert const.k_lin == pytest.approx(g2 * (4 - g2))  # docs/theory.md's block coefficient


@pytest.mark.parametrize(
    ("changes", "k_lin", "k_att"),
    [
        ({}, lambda g2: g2 * (2 - g2), lambda g2, h: g2**2 / h),
        ({"heads": 4, "out_proj": True}, lambda g2: 2 * g2, lambda g2, h: g2**2 / h),
        ({"heads": 4}, lambda g2: g2 * (2 - g2), lambda g2, h: g2**2 / h),
        ({"attention": "none", "mlp": "shaped_relu"}, lambda g2: 2 * g2, lambda g2, h: 0.0),
    ],
)
def test_constants_table(changes, k_lin, k_att):
    cfg = ModelConfig(width=256, gamma=0.7, tau0=1.3, **changes)
    const = sde.sde_constants(cfg, 3)
    g2 = cfg.gamma**2
    assert const.k_lin == pytest.approx(k_lin(g2))
    assert const.k_att == pytest.approx(k_att(g2, cfg.heads) / (cfg.tau0**2 * 9))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"attention": "softmax"}, "attention='softmax' has no covariance SDE"),
        ({"mlp": "relu"}, "mlp='relu' has no covariance SDE"),
        ({"norm": "pre"}, "norm='pre'"),
    ],
)
def test_degenerate_configs_refused(changes, match):
    cfg = ModelConfig(**changes)
    V = equicorrelated(3, 0.2)
    for fn in (sde.drift, sde.diffusion):
        with pytest.raises(ValueError, match=match):
            fn(cfg, V)
    with pytest.raises(ValueError, match=match):
        sde.solve(cfg, V, 4)


def test_every_unsupported_field_is_named_at_once():
    """Issue 39: the post_ln preset needed a rerun per field; the refusal names all four (its
    mlp_ratio=4 has an SDE, docs/theory.md#sde-mlp-ratio, and is not named)."""
    from shapedtx import preset

    with pytest.raises(ValueError) as info:
        sde.sde_constants(preset("post_ln", width=16, depth=2))
    message = str(info.value)
    assert message.startswith("4 fields have no derived covariance SDE")
    for field in ("attention='softmax'", "mlp='gelu'", "norm='post'", "residual='unit'"):
        assert field in message
    assert "mlp_ratio" not in message
    for fix in ("use attention='shaped'", "use mlp='shaped_relu'", "use norm='none'",
                "use residual='scaled'"):  # fmt: skip
        assert fix in message


def test_bad_shapes_refused():
    with pytest.raises(ValueError, match="V must have shape"):
        sde.drift(ATT, torch.ones(3, 2, dtype=torch.float64))


def _flat_cov(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empirical covariance of zero-mean (N, m, m) increments and its standard error."""
    x = samples.flatten(1)
    prod = x[:, :, None] * x[:, None, :]
    return prod.mean(0), prod.std(0) / math.sqrt(x.shape[0])


@pytest.mark.slow
def test_noise_covariance_equals_diffusion():
    """The structured sampler has covariance diffusion(config, V); a wrong k_att is rejected."""
    cfg = ModelConfig(width=2048, gamma=1.0, tau0=0.5, heads=2, out_proj=True)
    m, N = 3, 200_000
    V = random_V(m, seed=4)
    g = torch.Generator().manual_seed(0)
    xi = sde.sample_noise(cfg, V.expand(N, m, m), g)
    torch.testing.assert_close(xi, xi.mT)
    cov, se = _flat_cov(xi)
    Sigma = sde.diffusion(cfg, V).reshape(m * m, m * m)
    assert ((cov - Sigma).abs() <= 5 * se).all(), ((cov - Sigma).abs() / se).max()
    assert xi.mean(0).abs().max() < 5 * xi.std(0).max() / math.sqrt(N)
    # power: the same statistic rejects the attention term with a factor 1.5
    const = sde.sde_constants(cfg, m)
    wrong = Sigma + 0.5 * const.k_att * attention_sigma(V).reshape(m * m, m * m)
    assert ((cov - wrong).abs() > 5 * se).any()


def test_sigma_terms_by_einsum_and_their_symmetries():
    """Sigma_lin^{ab,cd} = V^ac V^bd + V^ad V^bc and the attention term V^ac W^bd + V^ad W^bc
    + V^bc W^ad + V^bd W^ac (W = V P V P V), written independently with einsum; both are
    symmetric in (a, b), in (c, d) and under (ab) <-> (cd)."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    V = X @ X.mT / 5
    P = torch.eye(3, dtype=torch.float64) - 1 / 3
    W = V @ P @ V @ P @ V
    lin = torch.einsum("...ac,...bd->...abcd", V, V) + torch.einsum("...ad,...bc->...abcd", V, V)
    att = (torch.einsum("...ac,...bd->...abcd", V, W) + torch.einsum("...ad,...bc->...abcd", V, W)
           + torch.einsum("...bc,...ad->...abcd", V, W)
           + torch.einsum("...bd,...ac->...abcd", V, W))  # fmt: skip
    torch.testing.assert_close(sigma_lin(V), lin, rtol=1e-12, atol=0)
    torch.testing.assert_close(attention_sigma(V), att, rtol=1e-12, atol=0)
    for S in (lin, att):
        torch.testing.assert_close(S, S.transpose(-4, -3))
        torch.testing.assert_close(S, S.transpose(-2, -1))
        torch.testing.assert_close(S, S.permute(0, 3, 4, 1, 2))


def test_nu_clamps_correlations_just_outside_the_unit_interval():
    from sde.coefficients import nu

    rho = torch.tensor([1.0 + 1e-12, 1.0, -1.0 - 1e-12, -1.0], dtype=torch.float64)
    out = nu(rho, 0.0, -1.0)
    assert torch.isfinite(out).all()
    assert out[0] == out[1] == 0.0
    assert out[2] == out[3] == pytest.approx(1 / (2 * math.pi) * math.pi)


NOISE_CONFIGS = {
    "attention": ModelConfig(width=2048, gamma=1.0, tau0=0.5, heads=2, out_proj=True),
    "mlp_only": ModelConfig(width=2048, attention="none", mlp="shaped_relu", c_minus=-1.2),
}


@pytest.mark.parametrize("name", list(NOISE_CONFIGS))
@pytest.mark.parametrize("factor", ["symmetric", "cholesky"])
def test_noise_is_linear_in_the_normals_with_exactly_the_diffusion(name, factor):
    """The noise is linear in the normals (N1, N2): its covariance J J^T (J the Jacobian) is
    diffusion(config, V) to rounding, for any factor with L L^T = V (the symmetric root or a
    Cholesky factor; module docstring of sde.noise), non-causal by default, and symmetric.
    A leading batch dimension of size 1 checks that only the matrix axes are transposed."""
    from sde.noise import noise_increment, psd_factor

    config = NOISE_CONFIGS[name]
    m = 4
    V = random_V(m, (1,), seed=3)
    const = sde.sde_constants(config, m)
    L = psd_factor(V)[0] if factor == "symmetric" else torch.linalg.cholesky(V)
    torch.testing.assert_close(L @ L.mT, V, rtol=1e-12, atol=1e-12)

    def noise(z: torch.Tensor) -> torch.Tensor:
        return noise_increment(L, V, z.view(1, 2, m, m), const.k_lin, const.k_att).reshape(-1)

    J = torch.autograd.functional.jacobian(noise, torch.zeros(2 * m * m, dtype=torch.float64))
    Sigma = sde.diffusion(config, V[0]).reshape(m * m, m * m)
    torch.testing.assert_close(J @ J.T, Sigma, rtol=1e-12, atol=1e-12)
    z = torch.randn(1, 2, m, m, generator=torch.Generator().manual_seed(0), dtype=V.dtype)
    xi = noise_increment(L, V, z, const.k_lin, const.k_att)
    torch.testing.assert_close(xi, xi.mT, rtol=0, atol=1e-14)
    if factor == "symmetric":  # sample_noise factors V itself (symmetric root)
        torch.testing.assert_close(sde.sample_noise(config, V, normals=z), xi)


def test_sample_noise_draws_two_normal_matrices_per_covariance_of_any_batch_shape():
    """Without ``normals`` the draw is ``normals = randn((..., 2, m, m), generator)``; every
    covariance of a (2, 3, m, m) batch gets the noise of its own normals."""
    config = NOISE_CONFIGS["attention"]
    m = 4
    V = random_V(m, (2, 3), seed=5)
    xi = sde.sample_noise(config, V, torch.Generator().manual_seed(7))
    normals = torch.randn(
        (2, 3, 2, m, m), generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    torch.testing.assert_close(sde.sample_noise(config, V, normals=normals), xi, rtol=0, atol=0)
    assert xi.shape == (2, 3, m, m)
    for i in range(2):
        for j in range(3):
            one = sde.sample_noise(config, V[i, j], normals=normals[i, j])
            torch.testing.assert_close(xi[i, j], one, rtol=1e-12, atol=1e-13)
    assert (xi[0, 0] - xi[0, 1]).abs().max() > 1e-3


def test_constants_without_attention_are_not_causal():
    """SDEConstants.causal is False without attention (its documented invariant), both from
    sde_constants and for constants built without the causal field."""
    from sde.coefficients import SDEConstants

    mlp = ModelConfig(attention="none", mlp="shaped_relu", causal=True)
    assert sde.sde_constants(mlp, 3).causal is False
    assert sde.sde_constants(ATT.replace(causal=True), 3).causal is True
    assert SDEConstants(k_lin=1.0, k_att=0.0, a_att=0.0, k_mlp=0.5, heads=1).causal is False


CONSTANT_CASES = {
    "attention, 1 head": {},
    "attention, 4 heads, W^O": {"heads": 4, "out_proj": True},
    "attention, 2 heads of 32, W^O": {"heads": 2, "head_dim": 32, "out_proj": True},
    "MLP": {"attention": "none", "mlp": "shaped_relu", "c_plus": 0.4, "c_minus": -1.1},
    "block, 2 heads": {"heads": 2, "mlp": "shaped_relu", "c_plus": -0.2, "c_minus": -1.5},
}


@pytest.mark.parametrize("name", list(CONSTANT_CASES))
@pytest.mark.parametrize("m", [None, 2, 5])
def test_all_four_constants_are_docs_theory_s(name, m):
    """docs/theory.md#sde-heads, literally: k_lin = 2 lam^2 gamma^2 + gamma^4 (n / (n_h d_p) +
    1[W^O]) (attention) + 2 gamma^2 (MLP), k_att = gamma^4 / (tau0^2 m^2 n_h) (0 without m or
    attention), a_att = gamma^2 / tau0^2, k_mlp = gamma^2 (c_+ - c_-)^2 / 4; heads = n_h."""
    cfg = ModelConfig(width=128, gamma=0.6, tau0=1.7, **CONSTANT_CASES[name])
    g2, lam2 = 0.36, 0.64
    att, mlp = cfg.attention == "shaped", cfg.mlp == "shaped_relu"
    k_lin = (2 * lam2 * g2 + g2**2 * (128 / (cfg.heads * cfg.head_dim) + cfg.out_proj)) * att
    k_lin += 2 * g2 * mlp
    k_att = g2**2 / (1.7**2 * m**2 * cfg.heads) if att and m else 0.0
    a_att = g2 / 1.7**2 * att
    k_mlp = g2 * (cfg.c_plus - cfg.c_minus) ** 2 / 4 * mlp
    const = sde.sde_constants(cfg, m)
    got = (const.k_lin, const.k_att, const.a_att, const.k_mlp)
    assert got == pytest.approx((k_lin, k_att, a_att, k_mlp), rel=1e-14, abs=0)
    assert const.heads == cfg.heads and const.causal is False


def test_one_or_two_unsupported_fields_are_refused_as_documented():
    """One unsupported field: its own reason, as is. Two: both named at once, counted."""
    with pytest.raises(ValueError) as one:
        sde.sde_constants(ModelConfig(norm="pre"))
    assert str(one.value).startswith("norm='pre' has no derived covariance SDE")
    with pytest.raises(ValueError) as two:
        sde.sde_constants(ModelConfig(norm="pre", mlp="gelu"))
    message = str(two.value)
    assert message.startswith("2 fields have no derived covariance SDE (mlp='gelu', norm='pre')")
    assert "(1) mlp='gelu'" in message and "(2) norm='pre'" in message
    for m in (1, 0):
        with pytest.raises(ValueError, match="m"):
            sde.sde_constants(ATT, m)
    assert sde.sde_constants(ATT, 2).k_att > 0


def test_covariances_of_any_batch_shape_and_at_least_two_tokens():
    """V: (..., m, m) with m >= 2: a (2, 1) batch is accepted (the middle size is not m), one
    token or a non-square V is refused."""
    V = random_V(3, (2, 1), seed=8)
    torch.testing.assert_close(sde.drift(ATT, V)[1, 0], sde.drift(ATT, V[1, 0]))
    assert sde.diffusion(ATT, V).shape == (2, 1, 3, 3, 3, 3)
    for bad in (torch.ones(1, 1, dtype=torch.float64), torch.ones(2, 3, 2, dtype=torch.float64)):
        with pytest.raises(ValueError, match="V must have shape"):
            sde.diffusion(ATT, bad)
