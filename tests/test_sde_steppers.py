"""Single-step moments and weak order of every SDE stepper (docs/theory.md#sde, #causal-sde and
#checks).

One step of size dt from a fixed V with antithetic normals (xi, -xi): the mean increment over
dt must equal ``b(V)`` and the covariance over dt must equal ``Sigma(V)``, up to the O(dt) the
scheme guarantees (weak order 1) plus z Monte Carlo standard errors. The settings have strong
drift (gamma = 1, tau0 = 0.3; shaped ReLU with c_- = -4) so that a wrong Ito correction or a
wrong MLP drift step is far outside the tolerance. Then the weak order: ``E[V_T]`` converges to
a fine-dt reference at order 1 in dt (coupled Brownian increments).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torchsde

import sde
from sde.solvers import EulerMaruyamaStep, FactoredEulerStep, integrate
from sde.torchsde_solver import CovarianceSDE, pack, unpack
from shapedtx import ModelConfig, equicorrelated

from mc_stats import assert_mean_within_se

STRONG = ModelConfig(width=256, gamma=1.0, tau0=0.3)
MLP = ModelConfig(width=256, attention="none", mlp="shaped_relu", gamma=1.0, c_minus=-4.0)
CASES = {
    "attention_m2": (STRONG, 2),
    "attention_m4": (STRONG, 4),
    "shaped_relu_m4": (MLP, 4),
    "block_m3": (STRONG.replace(mlp="shaped_relu", c_minus=-4.0), 3),
    "causal_attention_m4": (STRONG.replace(causal=True), 4),
    "causal_heads_out_proj_m4": (STRONG.replace(causal=True, heads=2, out_proj=True), 4),
    "causal_block_m4": (STRONG.replace(causal=True, mlp="shaped_relu", c_minus=-4.0), 4),
}
N, DT, Z = 20_000, 1e-4, 4.5
MEAN_FLOOR = 2e-3  # O(dt) bias allowance, relative to max |b|
COV_FLOOR = 5e-3  # relative to max |Sigma|


def fixed_V(m: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(m)
    X = torch.randn(m, m + 1, generator=g, dtype=torch.float64)
    return X @ X.T / (m + 1) + 0.3 * torch.eye(m, dtype=torch.float64)


class FixedIncrement(torchsde.BrownianInterval):
    """A Brownian "motion" whose increment over any queried interval is the given ``W``
    (the tests query exactly one step [0, dt])."""

    def __init__(self, W: torch.Tensor) -> None:
        self.W = W

    def __call__(self, ta, tb=None, return_U=False, return_A=False):
        return self.W

    def __repr__(self) -> str:
        return "FixedIncrement()"

    @property
    def dtype(self) -> torch.dtype:
        return self.W.dtype

    @property
    def device(self) -> torch.device:
        return self.W.device

    @property
    def shape(self) -> torch.Size:
        return self.W.shape

    @property
    def levy_area_approximation(self) -> str:
        return "none"


def torchsde_step(config: ModelConfig, V: torch.Tensor, normals: torch.Tensor, dt: float):
    """One Euler step of ``torchsde.sdeint`` from every ``V`` with increments sqrt(dt) normals."""
    B, m = V.shape[0], V.shape[-1]
    sdeobj = CovarianceSDE(config, m, torch.full((B,), 1e8, dtype=V.dtype))
    bm = FixedIncrement(math.sqrt(dt) * normals.reshape(B, -1))
    ts = torch.tensor([0.0, dt], dtype=V.dtype)
    ys = torchsde.sdeint(sdeobj, pack(V), ts, bm=bm, method="euler", dt=dt)
    return unpack(ys[-1], m)


def one_step(name: str, config: ModelConfig, V: torch.Tensor, normals: torch.Tensor, dt: float):
    """V' from every V (N, m, m) under the stepper ``name``."""
    m = V.shape[-1]
    if name == "torchsde":
        return torchsde_step(config, V, normals, dt)
    stepper = {
        "euler": FactoredEulerStep(config, m),
        "euler_canonical": FactoredEulerStep(config, m, canonical=True),
        "em": EulerMaruyamaStep(config, m),
    }[name]
    return stepper.step(stepper.init(V), normals, dt)[1]


def step_moments(name: str, config: ModelConfig, m: int, seed: int = 0):
    """``(V, mean_est (N, m, m), inc (N, m, m))``: antithetic drift estimates
    ``((V'_+ + V'_-)/2 - V) / dt`` and increments ``(V'_+ - V) / sqrt(dt)``."""
    V = fixed_V(m)
    g = torch.Generator().manual_seed(seed)
    normals = torch.randn(N, 2, m, m, generator=g, dtype=torch.float64)
    Vs = V.expand(N, m, m).contiguous()
    plus = one_step(name, config, Vs, normals, DT)
    minus = one_step(name, config, Vs, -normals, DT)
    return V, ((plus + minus) / 2 - V) / DT, (plus - V) / math.sqrt(DT)


