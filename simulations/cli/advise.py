"""``shapedtx advise``: branch weight gamma and temperature tau0 from the covariance SDE.

A thin wrapper of :func:`simulations.advise` (see its module for the method).
"""

from __future__ import annotations

import argparse
import json
import textwrap

from simulations.ranking import ranking_rule, ranking_text

from . import add_command
from ._common import RunArgs, add_run_options, option_error

DESCRIPTION = """\
Pick gamma (branch weight; skip weight lambda = sqrt(1 - gamma^2)) and tau0 (shaped-attention
temperature) for a shaped Transformer of width n, depth d and m tokens, before training. The
covariance SDE is solved to T = d/n for every (gamma, tau0) of the grid (cost independent of
the width); each candidate's predicted law at T must meet the safety criteria:

  collapse  fraction of paths with an off-diagonal correlation rho_T > --rho-max (0.99) must be
            below --max-collapse (1%): tokens that align cannot be told apart by attention and
            their query/key gradients vanish (rank collapse); exploded paths count as collapsed.
  exploded  fraction of paths that blow up before T must be below --max-exploded (0.1%): the
            attention drift is cubic in the covariance, so the SDE (and the network) can
            diverge in finite depth for large gamma or small tau0.
  norm      the --norm-quantile (99th) percentile of V^{aa}_T / V^{aa}_0 must be below
            --max-norm (10): token norms act as an inverse attention temperature; heavy norm
            growth makes the softmax saturate.

Ranking (simulations.advise.rank_key; spread_target is --spread-target, default 0.145):
{ranking}
How well the score predicts trained losses: the advise study, examples/advise/results.md.

Every candidate is screened with --screen-samples paths (rejected there only for a violation
beyond 2 standard errors; others are "unresolved"); candidates are then confirmed with
--samples fresh paths in ranking order until one passes. Monte Carlo standard errors are
shown (binomial for fractions, order-statistic for the quantile, batch means for the spread).
Verdicts: "pass" only when every criterion passes by at least 2 standard errors (for the
fractions the binomial SE at the threshold: 0 exploded of 32 paths cannot show a rate below
0.1%, SE 0.0056; about 4000 paths can); a pass by less is "unresolved", and an unresolved or
grid-edge advice says so in a note.

Long contexts: the SDE is integrated with min(--tokens, --max-tokens) tokens (default 16,
chosen by measurement, benchmarks/RESULTS.md): beyond 16 tokens the scores barely move, the
SDE's 50-step solution is itself less accurate and the cost grows as m^3.
--max-tokens 0 integrates all tokens.
The cost estimate is printed (to stderr) before the work starts, with a progress bar.
Causal attention is the default (what `shapedtx train` trains); --no-causal for the other.
The [LW] depth/width check and the [BH] head-size check (key size per head >= m - 1) are
printed alongside. Exit code 0 with an advice, 1 when no candidate passes, 2 on bad input.
Example: shapedtx advise --width 1024 --depth 1024 --tokens 8""".replace(
    "{ranking}", textwrap.indent(f"{ranking_rule()}.\n\n{ranking_text()}", "  ")
)  # the rule as rank_key's docstring states it


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "advise", run, DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = parser.add_argument_group("network")
    g.add_argument("--width", type=int, required=True, help="n, residual width")
    g.add_argument("--depth", type=int, required=True, help="d, number of blocks")
    g.add_argument("--tokens", type=int, required=True, help="m, sequence length (>= 2)")
    g.add_argument("--heads", type=int, default=1, help="attention heads (W^O when > 1; default 1)")
    g.add_argument(
        "--mlp",
        choices=("shaped_relu", "none"),
        default="shaped_relu",
        help="(default shaped_relu)",
    )
    g.add_argument(
        "--mlp-ratio",
        type=int,
        default=1,
        help="MLP hidden width / n of the model trained (default 1; it changes the SDE)",
    )
    g.add_argument(
        "--causal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="causal attention (default: causal, as shapedtx train trains)",
    )
    g.add_argument("--rho0", type=float, default=0.2, help="input correlation (default 0.2)")
    s = parser.add_argument_group("grid and sampling")
    s.add_argument("--gammas", type=_floats, default=None, help="comma-separated gamma grid")
    s.add_argument("--tau0s", type=_floats, default=None, help="comma-separated tau0 grid")
    s.add_argument("--samples", type=int, default=4096, help="paths per confirmed candidate")
    s.add_argument("--screen-samples", type=int, default=128, help="paths per screened candidate")
    s.add_argument("--steps", type=int, default=None, help="Euler steps (default max(50, 50 T))")
    s.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="integrate the SDE with at most this many tokens (default 16, the scores converge "
        "in m; 0: all tokens)",
    )
    c = parser.add_argument_group("criteria and ranking")
    c.add_argument("--rho-max", type=float, default=0.99, help="collapse level of rho (0.99)")
    c.add_argument("--max-collapse", type=float, default=0.01, help="(default 0.01)")
    c.add_argument("--max-exploded", type=float, default=0.001, help="(default 0.001)")
    c.add_argument("--norm-quantile", type=float, default=0.99, help="(default 0.99)")
    c.add_argument("--max-norm", type=float, default=10.0, help="(default 10)")
    c.add_argument(
        "--spread-target", type=float, default=None, help="ranking target of rho_spread (0.145)"
    )
    parser.add_argument("--json", action="store_true", help="print the Advice as JSON")
    parser.add_argument("--all", action="store_true", help="table of every candidate")
    # the screening runs on the CPU in float64 (simulations.advise has no device or dtype)
    add_run_options(parser, exclude=("device", "dtype"))


