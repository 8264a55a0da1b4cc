"""Shared pieces of the command line: one-line errors and the ModelConfig options."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..config import ATTENTIONS, MLPS, NORMS, ModelConfig


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
