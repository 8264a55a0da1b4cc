"""``shapedtx design``: depth/width for a parameter budget, head-size check, GPT-3 table.

docs/theory.md#depth-width and #head-size; the fit constants are the BigScience restatement of [LW].
"""

from __future__ import annotations

import argparse

from shapedtx._validation import check_int, check_positive
from shapedtx.config import ModelConfig
from shapedtx.design import DEFAULT_MULTIPLE, gpt3_table, head_size_report, optimal_shape
from simulations.formatting import format_gpt3, format_head_sizes, format_shape

from . import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "design", run,
        "Depth-to-width rule of Levine et al. (2020) and head-size check of Bhojanapalli et al. "
        "(2020). Examples: 'shapedtx design --params 175e9 --seq-len 2048', "
        "'shapedtx design --table gpt3'.",
    )  # fmt: skip
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


def _head_sizes(width: int, depth: int, head_size: int, seq_len: int) -> str:
    """The head-size check of the recommended shape: heads of ``head_size``, and of d_p = m."""
    heads = max(1, width // head_size)
    config = ModelConfig(width=width, depth=depth, attention="softmax", heads=heads,
                         head_dim=head_size, key_dim=head_size, out_proj=True)  # fmt: skip
    fixed = config.replace(head_dim=seq_len, key_dim=seq_len)
    reports = {
        f"head size {head_size}": (heads, head_size, head_size_report(config, seq_len)),
        "fixed head size d_p = m": (heads, seq_len, head_size_report(fixed, seq_len)),
    }
    return format_head_sizes(seq_len, reports)


def run(args: argparse.Namespace) -> int:
    if args.head_size is not None:
        check_int("--head-size", args.head_size, 1)
    check_int("--multiple", args.multiple, 1)
    if args.seq_len is not None:
        check_int("--seq-len", args.seq_len, 1)
    if args.table is not None and (args.seq_len is not None or args.head_size is not None):
        raise ValueError("--seq-len and --head-size apply to --params only (GPT-3 uses m = 2048)")
    if args.table == "gpt3":
        print(format_gpt3(gpt3_table(multiple=args.multiple), args.multiple))
        return 0
    check_positive("--params", args.params)
    shape = optimal_shape(args.params, multiple=args.multiple)
    print(format_shape(args.params, shape))
    if args.seq_len is not None:
        head_size = 128 if args.head_size is None else args.head_size
        print("\n" + _head_sizes(shape.width_rounded, shape.depth_rounded, head_size, args.seq_len))
    return 0