def _criteria(args: argparse.Namespace):
    from simulations.advise import Criteria

    options = {
        "rho_max": "--rho-max",
        "collapse": "--max-collapse",
        "exploded": "--max-exploded",
        "norm_quantile": "--norm-quantile",
        "norm_ratio": "--max-norm",
    }
    values = dict(
        rho_max=args.rho_max,
        collapse=args.max_collapse,
        exploded=args.max_exploded,
        norm_quantile=args.norm_quantile,
        norm_ratio=args.max_norm,
    )
    try:
        return Criteria(**values)
    except ValueError as err:
        raise option_error(err, renamed=options) from None


_OPTIONS = (
    "width", "depth", "tokens", "heads", "samples", "screen_samples", "steps", "seed", "gammas",
    "tau0s", "rho0", "spread_target", "max_tokens", "mlp_ratio",
)  # fmt: skip
"""advise's parameters whose errors name the option ``--name-with-dashes``."""


def run(args: argparse.Namespace) -> int:
    settings = RunArgs.from_args(args)  # torch-free
    import sys

    from simulations.advise import (
        DEFAULT_GAMMAS,
        DEFAULT_MAX_TOKENS,
        DEFAULT_SPREAD_TARGET,
        DEFAULT_TAU0S,
        advise,
    )
    from simulations.formatting import format_advice

    criteria = _criteria(args)
    settings.apply_threads()
    kwargs = dict(
        heads=args.heads,
        mlp=args.mlp,
        mlp_ratio=args.mlp_ratio,
        causal=args.causal,
        gammas=args.gammas or DEFAULT_GAMMAS,
        tau0s=args.tau0s or DEFAULT_TAU0S,
        criteria=criteria,
        spread_target=DEFAULT_SPREAD_TARGET if args.spread_target is None else args.spread_target,
        rho0=args.rho0,
        samples=args.samples,
        screen_samples=args.screen_samples,
        steps=args.steps,
        seed=settings.seed,
        max_tokens=DEFAULT_MAX_TOKENS
        if args.max_tokens is None
        else (None if args.max_tokens == 0 else args.max_tokens),
        progress=settings.progress,
        log=lambda line: print(f"shapedtx advise: {line}", file=sys.stderr, flush=True),
    )
    try:
        advice = advise(args.width, args.depth, args.tokens, **kwargs)
    except ValueError as err:
        raise option_error(err, _OPTIONS) from None
    if args.json:
        print(json.dumps(advice.to_dict(), indent=1, allow_nan=False))
    else:
        print(format_advice(advice, every=args.all))
    return 0 if advice.gamma is not None else 1
