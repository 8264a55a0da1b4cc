"""``shapedtx compare``: a tiny end-to-end run writes every file; bad options exit 2."""

import json
import math

import numpy as np
import pytest

from shapedtx import load_dataset
from simulations.baselines import baselines
from simulations.cli import main
from simulations.presets import PRESETS


def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


def test_compare_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["compare", "--quick", "--width", "16", "--depth", "12", "--samples", "128"]
    argv += ["--baseline-samples", "32", "--convergence-widths", "8", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rank collapse" in printed and "rho at T" in printed
    for name in ("network", "sde", "comparison", "collapse", "convergence"):
        assert (out / f"{name}.nc").is_file()
    for fig in ("mean_correlation", "rho_density", "quantile_bands", "convergence"):
        for ext in ("png", "pdf"):
            assert (out / "figures" / f"{fig}.{ext}").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert all(math.isfinite(v) for v in _numbers(summary))
    for src in ("network", "sde"):
        q = summary["rho_T"][src]["quantiles"]
        assert len(q) == 5 and all(v is not None for v in q) and q == sorted(q)
    for key in ("ks_rho", "ks_rho_pvalue", "w1_rho", "ks_logVaa", "w1_logVaa"):
        assert summary["distances_T"][key] is not None
    collapse = summary["collapse"]["models"]
    assert len(collapse) == 6  # shaped, 2 standard counterparts, 3 vanilla presets
    assert any(k.startswith("post-LN") for k in collapse)
    assert summary["convergence"]["widths"] == [8, 16]
    assert summary["run_times_s"]["total"] > 0
    net, cmp = load_dataset(out / "network.nc"), load_dataset(out / "comparison.nc")
    assert net.sizes["sample"] == 128 and net.attrs["config.width"] == 16
    assert cmp.sizes["t"] == 13  # layers 0..12 of width 16 pair with SDE times (dt 0.01)
    assert cmp.attrs["max_time_gap"] <= 0.005 + 1e-12


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--samples", "1"], "--samples"),
        (["--rho0", "1.5"], "rho0"),
        (["--tokens", "1"], "--tokens"),
        (["--threshold", "1.5"], "--threshold"),
        (["--convergence-widths", "7"], "widths"),
        (["--convergence-widths", "a,b"], "--convergence-widths"),
        (["--dt", "-1"], "--dt"),
        (["--gamma", "2"], "gamma"),
        (["--preset", "nope"], "preset"),
        (["--width", "x"], "width"),
        (["--attention", "softmax"], "softmax"),
    ],
)
def test_compare_rejects_bad_options(tmp_path, capsys, extra, message):
    try:
        code = main(["compare", "--quick", "--no-figures", "--out", str(tmp_path), *extra])
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()


