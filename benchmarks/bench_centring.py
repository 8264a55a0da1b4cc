"""Benchmark: the fused centring of shaped attention, in isolation and in a training step.

1. Forward + backward of one attention call (causal, float32): SDPA softmax attention,
   shaped attention with the fused centring (:func:`shapedtx.attention.centred_sum`) by its
   compiled kernels (the CPU default, :mod:`shapedtx._compiled_centring`) and by its torch
   form (used on other devices and in half precision), and with the former unfused
   expression ``v + attended - C v`` (C v from ``torch.cumsum``).
2. Full optimiser steps of ``LanguageModel`` (as ``bench_train.py``): softmax + ReLU without
   LN against shaped attention + ReLU without LN, with the same three centrings.
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
from shapedtx import ModelConfig, _compiled_centring
from shapedtx.attention import token_cumsum, token_mean
from shapedtx.blocks import merge_heads, split_heads
from shapedtx.training import LanguageModel


def _unfused(attended, v, *, causal=False):
    # attended: (..., m, d) or the per-head (..., m, h, d / h) view, merged by a copy; the
    # running mean from torch.cumsum (the form before the fused centring)
    counts = torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]
    mean = token_cumsum(v) / counts if causal else token_mean(v)
    return v + attended.reshape(v.shape) - mean


FORMS = {"compiled": "fused (compiled)", "torch": "fused (torch form)", "unfused": "unfused"}
"""The centrings compared, and how the variants' names end."""


@contextlib.contextmanager
def _centring(form: str):
    """Shaped attention's centring: the compiled kernels, the fused torch form, or unfused."""
    centred_sum, applies = attention.centred_sum, _compiled_centring.applies
    if form == "unfused":
        attention.centred_sum = _unfused
    elif form == "torch":
        _compiled_centring.applies = lambda *tensors: False
    try:
        yield
    finally:
        attention.centred_sum, _compiled_centring.applies = centred_sum, applies


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
    # as the blocks' linear maps give them: merged heads, queries and keys split by a view
    q, k, values = (torch.randn(B, m, H * d, generator=gen, requires_grad=True) for _ in range(3))
    g = torch.randn(B, m, H * d, generator=gen)
    tau = (128 * 32) ** 0.5

    def call(variant: str) -> None:
        # as in shapedtx.blocks.attention_branch: inputs split into heads, outputs merged
        qh, kh = split_heads(q, H), split_heads(k, H)
        if variant == "softmax (SDPA)":
            out = F.scaled_dot_product_attention(qh, kh, split_heads(values, H), is_causal=True)
            out = merge_heads(out)
        else:
            with _centring(forms[variant]):
                out = attention.shaped_attention_heads(qh, kh, values, tau, causal=True)
        out.backward(g)

    forms = {f"shaped, {end} centring": form for form, end in FORMS.items()}
    variants = ["softmax (SDPA)", *forms]
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
    for name, form in {
        "softmax + ReLU, no LN": "compiled",  # (no centring)
        **{f"shaped + ReLU, no LN, {end}": form for form, end in FORMS.items()},
    }.items():
        kind = "shaped" if name.startswith("shaped") else "softmax"
        cfg = ModelConfig(
            width=128, depth=8, heads=4, out_proj=True, causal=True, attention=kind, mlp="relu"
        )
        torch.manual_seed(0)
        model = LanguageModel(cfg, 128)
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4), form)

    def step(name: str) -> None:
        model, optimizer, form = models[name]
        with _centring(form):
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
