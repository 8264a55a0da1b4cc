"""The width-independent sampler ``method="gram"`` (simulations/gram.py, docs/theory.md#samplers).

Law: two-sample KS tests against "exact" and "weights" at small widths (several
configurations, including the k < m corner cases), with a deliberately wrong variant rejected
by the same statistics; one-step diffusion at n = 10^7 against the SDE with no finite-width
allowance; medians at fixed T against ``sde.solve``. Plus seeds, chunking, rejected configs.
"""

import time

import pytest
import torch

import sde
from sde.coefficients import sigma_lin
from sde.noise import psd_factor
from shapedtx import ModelConfig
from shapedtx.metrics import correlation, mean_correlation
from simulations import GramSampler, GroupedNormal, equicorrelated, simulate
from simulations import gram as gram_module
from simulations.compare import compare

from mc_stats import assert_mean_within_se, two_sample_pvalue

# Independent samples: KS p-values are uniform under the null; 6 statistics x 2 references x
# 6 configurations: family-wise false-alarm rate <= 7.2e-2 at P_MIN (Bonferroni), fixed seeds.
P_MIN = 1e-3

_V0 = torch.tensor([[1.5, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 2.0]], dtype=torch.float64)


def _V(ds) -> torch.Tensor:
    return torch.from_numpy(ds["V"].values)


