"""``sde.solve_batch`` and the batched factored Euler step: the CPU chunking over paths
(``sde.solvers.CHUNK_BYTES``) with many configurations, whose per-row constants each chunk
must take on its own rows (issue 66)."""

import pytest
import torch
from test_sde_batch import _configs  # configurations whose constants all differ

import sde
import sde.solvers as solvers
from sde.solvers import FactoredEulerStep
from shapedtx.covariance import equicorrelated

M, T, STEPS = 4, 0.4, 12


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_chunked_solve_batch_of_many_configurations_is_the_unchunked_one(monkeypatch, causal, rows):
    """Chunks of 1, 2 or 3 paths (boundaries inside and between configurations' blocks, a
    last chunk shorter than the others) give every configuration the numbers of one batch."""
    configs, samples = _configs(causal), [3, 5, 1, 4]
    V0 = equicorrelated(M, 0.3)
    kw = dict(T=T, steps=STEPS, seed=4, dtype=torch.float64)
    monkeypatch.setattr(solvers, "CHUNK_BYTES", None)
    whole = sde.solve_batch(configs, V0, samples, **kw)
    monkeypatch.setattr(solvers, "CHUNK_BYTES", rows * M * M * 8)
    chunked = sde.solve_batch(configs, V0, samples, **kw)
    assert [VT.shape[0] for VT, _ in chunked] == samples
    for (VT, ex), (VT0, ex0) in zip(chunked, whole, strict=True):
        torch.testing.assert_close(VT, VT0, rtol=1e-12, atol=1e-12)
        assert torch.equal(ex, ex0)


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_step_takes_each_rows_constants(monkeypatch, causal):
    """One step of a batch of configurations, chunked one path at a time: row i is the step of
    its own configuration alone (each configuration's constants differ, so a chunk given
    another row's constants, or the first row's, gets other numbers)."""
    configs, paths = _configs(causal), [2, 1, 3, 2]
    B = sum(paths)
    V = equicorrelated(M, 0.4).double().expand(B, M, M).contiguous()
    normals = torch.randn(B, 2, M, M, generator=torch.Generator().manual_seed(1)).double()
    monkeypatch.setattr(solvers, "CHUNK_BYTES", M * M * 8)
    step = FactoredEulerStep(configs, M, paths=paths)
    new = step.step(step.init(V), normals, 0.05)[1]
    start = 0
    for config, n in zip(configs, paths, strict=True):
        alone = FactoredEulerStep(config, M)
        rows = slice(start, start + n)
        expected = alone.step(alone.init(V[rows]), normals[rows], 0.05)[1]
        torch.testing.assert_close(new[rows], expected, rtol=1e-12, atol=1e-12)
        start += n
