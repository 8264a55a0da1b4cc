"""``simulations.training_runs`` without training: the summary of a horizon's log, the
loss a study ranks by, the corpus check, the run's fields and the planned/listed runners'
bookkeeping, on hand-built logs and results (issue 66)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import simulations.training_runs as tr
from shapedtx import ModelConfig, ParameterError, TrainConfig
from simulations.sweep.tasks import TaskSummary
from simulations.training_runs import (
    RESULT,
    TrainingRun,
    horizon_loss,
    one_corpus,
    run_planned,
    run_trainings,
    summarise_log,
)

MODEL = ModelConfig(width=16, depth=2, heads=2, out_proj=True, causal=True)
TRAIN = TrainConfig(
    batch_size=4, seq_len=16, warmup_steps=2, schedule="wsd", log_interval=2, eval_interval=4
)
METRICS = ("mean_rho", "centred_stable_rank", "stable_rank")


def _log(val, train, status="finished", layers=3, **attrs) -> xr.Dataset:
    """A training log: steps 0, 2, 4, ...; ``val`` and ``train`` per step (NaN: not logged);
    metric ``name`` at step s, layer l is ``100 i + 10 s + l`` (i the metric's index)."""
    steps = np.arange(len(val)) * 2
    data = {
        "val_loss": ("step", np.asarray(val, dtype=float)),
        "train_loss": ("step", np.asarray(train, dtype=float)),
    }
    for i, name in enumerate(METRICS):
        values = 100 * i + 10 * steps[:, None] + np.arange(layers)[None, :]
        data[name] = (("step", "layer"), values.astype(float))
    return xr.Dataset(data, coords={"step": steps}, attrs={"status": status, **attrs})


def test_a_finished_run_above_its_initial_loss_is_diverged():
    """A run that finished with a final validation loss above its initial one counts as
    diverged (so a study never ranks it), one at or below it does not."""
    nan = math.nan
    above = summarise_log(_log([3.0, nan, 2.0, 3.5], [nan, 3.1, 2.5, 3.4]), 6)
    assert above["status"] == "finished" and above["diverged"] is True
    assert above["val_loss"] == 3.5 and above["init_val_loss"] == 3.0
    equal = summarise_log(_log([3.0, 2.0, 3.0], [nan, 2.5, 2.9]), 4)
    assert equal["diverged"] is False and equal["val_loss"] == 3.0
    below = summarise_log(_log([3.0, 2.0, 2.9], [nan, 2.5, 2.9]), 4)
    assert below["diverged"] is False and below["val_loss"] == 2.9


def test_a_run_that_did_not_finish_or_ended_non_finite_is_diverged():
    nan = math.nan
    for status in ("diverged", "running", "None"):
        out = summarise_log(_log([3.0, 2.0], [nan, 2.5], status=status), 2)
        assert out["diverged"] is True and out["status"] == status
        assert out["val_loss"] is None  # the final loss of a run that did not finish
        assert out["init_val_loss"] == 3.0
    no_status = _log([3.0, 2.0], [nan, 2.5])
    del no_status.attrs["status"]
    out = summarise_log(no_status, 2)
    assert out["status"] == "None" and out["diverged"] is True
    inf = summarise_log(_log([3.0, math.inf], [nan, 2.5]), 2)
    assert inf["diverged"] is True and inf["val_loss"] is None
    nan_final = summarise_log(_log([3.0, 2.0, nan], [nan, 2.5, 2.0]), 4)  # last row: no eval
    assert nan_final["val_loss"] == 2.0 and nan_final["diverged"] is False


def test_summary_fields_of_a_horizons_log():
    """Every field of the summary: the horizon, the curves (the validation curve over the
    evaluated steps only, the training curve without step 0), non-finite values as None,
    the branch and divergence steps from the attrs (None when absent) and the metrics at the
    first and last logged step."""
    nan = math.nan
    log = _log([4.0, nan, 3.0, nan, 2.5], [nan, 3.8, math.inf, 2.9, 2.6])
    out = summarise_log(log, 8)
    assert out["horizon"] == 8
    assert out["val_curve"] == {"step": [0, 4, 8], "loss": [4.0, 3.0, 2.5]}
    assert out["train_curve"] == {"step": [2, 4, 6, 8], "loss": [3.8, None, 2.9, 2.6]}
    assert out["diverged_step"] is None and out["branch_step"] is None
    for i, name in enumerate(METRICS):
        assert out[name] == {
            "init": [100.0 * i + j for j in range(3)],
            "final": [100.0 * i + 80 + j for j in range(3)],
            "final_step": 8,
        }
    both = summarise_log(_log([4.0, 3.0], [nan, 3.0], diverged_step=7, branch_step=6), 2)
    assert both["diverged_step"] == 7 and both["branch_step"] == 6
    assert isinstance(both["diverged_step"], int) and isinstance(both["branch_step"], int)
    zero = summarise_log(_log([4.0, 3.0], [nan, 3.0], diverged_step=0, branch_step=0), 2)
    assert zero["diverged_step"] == 0 and zero["branch_step"] == 0
    assert set(out) == {
        "horizon", "status", "diverged_step", "val_loss", "init_val_loss", "diverged",
        "val_curve", "train_curve", "branch_step", *METRICS,
    }  # fmt: skip
    json.dumps(out, allow_nan=False)  # JSON without NaN


def test_summary_keeps_the_largest_attention_logits():
    """``max_logit(step, block, head)`` is kept as the largest over heads per block at the
    first and last step and over the run, and the largest over blocks and heads per step;
    NaN (a block without softmax logits, a missing head) is ignored, None where all are NaN."""
    nan = math.nan
    log = _log([4.0, 3.0, 2.5], [nan, 3.0, 2.6])
    top = np.array(
        [
            [[1.0, 2.0], [nan, nan], [3.0, nan]],  # step 0: blocks 0-2, heads 0-1
            [[9.0, 4.0], [nan, nan], [1.0, 2.0]],  # step 2: the peak of block 0
            [[5.0, 6.0], [nan, nan], [7.0, 0.5]],  # step 4
        ]
    )
    log["max_logit"] = (("step", "block", "head"), top)
    out = summarise_log(log, 4)["max_logit"]
    assert out["init"] == [2.0, None, 3.0]
    assert out["final"] == [6.0, None, 7.0]
    assert out["peak"] == [9.0, None, 7.0]
    assert out["curve"] == {"step": [0, 2, 4], "value": [3.0, 9.0, 7.0]}
    json.dumps(out, allow_nan=False)


def test_summary_of_a_log_without_any_evaluation():
    out = summarise_log(_log([math.nan, math.nan], [math.nan, 2.0]), 2)
    assert out["val_loss"] is None and out["init_val_loss"] is None and out["diverged"] is True
    assert out["val_curve"] == {"step": [], "loss": []}


def test_horizon_loss_is_inf_for_a_diverged_or_absent_horizon():
    result = {
        "horizons": {
            "8": {"diverged": False, "val_loss": 2.5},
            "16": {"diverged": True, "val_loss": 9.0},
        }
    }
    assert horizon_loss(result, 8) == 2.5 and isinstance(horizon_loss(result, 8), float)
    assert horizon_loss(result, 16) == math.inf
    assert horizon_loss(result, 32) == math.inf


def test_one_corpus_counts_fingerprints():
    assert one_corpus([]) is None
    assert one_corpus([{"x": 1}]) is None
    assert one_corpus([{"corpus_fingerprint": "a"}, {"x": 1}, {"corpus_fingerprint": "a"}]) == "a"
    runs = [{"corpus_fingerprint": "b"}, {"corpus_fingerprint": "a"}, {"corpus_fingerprint": "b"}]
    with pytest.raises(ValueError) as err:
        one_corpus(runs)
    assert "2 different corpora (a (1 runs), b (2 runs))" in str(err.value)


def test_training_run_fields_and_checks(tmp_path):
    run = TrainingRun(MODEL, TRAIN, [16, 8], str(tmp_path / "r"))
    assert run.horizons == (8, 16)  # sorted, a tuple
    assert run.result_path == tmp_path / "r" / RESULT and RESULT == "result.json"
    assert (run.max_bytes, run.data, run.device, run.dtype) == (8_000_000, None, "cpu", "float32")
    assert run.compile is False and run.labels == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.folder = str(tmp_path / "elsewhere")  # frozen: a run is a value
    TrainingRun(MODEL, TRAIN, (16,), str(tmp_path), dtype="float64")
    TrainingRun(MODEL, TRAIN, (16,), str(tmp_path), data=str(tmp_path))  # an existing folder
    for bad, name in [
        (dict(model="shaped"), "model"),
        (dict(train={"lr": 1}), "train"),
        (dict(dtype="float16"), "dtype"),
        (dict(data=str(tmp_path / "absent")), "data"),
    ]:
        kw = {**dict(model=MODEL, train=TRAIN, horizons=(16,), folder=str(tmp_path)), **bad}
        with pytest.raises(ParameterError) as err:
            TrainingRun(**kw)
        assert err.value.parameter == name


def _done(run: TrainingRun, value: dict) -> None:
    Path(run.folder).mkdir(parents=True, exist_ok=True)
    run.result_path.write_text(json.dumps(value))


def test_run_trainings_reads_finished_runs_and_runs_the_others(tmp_path, monkeypatch):
    """Finished runs are read from their result, the others handed to run_tasks in order with
    their folders as keys and the caller's options; two runs sharing a folder are refused."""
    runs = [TrainingRun(MODEL, TRAIN, (16,), str(tmp_path / n)) for n in "abc"]
    _done(runs[1], {"done": "b"})
    seen = {}

    def fake(fn, todo, keys, **kw):
        seen.update(fn=fn, todo=list(todo), keys=list(keys), **kw)
        out: TaskSummary = TaskSummary()
        out.results[keys[0]] = {"new": 1}
        out.failed[keys[1]] = "boom"
        return out

    monkeypatch.setattr(tr, "run_tasks", fake)
    summary = run_trainings(runs, workers=3, threads_per_worker=2, threads=5, progress=False)
    assert seen["fn"] is tr.run_training and seen["todo"] == [runs[0], runs[2]]
    assert seen["keys"] == [runs[0].folder, runs[2].folder]
    assert (seen["workers"], seen["threads_per_worker"], seen["threads"]) == (3, 2, 5)
    assert seen["progress"] is False and seen["desc"] == "train" and seen["client"] is None
    assert summary.results == {runs[1].folder: {"done": "b"}, runs[0].folder: {"new": 1}}
    assert summary.failed == {runs[2].folder: "boom"}
    twin = TrainingRun(MODEL, TRAIN, (16,), str(tmp_path / "a" / ".." / "a"))
    with pytest.raises(ParameterError) as err:
        run_trainings([runs[0], twin])
    assert err.value.parameter == "runs"


def test_run_planned_bookkeeping(tmp_path, monkeypatch):
    """run_planned: nothing to run (an empty plan, only finished runs, max_runs=0) starts
    nothing; otherwise run_replanned gets the pending runs by absolute folder, one thread per
    run, max_runs as its cap and no embedded workers beside a client."""
    runs = [TrainingRun(MODEL, TRAIN, (16,), str(tmp_path / n)) for n in "ab"]
    calls = []

    def fake(fn, pending, **kw):
        calls.append((fn, pending(), kw))
        return TaskSummary()

    monkeypatch.setattr(tr, "run_replanned", fake)
    assert run_planned(lambda: []).results == {} and not calls
    assert run_planned(lambda: runs, max_runs=0).results == {} and not calls
    with pytest.raises(ParameterError):
        run_planned(lambda: runs, max_runs=-1)
    _done(runs[0], {})
    run_planned(lambda: runs, workers=2, max_runs=1)
    fn, pending, kw = calls[-1]
    assert fn is tr.run_training
    assert pending == [(str(Path(runs[1].folder).resolve()), runs[1])]
    assert kw["workers"] == 2 and kw["threads"] == 1 and kw["max_jobs"] == 1
    assert kw["client"] is None and kw["desc"] == "train"
    run_planned(lambda: runs, client="tcp://x:1", workers=2)
    assert calls[-1][2]["workers"] is None and calls[-1][2]["client"] == "tcp://x:1"
    assert calls[-1][2]["max_jobs"] is None
    _done(runs[1], {})
    n = len(calls)
    run_planned(lambda: runs)
    assert len(calls) == n  # every planned run finished: nothing started
    with pytest.raises(ParameterError) as err:
        run_planned(lambda: [runs[0], runs[0]])
    assert err.value.parameter == "plan"


def _fake_training(monkeypatch, calls):
    """``run_training`` with ``train_horizons`` replaced by hand-built logs (no training): each
    horizon H finishes at loss 2 + 1 / H from 3, and its ``log.nc`` is written."""
    import shapedtx.training as training

    def fake(model, data, train, horizons, folder, **kw):
        calls.append(dict(model=model, data=data, train=train, horizons=horizons, **kw))
        logs = {}
        for h in horizons:
            logs[h] = _log([3.0, 2.0 + 1 / h], [math.nan, 2.5], branch_step=h - 2)
            (Path(folder) / f"h{h}").mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"h{h}" / "log.nc").write_text("")
        return logs

    monkeypatch.setattr(training, "train_horizons", fake)


