"""``shapedtx simulate``: token covariances of random finite networks (``simulations``)."""

from __future__ import annotations

import argparse

from . import SUBCOMMANDS
from ._common import (
    add_config_arguments,
    add_input_arguments,
    add_method_argument,
    add_run_arguments,
    run_setup,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help=SUBCOMMANDS["simulate"],
        description="Draw random networks at initialisation (equicorrelated input covariance) "
        "and record V_l = X_l X_l^T / n after every block; prints the mean correlation at a "
        "few layers and optionally writes the covariance Dataset to a netCDF file.",
    )
    add_config_arguments(parser)
    g = parser.add_argument_group("simulation")
    add_input_arguments(g)
    add_method_argument(g)
    add_run_arguments(g)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, V0, options = run_setup(args)  # a usage error is raised before torch loads
    from shapedtx.results import save_dataset, with_metrics
    from simulations import simulate

    ds = simulate(config, V0, args.samples, method=args.method, options=options)
    mean_rho = with_metrics(ds)["mean_rho"].mean("sample")
    depth = config.depth
    layers = sorted({0, depth // 4, depth // 2, (3 * depth) // 4, depth})
    summary = ", ".join(f"{layer}: {mean_rho.values[layer]:.4f}" for layer in layers)
    print(
        f"simulate[{ds.attrs['method']}] width={config.width} depth={depth} m={args.tokens} "
        f"samples={args.samples}: mean rho by layer {{{summary}}}"
    )
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    return 0
