"""The command line in pipelines and its start-up cost (issue 39)."""

from __future__ import annotations

import subprocess
import sys

from simulations.cli import BROKEN_PIPE

ENTRY = "import sys; from simulations.cli import main; sys.exit(main(sys.argv[1:]))"


def test_a_closed_pipe_exits_quietly():
    """`shapedtx design --table gpt3 | head -0`: no "Broken pipe" error, exit 128 + SIGPIPE
    (not 1, which advise uses for "no candidate passes")."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "design", "--table", "gpt3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE == 141
    assert err == ""


def _modules_after(argv: list[str]) -> tuple[int, set[str]]:
    code = (
        "import sys\nfrom simulations.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as exit_:\n    code = exit_.code\n"
        "heavy = ('torch', 'numpy', 'scipy', 'xarray', 'matplotlib', 'distributed', 'numba')\n"
        "sys.stderr.write('MODULES ' + ','.join(m for m in heavy if m in sys.modules) + '\\n')\n"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES"))
    return done.returncode, set(filter(None, line.split(" ", 1)[1].split(",")))


def test_help_and_usage_errors_do_not_import_torch():
    """Issue 39: `shapedtx --help` took 6-9 s, most of it importing torch and the packages;
    the top-level help and usage errors now import none of the heavy libraries."""
    for argv, code in ((["--help"], 0), (["bogus"], 2), (["--bogus"], 2), ([], 0)):
        rc, heavy = _modules_after(argv)
        assert rc == code and not heavy, (argv, heavy)
    rc, heavy = _modules_after(["probe", "--bogus"])  # a light command's own usage error
    assert rc == 2 and "torch" not in heavy


def test_every_subcommand_is_listed_and_registers_its_own_help():
    import argparse

    from simulations.cli import SUBCOMMANDS, build_parser

    parser = build_parser()  # every module
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subparsers._choices_actions}
    assert helps == SUBCOMMANDS
