"""Issue #18: the batched exact sampler (bit-reproducible per seed whatever the chunking),
the default method (``method=None`` -> the fastest exact-in-law method), the bulk normal
streams and the small-matrix product helper."""

import threading
import time

import numpy as np
import pytest
import torch

from shapedtx import ModelConfig
from shapedtx._matmul import small_matmul
from simulations import GroupedNormal, equicorrelated, resolve_method, simulate
from simulations._compiled_random import _compiled, random_fill
from simulations.samplers import ExactSampler

EXACT_CONFIGS = {
    # Bartlett keys (n_k >= m), MLP, pre-LN, 2 heads with W^O
    "pre-LN, 2 heads, W^O, MLP": ModelConfig(
        width=16, depth=4, heads=2, out_proj=True, mlp="shaped_relu", norm="pre"
    ),
    # n_k < m (plain Gaussian queries and keys), value and W^O fan-in < m (QR factors)
    "3 heads of size 1, causal softmax": ModelConfig(
        width=12,
        depth=4,
        heads=3,
        head_dim=1,
        key_dim=1,
        out_proj=True,
        causal=True,
        attention="softmax",
        mlp="relu",
    ),
    "one head, no W^O, causal shaped": ModelConfig(width=24, depth=4, causal=True),
}


@pytest.mark.parametrize("name", EXACT_CONFIGS)
def test_exact_bit_reproducible_across_chunk_sizes(name):
    """Same seed -> identical bits for chunk sizes 1, G + 1, 3 G and the default (cache-sized)
    chunk, and for the first G samples of a longer run."""
    cfg = EXACT_CONFIGS[name]
    G = ExactSampler.group_size
    samples = 3 * G + 5
    V0 = equicorrelated(5, 0.3)
    ref = simulate(cfg, V0, samples, method="exact", seed=11)["V"].values
    for chunk_size in (1, G + 1, 3 * G):
        again = simulate(cfg, V0, samples, method="exact", seed=11, chunk_size=chunk_size)
        np.testing.assert_array_equal(again["V"].values, ref)
    prefix = simulate(cfg, V0, G, method="exact", seed=11)["V"].values
    np.testing.assert_array_equal(prefix, ref[:G])
    assert not np.allclose(
        simulate(cfg, V0, G, method="exact", seed=12)["V"].values[:, 1:], ref[:G, 1:]
    )


def test_default_chunk_is_cache_sized():
    """Width 1024, m = 8: the default chunk holds about ExactSampler.chunk_bytes per tensor,
    and the results equal those of one big chunk."""
    cfg = ModelConfig(width=1024, depth=2)
    V0 = equicorrelated(8, 0.2)
    a = simulate(cfg, V0, 300, method="exact", seed=1)["V"].values
    b = simulate(cfg, V0, 300, method="exact", seed=1, chunk_size=300)["V"].values
    np.testing.assert_array_equal(a, b)


def test_default_method_is_the_fastest_exact_one():
    V0 = equicorrelated(3, 0.2)
    gram_ok = ModelConfig(width=16, depth=2)
    not_gram = ModelConfig(width=16, depth=2, norm="pre")
    assert resolve_method(gram_ok) == resolve_method(gram_ok, "auto") == "gram"
    assert resolve_method(not_gram) == "exact"
    assert resolve_method(gram_ok, "weights") == "weights"
    ds = simulate(gram_ok, V0, 4)
    assert (ds.attrs["method"], ds.attrs["method_requested"]) == ("gram", "auto")
    ds = simulate(not_gram, V0, 4, method="auto")
    assert (ds.attrs["method"], ds.attrs["method_requested"]) == ("exact", "auto")
    ds = simulate(gram_ok, V0, 4, method="exact")
    assert (ds.attrs["method"], ds.attrs["method_requested"]) == ("exact", "exact")
    # the same numbers as asking for the method by name
    np.testing.assert_array_equal(
        simulate(gram_ok, V0, 4, seed=3)["V"].values,
        simulate(gram_ok, V0, 4, seed=3, method="gram")["V"].values,
    )


