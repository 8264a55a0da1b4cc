"""Shared pieces of the command line: one-line errors and the ModelConfig options."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import torch

from ..config import ATTENTIONS, MLPS, NORMS, ModelConfig

DTYPES = {"float64": torch.float64, "float32": torch.float32}


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (``shapedtx: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def add_config_arguments(
    parser: argparse.ArgumentParser, defaults: ModelConfig | None = None
) -> None:
    """Add one option per ``ModelConfig`` field (``--width``, ``--tau0``, ...)."""
    d = defaults or ModelConfig()
    g = parser.add_argument_group("model (ModelConfig)")
    g.add_argument(
        "--width", type=int, default=d.width, help="n, residual width (default %(default)s)"
    )
    g.add_argument(
        "--depth", type=int, default=d.depth, help="d, number of blocks (default %(default)s)"
    )
    g.add_argument("--attention", choices=ATTENTIONS, default=d.attention)
    g.add_argument("--mlp", choices=MLPS, default=d.mlp)
    g.add_argument("--norm", choices=NORMS, default=d.norm)
    g.add_argument("--heads", type=int, default=d.heads)
    g.add_argument("--key-dim", type=int, default=None, help="n_k per head (default head_dim)")
    g.add_argument("--head-dim", type=int, default=None, help="d_p per head (default width/heads)")
    g.add_argument("--out-proj", action=argparse.BooleanOptionalAction, default=d.out_proj)
    g.add_argument("--tau0", type=float, default=d.tau0)
    g.add_argument("--gamma", type=float, default=d.gamma, help="branch weight (default 1/sqrt(8))")
    g.add_argument("--c-plus", type=float, default=d.c_plus)
    g.add_argument("--c-minus", type=float, default=d.c_minus)
    g.add_argument("--causal", action=argparse.BooleanOptionalAction, default=d.causal)


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    """Build the ModelConfig from the options of :func:`add_config_arguments`."""
    return ModelConfig(
        width=args.width,
        depth=args.depth,
        attention=args.attention,
        mlp=args.mlp,
        norm=args.norm,
        heads=args.heads,
        key_dim=args.key_dim,
        head_dim=args.head_dim,
        out_proj=args.out_proj,
        tau0=args.tau0,
        gamma=args.gamma,
        c_plus=args.c_plus,
        c_minus=args.c_minus,
        causal=args.causal,
    )


def add_input_arguments(group: argparse._ArgumentGroup, *, what: str = "networks") -> None:
    """``--tokens --rho0 --scale --samples``: an equicorrelated input covariance V0."""
    group.add_argument("--tokens", type=int, default=4, help="m, number of tokens (default 4)")
    group.add_argument("--rho0", type=float, default=0.2, help="initial correlation (default 0.2)")
    group.add_argument("--scale", type=float, default=1.0, help="initial V^{aa} (default 1)")
    group.add_argument("--samples", type=int, default=256, help=f"number of {what} (default 256)")


def add_run_arguments(group: argparse._ArgumentGroup) -> None:
    """``--seed --device --dtype --threads --out --no-progress``."""
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--device", default=None, help="torch device (default cpu)")
    group.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    group.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    group.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_device(text: str | None) -> torch.device:
    """``--device`` as a torch.device (default cpu); UsageError if unknown or unavailable."""
    try:
        device = torch.device(text) if text is not None else torch.device("cpu")
    except RuntimeError as err:
        raise UsageError(f"--device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {text} requested but CUDA is not available")
    return device


def set_threads(threads: int | None, option: str = "--threads") -> None:
    """Apply a ``--threads`` option (None leaves torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise UsageError(f"{option} must be >= 1, got {threads}")
    torch.set_num_threads(threads)


def run_setup(args: argparse.Namespace) -> tuple[ModelConfig, torch.Tensor, torch.dtype]:
    """Validate the options of :func:`add_input_arguments` / :func:`add_run_arguments`:
    returns (config, V0 on the device, dtype) and applies ``--threads``."""
    from ..covariance import equicorrelated

    config = config_from_args(args)
    if args.out is not None and Path(args.out).suffix != ".nc":
        raise UsageError(f"--out must be a .nc file, got {args.out!r}")
    set_threads(args.threads)
    device = parse_device(args.device)
    V0 = equicorrelated(args.tokens, args.rho0, args.scale, device=device)
    return config, V0, DTYPES[args.dtype]
