"""Learning-rate schedules (cosine, warmup-stable-decay) and WSD branching from snapshots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shapedtx import ModelConfig, TrainConfig, load_corpus, train
from shapedtx.training import lr_factor

TEXT = "def f(x):\n    return x * 2  # a shaped transformer keeps its tokens apart\n" * 60
MODEL = ModelConfig(
    width=16, depth=2, attention="shaped", mlp="shaped_relu", heads=2, out_proj=True, causal=True
)
WSD = TrainConfig(
    steps=16,
    batch_size=4,
    seq_len=16,
    lr=1e-2,
    warmup_steps=2,
    schedule="wsd",
    cooldown_fraction=0.25,
    log_interval=2,
    eval_interval=4,
    eval_batches=2,
    metrics_batch=2,
    checkpoint_interval=4,
    seed=5,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text(TEXT)
    return load_corpus(path, val_fraction=0.2)


def test_wsd_learning_rate_at_every_step():
    """Warm-up (step + 1) / w, 1 until steps - round(f steps), then linear to min_lr_ratio."""
    config = TrainConfig(
        steps=100, warmup_steps=10, schedule="wsd", cooldown_fraction=0.2, min_lr_ratio=0.1
    )
    assert config.cooldown_start == 80
    f = [lr_factor(s, config) for s in range(101)]
    expected = [(s + 1) / 10 for s in range(10)] + [1.0] * 71
    expected += [0.1 + 0.9 * (1 - (s - 80) / 20) for s in range(81, 101)]
    np.testing.assert_allclose(f, expected, rtol=0, atol=1e-15)
    assert f[80] == 1.0 and f[100] == pytest.approx(0.1)


def test_cosine_learning_rate_at_every_step():
    config = TrainConfig(steps=50, warmup_steps=5, min_lr_ratio=0.2)
    assert config.schedule == "cosine" and config.cooldown_start == 50
    expected = [(s + 1) / 5 for s in range(5)] + [
        0.2 + 0.8 * 0.5 * (1 + np.cos(np.pi * (s - 5) / 45)) for s in range(5, 51)
    ]
    np.testing.assert_allclose([lr_factor(s, config) for s in range(51)], expected, atol=1e-15)


def test_wsd_horizons_share_the_stable_phase():
    """Two WSD runs differing only in steps agree up to the earlier cooldown start and no
    further."""
    short, long = WSD.replace(steps=200), WSD.replace(steps=1000)
    same = [lr_factor(s, short) == lr_factor(s, long) for s in range(201)]
    assert all(same[: short.cooldown_start + 1]) and not any(same[short.cooldown_start + 1 :])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": "linear"}, "schedule"),
        ({"cooldown_fraction": 0.0}, "cooldown_fraction"),
        ({"cooldown_fraction": 1.5}, "cooldown_fraction"),
        ({"cooldown_fraction": 0.95, "warmup_steps": 2}, "cooldown_fraction"),
    ],
)
def test_schedule_fields_are_validated(changes, message):
    with pytest.raises(ValueError, match=message):
        WSD.replace(**changes)


def test_schedule_round_trips_through_attrs():
    assert TrainConfig.from_attrs(WSD.to_attrs()) == WSD


def test_trained_lr_follows_the_wsd_schedule(corpus):
    log = train(
        MODEL,
        corpus,
        WSD.replace(log_interval=1, eval_interval=4, checkpoint_interval=0),
        progress=False,
    ).log
    lrs = log["lr"].values[1:]
    np.testing.assert_allclose(lrs, [WSD.lr * lr_factor(s, WSD) for s in range(WSD.steps)])


def test_branched_cooldown_equals_the_full_run_bitwise(corpus, tmp_path):
    """A horizon-8 run branched from a snapshot of a horizon-16 run at its cooldown start
    is the horizon-8 run trained from the start: same log, same weights (CPU, bitwise)."""
    short = WSD.replace(steps=8)
    assert short.cooldown_start == 6
    main = train(
        MODEL,
        corpus,
        WSD.replace(checkpoint_interval=4, log_interval=2),
        out_dir=tmp_path / "main",
        snapshots=[6],
        progress=False,
    )
    snapshot = tmp_path / "main" / "checkpoint-6.pt"
    assert snapshot.is_file() and main.log.attrs["status"] == "finished"
    branched = train(
        MODEL, corpus, short, out_dir=tmp_path / "branch", branch_from=snapshot, progress=False
    )
    direct = train(MODEL, corpus, short, progress=False)
    for name in ("train_loss", "val_loss", "lr", "grad_norm", "mean_rho"):
        np.testing.assert_array_equal(branched.log[name].values, direct.log[name].values)
    for (key, a), b in zip(
        branched.model.state_dict().items(), direct.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), key
    assert branched.log.attrs["branch_step"] == 6
    assert branched.log.attrs["branched_from"] == str(snapshot)
    # the branch differs from the main run after the branch point
    assert not np.array_equal(branched.log["lr"].values[-1], main.log["lr"].sel(step=8).values)


def test_branch_resumes_from_its_own_checkpoint(corpus, tmp_path):
    """An interrupted branch resumes from its own checkpoint, keeping its origin."""
    train(MODEL, corpus, WSD, out_dir=tmp_path / "main", snapshots=[6], progress=False)
    short = WSD.replace(steps=8, checkpoint_interval=2)
    snapshot = tmp_path / "main" / "checkpoint-6.pt"

    def stop(step, loss):
        if step == 8:
            raise KeyboardInterrupt
        return loss

    with pytest.raises(KeyboardInterrupt):
        train(
            MODEL,
            corpus,
            short,
            out_dir=tmp_path / "b",
            branch_from=snapshot,
            loss_hook=stop,
            progress=False,
        )
    resumed = train(
        MODEL, corpus, short, out_dir=tmp_path / "b", branch_from=snapshot, progress=False
    )
    direct = train(MODEL, corpus, short, progress=False)
    np.testing.assert_array_equal(resumed.log["train_loss"].values, direct.log["train_loss"].values)
    assert resumed.log.attrs["branch_step"] == 6


def test_branch_refuses_a_checkpoint_past_its_cooldown_start(corpus, tmp_path):
    train(MODEL, corpus, WSD, out_dir=tmp_path / "main", snapshots=[8], progress=False)
    with pytest.raises(ValueError, match="differ at step 7"):
        train(
            MODEL,
            corpus,
            WSD.replace(steps=8),
            branch_from=tmp_path / "main" / "checkpoint-8.pt",
            progress=False,
        )


def test_branch_refuses_other_settings(corpus, tmp_path):
    train(MODEL, corpus, WSD, out_dir=tmp_path / "main", snapshots=[4], progress=False)
    snapshot = tmp_path / "main" / "checkpoint-4.pt"
    with pytest.raises(ValueError, match=r"train\.lr"):
        train(MODEL, corpus, WSD.replace(steps=8, lr=2e-2), branch_from=snapshot, progress=False)
    with pytest.raises(ValueError, match="branch_from"):
        train(MODEL, corpus, WSD, branch_from=tmp_path / "missing.pt", progress=False)


@pytest.mark.parametrize(
    ("snapshots", "message"), [([3], "multiples of log_interval"), ([18], "ints in"), ([0], "ints")]
)
def test_snapshots_are_validated(corpus, tmp_path, snapshots, message):
    with pytest.raises(ValueError, match=message):
        train(MODEL, corpus, WSD, out_dir=tmp_path, snapshots=snapshots, progress=False)
    with pytest.raises(ValueError, match="out_dir"):
        train(MODEL, corpus, WSD, snapshots=[4], progress=False)


def test_resume_from_the_initial_checkpoint_logs_step_0_once(corpus, tmp_path):
    """Interrupted before the first step completes (only the step-0 checkpoint exists): the
    resumed run is the uninterrupted one, with one row for step 0."""

    def stop(step, loss):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(MODEL, corpus, WSD, out_dir=tmp_path, loss_hook=stop, progress=False)
    resumed = train(MODEL, corpus, WSD, out_dir=tmp_path, progress=False).log
    direct = train(MODEL, corpus, WSD, progress=False).log
    assert list(resumed.step.values) == list(direct.step.values)
    np.testing.assert_array_equal(resumed["val_loss"].values, direct["val_loss"].values)


def test_a_checkpoint_older_than_a_config_field_resumes_at_its_default(corpus, tmp_path):
    """A checkpoint written before a field existed (here: without schedule and
    cooldown_fraction) resumes when the field has its default, and not otherwise."""
    config = WSD.replace(schedule="cosine", cooldown_fraction=0.2, steps=8)

    def stop(step, loss):
        if step == 5:
            raise KeyboardInterrupt
        return loss

    with pytest.raises(KeyboardInterrupt):
        train(MODEL, corpus, config, out_dir=tmp_path, loss_hook=stop, progress=False)
    path = tmp_path / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    for key in ("train.schedule", "train.cooldown_fraction"):
        del state["identity"][key]
    torch.save(state, path)
    with pytest.raises(ValueError, match="schedule"):
        train(MODEL, corpus, config.replace(schedule="wsd"), out_dir=tmp_path, progress=False)
    resumed = train(MODEL, corpus, config, out_dir=tmp_path, progress=False).log
    direct = train(MODEL, corpus, config, progress=False).log
    np.testing.assert_array_equal(resumed["train_loss"].values, direct["train_loss"].values)
