"""Several training runs in one process, stepped in turn (each on its own CUDA stream).

:func:`train_many` advances every run by one step in turn, each exactly as :func:`train`
would run it alone (the same code: its own model, optimizer, batches, log, checkpoints and
resume), so each run's numbers are those of its own ``train`` call (bitwise on CPU). On CUDA
each run's kernels go to its own stream: one run's step cannot fill a large GPU (a width-256
model's matrix products use a fraction of its multiprocessors), and the runs' kernels overlap
while the host queues the next run's step; with ``compile="step"`` a run's step is a few
CUDA-graph replays, so the host keeps many runs' queues full.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch

from .._validation import ParameterError, check_device
from ..config import ModelConfig
from .config import TrainConfig
from .data import ByteCorpus
from .trainer import TrainingDiverged, TrainResult, _deadline, _prepare


@dataclass(frozen=True)
class Run:
    """One run of :func:`train_many`: :func:`train`'s per-run arguments.

    Attributes:
        model_config: the architecture (``causal`` True).
        config: the optimisation settings (its ``seed`` and ``lr`` are the run's own).
        out_dir: the run's folder (checkpoint and log; resumed if it holds a checkpoint), or
            None (nothing written).
        snapshots, branch_from: as for :func:`train`.
    """

    model_config: ModelConfig
    config: TrainConfig
    out_dir: str | os.PathLike | None = None
    snapshots: Sequence[int] = ()
    branch_from: str | os.PathLike | None = None


def train_many(
    runs: Sequence[Run],
    data: ByteCorpus,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    resume: bool = True,
    progress: bool = True,
    compile: bool | str = False,
    time_limit: float | None = None,
) -> list[TrainResult | TrainingDiverged]:
    """Train ``runs`` together in this process, one step of each in turn.

    Every run is checked (ParameterError naming the argument, and the run's index) before any
    is built. A run that diverges stops with its :class:`TrainingDiverged` in its place of the
    result; the others go on.

    Args:
        runs: the runs (:class:`Run`), any number, of any shapes (runs of one shape share
            compiled code).
        data, device, dtype, resume, progress, compile: as for :func:`train`, for every run.
        time_limit: seconds of wall time for the whole call (needs every run's ``out_dir``):
            each run writes a checkpoint at its last log row before the limit and returns
            unfinished (``TrainResult.finished`` False); calling again resumes them.

    Returns:
        One entry per run, in order: its :class:`TrainResult`, or the
        :class:`TrainingDiverged` that stopped it.
    """
    if isinstance(runs, Run) or not isinstance(runs, Sequence) or not runs:
        raise ParameterError("runs", f"runs must be a non-empty sequence of Run, got {runs!r}")
    dev = check_device(device)
    steps: list[Generator[None, None, TrainResult]] = []
    for i, run in enumerate(runs):
        if not isinstance(run, Run):
            raise ParameterError(
                "runs", f"runs must hold Run objects, got {type(run).__name__} at index {i}"
            )
        deadline = _deadline(time_limit, run.out_dir)
        try:
            steps.append(
                _prepare(
                    run.model_config,
                    data,
                    run.config,
                    out_dir=run.out_dir,
                    device=dev,
                    dtype=dtype,
                    resume=resume,
                    progress=progress,
                    loss_hook=None,
                    snapshots=run.snapshots,
                    branch_from=run.branch_from,
                    compile=compile,
                    deadline=deadline,
                    desc=f"run {i}",
                )
            )
        except ParameterError as err:
            raise ParameterError(err.parameter, f"runs[{i}]: {err}") from None
    streams = [torch.cuda.Stream(dev) if dev.type == "cuda" else None for _ in runs]
    results: list[TrainResult | TrainingDiverged | None] = [None] * len(runs)
    active = list(range(len(runs)))
    while active:
        for i in list(active):
            stream = streams[i]
            context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
            try:
                with context:
                    next(steps[i])
            except StopIteration as stop:
                results[i] = stop.value
                active.remove(i)
            except TrainingDiverged as err:
                results[i] = err
                active.remove(i)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # every stream's work done before the models are used
    return [r for r in results if r is not None]


__all__ = ["Run", "train_many"]
