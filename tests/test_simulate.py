"""simulations.simulate: Dataset contract, reproducibility, chunking, every configuration,
bad input, non-finite reporting and rank collapse (docs/theory.md#layers, #rank-collapse and
#samplers)."""

import contextlib
import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapedtx import ModelConfig, config_of
from simulations import (
    SAMPLERS,
    GroupedNormal,
    equicorrelated,
    group_seed,
    resolve_method,
    simulate,
    with_metrics,
    with_rho,
)

from strategies import covariances, model_configs

SAMPLER_CLASSES = {name: c.sampler_class for name, c in SAMPLERS.items() if name != "auto"}
"""The sampler algorithm of every named choice but "auto" (which picks one of them)."""

SMALL = ModelConfig(width=24, depth=3, mlp="shaped_relu", norm="pre", heads=2, out_proj=True)


def test_dataset_contract():
    V0 = equicorrelated(3, 0.4, 2.0)
    ds = simulate(SMALL, V0, 5, method="exact", seed=7)
    assert ds["V"].dims == ("sample", "t", "token_a", "token_b")
    assert ds["V"].shape == (5, SMALL.depth + 1, 3, 3)
    np.testing.assert_array_equal(ds["layer"].values, np.arange(SMALL.depth + 1))
    np.testing.assert_allclose(ds["t"].values, np.arange(SMALL.depth + 1) / SMALL.width)
    assert config_of(ds) == SMALL
    attrs = ds.attrs
    assert (attrs["source"], attrs["method"], attrs["seed"]) == ("network", "exact", 7)
    assert (attrs["dtype"], attrs["device"], attrs["nonfinite"]) == ("float64", "cpu", 0)
    assert attrs["group_size"] == SAMPLER_CLASSES["exact"].group_size and "version" in attrs
    # X_0 X_0^T / n = V0 exactly, and every V is symmetric
    np.testing.assert_allclose(ds["V"].values[:, 0], np.broadcast_to(V0.numpy(), (5, 3, 3)))
    np.testing.assert_allclose(ds["V"].values, ds["V"].values.swapaxes(-1, -2), atol=1e-12)
    # helpers on Datasets are re-exported
    assert "rho" in with_rho(ds) and "mean_rho" in with_metrics(ds)


def test_float32():
    ds = simulate(SMALL, equicorrelated(3, 0.4), 3, dtype=torch.float32)
    assert ds["V"].dtype == np.float32 and ds.attrs["dtype"] == "float32"


@pytest.mark.parametrize("method", list(SAMPLER_CLASSES))
def test_seed_reproducible_and_chunk_invariant(method):
    """Same seed -> identical bits whatever the chunking; a run's first whole groups do not
    depend on how many samples follow; another seed gives other numbers."""
    G = SAMPLER_CLASSES[method].group_size
    samples = 2 * G + 3  # two full groups and a partial one
    V0 = equicorrelated(4, 0.2)
    cfg = SMALL if method == "weights" else SMALL.replace(depth=5)
    if method == "gram":  # one head, no W^O, no LayerNorm (see test_every_configuration_runs)
        cfg = cfg.replace(norm="none", heads=1, head_dim=None, key_dim=None, out_proj=False)
    ref = simulate(cfg, V0, samples, method=method, seed=3)["V"].values
    for kwargs in (dict(chunk_size=1), dict(chunk_size=G + 1), dict(memory_budget=1e3)):
        with pytest.warns(RuntimeWarning) if "memory_budget" in kwargs else _no_warning():
            again = simulate(cfg, V0, samples, method=method, seed=3, **kwargs)["V"].values
        np.testing.assert_array_equal(again, ref)
    prefix = simulate(cfg, V0, G, method=method, seed=3)["V"].values
    np.testing.assert_array_equal(prefix, ref[:G])
    other = simulate(cfg, V0, samples, method=method, seed=4)["V"].values
    assert not np.allclose(other[:, 1:], ref[:, 1:])


