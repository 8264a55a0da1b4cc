"""``shapedtx sweep``: run a parameter grid from a TOML file on Dask (``simulations.sweep``).

The file has a ``[grid]`` table (parameter = value, or = [values] for a grid dimension) and
optionally ``kind = "network" | "sde" | "both"``; see ``examples/sweep_grid.toml``.
Exit code 0 when every point is done, 1 when some failed (listed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import add_command
from ._common import RunArgs, UsageError, add_run_options, check_output_folder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = ("network", "sde", "both")
_FILE_KEYS = ("grid", "kind")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "sweep", run,
        "Run every point of the grid in GRID.toml as a Dask task (embedded local cluster, or any "
        "cluster via --scheduler) into one resumable zarr store: run the same command again to "
        "finish an interrupted sweep. Read the results with xarray.open_zarr(STORE) or "
        "simulations.open_sweep(STORE).",
    )  # fmt: skip
    parser.add_argument("grid", metavar="GRID.toml", help="grid file ([grid] table, kind)")
    parser.add_argument("--store", required=True, help="zarr store directory (created/resumed)")
    parser.add_argument("--kind", choices=KINDS, default=None, help="overrides the file's kind")
    parser.add_argument(
        "--scheduler", default=None, metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="embedded cluster worker processes (default 2)"
    )
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument(
        "--no-retry-failed", action="store_true", help="do not rerun points that failed before"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="delete an existing sweep store at --store and start afresh (by default a store "
        "of the same sweep is resumed and one of another sweep refused)",
    )
    # the seed is a grid parameter; the workers' threads are --threads-per-worker
    add_run_options(
        parser, exclude=("seed", "threads"), helps={"device": "torch device on the workers"}
    )


def _read_grid(path: str) -> tuple[dict[str, Any], str | None]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as err:
        raise UsageError(f"cannot read {path!r}: {err.strerror or err}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path!r} is not valid TOML: {err}") from None
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise UsageError(f"{path!r}: unknown keys {unknown}; expected a [grid] table and kind")
    grid = data.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise UsageError(f"{path!r} needs a non-empty [grid] table")
    kind = data.get("kind")
    if kind is not None and kind not in KINDS:
        raise UsageError(f"{path!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return grid, kind


_SHUTDOWN_ERRORS = ("CommClosedError", "StreamClosedError")


class _ShutdownNoise(logging.Filter):
    """Drops the log records of a connection closed under Dask at shutdown (``CommClosedError``,
    ``StreamClosedError``: the scheduler went away before a client or worker callback ran; the
    results are complete and already stored). Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        chain: list[str] = []
        while exc is not None and len(chain) < 10:
            chain.append(type(exc).__name__)
            exc = exc.__cause__ or exc.__context__
        text = record.getMessage()
        return not any(name in chain or name in text for name in _SHUTDOWN_ERRORS)


def _install_quiet_shutdown() -> Callable[[], None]:
    """Install :class:`_ShutdownNoise` in this process and return the function that removes
    it: on the handlers of the ``distributed`` and root loggers, on the loggers that report
    callback and task errors (``tornado.application``, ``asyncio``) and on logging's
    last-resort handler; an unraisable ``CommClosedError`` at garbage collection is dropped
    too."""
    noise = _ShutdownNoise()
    targets: list[logging.Filterer] = [
        logging.getLogger(name) for name in ("distributed", "tornado.application", "asyncio")
    ]
    for name in ("distributed", ""):
        targets += logging.getLogger(name).handlers
    if logging.lastResort is not None:
        targets.append(logging.lastResort)
    previous_hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        if type(info.exc_value).__name__ not in _SHUTDOWN_ERRORS:
            previous_hook(info)

    for target in targets:
        target.addFilter(noise)
    sys.unraisablehook = unraisable

    def remove() -> None:
        for target in targets:
            target.removeFilter(noise)
        sys.unraisablehook = previous_hook

    return remove


@contextmanager
def quiet_shutdown() -> Iterator[None]:
    """Silence distributed's shutdown noise (:class:`_ShutdownNoise`) within the block."""
    remove = _install_quiet_shutdown()
    try:
        yield
    finally:
        remove()


_QUIET: list[bool] = []  # installed for this process by `shapedtx sweep`


def run(args: argparse.Namespace) -> int:
    import distributed  # noqa: F401  # its logging handlers exist before the filter

    if not _QUIET:  # for the rest of the process: Dask's shutdown runs on after the command
        _install_quiet_shutdown()  # (atexit), where the CommClosedError traceback came from
        _QUIET.append(True)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from shapedtx.options import DTYPES
    from simulations import sweep
    from simulations.formatting import format_sweep

    settings = RunArgs.from_args(args)
    grid, file_kind = _read_grid(args.grid)
    kind = args.kind or file_kind or "network"
    if args.scheduler is not None and args.workers is not None:
        raise UsageError("--workers sets the embedded cluster; omit it with --scheduler")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.threads_per_worker < 1:
        raise UsageError(f"--threads-per-worker must be >= 1, got {args.threads_per_worker}")
    if Path(args.store).exists() and not Path(args.store).is_dir():
        raise UsageError(f"--store must be a directory, got the file {args.store!r}")
    # in a writable place; its content (resume, refuse, overwrite) is checked by the library
    check_output_folder(Path(args.store), overwrite=True, option="--store")
    if settings.device is not None:
        settings.torch_device()  # a bad device is a usage error here, not a failure of every point
    client = None
    if args.scheduler is not None:
        from distributed import Client
        from distributed.comm import get_address_host_port, parse_address

        try:  # a malformed address first: a Client that fails on it waits 40 s to close
            if parse_address(args.scheduler)[0] != "inproc":  # in-process: no host and port
                get_address_host_port(args.scheduler)
            client = Client(args.scheduler, timeout="20s", set_as_default=False)
        except (OSError, ValueError, TimeoutError) as err:
            raise UsageError(f"--scheduler {args.scheduler}: {err}") from None
    try:
        summary = sweep(
            grid,
            store=args.store,
            kind=kind,
            client=client,
            workers=args.workers,
            threads_per_worker=args.threads_per_worker,
            dtype=DTYPES[settings.dtype],
            device=settings.device,
            retry_failed=not args.no_retry_failed,
            overwrite=args.overwrite,
            progress=settings.progress,
        )
    finally:
        if client is not None:
            client.close()
    print(format_sweep(summary, kind))
    return 1 if summary.failed else 0
