"""Many configurations in one batch: ``FactoredEulerStep(configs, m, paths=...)`` and
``sde.solve_batch`` against the single-configuration path (same noise, same numbers)."""

import math

import pytest
import torch

import sde
from sde.solve import DEFAULT_BOUND, SEED_MAX
from sde.solvers import FactoredEulerStep, gaussian_noise, integrate
from shapedtx import ModelConfig
from shapedtx.covariance import equicorrelated

M, T, STEPS = 4, 0.4, 20


def _configs(causal: bool) -> list[ModelConfig]:
    """Configurations with different constants (gamma, tau0, MLP or not, heads)."""
    base = ModelConfig(width=64, depth=16, causal=causal)
    return [
        base.replace(mlp="shaped_relu", gamma=0.3, tau0=1.0),
        base.replace(mlp="shaped_relu", gamma=0.8, tau0=0.5),
        base.replace(mlp="none", gamma=0.5, tau0=2.0),
        base.replace(mlp="shaped_relu", gamma=0.6, tau0=1.0, heads=2, out_proj=True),
    ]


def _final(stepper, V0, noise, B, bound=DEFAULT_BOUND):
    V0s = V0.expand(B, M, M).contiguous()
    sol = integrate(
        stepper, V0s, steps=STEPS, dt=T / STEPS, save_every=STEPS, noise=noise, bound=bound
    )
    return sol.V[:, -1], sol.exploded


def _rows(normals, rows):
    """The noise source of ``rows`` of the batch's normals ``(steps, B, 2, m, m)``."""
    return lambda k: normals[k, rows]


@pytest.mark.parametrize("causal", [False, True])
def test_batched_step_equals_each_configuration_alone_with_the_same_noise(causal):
    """Rows of each configuration, integrated in one batch with per-row constants, equal that
    configuration integrated alone (its scalar constants) on the same normals, also for a
    configuration without MLP in a batch with one (its rows keep their factor, as alone)."""
    configs, paths = _configs(causal), [3, 5, 1, 4]
    V0 = equicorrelated(M, 0.3).double()
    B = sum(paths)
    normals = torch.randn(STEPS, B, 2, M, M, generator=torch.Generator().manual_seed(5))
    normals = normals.double()
    VT, exploded = _final(FactoredEulerStep(configs, M, paths=paths), V0, normals.__getitem__, B)
    start = 0
    for config, n in zip(configs, paths, strict=True):
        rows = slice(start, start + n)
        alone, ex = _final(FactoredEulerStep(config, M), V0, _rows(normals, rows), n)
        torch.testing.assert_close(VT[rows], alone, rtol=1e-10, atol=1e-12)
        assert torch.equal(exploded[rows], ex)
        start += n
    assert not exploded.any()


@pytest.mark.parametrize("causal", [False, True])
def test_solve_batch_of_one_configuration_is_sde_solve(causal):
    """``sde.solve_batch`` of one configuration: the numbers of ``sde.solve`` (factored Euler,
    dt = T / steps, same dtype) at T, with the batch's seed (``seed + 1`` for a causal batch)."""
    config = _configs(causal)[1]
    V0 = equicorrelated(M, 0.2)
    ((VT, ex),) = sde.solve_batch([config], V0, 50, T=T, steps=STEPS, seed=3, dtype=torch.float64)
    ds = sde.solve(config, V0, 50, T=T, dt=T / STEPS, seed=3 + causal, progress=False)
    assert ds.attrs["steps"] == STEPS
    torch.testing.assert_close(VT, torch.from_numpy(ds["V"].values[:, -1]), rtol=1e-10, atol=1e-12)
    assert torch.equal(ex, torch.from_numpy(ds["exploded"].values))


