"""Benchmark: the fused centring of shaped attention, in isolation and in a training step.

1. Forward + backward of one attention call (causal, float32): SDPA softmax attention,
   shaped attention with the fused centring (:func:`shapedtx.attention.centred_sum`) and
   with the former unfused expression ``v + attended - C v`` (C v from ``torch.cumsum``).
2. Full optimiser steps of ``LanguageModel`` (as ``bench_train.py``): softmax + ReLU without
   LN against shaped attention + ReLU without LN, fused and unfused centring.
Interleaved rounds, process CPU time, medians over rounds and of per-round ratios to softmax.

    python benchmarks/bench_centring.py
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import shapedtx.attention as attention
from shapedtx import ModelConfig
from shapedtx.attention import token_cumsum, token_mean
from shapedtx.blocks import merge_heads, split_heads
from shapedtx.training import LanguageModel


def _unfused(attended, v, *, causal=False):
    # attended: (..., m, d) or the per-head (..., m, h, d / h) view, merged by a copy; the
    # running mean from torch.cumsum (the form before the fused centring)
    counts = torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]
    mean = token_cumsum(v) / counts if causal else token_mean(v)
    return v + attended.reshape(v.shape) - mean


@contextlib.contextmanager
def _centring(fused: bool):
    original = attention.centred_sum
    if not fused:
        attention.centred_sum = _unfused
    try:
        yield
    finally:
        attention.centred_sum = original


def _interleaved(
    run: Callable[[str], None], names: list[str], rounds: int, repeats: int
) -> dict[str, list[float]]:
    """CPU seconds per ``run(name)`` for every name, one warm-up call each, then ``rounds``
    rounds that time ``repeats`` calls of each name in turn (load affects them alike)."""
    for name in names:
        run(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            start = time.process_time()
            for _ in range(repeats):
                run(name)
            times[name].append((time.process_time() - start) / repeats)
    return times


def _report(title: str, times: dict[str, list[float]], unit: str) -> None:
    base = next(iter(times))
    print(f"\n{title}\n| variant | median {unit} | time / {base}: median [min, max] |")
    print("|---|---|---|")
    for name, values in times.items():
        ratios = [t / b for t, b in zip(values, times[base], strict=True)]
        print(
            f"| {name} | {1e3 * statistics.median(values):.2f} | "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=10, help="attention calls per round")
    p.add_argument("--steps", type=int, default=3, help="training steps per round")
    p.add_argument("--skip-train", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    B, H, m, d = 16, 4, 128, 32
    q, k = (torch.randn(B, H, m, d, generator=gen, requires_grad=True) for _ in range(2))
    values = torch.randn(B, m, H * d, generator=gen, requires_grad=True)  # merged heads
    g = torch.randn(B, m, H * d, generator=gen)
    tau = (128 * 32) ** 0.5

    def call(variant: str) -> None:
        # as in shapedtx.blocks.attention_branch: values split into heads, outputs merged
        if variant == "softmax (SDPA)":
            out = F.scaled_dot_product_attention(q, k, split_heads(values, H), is_causal=True)
            out = merge_heads(out)
        else:
            with _centring(variant == "shaped, fused centring"):
                out = attention.shaped_attention_heads(q, k, values, tau, causal=True)
        out.backward(g)

    variants = ["softmax (SDPA)", "shaped, fused centring", "shaped, unfused centring"]
    times = _interleaved(call, variants, args.rounds, args.calls)
    print(
        f"CPU float32, 1 thread, {args.rounds} interleaved rounds, CPU time; "
        f"attention B {B}, heads {H}, m {m}, head {d}, causal"
    )
    _report("forward + backward of one attention call", times, "ms")
    if args.skip_train:
        return

    tokens = torch.randint(0, 256, (16, 129), generator=gen)
    models = {}
    for name, kind in {
        "softmax + ReLU, no LN": "softmax",
        "shaped + ReLU, no LN, fused": "shaped",
        "shaped + ReLU, no LN, unfused": "shaped",
    }.items():
        cfg = ModelConfig(
            width=128, depth=8, heads=4, out_proj=True, causal=True, attention=kind, mlp="relu"
        )
        torch.manual_seed(0)
        model = LanguageModel(cfg, 128)
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))

    def step(name: str) -> None:
        model, optimizer = models[name]
        with _centring(not name.endswith("unfused")):
            optimizer.zero_grad(set_to_none=True)
            model.loss(tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

    times = _interleaved(step, list(models), args.rounds, args.steps)
    _report(
        "training step (width 128, depth 8, 4 heads, W^O, batch 16 x 128)", times, "ms per step"
    )


if __name__ == "__main__":
    main()
