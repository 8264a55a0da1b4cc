"""How advise's scores depend on the number of tokens m (benchmarks/RESULTS.md,
"advise's scores against m").

For a few (gamma, tau0) around the advice at width 512, depth 96 (T = 0.1875), causal and
shaped ReLU MLP (what ``shapedtx train`` trains), solve the covariance SDE with advise's own
batched solver (float32, advise's steps) at m = 8 ... 128 and print each criterion and the
ranking score with its Monte Carlo SE, and the per-path-step time. The table decides how many
tokens ``simulations.advise`` integrates (``max_tokens``); record it in benchmarks/RESULTS.md.

    python benchmarks/advise_tokens.py
    python benchmarks/advise_tokens.py --tokens 8 16 32 --samples 256
"""

from __future__ import annotations

import argparse
import time

import torch

from shapedtx.covariance import equicorrelated
from simulations.advise import Criteria, _config, measure, solve_batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    p.add_argument("--gammas", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.5])
    p.add_argument("--tau0s", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=96)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    T = args.depth / args.width
    steps = max(50, -(-50 * args.depth // args.width))
    grid = [(g, t) for g in args.gammas for t in args.tau0s]
    print(
        f"## advise's scores against m: width {args.width}, depth {args.depth} (T = {T:g}), "
        f"causal {args.causal}, shaped ReLU MLP, {args.samples} paths, {steps} steps, "
        f"float32, {torch.get_num_threads()} threads\n"
    )
    print("| m | gamma | tau0 | collapse | exploded | norm q99 | rho_spread | ms / path-step |")
    print("|---|---|---|---|---|---|---|---|")
    for m in args.tokens:
        configs = [
            _config(args.width, args.depth, 1, "shaped_relu", args.causal, g, t) for g, t in grid
        ]
        V0 = equicorrelated(m, 0.2, 1.0)
        start = time.perf_counter()
        res = solve_batch(configs, V0, args.samples, T=T, steps=steps, seed=args.seed)
        per = (time.perf_counter() - start) / (len(configs) * args.samples * steps) * 1e3
        for (g, t), (VT, ex) in zip(grid, res, strict=True):
            r = measure(V0, VT, ex, Criteria())
            print(
                f"| {m} | {g:g} | {t:g} | {r.collapse:.4f} +- {r.collapse_se:.4f} | "
                f"{r.exploded:.4f} +- {r.exploded_se:.4f} | {r.norm:.3g} +- {r.norm_se:.2g} | "
                f"{r.rho_spread:.4f} +- {r.rho_spread_se:.4f} | {per:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
