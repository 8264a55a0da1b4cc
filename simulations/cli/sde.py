"""``shapedtx sde``: solve the limiting covariance SDE (``sde.solve``) for many paths."""

from __future__ import annotations

import argparse

from . import add_command
from ._common import (
    SDE_METHODS,
    add_config_arguments,
    add_input_arguments,
    add_output_arguments,
    add_run_options,
    run_setup,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "sde", run,
        "Solve dV = b(V) dt + Sigma(V)^{1/2} dB (docs/theory.md#sde) for many paths from an "
        "equicorrelated V0 up to T (default depth / width); prints the mean correlation and "
        "the fraction of exploded paths, optionally writes the Dataset.",
    )  # fmt: skip
    add_config_arguments(parser)
    g = parser.add_argument_group("SDE")
    add_input_arguments(g, what="paths")
    g.add_argument("--T", type=float, default=None, help="time horizon (default depth/width)")
    g.add_argument("--dt", type=float, default=0.01, help="step size (default 0.01)")
    g.add_argument("--method", choices=SDE_METHODS, default="euler")
    g.add_argument("--bound", type=float, default=1e8, help="explosion bound x max V0^aa")
    add_output_arguments(g)
    add_run_options(parser)


def run(args: argparse.Namespace) -> int:
    config, V0, options = run_setup(args)  # a usage error is raised before torch loads
    from sde import solve
    from shapedtx.results import save_dataset
    from simulations.formatting import format_sde

    ds = solve(
        config, V0, args.samples, T=args.T, dt=args.dt, method=args.method, bound=args.bound,
        **options, warn=False,  # the exploded fraction is printed
    )  # fmt: skip
    print(format_sde(ds))
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    return 0