def mean_ok(mean_est: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        assert_mean_within_se(mean_est, b, z=Z, floor=MEAN_FLOOR * b.abs().max().item())
    except AssertionError:
        return False
    return True


def cov_ok(inc: torch.Tensor, Sigma: torch.Tensor) -> bool:
    m = inc.shape[-1]
    x = inc.flatten(1)
    x = x - x.mean(0)
    prod = x[:, :, None] * x[:, None, :]
    flat = Sigma.reshape(m * m, m * m)
    se = prod.std(0) / math.sqrt(x.shape[0])
    return bool(((prod.mean(0) - flat).abs() <= Z * se + COV_FLOOR * flat.abs().max()).all())


@pytest.mark.parametrize("stepper", ["euler", "euler_canonical", "em", "torchsde"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_step_mean_and_covariance(case, stepper):
    config, m = CASES[case]
    V, mean_est, inc = step_moments(stepper, config, m)
    b = sde.drift(config, V)
    assert mean_ok(mean_est, b), (case, stepper, mean_est.mean(0), b)
    assert cov_ok(inc, sde.diffusion(config, V)), (case, stepper)
    # power: the attention drift 10% too large or the MLP drift 10% too large is rejected
    const = sde.sde_constants(config, m)
    if const.a_att:
        att = sde.drift(config.replace(mlp="none"), V)
        assert not mean_ok(mean_est, b + 0.1 * att), (case, stepper)
    if const.k_mlp:
        mlp = sde.drift(config.replace(attention="none"), V)
        assert not mean_ok(mean_est, b + 0.1 * mlp), (case, stepper)
    if const.causal:  # the non-causal formulas are rejected
        assert not mean_ok(mean_est, sde.drift(config.replace(causal=False), V))
        assert not cov_ok(inc, sde.diffusion(config.replace(causal=False), V))


def coupled_noise(fine: torch.Tensor, k: int):
    """Noise source of a step k times coarser, from the fine normals (S, B, 2, m, m)."""

    def noise(step: int) -> torch.Tensor:
        return fine[step * k : (step + 1) * k].sum(0) / math.sqrt(k)

    return noise


@pytest.mark.parametrize("causal", [False, True])
def test_weak_order_one_against_fine_reference(causal):
    """E[V_T] of the factored Euler scheme at dt = T/4, T/8, T/16 against dt = T/64 driven by
    the same Brownian path: the error (corrected for the reference's own O(T/64) error) halves
    with dt (order 1) and is resolved (> 3 SE). A blow-up-free setting (tau0 = 3: the cubic
    attention drift cannot explode by T; V^aa is log-normal-like, so E[V_T] is dominated by
    its tails when paths explode)."""
    config = ModelConfig(gamma=0.8, tau0=3.0, mlp="shaped_relu", c_minus=-2.0, causal=causal)
    m, B, T, fine_steps = 4, 4000, 0.25, 64
    V0 = equicorrelated(m, 0.3).expand(B, m, m).contiguous()
    g = torch.Generator().manual_seed(1)
    fine = torch.randn(fine_steps, B, 2, m, m, generator=g, dtype=torch.float64)
    finals = {}
    for steps in (4, 8, 16, fine_steps):
        k = fine_steps // steps
        sol = integrate(
            FactoredEulerStep(config, m),
            V0,
            steps=steps,
            dt=T / steps,
            save_every=steps,
            noise=coupled_noise(fine, k),
            bound=1e8,
            progress=False,
        )
        assert not sol.exploded.any()
        finals[steps] = sol.V[:, -1]
    errors, ses = [], []
    for steps in (4, 8, 16):
        diff = (finals[steps] - finals[fine_steps]).flatten(1)
        mean, se = diff.mean(0), diff.std(0) / math.sqrt(B)
        errors.append(mean.norm().item())
        ses.append(se.norm().item())
    ref_error = [e / (1 - 4 / fine_steps * s) for e, s in zip(errors, (1, 2, 4), strict=True)]
    assert errors[-1] > 3 * ses[-1], (errors, ses)
    for coarse, finer in itertools.pairwise(ref_error):
        assert 0.35 < finer / coarse < 0.65, (errors, ses)


def test_causal_factored_euler_is_psd_near_collapse():
    """Near collapse (rho0 = 0.95) with a coarse step, the causal factored scheme stays PSD
    (the added Hadamard term (a_att - k_att) dt M o V is PSD) on every path, while plain EM
    leaves the PSD cone on many (flagged)."""
    cfg = ModelConfig(gamma=0.9, tau0=1.0, mlp="shaped_relu", causal=True)
    V0 = equicorrelated(4, 0.95)
    ds = sde.solve(cfg, V0, 300, T=0.5, dt=0.1, seed=1, progress=False)
    V = torch.from_numpy(ds["V"].values)
    evals = torch.linalg.eigvalsh(V)
    assert (evals[..., 0] >= -1e-12 * evals[..., -1]).all()
    em = sde.solve(cfg, V0, 300, T=0.5, dt=0.1, method="em", seed=1, progress=False)
    assert em.attrs["exploded_fraction"] > 0.2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA notion")
@pytest.mark.parametrize("mlp", ["none", "shaped_relu"])
def test_causal_factored_euler_step_has_no_host_sync(mlp):
    """One causal factored Euler step on CUDA under ``set_sync_debug_mode("error")``."""
    cfg = STRONG.replace(causal=True, mlp=mlp, c_minus=-4.0)
    m, device = 4, torch.device("cuda")
    V = fixed_V(m).to(device).expand(64, m, m).contiguous()
    stepper = FactoredEulerStep(cfg, m)
    L = stepper.init(V)
    normals = torch.randn(64, 2, m, m, dtype=torch.float64, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            L, new, _ = stepper.step(L, normals, 1e-3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(new).all()
