"""``shapedtx plot``: the loss curves of several ``shapedtx train`` runs in one figure."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import add_command
from ._common import UsageError, check_output_file, option_error

FORMATS = (".png", ".pdf", ".svg")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "plot", run,
        "Train (thin) and validation (markers) loss of every RUN against step in one figure "
        "(shapedtx.plot_runs), one colour per run, labelled by its folder name. Example: "
        "shapedtx plot runs/shaped runs/preln --out losses.png",
    )  # fmt: skip
    parser.add_argument("runs", nargs="+", metavar="RUN", help="`shapedtx train` --out folder")
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        help="legend label of a run, once per RUN in order (default: the folder names)",
    )
    parser.add_argument("--out", required=True, help=f"figure file ({', '.join(FORMATS)})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix not in FORMATS:
        raise UsageError(f"--out must end in {', '.join(FORMATS)}, got {args.out!r}")
    check_output_file(out, args.overwrite)
    if args.label is not None and len(args.label) != len(args.runs):
        raise UsageError(
            f"--label must be given once per RUN ({len(args.runs)}), got {len(args.label)}"
        )
    from shapedtx.files import atomic_path
    from shapedtx.training.plots import plot_runs

    runs = dict(zip(args.label, args.runs, strict=True)) if args.label else args.runs
    if args.label and len(set(args.label)) < len(args.label):
        raise UsageError("--label must not repeat a label")
    try:
        figure = plot_runs(runs)
    except ValueError as err:
        raise option_error(err, renamed={"runs": "RUN"}) from None  # runs[1] -> RUN[1]
    with atomic_path(out) as tmp:
        figure.savefig(tmp, format=out.suffix[1:], dpi=120)
    print(f"wrote {out}: {len(args.runs)} runs")
    return 0
