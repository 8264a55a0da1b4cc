"""``shapedtx advise``: branch weight gamma and temperature tau0 from the covariance SDE.

A thin wrapper of :func:`simulations.advise` (see its module for the method).
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap

from simulations.ranking import ranking_rule, ranking_text

from . import SUBCOMMANDS
from ._common import option_error
from .design import _table

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
Evidence for the score: Spearman 0.92 between rho_spread and the trained loss over 26
configurations at width 32, 0.97 over 13 at width 64, depth 64 (examples/advise/README.md).

Every candidate is screened with --screen-samples paths (rejected there only for a violation
beyond 2 standard errors; others are "unresolved"); candidates are then confirmed with
--samples fresh paths in ranking order until one passes. Monte Carlo standard errors are
shown (binomial for fractions, order-statistic for the quantile, batch means for the spread).
Verdicts: "pass" only when every criterion passes by at least 2 standard errors (for the
fractions the binomial SE at the threshold: 0 exploded of 32 paths cannot show a rate below
0.1%, SE 0.0056; about 4000 paths can); a pass by less is "unresolved", and an unresolved or
grid-edge advice says so in a note.

Long contexts: the SDE is integrated with min(--tokens, --max-tokens) tokens (default 16),
chosen by measurement (benchmarks/RESULTS.md, issue #39): for a causal block at width 512,
depth 96, rho_spread moves by at most 1% (gamma <= 0.3; 3.6% above) from m = 16 to 32, and
the fractions and the norm quantile agree within about 2 SE or are stricter at m = 16; at
larger m the SDE's 50-step solution is itself less accurate, and the cost grows as m^3.
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
    parser = subparsers.add_parser(
        "advise",
        help=SUBCOMMANDS["advise"],
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="integrate the SDE with at most this many tokens (default 16, the scores converge "
        "in m; 0: all tokens)",
    )
    s.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars (default: when stderr is a terminal)",
    )
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads")
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
    parser.set_defaults(func=run)


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
    "tau0s", "rho0", "spread_target", "max_tokens",
)  # fmt: skip
"""advise's parameters whose errors name the option ``--name-with-dashes``."""


def _fmt(x: float, digits: int = 3) -> str:
    return "inf" if x == math.inf else f"{x:.{digits}g}"


def format_advice(advice, *, every: bool = False) -> str:
    """The human-readable report of an :class:`simulations.Advice`."""
    cr = advice.criteria
    se = advice.mc_se
    lines = [
        f"shapedtx advise: width {advice.width}, depth {advice.depth}, tokens {advice.tokens}, "
        f"heads {advice.heads}, mlp {advice.mlp}, causal {advice.causal}: T = d/n = "
        f"{advice.T:.4g}",
    ]
    if advice.gamma is None:
        lines.append("NO candidate of the grid passes the criteria")
    else:
        lam = math.sqrt(1 - advice.gamma**2)
        lines.append(
            f"advice: gamma = {advice.gamma:g} (lambda = {lam:.4f}), tau0 = {advice.tau0:g}"
        )
    lines += [
        f"criteria: collapse P(max rho_T > {cr.rho_max:g}) < {cr.collapse:g}; exploded < "
        f"{cr.exploded:g}; q{100 * cr.norm_quantile:g}(V_T^aa/V_0^aa) < {cr.norm_ratio:g}",
        f"ranking: {ranking_rule(advice.spread_target)}",
        f"sampling: {advice.steps} Euler steps, screen {advice.screen_samples} paths, confirm "
        f"{advice.samples} paths, SDE with m = {advice.sim_tokens} tokens; "
        f"{advice.seconds:.1f} s (estimated {advice.estimated_seconds:.0f} s)",
        f"Monte Carlo SE at the thresholds (confirmed): collapse {se['collapse_confirm']:.2g}, "
        f"exploded {se['exploded_confirm']:.2g} (screen: {se['collapse_screen']:.2g}, "
        f"{se['exploded_screen']:.2g}); rows show each estimate's SE",
        "",
    ]
    rows = []
    shown = advice.candidates if every else _summary(advice.candidates)
    for c in shown:
        m = c.measurement
        rows.append(
            (
                f"{c.gamma:g}",
                f"{c.tau0:g}",
                c.stage,
                m.samples,
                f"{m.collapse:.4f}+-{m.collapse_se:.4f}",
                f"{m.exploded:.4f}+-{m.exploded_se:.4f}",
                f"{_fmt(m.norm)}+-{_fmt(m.norm_se, 2)}",
                f"{m.rho_spread:.3f}+-{m.rho_spread_se:.3f}",
                _verdict(c),
            )
        )
    lines.append(
        _table(
            (
                "gamma",
                "tau0",
                "stage",
                "N",
                "collapse",
                "exploded",
                "norm q",
                "rho_spread",
                "verdict",
            ),
            rows,
        )
    )
    if not every and len(shown) < len(advice.candidates):
        lines.append(f"({len(advice.candidates) - len(shown)} more candidates: --all or --json)")
    d = advice.design
    lines += [
        "",
        f"[LW] depth threshold log_3(n) = {d.depth_threshold:.2f}: depth {advice.depth} is "
        f"{d.regime}; allocation for 12 L d^2: {d.allocation}",
        f"[BH] key size per head {d.key_dim} vs m = {advice.tokens}: "
        + ("ok (>= m - 1)" if d.head_size_ok else "TOO SMALL (< m - 1)")
        + f"; at most {d.max_unbottlenecked_heads} heads of size n/heads >= m",
    ]
    lines += [f"note: {n}" for n in advice.notes]
    return "\n".join(lines)


def _verdict(c) -> str:
    if c.verdict == "pass":
        return "pass"
    if c.verdict == "unresolved":  # the details (paths needed) are in --json
        names = ", ".join(" ".join(u.split()[:2]) if u.startswith("norm") else u.split()[0]
                          for u in c.unresolved)  # fmt: skip
        return f"unresolved (passes by < 2 SE): {names}"
    return ("unresolved (within 2 SE): " if c.plausible else "") + "; ".join(c.violations)


def _summary(cands):
    """The best candidate, the best few others, and one row per gamma's first failure."""
    out = list(cands[:6])
    seen = {c.gamma for c in out if not c.plausible}
    for c in cands[6:]:
        if not c.plausible and c.gamma not in seen:
            out.append(c)
            seen.add(c.gamma)
    return out


def run(args: argparse.Namespace) -> int:
    import sys

    from simulations.advise import (
        DEFAULT_GAMMAS,
        DEFAULT_MAX_TOKENS,
        DEFAULT_SPREAD_TARGET,
        DEFAULT_TAU0S,
        advise,
    )

    from ._common import set_threads

    criteria = _criteria(args)
    set_threads(args.threads)
    kwargs = dict(
        heads=args.heads,
        mlp=args.mlp,
        causal=args.causal,
        gammas=args.gammas or DEFAULT_GAMMAS,
        tau0s=args.tau0s or DEFAULT_TAU0S,
        criteria=criteria,
        spread_target=DEFAULT_SPREAD_TARGET if args.spread_target is None else args.spread_target,
        rho0=args.rho0,
        samples=args.samples,
        screen_samples=args.screen_samples,
        steps=args.steps,
        seed=args.seed,
        max_tokens=DEFAULT_MAX_TOKENS
        if args.max_tokens is None
        else (None if args.max_tokens == 0 else args.max_tokens),
        progress=args.progress,
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
