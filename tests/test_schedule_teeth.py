"""The learning-rate schedules (``lr_factor``, ``TrainConfig.cooldown_start``) and the
branched horizons (``horizon_configs``, ``train_horizons`` with ``train`` replaced by a
recorder): every boundary and error condition of their docstrings (issue 66)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import xarray as xr

import shapedtx.training.horizons as hz
from shapedtx import ModelConfig, ParameterError, TrainConfig
from shapedtx.results import save_dataset
from shapedtx.training import horizon_configs, train_horizons
from shapedtx.training.trainer import CHECKPOINT, LOG, TrainingDiverged, lr_factor


def _wsd(step, steps, warmup, cooldown, low):
    """docs: linear warm-up (step + 1) / warmup, 1 until the cooldown start, then linear to
    ``low`` at ``steps`` (and after)."""
    if step < warmup:
        return (step + 1) / warmup
    start = steps - cooldown
    if step < start:
        return 1.0
    return low + (1 - low) * (1 - min((step - start) / cooldown, 1.0))


def _cosine(step, steps, warmup, low):
    if step < warmup:
        return (step + 1) / warmup
    p = min((step - warmup) / (steps - warmup), 1.0)
    return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * p))


@pytest.mark.parametrize(
    ("steps", "warmup", "fraction", "low", "cooldown"),
    [
        (20, 4, 0.25, 0.1, 5),
        (20, 0, 0.25, 0.0, 5),  # no warm-up
        (10, 2, 0.25, 0.3, 2),  # round(2.5) = 2 (half to even)
        (10, 2, 0.35, 0.3, 4),  # round(3.5) = 4
        (30, 3, 0.01, 0.2, 1),  # round(0.3) = 0: at least one cooldown step
        (12, 0, 1.0, 0.1, 12),  # all cooldown
        (16, 4, 0.75, 0.5, 12),  # cooldown starting right after the warm-up
    ],
)
def test_wsd_factor_at_every_step_and_past_the_end(steps, warmup, fraction, low, cooldown):
    c = TrainConfig(
        steps=steps, warmup_steps=warmup, schedule="wsd", cooldown_fraction=fraction,
        min_lr_ratio=low, log_interval=1, eval_interval=1,
    )  # fmt: skip
    assert c.cooldown_start == steps - cooldown
    for step in range(steps + 3):
        assert lr_factor(step, c) == pytest.approx(
            _wsd(step, steps, warmup, cooldown, low), rel=1e-12, abs=1e-15
        ), step
    assert lr_factor(steps, c) == pytest.approx(low, abs=1e-15)


@pytest.mark.parametrize(("steps", "warmup", "low"), [(20, 4, 0.1), (9, 0, 0.0), (7, 6, 0.5)])
def test_cosine_factor_at_every_step_and_past_the_end(steps, warmup, low):
    c = TrainConfig(steps=steps, warmup_steps=warmup, min_lr_ratio=low, log_interval=1,
                    eval_interval=1)  # fmt: skip
    assert c.cooldown_start == steps and c.schedule == "cosine"
    for step in range(steps + 3):
        assert lr_factor(step, c) == pytest.approx(_cosine(step, steps, warmup, low), abs=1e-14)


def test_wsd_cooldown_must_start_after_the_warm_up():
    kw = dict(steps=20, schedule="wsd", log_interval=1, eval_interval=1)
    assert TrainConfig(warmup_steps=5, cooldown_fraction=0.75, **kw).cooldown_start == 5
    with pytest.raises(ParameterError) as err:
        TrainConfig(warmup_steps=6, cooldown_fraction=0.75, **kw)
    assert err.value.parameter == "cooldown_fraction"
    TrainConfig(steps=20, warmup_steps=6, cooldown_fraction=0.75)  # cosine: not checked
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ParameterError) as err:
            TrainConfig(cooldown_fraction=bad, **kw)
        assert err.value.parameter == "cooldown_fraction"
    assert TrainConfig(cooldown_fraction=1.0, warmup_steps=0, **kw).cooldown_start == 0
    with pytest.raises(ParameterError) as err:
        TrainConfig(schedule="linear")
    assert err.value.parameter == "schedule"


BASE = TrainConfig(steps=100, warmup_steps=4, schedule="wsd", cooldown_fraction=0.25,
                   log_interval=2, eval_interval=4, checkpoint_interval=4)  # fmt: skip


def test_horizon_configs_are_ascending_with_their_steps():
    out = horizon_configs(BASE, [16, 8, 40])
    assert list(out) == [8, 16, 40]
    for h, c in out.items():
        assert c == BASE.replace(steps=h)
    assert list(horizon_configs(BASE, (5,))) == [5]  # one horizon, just past the warm-up
    assert list(horizon_configs(BASE.replace(schedule="cosine"), [12])) == [12]


@pytest.mark.parametrize(
    ("horizons", "message"),
    [
        ([], "non-empty sequence of ints"),
        ((8, 8), "distinct"),
        ((8, True), "non-empty sequence of ints"),
        ((8.0,), "non-empty sequence of ints"),
        (("8",), "non-empty sequence of ints"),
        ((4,), "> warmup_steps=4"),
        ((3, 16), "> warmup_steps=4"),
    ],
)
def test_horizon_configs_refuse(horizons, message):
    with pytest.raises(ParameterError, match=re.escape(message)) as err:
        horizon_configs(BASE, horizons)
    assert err.value.parameter == "horizons"


def test_only_the_shorter_horizons_cooldown_starts_must_fall_on_a_log_row():
    # cooldown starts: 12 -> 9, 16 -> 12, 18 -> 14 (round(4.5) = 4), 20 -> 15
    assert list(horizon_configs(BASE, (16, 18, 20))) == [16, 18, 20]  # 20: the longest
    for bad in [(12, 16), (16, 20, 24)]:
        with pytest.raises(ParameterError, match="not a multiple of log_interval") as err:
            horizon_configs(BASE, bad)
        assert err.value.parameter == "horizons"
    with pytest.raises(ParameterError, match="schedule='wsd'"):
        horizon_configs(BASE.replace(schedule="cosine"), (8, 16))


MODEL = ModelConfig(width=8, depth=1)


def _log(status: str, tag: int) -> xr.Dataset:
    return xr.Dataset({"x": ("step", np.arange(3.0) + tag)}, attrs={"status": status})


class _Recorder:
    """``train`` replaced: records each call, writes the snapshots asked for (unless the
    run ``diverges_at`` a step before them), the run's log and checkpoint."""

    def __init__(self, diverges_at=None, no_log=False):
        self.calls, self.diverges_at, self.no_log = [], diverges_at, no_log

    def __call__(self, model, data, config, *, out_dir, snapshots=(), branch_from=None, **kw):
        out_dir = Path(out_dir)
        self.calls.append(
            dict(steps=config.steps, out_dir=out_dir, snapshots=list(snapshots),
                 branch_from=branch_from, **kw)
        )  # fmt: skip
        out_dir.mkdir(parents=True, exist_ok=True)
        for s in snapshots:
            if self.diverges_at is None or s < self.diverges_at:
                (out_dir / f"checkpoint-{s}.pt").write_text("")
        (out_dir / CHECKPOINT).write_text("")
        if self.diverges_at is not None and not branch_from:
            log = None if self.no_log else _log("diverged", config.steps)
            if log is not None:
                save_dataset(log, out_dir / LOG)
            raise TrainingDiverged("nan", step=self.diverges_at, checkpoint=None, log=log)
        log = _log("finished", config.steps)
        save_dataset(log, out_dir / LOG)
        return SimpleNamespace(log=log)