def test_run_training_records_every_documented_field(tmp_path, monkeypatch):
    """The result's fields: the labels, the parameter count, the corpus's size, source and
    fingerprint, the unigram baseline, the epochs at the longest horizon, both configs, the
    device and compile flag, not resumed, and one summary per horizon; train_horizons gets
    the run's settings; the result is written and read back by a second call."""
    import torch

    from shapedtx.training import LanguageModel, load_corpus, unigram_baseline

    calls: list = []
    _fake_training(monkeypatch, calls)
    run = TrainingRun(
        MODEL, TRAIN, (16, 8), str(tmp_path / "r"), max_bytes=20_000, dtype="float64",
        labels={"k": 1},
    )  # fmt: skip
    result = tr.run_training(run)
    (call,) = calls
    assert call["model"] is MODEL and call["train"] is TRAIN and call["horizons"] == (8, 16)
    assert call["device"] == "cpu" and call["dtype"] is torch.float64
    assert call["compile"] is False and call["progress"] is False
    data = load_corpus(None, max_bytes=20_000)
    assert call["data"].train.numel() == data.train.numel() == 18_000
    model = LanguageModel(MODEL, TRAIN.seq_len)
    assert result["k"] == 1
    assert result["params"] == sum(p.numel() for p in model.parameters())
    assert result["train_bytes"] == 18_000
    assert result["corpus"] == data.source
    assert result["corpus_fingerprint"] == data.fingerprint()
    assert result["unigram_baseline"] == pytest.approx(unigram_baseline(data), rel=1e-12)
    epochs = 16 * TRAIN.tokens_per_step / 18_000
    assert result["epochs_at_longest"] == pytest.approx(epochs, rel=1e-12)
    assert result["model_config"] == MODEL.to_attrs()
    assert result["train_config"] == TRAIN.to_attrs()
    assert result["device"] == "cpu" and result["compiled"] is False
    assert result["batch_generator"] == "cpu"
    assert result["resumed"] is False and result["wall_seconds"] >= 0
    assert "gpu" not in result["host"] and result["host"]["torch"] == torch.__version__
    assert sorted(result["horizons"]) == ["16", "8"]
    for h in (8, 16):
        summary = result["horizons"][str(h)]
        assert summary["horizon"] == h and summary["branch_step"] == h - 2
        assert summary["val_loss"] == 2.0 + 1 / h and summary["diverged"] is False
    assert json.loads(run.result_path.read_text()) == json.loads(json.dumps(result))
    assert tr.run_training(run) == json.loads(json.dumps(result)) and len(calls) == 1