@contextlib.contextmanager
def _no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _configs():
    """Every combination of attention / mlp / norm / causal, with several head layouts,
    including value and key sizes below the number of tokens (fan_in < m)."""
    heads = [
        dict(),
        dict(heads=2),
        dict(heads=2, head_dim=1, key_dim=1, out_proj=True),
        dict(heads=3, head_dim=5, key_dim=2, out_proj=True),
    ]
    for attention, mlp, norm, causal, h in itertools.product(
        ("shaped", "softmax", "none"),
        ("shaped_relu", "relu", "none"),
        ("none", "pre"),
        (False, True),
        heads,
    ):
        if attention == "none" and (mlp == "none" or h):
            continue
        yield ModelConfig(
            width=12, depth=2, attention=attention, mlp=mlp, norm=norm, causal=causal, **h
        )


@pytest.mark.parametrize("method", list(SAMPLER_CLASSES))
def test_every_configuration_runs(method):
    V0 = equicorrelated(4, 0.3)
    count = 0
    for cfg in _configs():
        if method == "gram" and (
            cfg.norm == "pre" or (cfg.attention != "none" and cfg.heads > 1 and not cfg.out_proj)
        ):
            with pytest.raises(ValueError, match="method 'gram' does not support"):
                simulate(cfg, V0, 3, method=method)
            count += 1
            continue
        V = simulate(cfg, V0, 3, method=method)["V"].values
        assert V.shape == (3, 3, 4, 4) and np.isfinite(V).all(), cfg
        eig = np.linalg.eigvalsh(V)
        assert (eig > -1e-10 * eig[..., -1:]).all(), cfg
        count += 1
    assert count == 2 * 2 * (2 * 3 * 4 + 2)


