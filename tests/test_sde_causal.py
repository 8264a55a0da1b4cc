"""Causal covariance SDE (docs/theory.md#causal-sde): closed forms against a literal transcription
of the formulas, the reduction to section 3, token 1, and the exact law of the structured noise."""

from __future__ import annotations

import pytest
import torch

import sde
from sde.noise import noise_increment, psd_factor
from sde.torchsde_solver import CovarianceSDE, pack
from shapedtx import ModelConfig

CAUSAL = ModelConfig(width=512, gamma=0.8, tau0=0.7, causal=True)
VARIANTS = {
    "attention": CAUSAL,
    "heads_out_proj": CAUSAL.replace(heads=4, out_proj=True),
    "block": CAUSAL.replace(mlp="shaped_relu", c_minus=-2.0),
}


def random_V(m: int, batch: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, m, m + 2, generator=g, dtype=torch.float64)
    return X @ X.transpose(-1, -2) / (m + 2) + 0.2 * torch.eye(m, dtype=torch.float64)


def literal_P(a: int, m: int) -> torch.Tensor:
    """``P_a`` entry by entry (1-based a)."""
    P = torch.zeros(m, m, dtype=torch.float64)
    for i in range(a):
        for j in range(a):
            P[i, j] = (i == j) - 1.0 / a
    return P


def literal_drift_and_bracket(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/theory.md#causal-sde transcribed with loops: the drift bracket (without gamma^2 /
    tau0^2) and the diffusion bracket (without gamma^4 / (tau0^2 n_h))."""
    m = V.shape[-1]
    P = [literal_P(a, m) for a in range(1, m + 1)]
    u = []
    for a in range(1, m + 1):
        Vb = P[a - 1] @ V @ P[a - 1]
        ua = torch.zeros(m, dtype=torch.float64)
        for i in range(a):
            ua[i] = Vb[i, i] - torch.trace(Vb) / a
        u.append(ua)
    b = torch.zeros(m, m, dtype=torch.float64)
    for a in range(m):
        for c in range(m):
            M = torch.trace(P[a] @ V @ P[c] @ V) / ((a + 1) * (c + 1))
            b[a, c] = (
                M * V[a, c]
                + V[a, a] / (2 * (a + 1)) * (V @ u[a])[c]
                + V[c, c] / (2 * (c + 1)) * (V @ u[c])[a]
            )
    S = torch.zeros(m, m, m, m, dtype=torch.float64)

    def W(x: int, y: int) -> torch.Tensor:
        return V @ P[x] @ V @ P[y] @ V / ((x + 1) * (y + 1))

    for a in range(m):
        for bb in range(m):
            for c in range(m):
                for d in range(m):
                    S[a, bb, c, d] = (
                        V[a, c] * W(a, c)[bb, d]
                        + V[a, d] * W(a, d)[bb, c]
                        + V[bb, c] * W(bb, c)[a, d]
                        + V[bb, d] * W(bb, d)[a, c]
                    )
    return b, S


@pytest.mark.parametrize("m", [2, 3, 4])
def test_causal_coefficients_match_the_literal_formulas(m):
    V = random_V(m, seed=m)
    b_lit, S_lit = literal_drift_and_bracket(V)
    a_att = CAUSAL.gamma**2 / CAUSAL.tau0**2
    torch.testing.assert_close(sde.drift(CAUSAL, V), a_att * b_lit, rtol=1e-12, atol=1e-13)
    const = sde.sde_constants(CAUSAL, m)
    assert const.causal and const.k_att == pytest.approx(CAUSAL.gamma**4 / CAUSAL.tau0**2)
    expected = const.k_lin * sde.coefficients.sigma_lin(V) + const.k_att * S_lit
    torch.testing.assert_close(sde.diffusion(CAUSAL, V), expected, rtol=1e-12, atol=1e-13)
    # batched: the same per batch entry
    Vb = random_V(m, (3,), seed=9)
    torch.testing.assert_close(sde.drift(CAUSAL, Vb)[1], sde.drift(CAUSAL, Vb[1]))


def test_causal_reduces_to_section_3_and_token_1_is_linear():
    """Token 1 (P_1 = 0) has no attention drift or noise; the last token's own entries are the
    non-causal ones (a = c = m: section 3); the causal drift differs from the non-causal one."""
    m = 4
    V = random_V(m, seed=1)
    b, bn = sde.drift(CAUSAL, V), sde.drift(CAUSAL.replace(causal=False), V)
    assert b[0, 0] == 0.0
    torch.testing.assert_close(b[-1, -1], bn[-1, -1])
    assert (b - bn).norm() > 0.2 * bn.norm()
    S = sde.diffusion(CAUSAL, V)
    k_lin = sde.sde_constants(CAUSAL, m).k_lin
    torch.testing.assert_close(S[0, 0, 0, 0], 2 * k_lin * V[0, 0] ** 2)
    Sn = sde.diffusion(CAUSAL.replace(causal=False), V)
    torch.testing.assert_close(S[-1, -1, -1, -1], Sn[-1, -1, -1, -1])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causal_noise_has_exactly_the_diffusion(name):
    """The noise is linear in the normals: its covariance J J^T (J the Jacobian) equals the
    causal diffusion to rounding, and torchsde's diffusion matrix is the same J."""
    config = VARIANTS[name]
    m = 4
    V = random_V(m, seed=2)
    const = sde.sde_constants(config, m)
    L, _ = psd_factor(V)

    def noise(z: torch.Tensor) -> torch.Tensor:
        normals = z.view(2, m, m)
        return noise_increment(L, V, normals, const.k_lin, const.k_att, causal=True).reshape(-1)

    J = torch.autograd.functional.jacobian(noise, torch.zeros(2 * m * m, dtype=torch.float64))
    Sigma = sde.diffusion(config, V).reshape(m * m, m * m)
    torch.testing.assert_close(J @ J.T, Sigma, rtol=1e-12, atol=1e-12)
    wrong = sde.diffusion(config.replace(causal=False), V).reshape(m * m, m * m)
    assert (J @ J.T - wrong).abs().max() > 1e-3 * Sigma.abs().max()
    G = CovarianceSDE(config, m, torch.tensor([1e8], dtype=torch.float64)).g(None, pack(V)[None])
    torch.testing.assert_close(G[0], pack(J.T.reshape(-1, m, m)).T, rtol=1e-12, atol=1e-12)


