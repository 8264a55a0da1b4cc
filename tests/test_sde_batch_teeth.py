"""``sde.solve_batch`` and the batched factored Euler step: the CPU chunking over paths
(``sde.solvers.CHUNK_BYTES``) with many configurations, whose per-row constants each chunk
must take on its own rows (issue 66)."""

import pytest
import torch
from test_sde_batch import _configs  # configurations whose constants all differ

import sde
import sde.solvers as solvers
from sde.solvers import FactoredEulerStep
from shapedtx import ModelConfig
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


def _recording(monkeypatch):
    """Record the number of rows of every call of the factored Euler step."""
    calls: list[int] = []
    inner = solvers._factored_euler_step

    def step(state, normals, *args, **kw):
        calls.append(normals.shape[0])
        return inner(state, normals, *args, **kw)

    monkeypatch.setattr(solvers, "_factored_euler_step", step)
    return calls


@pytest.mark.parametrize(
    "chunk, dtype, sizes",
    [
        (None, torch.float64, [7]),
        (3 * M * M * 8, torch.float64, [3, 3, 1]),
        (3 * M * M * 8 + 7, torch.float64, [3, 3, 1]),  # rows = bytes // (m m itemsize)
        (3 * M * M * 8, torch.float32, [6, 1]),  # the itemsize of the normals
        (1, torch.float64, [1] * 7),  # at least one row
        (7 * M * M * 8, torch.float64, [7]),  # a chunk of the whole batch: one call
        (100 * M * M * 8, torch.float64, [7]),
    ],
)
def test_chunks_are_rows_of_chunk_bytes_and_return_the_unchunked_state(
    monkeypatch, chunk, dtype, sizes
):
    """The CPU chunks hold ``CHUNK_BYTES // (m m itemsize)`` rows (at least one, the last one
    shorter); the whole batch at once when unset or when a chunk holds it; the returned state
    (factor and V') is the unchunked one, from a ``(factor, V)`` pair or a bare factor."""
    configs, paths = _configs(False), [2, 1, 3, 1]
    V = equicorrelated(M, 0.4).to(dtype).expand(7, M, M).contiguous()
    normals = torch.randn(7, 2, M, M, generator=torch.Generator().manual_seed(2)).to(dtype)
    step = FactoredEulerStep(configs, M, paths=paths)
    state = step.init(V)
    monkeypatch.setattr(solvers, "CHUNK_BYTES", None)
    (F0, V0), new0, _ = step.step(state, normals, 0.05)
    (G0, _), bare0, _ = step.step(state[0], normals, 0.05)
    calls = _recording(monkeypatch)
    monkeypatch.setattr(solvers, "CHUNK_BYTES", chunk)
    (F, V1), new, extra = step.step(state, normals, 0.05)
    assert calls == sizes and extra is None
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {}
    torch.testing.assert_close(F, F0, **tol)
    torch.testing.assert_close(V1, V0, **tol)
    torch.testing.assert_close(new, new0, **tol)
    (G, _), bare, _ = step.step(state[0], normals, 0.05)  # a bare factor
    assert calls == sizes + sizes
    torch.testing.assert_close(G, G0, **tol)
    torch.testing.assert_close(bare, bare0, **tol)


def test_solve_batch_is_quiet_and_refuses_bad_arguments(capfd):
    """No progress bar by default; every bad argument is refused naming it."""
    config, V0 = _configs(False)[0], equicorrelated(M, 0.2)
    sde.solve_batch([config], V0, 2, T=T, steps=3)
    assert capfd.readouterr().err == ""
    bad_V0 = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    for kw, name in [
        ({"samples": [2, 0]}, "samples"),
        ({"samples": 2.5}, "samples"),
        ({"steps": 1.5}, "steps"),
        ({"T": 0.0}, "T"),
        ({"seed": -1}, "seed"),
        ({"dtype": torch.float16}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"V0": bad_V0}, "V0"),
    ]:
        args = {"samples": [2, 2], "T": T, "steps": 3, "V0": V0} | kw
        with pytest.raises(ValueError, match=name):
            sde.solve_batch([config, config], args.pop("V0"), args.pop("samples"), **args)


def test_solve_batch_takes_the_bound_and_the_device():
    """A tighter ``bound`` flags the paths that the default leaves; ``device="cpu"`` and
    ``dtype`` give the results there, the same numbers as the default device."""
    wild = ModelConfig(width=64, depth=16, mlp="shaped_relu", gamma=1.0, tau0=0.25)
    V0 = equicorrelated(M, 0.2)
    ((_, loose),) = sde.solve_batch([wild], V0, 32, T=1.0, steps=50, seed=1)
    ((_, tight),) = sde.solve_batch([wild], V0, 32, T=1.0, steps=50, seed=1, bound=5.0)
    assert int(tight.sum()) > int(loose.sum())
    ((VT, _),) = sde.solve_batch([wild], V0, 4, T=T, steps=3, dtype=torch.float64)
    ((on_cpu, _),) = sde.solve_batch([wild], V0, 4, T=T, steps=3, dtype=torch.float64, device="cpu")
    assert on_cpu.device.type == "cpu" and on_cpu.dtype == torch.float64
    assert torch.equal(VT, on_cpu)


def _fake_step(calls):
    """A stand-in for the factored Euler step: records each call's rows, returns its own
    tensors (``normals[:, 0]`` as factor and V')."""

    def step(state, normals, *args, **kw):
        calls.append(normals.shape[0])
        out = normals[:, 0] + 0
        return (out, out), out

    return step


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_one_batch_off_the_cpu_or_when_a_chunk_holds_it_is_the_step_itself(monkeypatch, device):
    """Off the CPU (here the meta device) the batch is never chunked, whatever
    ``CHUNK_BYTES``; on the CPU a chunk that holds the whole batch is the one-batch call: the
    step's own tensors come back (no chunk loop, no copy)."""
    calls: list[int] = []
    monkeypatch.setattr(solvers, "_factored_euler_step", _fake_step(calls))
    B = 5
    normals = torch.zeros(B, 2, M, M, dtype=torch.float64, device=device)
    state = torch.zeros(B, M, M, dtype=torch.float64, device=device)
    const = solvers._Constants(1.0, 1.0, 1.0, 1.0)
    chunk = (2 if device == "meta" else B) * M * M * 8  # meta: 2 rows a chunk on the CPU
    monkeypatch.setattr(solvers, "CHUNK_BYTES", chunk)
    (factor, V), new = solvers._chunked_step(state, normals, 0.1, const, False, {})
    assert calls == [B]
    assert factor is V is new  # the stand-in's own tensor, not a chunked copy
