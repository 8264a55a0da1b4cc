"""Depth sweep: shaped attention (no LayerNorm) vs standard attention with and without pre-LN.

Trains causal byte-level LMs on the default corpus (Python standard library sources, no
download) at several depths with the same width, schedule and token budget, and writes:

- ``<out>/runs/<model>_d<depth>/`` checkpoint, ``log.nc`` (resumable; finished runs are skipped),
- ``<out>/summary.nc`` final validation loss and final-layer metrics per (model, depth),
- ``<out>/results.md`` the table, ``<out>/depth_sweep.png`` the figure,
  ``<out>/losses_deepest.png`` the loss curves and ``<out>/collapse_deepest.png`` the token
  correlation during training at the largest depth.

Usage (about 20 min on one CPU thread)::

    python examples/depth_sweep/depth_sweep.py --out examples/depth_sweep
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from matplotlib.figure import Figure

from shapedtx import ModelConfig, TrainConfig, TrainingDiverged, load_corpus, train
from shapedtx.results import load_dataset, save_dataset
from shapedtx.training import final_val_loss, plot_losses

MODELS = {
    "shaped": {"attention": "shaped", "mlp": "shaped_relu", "norm": "none"},
    "pre-LN": {"attention": "softmax", "mlp": "relu", "norm": "pre"},
    "no-norm": {"attention": "softmax", "mlp": "relu", "norm": "none"},
    # variants of the shaped model (not run by default): standard ReLU MLP, sharper attention
    "shaped+ReLU": {"attention": "shaped", "mlp": "relu", "norm": "none"},
    "shaped-tau0=0.25": {"attention": "shaped", "mlp": "shaped_relu", "norm": "none", "tau0": 0.25},
}
DEFAULT_MODELS = ["shaped", "pre-LN", "no-norm"]


def models(args: argparse.Namespace) -> dict[str, dict]:
    """Model name -> ModelConfig fields (tau0 = ``--tau0`` unless the model sets it)."""
    return {name: {"tau0": args.tau0, **MODELS[name]} for name in args.models}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent)
    p.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--gamma", type=float, default=2**-1.5)
    p.add_argument("--tau0", type=float, default=1.0)
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=DEFAULT_MODELS)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-bytes", type=int, default=4_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    return p.parse_args()


def run_one(name, depth, args, data, train_config) -> xr.Dataset:
    config = ModelConfig(
        width=args.width,
        depth=depth,
        heads=args.heads,
        out_proj=True,
        causal=True,
        gamma=args.gamma,
        **models(args)[name],
    )
    out = args.out / "runs" / f"{name}_d{depth}"
    if (out / "log.nc").exists():
        log = load_dataset(out / "log.nc")
        if log.attrs.get("status") in ("finished", "diverged"):
            return log
    try:
        return train(config, data, train_config, out_dir=out, progress=args.progress).log
    except TrainingDiverged as err:
        print(f"  {name} depth {depth}: {err}", flush=True)
        return err.log


def summarise(logs: dict[tuple[str, int], xr.Dataset], args) -> xr.Dataset:
    names, depths = list(models(args)), args.depths
    shape = (len(names), len(depths))
    val, rho, rank, diverged = (np.full(shape, np.nan) for _ in range(4))
    diverged[:] = 0
    for (name, depth), log in logs.items():
        i, j = names.index(name), depths.index(depth)
        diverged[i, j] = log is None or log.attrs.get("status") == "diverged"
        if not diverged[i, j]:
            val[i, j] = final_val_loss(log)
            rho[i, j] = log["mean_rho"].values[-1, -1]
            rank[i, j] = log["stable_rank"].values[-1, -1]
    dims = ("model", "depth")
    return xr.Dataset(
        {
            "val_loss": (dims, val),
            "mean_rho_last_layer": (dims, rho),
            "stable_rank_last_layer": (dims, rank),
            "diverged": (dims, diverged.astype(np.int8)),
        },
        coords={"model": names, "depth": depths},
        attrs={
            k: v
            for k, v in vars(args).items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool)
        },
    )


def table(summary: xr.Dataset, tokens: int) -> str:
    head = "| model | " + " | ".join(f"depth {d}" for d in summary.depth.values) + " |"
    lines = [head, "|---|" + "---|" * summary.sizes["depth"]]
    for name in summary.model.values:
        cells = []
        for d in summary.depth.values:
            s = summary.sel(model=name, depth=d)
            v = float(s.val_loss)
            cells.append("diverged" if int(s.diverged) else ("-" if math.isnan(v) else f"{v:.3f}"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Final validation loss (nats/byte) after {tokens:,} training tokens per model.")
    return "\n".join(lines)


def figure(summary: xr.Dataset) -> Figure:
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    for name in summary.model.values:
        s = summary.sel(model=name)
        left.plot(s.depth, s.val_loss, "o-", label=name)
        right.plot(s.depth, s.mean_rho_last_layer, "o-", label=name)
    for ax, label in ((left, "final validation loss (nats/byte)"), (right, "last-layer mean rho")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("depth (blocks)")
        ax.set_ylabel(label)
        ax.legend(fontsize="small")
    right.set_title("token correlation after training (fixed batch)", fontsize="medium")
    left.set_title("same width, schedule and token budget", fontsize="medium")
    return fig


def collapse_figure(logs: dict[str, xr.Dataset], depth: int) -> Figure:
    """Mean token correlation of the fixed batch over training, last layer and per layer."""
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    for i, (name, log) in enumerate(logs.items()):
        rho = log["mean_rho"]
        left.plot(log.step, rho[:, -1], ".-", color=f"C{i}", label=name)
        right.plot(log.layer, rho[0], ":", color=f"C{i}")
        right.plot(log.layer, rho[-1], "-", color=f"C{i}", label=name)
    left.set_xlabel("step")
    left.set_ylabel("last-layer mean rho")
    left.set_title(f"depth {depth}: correlation during training", fontsize="medium")
    right.set_xlabel("layer (0 = embedding)")
    right.set_ylabel("mean rho")
    right.set_title("per layer: at init (dotted), after training (solid)", fontsize="medium")
    for ax in (left, right):
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize="small")
    return fig


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    data = load_corpus(max_bytes=args.max_bytes)
    train_config = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup_steps=max(1, args.steps // 20),
        min_lr_ratio=0.1,
        grad_clip=1.0,
        log_interval=10,
        eval_interval=100 if args.steps % 100 == 0 else args.steps,
        eval_batches=8,
        metrics_batch=4,
        checkpoint_interval=100 if args.steps % 100 == 0 else 0,
        seed=args.seed,
    )
    print(f"corpus {data.source}: {data.train.numel():,} train / {data.val.numel():,} val bytes")
    logs: dict[tuple[str, int], xr.Dataset | None] = {}
    for depth in args.depths:
        for name in models(args):
            start = time.time()
            log = logs[name, depth] = run_one(name, depth, args, data, train_config)
            v = final_val_loss(log) if log is not None else math.nan
            seconds = time.time() - start
            print(f"{name:8s} depth {depth:3d}: val {v:.4f} ({seconds:.0f} s)", flush=True)
        write_outputs(logs, args, train_config)


def write_outputs(logs, args, train_config: TrainConfig) -> None:
    """Summary, table and figures of the runs finished so far (rewritten after every depth)."""
    summary = summarise(logs, args)
    save_dataset(summary, args.out / "summary.nc")
    tokens = train_config.steps * train_config.tokens_per_step
    (args.out / "results.md").write_text(table(summary, tokens) + "\n")
    figure(summary).savefig(args.out / "depth_sweep.png", dpi=120)
    deepest = max(depth for _, depth in logs)
    curves = {n: logs[n, deepest] for n in models(args) if logs.get((n, deepest)) is not None}
    if curves:
        fig = plot_losses(curves)
        fig.axes[0].set_title(f"loss at depth {deepest}")
        fig.savefig(args.out / "losses_deepest.png", dpi=120)
        collapse_figure(curves, deepest).savefig(args.out / "collapse_deepest.png", dpi=120)
    print(table(summary, tokens), flush=True)


if __name__ == "__main__":
    main()