def test_run_training_on_its_own_logs_or_checkpoints_is_resumed(tmp_path, monkeypatch):
    """``resumed``: a log (``h<H>/log.nc``) or a checkpoint (``h<H>/*.pt``) from an earlier
    call is there (a file elsewhere in the folder is not one)."""
    calls: list = []
    _fake_training(monkeypatch, calls)
    for name, path, resumed in [
        ("log", "h8/log.nc", True),
        ("pt", "h16/checkpoint-6.pt", True),
        ("other", "notes/log.nc", False),
        ("top", "checkpoint.pt", False),
    ]:
        folder = tmp_path / name
        (folder / path).parent.mkdir(parents=True)
        (folder / path).write_text("")
        run = TrainingRun(MODEL, TRAIN, (8, 16), str(folder), max_bytes=20_000)
        assert tr.run_training(run)["resumed"] is resumed, name


def test_run_training_wall_seconds_is_this_calls_time(tmp_path, monkeypatch):
    """``wall_seconds``: the time of this call (``perf_counter`` at the end minus at the start),
    rounded to 0.1 s."""
    from types import SimpleNamespace

    calls: list = []
    _fake_training(monkeypatch, calls)
    clock = iter([1000.0, 1012.34])
    monkeypatch.setattr(tr, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    run = TrainingRun(MODEL, TRAIN, (8,), str(tmp_path / "r"), max_bytes=20_000)
    assert tr.run_training(run)["wall_seconds"] == 12.3