@pytest.mark.parametrize(
    ("V0", "match"),
    [
        (torch.tensor([[1.0, 0.2], [0.3, 1.0]]), "symmetric"),
        (torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "positive definite"),
        (torch.ones(2, 2, 2), "square"),
        (torch.ones(2, 3), "square"),
        (torch.ones(1, 1), "m >= 2"),
        (torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]]), "finite"),
    ],
)
def test_invalid_V0(V0, match):
    with pytest.raises(ValueError, match=f"V0 .*{match}"):
        simulate(SMALL, V0.double(), 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(samples=0), "samples must be an integer >= 1"),
        (dict(samples=2.0), "samples must be an integer >= 1"),
        (dict(method="gaussian"), "method must be one of 'auto', 'exact', 'weights', 'gram'"),
        (dict(seed=-1), "seed must be an integer >= 0"),
        (dict(dtype=torch.float16), "dtype must be torch.float32 or torch.float64"),
        (dict(chunk_size=0), "chunk_size must be an integer >= 1"),
        (dict(memory_budget=0), "memory_budget must be a number of bytes > 0"),
        (dict(config="shaped"), "config must be a shapedtx.ModelConfig"),
        (dict(config=ModelConfig(width=3)), "width must be >= the number of tokens m = 4"),
        (dict(progress="yes"), "progress must be True, False or None"),
        (dict(V0="x"), "V0 must be a real"),
    ],
)
def test_invalid_arguments(kwargs, match):
    args = dict(config=SMALL, V0=equicorrelated(4, 0.2), samples=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        simulate(args.pop("config"), args.pop("V0"), args.pop("samples"), **args)


def test_resolve_method_rejects_unknown_names():
    assert resolve_method(SMALL, None) == resolve_method(SMALL, "auto") == "exact"
    assert resolve_method(SMALL, "weights") == "weights"
    with pytest.raises(ValueError, match="method must be one of"):
        resolve_method(SMALL, "foo")


def test_nonfinite_covariances_are_reported():
    """Token norms that overflow float64 are reported (warning + attrs), never silent."""
    V0 = equicorrelated(3, 0.2, scale=1e307)
    with pytest.warns(RuntimeWarning, match="3 of 3 samples have non-finite covariances"):
        ds = simulate(SMALL, V0, 3)
    assert ds.attrs["nonfinite"] == 3


def test_progress_bar(capsys):
    simulate(SMALL, equicorrelated(3, 0.2), 2, progress=True)
    assert "simulate[exact]" in capsys.readouterr().err
    simulate(SMALL, equicorrelated(3, 0.2), 2, progress=False)
    assert capsys.readouterr().err == ""


def _mean_rho(ds) -> np.ndarray:
    """Mean over samples of the mean off-diagonal correlation, per layer: (t,)."""
    return with_metrics(ds)["mean_rho"].mean("sample").values


def test_standard_attention_collapses():
    """docs/theory.md#rank-collapse: gamma = 1/sqrt(8), n = 200, m = 4, rho0 = 0.2: mean rho about
    0.41 after 5 layers and above 0.85 (about 0.93) by layer 25 (measured: 0.41, 0.93)."""
    cfg = ModelConfig(width=200, depth=25, attention="softmax", gamma=8**-0.5)
    rho = _mean_rho(simulate(cfg, equicorrelated(4, 0.2), 64, seed=5))
    assert rho[25] > 0.85
    assert 0.33 < rho[5] < 0.5
    assert (np.diff(rho) > 0).all()  # monotone collapse
    # without the skip connection (gamma = 1): about 0.85 after one layer
    no_skip = ModelConfig(width=200, depth=1, attention="softmax", gamma=1.0)
    assert 0.8 < _mean_rho(simulate(no_skip, equicorrelated(4, 0.2), 64, seed=5))[1] < 0.9


def test_shaped_attention_does_not_collapse():
    """Same network with shaped attention (tau0 = 1): mean rho within 0.1 of rho0 for 150
    layers (the standard network above exceeds 0.85 at layer 25)."""
    cfg = ModelConfig(width=200, depth=150, attention="shaped", gamma=8**-0.5, tau0=1.0)
    rho = _mean_rho(simulate(cfg, equicorrelated(4, 0.2), 64, seed=6))
    assert np.abs(rho - 0.2).max() < 0.1
    assert math.isclose(rho[0], 0.2)


def test_grouped_normal_streams():
    """Each group's rows come from its own generator seeded from (seed, group) only."""
    rng = GroupedNormal(9, [2, 3], [4, 1], torch.device("cpu"))
    Z = rng.normal((2, 3), torch.float64)
    assert Z.shape == (5, 2, 3) and rng.samples == 5
    for g, rows in ((2, Z[:4]), (3, Z[4:])):
        gen = torch.Generator().manual_seed(group_seed(9, g))
        torch.testing.assert_close(
            rows, torch.randn(rows.shape, generator=gen, dtype=torch.float64)
        )
    assert group_seed(9, 2) != group_seed(9, 3) != group_seed(10, 3)
    # map: fn gets each group's rows of x and that group's next draws
    rng = GroupedNormal(9, [2, 3], [4, 1], torch.device("cpu"))
    x = torch.arange(5.0, dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(rng.map(lambda x_g, z: x_g + z, x, (2, 3)), x + Z)


# Laws for every input (property-based) ---------------------------------------------------------
def _assert_psd(V: np.ndarray, rel: float = 1e-9) -> None:
    """Symmetric with eigenvalues >= -rel * trace (every leading index a separate matrix)."""
    np.testing.assert_allclose(V, np.swapaxes(V, -1, -2), rtol=0, atol=rel * np.abs(V).max())
    eig = np.linalg.eigvalsh(V)
    trace = np.trace(V, axis1=-2, axis2=-1)
    assert (eig >= -rel * trace[..., None]).all(), eig.min()


@settings(deadline=None)
@given(model_configs(min_width=4, max_width=12, max_depth=3), covariances(max_m=4),
       st.sampled_from(sorted(SAMPLER_CLASSES)), st.integers(0, 1000))  # fmt: skip
def test_every_simulated_covariance_is_psd(config, V0, method, seed):
    """V_l = X_l X_l^T / n is PSD at every layer, for every architecture and sampler."""
    if method == "gram":  # its supported family: no LayerNorm, ReLU-type MLP of width n
        simplified = config.attention == "simplified"  # not in it: shaped attention instead
        config = config.replace(heads=1, head_dim=None, key_dim=config.key_dim, out_proj=False,
                                norm="none", init="fan_in", mlp_ratio=1,
                                mlp="relu" if config.mlp == "gelu" else config.mlp,
                                attention="shaped" if simplified else config.attention,
                                residual="scaled" if simplified else config.residual,
                                layout="sequential")  # fmt: skip
    ds = simulate(config, V0, 2, method=method, seed=seed, progress=False)
    V = ds["V"].values
    assert np.isfinite(V).all()
    _assert_psd(V)


def test_sampler_and_solver_objects_equal_their_names():
    """``method=Exact()`` is ``method="exact"`` exactly in ``simulate``, and
    ``method=sde.FactoredEuler(dt)`` is ``method="euler", dt=dt`` in ``sde.solve``."""
    import sde
    from simulations import Auto, Exact, Gram, Weights

    config = ModelConfig(width=16, depth=3)
    V0 = equicorrelated(3, 0.2)
    for obj, name in ((Exact(), "exact"), (Weights(), "weights"), (Gram(), "gram")):
        a = simulate(config, V0, 8, method=obj, seed=2, chunk_size=4)
        b = simulate(config, V0, 8, method=name, seed=2, chunk_size=4)
        assert np.array_equal(a["V"].values, b["V"].values) and a.attrs["method"] == name
    assert simulate(config, V0, 8, method=Auto()).attrs["method"] == "gram"
    x = sde.solve(config, V0, 8, method=sde.FactoredEuler(0.02), seed=5, dtype=torch.float32)
    y = sde.solve(config, V0, 8, method="euler", dt=0.02, seed=5, dtype=torch.float32)
    assert np.array_equal(x["V"].values, y["V"].values)


def test_run_settings_are_keywords_only():
    """One way to pass the run settings: keywords (no ``options`` object beside them)."""
    import inspect

    import sde

    settings = {"seed", "device", "dtype", "progress"}
    for verb in (simulate, sde.solve):
        parameters = inspect.signature(verb).parameters
        assert "options" not in parameters
        assert all(parameters[k].kind is inspect.Parameter.KEYWORD_ONLY for k in settings)
    with pytest.raises(TypeError, match="options"):
        simulate(ModelConfig(width=16, depth=3), equicorrelated(3, 0.2), 2, options=None)


def test_weights_sampler_is_the_library_block_with_each_groups_generator():
    """``method="weights"``: a block is :func:`shapedtx.block` with
    :func:`shapedtx.gaussian_linear` on each group's own generator (explicit matrices, the
    reference), here computed group by group with the unfused block."""
    from shapedtx import block, gaussian_linear
    from simulations.samplers import WeightsSampler

    cfg = ModelConfig(width=12, depth=2, mlp="shaped_relu", c_minus=-2.0, causal=True)
    G = WeightsSampler.group_size
    sizes = [G, 2]
    X = torch.randn(G + 2, 3, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampler = WeightsSampler(cfg, GroupedNormal(5, [0, 1], sizes, torch.device("cpu")))
    out = sampler.step(X.clone())
    ref_rng = GroupedNormal(5, [0, 1], sizes, torch.device("cpu"))
    ref = torch.cat(
        [
            block(X[s], cfg, gaussian_linear(gen, cfg), fused=False)
            for gen, s in zip(ref_rng.generators, ref_rng.slices, strict=True)
        ]
    )
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(width=12, depth=3, heads=2, attention="softmax"),  # two heads, no W^O
        ModelConfig(width=12, depth=3, heads=2, out_proj=True, mlp="relu"),
        ModelConfig(width=12, depth=3, norm="pre", causal=True),
        ModelConfig(width=12, depth=3, mlp="shaped_relu", causal=True),  # the direct path
    ],
)
def test_exact_direct_attention_path_gives_the_block_numbers(cfg, monkeypatch):
    """The exact sampler's direct attention sub-block (one head, no W^O, no LayerNorm) and
    :func:`shapedtx.block` give the same numbers with the same draws (up to rounding), and
    every other configuration runs the block function itself (identical bits)."""
    from simulations import samplers

    V0 = equicorrelated(4, 0.3)
    fast = simulate(cfg, V0, 10, method="exact", seed=3)["V"].values
    monkeypatch.setattr(samplers, "FAST_ATTENTION", False)
    slow = simulate(cfg, V0, 10, method="exact", seed=3)["V"].values
    if cfg.heads == 1 and cfg.norm == "none":
        np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(fast, slow)


def test_token_sampler_memory_counts_m_by_widest_tensors():
    """The token samplers' working memory per sample is a number of (m, widest) tensors of
    the dtype (at least the state X: m x n); the weights sampler's fixed part holds one
    group's explicit weight matrices (at least group_size matrices n x widest); the exact
    sampler adds the block it draws ahead."""
    from simulations.samplers import ExactSampler, TokenSampler, WeightsSampler

    cfg = ModelConfig(width=24, depth=2, mlp="relu")
    f64, f32 = torch.float64, torch.float32
    # query and key 4 x 4 (m x m Bartlett products), value, MLP in and out 4 x 24
    drawn = 2 * 4 * 4 + 3 * 4 * 24
    base = TokenSampler.memory(cfg, 4, f64)[0]
    assert ExactSampler.memory(cfg, 4, f64)[0] == base + 8 * drawn
    assert ExactSampler.memory(cfg, 4, f32)[0] == (base + 8 * drawn) // 2
    for cls in (TokenSampler, WeightsSampler):
        per, fixed = cls.memory(cfg, 4, f64)
        assert per >= 4 * 24 * 8
        assert cls.memory(cfg, 8, f64)[0] == 2 * per
        assert cls.memory(cfg, 4, f32)[0] * 2 == per
        # the widest map sets the size: a 4x wider MLP, or 200 query columns
        assert cls.memory(cfg.replace(mlp_ratio=4), 4, f64)[0] == 4 * per
        wide_keys = ModelConfig(width=24, depth=2, heads=2, key_dim=100, mlp="relu")
        assert cls.memory(wide_keys, 4, f64)[0] > 8 * per
    assert ExactSampler.memory(cfg, 4, f64)[1] == 0
    assert ExactSampler.memory(wide_keys, 4, f64)[0] > 8 * base
    fixed = WeightsSampler.memory(cfg, 4, f64)[1]
    assert fixed >= WeightsSampler.group_size * 24 * 24 * 8
    assert WeightsSampler.memory(cfg, 4, f32)[1] * 2 == fixed
    assert WeightsSampler.memory(cfg.replace(mlp_ratio=4), 4, f64)[1] >= 4 * fixed


class _FixedMemory(SAMPLER_CLASSES["weights"]):
    """A sampler with a stated memory estimate and no cache-sized chunk."""

    group_size = 4
    chunk_bytes = None

    @classmethod
    def memory(cls, config, m, dtype):
        return 1000, 5000


def test_default_chunk_is_the_largest_that_fits_the_budget():
    """Without chunk_size the chunk is the largest whole number of groups whose memory (the
    sampler's estimate per sample plus the recorded covariances, (depth + 1) m^2 numbers per
    sample, plus the fixed part) fits ``memory_budget`` (default 1 GiB); a budget below one
    group gives one group with a warning, and any budget > 0 bytes is accepted."""
    from simulations import driver

    assert driver.DEFAULT_MEMORY_BUDGET == 1024**3
    cfg, m, f64 = ModelConfig(width=16, depth=9), 3, torch.float64
    per_group = 4 * (1000 + 10 * m * m * 8)  # G (per sample + recorded covariances)
    for budget in (5000 + 3 * per_group, 5000 + 4 * per_group - 1, 1e6):
        groups = driver._chunk_groups(_FixedMemory, cfg, m, f64, None, budget)
        assert 5000 + groups * per_group <= budget < 5000 + (groups + 1) * per_group
    assert driver._chunk_groups(_FixedMemory, cfg, m, f64, 9, 1.0) == 3  # rounded up
    for budget in (5000 + per_group, 5000 + 2 * per_group - 1):
        assert driver._chunk_groups(_FixedMemory, cfg, m, f64, None, budget) == 1
    with pytest.warns(RuntimeWarning, match="below one group"):
        assert driver._chunk_groups(_FixedMemory, cfg, m, f64, None, 100.0) == 1
    with pytest.warns(RuntimeWarning, match="below one group"):
        ds = simulate(cfg.replace(depth=1), equicorrelated(3, 0.2), 2, memory_budget=0.5)
    assert ds["V"].shape == (2, 2, 3, 3)


def test_exact_default_chunk_holds_about_chunk_bytes_per_tensor():
    """The exact sampler's default chunk: the most whole groups whose (m, widest) tensor holds
    at most ``chunk_bytes`` (at least one group, even when one group's tensor is larger)."""
    from simulations import ExactSampler, driver

    G, f64 = ExactSampler.group_size, torch.float64
    for width, m in ((1024, 8), (256, 4), (4096, 8)):
        cfg = ModelConfig(width=width, depth=2)
        groups = driver._chunk_groups(ExactSampler, cfg, m, f64, None, 2**30)
        tensor = m * width * 8 * G  # bytes of one (m, n) float64 tensor per group
        assert groups == max(1, ExactSampler.chunk_bytes // tensor)
        assert groups == 1 or groups * tensor <= ExactSampler.chunk_bytes


def test_grouped_fast_streams_on_cpu_are_numpy_sfc64():
    """On CPU, group g's fast stream is numpy's SFC64 generator seeded from (seed, g, 1):
    fill_normal fills the buffer in place (and returns it) with each group's next standard
    normals, chi2 draws from the same stream, and the one-group views of ``split`` (made before
    or after the first draw) continue that stream rather than restarting it."""

    def streams():
        return {
            g: np.random.Generator(np.random.SFC64(np.random.SeedSequence([9, g, 1])))
            for g in (2, 3)
        }

    ref = streams()
    rows = {2: slice(0, 4), 3: slice(4, 5)}
    rng = GroupedNormal(9, [2, 3], [4, 1], torch.device("cpu"))
    buf = torch.empty(5, 6, dtype=torch.float64)
    assert rng.fill_normal(buf) is buf
    for g, s in rows.items():
        np.testing.assert_array_equal(buf[s].numpy(), ref[g].standard_normal((s.stop - s.start, 6)))
    f32 = rng.fill_normal(torch.empty(5, 3, dtype=torch.float32))
    for g, s in rows.items():
        expected = ref[g].standard_normal((s.stop - s.start, 3), dtype=np.float32)
        np.testing.assert_array_equal(f32[s].numpy(), expected)
    dof = torch.tensor([3.0, 5.5], dtype=torch.float64)
    chi = rng.chi2(dof, torch.float64)
    for g, s in rows.items():
        expected = ref[g].chisquare(dof.numpy(), size=(s.stop - s.start, 2))
        np.testing.assert_array_equal(chi[s].numpy(), expected)
    for (s, sub), g in zip(rng.split(), (2, 3), strict=True):
        assert s == rows[g] and sub.samples == s.stop - s.start
        z = sub.fill_normal(torch.empty(sub.samples, 2, dtype=torch.float64)).numpy()
        np.testing.assert_array_equal(z, ref[g].standard_normal((sub.samples, 2)))
        c = sub.chi2(dof, torch.float64).numpy()
        np.testing.assert_array_equal(c, ref[g].chisquare(dof.numpy(), size=(sub.samples, 2)))
    # split before any draw: the views and the chunk still share one stream per group
    ref = streams()
    rng = GroupedNormal(9, [2, 3], [4, 1], torch.device("cpu"))
    for _, sub in rng.split():
        sub.fill_normal(torch.empty(sub.samples, 2, dtype=torch.float64))
    after = rng.fill_normal(torch.empty(5, 2, dtype=torch.float64))
    for g, s in rows.items():
        ref[g].standard_normal((s.stop - s.start, 2))  # the views' draws
        np.testing.assert_array_equal(
            after[s].numpy(), ref[g].standard_normal((s.stop - s.start, 2))
        )


def test_grouped_normal_of_a_single_group():
    rng = GroupedNormal(9, [3], [2], torch.device("cpu"))
    Z = rng.normal((4,), torch.float64)
    gen = torch.Generator().manual_seed(group_seed(9, 3))
    assert torch.equal(Z, torch.randn((2, 4), generator=gen, dtype=torch.float64))
