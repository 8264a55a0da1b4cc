"""``shapedtx sde``: solve the limiting covariance SDE (``sde.solve``) for many paths."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ._common import UsageError, add_config_arguments, config_from_args

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def register(subparsers: argparse._SubParsersAction) -> None:
    from sde import METHODS

    parser = subparsers.add_parser(
        "sde",
        help="solve the neural covariance SDE (the infinite-width, depth/width = T limit)",
        description="Solve dV = b(V) dt + Sigma(V)^{1/2} dB (THEORY section 3) for many paths "
        "from an equicorrelated V0 up to T (default depth / width); prints the mean "
        "correlation and the fraction of exploded paths, optionally writes the Dataset.",
    )
    add_config_arguments(parser)
    g = parser.add_argument_group("SDE")
    g.add_argument("--tokens", type=int, default=4, help="m, number of tokens (default 4)")
    g.add_argument("--rho0", type=float, default=0.2, help="initial correlation (default 0.2)")
    g.add_argument("--scale", type=float, default=1.0, help="initial V^{aa} (default 1)")
    g.add_argument("--samples", type=int, default=256, help="number of paths (default 256)")
    g.add_argument("--T", type=float, default=None, help="time horizon (default depth/width)")
    g.add_argument("--dt", type=float, default=0.01, help="step size (default 0.01)")
    g.add_argument("--method", choices=METHODS, default="euler")
    g.add_argument("--bound", type=float, default=1e8, help="explosion bound x max V0^aa")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sde import solve

    from ..covariance import equicorrelated
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
    ds = solve(
        config,
        V0,
        args.samples,
        T=args.T,
        dt=args.dt,
        method=args.method,
        seed=args.seed,
        device=device,
        dtype=DTYPES[args.dtype],
        bound=args.bound,
        progress=False if args.no_progress else None,
    )
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
