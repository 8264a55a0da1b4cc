"""Shaped vs vanilla Transformers in training: a seeded, learning-rate-tuned depth study.

Causal byte-level LMs on the default corpus (Python standard library sources, no download):
the shaped Transformer (no LayerNorm) at several branch weights gamma, and the vanilla
Transformers practitioners train (``shapedtx.presets``: GPT-2 pre-LN, post-LN, no-norm unit
residual with fan_in and with GPT-2 init), at several depths. Per (model, depth) the peak
learning rate is tuned on a grid spaced by 3x (extended by one point while the best is at an
edge), then the best learning rate is re-run with more seeds.

Every run is a task of the project's Dask machinery through the shared study runner
(``simulations.studies``: an embedded local cluster of ``--workers`` processes, or
``--scheduler ADDRESS``); it trains in its scratch folder ``runs/<model>/d<depth>/
lr<lr>_s<seed>/`` (git-ignored; checkpoints, so an interrupted run resumes) and is appended to
``runs.jsonl``, the study's record of its finished runs, when it finishes; a second invocation
skips them. ``--report`` rebuilds ``results.md``, ``results.json``, ``tables.md`` and the
figures from ``runs.jsonl`` (``report.py``) without training; none is edited by hand.

Usage::

    python examples/shaped_vs_vanilla/study.py                 # the CPU study (see README)
    python examples/shaped_vs_vanilla/study.py --quick --out /tmp/study   # seconds
    python examples/shaped_vs_vanilla/study.py --device cuda --width 256 --depths 4 16 64 128
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shapedtx import ModelConfig, TrainConfig, preset
from simulations.studies import (
    STORE,
    RunStore,
    Study,
    import_beside,
    lr_tag,
    parse_study_args,
    report_setup,
    study_main,
    study_parser,
)
from simulations.training_runs import TrainingRun

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
    return out / "runs" / slug / f"d{depth}" / f"{lr_tag(lr)}_s{seed}"


def training_run(job: tuple[str, int, float, int], setup: Setup, out: Path,
                 device: str) -> TrainingRun:  # fmt: skip
    """The :class:`TrainingRun` of one (model, depth, lr, seed), in its scratch folder
    ``runs/<model>/d<depth>/lr<lr>_s<seed>/`` (``lr`` as ``simulations.studies.lr_tag``)."""
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
    """The study's finished runs in the flat form: its ``runs.jsonl``, with any finished run
    left in its scratch folder taken in first."""
    return [flat_result(r) for r in RunStore(out / STORE).finished()]


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


def study(setup: Setup, out: Path, device: str = "cpu") -> Study:
    """The study for the shared runner (``simulations.studies``): the runs of :func:`plan`
    (deepest first) in ``out/runs/``, the report of ``report.py``."""

    def runs(results: list[dict[str, Any]]) -> list[TrainingRun]:
        todo = sorted(plan(setup, [flat_result(r) for r in results]), key=lambda j: -j[1])
        return [training_run(job, setup, out, device) for job in todo]

    def write_report(results: list[dict[str, Any]]) -> Any:
        report = import_beside(HERE, "report").report
        full = report_setup(out, {HERE: DEFAULT}, setup)
        return report(full, out, [flat_result(r) for r in results])

    return Study(
        out,
        runs,
        write_report,
        describe=lambda key, r: f"{r['model_name']} d{r['depth']} lr {r['lr']:.2g} s{r['seed']}",
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = study_parser(__doc__.splitlines()[0], out_help="study folder (default: beside me)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds (smoke test)")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--depths", type=int, nargs="+", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=None)
    return parse_study_args(p, argv)


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
    out = args.out if args.out is not None else HERE
    return study_main(study(setup_of(args), out, args.device), args)


if __name__ == "__main__":
    sys.exit(main())
