"""The command line's shared pieces (``simulations.cli._common``), in process: the generated
model, input and run options (defaults and help), the bounds of the input options, the output
file and folder checks, and the staged output folder (its mode under the umask, and nothing
left beside it after success, failure or Ctrl-C)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from shapedtx import ModelConfig
from simulations.cli import _common
from simulations.cli._common import UsageError


def _parser(defaults: ModelConfig | None = None) -> argparse.ArgumentParser:
    """A parser with every shared option, as simulate's."""
    parser = _common.ArgumentParser(prog="t")
    _common.add_config_arguments(parser, defaults)
    group = parser.add_argument_group("input")
    _common.add_input_arguments(group)
    _common.add_output_arguments(group)
    _common.add_run_options(parser)
    return parser


def _helps(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    return {s: a.help for a in parser._actions for s in a.option_strings}


def test_a_parse_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["--width", "wide"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("t: error: ") and err.count("\n") == 1 and "--width" in err


def test_the_shared_options_have_the_documented_defaults_and_help():
    parser = _parser()
    args = parser.parse_args([])
    assert (args.tokens, args.rho0, args.scale, args.samples) == (4, 0.2, 1.0, 256)
    assert (args.out, args.overwrite) == (None, False)
    assert (args.seed, args.device, args.dtype, args.threads, args.progress) == (
        0, None, "float64", None, None
    )  # fmt: skip
    assert _common.RunArgs.from_args(args) == _common.RunArgs()
    helps = _helps(parser)
    assert helps["--seed"] == "random seed (default 0)"
    assert helps["--device"] == "torch device (default cpu)"
    assert helps["--dtype"] == "floating-point type (default float64)"
    assert helps["--threads"] == "torch CPU threads (default torch's)"
    assert str(helps["--progress"]).startswith("progress bars (default when stderr is a terminal)")
    assert helps["--width"] == f"n, residual width (default {ModelConfig().width})"
    assert helps["--tau0"] == "shaped-attention temperature constant (default 1.0)"
    assert helps["--key-dim"] == "n_k per head (default head_dim)"  # no number: derived
    assert helps["--head-dim"] == "d_p per head (default width/heads)"
    assert helps["--gamma"] == "branch weight of the scaled residual (default 1/sqrt(8))"
    assert str(helps["--model"]).startswith("start from a named model: shaped: ")


@pytest.mark.parametrize(("default", "shown"), [(True, "on"), (False, "off")])
def test_a_bool_run_option_shows_its_default_as_on_or_off(default, shown):
    parser = argparse.ArgumentParser()
    _common.add_run_options(parser, defaults={"progress": default}, helps={"progress": "bars"})
    assert str(_helps(parser)["--progress"]).startswith(f"bars (default {shown})")
    assert parser.parse_args([]).progress is default


def test_derived_head_sizes_follow_the_width_and_explicit_ones_stay():
    parser = _parser()
    derived = ModelConfig(width=64, heads=2)  # head_dim = key_dim = 32, from the width
    config = _common.config_from_args(parser.parse_args(["--width", "32"]), derived)
    assert (config.head_dim, config.key_dim) == (16, 16)
    explicit = ModelConfig(width=64, heads=2, head_dim=16, out_proj=True)  # key_dim = 16 too
    config = _common.config_from_args(parser.parse_args(["--width", "48"]), explicit)
    assert (config.width, config.head_dim, config.key_dim) == (48, 16, 16)
    # heads need not divide the width when head_dim is given: the defaults themselves, no
    # option changed, are accepted, and a changed width keeps the head size
    uneven = ModelConfig(width=10, heads=3, head_dim=3, out_proj=True)
    assert _common.config_from_args(parser.parse_args([]), uneven) == uneven
    config = _common.config_from_args(parser.parse_args(["--width", "12"]), uneven)
    assert (config.width, config.head_dim, config.key_dim) == (12, 3, 3)


def test_an_option_the_model_ignores_is_refused_by_name():
    parser = _parser()
    with pytest.raises(UsageError, match=r"^--tau0 has no effect with"):
        _common.config_from_args(parser.parse_args(["--attention", "softmax", "--tau0", "2"]))
    with pytest.raises(UsageError, match=r"^--width must be an integer >= 1"):
        _common.config_from_args(parser.parse_args(["--width", "0"]))


_INPUT = ["--width", "8", "--depth", "2", "--no-progress"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "1"], "--tokens must be an integer >= 2, got 1"),
        (["--samples", "0"], "--samples must be an integer >= 1, got 0"),
        (["--scale", "0"], "--scale must be a finite number > 0, got 0.0"),
        (["--scale", "-1"], "--scale must be a finite number > 0, got -1.0"),
        (["--scale", "inf"], "--scale must be a finite number > 0, got inf"),
        (["--scale", "nan"], "--scale must be a finite number > 0, got nan"),
        (["--tokens", "9"], "--tokens"),  # more tokens than the width
        (["--rho0", "1"], "--rho0 must be in"),
        (["--out", "V.csv"], "--out must be a .nc file, got 'V.csv'"),
        (["--threads", "0"], "--threads must be in [1, "),
    ],
)
def test_run_setup_refuses_a_value_just_outside_its_bound(argv, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        _common.run_setup(_parser().parse_args([*_INPUT, *argv]))


@pytest.mark.parametrize(
    ("argv", "tokens", "scale"),
    [
        (["--tokens", "2", "--samples", "1"], 2, 1.0),  # the minima
        (["--tokens", "8"], 8, 1.0),  # as many tokens as the width
        (["--scale", "0.5"], 4, 0.5),
        (["--scale", "1e-300"], 4, 1e-300),
        (["--scale", "1e300"], 4, 1e300),
    ],
)
def test_run_setup_accepts_the_bounds(argv, tokens, scale):
    import torch

    config, V0, options = _common.run_setup(_parser().parse_args([*_INPUT, *argv]))
    assert (config.width, config.depth) == (8, 2)
    rho0 = torch.full((tokens, tokens), 0.2, dtype=torch.float64).fill_diagonal_(1.0)
    assert torch.equal(V0, scale * rho0)
    assert options == {"seed": 0, "dtype": torch.float64, "progress": False}


def test_run_setup_checks_the_out_file(tmp_path):
    out = tmp_path / "V.nc"
    out.write_text("earlier")
    with pytest.raises(UsageError, match="exists; pass --overwrite"):
        _common.run_setup(_parser().parse_args([*_INPUT, "--out", str(out)]))
    _common.run_setup(_parser().parse_args([*_INPUT, "--out", str(out), "--overwrite"]))
    assert out.read_text() == "earlier"  # checked, not written


def test_check_output_file(tmp_path):
    new = tmp_path / "a" / "b" / "V.nc"
    assert _common.check_output_file(str(new), False) == new  # its folders are made later
    existing = tmp_path / "V.nc"
    existing.write_text("x")
    with pytest.raises(UsageError, match=r"^--figure .*V\.nc exists; pass --overwrite"):
        _common.check_output_file(existing, False, "--figure")
    assert _common.check_output_file(existing, True) == existing
    with pytest.raises(UsageError, match="is a folder; give a file name"):
        _common.check_output_file(tmp_path, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["V.nc"]  # the probe file is gone


@pytest.mark.parametrize("check", [_common.check_output_file, _common.check_output_folder])
def test_an_unwritable_place_is_refused_naming_the_nearest_existing_folder(check):
    """/proc exists and os.access calls it writable for root; its missing folders are skipped."""
    path = "/proc/shapedtx-test/x/out"
    with pytest.raises(UsageError, match=f"^--out {path}: cannot write in /proc "):
        check(Path(path), False)


def test_check_output_folder(tmp_path):
    _common.check_output_folder(tmp_path / "new" / "run", False)
    empty = tmp_path / "empty"
    empty.mkdir()
    _common.check_output_folder(empty, False)
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    with pytest.raises(UsageError, match=r"^--store .* already holds files; pass --overwrite"):
        _common.check_output_folder(used, False, "--store")
    _common.check_output_folder(used, True)
    with pytest.raises(UsageError, match="is a file; give a folder"):
        _common.check_output_folder(used / "summary.json", True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "used"]


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_a_staged_folder_replaces_the_output_whole_with_the_umasks_mode(tmp_path, umask_027):
    out = tmp_path / "a" / "b" / "run"  # missing parents are made
    with _common.staged_folder(out) as staging:
        assert staging.parent == out.parent and staging.name.startswith(".run.partial-")
        (staging / "first.txt").write_text("1")
    assert [p.name for p in out.iterdir()] == ["first.txt"]
    assert out.stat().st_mode & 0o777 == 0o750  # 0o777 less the umask (mkdtemp's is 0o700)
    with _common.staged_folder(out) as staging:
        (staging / "second.txt").write_text("2")
    assert [p.name for p in out.iterdir()] == ["second.txt"]  # the earlier files are gone
    assert [p.name for p in out.parent.iterdir()] == ["run"]  # no staging or old folder left
    assert os.umask(0o027) == 0o027  # the umask is left as it was


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_or_interrupted_run_leaves_the_output_as_it_was(tmp_path, error):
    out = tmp_path / "run"
    out.mkdir()
    (out / "earlier.txt").write_text("kept")
    with pytest.raises(error), _common.staged_folder(out) as staging:
        (staging / "half.txt").write_text("x")
        raise error
    assert [p.name for p in out.iterdir()] == ["earlier.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # the staging folder is removed
    with pytest.raises(error), _common.staged_folder(tmp_path / "new"):
        raise error
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_an_earlier_output_that_cannot_be_removed_does_not_fail_the_run(tmp_path, monkeypatch):
    """The new output is in place; the old copy stays beside it (a file held open on a
    network file system, say), not an error after the work is done."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "held.txt").write_text("old")
    unlink = os.unlink

    def refuse_held(path, *args, **kwargs):
        if os.fspath(path).endswith("held.txt"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse_held)
    with _common.staged_folder(out) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.old-")]
