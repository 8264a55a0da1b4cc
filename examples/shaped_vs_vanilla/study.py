"""Shaped vs vanilla Transformers in training: a seeded, learning-rate-tuned depth study.

Causal byte-level LMs on the default corpus (Python standard library sources, no download):
the shaped Transformer (no LayerNorm) at several branch weights gamma, and the vanilla
Transformers practitioners train (``shapedtx.presets``: GPT-2 pre-LN, post-LN, no-norm unit
residual with fan_in and with GPT-2 init), at several depths. Per (model, depth) the peak
learning rate is tuned on a grid spaced by 3x (extended by one point while the best is at an
edge), then the best learning rate is re-run with more seeds.

Every run is a task of the project's Dask machinery (``simulations.run_planned``: an embedded
local cluster of ``--workers`` processes, or ``--scheduler ADDRESS``) and writes
``<out>/runs/<model>/d<depth>/lr<lr>_s<seed>/result.json`` atomically when it finishes
(training itself checkpoints and resumes), so an interrupted study loses no finished run and a
second invocation skips them. ``--report`` rebuilds ``results.json``,
``results.md`` and the figures from the finished runs without training.

Usage::

    python examples/shaped_vs_vanilla/study.py                 # the CPU study (see README)
    python examples/shaped_vs_vanilla/study.py --quick --out /tmp/study   # seconds
    python examples/shaped_vs_vanilla/study.py --device cuda --width 256 --depths 4 16 64 128
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shapedtx import ModelConfig, TrainConfig, load_corpus, preset
from shapedtx.files import atomic_path, write_json
from shapedtx.training import unigram_baseline as corpus_unigram
from simulations.training_runs import TrainingRun, run_planned

HERE = Path(__file__).parent

MODELS: dict[str, dict[str, Any]] = {
    "shaped g=0.1": {"name": "shaped", "gamma": 0.1},
    "shaped g=0.2": {"name": "shaped", "gamma": 0.2},
    "shaped g=0.35": {"name": "shaped", "gamma": 2**-1.5},
    "pre-LN (GPT-2)": {"name": "pre_ln"},
    "post-LN": {"name": "post_ln"},
    "no-norm fan_in": {"name": "no_norm"},
    "no-norm gpt2": {"name": "no_norm", "init": "gpt2"},
}
"""Study model -> preset name and overrides. Every model: 4 heads with W^O, MLP hidden 4n
(the shaped models too, so that all have the same parameter count), causal."""


@dataclass(frozen=True)
class Setup:
    """Sizes and grids of one study (the CPU default, ``--quick`` or a GPU run)."""

    width: int
    depths: tuple[int, ...]
    steps: int
    batch_size: int
    seq_len: int
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    max_bytes: int
    models: tuple[str, ...]
    max_extensions: int = 2


DEFAULT = Setup(
    width=32,
    depths=(4, 16, 64),
    steps=200,
    batch_size=16,
    seq_len=64,
    lrs=(3e-4, 1e-3, 3e-3),
    seeds=(0, 1, 2),
    max_bytes=4_000_000,
    models=tuple(MODELS),
)
QUICK = Setup(
    width=16,
    depths=(2, 4),
    steps=12,
    batch_size=4,
    seq_len=16,
    lrs=(1e-3, 3e-3),
    seeds=(0, 1),
    max_bytes=200_000,
    models=tuple(MODELS),
    max_extensions=1,
)


def model_config(model: str, width: int, depth: int) -> ModelConfig:
    fields = dict(MODELS[model])
    return preset(fields.pop("name"), width=width, depth=depth, mlp_ratio=4, causal=True, **fields)


def train_config(setup: Setup, lr: float, seed: int) -> TrainConfig:
    log = max(1, setup.steps // 8)
    return TrainConfig(
        steps=8 * log,
        batch_size=setup.batch_size,
        seq_len=setup.seq_len,
        lr=lr,
        warmup_steps=max(1, setup.steps // 10),
        log_interval=log,
        eval_interval=2 * log,
        eval_batches=4,
        metrics_batch=8,
        checkpoint_interval=2 * log,
        seed=seed,
    )


def run_dir(out: Path, model: str, depth: int, lr: float, seed: int) -> Path:
    slug = model.replace(" ", "_").replace("(", "").replace(")", "").replace("=", "")
    return out / "runs" / slug / f"d{depth}" / f"lr{lr:.0e}_s{seed}"


def training_run(job: tuple[str, int, float, int], setup: Setup, out: Path,
                 device: str) -> TrainingRun:  # fmt: skip
    """The :class:`TrainingRun` of one (model, depth, lr, seed): its result is
    ``runs/<model>/d<depth>/lr<lr>_s<seed>/result.json``."""
    model, depth, lr, seed = job
    config = train_config(setup, lr, seed)
    return TrainingRun(
        model=model_config(model, setup.width, depth),
        train=config,
        horizons=(config.steps,),
        folder=str(run_dir(out, model, depth, lr, seed)),
        max_bytes=setup.max_bytes,
        device=device,
        labels={"model_name": model, "depth": depth, "lr": lr, "seed": seed},
    )


def flat_result(r: dict[str, Any]) -> dict[str, Any]:
    """A run's result in this study's flat form (the form of the runs made before the runs
    became Dask tasks, which are read as they are): its one horizon's numbers at top level."""
    if "horizons" not in r:
        return r
    (h,) = r["horizons"].values()
    return {
        "model": r["model_name"],
        **{k: r[k] for k in ("depth", "lr", "seed", "params")},
        "status": h["status"],
        "init_val_loss": h["init_val_loss"],
        "val_loss": h["val_loss"],
        "diverged": h["diverged"],
        "curve": {"step": h["val_curve"]["step"], "val_loss": h["val_curve"]["loss"]},
        "mean_rho": h["mean_rho"],
        "centred_stable_rank": h["centred_stable_rank"],
    }


