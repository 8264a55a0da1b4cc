"""Benchmark: ``simulate(config, V0, samples)`` with no method against a naive loop.

The naive reference is what a user would write without the library's samplers: for every
sample, explicit N(0, 1/n) weight matrices drawn with ``torch.randn`` for every linear map of
every block, and the library's block (:func:`shapedtx.block`) on the (m, n) tokens, float64.
The default ``simulate`` call picks the fastest exact-in-law method for the config
(``attrs["method"]``). Interleaved rounds, process CPU time, cost per (sample x block);
the table gives medians over rounds and of the per-round ratios.

    python benchmarks/bench_default.py                  # n 1024, d 16, m 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from shapedtx import ModelConfig, block, gaussian_linear, initial_tokens
from shapedtx.metrics import covariance
from simulations import equicorrelated, simulate


def naive(cfg: ModelConfig, V0: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    linear = gaussian_linear(gen, cfg)
    out = []
    for _ in range(samples):
        X = initial_tokens(V0, cfg.width, 1, gen)[0]
        Vs = [covariance(X)]
        for _ in range(cfg.depth):
            X = block(X, cfg, linear)
            Vs.append(covariance(X))
        out.append(torch.stack(Vs))
    return torch.stack(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--naive-samples", type=int, default=2)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mlp", default="none")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = ModelConfig(width=args.width, depth=args.depth, causal=True, mlp=args.mlp)
    V0 = equicorrelated(args.tokens, 0.2)
    units = {"naive": args.naive_samples * cfg.depth, "default": args.samples * cfg.depth}
    times: dict[str, list[float]] = {"naive": [], "default": []}
    method = ""
    for r in range(args.rounds):
        start = time.process_time()
        naive(cfg, V0, args.naive_samples, r)
        times["naive"].append((time.process_time() - start) / units["naive"])
        start = time.process_time()
        method = simulate(cfg, V0, args.samples, seed=r, progress=False).attrs["method"]
        times["default"].append((time.process_time() - start) / units["default"])
    ratios = [a / b for a, b in zip(times["naive"], times["default"], strict=True)]
    print(
        f"causal shaped attention, mlp {args.mlp}, n {args.width}, d {args.depth}, "
        f"m {args.tokens}, float64, CPU, 1 thread, {args.rounds} rounds, CPU time; default "
        f"method resolved to {method!r}"
    )
    print("| method | samples x blocks per round | median ms per (sample x block) |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {units[name]} | {1e3 * statistics.median(values):.4f} |")
    print(
        f"speed-up of the default over naive: median {statistics.median(ratios):.0f}x "
        f"[{min(ratios):.0f}x, {max(ratios):.0f}x]"
    )


if __name__ == "__main__":
    main()