def test_fill_normal_streams_are_per_group():
    """Each group's rows depend only on (seed, group), whatever the groups beside them."""
    both = GroupedNormal(5, [0, 1], [3, 2], torch.device("cpu"))
    buf = both.fill_normal(torch.empty(5, 7, dtype=torch.float64))
    alone = GroupedNormal(5, [1], [2], torch.device("cpu"))
    torch.testing.assert_close(alone.fill_normal(torch.empty(2, 7, dtype=torch.float64)), buf[3:])
    other = GroupedNormal(6, [1], [2], torch.device("cpu"))
    assert not torch.equal(other.fill_normal(torch.empty(2, 7, dtype=torch.float64)), buf[3:])
    f32 = both.fill_normal(torch.empty(5, 4000, dtype=torch.float32))
    assert abs(float(f32.mean())) < 0.01 and abs(float(f32.std()) - 1) < 0.01
    with pytest.raises(ValueError, match="contiguous"):
        both.fill_normal(torch.empty(7, 5, dtype=torch.float64).T)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_fill_gives_numpys_numbers(dtype):
    """The compiled fill (numba) draws exactly numpy's ``standard_normal`` numbers (float64;
    float32 goes to numpy), array after array, then numpy's ``chisquare`` numbers (shapes
    below, at and above 1: numpy's three gamma samplers), and leaves the generator in
    numpy's state."""
    arrays = [np.empty((3, 5), dtype), np.empty(0, dtype), np.empty((2, 2, 2), dtype)]
    half = np.array([0.5, 1.0, 1.05, 1.2, 1.5, 2.0, 7.0, 511.5, 1e6])  # b = shape - 1/3 < 1
    chi = np.empty((2000, half.size))  # enough to reach the squeeze test's every branch
    gen = np.random.Generator(np.random.SFC64(11))
    random_fill(gen, arrays, half, chi)
    ref = np.random.Generator(np.random.SFC64(11))
    for a in arrays:
        np.testing.assert_array_equal(a, ref.standard_normal(a.shape, dtype=dtype))
    np.testing.assert_array_equal(chi, ref.chisquare(2 * half, size=chi.shape))
    np.testing.assert_array_equal(gen.standard_normal(8), ref.standard_normal(8))
    random_fill(gen, arrays)  # normals only
    for a in arrays:
        np.testing.assert_array_equal(a, ref.standard_normal(a.shape, dtype=dtype))
    with pytest.raises(ValueError, match="C-contiguous"):
        random_fill(gen, [np.empty((4, 3), dtype).T])
    with pytest.raises(ValueError, match="both half and chi"):
        random_fill(gen, arrays, half)
    with pytest.raises(ValueError, match="chi must be"):
        random_fill(gen, arrays, half, np.empty((3, 2)))
    assert _compiled().targetoptions["nogil"]  # the parallel fills need the GIL released


def test_compiled_fill_without_a_writable_cache(monkeypatch):
    """Where numba finds no writable cache folder, the fill is compiled in memory."""
    import numba

    real_njit = numba.njit

    def njit(**options):
        if options.get("cache"):
            raise RuntimeError("cannot cache function '_fill': no locator available")
        return real_njit(**options)

    monkeypatch.setattr(numba, "njit", njit)
    a = np.empty(6)
    fill = _compiled.__wrapped__()
    assert fill.targetoptions["nogil"]
    chi = np.empty((1, 2))
    fill(np.random.Generator(np.random.SFC64(2)), (a,), np.array([0.5, 4.0]), chi)
    ref = np.random.Generator(np.random.SFC64(2))
    np.testing.assert_array_equal(a, ref.standard_normal(6))
    np.testing.assert_array_equal(chi, ref.chisquare([1.0, 8.0], size=(1, 2)))


