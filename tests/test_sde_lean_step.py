"""The lean factored Euler step (``sde.solvers._factored_euler_step``, issue 39) against the
first implementation (``sde.solvers._ReferenceFactoredEulerStep``): the same formula with
fewer m x m products, O(m^2) causal auxiliaries, fused passes and chunks of paths.

- pathwise: for the same normals both give the same V' up to rounding, in every branch
  (attention, MLP, block, causal, several heads, canonical factor, a bare-factor state);
- the O(m^2) pieces equal the definitions they replace;
- in law at m = 64: ``sde.integrate`` with the new step and its noise source (numpy on the
  CPU) against the reference step with torch normals, two-sample KS tests, causal and not.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from sde.coefficients import arccos_kernel, causal_attention_auxiliaries
from sde.noise import attention_noise_factor
from sde.solvers import (
    FactoredEulerStep,
    _arccos_blend,
    _causal_auxiliaries_cumsum,
    _causal_row_centring,
    _chunked_step,
    _ReferenceFactoredEulerStep,
    gaussian_noise,
    integrate,
)
from shapedtx import ModelConfig, equicorrelated

BASE = ModelConfig(width=256, gamma=0.6, tau0=0.7)
CASES = {
    "attention": BASE,
    "block": BASE.replace(mlp="shaped_relu", c_minus=-2.0),
    "mlp_only": BASE.replace(attention="none", mlp="shaped_relu"),
    "heads_out_proj": BASE.replace(heads=2, out_proj=True, mlp="shaped_relu"),
    "causal_attention": BASE.replace(causal=True),
    "causal_block": BASE.replace(causal=True, mlp="shaped_relu", c_minus=-2.0),
}


def _random_V(B: int, m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, m, m + 2, generator=g, dtype=torch.float64)
    return X @ X.mT / (m + 2) + 0.3


@pytest.mark.parametrize("canonical", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_lean_step_equals_the_reference_step_pathwise(case, canonical):
    """Six steps from the same state with the same normals: V' agrees to 1e-12 relative."""
    config, m = CASES[case], 7
    new, ref = (
        FactoredEulerStep(config, m, canonical=canonical),
        _ReferenceFactoredEulerStep(config, m, canonical=canonical),
    )
    V = _random_V(5, m, 0)
    s_new, s_ref = new.init(V), ref.init(V)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        normals = torch.randn(5, 2, m, m, generator=g, dtype=torch.float64)
        kept = normals.clone()
        s_new, V_new, _ = new.step(s_new, normals, 0.02)
        s_ref, V_ref, _ = ref.step(s_ref, normals, 0.02)
        assert torch.equal(normals, kept)  # the normals are not modified in place
    torch.testing.assert_close(V_new, V_ref, rtol=1e-12, atol=1e-12 * V_ref.abs().max().item())
    # a bare factor as the state (the protocol's old form) gives the same step
    L = torch.linalg.cholesky(V)
    normals = torch.randn(5, 2, m, m, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        new.step(L, normals, 0.02)[1], ref.step(L, normals, 0.02)[1], rtol=1e-12, atol=1e-12
    )


def test_chunks_give_the_same_step(monkeypatch):
    """The CPU chunking over paths (sde.solvers.CHUNK_BYTES) changes nothing but the speed."""
    import sde.solvers as solvers

    config, m = CASES["causal_block"], 6
    step = FactoredEulerStep(config, m)
    V = _random_V(9, m, 2)
    normals = torch.randn(9, 2, m, m, generator=torch.Generator().manual_seed(3)).double()
    whole = step.step(step.init(V), normals, 0.02)[1]
    monkeypatch.setattr(solvers, "CHUNK_BYTES", 2 * m * m * 8)  # chunks of 2 paths
    torch.testing.assert_close(step.step(step.init(V), normals, 0.02)[1], whole)
    assert _chunked_step is solvers._chunked_step


