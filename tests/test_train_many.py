"""``train_many``: several runs stepped in turn in one process, each its own ``train``."""

from __future__ import annotations

import numpy as np
import pytest

from shapedtx import TrainConfig, load_corpus, preset, train
from shapedtx._validation import ParameterError
from shapedtx.training import Run, TrainingDiverged, train_many

TEXT = "while n > 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1  # six runs at once\n" * 40
SHAPED = preset("shaped", width=8, depth=2, heads=2, causal=True).replace(mlp_slopes="layer")
PRE_LN = preset("pre_ln", width=8, depth=2, heads=2, causal=True)
CONFIG = TrainConfig(
    steps=4, batch_size=2, seq_len=8, lr=1e-2, warmup_steps=1, log_interval=2, eval_interval=2,
    eval_batches=1, metrics_batch=2,
)  # fmt: skip
NAMES = ("train_loss", "val_loss", "grad_norm", "grad_norm_block", "lr")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(TEXT)
    return load_corpus(path, val_fraction=0.2)


def _check_alone(runs, results, data):
    for run, result in zip(runs, results, strict=True):
        assert not isinstance(result, TrainingDiverged) and result.finished
        alone = train(run.model_config, data, run.config, progress=False).log
        for name in NAMES:
            a, b = alone[name].values, result.log[name].values
            assert np.array_equal(a, b, equal_nan=True), (run.config.lr, name)


def test_two_runs_together_are_each_run_alone(data, tmp_path):
    """Two runs (two shapes, their own lrs and seeds) trained together give each run's own
    ``train`` log bit for bit, and write each run's checkpoint."""
    runs = [
        Run(SHAPED, CONFIG.replace(lr=3e-3, seed=0), out_dir=tmp_path / "a"),
        Run(PRE_LN, CONFIG.replace(lr=3e-2, seed=1), out_dir=tmp_path / "b"),
    ]
    results = train_many(runs, data, progress=False)
    assert (tmp_path / "a" / "checkpoint.pt").is_file()
    assert (tmp_path / "b" / "checkpoint.pt").is_file()
    _check_alone(runs, results, data)


@pytest.mark.slow  # twelve short runs: two minutes on a busy CPU
def test_six_runs_together_are_each_run_alone(data):
    """A study's six runs at once (two shapes at three lrs, each its own seed)."""
    runs = [
        Run(model, CONFIG.replace(lr=lr, seed=seed))
        for model in (SHAPED, PRE_LN)
        for lr, seed in ((3e-3, 0), (1e-2, 1), (3e-2, 2))
    ]
    results = train_many(runs, data, progress=False)
    assert len(results) == 6
    _check_alone(runs, results, data)
    assert len({r.log["train_loss"].values[-1] for r in results}) == 6  # six different runs


def test_a_time_limit_stops_every_run_and_the_next_call_finishes_them(data, tmp_path):
    runs = [Run(SHAPED, CONFIG.replace(seed=s), out_dir=tmp_path / f"{s}") for s in (0, 1)]
    first = train_many(runs, data, progress=False, time_limit=1e-9)
    assert all(not r.finished for r in first)
    second = train_many(runs, data, progress=False)
    for run, result in zip(runs, second, strict=True):
        alone = train(run.model_config, data, run.config, progress=False).log
        assert result.finished
        assert np.array_equal(alone["val_loss"].values, result.log["val_loss"].values)


@pytest.mark.parametrize(
    ("runs", "parameter", "match"),
    [
        ([], "runs", "non-empty"),
        (Run(SHAPED, CONFIG), "runs", "sequence"),
        ([Run(SHAPED, CONFIG), "pre_ln"], "runs", "index 1"),
        ([Run(SHAPED, CONFIG), Run(SHAPED, CONFIG, snapshots=(3,), out_dir="x")], "snapshots",
         r"runs\[1\]"),
    ],
)  # fmt: skip
def test_bad_runs_are_refused_before_any_run_starts(data, runs, parameter, match):
    with pytest.raises(ParameterError, match=match) as info:
        train_many(runs, data, progress=False)
    assert info.value.parameter == parameter


@pytest.mark.slow  # two compilations of the step: minutes on a busy CPU
def test_compiled_runs_together_are_each_eager_run_alone(data, monkeypatch):
    import shapedtx.training.step as step_module

    monkeypatch.setattr(step_module, "COMPILE_BACKEND", "aot_eager")
    runs = [Run(SHAPED, CONFIG.replace(lr=lr, seed=s)) for lr, s in ((3e-3, 0), (3e-2, 1))]
    results = train_many(runs, data, progress=False, compile="step")
    for run, result in zip(runs, results, strict=True):
        alone = train(run.model_config, data, run.config, progress=False).log
        for name in NAMES:
            a, b = alone[name].values, result.log[name].values
            assert np.allclose(a, b, rtol=1e-5, equal_nan=True), (run.config.lr, name)
