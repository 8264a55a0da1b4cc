"""Training runs as resumable Dask tasks: the unit of every training study.

A :class:`TrainingRun` is one model, one set of optimisation settings and one or more
horizons (several with the WSD schedule, see :func:`shapedtx.training.train_horizons`).
:func:`run_training` trains it in its folder and writes ``result.json`` atomically when every
horizon has ended; :func:`run_trainings` runs many as tasks of the project's Dask machinery
(:func:`simulations.sweep.run_tasks`): an interrupted study keeps every finished run, a
second call skips them, and a run whose worker died resumes from its last checkpoint.
:func:`run_planned` runs a study whose next runs depend on the finished ones (a learning-rate
grid extended while its best value is at an edge), planning again whenever a worker is free.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shapedtx._validation import ParameterError, check_device, check_int
from shapedtx.config import ModelConfig
from shapedtx.files import write_json
from shapedtx.training import TrainConfig

from .sweep.tasks import TaskSummary, run_replanned, run_tasks

RESULT = "result.json"
DTYPE_NAMES = ("float32", "float64")


@dataclass(frozen=True)
class TrainingRun:
    """One training job.

    Attributes:
        model: the architecture.
        train: the optimisation settings (``steps`` is replaced by each horizon).
        horizons: the horizons in steps (one for a cosine schedule).
        folder: where the run writes ``h<H>/`` training folders and ``result.json``.
        max_bytes: the corpus's size (``shapedtx.load_corpus(max_bytes=...)``).
        data: a corpus file or folder (``shapedtx.load_corpus(data)``); ``None``: the default
            corpus (this Python's standard library; ``shapedtx.training.export_corpus`` copies
            it for a machine with another Python).
        device, dtype: where and in which precision it trains.
        compile: train through ``torch.compile`` (see :func:`shapedtx.training.train`).
        labels: anything the study wants back in the result (model name, grid values).
    """

    model: ModelConfig
    train: TrainConfig
    horizons: tuple[int, ...]
    folder: str
    max_bytes: int = 8_000_000
    data: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = False
    labels: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from shapedtx.training import horizon_configs

        if not isinstance(self.model, ModelConfig):
            raise ParameterError(
                "model", f"model must be a ModelConfig, got {type(self.model).__name__}"
            )
        if not isinstance(self.train, TrainConfig):
            raise ParameterError(
                "train", f"train must be a TrainConfig, got {type(self.train).__name__}"
            )
        object.__setattr__(self, "horizons", tuple(horizon_configs(self.train, self.horizons)))
        _check_data(self.data)
        if self.dtype not in DTYPE_NAMES:
            raise ParameterError("dtype", f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")

    @property
    def result_path(self) -> Path:
        return Path(self.folder) / RESULT


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _floats(values: Any) -> list[float | None]:
    return [_finite(float(v)) for v in np.asarray(values, dtype=float).ravel()]


def summarise_log(log: Any, horizon: int) -> dict[str, Any]:
    """The JSON summary of one horizon's training log (``shapedtx.training.log_dataset``):
    status, final and initial validation loss, the validation and training curves, and the
    per-layer covariance metrics at initialisation and at the last logged step."""
    val = log["val_loss"].dropna("step")
    status = str(log.attrs.get("status"))
    finished = status == "finished"
    final = float(val.values[-1]) if finished and val.size else math.nan
    init = float(val.values[0]) if val.size else math.nan
    out: dict[str, Any] = {
        "horizon": horizon,
        "status": status,
        "diverged_step": int(log.attrs["diverged_step"]) if "diverged_step" in log.attrs else None,
        "val_loss": _finite(final),
        "init_val_loss": _finite(init),
        "diverged": not finished or not math.isfinite(final) or final > init,
        "val_curve": {"step": [int(s) for s in val.step.values], "loss": _floats(val.values)},
        "train_curve": {
            "step": [int(s) for s in log.step.values[1:]],
            "loss": _floats(log["train_loss"].values[1:]),
        },
        "branch_step": int(log.attrs["branch_step"]) if "branch_step" in log.attrs else None,
    }
    for name in ("mean_rho", "centred_stable_rank", "stable_rank"):
        out[name] = {
            "init": _floats(log[name].isel(step=0).values),
            "final": _floats(log[name].isel(step=-1).values),
            "final_step": int(log.step.values[-1]),
        }
    out.update(_shape_curves(log))
    if "max_logit" in log:
        out["max_logit"] = _max_logits(log["max_logit"])
    return out


def _nanmax(values: np.ndarray, axis: int | tuple[int, ...]) -> np.ndarray:
    """``values.max(axis)`` ignoring NaN; NaN where a slice has no number."""
    top = np.where(np.isnan(values), -np.inf, values).max(axis)
    return np.where(top == -np.inf, np.nan, top)


def _max_logits(max_logit: Any) -> dict[str, Any]:
    """The largest attention logit (docs/guide/monitor.md) of a log's ``max_logit(step, block,
    head)``, compactly: per block (the largest over heads) at the first and last logged step
    and over the whole run (``peak``), and per logged step the largest over blocks and heads
    (``curve``). NaN (None) where a block has no softmax logits."""
    values = np.asarray(max_logit.values, dtype=float)  # (step, block, head)
    return {
        "init": _floats(_nanmax(values[0], 1)),
        "final": _floats(_nanmax(values[-1], 1)),
        "peak": _floats(_nanmax(values, (0, 2))),
        "curve": {
            "step": [int(s) for s in max_logit.step.values],
            "value": _floats(_nanmax(values, (1, 2))),
        },
    }


def _shape_curves(log: Any) -> dict[str, Any]:
    """How a trainable shape moved (docs/theory.md#trainable-shape), where the log has it:
    ``mlp_kappa`` per logged step and block, and ``shape_gain`` per step, block and gain."""
    out: dict[str, Any] = {}
    steps = [int(s) for s in log.step.values]
    if "mlp_kappa" in log:
        values = np.asarray(log["mlp_kappa"].values, dtype=float)
        out["mlp_kappa"] = {"step": steps, "value": [_floats(row) for row in values]}
    if "shape_gain" in log:
        values = np.asarray(log["shape_gain"].values, dtype=float)  # (step, block, gain)
        out["shape_gain"] = {
            "step": steps,
            "gain": [str(g) for g in log.gain.values],
            "value": [[_floats(block) for block in row] for row in values],
        }
    return out


def horizon_loss(result: dict[str, Any], horizon: int) -> float:
    """The final validation loss of a :func:`run_training` result at ``horizon``; ``inf`` when
    that horizon diverged or the run does not have it (so ``min`` over runs picks a trained one).
    """
    h = result["horizons"].get(str(horizon))
    return math.inf if h is None or h["diverged"] else float(h["val_loss"])


def _losses_text(result: dict[str, Any]) -> str:
    """A :func:`run_training` result's validation loss at each horizon, one line (a study's
    log): ``"val loss 2.182 (250), 1.135 (5000)"``, ``diverged`` for a diverged horizon."""

    def one(horizon: int) -> str:
        loss = horizon_loss(result, horizon)
        return f"{'diverged' if math.isinf(loss) else f'{loss:.3f}'} ({horizon})"

    return "val loss " + ", ".join(one(h) for h in sorted(map(int, result["horizons"])))


def run_training(run: TrainingRun, progress: bool = False) -> dict[str, Any]:
    """Train ``run`` (resuming what its folder holds) and write ``result.json`` atomically;
    return the result at once if it exists. The checkpoints are removed once every horizon
    has ended (the logs ``h<H>/log.nc`` stay)."""
    if run.result_path.exists():
        return json.loads(run.result_path.read_text())
    import torch

    from shapedtx.training import LanguageModel, load_corpus, train_horizons, unigram_baseline

    start = time.perf_counter()
    # a log or checkpoint from an earlier call: this call's wall time is part of the run's
    resumed = any(Path(run.folder).glob("h*/log.nc")) or any(Path(run.folder).glob("h*/*.pt"))
    data = load_corpus(run.data, max_bytes=run.max_bytes)
    logs = train_horizons(
        run.model,
        data,
        run.train,
        run.horizons,
        run.folder,
        device=run.device,
        dtype=getattr(torch, run.dtype),
        progress=progress,
        compile=run.compile,
    )
    params = sum(p.numel() for p in LanguageModel(run.model, run.train.seq_len).parameters())
    result = {
        **run.labels,
        "params": params,
        "train_bytes": int(data.train.numel()),
        "corpus": data.source,
        "corpus_fingerprint": data.fingerprint(),
        "unigram_baseline": unigram_baseline(data),
        "epochs_at_longest": max(run.horizons) * run.train.tokens_per_step / data.train.numel(),
        "model_config": run.model.to_attrs(),
        "train_config": run.train.to_attrs(),
        "device": run.device,
        "compiled": run.compile,
        "host": _host(run.device),
        "batch_generator": "cpu",  # the same batches on every device (WindowSampler)
        # of this call: the whole run when it was not resumed
        "wall_seconds": round(time.perf_counter() - start, 1),
        "resumed": resumed,
        "horizons": {str(h): summarise_log(log, h) for h, log in logs.items()},
    }
    write_json(result, run.result_path, indent=1)
    return result


def _host(device: str) -> dict[str, str]:
    """What sets a run's last bits besides its seed and configuration: torch's build and the
    kernels it dispatches to (the CPU's vector extension; the GPU's name on CUDA). Two machines
    can differ in rounding, and a run at the edge of stability amplifies it."""
    import torch

    host = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.device(device).type == "cuda":
        host["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return host


def _check_data(data: str | None) -> None:
    if data is not None and not Path(data).exists():
        message = f"data must be an existing corpus file or folder, got {data!r}"
        raise ParameterError("data", message)


def check_run_options(device: str, data: str | None) -> None:
    """What a study checks before it starts a cluster: ``device`` is available on this
    machine and ``data`` (``TrainingRun.data``) exists; a ParameterError naming the one that
    is not. (``TrainingRun`` itself does not check the device: its runs may train on the
    workers of another machine.)"""
    check_device(device)
    _check_data(data)


def one_corpus(results: Sequence[dict[str, Any]]) -> str | None:
    """The ``corpus_fingerprint`` every result shares (None: none recorded one; results
    from before it was recorded are not checked); a ValueError naming the fingerprints and
    their counts when the runs trained on different data (a study's runs compare only on one
    corpus: a machine with another Python has another default corpus, see
    ``TrainingRun.data``)."""
    counts = Counter(str(r["corpus_fingerprint"]) for r in results if "corpus_fingerprint" in r)
    if len(counts) > 1:
        found = ", ".join(f"{k} ({n} runs)" for k, n in sorted(counts.items()))
        raise ValueError(
            f"the runs trained on {len(counts)} different corpora ({found}): a study's runs "
            "must share one; train the others with TrainingRun.data set to the same corpus"
        )
    return next(iter(counts), None)


def _folders(runs: Sequence[TrainingRun], name: str, message: str) -> list[str]:
    """Each run's absolute folder; a :class:`ParameterError` on ``name`` if two share one."""
    keys = [os.path.abspath(r.folder) for r in runs]
    if len(set(keys)) != len(keys):
        raise ParameterError(name, message)
    return keys


