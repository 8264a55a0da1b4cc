"""Same parameter budget, several depths: which depth wins, next to the fitted rule.

Levine et al. (2020) (docs/theory.md#depth-width): at a fixed size N = 12 L d^2 there is an optimal
depth, fitted as ln d*(L) = 5.039 + 0.0555 L (BigScience restatement). This harness trains standard
pre-LN causal byte-level Transformers (``shapedtx.training.train``) of about the same N at
several depths (width = sqrt(N / (12 L)), a multiple of the head count) and prints the final
validation loss of each next to the fit's L*(N). Tiny budgets: see examples/DESIGN_RESULTS.md.

Run: python examples/depth_width_budget.py [--params 1e6] [--depths 1 2 4 8 16] [--steps 300]
"""

import argparse
import math
import time

import numpy as np
import torch

from shapedtx import ModelConfig
from shapedtx.design import optimal_shape, param_count
from shapedtx.training import TrainConfig, final_val_loss, load_corpus, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1e6, help="budget N = 12 L d^2")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = load_corpus(max_bytes=args.max_bytes)
    train_config = TrainConfig(
        steps=args.steps,
        batch_size=16,
        seq_len=64,
        lr=3e-3,
        warmup_steps=max(1, args.steps // 10),
        log_interval=args.steps,
        eval_interval=args.steps,
        eval_batches=8,
        checkpoint_interval=0,
    )
    best = optimal_shape(args.params)
    print(
        f"budget N = 12 L d^2 = {args.params:.3g}; fit: L* = {best.depth:.2f}, "
        f"d* = {best.width:.1f}; {train_config.steps} steps x {train_config.tokens_per_step} "
        f"tokens; seeds {args.seeds}; corpus {data.train.numel()} training bytes"
    )
    print(
        "| depth L | width d | 12 L d^2 | shapedtx params | val loss (nats/byte) per seed | mean |"
    )
    print("|---|---|---|---|---|---|")
    for depth in args.depths:
        width = args.heads * max(1, round(math.sqrt(args.params / (12 * depth)) / args.heads))
        config = ModelConfig(
            width=width,
            depth=depth,
            attention="softmax",
            mlp="relu",
            norm="pre",
            heads=args.heads,
            out_proj=True,
            causal=True,
            final_norm=True,
        )
        losses = []
        start = time.perf_counter()
        for seed in args.seeds:
            result = train(config, data, train_config.replace(seed=seed), progress=False)
            losses.append(final_val_loss(result.log))
        seconds = time.perf_counter() - start
        print(
            f"| {depth} | {width} | {12 * depth * width**2:.3g} | {param_count(config).total} | "
            f"{', '.join(f'{v:.4f}' for v in losses)} | {np.mean(losses):.4f} |"
            f"  <!-- {seconds:.0f} s -->",
            flush=True,
        )


if __name__ == "__main__":
    main()
