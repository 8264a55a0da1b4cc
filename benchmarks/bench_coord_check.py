"""Benchmark: the cost of coord_check's measurements in a training step.

Three identical ``LanguageModel`` copies (same seed), each with its own AdamW, take full
optimiser steps (zero_grad, forward, backward, step) on the same byte batch:

- ``plain``: no hooks;
- ``hooks``: coord_check's forward hooks on every block (RMS of the stream and of the branch
  output, kept on the device), the measurements taken after every forward;
- ``hooks + updates``: also the RMS of every block's weight update per group after the step
  (the whole per-step measurement of :func:`shapedtx.coord_check`).

Rounds are interleaved (plain, hooks, hooks + updates, plain, ...) so that the machine's load
affects the variants alike; the figure is the median over rounds of the per-round ratio of
process CPU time (wall time with ``--device cuda``, synchronised) to ``plain``.

    python benchmarks/bench_coord_check.py
    python benchmarks/bench_coord_check.py --width 256 --depth 4 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from shapedtx import ModelConfig, find_blocks
from shapedtx.diagnostics import UpdateMeter, default_group
from shapedtx.diagnostics.coordinates import _Activations
from shapedtx.training import LanguageModel

VARIANTS = ("plain", "hooks", "hooks + updates")
"""The compared training steps, ``plain`` first (the ratios' denominator)."""


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return wall
    return time.process_time


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=3, help="training steps per variant and round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = ModelConfig(
        width=args.width, depth=args.depth, heads=args.heads, out_proj=True, causal=True,
        attention="shaped", mlp="relu",
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.tokens + 1), generator=gen).to(device)
    runs = {}
    for name in VARIANTS:
        torch.manual_seed(0)
        model = LanguageModel(cfg, args.tokens).to(device).train()
        blocks = find_blocks(model)
        hooks = _Activations(blocks)
        if name != "plain":
            hooks.__enter__()  # installed for the whole run
        meter = UpdateMeter(blocks, default_group) if name == "hooks + updates" else None
        if meter is not None:
            meter.remember()
        runs[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4), hooks, meter)
    kept: list[torch.Tensor] = []  # the measurements, as coord_check keeps them (no sync)

    def step(name: str) -> None:
        model, opt, hooks, meter = runs[name]
        opt.zero_grad(set_to_none=True)
        loss = model.loss(tokens)
        if name != "plain":
            kept.extend(hooks.take())
        loss.backward()
        opt.step()
        if meter is not None:
            kept.append(meter.mean_square())

    clock = _clock(device)
    for name in VARIANTS:  # warm-up
        step(name)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            start = clock()
            for _ in range(args.steps):
                step(name)
            times[name].append((clock() - start) / args.steps)
        kept.clear()
    for _, _, hooks, _ in runs.values():
        hooks.__exit__()
    what = "wall time (synchronised)" if device.type == "cuda" else "process CPU time"
    print(
        f"{device}, {args.threads} thread(s), {args.rounds} interleaved rounds of {args.steps} "
        f"steps, {what}; LanguageModel width {args.width}, depth {args.depth}, "
        f"{args.heads} heads, batch {args.batch} x {args.tokens}, float32, AdamW"
    )
    print("| variant | median ms / step | time / plain: median [min, max] |")
    print("|---|---|---|")
    for name, values in times.items():
        ratios = [t / b for t, b in zip(values, times["plain"], strict=True)]
        print(
            f"| {name} | {1e3 * statistics.median(values):.2f} | "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |"
        )
    return times


if __name__ == "__main__":
    main()