def run_trainings(
    runs: Sequence[TrainingRun],
    *,
    client: Any = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    threads: int | None = None,
    progress: bool | None = None,
    describe: Callable[[str, dict[str, Any]], str] | None = None,
) -> TaskSummary[dict[str, Any]]:
    """Run every run as a Dask task (:func:`simulations.sweep.run_tasks`, whose arguments
    these are; the first run first) and return their results by folder; finished runs are
    read, not trained again. A study whose next runs depend on finished ones uses
    :func:`run_planned`."""
    _folders(runs, "runs", "runs must have distinct folders")
    todo = [r for r in runs if not r.result_path.exists()]
    summary: TaskSummary[dict[str, Any]] = TaskSummary()
    for r in runs:
        if r.result_path.exists():
            summary.results[r.folder] = json.loads(r.result_path.read_text())
    done = run_tasks(
        run_training,
        todo,
        [r.folder for r in todo],
        client=client,
        workers=workers,
        threads_per_worker=threads_per_worker,
        threads=threads,
        progress=progress,
        desc="train",
        describe=describe,
    )
    summary.results.update(done.results)
    summary.failed.update(done.failed)
    return summary


def run_planned(
    plan: Callable[[], Sequence[TrainingRun]],
    *,
    client: Any = None,
    workers: int | None = None,
    max_runs: int | None = None,
    progress: bool | None = None,
    describe: Callable[[str, dict[str, Any]], str] | None = None,
) -> TaskSummary[dict[str, Any]]:
    """Run a study whose next runs depend on its finished ones: ``plan()`` gives the runs
    still needed in priority order (it reads the finished ones from disk, and is called while
    runs are running), and whenever a worker thread is free it is asked again and the free
    threads take its first runs not yet started (:func:`simulations.sweep.run_replanned`; one
    torch thread per run). Ends when ``plan()`` gives nothing new and nothing runs, after
    ``max_runs`` new runs, or once a run failed (it would only be planned again; the running
    ones finish). The cluster: ``client`` (a ``distributed.Client`` or a scheduler's address)
    or an embedded one of ``workers`` processes (ignored with ``client``), started only if
    there is something to run. Returns the new runs' results and failures by absolute
    folder. The line logged as a run ends gives ``describe(folder, result)`` and the run's
    validation loss at each horizon."""
    if max_runs is not None:
        check_int("max_runs", max_runs, minimum=0)

    def pending() -> list[tuple[str, TrainingRun]]:
        runs = list(plan())
        keys = _folders(runs, "plan", "plan() must give runs with distinct folders")
        return [(key, r) for key, r in zip(keys, runs, strict=True) if not r.result_path.exists()]

    if max_runs == 0 or not pending():
        return TaskSummary()

    def label(key: str, result: dict[str, Any]) -> str:
        return "; ".join([*([describe(key, result)] if describe else []), _losses_text(result)])

    return run_replanned(
        run_training,
        pending,
        client=client,
        workers=None if client is not None else workers,
        threads=1,
        max_jobs=max_runs,
        progress=progress,
        desc="train",
        describe=label,
    )


__all__ = [
    "RESULT",
    "TrainingRun",
    "run_planned",
    "run_training",
    "run_trainings",
    "summarise_log",
]
