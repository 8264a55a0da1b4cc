"""Every subcommand: bad input is one line on stderr naming the option, exit code 2, no
traceback, and nothing written (checked before any computation)."""

import pytest

from simulations.cli import main

BAD = [
    # simulate
    ["simulate", "--width", "0"],
    ["simulate", "--depth", "-1"],
    ["simulate", "--tokens", "1"],
    ["simulate", "--rho0", "2"],
    ["simulate", "--samples", "0"],
    ["simulate", "--scale", "-1"],
    ["simulate", "--model", "gpt5"],
    ["simulate", "--mlp-ratio", "0"],
    ["simulate", "--norm", "rms"],
    ["simulate", "--out", "x.csv"],
    ["simulate", "--out", "{tmp}"],
    ["simulate", "--device", "tpu"],
    ["simulate", "--gamma", "1.5"],
    ["simulate", "--tau0", "0"],
    ["simulate", "--heads", "7"],
    ["simulate", "--out", "/proc/shapedtx-test/out.nc"],  # os.access says yes to root
    ["simulate", "--device", "meta"],
    ["simulate", "--threads", "100000"],
    ["simulate", "--width", "8", "--depth", "2", "--tokens", "2", "--samples", "1000000000000"],
    # sde
    ["sde", "--attention", "softmax"],
    ["sde", "--residual", "unit"],
    ["sde", "--mlp", "gelu"],
    ["sde", "--norm", "post"],
    ["sde", "--init", "gpt2"],
    ["sde", "--tokens", "1"],
    ["sde", "--out", "{tmp}"],
    ["sde", "--dtype", "float16"],
    ["sde", "--out", "/sys/shapedtx-test.nc"],
    # compare
    ["compare", "--out", "{out}", "--samples", "1"],
    ["compare", "--out", "{out}", "--dt", "0"],
    ["compare", "--out", "{out}", "--threshold", "1.5"],
    ["compare", "--out", "{out}", "--model", "pre_ln"],
    ["compare", "--out", "{out}", "--convergence-widths", "a,b"],
    ["compare", "--out", "{out}", "--tokens", "1"],
    ["compare", "--out", "{file}"],
    ["compare", "--out", "{out}", "--threads", "0"],
    ["compare", "--out", "{out}", "--preset", "x"],
    ["compare", "--out", "/proc/shapedtx-test/out"],
    # train
    ["train", "--steps", "0"],
    ["train", "--lr", "-1"],
    ["train", "--seq-len", "1"],
    ["train", "--no-causal"],
    ["train", "--width", "0"],
    ["train", "--out", "{file}"],
    ["train", "--out", "/proc/shapedtx-test/run"],
    # design, advise, sweep, probe
    ["design", "--params", "-1"],
    ["design", "--params", "1e9", "--head-size", "0"],
    ["design", "--params", "1e9", "--multiple", "0"],
    ["advise", "--width", "0", "--depth", "4"],
    ["advise", "--width", "64", "--depth", "4", "--tokens", "1"],
    ["sweep", "{grid}", "--store", "{file}"],
    ["sweep", "{grid}", "--store", "{file}/s.zarr"],
    ["probe", "{tmp}/missing-run"],
]


@pytest.mark.parametrize("argv", BAD, ids=lambda a: " ".join(a))
def test_bad_invocation_is_one_line_exit_2_and_writes_nothing(argv, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nwidth = [16, -3]\ndepth = 2\nsamples = 4\n")
    before = sorted(tmp_path.rglob("*"))
    argv = [a.format(tmp=tmp_path, out=tmp_path / "out", file=tmp_path / "file.txt", grid=grid)
            for a in argv]  # fmt: skip
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "error" in err and "Traceback" not in err, err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sde", "--T", "-1"], "--T must be a finite number > 0"),
        (["sde", "--seed", "-1"], "--seed must be an integer >= 0"),
        (["simulate", "--seed", "-1"], "--seed must be an integer >= 0"),
        (["train", "--batch-size", "0"], "--batch-size must be an integer >= 1"),
        # an option the model would ignore is refused, naming why
        (["simulate", "--mlp", "none", "--c-plus", "3"], "--c-plus has no effect with mlp='none'"),
        (["simulate", "--attention", "softmax", "--tau0", "2"], "--tau0 has no effect with"),
        (["train", "--residual", "unit", "--gamma", "0.5"], "--gamma has no effect with"),
        (["sde", "--mlp", "none", "--mlp-ratio", "4"], "--mlp-ratio has no effect with"),
        (["simulate", "--attention", "none", "--mlp", "relu", "--heads", "2"], "--heads has no"),
        (["train", "--data", __file__, "--suffix", ".py"], "--suffix selects files in a folder"),
    ],
)
def test_library_messages_name_the_command_line_option(argv, message, capsys):
    assert main(argv) == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_a_write_that_fails_mid_run_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    import shapedtx.files

    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(shapedtx.files.os, "replace", refuse)
    out = tmp_path / "V.nc"
    argv = ["simulate", "--width", "8", "--depth", "1", "--tokens", "2", "--samples", "2"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Operation not permitted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone too


def test_at_least_40_bad_invocations():
    assert len(BAD) >= 40