def test_bulk_draws_do_not_depend_on_the_number_of_threads():
    """start() with helper threads (a draw above PARALLEL_NUMBERS) gives the numbers of one
    thread, normals then chi-square per group, and the helpers work before result() is
    asked for (the exact sampler draws the next block while it computes this one)."""
    from simulations.rng import PARALLEL_NUMBERS

    sizes = [64] * 8
    cols = PARALLEL_NUMBERS // 64 + 1
    dof = torch.tensor([3.0, 40.0])
    draws = {}
    for workers in (1, 2, 3):
        rng = GroupedNormal(9, range(8), sizes, torch.device("cpu"), workers)
        pending = rng.start([torch.empty(512, cols, dtype=torch.float64)], dof)
        if workers > 1:  # the helpers take groups without being waited for
            for _ in range(2000):
                if pending._next > 0:
                    break
                time.sleep(0.001)
            assert pending._next > 0
        (normals,), chi = pending.result()
        after = rng.fill_normal(torch.empty(512, 3, dtype=torch.float64))
        draws[workers] = (normals, chi, after)
    for workers in (2, 3):
        for a, b in zip(draws[1], draws[workers], strict=True):
            assert torch.equal(a, b)
    normals, chi, _ = draws[1]
    # group 2 alone: its normals, then its chi-square variables, from its own stream
    alone = GroupedNormal(9, [2], [64], torch.device("cpu"))
    assert torch.equal(
        alone.fill_normal(torch.empty(64, cols, dtype=torch.float64)), normals[128:192]
    )
    assert torch.equal(alone.chi2(dof, torch.float64), chi[128:192])


def test_interrupted_parallel_work_stops_the_helpers():
    """An exception in the calling thread (e.g. KeyboardInterrupt) stops the helpers from
    taking further tasks; the exception reaches the caller."""
    from simulations.rng import run_parallel

    done = []

    def work(i):
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt
        time.sleep(0.01)
        done.append(i)

    with pytest.raises(KeyboardInterrupt):
        run_parallel(work, 40, 2)
    assert len(done) < 5  # the helper stopped after the task(s) it had taken


def test_interrupt_is_not_replaced_by_a_helpers_error():
    """Ctrl-C in the calling thread can break what a helper is doing (e.g. a module import
    interrupted half way); the caller still gets KeyboardInterrupt, after the helpers are
    done, not the helper's consequent error. Without an interrupt a helper's error reaches
    the caller."""
    from simulations.rng import run_parallel

    finished = []

    def work(i):  # many tasks: the helper has time to take one, even on a loaded machine
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.2)
            raise KeyboardInterrupt
        time.sleep(0.05)
        finished.append(i)
        raise AttributeError("module 'numba' has no attribute 'core'")

    with pytest.raises(KeyboardInterrupt):
        run_parallel(work, 20, 2)
    assert len(finished) == 1  # the helper had failed on its task

    def helper_fails(i):
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("helper")
        time.sleep(0.05)

    with pytest.raises(ValueError, match="helper"):
        run_parallel(helper_fails, 20, 2)


def test_interrupt_stops_the_parallel_samplers_within_a_block(monkeypatch):
    """With 2 threads the gram sampler runs one sampler per thread on its own groups; an
    interrupt in the calling thread's part stops the other part before its next block."""
    from simulations import GramSampler

    steps = {True: 0, False: 0}  # by "in the calling thread"
    original = GramSampler.step

    def step(self, state):
        main = threading.current_thread() is threading.main_thread()
        steps[main] += 1
        if main and steps[main] == 3:
            raise KeyboardInterrupt
        if not main:
            time.sleep(0.002)  # the other part is not far ahead when the interrupt comes
        return original(self, state)

    monkeypatch.setattr(GramSampler, "step", step)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(KeyboardInterrupt):
            simulate(ModelConfig(width=64, depth=50), equicorrelated(4, 0.3), 1024, method="gram")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    taken = sum(steps.values())
    time.sleep(0.05)
    # stopped (no step after simulate raised), long before 2 parts x 50 blocks
    assert sum(steps.values()) == taken and steps[True] == 3 and taken < 20


@pytest.mark.parametrize("method", ["exact", "gram"])
def test_simulate_same_numbers_with_fill_threads(method, monkeypatch):
    """torch's thread count (the fill threads) changes no bit of the result, and simulate
    restores it afterwards, also when it fails."""
    cfg = ModelConfig(width=300, depth=3, causal=True)
    V0 = equicorrelated(4, 0.3)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            # several generator groups: gram runs one sampler per thread (parallel_parts)
            runs.append(simulate(cfg, V0, 600, seed=4, method=method)["V"].values)
            assert torch.get_num_threads() == threads
        import simulations.driver

        def fail(sampler, *args):
            assert torch.get_num_threads() == 1  # torch's ops run on one thread meanwhile
            raise RuntimeError("in the block loop")

        monkeypatch.setattr(simulations.driver, "_simulate_chunk", fail)
        with pytest.raises(RuntimeError, match="block loop"):
            simulate(cfg, V0, 8, method=method)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(runs[0], runs[1])