def test_linear_time_pieces_equal_their_definitions():
    """Cumulative-sum causal auxiliaries M, U and row-wise causal centring R, the fused
    arc-cosine blend: equal to the O(m^3)-O(m^4) definitions, also near collapse."""
    V = _random_V(3, 9, 4)
    collapsed = equicorrelated(9, 0.999).double().expand(2, 9, 9) * 3.0
    for W in (V, collapsed):
        M, U = causal_attention_auxiliaries(W)
        M2, U2 = _causal_auxiliaries_cumsum(W)
        scale = W.abs().max().item() ** 2
        torch.testing.assert_close(M2, M, rtol=0, atol=1e-13 * scale)
        torch.testing.assert_close(U2, U, rtol=0, atol=1e-13 * scale)
        torch.testing.assert_close(
            _arccos_blend(W, 0.3), W + 0.3 * (arccos_kernel(W) - W), rtol=1e-14, atol=1e-14
        )
    Y = torch.randn(4, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(_causal_row_centring(Y), attention_noise_factor(Y, causal=True))


def _final(stepper, V0, paths, seed, noise_kind):
    m = V0.shape[-1]
    V0s = V0.expand(paths, m, m).contiguous()
    gen = torch.Generator().manual_seed(seed)
    if noise_kind == "torch":

        def noise(step):
            return torch.randn((paths, 2, m, m), generator=gen, dtype=torch.float64)
    else:
        noise = gaussian_noise((paths, 2, m, m), gen, torch.float64, torch.device("cpu"))
    sol = integrate(
        stepper, V0s, steps=3, dt=0.05, save_every=3, noise=noise, bound=1e8, progress=False
    )
    assert not sol.exploded.any()
    return sol.V[:, -1]


def _statistics(V: torch.Tensor) -> dict[str, np.ndarray]:
    """rho of the first and of the last two tokens, and log V^aa of the first and last."""
    d = torch.diagonal(V, dim1=-2, dim2=-1)
    return {
        "rho_01": (V[:, 0, 1] / (d[:, 0] * d[:, 1]).sqrt()).numpy(),
        "rho_last": (V[:, -1, -2] / (d[:, -1] * d[:, -2]).sqrt()).numpy(),
        "log_V00": d[:, 0].log().numpy(),
        "log_Vlast": d[:, -1].log().numpy(),
    }


@pytest.mark.parametrize("causal", [False, True])
def test_lean_step_has_the_law_of_the_reference_step_at_m64(causal):
    """m = 64, 3 steps of 0.05 (strong drift and noise: gamma 0.6, tau0 0.7, shaped ReLU),
    the reference with 160 paths (64 causal: its O(m^4) auxiliaries), the new step with 4x as
    many: four two-sample KS tests (independent streams: the new step with its numpy noise,
    the reference with torch.randn), each p > 0.01 (fixed seeds: deterministic). The same
    test rejects the reference at gamma 0.75 (p < 1e-4 on some statistic), so it resolves a
    change of law of that size."""
    config = CASES["block"].replace(causal=causal)
    m, paths = 64, 160
    ref_paths = 64 if causal else paths  # the causal reference costs O(m^4) per path-step
    V0 = equicorrelated(m, 0.2).double()
    new = _statistics(_final(FactoredEulerStep(config, m), V0, 4 * ref_paths, 1, "numpy"))
    ref = _statistics(_final(_ReferenceFactoredEulerStep(config, m), V0, ref_paths, 2, "torch"))
    pvalues = {k: stats.ks_2samp(new[k], ref[k]).pvalue for k in new}
    assert min(pvalues.values()) > 0.01, pvalues
    if not causal:  # power (the causal reference costs O(m^4): checked once, non-causal)
        other = config.replace(gamma=0.75)
        wrong = _statistics(_final(_ReferenceFactoredEulerStep(other, m), V0, paths, 2, "torch"))
        power = min(stats.ks_2samp(new[k], wrong[k]).pvalue for k in new)
        assert power < 1e-4