# The multi-head causal constants (docs/theory.md#sde-heads and #causal-sde), written out
# independently of sde.sde_constants: exact at heads 1, 2, 4 (a wrong 1/n_h fails at once).
HEAD_CASES = {
    "1 head": {"heads": 1},
    "2 heads": {"heads": 2},
    "4 heads": {"heads": 4},
    "2 heads, W^O": {"heads": 2, "out_proj": True},
    "4 heads, W^O": {"heads": 4, "out_proj": True},
    "4 heads of 64, W^O": {"heads": 4, "out_proj": True, "head_dim": 64},
    "2 heads, block": {"heads": 2, "mlp": "shaped_relu", "c_minus": -2.0},
}


def theory_sigma(config: ModelConfig, V: torch.Tensor) -> torch.Tensor:
    """docs/theory.md's causal diffusion: ``k_lin Sigma_lin + gamma^4 / (tau0^2 n_h) [causal
    bracket]`` with ``k_lin = 2 lam^2 gamma^2 + gamma^4 (n / (n_h d_p) + 1[W^O]) + 2 gamma^2
    1[MLP]`` (the general rule); Sigma_lin by einsum, the bracket by loops."""
    g2 = config.gamma**2
    k_lin = 2 * (1 - g2) * g2 + g2**2 * (
        config.width / (config.heads * config.head_dim) + (1 if config.out_proj else 0)
    )
    if config.mlp == "shaped_relu":
        k_lin += 2 * g2
    k_att = g2**2 / (config.tau0**2 * config.heads)
    lin = torch.einsum("ac,bd->abcd", V, V) + torch.einsum("ad,bc->abcd", V, V)
    return k_lin * lin + k_att * literal_drift_and_bracket(V)[1]


