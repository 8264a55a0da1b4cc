"""The ``shapedtx`` command. Each subcommand lives in its own module with a ``register``
function; bad input gives a one-line error and exit code 2 (never a traceback)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from shapedtx import __version__

from ._common import ArgumentParser, UsageError, option_error

# Subcommand modules of this package, in --help order, with their one-line help (the one
# source: each module's register() uses it). Only the module of the command being run is
# imported, so that `shapedtx --help` and usage errors stay fast (no torch).
SUBCOMMANDS: dict[str, str] = {
    "simulate": "simulate the token covariance of random networks at initialisation",
    "sde": "solve the neural covariance SDE (the infinite-width, depth/width = T limit)",
    "train": "train a causal byte-level language model",
    "plot": "loss curves of several training runs in one figure",
    "probe": "token covariance of a trained checkpoint",
    "design": "recommended depth/width for a parameter budget; GPT-3 table",
    "advise": "choose gamma and tau0 for a width, depth and sequence length from the SDE",
    "sweep": "run a parameter grid (simulate and/or SDE) on Dask into a zarr store",
    "compare": "finite network vs SDE limit, convergence in width, rank-collapse report",
    "stability": "stability map over (gamma, tau0): network vs SDE, when V leaves a region",
}


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    description: str,
    **kwargs: Any,
) -> ArgumentParser:
    """The parser of subcommand ``name`` (its help line from :data:`SUBCOMMANDS`), which runs
    ``run(args)``; ``kwargs`` go to argparse (e.g. ``formatter_class``)."""
    parser = subparsers.add_parser(name, help=SUBCOMMANDS[name], description=description, **kwargs)
    parser.set_defaults(func=run)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (its first argument that is not an option)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def build_parser(command: str | None = None) -> ArgumentParser:
    """The ``shapedtx`` parser: every subcommand with its help line, and the full options of
    ``command`` (all of them when None: their modules are imported)."""
    parser = ArgumentParser(
        prog="shapedtx",
        description="Shaped Transformers: simulate, solve the SDE, compare, train, design, advise.",
    )
    parser.add_argument("--version", action="version", version=f"shapedtx {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name, summary in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"{__name__}.{name}").register(sub)
        else:  # named in --help; its options are built when it is the command run
            sub.add_parser(name, help=summary)
    return parser


def _option_dests(parser: ArgumentParser, command: str) -> list[str]:
    """The parameters of ``command`` that have an option ``--name-with-dashes``."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = subparsers.choices[command]._actions
    return [a.dest for a in actions if "--" + a.dest.replace("_", "-") in a.option_strings]


def _one_line_warnings(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``shapedtx COMMAND: warning: MESSAGE``, one line
    (not Python's file, line and source)."""

    def show(message: Warning | str, *args: object, **kwargs: object) -> None:
        text = str(message).replace("\n", " ")
        sys.stderr.write(f"shapedtx {command}: warning: {text}\n")

    return show


BROKEN_PIPE = 128 + 13
"""Exit status when stdout's reader has gone (``shapedtx ... | head``): 128 + SIGPIPE, what a
shell reports for a Unix tool that a broken pipe stopped (not 1, which ``advise`` uses)."""


def _broken_pipe() -> int:
    """Point stdout at /dev/null, so that the interpreter's final flush cannot fail again
    (Python's documented recipe), and return :data:`BROKEN_PIPE`; nothing is printed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (e.g. captured)
        pass
    return BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv) or "")
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0
    try:
        with warnings.catch_warnings():  # restores the printer afterwards
            warnings.showwarning = _one_line_warnings(args.command)
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # `shapedtx ... | head`: the reader has gone; stop quietly
        return _broken_pipe()
    except (ValueError, UsageError) as err:
        if not isinstance(err, UsageError):  # a library message: name the option, not the field
            err = option_error(err, _option_dests(parser, args.command))
        sys.stderr.write(f"shapedtx {args.command}: error: {err}\n")
        return 2
    except (MemoryError, RuntimeError) as err:  # sizes too large for this machine
        if not isinstance(err, MemoryError) and "allocate" not in str(err):
            raise
        sys.stderr.write(
            f"shapedtx {args.command}: error: not enough memory for these sizes ("
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}); lower --samples, "
            "--depth, --width or the batch sizes\n"
        )
        return 2
    except OSError as err:  # e.g. the disk filled or an output became unwritable mid-run
        sys.stderr.write(f"shapedtx {args.command}: error: {err}\n")
        return 1
    except KeyboardInterrupt:  # outputs are atomic: nothing half-written is left behind
        sys.stderr.write(f"shapedtx {args.command}: interrupted; no partial output was kept\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