def test_compare_no_sde_reports_a_vanilla_models_collapse(tmp_path, capsys):
    """Issue 39: --model post_ln has no SDE, yet its collapse report needs none."""
    out = tmp_path / "run"
    argv = ["compare", "--quick", "--model", "post_ln", "--width", "16", "--depth", "12"]
    argv += ["--samples", "16", "--baseline-samples", "8", "--no-progress", "--out", str(out)]
    assert main([*argv, "--no-sde"]) == 0
    printed = capsys.readouterr().out
    assert "rank collapse" in printed and "model (softmax attn + gelu MLP x4, post-LN" in printed
    assert {p.name for p in out.iterdir()} == {"collapse.nc", "network.nc", "figures"}
    report = load_dataset(out / "collapse.nc")
    assert report.sizes["model"] == 6 and report.attrs["config.norm"] == "post"
    assert (out / "figures" / "collapse_metrics.png").is_file()
    assert main(["compare", "--quick", "--model", "post_ln", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    # post_ln's mlp_ratio 4 has an SDE since issue 40: the other 4 fields are refused
    assert "4 fields have no derived covariance SDE" in err and "--no-sde" in err


def test_run_collapse_needs_no_sde_and_run_comparison_refuses_it():
    from shapedtx import preset
    from simulations import Experiment, run_collapse, run_comparison

    e = Experiment(preset("no_norm", width=8, depth=4), samples=4, baseline_samples=2, sde=False)
    report, models = run_collapse(e)
    assert len(models) == 6 and report.attrs["experiment.sde"] == 0
    with pytest.raises(ValueError, match="sde is False"):
        run_comparison(e)
    with pytest.raises(ValueError, match="sde must be"):
        Experiment(preset("no_norm", width=8, depth=4), sde="no")


def test_presets_and_baselines():
    assert set(PRESETS) == {"block", "attention", "mlp"}
    block = PRESETS["block"]
    assert (block.config.width, block.config.depth, block.samples, block.tokens) == (
        200,
        150,
        4096,
        4,
    )
    assert block.config.mlp == "shaped_relu" and block.rho0 == 0.2
    base = baselines(block.config)
    counterparts = {k: c for k, c in base.items() if k.startswith("standard")}
    assert {c.norm for c in counterparts.values()} == {"none", "pre"}
    assert all(c.attention == "softmax" and c.mlp == "relu" for c in counterparts.values())
    vanilla = {k: c for k, c in base.items() if not k.startswith("standard")}
    assert {c.norm for c in vanilla.values()} == {"none", "pre", "post"}
    assert all(c.mlp == "gelu" and c.residual == "unit" for c in vanilla.values())
    assert all((c.width, c.depth) == (200, 150) for c in base.values())
    mlp = baselines(PRESETS["mlp"].config)
    assert all(c.attention == "none" and c.mlp == "relu" for k, c in mlp.items()
               if k.startswith("standard"))  # fmt: skip


def test_at_width_keeps_T_and_derived_head_sizes():
    from shapedtx import ModelConfig
    from simulations.convergence import at_width

    cfg = at_width(ModelConfig(width=200, depth=150, mlp="shaped_relu"), 16)
    assert (cfg.width, cfg.depth, cfg.head_dim, cfg.key_dim) == (16, 12, 16, 16)
    fixed = ModelConfig(width=64, depth=32, heads=2, head_dim=8, out_proj=True)
    assert at_width(fixed, 32).head_dim == 8
    with pytest.raises(ValueError, match="depth = T"):
        at_width(ModelConfig(width=200, depth=150), 10)


def test_compare_causal_writes_token_pairs(tmp_path, capsys):
    """``--causal`` (docs/theory.md#causal-sde) runs end to end and adds the per-token-pair outputs;
    the non-causal run has none (its outputs are unchanged)."""
    from simulations.compare import causal_pairs

    assert causal_pairs(4) == [(1, 2), (1, 4), (3, 4)] and causal_pairs(2) == [(1, 2)]
    out = tmp_path / "causal"
    argv = ["compare", "--quick", "--causal", "--width", "16", "--depth", "12"]
    argv += ["--samples", "64", "--baseline-samples", "16", "--convergence-widths", "none"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "causal: mean rho at T by token pair" in printed and "MLP, causal)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["causal"] == 1
    tp = summary["token_pairs"]
    assert tp["pairs"] == ["1-2", "1-4", "3-4"]
    for src in ("network", "sde"):
        assert len(tp["mean_rho_T"][src]) == 3 and len(tp["V_diag_mean_T"][src]) == 4
    assert all(math.isfinite(v) for v in _numbers(tp))
    for ext in ("png", "pdf"):
        assert (out / "figures" / f"token_pairs.{ext}").stat().st_size > 1000
    pairs = load_dataset(out / "token_pairs.nc")
    assert pairs["mean_rho"].dims == ("source", "pair", "t")
    last = pairs.isel(t=-1)  # the summary is at T, the last time
    for src in ("network", "sde"):
        np.testing.assert_allclose(tp["mean_rho_T"][src], last["mean_rho"].sel(source=src))
        np.testing.assert_allclose(tp["V_diag_mean_T"][src], last["V_diag_mean"].sel(source=src))
    assert load_dataset(out / "sde.nc").attrs["config.causal"] == 1
    plain = tmp_path / "plain"
    argv = [a for a in argv if a != "--causal"]
    assert main([*argv, "--no-figures", "--no-progress", "--out", str(plain)]) == 0
    assert "token_pairs" not in json.loads((plain / "summary.json").read_text())
    assert not (plain / "token_pairs.nc").exists()


QUICK = ["compare", "--quick", "--width", "16", "--depth", "12", "--samples", "64",
         "--baseline-samples", "16", "--convergence-widths", "none", "--no-progress"]  # fmt: skip


def test_run_comparison_from_python_gives_the_cli_summary(tmp_path, capsys):
    from shapedtx import ModelConfig
    from simulations import Experiment, run_comparison

    assert main([*QUICK, "--no-figures", "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    config = ModelConfig(width=16, depth=12, mlp="shaped_relu")
    experiment = Experiment(config, samples=64, baseline_samples=16, convergence_widths=(),
                            name="block", description=cli["description"])  # fmt: skip
    summary = run_comparison(experiment).summary
    for key in ("rho_T", "Vaa_T", "distances_T", "collapse", "config", "sde"):
        assert summary[key] == cli[key], key


def test_compare_refuses_a_used_folder_and_overwrite_leaves_no_stale_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*QUICK, "--out", str(out)]) == 0
    (out / "stale.txt").write_text("from an earlier run")
    capsys.readouterr()
    assert main([*QUICK, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert main([*QUICK, "--no-figures", "--overwrite", "--out", str(out)]) == 0
    assert not (out / "stale.txt").exists() and not (out / "figures").exists()
    assert not list(tmp_path.glob(".*"))  # no staging or old folder left beside it


def test_output_files_honour_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        assert main([*QUICK, "--no-figures", "--out", str(tmp_path / "m")]) == 0
    finally:
        os.umask(old)
    for path in [tmp_path / "m", *(tmp_path / "m").iterdir()]:
        expected = 0o755 if path.is_dir() else 0o644
        assert path.stat().st_mode & 0o777 == expected, path


def test_ctrl_c_exits_130_and_leaves_nothing(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "interrupted"
    argv = ["compare", "--width", "32", "--depth", "24", "--samples", "4096",
            "--baseline-samples", "256", "--out", str(out)]  # fmt: skip
    # Python's Ctrl-C handler, also when pytest runs as a background job (which starts its
    # children with SIGINT ignored, and then the CLI rightly leaves it ignored)
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from simulations.cli import main; sys.exit(main())")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # the first stage line: the computation has started
    assert first.startswith("[1/"), first
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_presets_match_the_documented_setup():
    """README (``shapedtx compare``): every preset at width 200, depth 150 (T = 0.75),
    gamma = 1/sqrt(8), tau0 = 1, m = 4 tokens, rho0 = 0.2, 4096 samples, 256 per baseline,
    convergence widths 4,8,16,32,64; ``--quick`` (width 32, 256 samples) keeps T, so every
    quick size is a valid depth; presets are read-only."""
    import dataclasses

    from simulations.presets import QUICK

    kinds = {"block": ("shaped", "shaped_relu"), "attention": ("shaped", "none"),
             "mlp": ("none", "shaped_relu")}  # fmt: skip
    for name, p in PRESETS.items():
        c = p.config
        assert (c.attention, c.mlp) == kinds[name]
        assert (c.width, c.depth, c.T, c.tau0) == (200, 150, 0.75, 1.0)
        assert math.isclose(c.gamma, 8**-0.5)
        assert (p.tokens, p.rho0, p.samples, p.baseline_samples) == (4, 0.2, 4096, 256)
        assert p.convergence_widths == (4, 8, 16, 32, 64)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.samples = 1
    assert (QUICK["width"], QUICK["samples"]) == (32, 256)
    assert QUICK["depth"] == 0.75 * QUICK["width"] and QUICK["baseline_samples"] >= 2
    for w in QUICK["convergence_widths"]:
        assert w < QUICK["width"] and (0.75 * w).is_integer()


def test_baseline_heads_and_model_labels():
    """Vanilla baselines: 4 heads with W^O, else the largest of 2 and 1 dividing the width;
    labels name attention, MLP (with its ratio), LayerNorm, unit residual, init, causality."""
    from shapedtx import ModelConfig
    from simulations.baselines import model_label

    for width, heads in ((200, 4), (36, 4), (30, 2), (18, 2), (15, 1), (9, 1)):
        base = baselines(ModelConfig(width=width, depth=width // 3 * 2))
        vanilla = [c for k, c in base.items() if not k.startswith("standard")]
        assert all(c.heads == heads and c.out_proj for c in vanilla), width
    cfg = ModelConfig(width=16, depth=8, mlp="shaped_relu")
    assert model_label(cfg) == "shaped attn + shaped_relu MLP"
    assert model_label(cfg.replace(attention="none", mlp="relu", mlp_ratio=2)) == "relu MLP x2"
    assert model_label(cfg.replace(mlp="none", mlp_ratio=2, causal=True)) == "shaped attn, causal"
    label = model_label(cfg.replace(norm="pre", residual="unit", init="gpt2", mlp_ratio=4))
    assert label == "shaped attn + shaped_relu MLP x4, pre-LN, X + f(X), gpt2 init"


def _tiny_experiment(**kw):
    from shapedtx import ModelConfig
    from simulations import Experiment

    kw = {"samples": 16, "baseline_samples": 4, "convergence_widths": (), **kw}
    return Experiment(ModelConfig(width=8, depth=6, mlp="shaped_relu"), **kw)


def test_experiment_defaults_and_validation_boundaries():
    """Defaults are the compare presets' (README: m = 4, rho0 = 0.2, 4096 samples, 256 per
    baseline, widths 4,8,16,32,64); rho0 must lie in the open interval (-1/(m-1), 1) where
    the equicorrelated matrix is positive definite, dt > 0 finite, threshold in (0, 1)."""
    from shapedtx import ModelConfig
    from simulations import Experiment

    e = Experiment(ModelConfig(width=16, depth=12, mlp="shaped_relu"))
    assert (e.tokens, e.rho0, e.samples, e.baseline_samples) == (4, 0.2, 4096, 256)
    assert e.convergence_widths == (4, 8, 16, 32, 64) and e.widths == (4, 8, 32, 64)
    assert (e.method, e.threshold, e.seed) == ("auto", 0.99, 0)
    for ok in ({"rho0": -0.33}, {"rho0": 0.999}, {"dt": 1e-4}, {"threshold": 0.5},
               {"method": "exact"}, {"tokens": 8}):  # fmt: skip
        _tiny_experiment(**ok)
    for bad, field in (({"rho0": -1 / 3}, "rho0"), ({"rho0": 1.0}, "rho0"),
                       ({"tokens": 3, "rho0": -0.5}, "rho0"), ({"dt": 0.0}, "dt"),
                       ({"dt": float("inf")}, "dt"), ({"threshold": 0.0}, "threshold"),
                       ({"threshold": 1.0}, "threshold"), ({"method": "bogus"}, "method"),
                       ({"tokens": 9}, "tokens"), ({"device": "foo"}, "device"),
                       ({"name": 3}, "name"), ({"description": None}, "description")):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            _tiny_experiment(**bad)
    from simulations import run_comparison

    with pytest.raises(ValueError, match="figures must be True or False"):
        run_comparison(_tiny_experiment(), figures="no")


def test_p_value_formatting():
    from simulations.formatting import p_value as _p

    assert _p(None) == "nan" and _p(0.9995) == "> 0.999" and _p(0.999) == "0.999"
    assert (_p(0.5), _p(0.01), _p(0.0012345)) == ("0.500", "0.010", "0.0012")


def test_run_collapse_seeds_and_stage_count(tmp_path, capfd):
    """Baseline k is simulated with seed ``seed + 2 + k`` (Experiment docs); ``stages`` gets
    ``(k, total)`` with k running 1..total, whatever the outputs asked for. From Python the
    runs are quiet (no progress bars unless asked) and draw figures unless ``figures=False``."""
    import inspect
    from dataclasses import replace

    from simulations import run_collapse, run_comparison

    assert inspect.signature(run_comparison).parameters["figures"].default is True

    e = _tiny_experiment(seed=5)
    report, models = run_collapse(e)
    seeds = [ds.attrs["seed"] for ds in models.values()]
    assert seeds == [5, *(7 + k for k in range(len(models) - 1))]
    assert list(report["model"].values) == list(models)
    for widths, out in (((4,), None), ((), tmp_path / "run")):
        calls = []
        result = run_comparison(
            _tiny_experiment(convergence_widths=widths),
            out,
            figures=False,
            stages=lambda k, n, t: calls.append((k, n)),  # noqa: B023
        )
        assert [k for k, _ in calls] == list(range(1, len(calls) + 1))
        assert {n for _, n in calls} == {len(calls)} and len(calls) == 5  # convergence or write
    assert "simulate[" not in capfd.readouterr().err  # no tqdm bars by default
    # the summary is taken at T, the last time (layer 6 of width 8: T = 0.75)
    summary = result.summary
    assert summary["t_final"] == {"network": 0.75, "sde": pytest.approx(0.75)}
    net_last = result.comparison.isel(t=-1)["rho_quantile"].sel(source="network").values
    assert summary["rho_T"]["network"]["quantiles"] == pytest.approx(list(net_last), rel=1e-12)
    # a limit without the solver's 'exploded' record has no exploded paths
    from simulations.experiment import summarise

    assert (
        summarise(replace(result, limit=result.limit.drop_vars("exploded")))["sde"]["exploded"] == 0
    )