def load_results(out: Path) -> list[dict[str, Any]]:
    paths = sorted(out.glob("runs/*/d*/*/result.json"))
    return [flat_result(json.loads(p.read_text())) for p in paths]


def _key(r: dict[str, Any]) -> tuple[str, int]:
    return r["model"], r["depth"]


def best_lr(runs: list[dict[str, Any]]) -> float | None:
    """The learning rate with the lowest final validation loss of seed 0 (None if all
    diverged)."""
    ok = [r for r in runs if r["seed"] == 0 and not r["diverged"]]
    return min(ok, key=lambda r: r["val_loss"])["lr"] if ok else None


def plan(setup: Setup, results: list[dict[str, Any]]) -> list[tuple[str, int, float, int]]:
    """The runs still needed given the finished ones: the lr grid (seed 0), one more grid
    point beyond an edge that holds the best lr (at most ``max_extensions`` per side), then
    the other seeds at the best lr."""
    done = {(r["model"], r["depth"], r["lr"], r["seed"]) for r in results}
    todo = []
    for model in setup.models:
        for depth in setup.depths:
            runs = [r for r in results if _key(r) == (model, depth)]
            grid = sorted({*setup.lrs, *(r["lr"] for r in runs if r["seed"] == 0)})
            missing = [lr for lr in grid if (model, depth, lr, 0) not in done]
            if missing:
                todo += [(model, depth, lr, 0) for lr in missing]
                continue
            best = best_lr(runs)
            if best is None:
                continue
            lo, hi = min(setup.lrs), max(setup.lrs)
            if best == grid[0] and grid[0] > lo / 3.0**setup.max_extensions * 1.01:
                todo.append((model, depth, _round(best / 3), 0))
                continue
            if best == grid[-1] and grid[-1] < hi * 3.0**setup.max_extensions / 1.01:
                todo.append((model, depth, _round(best * 3), 0))
                continue
            todo += [(model, depth, best, s) for s in setup.seeds if (model, depth, best, s)
                     not in done]  # fmt: skip
    return todo


def _round(lr: float) -> float:
    return float(f"{lr:.1e}")


def run_study(
    setup: Setup, out: Path, device: str, workers: int | None, scheduler: str | None = None
) -> list[dict[str, Any]]:
    """Run every planned run as a Dask task, re-planning each time a run ends until nothing
    is left (``simulations.run_planned``); returns all results."""

    def runs() -> list[TrainingRun]:
        todo = sorted(plan(setup, load_results(out)), key=lambda j: -j[1])  # deepest first
        return [training_run(job, setup, out, device) for job in todo]

    summary = run_planned(
        runs,
        client=scheduler,
        workers=workers,
        describe=lambda key, r: f"{r['model_name']} d{r['depth']} lr {r['lr']:.0e}",
    )
    for key, error in summary.failed.items():
        print(f"study.py: run {key} failed: {error}", file=sys.stderr)
    return load_results(out)


# Report ---------------------------------------------------------------------------------------
def unigram_baseline(max_bytes: int) -> dict[str, float]:
    """Cross-entropy of the validation split under the training split's byte frequencies and
    the validation split's entropy (``shapedtx.training.unigram_baseline``)."""
    return corpus_unigram(load_corpus(max_bytes=max_bytes))


