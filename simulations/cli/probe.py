"""``shapedtx probe``: token covariance of a saved ``shapedtx train`` checkpoint
(:func:`shapedtx.training.probing.probe_run`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import add_command
from ._common import RunArgs, UsageError, add_run_options, check_output_file, option_error

_DATA_OPTIONS = {
    "path": "--data",
    "suffix": "--suffix",
    "max_bytes": "--max-bytes",
    "val_fraction": "--val-fraction",
}
"""probe_run's data settings and their options."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "probe", run,
        "Rebuild the language model of a `shapedtx train` run from RUN/log.nc and "
        "RUN/checkpoint.pt, run it on fixed validation windows (the trainer's metrics batch) and "
        "record the token covariance after every block (shapedtx.probe): the covariance Dataset "
        "V(sample, t, token_a, token_b), one sample per window. Prints a one-line collapse "
        "summary.",
    )  # fmt: skip
    parser.add_argument("run", help="output folder of `shapedtx train` (log.nc, checkpoint.pt)")
    parser.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--windows", type=int, default=None, help="validation windows (default: metrics_batch)"
    )
    parser.add_argument("--threshold", type=float, default=0.99, help="collapse threshold")
    g = parser.add_argument_group(
        "data (default: the run's, from RUN/data.json; for runs without it the run's corpus "
        "and size with train's defaults)"
    )
    g.add_argument("--data", default=None, help="text file or folder")
    g.add_argument("--suffix", default=None)
    g.add_argument("--max-bytes", type=int, default=None)
    g.add_argument("--val-fraction", type=float, default=None)
    # deterministic, without a progress bar, in the run's dtype (RUN/log.nc)
    add_run_options(parser, exclude=("seed", "dtype", "progress"))


def run(args: argparse.Namespace) -> int:
    settings = RunArgs.from_args(args)  # the torch-free checks first
    if args.out is not None:
        if Path(args.out).suffix != ".nc":
            raise UsageError(f"--out must be a .nc file, got {args.out!r}")
        check_output_file(args.out, args.overwrite)
    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold must be in (0, 1), got {args.threshold}")
    from shapedtx.results import save_dataset
    from shapedtx.training.probing import DataMismatch, probe_run
    from simulations.formatting import format_probe

    settings.apply_threads()
    data = {k: getattr(args, "data" if k == "path" else k) for k in _DATA_OPTIONS}
    try:
        ds = probe_run(args.run, windows=args.windows, device=settings.torch_device(), **data)
    except DataMismatch as err:
        how = "pass the data options as given to `shapedtx train`"
        raise UsageError(err.describe(_DATA_OPTIONS, how)) from None
    except ValueError as err:
        raise option_error(err, ("windows",), renamed={"folder": "RUN", **_DATA_OPTIONS}) from None
    print(format_probe(ds, args.threshold))
    if args.out is not None:
        save_dataset(ds, args.out)
        print(f"wrote {args.out}")
    return 0