def test_concurrent_simulate_calls_restore_the_thread_count():
    """simulate calls running at once in threads (as in a threaded Dask worker) give the
    numbers of a lone call, and torch's thread count is restored after the last returns."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = ModelConfig(width=300, depth=3, causal=True)
    V0 = equicorrelated(4, 0.3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        alone = simulate(cfg, V0, 200, seed=5, method="exact")["V"].values
        with ThreadPoolExecutor(3) as pool:
            runs = list(
                pool.map(lambda _: simulate(cfg, V0, 200, seed=5, method="exact"), range(3))
            )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    for ds in runs:
        np.testing.assert_array_equal(ds["V"].values, alone)


def test_small_matmul_equals_matmul():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 2, 4, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(6, 2, 4, 9, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(small_matmul(a, b), a @ b, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(small_matmul(a[0, 0], b), a[0, 0] @ b, rtol=1e-13, atol=1e-13)
    a.requires_grad_(True)
    out = small_matmul(a, b)  # autograd path: torch
    out.sum().backward()
    assert a.grad is not None


def test_gpu_script_runs_on_cpu(tmp_path):
    """benchmarks/gpu.py --device cpu --tiny: every stage runs, the agreement tests pass and
    the JSON report lists times and peak memory."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(root / "benchmarks" / "gpu.py"), "--device", "cpu", "--tiny"]
    done = subprocess.run([*cmd, "--json", str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    stages = [row["stage"] for row in result["rows"]]
    assert stages[:3] == ["simulate[exact]", "simulate[gram]", "simulate[auto]"]
    assert {"sde.solve", "compare"} <= set(stages) and stages[-1].startswith("train")
    assert all(row["seconds"] > 0 and row["peak_mb"] > 0 for row in result["rows"])
    assert result["failures"] == []


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(width=24, depth=5, causal=True),
        ModelConfig(width=24, depth=5, attention="softmax", mlp="relu", residual="unit"),
        ModelConfig(width=24, depth=5, key_dim=2, mlp="shaped_relu"),
    ],
)
def test_exact_direct_attention_equals_block_function(cfg, monkeypatch):
    """The exact sampler's direct attention sub-block (one head, no W^O, no LN) gives the
    numbers of :func:`shapedtx.block` with the same draws, up to rounding."""
    from simulations import samplers

    V0 = equicorrelated(4, 0.3)
    fast = simulate(cfg, V0, 70, method="exact", seed=3)["V"].values
    monkeypatch.setattr(samplers, "FAST_ATTENTION", False)
    slow = simulate(cfg, V0, 70, method="exact", seed=3)["V"].values
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12)


def test_nonfinite_samples_count_is_exact():
    """The per-sample sum is only a first pass: an overflowing sum of finite entries is not
    counted, NaN and inf entries are."""
    from simulations.driver import _nonfinite_samples

    V = torch.ones(5, 3, 2, 2, dtype=torch.float64)
    assert _nonfinite_samples(V) == 0
    V[1] = 1e308  # finite entries whose sum overflows
    assert _nonfinite_samples(V) == 0
    V[2, 1, 0, 1] = float("nan")
    V[4, 2, 1, 1] = -float("inf")
    assert _nonfinite_samples(V) == 2