def summarise(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    """``results.json``: per model and depth the best lr, the final validation loss of every
    seed there, divergences and the loss-vs-lr curve."""
    models: dict[str, Any] = {}
    for model in setup.models:
        per_depth = {}
        for depth in setup.depths:
            runs = [r for r in results if _key(r) == (model, depth)]
            if not runs:
                continue
            best = best_lr(runs)
            seeds = sorted((r for r in runs if r["lr"] == best), key=lambda r: r["seed"])
            losses = [r["val_loss"] for r in seeds if not r["diverged"]]
            grid = sorted((r for r in runs if r["seed"] == 0), key=lambda r: r["lr"])
            per_depth[str(depth)] = {
                "lr": best,
                "seeds": [r["seed"] for r in seeds],
                "val_loss": [r["val_loss"] for r in seeds],
                "val_loss_mean": float(np.mean(losses)) if losses else None,
                "val_loss_std": float(np.std(losses, ddof=1)) if len(losses) > 1 else None,
                "diverged": sum(r["diverged"] for r in runs),
                "runs": len(runs),
                "lr_curve": {
                    "lr": [r["lr"] for r in grid],
                    "val_loss": [r["val_loss"] for r in grid],
                    "diverged": [r["diverged"] for r in grid],
                },
                "trainable_lrs": [r["lr"] for r in grid if not r["diverged"]],
                "params": seeds[0]["params"] if seeds else None,
            }
        models[model] = {"depth": per_depth}
    return {
        "setup": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(setup).items()},
        "unigram_baseline": unigram_baseline(setup.max_bytes),
        "models": models,
    }


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def results_table(summary: dict[str, Any]) -> str:
    """Markdown table: model x depth -> mean ± sd final validation loss (best lr, seeds)."""
    depths = summary["setup"]["depths"]
    head = "| model | " + " | ".join(f"depth {d}" for d in depths) + " |"
    lines = [head, "|---" * (len(depths) + 1) + "|"]
    for model, entry in summary["models"].items():
        cells = []
        for d in depths:
            e = entry["depth"].get(str(d))
            if e is None:
                cells.append("not run")
            elif e["val_loss_mean"] is None:
                cells.append(f"all diverged ({e['diverged']}/{e['runs']})")
            else:
                sd = f" ± {e['val_loss_std']:.3f}" if e["val_loss_std"] is not None else ""
                n = sum(v is not None for v in e["val_loss"])
                cells.append(
                    f"{e['val_loss_mean']:.3f}{sd} (n={n}, lr {e['lr']:.2g}, "
                    f"div {e['diverged']}/{e['runs']})"
                )
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """final loss vs depth, loss vs lr per depth, loss curves and per-layer covariance."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    depths = summary["setup"]["depths"]
    models = list(summary["models"])
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    paths = []

    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    top = summary["unigram_baseline"]["cross_entropy"] + 0.15
    for k, model in enumerate(models):
        xs, means, sds = [], [], []
        for d in depths:
            e = summary["models"][model]["depth"].get(str(d))
            if e and e["val_loss_mean"] is not None and e["val_loss_mean"] <= top:
                x = d * (1 + 0.03 * (k - len(models) / 2))  # small offsets: bars do not overlap
                xs.append(x)
                means.append(e["val_loss_mean"])
                sds.append(e["val_loss_std"] or 0.0)
                pts = [v for v in e["val_loss"] if v is not None]
                ax.plot([x] * len(pts), pts, ".", color=colours[model], alpha=0.5, ms=4)
        ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, color=colours[model], label=model)
    ax.axhline(summary["unigram_baseline"]["cross_entropy"], color="grey", ls=":", lw=1,
               label="unigram baseline")  # fmt: skip
    low = min((v for e in summary["models"].values() for c in e["depth"].values()
               for v in c["val_loss"] if v is not None), default=top - 1)  # fmt: skip
    for k, model in enumerate(models):  # losses above the unigram baseline: off scale
        for d in depths:
            e = summary["models"][model]["depth"].get(str(d))
            if e and e["val_loss_mean"] is not None and e["val_loss_mean"] > top:
                x = d * (1 + 0.03 * (k - len(models) / 2))
                ax.plot([x], [top - 0.02], "^", color=colours[model], ms=9)
                ax.annotate(f"{e['val_loss_mean']:.3g}", (x, top - 0.02), fontsize=7,
                            xytext=(4, -10), textcoords="offset points")  # fmt: skip
    ax.set_ylim(low - 0.05, top)
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel("final validation loss (nats/byte)")
    ax.set_title(
        "best lr per model and depth: mean ± sd over seeds (dots: seeds;\n"
        "triangles: off scale, above the unigram baseline)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_vs_depth.png"))

    fig = Figure(figsize=(4.0 * len(depths), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(depths), sharey=True))
    for ax, d in zip(axes, depths, strict=True):
        for model in models:
            e = summary["models"][model]["depth"].get(str(d))
            if not e:
                continue
            c = e["lr_curve"]
            ok = [(lr, v) for lr, v, bad in zip(c["lr"], c["val_loss"], c["diverged"],
                                                 strict=True) if not bad]  # fmt: skip
            if ok:
                ax.plot(*zip(*ok, strict=True), "o-", color=colours[model], label=model, ms=4)
            bad = [lr for lr, b in zip(c["lr"], c["diverged"], strict=True) if b]
            if bad:
                ax.plot(bad, [1.0] * len(bad), "x", color=colours[model], ms=8,
                        transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
        ax.set_xscale("log")
        ax.set_ylim(top=summary["unigram_baseline"]["cross_entropy"] + 0.8)
        ax.set_xlabel("peak learning rate")
        ax.set_title(f"depth {d} (x at top: diverged)")
    axes[0].set_ylabel("final validation loss, seed 0 (nats/byte)")
    axes[-1].legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_vs_lr.png"))

    fig = Figure(figsize=(4.0 * len(depths), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(depths), sharey=True))
    for ax, d in zip(axes, depths, strict=True):
        for model in models:
            e = summary["models"][model]["depth"].get(str(d))
            if not e or e["lr"] is None:
                continue
            for r in results:
                if (r["model"], r["depth"], r["lr"]) == (model, d, e["lr"]):
                    c = r["curve"]
                    ax.plot(c["step"], c["val_loss"], color=colours[model], alpha=0.7,
                            label=model if r["seed"] == 0 else None)  # fmt: skip
        ax.set_xlabel("step")
        ax.set_title(f"depth {d}, best lr, all seeds")
    axes[0].set_ylabel("validation loss (nats/byte)")
    axes[-1].legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_curves.png"))

    for metric, label in (("mean_rho", "mean token correlation"),
                          ("centred_stable_rank", "centred stable rank")):  # fmt: skip
        fig = Figure(figsize=(4.0 * len(depths), 6.4), layout="constrained")
        axes = fig.subplots(2, len(depths), squeeze=False, sharey="row")
        for j, d in enumerate(depths):
            for model in models:
                e = summary["models"][model]["depth"].get(str(d))
                run = next((r for r in results if e and (r["model"], r["depth"], r["lr"],
                            r["seed"]) == (model, d, e["lr"], 0)), None)  # fmt: skip
                if run is None or metric not in run:
                    continue
                for i, when in enumerate(("init", "final")):
                    y = [np.nan if v is None else v for v in run[metric][when]]
                    axes[i, j].plot(range(len(y)), y, color=colours[model], label=model)
            axes[0, j].set_title(f"depth {d}: at initialisation")
            axes[1, j].set_title(f"depth {d}: after training")
            axes[1, j].set_xlabel("layer (0 = embeddings)")
        for i in range(2):
            axes[i, 0].set_ylabel(label)
        axes[0, -1].legend(fontsize=7)
        paths.append(_save(fig, folder / f"{metric}_by_layer.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path


def report(setup: Setup, out: Path) -> dict[str, Any]:
    """Write ``results.json``, ``results_table.md`` and the figures from the finished runs."""
    results = load_results(out)
    summary = summarise(setup, results)
    write_json(summary, out / "results.json", indent=1)
    table = results_table(summary)
    base = summary["unigram_baseline"]
    text = (
        f"Final validation loss (nats/byte) at the best peak lr per model and depth, mean ± sd "
        f"over seeds; div = diverged runs of all runs of that cell (every lr and seed). "
        f"Unigram baseline of the validation split: {base['cross_entropy']:.3f} "
        f"(entropy {base['val_entropy']:.3f}).\n\n{table}\n"
    )
    with atomic_path(out / "results_table.md") as tmp:
        tmp.write_text(text)
    figures(summary, results, out / "figures")
    return summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE, help="study folder (default: beside me)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds (smoke test)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2, help="embedded Dask workers (processes)")
    p.add_argument("--scheduler", default=None, help="address of a running Dask scheduler")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--depths", type=int, nargs="+", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=None)
    p.add_argument("--report", action="store_true", help="only rebuild the report")
    return p.parse_args(argv)


def setup_of(args: argparse.Namespace) -> Setup:
    base = QUICK if args.quick else DEFAULT
    changes = {
        "width": args.width,
        "depths": tuple(args.depths) if args.depths else None,
        "steps": args.steps,
        "models": tuple(args.models) if args.models else None,
    }
    fields = {**vars(base), **{k: v for k, v in changes.items() if v is not None}}
    return Setup(**fields)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    setup = setup_of(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.stderr.write("study.py: --device cuda requested but CUDA is not available\n")
        return 2
    if args.workers < 1:
        sys.stderr.write(f"study.py: --workers must be >= 1, got {args.workers}\n")
        return 2
    try:
        if not args.report:
            run_study(setup, args.out, args.device, args.workers, args.scheduler)
        summary = report(setup, args.out)
    except KeyboardInterrupt:
        sys.stderr.write("study.py: interrupted; finished runs are kept, run again to resume\n")
        return 130
    print((args.out / "results_table.md").read_text())
    return 0 if summary["models"] else 1


if __name__ == "__main__":
    sys.exit(main())
