"""Training throughput (tokens/s) of shaped vs standard attention at equal size.

Times full optimiser steps (forward, backward, gradient clipping, AdamW) of
``shapedtx.training.LanguageModel`` on random bytes, interleaving the models round by round so
that machine load affects them alike, and reports the median step time of each and its
per-round time ratio to the baseline (standard softmax attention with pre-LN, ReLU MLP)
measured in the same run.
Shaped attention goes through the fused path (SDPA + cumulative token mean).

    python benchmarks/bench_train.py                       # CPU, 1 thread
    python benchmarks/bench_train.py --device cuda --threads 0
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from shapedtx import ModelConfig
from shapedtx.training import LanguageModel

MODELS = {
    "pre-LN softmax + ReLU (baseline)": {"attention": "softmax", "norm": "pre", "mlp": "relu"},
    "shaped attention + shaped ReLU, no LN": {
        "attention": "shaped",
        "norm": "none",
        "mlp": "shaped_relu",
    },
    "softmax + ReLU, no LN": {"attention": "softmax", "norm": "none", "mlp": "relu"},
    "shaped attention + ReLU, no LN": {"attention": "shaped", "norm": "none", "mlp": "relu"},
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch default)")
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default=None,
        help="cpu: process CPU time (robust to other jobs on a shared CPU; default on CPU), "
        "wall: elapsed time with device synchronisation (default on CUDA)",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    clock_name = args.clock or ("cpu" if device.type == "cpu" else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(
        0, 256, (args.batch_size, args.seq_len + 1), generator=gen, device=device
    )
    setups = {}
    for name, kind in MODELS.items():
        config = ModelConfig(
            width=args.width,
            depth=args.depth,
            heads=args.heads,
            out_proj=True,
            causal=True,
            **kind,
        )
        torch.manual_seed(0)
        model = LanguageModel(config, args.seq_len).to(device=device, dtype=dtype)
        setups[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))

    def step(model, optimizer):
        optimizer.zero_grad(set_to_none=True)
        model.loss(tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for model, optimizer in setups.values():  # warm-up
        for _ in range(2):
            step(model, optimizer)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.rounds):
        for name, (model, optimizer) in setups.items():
            _sync(device)
            start = clock()
            for _ in range(args.steps):
                step(model, optimizer)
            _sync(device)
            times[name].append((clock() - start) / args.steps)
    base_name = next(iter(MODELS))
    params = sum(p.numel() for p in next(iter(setups.values()))[0].parameters())
    print(
        f"width {args.width}, depth {args.depth}, heads {args.heads}, batch {args.batch_size} x "
        f"{args.seq_len} tokens, {params:,} parameters, {args.device} {args.dtype}, "
        f"threads {torch.get_num_threads()}, {args.rounds} rounds x {args.steps} steps, "
        f"{clock_name} clock"
    )
    print("| model | median step (ms) | tokens/s | time / baseline: median [min, max] of rounds |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        rate = args.batch_size * args.seq_len / median
        # ratio within each round: both models ran back to back under the same load
        ratios = [t / b for t, b in zip(values, times[base_name], strict=True)]
        print(
            f"| {name} | {1e3 * median:.1f} | {rate:,.0f} | {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}, {max(ratios):.3f}] |"
        )


if __name__ == "__main__":
    main()
