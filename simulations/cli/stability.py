"""``shapedtx stability``: the stability map over (gamma, tau0), network and SDE side by side
(``simulations.stability_map``; conventions: docs/guide/stability.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import add_command
from ._common import (
    UsageError,
    add_config_arguments,
    add_input_arguments,
    add_method_argument,
    add_run_options,
    check_output_file,
    option_error,
    run_setup,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "stability", run,
        "For every (gamma, tau0) of a grid, the median first t = layer / width at which an "
        "eigenvalue of V leaves [low, high] (default [1e-4, 1e4]), capped at --T-max, from "
        "finite networks (simulations.simulate) and from the covariance SDE; prints both maps, "
        "the censored fractions and the agreement (cells within 10%, worst cell), optionally "
        "writes the Dataset and the figure. The model's depth, gamma and tau0 are set by the "
        "map (depth = ceil(T_max * width)).",
    )  # fmt: skip
    add_config_arguments(parser, exclude=("depth", "gamma", "tau0"))
    g = parser.add_argument_group("stability map")
    add_input_arguments(g, what="networks and SDE paths per cell")
    g.add_argument("--gammas", default="0.05,0.1,0.2,0.4,0.7,1",
                   help="comma-separated gammas (default 0.05,0.1,0.2,0.4,0.7,1)")  # fmt: skip
    g.add_argument("--tau0s", default="0.05,0.1,0.25,0.5,1,2.5",
                   help="comma-separated tau0s (default 0.05,0.1,0.25,0.5,1,2.5)")  # fmt: skip
    g.add_argument("--T-max", type=float, default=1.0, help="cap on t (default 1)")
    g.add_argument("--dt", type=float, default=None, help="SDE step (default min(0.01, T/100))")
    g.add_argument("--low", type=float, default=1e-4, help="region's lower end (default 1e-4)")
    g.add_argument("--high", type=float, default=1e4, help="region's upper end (default 1e4)")
    g.add_argument("--sde-only", action="store_true", help="skip the finite networks")
    add_method_argument(g)
    g.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    g.add_argument("--figure", default=None, help="write the figure (PNG and PDF) to this path")
    g.add_argument("--overwrite", action="store_true", help="replace existing output files")
    add_run_options(parser)


def _grid(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    gammas, tau0s = _grid(args.gammas, "--gammas"), _grid(args.tau0s, "--tau0s")
    config, V0, options = run_setup(args)  # a usage error is raised before torch loads
    if args.figure is not None and not args.overwrite:
        for suffix in (".png", ".pdf"):
            check_output_file(Path(args.figure).with_suffix(suffix), False, "--figure")
    from shapedtx.results import save_dataset
    from simulations.formatting import format_stability_map
    from simulations.stability import plot_stability_map, stability_map

    try:
        ds = stability_map(
            config, V0, gammas, tau0s, T_max=args.T_max, samples=args.samples,
            method=args.method, dt=args.dt, low=args.low, high=args.high, seed=options["seed"],
            dtype=options["dtype"], network=not args.sde_only, progress=options["progress"],
        )  # fmt: skip
    except ValueError as err:
        names = ("gammas", "tau0s", "samples", "dt", "low", "high", "method")
        raise option_error(err, names, renamed={"T_max": "--T-max"}) from None
    print(format_stability_map(ds))
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    if args.figure is not None:
        plot_stability_map(ds, args.figure)
        print(f"wrote {args.figure} (.png, .pdf)")
    return 0