def test_in_place_variants_equal_the_functional_ones():
    """``overwrite=True`` (the gram sampler's block loop) gives the same attention matrices and
    activations as the functional forms; ``small_matmul`` with ``out`` and with a large
    transposed operand (numpy's transposed BLAS path) equals torch's product."""
    from shapedtx import shaped_attention_matrix, shaped_relu
    from shapedtx._matmul import TRANSPOSED_DIRECT, transpose_into
    from shapedtx.blocks import attention_from_logits

    gen = torch.Generator().manual_seed(0)
    for m in (5, 20):  # elementwise softmax, and torch.softmax above SMALL_SOFTMAX keys
        Y = torch.randn(6, 2, m, m, generator=gen, dtype=torch.float64)
        for attention in ("shaped", "softmax"):
            for causal in (False, True):
                cfg = ModelConfig(width=32, attention=attention, causal=causal)
                expected = attention_from_logits(Y, cfg)
                assert torch.equal(attention_from_logits(Y.clone(), cfg, overwrite=True), expected)
    # autograd needs Y: overwrite is ignored, Y is unchanged and the gradient flows
    Y = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    before = Y.detach().clone()
    shaped_attention_matrix(Y, 2.0, causal=True, overwrite=True).square().sum().backward()
    assert torch.equal(Y.detach(), before) and Y.grad is not None
    x = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    for slopes in ((1.2, 0.7), (1.0, 0.0), (0.0, 0.5)):
        assert torch.equal(shaped_relu(x.clone(), *slopes, overwrite=True), shaped_relu(x, *slopes))
    leaf = x.clone().requires_grad_()  # as for the attention matrices: overwrite is ignored
    shaped_relu(leaf, 1.2, 0.7, overwrite=True).sum().backward()
    assert torch.equal(leaf.detach(), x)
    expected = torch.full_like(x, 0.7).masked_fill_(x > 0, 1.2)  # the slopes, up to rounding
    torch.testing.assert_close(leaf.grad, expected, rtol=0, atol=1e-15)
    wide = torch.randn(3, 4, TRANSPOSED_DIRECT // 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(small_matmul(wide, wide.mT), wide @ wide.mT, rtol=1e-12, atol=1e-12)
    a, b = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64)
    out = torch.empty(3, 5, 5, dtype=torch.float64)
    assert small_matmul(a, b.mT, out=out) is out
    torch.testing.assert_close(out, a @ b.mT, rtol=1e-12, atol=1e-12)
    # into strided views (the gram sampler's transposed and side-by-side products)
    small_matmul(a, b, out=out.mT)
    torch.testing.assert_close(out, (a @ b).mT, rtol=1e-12, atol=1e-12)
    side = torch.zeros(3, 5, 12, dtype=torch.float64)
    small_matmul(a, b, out=side[..., 5:10])
    torch.testing.assert_close(side[..., 5:10], a @ b, rtol=1e-12, atol=1e-12)
    assert not side[..., :5].any() and not side[..., 10:].any()
    for dtype in (torch.float64, torch.bfloat16):  # numpy's copy, and torch's
        x = side.to(dtype)
        assert torch.equal(transpose_into(x, torch.empty(3, 12, 5, dtype=dtype)), x.mT)


def test_workspace_reuses_and_alternates_tensors():
    from simulations.gram import Workspace

    work, like = Workspace(), torch.zeros(1, dtype=torch.float64)
    a = work.get("a", (3, 2), like)
    assert torch.equal(a, torch.zeros(3, 2, dtype=torch.float64))
    assert work.get("a", (3, 2), like) is a
    assert work.get("a", (4, 2), like).shape == (4, 2)  # another shape: a new tensor
    first = work.other("L", a)
    second = work.other("L", first)
    assert first.data_ptr() != second.data_ptr() and work.other("L", second) is first
    small = work.flat("h", (2, 3), like)
    assert small.is_contiguous() and work.flat("h", (5,), like).data_ptr() == small.data_ptr()
    assert Workspace(keep=False).get("a", (3, 2), like) is not Workspace(keep=False).get(
        "a", (3, 2), like
    )


def _run_benchmark(script: str, *args: str) -> str:
    """Run ``benchmarks/<script>`` with arguments in a fresh interpreter; its stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, str(root / "benchmarks" / script), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kernel_benchmark_runs_and_checks_its_kernels():
    """benchmarks/bench_kernels.py: every row first checks the compiled kernel against what
    it replaces (same numbers), then times it; one round runs in seconds."""
    stdout = _run_benchmark("bench_kernels.py", "--rounds", "1")
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and "ns /" in line]
    # normals, chi-square, Cholesky at five sizes, centring forward and backward at two sizes
    assert len(rows) == 3 + 2 + 2 * 5 + 2 * 2 * 2
    assert sum("(not used)" in row for row in rows) == 2  # m = 64 > MAX_SIZE


def test_centring_benchmark_runs_every_form():
    """benchmarks/bench_centring.py: one round of one call and one step of every variant
    (softmax, the compiled and torch forms of the fused centring, unfused) runs."""
    stdout = _run_benchmark("bench_centring.py", "--rounds", "1", "--calls", "1", "--steps", "1")
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    for form in ("fused (compiled)", "fused (torch form)", "unfused"):
        assert sum(form in row for row in rows) == 2  # one attention call, one training step
