"""Benchmark: "exact" (docs/theory.md#samplers) against "weights" (explicit matrices) in one run.

Shaped block with shaped-ReLU MLP, m tokens, several widths. Each (method, width) runs in its
own subprocess so that its peak memory is its own: peak resident set size (``ru_maxrss``) of
that process, and its increase over the RSS measured just before the timed run (after imports
and a warm-up). Cost is reported per (block x sample); "weights" is timed on fewer blocks and
samples than "exact" (it costs O(m n^2) per linear map and n^2 random numbers), which is fair
because the cost of both is linear in blocks and samples.

    python benchmarks/bench_simulate.py                      # widths 256 1024 4096
    python benchmarks/bench_simulate.py --widths 256 --exact 16 16 --weights 4 2
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch

from shapedtx import ModelConfig
from simulations import equicorrelated, simulate


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    cfg = ModelConfig(width=args.width, depth=args.blocks, attention="shaped", mlp="shaped_relu")
    V0 = equicorrelated(args.tokens, 0.2)
    simulate(cfg.replace(depth=1), V0, 1, method=args.method, progress=False)  # warm-up
    before = _rss_bytes()
    seconds = math.inf
    for _ in range(args.repeats):  # best of: the machine is shared
        start = time.perf_counter()
        ds = simulate(cfg, V0, args.samples, method=args.method, progress=False)
        seconds = min(seconds, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert ds.attrs["nonfinite"] == 0
    print(json.dumps({"seconds": seconds, "peak": peak, "before": before}))


def _measure(args, method: str, width: int, samples: int, blocks: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--method", method, "--width", str(width)]
    cmd += ["--samples", str(samples), "--blocks", str(blocks), "--tokens", str(args.tokens)]
    cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["per_unit"] = result["seconds"] / (samples * blocks)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--tokens", type=int, default=8, help="m (default 8)")
    parser.add_argument(
        "--exact", type=int, nargs=2, default=[64, 64], metavar=("SAMPLES", "BLOCKS")
    )
    parser.add_argument(
        "--weights",
        type=int,
        nargs=2,
        default=None,
        metavar=("SAMPLES", "BLOCKS"),
        help="default: 16 8 at width <= 256, 8 4 at <= 1024, 4 2 above",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=2, help="best of N timings (default 2)")
    # worker mode (one measurement in a fresh process)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return

    print(
        f"shaped block + shaped ReLU MLP, m = {args.tokens}, float64, CPU, "
        f"{args.threads} thread(s), best of {args.repeats}; cost per (block x sample); "
        f"memory: peak RSS of the "
        f"measuring process (increase over RSS before the timed run)"
    )
    header = (
        f"{'width':>6} {'method':>8} {'samples x blocks':>17} {'seconds':>8} "
        f"{'ms/(block*sample)':>18} {'peak RSS MB':>12} {'(+MB)':>8} {'speed-up':>9}"
    )
    print(header)
    for width in args.widths:
        if args.weights is not None:
            w_samples, w_blocks = args.weights
        else:
            w_samples, w_blocks = (16, 8) if width <= 256 else (8, 4) if width <= 1024 else (4, 2)
        rows = {
            "exact": (*args.exact, _measure(args, "exact", width, *args.exact)),
            "weights": (w_samples, w_blocks, _measure(args, "weights", width, w_samples, w_blocks)),
        }
        ratio = rows["weights"][2]["per_unit"] / rows["exact"][2]["per_unit"]
        for method, (samples, blocks, r) in rows.items():
            print(
                f"{width:>6} {method:>8} {f'{samples} x {blocks}':>17} {r['seconds']:>8.2f} "
                f"{1e3 * r['per_unit']:>18.3f} {r['peak'] / 2**20:>12.0f} "
                f"{(r['peak'] - r['before']) / 2**20:>8.0f} "
                f"{(f'{ratio:.0f}x' if method == 'exact' else ''):>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()
