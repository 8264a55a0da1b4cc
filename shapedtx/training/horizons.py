"""``train_horizons``: one model trained to several horizons for about the cost of the longest.

With the warmup-stable-decay schedule (``TrainConfig(schedule="wsd")``) a run of horizon H
follows the same learning rates as the longest run up to its cooldown start, ``H -
round(cooldown_fraction H)``. So the longest run keeps a snapshot of its checkpoint at each
shorter horizon's cooldown start, and each shorter horizon is that snapshot's cooldown branch
(``train(..., branch_from=snapshot)``): bitwise the run of that horizon trained from the start,
at the cost of its cooldown alone (Hagele et al. 2024).

Layout of ``out_dir``: ``h<H>/`` per horizon, each a training folder (``log.nc``,
``checkpoint.pt``); the longest horizon's folder also holds the snapshots
``checkpoint-<step>.pt`` until every branch has finished. Every folder resumes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import xarray as xr

from .._validation import ParameterError
from ..config import ModelConfig
from ..results import load_dataset
from .config import TrainConfig
from .data import ByteCorpus
from .trainer import CHECKPOINT, LOG, TrainingDiverged, train

ENDED = ("finished", "diverged")
"""Log statuses of a horizon that is not trained again."""


def horizon_configs(config: TrainConfig, horizons: Sequence[int]) -> dict[int, TrainConfig]:
    """Horizon -> its ``TrainConfig`` (``config`` with ``steps`` = the horizon), ascending.

    ValueError unless ``horizons`` are distinct ints > ``warmup_steps``, at most one of them
    for a cosine schedule, and every shorter horizon's cooldown start is a multiple of
    ``log_interval`` (a snapshot falls on a log row)."""
    values = list(horizons)
    if not values or any(isinstance(h, bool) or not isinstance(h, int) for h in values):
        raise ParameterError(
            "horizons", f"horizons must be a non-empty sequence of ints, got {horizons!r}"
        )
    if len(set(values)) != len(values):
        raise ParameterError("horizons", f"horizons must be distinct, got {values}")
    if config.schedule != "wsd" and len(values) > 1:
        raise ParameterError(
            "horizons",
            f"horizons: several horizons need schedule='wsd' (a cosine run has one), got "
            f"{len(values)} with schedule={config.schedule!r}",
        )
    out = {}
    for h in sorted(values):
        if h <= config.warmup_steps:
            raise ParameterError(
                "horizons", f"horizons must be > warmup_steps={config.warmup_steps}, got {h}"
            )
        out[h] = config.replace(steps=h)
    for h, c in list(out.items())[:-1]:
        if c.cooldown_start % config.log_interval:
            raise ParameterError(
                "horizons",
                f"horizons: horizon {h} starts its cooldown at step {c.cooldown_start}, not a "
                f"multiple of log_interval={config.log_interval}",
            )
    return out


def _ended(folder: Path) -> xr.Dataset | None:
    path = folder / LOG
    if not path.exists():
        return None
    log = load_dataset(path)
    return log if log.attrs.get("status") in ENDED else None


def train_horizons(
    model_config: ModelConfig,
    data: ByteCorpus,
    config: TrainConfig,
    horizons: Sequence[int],
    out_dir: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
    keep_checkpoints: bool = False,
    compile: bool = False,
) -> dict[int, xr.Dataset]:
    """Train ``model_config`` once per horizon (see module doc) and return horizon -> log.

    Args:
        model_config, data, device, dtype, progress, compile: as for :func:`train`.
        config: the settings of every horizon but ``steps`` (WSD for several horizons).
        horizons: the horizons in steps (see :func:`horizon_configs`).
        out_dir: the folder of the runs (created; resumed where runs exist).
        keep_checkpoints: keep each horizon's final ``checkpoint.pt`` (the trained weights);
            default: removed once every horizon has ended, leaving the logs.

    Returns:
        Horizon -> its log (``status`` ``"finished"`` or ``"diverged"``; a horizon whose
        branch point the longest run never reached is a diverged log of the longest run,
        with ``diverged_step`` before the branch point).
    """
    configs = horizon_configs(config, horizons)
    out = Path(out_dir)
    longest = max(configs)
    main_dir = out / f"h{longest}"
    branch_points = {h: c.cooldown_start for h, c in configs.items() if h != longest}
    logs: dict[int, xr.Dataset] = {}
    main_log = _ended(main_dir)
    if main_log is None:
        try:
            main_log = train(
                model_config,
                data,
                configs[longest],
                out_dir=main_dir,
                device=device,
                dtype=dtype,
                progress=progress,
                compile=compile,
                snapshots=sorted(branch_points.values()),
            ).log
        except TrainingDiverged as err:
            if err.log is None:
                raise
            main_log = err.log
    logs[longest] = main_log
    for h, point in branch_points.items():
        folder = out / f"h{h}"
        ended = _ended(folder)
        if ended is not None:
            logs[h] = ended
            continue
        snapshot = main_dir / f"checkpoint-{point}.pt"
        if not snapshot.exists():  # the longest run diverged before this branch point
            logs[h] = main_log
            continue
        try:
            logs[h] = train(
                model_config,
                data,
                configs[h],
                out_dir=folder,
                device=device,
                dtype=dtype,
                progress=progress,
                compile=compile,
                branch_from=snapshot,
            ).log
        except TrainingDiverged as err:
            if err.log is None:
                raise
            logs[h] = err.log
    for point in branch_points.values():
        (main_dir / f"checkpoint-{point}.pt").unlink(missing_ok=True)
    if not keep_checkpoints:
        for h in configs:
            (out / f"h{h}" / CHECKPOINT).unlink(missing_ok=True)
    return dict(sorted(logs.items()))


__all__ = ["ENDED", "horizon_configs", "train_horizons"]