def _statistics(V: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    return {
        "rho01": correlation(V[:, layer])[:, 0, 1],
        "V00": V[:, layer, 0, 0],
        "mean_rho": mean_correlation(V[:, layer]),
    }


def _pvalues(a: torch.Tensor, b: torch.Tensor, layers) -> dict[str, float]:
    out = {}
    for layer in layers:
        sa, sb = _statistics(a, layer), _statistics(b, layer)
        out.update({f"{k}@{layer}": two_sample_pvalue(sa[k], sb[k]) for k in sa})
    return out


LAW_CONFIGS = {
    "shaped attention": ModelConfig(width=32, depth=8, gamma=0.6, tau0=0.5),
    "softmax attention": ModelConfig(width=32, depth=8, attention="softmax", gamma=0.6),
    "shaped block with shaped MLP": ModelConfig(
        width=32, depth=8, mlp="shaped_relu", gamma=0.6, tau0=0.5, c_minus=-2.0
    ),
    "ReLU MLP only": ModelConfig(width=32, depth=8, attention="none", mlp="relu", gamma=0.6),
    # n - m = 2 < m and n_k = 2 < m: the non-Bartlett (direct Gaussian) branches
    "causal softmax, n_k < m, n - m < m, ReLU": ModelConfig(
        width=6, depth=8, attention="softmax", key_dim=2, causal=True, mlp="relu", gamma=0.6
    ),
    "shaped, n = m": ModelConfig(width=4, depth=6, gamma=0.7, tau0=0.5),
}


@pytest.mark.parametrize("name", LAW_CONFIGS)
def test_gram_agrees_with_exact_and_weights(name):
    """KS on rho^{01}, V^{00}, mean rho at the middle and final layer, m = 4."""
    cfg = LAW_CONFIGS[name]
    V0 = equicorrelated(4, 0.3)
    layers = (cfg.depth // 2, cfg.depth)
    g = _V(simulate(cfg, V0, 2000, method="gram", seed=1))
    for method, seed in (("exact", 2), ("weights", 3)):
        ref = _V(simulate(cfg, V0, 500, method=method, seed=seed))
        for key, p in _pvalues(g, ref, layers).items():
            assert p > P_MIN, f"{name}: gram vs {method}: {key} differs (KS p = {p:.2g})"


def test_hidden_column_batches_keep_the_law(monkeypatch):
    """The MLP's hidden Gram matrix drawn in several column batches (with a remainder)."""
    monkeypatch.setattr(gram_module, "HIDDEN_ELEMENTS", GramSampler.group_size * 4 * 5)
    cfg = LAW_CONFIGS["shaped block with shaped MLP"]
    V0 = equicorrelated(4, 0.3)
    g = _V(simulate(cfg, V0, 2000, method="gram", seed=1))
    ref = _V(simulate(cfg, V0, 500, method="exact", seed=2))
    for key, p in _pvalues(g, ref, (cfg.depth,)).items():
        assert p > P_MIN, f"column-batched hidden Gram: {key} differs (KS p = {p:.2g})"


def _update_without_GGt(L, B, G, F, lam, s, work=None):
    """A plausible bug: the branch Gram uses only the Wishart(n - m) complement (drops
    ``B G G^T B^T``, i.e. forgets the part of W^V inside the token span)."""
    V = lam**2 * L @ L.mT + lam * s * (B @ G @ L.mT + L @ G.mT @ B.mT) + s**2 * B @ F @ F.mT @ B.mT
    return psd_factor(V)[0], V


def test_distribution_test_has_power(monkeypatch):
    """The same statistics reject the variant without ``G G^T`` (a relative m/n error)."""
    monkeypatch.setattr(gram_module, "residual_update", _update_without_GGt)
    cfg = LAW_CONFIGS["shaped attention"]
    V0 = equicorrelated(4, 0.3)
    g = _V(simulate(cfg, V0, 2000, method="gram", seed=1))
    ref = _V(simulate(cfg, V0, 500, method="weights", seed=3))
    assert min(_pvalues(g, ref, (cfg.depth,)).values()) < P_MIN


def _assert_diffusion(dV, n, Sigma, rel):
    d = dV - dV.mean(0)
    products = n * torch.einsum("sab,scd->sabcd", d, d)
    assert_mean_within_se(products, Sigma, z=5.0, floor=rel * Sigma.abs().max().item())


def test_huge_width_one_step_and_width_independent_cost():
    """n = 10^7 (n_k = 10^7): n Cov(V_1 - V_0) = Sigma(V_0) within 5 SE with a finite-width
    allowance of 0.2% (the one-step test of the token samplers needs 2% at n = 256); the
    Sigma_lin coefficient of the W^O variant is rejected. The cost of a block does not grow
    with the width: a loose guard (ratio < 3, expected about 1) against any O(n) work."""
    n = 10**7
    cfg = ModelConfig(width=n, depth=1, gamma=0.7, tau0=0.5)
    V = _V(simulate(cfg, _V0, 40_000, method="gram", seed=5))
    assert V.dtype == torch.float64 and bool(torch.isfinite(V).all())
    dV = V[:, 1] - V[:, 0]
    Sigma = sde.diffusion(cfg, _V0)
    _assert_diffusion(dV, n, Sigma, rel=0.002)
    with pytest.raises(AssertionError):
        _assert_diffusion(dV, n, Sigma + cfg.gamma**4 * sigma_lin(_V0), rel=0.002)

    def seconds(width):
        c = ModelConfig(width=width, depth=4, gamma=0.7, tau0=0.5)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            simulate(c, _V0, 1024, method="gram", seed=0, progress=False)
            best = min(best, time.perf_counter() - start)
        return best

    assert seconds(n) < 3 * seconds(64) + 0.05


@pytest.mark.slow
def test_gram_matches_sde_medians_at_fixed_T():
    """n = 256, T = 0.75 (docs/theory.md#checks configuration, m = 3): the medians of rho and
    V^{aa} agree with ``sde.solve`` within 4 (cluster-robust) standard errors; the SDE with
    half the temperature (tau0 = 0.5) is rejected by the same check."""
    cfg = ModelConfig(width=256, depth=192)
    N = 3000
    net = simulate(cfg, _V0, N, method="gram", seed=1).isel(t=[-1])

    def median_gaps(tau0: float) -> list[float]:
        lim = sde.solve(cfg.replace(tau0=tau0), _V0, N, dt=0.005, seed=2, progress=False)
        c = compare(net, lim.isel(t=[-1]).assign_coords(t=net["t"].values))
        gaps = []
        for v in ("rho", "Vaa"):
            q = c[f"{v}_quantile"].sel(quantile=0.5).values[:, 0]
            se = c[f"{v}_quantile_se"].sel(quantile=0.5).values[:, 0]
            gaps.append(abs(q[0] - q[1]) / float((se**2).sum() ** 0.5))
        return gaps

    gaps = median_gaps(cfg.tau0)
    assert max(gaps) < 4.0, f"median gaps (rho, V^aa) in SE: {gaps}"
    assert max(median_gaps(0.5)) > 4.0


def test_seed_reproducibility_and_chunking():
    cfg = LAW_CONFIGS["shaped block with shaped MLP"]
    V0 = equicorrelated(4, 0.3)
    a = _V(simulate(cfg, V0, 600, method="gram", seed=7))
    b = _V(simulate(cfg, V0, 600, method="gram", seed=7, chunk_size=256))
    c = _V(simulate(cfg, V0, 600, method="gram", seed=8))
    assert torch.equal(a, b)
    assert not torch.equal(a[:, -1], c[:, -1])
    assert torch.allclose(a[:, 0], V0.expand(600, 4, 4), atol=1e-14)
    ds = simulate(cfg.replace(attention="softmax"), V0, 50, method="gram", dtype=torch.float32)
    assert ds["V"].dtype == "float32" and ds.attrs["method"] == "gram"


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"norm": "pre"}, "norm='pre'"),
        ({"heads": 2}, "heads=2 without W"),
        ({"heads": 2, "norm": "post"}, "norm='post'.*heads=2 without W"),
        ({"mlp": "gelu"}, "mlp='gelu'"),
        ({"init": "gpt2"}, "init='gpt2'"),
    ],
)
def test_unsupported_configurations_are_rejected(changes, match):
    cfg = ModelConfig(width=16, depth=2, **changes)
    with pytest.raises(ValueError, match=match):
        simulate(cfg, equicorrelated(3, 0.2), 4, method="gram")


