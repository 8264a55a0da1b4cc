"""``shapedtx design``: depth/width for a parameter budget, head-size check, GPT-3 table.

docs/theory.md#depth-width and #head-size; the fit constants are the BigScience restatement of [LW].
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shapedtx._validation import check_int, check_positive
from shapedtx.config import ModelConfig
from shapedtx.design import (
    DEFAULT_MULTIPLE,
    GPT3_CONTEXT,
    LW_FIT,
    depth_threshold,
    extrapolation_warning,
    gpt3_table,
    head_size_report,
    optimal_shape,
    regime,
)

from . import SUBCOMMANDS

FIT_NOTE = (
    f"fit: ln d*(L) = {LW_FIT.a} + {LW_FIT.b} L, size N = 12 L d^2 (BigScience restatement of "
    "Levine et al. 2020; docs/theory.md#depth-width)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "design",
        help=SUBCOMMANDS["design"],
        description="Depth-to-width rule of Levine et al. (2020) and head-size check of "
        "Bhojanapalli et al. (2020). Examples: 'shapedtx design --params 175e9 --seq-len 2048', "
        "'shapedtx design --table gpt3'.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--params", type=float, help="non-embedding budget N = 12 L d^2")
    what.add_argument("--table", choices=("gpt3",), help="print the table of a model family")
    parser.add_argument(
        "--seq-len", type=int, default=None, help="sequence length m: add the head-size check"
    )
    parser.add_argument(
        "--head-size", type=int, default=None, help="standard head size d_p (default 128)"
    )
    parser.add_argument(
        "--multiple",
        type=int,
        default=DEFAULT_MULTIPLE,  # the library's, so that Python and the CLI agree
        help="round the recommended width to a multiple of this (default %(default)s)",
    )
    parser.set_defaults(func=run)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _budget(args: argparse.Namespace) -> str:
    shape = optimal_shape(args.params, multiple=args.multiple)
    rows = [
        ("optimal (real)", f"{shape.depth:.2f}", f"{shape.width:.1f}", f"{shape.params:.4g}"),
        (
            f"rounded (width multiple of {shape.multiple})",
            shape.depth_rounded,
            shape.width_rounded,
            f"{shape.params_rounded:.4g}",
        ),
    ]
    w = shape.width_rounded
    above = regime(shape.depth_rounded, w) == "depth-inefficient"
    out = [
        f"Recommended shape for N = {args.params:.4g} non-embedding parameters",
        FIT_NOTE,
        *filter(None, [extrapolation_warning(args.params)]),
        "",
        _table(("", "depth L", "width d", "12 L d^2"), rows),
        f"rounded shape spends {shape.params_rounded / args.params:.1%} of the budget",
        "",
        f"depth threshold log_3(d) = {depth_threshold(w):.2f}: depth {shape.depth_rounded} is "
        + (
            "above it, where depth and width contribute similarly (true of every practical "
            "model; the fitted optimum above is the recommendation)"
            if above
            else "below it, where depth is far more efficient than width"
        ),
    ]
    if args.seq_len is not None:
        head_size = 128 if args.head_size is None else args.head_size
        out += ["", _heads(w, shape.depth_rounded, head_size, args.seq_len)]
    return "\n".join(out)


def _heads(width: int, depth: int, head_size: int, seq_len: int) -> str:
    heads = max(1, width // head_size)
    config = ModelConfig(
        width=width,
        depth=depth,
        attention="softmax",
        heads=heads,
        head_dim=head_size,
        key_dim=head_size,
        out_proj=True,
    )
    report = head_size_report(config, seq_len)
    fixed = head_size_report(config.replace(head_dim=seq_len, key_dim=seq_len), seq_len)
    rows = [
        (
            f"head size {head_size}",
            heads,
            head_size,
            report.max_logit_rank,
            "yes" if report.bottleneck else "no",
            f"{report.params_actual:.4g}",
        ),
        (
            "fixed head size d_p = m",
            heads,
            seq_len,
            fixed.max_logit_rank,
            "yes" if fixed.bottleneck else "no",
            f"{fixed.params_actual:.4g}",
        ),
    ]
    return "\n".join(
        [
            f"Head size at sequence length m = {seq_len} (Bhojanapalli et al. 2020; "
            "docs/theory.md#head-size)",
            _table(
                ("layout", "heads", "d_p", "logit rank <=", "d_p < m", "attn params/layer"), rows
            ),
            f"standard layout (4 d^2 = {report.params_standard:.4g} per layer): at most "
            f"{report.max_unbottlenecked_heads} heads of size d / heads >= m",
        ]
    )


def _gpt3(multiple: int) -> str:
    rows = []
    for r in gpt3_table(multiple=multiple):
        rec = r.recommended
        rows.append(
            (
                r.name,
                r.depth,
                r.width,
                r.heads,
                r.head_dim,
                f"{r.params:.3g}",
                f"{r.threshold:.1f}",
                "above" if r.regime == "depth-inefficient" else "below",
                r.allocation,
                f"{rec.depth:.1f}",
                f"{rec.width:.0f}",
                f"{rec.depth_rounded} x {rec.width_rounded}",
                "yes" if r.bottleneck else "no",
            )
        )
    header = (
        "model",
        "L",
        "d",
        "heads",
        "d_p",
        "12 L d^2",
        "log3 d",
        "L vs log3 d",
        "verdict",
        "L*",
        "d*",
        f"rounded L x d (mult. {multiple})",
        f"d_p < {GPT3_CONTEXT}",
    )
    return "\n".join(
        [
            "GPT-3 family (Brown et al. 2020, Table 2.1) against the fitted optimum for its size",
            FIT_NOTE,
            "verdict: depth vs L* for the same 12 L d^2, +-10%",
            "",
            _table(header, rows),
        ]
    )


def run(args: argparse.Namespace) -> int:
    if args.head_size is not None:
        check_int("--head-size", args.head_size, 1)
    check_int("--multiple", args.multiple, 1)
    if args.seq_len is not None:
        check_int("--seq-len", args.seq_len, 1)
    if args.table is not None and (args.seq_len is not None or args.head_size is not None):
        raise ValueError("--seq-len and --head-size apply to --params only (GPT-3 uses m = 2048)")
    if args.table == "gpt3":
        print(_gpt3(args.multiple))
        return 0
    check_positive("--params", args.params)
    print(_budget(args))
    return 0