def test_train_horizons_trains_the_longest_with_snapshots_and_branches_the_others(
    tmp_path, monkeypatch
):
    rec = _Recorder()
    monkeypatch.setattr(hz, "train", rec)
    logs = train_horizons(MODEL, "data", BASE, (20, 8, 16), tmp_path, device="cpu",
                          progress=False, compile=True)  # fmt: skip
    assert list(logs) == [8, 16, 20]
    main, *branches = rec.calls
    assert main["steps"] == 20 and main["out_dir"] == tmp_path / "h20"
    assert main["snapshots"] == [6, 12] and main["branch_from"] is None
    assert main["compile"] is True and main["progress"] is False and main["device"] == "cpu"
    assert [(c["steps"], c["out_dir"], c["branch_from"]) for c in branches] == [
        (8, tmp_path / "h8", tmp_path / "h20" / "checkpoint-6.pt"),
        (16, tmp_path / "h16", tmp_path / "h20" / "checkpoint-12.pt"),
    ]
    for h in (8, 16, 20):
        assert float(logs[h]["x"][0]) == h
        assert not (tmp_path / f"h{h}" / CHECKPOINT).exists()  # removed, logs kept
        assert (tmp_path / f"h{h}" / LOG).exists()
    assert not list((tmp_path / "h20").glob("checkpoint-*.pt"))
    # a second call trains nothing: every horizon has ended
    n = len(rec.calls)
    again = train_horizons(MODEL, "data", BASE, (8, 16, 20), tmp_path, progress=False)
    assert len(rec.calls) == n and list(again) == [8, 16, 20]


