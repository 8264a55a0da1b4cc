"""``shapedtx sde``: solve the limiting covariance SDE (``sde.solve``) for many paths."""

from __future__ import annotations

import argparse
import math

from . import SUBCOMMANDS
from ._common import (
    SDE_METHODS,
    add_config_arguments,
    add_input_arguments,
    add_run_arguments,
    run_setup,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sde",
        help=SUBCOMMANDS["sde"],
        description="Solve dV = b(V) dt + Sigma(V)^{1/2} dB (docs/theory.md#sde) for many paths "
        "from an equicorrelated V0 up to T (default depth / width); prints the mean "
        "correlation and the fraction of exploded paths, optionally writes the Dataset.",
    )
    add_config_arguments(parser)
    g = parser.add_argument_group("SDE")
    add_input_arguments(g, what="paths")
    g.add_argument("--T", type=float, default=None, help="time horizon (default depth/width)")
    g.add_argument("--dt", type=float, default=0.01, help="step size (default 0.01)")
    g.add_argument("--method", choices=SDE_METHODS, default="euler")
    g.add_argument("--bound", type=float, default=1e8, help="explosion bound x max V0^aa")
    add_run_arguments(g)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, V0, options = run_setup(args)  # a usage error is raised before torch loads
    from sde import solve
    from shapedtx.results import save_dataset, with_metrics

    ds = solve(
        config, V0, args.samples, T=args.T, dt=args.dt, method=args.method, bound=args.bound,
        options=options, warn=False,  # the exploded fraction is printed below
    )  # fmt: skip
    ok = ~ds["exploded"]
    mean_rho = with_metrics(ds)["mean_rho"].where(ok).mean("sample")
    picks = sorted({round(i * (ds.sizes["t"] - 1) / 4) for i in range(5)})
    summary = ", ".join(f"{ds['t'].values[i]:.3g}: {mean_rho.values[i]:.4f}" for i in picks)
    fraction = ds.attrs["exploded_fraction"]
    print(
        f"sde[{args.method}] m={args.tokens} samples={args.samples} T={ds.attrs['T']:.4g} "
        f"dt={ds.attrs['dt']:.4g}: mean rho by t {{{summary}}}"
    )
    print(
        f"exploded fraction: {fraction:.4g} ({int(ds['exploded'].values.sum())} of "
        f"{args.samples} paths frozen and flagged)"
        + ("" if math.isclose(fraction, 0.0) else "; mean rho above excludes them")
    )
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    return 0
