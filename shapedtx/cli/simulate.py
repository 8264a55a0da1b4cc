"""``shapedtx simulate``: token covariances of random finite networks (``simulations``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ._common import UsageError, add_config_arguments, config_from_args

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def register(subparsers: argparse._SubParsersAction) -> None:
    from simulations import SAMPLERS

    parser = subparsers.add_parser(
        "simulate",
        help="simulate the token covariance of random networks at initialisation",
        description="Draw random networks at initialisation (equicorrelated input covariance) "
        "and record V_l = X_l X_l^T / n after every block; prints the mean correlation at a "
        "few layers and optionally writes the covariance Dataset to a netCDF file.",
    )
    add_config_arguments(parser)
    g = parser.add_argument_group("simulation")
    g.add_argument("--tokens", type=int, default=4, help="m, number of tokens (default 4)")
    g.add_argument("--rho0", type=float, default=0.2, help="initial correlation (default 0.2)")
    g.add_argument("--scale", type=float, default=1.0, help="initial V^{aa} (default 1)")
    g.add_argument("--samples", type=int, default=256, help="number of networks (default 256)")
    g.add_argument("--method", choices=tuple(SAMPLERS), default="exact")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulations import equicorrelated, simulate

    from ..results import save_dataset, with_metrics

    config = config_from_args(args)
    if args.out is not None and Path(args.out).suffix != ".nc":
        raise UsageError(f"--out must be a .nc file, got {args.out!r}")
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device) if args.device is not None else torch.device("cpu")
    except RuntimeError as err:
        raise UsageError(f"--device: {err}") from None
    V0 = equicorrelated(args.tokens, args.rho0, args.scale, device=device)
    ds = simulate(
        config,
        V0,
        args.samples,
        method=args.method,
        seed=args.seed,
        device=device,
        dtype=DTYPES[args.dtype],
        progress=False if args.no_progress else None,
    )
    mean_rho = with_metrics(ds)["mean_rho"].mean("sample")
    depth = config.depth
    layers = sorted({0, depth // 4, depth // 2, (3 * depth) // 4, depth})
    summary = ", ".join(f"{layer}: {mean_rho.values[layer]:.4f}" for layer in layers)
    print(
        f"simulate[{args.method}] width={config.width} depth={depth} m={args.tokens} "
        f"samples={args.samples}: mean rho by layer {{{summary}}}"
    )
    if ds.attrs["nonfinite"]:
        print(f"warning: {ds.attrs['nonfinite']} samples have non-finite covariances")
    if args.out is not None:
        print(f"wrote {save_dataset(ds, args.out)}")
    return 0