@pytest.mark.parametrize("name", list(HEAD_CASES))
def test_multi_head_causal_diffusion_and_sample_noise_are_the_theory_s(name):
    """diffusion(config, V) and the covariance of sample_noise(config, V) (linear in the
    normals: J J^T) both equal docs/theory.md's causal diffusion; sample_noise must pass the
    causal flag on (the non-causal noise of the same config misses it)."""
    config = ModelConfig(width=512, gamma=0.8, tau0=0.7, causal=True, **HEAD_CASES[name])
    m = 3
    V = random_V(m, seed=5)
    expected = theory_sigma(config, V)
    torch.testing.assert_close(sde.diffusion(config, V), expected, rtol=1e-12, atol=1e-13)

    def noise(z: torch.Tensor) -> torch.Tensor:
        return sde.sample_noise(config, V, normals=z.view(2, m, m)).reshape(-1)

    J = torch.autograd.functional.jacobian(noise, torch.zeros(2 * m * m, dtype=torch.float64))
    flat = expected.reshape(m * m, m * m)
    torch.testing.assert_close(J @ J.T, flat, rtol=1e-12, atol=1e-13)
    non_causal = sde.diffusion(config.replace(causal=False), V).reshape(m * m, m * m)
    assert (flat - non_causal).abs().max() > 1e-3 * flat.abs().max()
    # the drawn noise is the same function of the generator's normals
    xi = sde.sample_noise(config, V, torch.Generator().manual_seed(1))
    z = torch.randn((2, m, m), generator=torch.Generator().manual_seed(1), dtype=V.dtype)
    torch.testing.assert_close(xi, sde.sample_noise(config, V, normals=z), rtol=0, atol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_noise_increment_is_the_documented_function_of_the_normals(causal):
    """sde.noise_increment, literally (module docstring of sde.noise): ``sqrt(k_lin / 2) L (N1
    + N1^T) L^T + sqrt(k_att) (Y V + V Y^T)`` with ``Yh = L N2 L^T`` and ``Y = Yh P`` or, causal,
    row a of Y ``Yh^{a,:} P_a / a``: the same normals give the same increment (the solvers
    couple paths through them), not only the same law."""
    m, k_lin, k_att = 4, 0.7, 0.3
    V = random_V(m, (2,), seed=6)
    L = torch.linalg.cholesky(V)
    normals = torch.randn(2, 2, m, m, generator=torch.Generator().manual_seed(2), dtype=V.dtype)
    for i in range(2):
        N1, N2 = normals[i, 0], normals[i, 1]
        Yh = L[i] @ N2 @ L[i].T
        if causal:
            Y = torch.stack([Yh[a] @ literal_P(a + 1, m) / (a + 1) for a in range(m)])
        else:
            Y = Yh @ literal_P(m, m)
        expected = (k_lin / 2) ** 0.5 * L[i] @ (N1 + N1.T) @ L[i].T + k_att**0.5 * (
            Y @ V[i] + V[i] @ Y.T
        )
        out = noise_increment(L, V, normals, k_lin, k_att, causal=causal)[i]
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-13)


def test_causal_coefficients_of_any_batch_shape():
    """(..., m, m) -> (..., m, m) and (..., m, m, m, m): a (3, 2) batch of covariances gets,
    entry by entry, the causal drift and diffusion of each one (m = 3: no batch size is m)."""
    config = VARIANTS["block"]
    V = random_V(3, (3, 2), seed=7)
    b, S = sde.drift(config, V), sde.diffusion(config, V)
    assert b.shape == (3, 2, 3, 3) and S.shape == (3, 2, 3, 3, 3, 3)
    for i in range(3):
        for j in range(2):
            torch.testing.assert_close(b[i, j], sde.drift(config, V[i, j]), rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(
                S[i, j], sde.diffusion(config, V[i, j]), rtol=1e-12, atol=1e-14
            )