def test_solve_batch_rows_of_mixed_configurations_are_their_own_solutions():
    """Causal and non-causal configurations with different numbers of paths: each
    configuration's result is its own single-configuration solution on its rows of the batch's
    noise (non-causal batch: seed, causal batch: seed + 1), returned in the input order."""
    configs = [*_configs(True)[:2], *_configs(False)[1:3], _configs(True)[3]]
    samples = [3, 6, 2, 5, 4]
    V0 = equicorrelated(M, 0.25)
    out = sde.solve_batch(configs, V0, samples, T=T, steps=STEPS, seed=7, dtype=torch.float64)
    assert [VT.shape[0] for VT, _ in out] == samples
    for offset, causal in enumerate((False, True)):
        batch = [i for i, c in enumerate(configs) if c.causal == causal]
        B = sum(samples[i] for i in batch)
        noise = gaussian_noise(
            (B, 2, M, M), torch.Generator().manual_seed(7 + offset), torch.float64, "cpu"
        )
        normals = torch.stack([noise(k) for k in range(STEPS)])
        start = 0
        for i in batch:
            rows = slice(start, start + samples[i])
            stepper = FactoredEulerStep(configs[i], M)
            alone, ex = _final(stepper, V0.double(), _rows(normals, rows), samples[i])
            torch.testing.assert_close(out[i][0], alone, rtol=1e-10, atol=1e-12)
            assert torch.equal(out[i][1], ex)
            start += samples[i]


def test_solve_batch_defaults_to_float32_and_flags_blow_ups():
    """float32 by default; a configuration that blows up is flagged on its rows only."""
    tame = ModelConfig(width=64, depth=16, mlp="shaped_relu", gamma=0.2, tau0=1.0)
    wild = tame.replace(gamma=1.0, tau0=0.25)
    out = sde.solve_batch([tame, wild], equicorrelated(M, 0.2), 64, T=1.0, steps=50, bound=20.0)
    (VT, ex), (_, wild_ex) = out
    assert VT.dtype == torch.float32 and not ex.any() and wild_ex.any()


def test_batched_stepper_and_solve_batch_validate():
    causal, plain = _configs(True)[0], _configs(False)[0]
    with pytest.raises(ValueError, match="all be causal"):
        FactoredEulerStep([causal, plain], M, paths=[1, 1])
    with pytest.raises(ValueError, match="paths"):
        FactoredEulerStep([causal, causal], M, paths=[1])
    with pytest.raises(ValueError, match="paths"):
        FactoredEulerStep([causal, causal], M)
    with pytest.raises(ValueError, match="paths"):
        FactoredEulerStep(causal, M, paths=[1])
    with pytest.raises(ValueError, match="paths"):
        FactoredEulerStep([causal, causal], M, paths=[1, 0])
    with pytest.raises(ValueError, match="samples"):
        sde.solve_batch([causal, plain], equicorrelated(M, 0.2), [4], T=T, steps=STEPS)
    with pytest.raises(ValueError, match="configs"):
        sde.solve_batch([], equicorrelated(M, 0.2), 4, T=T, steps=STEPS)
    with pytest.raises(ValueError, match="T"):
        sde.solve_batch([causal], equicorrelated(M, 0.2), 4, T=math.inf, steps=STEPS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA notion")
@pytest.mark.parametrize("causal", [False, True])
def test_batched_factored_euler_step_has_no_host_sync(causal):
    """Steps of a batch of configurations on CUDA under ``set_sync_debug_mode("error")`` (the
    per-row constants are made on the device by ``init``)."""
    configs, paths = _configs(causal), [16, 16, 16, 16]
    device = torch.device("cuda")
    V = equicorrelated(M, 0.3).double().to(device).expand(64, M, M).contiguous()
    stepper = FactoredEulerStep(configs, M, paths=paths)
    state = stepper.init(V)
    normals = torch.randn(64, 2, M, M, dtype=torch.float64, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            state, new, _ = stepper.step(state, normals, 1e-3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(new).all()


def test_solve_batch_bounds_and_defaults():
    """One path and one step are allowed, zero are not; the default seed is 0; the largest
    seed leaves room for the causal batch's ``seed + 1``."""
    config, V0 = _configs(False)[0], equicorrelated(M, 0.2)
    ((VT, ex),) = sde.solve_batch([config], V0, 1, T=T, steps=1)
    assert VT.shape == (1, M, M) and ex.shape == (1,)
    ((again, _),) = sde.solve_batch([config], V0, 1, T=T, steps=1, seed=0)
    assert torch.equal(VT, again)
    for bad in ({"steps": 0}, {"samples": 0}, {"seed": SEED_MAX}):
        kw = {"samples": 1, "T": T, "steps": 1} | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            sde.solve_batch([config], V0, **kw)
    sde.solve_batch([config], V0, 1, T=T, steps=1, seed=SEED_MAX - 1)
