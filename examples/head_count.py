"""More heads at a fixed embedding size: standard head size (width / heads) vs fixed head size.

Bhojanapalli et al. (2020) (docs/theory.md#head-size): with head size d_p = n / n_h, adding heads
shrinks d_p below the sequence length m and the heads become low-rank; with a fixed d_p (here d_p =
m) more heads keep helping. This harness trains standard pre-LN causal byte-level Transformers
(``shapedtx.training.train``) at fixed width n for several head counts, both layouts, and prints
the final validation loss. Tiny budgets: see examples/DESIGN_RESULTS.md.

Run: python examples/head_count.py [--width 64] [--seq-len 32] [--heads 1 2 4 8 16]
"""

import argparse
import time

import torch

from shapedtx import ModelConfig
from shapedtx.design import head_size_report, param_count
from shapedtx.training import TrainConfig, final_val_loss, load_corpus, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    data = load_corpus(max_bytes=args.max_bytes)
    train_config = TrainConfig(
        steps=args.steps,
        batch_size=32,
        seq_len=args.seq_len,
        lr=3e-3,
        warmup_steps=max(1, args.steps // 10),
        log_interval=args.steps,
        eval_interval=args.steps,
        eval_batches=8,
        checkpoint_interval=0,
        seed=args.seed,
    )
    base = ModelConfig(
        width=args.width,
        depth=args.depth,
        attention="softmax",
        mlp="relu",
        norm="pre",
        out_proj=True,
        causal=True,
        final_norm=True,
    )
    print(
        f"width n = {args.width}, depth {args.depth}, sequence length m = {args.seq_len}; "
        f"{train_config.steps} steps x {train_config.tokens_per_step} tokens; seed {args.seed}"
    )
    print("| heads | layout | head size d_p | d_p < m | shapedtx params | val loss (nats/byte) |")
    print("|---|---|---|---|---|---|")
    done = {}
    for heads in args.heads:
        if args.width % heads:
            raise ValueError(f"--heads {heads} must divide --width {args.width}")
        for layout, head_dim in (("standard", args.width // heads), ("fixed", args.seq_len)):
            config = base.replace(heads=heads, head_dim=head_dim, key_dim=head_dim)
            start = time.perf_counter()
            if (heads, head_dim) not in done:  # the two layouts coincide when n / h = m
                result = train(config, data, train_config, progress=False)
                done[heads, head_dim] = final_val_loss(result.log)
            report = head_size_report(config, args.seq_len)
            print(
                f"| {heads} | {layout} | {head_dim} | {'yes' if report.bottleneck else 'no'} | "
                f"{param_count(config).total} | {done[heads, head_dim]:.4f} |"
                f"  <!-- {time.perf_counter() - start:.0f} s -->",
                flush=True,
            )


if __name__ == "__main__":
    main()
