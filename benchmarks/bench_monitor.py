"""Benchmark: the cost of the trainer's monitor (``shapedtx.Monitor``) per logged interval.

``shapedtx.train`` measures every ``log_interval`` steps on its fixed metrics batch. Before the
monitor it ran ``covariance_metrics(model.hidden_states(tokens))`` (the covariance metrics
only); now it runs ``Monitor.measure()`` (the same covariance metrics plus activation RMS and
kurtosis, attention entropy and logits, relative weight updates). Per round, interleaved so
that the machine's load affects all alike, this times:

- ``steps``: ``log_interval`` full optimiser steps (zero_grad, loss, backward, AdamW step) at
  the training batch (``TrainConfig`` defaults: 16 x 64 bytes, log_interval 10);
- ``covariance``: the old measurement; ``monitor``: the new one (``metrics_batch`` 4).

The figures are the medians over rounds of ``measurement / steps``: the overhead of logging
at the default interval (process CPU time; wall time with ``--device cuda``, synchronised).

    python benchmarks/bench_monitor.py
    python benchmarks/bench_monitor.py --preset pre_ln --width 256 --depth 8 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import shapedtx
from shapedtx import Monitor, TrainConfig
from shapedtx.metrics import covariance_metrics
from shapedtx.training import LanguageModel

VARIANTS = ("steps", "covariance", "monitor")


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":

        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return wall
    return time.process_time


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="shaped")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    train = TrainConfig()
    config = shapedtx.preset(
        args.preset, width=args.width, depth=args.depth, heads=args.heads, causal=True
    )
    torch.manual_seed(0)
    model = LanguageModel(config, train.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, 256, (train.batch_size, train.seq_len + 1), generator=g).to(device)
    tokens = torch.randint(0, 256, (train.metrics_batch, train.seq_len), generator=g).to(device)
    monitor = Monitor(model, tokens)
    clock = _clock(device)

    def steps() -> None:
        for _ in range(train.log_interval):
            opt.zero_grad(set_to_none=True)
            model.loss(batch).backward()
            opt.step()

    def old() -> None:
        model.eval()
        covariance_metrics(model.hidden_states(tokens))
        model.train()

    run = {"steps": steps, "covariance": old, "monitor": monitor.measure}
    for fn in run.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            start = clock()
            run[name]()
            times[name].append(clock() - start)
    ratio = {
        name: statistics.median(t / s for t, s in zip(times[name], times["steps"], strict=True))
        for name in ("covariance", "monitor")
    }
    step_ms = 1e3 * statistics.median(times["steps"]) / train.log_interval
    print(
        f"{args.preset} width {args.width} depth {args.depth} heads {args.heads}, batch "
        f"{train.batch_size} x {train.seq_len}, metrics batch {train.metrics_batch}, "
        f"log_interval {train.log_interval}, {args.device}, {args.threads} thread(s)"
    )
    print(f"training step: {step_ms:.1f} ms (median of {args.rounds} rounds)")
    for name, value in ratio.items():
        ms = 1e3 * statistics.median(times[name])
        print(f"{name:>10}: {ms:7.1f} ms per log row = {100 * value:.2f}% of the interval's steps")
    extra = ratio["monitor"] - ratio["covariance"]
    print(f"monitor minus the old covariance measurement: {100 * extra:+.2f}% of the steps")
    return {"step_ms": step_ms, **ratio}


if __name__ == "__main__":
    main()
