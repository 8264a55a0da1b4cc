"""``shapedtx compare``: a tiny end-to-end run writes every file; bad options exit 2."""

import json
import math

import pytest

from shapedtx import load_dataset
from simulations.cli import main
from simulations.presets import PRESETS, baselines


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
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from simulations.cli import main; sys.exit(main())",
         *argv], stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = proc.stderr.readline()  # the first stage line: the computation has started
    assert first.startswith("[1/"), first
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
