"""``shapedtx simulate``: token covariances of random finite networks (``simulations``)."""

from __future__ import annotations

import argparse

from . import add_command
from ._common import (
    add_config_arguments,
    add_input_arguments,
    add_method_argument,
    add_output_arguments,
    add_run_options,
    run_setup,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "simulate", run,
        "Draw random networks at initialisation (equicorrelated input covariance) and record "
        "V_l = X_l X_l^T / n after every block; prints the mean correlation at a few layers and "
        "optionally writes the covariance Dataset to a netCDF file.",
    )  # fmt: skip
    add_config_arguments(parser)
    g = parser.add_argument_group("simulation")
    add_input_arguments(g)
    add_method_argument(g)
    add_output_arguments(g)
    add_run_options(parser)


def run(args: argparse.Namespace) -> int:
    config, V0, options = run_setup(args)  # a usage error is raised before torch loads
    from shapedtx.results import save_dataset
    from simulations import simulate
    from simulations.formatting import format_simulation

    ds = simulate(config, V0, args.samples, method=args.method, **options)
    print(format_simulation(ds))
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    return 0