def test_train_horizons_keeps_checkpoints_when_asked_and_retrains_a_running_log(
    tmp_path, monkeypatch
):
    rec = _Recorder()
    monkeypatch.setattr(hz, "train", rec)
    train_horizons(MODEL, "data", BASE, (8, 20), tmp_path, keep_checkpoints=True)
    assert (tmp_path / "h8" / CHECKPOINT).exists() and (tmp_path / "h20" / CHECKPOINT).exists()
    assert not (tmp_path / "h20" / "checkpoint-6.pt").exists()  # snapshots go regardless
    save_dataset(_log("running", 0), tmp_path / "h8" / LOG)  # not ended: trained again
    (tmp_path / "h20" / "checkpoint-6.pt").write_text("")  # from its snapshot
    n = len(rec.calls)
    train_horizons(MODEL, "data", BASE, (8, 20), tmp_path)
    assert [c["steps"] for c in rec.calls[n:]] == [8]
    assert not (tmp_path / "h20" / "checkpoint-6.pt").exists()
    save_dataset(_log("running", 0), tmp_path / "h8" / LOG)  # without its snapshot: the
    assert train_horizons(MODEL, "data", BASE, (8, 20), tmp_path)[8].attrs["status"] == (
        "finished"
    )  # longest run's log stands for it
    save_dataset(_log("diverged", 5), tmp_path / "h8" / LOG)  # ended: kept
    assert float(train_horizons(MODEL, "data", BASE, (8, 20), tmp_path)[8]["x"][0]) == 5


def test_a_diverged_longest_run_stands_for_the_horizons_it_never_branched(tmp_path, monkeypatch):
    """The longest run diverges after the first branch point (6) but before the second (12):
    horizon 8 branches, horizon 16 gets the diverged log of the longest run."""
    rec = _Recorder(diverges_at=11)
    monkeypatch.setattr(hz, "train", rec)
    logs = train_horizons(MODEL, "data", BASE, (8, 16, 20), tmp_path)
    assert [c["steps"] for c in rec.calls] == [20, 8]
    assert logs[20].attrs["status"] == "diverged" and logs[16] is logs[20]
    assert logs[8].attrs["status"] == "finished"
    monkeypatch.setattr(hz, "train", _Recorder(diverges_at=11, no_log=True))
    with pytest.raises(TrainingDiverged):  # a divergence without a log is raised
        train_horizons(MODEL, "data", BASE, (8, 20), tmp_path / "y")


def test_train_horizons_passes_the_documented_defaults_to_train(tmp_path, monkeypatch):
    """``device``, ``dtype``, ``progress`` and ``compile`` default as for ``train``."""
    rec = _Recorder()
    monkeypatch.setattr(hz, "train", rec)
    train_horizons(MODEL, "data", BASE, (8, 20), tmp_path)
    assert len(rec.calls) == 2
    for call in rec.calls:
        assert call["device"] is None and call["dtype"] is torch.float32
        assert call["progress"] is True and call["compile"] is False


class _DivergingBranch(_Recorder):
    """``train`` replaced: the longest run finishes, every branch diverges (with or without
    its log)."""

    def __call__(self, model, data, config, *, out_dir, snapshots=(), branch_from=None, **kw):
        if branch_from is None:
            return super().__call__(model, data, config, out_dir=out_dir, snapshots=snapshots,
                                    **kw)  # fmt: skip
        self.calls.append(dict(steps=config.steps, branch_from=branch_from))
        log = None if self.no_log else _log("diverged", config.steps)
        if log is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            save_dataset(log, Path(out_dir) / LOG)
        raise TrainingDiverged("nan", step=config.steps - 1, checkpoint=None, log=log)


def test_a_diverged_branch_is_returned_and_one_without_a_log_is_raised(tmp_path, monkeypatch):
    rec = _DivergingBranch()
    monkeypatch.setattr(hz, "train", rec)
    logs = train_horizons(MODEL, "data", BASE, (8, 16, 20), tmp_path)
    assert [c["steps"] for c in rec.calls] == [20, 8, 16]
    assert logs[20].attrs["status"] == "finished"
    for h in (8, 16):
        assert logs[h].attrs["status"] == "diverged" and float(logs[h]["x"][0]) == h
    assert not list((tmp_path / "h20").glob("checkpoint-*.pt"))
    monkeypatch.setattr(hz, "train", _DivergingBranch(no_log=True))
    with pytest.raises(TrainingDiverged):
        train_horizons(MODEL, "data", BASE, (8, 20), tmp_path / "y")
