"""``shapedtx train``: a tiny run end to end, and one-line errors with exit code 2."""

from __future__ import annotations

import pytest

from shapedtx.results import load_dataset
from simulations.cli import main

TINY = [
    "train", "--width", "16", "--depth", "2", "--heads", "2", "--steps", "6",
    "--batch-size", "4", "--seq-len", "16", "--warmup-steps", "1", "--log-interval", "2",
    "--eval-interval", "2", "--checkpoint-interval", "2", "--eval-batches", "1",
    "--metrics-batch", "2", "--no-progress", "--threads", "1",
]  # fmt: skip


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("hello shaped world, hello collapse. " * 30)
    return path


def test_cli_trains_and_writes_outputs(tmp_path, text, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--data", str(text), "--out", str(out)]) == 0
    assert "final validation loss" in capsys.readouterr().out
    for name in ("checkpoint.pt", "log.nc", "loss.png", "collapse.png"):
        assert (out / name).exists(), name
    log = load_dataset(out / "log.nc")
    assert log.attrs["status"] == "finished" and int(log.step[-1]) == 6
    assert log.attrs["config.attention"] == "shaped" and log.attrs["config.causal"] == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--steps", "0"], "--steps"),
        (["--lr", "-1"], "--lr must be"),
        (["--width", "abc"], "--width"),
        (["--attention", "linear"], "--attention"),
        (["--no-causal"], "causal"),
        (["--data", "/no/such/file"], "data path"),
        (["--dtype", "float8"], "--dtype"),
        (["--device", "nonsense"], "device"),
        (["--val-fraction", "2"], "--val-fraction"),
        (["--threads", "0"], "threads"),
        (["--seq-len", "5000"], "seq_len"),
    ],
)
def test_bad_options_give_one_line_error_and_exit_2(tmp_path, text, capsys, extra, needle):
    argv = [*TINY, "--data", str(text), "--out", str(tmp_path / "bad"), *extra]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err and needle in err, err
    assert "Traceback" not in err


def test_divergence_is_one_line_exit_1(tmp_path, text, capsys):
    argv = [*TINY, "--data", str(text), "--out", str(tmp_path / "nan"), "--attention", "softmax"]
    argv += ["--mlp", "relu", "--lr", "10", "--grad-clip", "0", "--eps", "1e-30", "--steps", "40"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "diverged: non-finite" in err and "Traceback" not in err


def test_short_runs_need_no_warmup_option_and_causal_is_not_offered(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    args = ["train", "--data", str(text), "--steps", "6", "--seq-len", "8", "--batch-size", "2",
            "--width", "8", "--depth", "1", "--heads", "2", "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0  # warm-up min(50, 6 // 10) = 0
    with pytest.raises(SystemExit) as exc:
        main([*args, "--out", str(tmp_path / "b"), "--no-causal"])
    assert exc.value.code == 2


def test_resume_mismatch_names_the_cli_flags(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    args = ["train", "--data", str(text), "--steps", "4", "--seq-len", "8", "--batch-size", "2",
            "--width", "8", "--heads", "2", "--no-progress"]  # fmt: skip
    args += ["--out", str(tmp_path / "r")]
    assert main([*args, "--depth", "1"]) == 0
    capsys.readouterr()
    assert main([*args, "--depth", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--depth 1" in err and "--no-resume" in err and "resume=False" not in err
    # starting afresh over a finished run needs --overwrite too
    assert main([*args, "--depth", "2", "--no-resume"]) == 2
    assert "pass --overwrite with --no-resume" in capsys.readouterr().err
    assert load_dataset(tmp_path / "r" / "log.nc").attrs["config.depth"] == 1
    assert main([*args, "--depth", "2", "--no-resume", "--overwrite"]) == 0
    assert load_dataset(tmp_path / "r" / "log.nc").attrs["config.depth"] == 2
    # probe never replaces its --out silently either
    probe = ["probe", str(tmp_path / "r"), "--data", str(text), "--out", str(tmp_path / "p.nc")]
    assert main(probe) == 0
    capsys.readouterr()
    assert main(probe) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main([*probe, "--overwrite"]) == 0


def test_the_compilation_warm_up_is_announced_before_training(tmp_path, text, capsys):
    """Issue 39: the first shaped steps compile numba kernels (seconds each) and the bar looked
    hung; a line says so first. Not for softmax attention, nor without the bar."""
    from simulations.cli.train import WARM_UP_NOTE

    argv = [a for a in TINY if a != "--no-progress"] + ["--steps", "2", "--warmup-steps", "0"]
    assert main([*argv, "--data", str(text), "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"shapedtx train: {WARM_UP_NOTE}\n")  # before the bar
    assert main([*argv, "--data", str(text), "--out", str(tmp_path / "b"),
                 "--attention", "softmax", "--mlp", "relu"]) == 0  # fmt: skip
    assert "compile" not in capsys.readouterr().err
    assert main([*TINY, "--data", str(text), "--out", str(tmp_path / "c")]) == 0
    assert "compile" not in capsys.readouterr().err