def test_overflow_is_reported():
    """Non-finite covariances are counted and warned about, never returned silently."""
    cfg = ModelConfig(width=16, depth=20, gamma=0.9)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        ds = simulate(cfg, 1e307 * equicorrelated(3, 0.2), 8, method="gram")
    assert ds.attrs["nonfinite"] > 0


def test_residual_update_algebra():
    """L' L'^T = lambda^2 V + lambda s (B G L^T + L G^T B^T) + s^2 B (G G^T + F F^T) B^T."""
    gen = torch.Generator().manual_seed(0)
    L, B, G = torch.randn((3, 5, 4, 4), generator=gen, dtype=torch.float64)
    F = torch.randn((5, 4, 2), generator=gen, dtype=torch.float64)
    lam, s = 0.8, 0.3
    out, V_out = gram_module.residual_update(L, B, G, F, lam, s)
    V = lam**2 * L @ L.mT + lam * s * (B @ G @ L.mT + L @ G.mT @ B.mT)
    V = V + s**2 * B @ (G @ G.mT + F @ F.mT) @ B.mT
    torch.testing.assert_close(out @ out.mT, V, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(V_out, V, rtol=1e-12, atol=1e-12)
    assert torch.equal(out, out.tril())


def test_residual_update_singular_sample_into_workspace():
    """A sample whose V' is singular (a zero token) takes the QR factor, the others the
    Cholesky factor, both written into the reused workspace tensors: L' L'^T = V' for all."""
    gen = torch.Generator().manual_seed(1)
    L, B, G = torch.randn((3, 4, 3, 3), generator=gen, dtype=torch.float64)
    F = torch.randn((4, 3, 3), generator=gen, dtype=torch.float64)
    L, B = L.tril(), B.clone()
    L[1, 0], B[1, 0] = 0.0, 0.0  # sample 1: token 0 is zero before and after the block
    work = gram_module.Workspace()
    for _ in range(2):  # the second call writes into the tensors of the first
        out, V = gram_module.residual_update(L, B, G, F, 0.8, 0.3, work)
        torch.testing.assert_close(out @ out.mT, V, rtol=1e-12, atol=1e-12)
        assert torch.equal(out, out.tril()) and out.is_contiguous()
        assert float(V[1, 0].abs().max()) == 0.0 and float(out[1, 0].abs().max()) == 0.0
        L = out.clone()
        L[1, 0], B[1, 0] = 0.0, 0.0


def test_mlp_with_singular_hidden_gram():
    """A zero token makes the hidden Gram matrix singular: the update stays finite and exact
    (the zero token stays zero under the MLP sub-block)."""
    cfg = ModelConfig(width=16, depth=1, attention="none", mlp="relu")
    rng = GroupedNormal(0, [0], [5], torch.device("cpu"))
    L = torch.linalg.cholesky(_V0).expand(5, 3, 3).clone()
    L[:, 0] = 0.0
    V = GramSampler(cfg, rng).covariance(GramSampler(cfg, rng).step((L, L @ L.mT)))
    assert bool(torch.isfinite(V).all())
    assert float(V[:, 0].abs().max()) == 0.0 and float(V[:, 1, 1].min()) > 0


MULTI_HEAD = {
    # heads with W^O: the Gram of the concatenated heads is sum_h A_h L Wishart(d_p) L^T A_h^T
    "2 heads, W^O, shaped": ModelConfig(width=32, depth=6, heads=2, out_proj=True, gamma=0.7),
    "4 heads, W^O, causal softmax, ReLU MLP": ModelConfig(
        width=32,
        depth=6,
        heads=4,
        out_proj=True,
        attention="softmax",
        causal=True,
        mlp="relu",
        gamma=0.6,
    ),
    # d_p = 2 < m (singular head Wishart) and H d_p = 8 >= m; n_k = 1 < m
    "4 heads of size 2, n_k 1, causal shaped, shaped MLP": ModelConfig(
        width=24,
        depth=6,
        heads=4,
        head_dim=2,
        key_dim=1,
        out_proj=True,
        causal=True,
        mlp="shaped_relu",
        gamma=0.6,
        tau0=0.5,
    ),
    # H d_p = 2 < m: the branch factor has rank 2 (B is m x 2)
    "2 heads of size 1 (H d_p < m), W^O, shaped": ModelConfig(
        width=24, depth=6, heads=2, head_dim=1, out_proj=True, gamma=0.8, tau0=0.3
    ),
    "1 head, fixed size 8, W^O, softmax": ModelConfig(
        width=32, depth=6, head_dim=8, out_proj=True, attention="softmax", gamma=0.7
    ),
}


@pytest.mark.parametrize("name", MULTI_HEAD)
def test_multi_head_gram_agrees_with_exact(name):
    """KS on rho^{01}, V^{00}, mean rho at the middle and last layer, and on V^{11}, V^{23}
    at the last layer: gram (2000 samples) vs exact (800 samples), m = 4."""
    cfg = MULTI_HEAD[name]
    V0 = equicorrelated(4, 0.3)
    g = _V(simulate(cfg, V0, 2000, method="gram", seed=1))
    ref = _V(simulate(cfg, V0, 800, method="exact", seed=2))
    pvalues = _pvalues(g, ref, (cfg.depth // 2, cfg.depth))
    for a, b in ((1, 1), (2, 3)):
        pvalues[f"V{a}{b}"] = two_sample_pvalue(g[:, -1, a, b], ref[:, -1, a, b])
    for key, p in pvalues.items():
        assert p > P_MIN, f"{name}: gram vs exact: {key} differs (KS p = {p:.2g})"


def test_multi_head_test_has_power():
    """The same statistics reject a branch weight 1.3x too large (gamma 0.91 vs 0.7)."""
    cfg = MULTI_HEAD["2 heads, W^O, shaped"].replace(heads=4)
    V0 = equicorrelated(4, 0.3)
    ref = _V(simulate(cfg, V0, 800, method="exact", seed=2))
    wrong = cfg.replace(gamma=cfg.gamma * 1.3)
    g = _V(simulate(wrong, V0, 2000, method="gram", seed=1))
    assert min(_pvalues(g, ref, (cfg.depth,)).values()) < P_MIN


def test_single_column_batches_follow_the_documented_batch_size(monkeypatch):
    """The column batch is ``max(1, HIDDEN_ELEMENTS // (group_size m))`` and fixes the random
    stream: a budget below one column per group and a budget of exactly one column per group
    both mean one hidden column per batch (the same numbers); two columns per batch draw
    other numbers."""
    cfg = ModelConfig(width=8, depth=2, attention="none", mlp="relu", gamma=0.6)
    V0 = equicorrelated(3, 0.3)
    runs = []
    for elements in (1, GramSampler.group_size * 3, GramSampler.group_size * 6):
        monkeypatch.setattr(gram_module, "HIDDEN_ELEMENTS", elements)
        runs.append(_V(simulate(cfg, V0, 20, method="gram", seed=4)))
    assert bool(torch.isfinite(runs[0]).all())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0][:, -1], runs[2][:, -1])


def test_memory_estimate_is_in_bytes_of_m_by_m_matrices():
    """The working memory per sample counts m x m matrices of the dtype: it scales as m^2 and
    as the item size, and grows with the number of attention heads; the fixed part is the
    hidden-column buffer, only with an MLP."""
    attn = ModelConfig(width=64, depth=2, heads=2, out_proj=True)
    per64, fixed = GramSampler.memory(attn, 4, torch.float64)
    assert fixed == 0 and per64 >= 4 * 4 * 8  # at least the state L itself
    assert GramSampler.memory(attn, 8, torch.float64)[0] == 4 * per64
    assert GramSampler.memory(attn, 4, torch.float32)[0] * 2 == per64
    assert GramSampler.memory(attn.replace(heads=4), 4, torch.float64)[0] > per64
    mlp = ModelConfig(width=64, depth=2, attention="none", mlp="relu")
    per_mlp, hidden = GramSampler.memory(mlp, 4, torch.float64)
    assert per_mlp < per64  # no attention heads
    assert hidden >= gram_module.HIDDEN_ELEMENTS * 8  # at least one batch of hidden numbers
    assert GramSampler.memory(mlp, 4, torch.float32)[1] * 2 == hidden
    threads = torch.get_num_threads()
    try:  # one batch of hidden numbers in flight per thread
        torch.set_num_threads(threads + 1)
        assert GramSampler.memory(mlp, 4, torch.float64)[1] * threads == hidden * (threads + 1)
    finally:
        torch.set_num_threads(threads)
