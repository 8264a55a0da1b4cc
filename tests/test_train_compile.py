"""``train(..., compile=True)``: the same run through ``torch.compile``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shapedtx import ModelConfig, TrainConfig, load_corpus, train

TEXT = "for i in range(3):\n    print(i * i)  # compiled or not, the same run\n" * 40
MODEL = ModelConfig(width=8, depth=1, attention="softmax", mlp="relu", heads=2, causal=True)
CONFIG = TrainConfig(
    steps=4,
    batch_size=2,
    seq_len=8,
    lr=1e-2,
    warmup_steps=1,
    log_interval=2,
    eval_interval=2,
    eval_batches=1,
    metrics_batch=2,
    seed=3,
)


def test_compiled_training_is_the_same_run(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    data = load_corpus(path, val_fraction=0.2)
    eager = train(MODEL, data, CONFIG, progress=False).log
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = train(MODEL, data, CONFIG, progress=False, compile=True).log
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert compiled.attrs["compiled"] == 1 and eager.attrs["compiled"] == 0
    for name in ("train_loss", "val_loss", "grad_norm"):
        a, b = eager[name].values, compiled[name].values
        assert np.allclose(a, b, rtol=1e-4, equal_nan=True), (name, a, b)
    assert np.isfinite(compiled["val_loss"].values[-1])


def test_compile_must_be_a_bool(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    with pytest.raises(ValueError, match="compile"):
        train(MODEL, load_corpus(path, val_fraction=0.2), CONFIG, progress=False, compile=1)
