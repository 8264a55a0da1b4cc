"""The run options (--seed --device --dtype --threads --progress) are written once, as the
fields of ``simulations.cli._common.RunArgs``, and generated into every subcommand that
computes (issue 36, item 4); the printed reports come from one module,
``simulations.formatting``."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.cli import SUBCOMMANDS, _common, build_parser, main

NOT_COMPUTING = {"design", "plot"}  # closed-form tables and a figure of saved logs
COMPUTING = sorted(set(SUBCOMMANDS) - NOT_COMPUTING)  # a new subcommand computes by default

# The run options a computing subcommand leaves out (with why): every other field of RunArgs
# must be an option of each (a command not listed takes them all).
EXCLUDED: dict[str, set[str]] = {
    "advise": {"device", "dtype"},  # simulations.advise screens on the CPU in float64
    "probe": {"seed", "dtype", "progress"},  # deterministic, the run's dtype, no progress bar
    "sweep": {"seed", "threads"},  # the seed is a grid parameter; --threads-per-worker
}

# The documented defaults that differ from RunArgs' own (README, docs/guide, --help).
DEFAULTS: dict[str, dict[str, object]] = {
    "compare": {"threads": min(2, os.cpu_count() or 1)},
    "train": {"dtype": "float32", "progress": True},
}

# The arguments a computing command requires (none where not listed).
REQUIRED: dict[str, list[str]] = {
    "compare": ["--out", "{tmp}/out"],
    "train": ["--out", "{tmp}/run"],
    "advise": ["--width", "64", "--depth", "8", "--tokens", "4"],
    "probe": ["{tmp}/no-run"],
    "sweep": ["{tmp}/grid.toml", "--store", "{tmp}/store"],
}


def _parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def test_the_lists_name_computing_subcommands():
    assert set(SUBCOMMANDS) >= NOT_COMPUTING
    assert set(EXCLUDED) | set(REQUIRED) <= set(COMPUTING)
    assert {"simulate", "sde", "compare", "train", "probe", "advise", "sweep"} <= set(COMPUTING)


@pytest.mark.parametrize("command", COMPUTING)
def test_computing_subcommands_take_the_shared_run_options(command):
    """Same names, types, choices and kinds everywhere, all in the one "run" group, with the
    documented defaults; the fields a command leaves out are exactly those listed."""
    parser = _parser(command)
    options = _options(parser)
    run_group = next(g for g in parser._action_groups if g.title == "run")
    in_group = {s for a in run_group._group_actions for s in a.option_strings}
    for f in dataclasses.fields(_common.RunArgs):
        flag = "--" + f.name.replace("_", "-")
        if f.name in EXCLUDED.get(command, ()):
            assert flag not in options, f"{command} {flag}"
            continue
        action = options[flag]
        assert flag in in_group, f"{command} declares {flag} outside the shared definition"
        assert action.dest == f.name
        expected = DEFAULTS.get(command, {}).get(f.name, f.default)
        assert action.default == expected, (command, flag)
        if f.metadata["type"] is bool:
            assert isinstance(action, argparse.BooleanOptionalAction)
            assert options["--no-" + f.name.replace("_", "-")] is action
        else:
            assert action.type is f.metadata["type"]
    dtype = options.get("--dtype")
    if dtype is not None:
        assert set(_common.DTYPE_NAMES) <= set(dtype.choices)


def test_a_field_added_to_run_args_is_an_option_of_every_computing_subcommand(monkeypatch):
    """The field list is written once: a new RunArgs field reaches every parser (unless a
    command excludes it by name) and is read back by RunArgs.from_args."""

    @dataclasses.dataclass(frozen=True)
    class Extended(_common.RunArgs):
        trace_level: int = _common._run_field(3, int, "a new run option")

    monkeypatch.setattr(_common, "RunArgs", Extended)
    for command in COMPUTING:
        action = _options(_parser(command))["--trace-level"]
        assert (action.type, action.default) == (int, 3), command
    for command in NOT_COMPUTING:
        assert "--trace-level" not in _options(_parser(command))
    args = build_parser("simulate").parse_args(["simulate", "--trace-level", "7", "--seed", "2"])
    settings = Extended.from_args(args)
    assert (settings.trace_level, settings.seed) == (7, 2)


def test_add_run_options_refuses_names_that_are_not_fields():
    parser = argparse.ArgumentParser()
    with pytest.raises(TypeError, match="not RunArgs fields"):
        _common.add_run_options(parser, exclude=("sed",))
    with pytest.raises(TypeError, match="not RunArgs fields"):
        _common.add_run_options(parser, defaults={"thread": 2})


def test_run_args_checks_its_fields():
    from shapedtx import ParameterError

    cores = os.cpu_count() or 1
    assert _common.RunArgs(seed=3, threads=cores).threads == cores
    for bad, name in (({"seed": -1}, "seed"), ({"threads": 0}, "threads"),
                      ({"threads": cores + 1}, "threads")):  # fmt: skip
        with pytest.raises(ParameterError) as err:
            _common.RunArgs(**bad)  # type: ignore[arg-type]
        assert err.value.parameter == name and str(bad[name]) in str(err.value)


def _argv(command: str, tmp_path: Path, *extra: str) -> list[str]:
    (tmp_path / "grid.toml").write_text("[grid]\nwidth = 8\n")
    return [command, *(a.format(tmp=tmp_path) for a in REQUIRED.get(command, [])), *extra]


BAD_RUN_OPTIONS = [
    (c, o, v)
    for c in COMPUTING
    for o, v in (("seed", "-1"), ("threads", "0"))
    if o not in EXCLUDED.get(c, ())
]


@pytest.mark.parametrize(("command", "option", "value"), BAD_RUN_OPTIONS)
def test_a_bad_run_option_is_a_one_line_error_naming_it(command, option, value, tmp_path, capsys):
    code = main(_argv(command, tmp_path, f"--{option}", value))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"shapedtx {command}: error: --{option} must be"), err
    assert len(err.strip().splitlines()) == 1 and value in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml"]  # nothing written


_WRAPPER = """
import sys
from simulations.cli import main
code = main(sys.argv[1:])
print("EXIT", code, "TORCH", "torch" in sys.modules, file=sys.stderr)
"""


@pytest.mark.parametrize("command", [c for c in COMPUTING if "threads" not in EXCLUDED.get(c, ())])
def test_a_bad_run_option_loads_no_torch(command, tmp_path):
    argv = _argv(command, tmp_path, "--threads", "0")
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *argv], capture_output=True, text=True)
    assert out.stderr.strip().splitlines()[-1] == "EXIT 2 TORCH False", out.stderr


def test_no_subcommand_formats_its_own_report():
    """Every printed report and table comes from simulations.formatting: no module of the
    command line defines a format_* function or a table of its own."""
    folder = Path(_common.__file__).parent
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        own = [n for n in names if n.startswith(("format_", "_format", "_table", "table"))]
        assert not own, f"{path.name} formats output itself: {own}"


def test_formatting_table_and_numbers():
    from simulations.formatting import number, p_value, table

    assert table(("a", "bb"), [("x", 1), ("yyy", 22)]).splitlines() == [
        "a    bb",
        "---  --",
        "x     1",
        "yyy  22",
    ]
    assert [number(v) for v in (0.123456, None, float("inf"), float("nan"))] == [
        "0.123", "nan", "inf", "nan"
    ]  # fmt: skip
    assert number(0.5, fixed=True) == " 0.500" and number(None, fixed=True) == "   nan"
    assert [p_value(v) for v in (None, 0.9995, 0.5, 0.001234)] == ["nan", "> 0.999", "0.500",
                                                                    "0.0012"]  # fmt: skip


def test_run_args_applies_threads_and_builds_the_librarys_options():
    """--threads sets torch's threads (none given: left alone), the device defaults to cpu,
    and the library's run keywords carry seed, dtype and progress."""
    import torch

    before = torch.get_num_threads()
    try:
        _common.RunArgs(threads=1).apply_threads()
        assert torch.get_num_threads() == 1
        torch.set_num_threads(before)
        _common.RunArgs().apply_threads()
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
    assert _common.RunArgs().torch_device() == torch.device("cpu")
    keywords = _common.RunArgs(seed=4, dtype="float32", progress=False).run_keywords()
    assert keywords == {"seed": 4, "dtype": torch.float32, "progress": False}
