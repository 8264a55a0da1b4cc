"""The monitor's view of a trainable shape (docs/theory.md#trainable-shape): the gains' means
per block, the MLP slopes' kernel nonlinearity kappa, and the attention logits with a
trainable temperature; logged by the trainer from the same code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shapedtx import Monitor, TrainConfig, preset
from shapedtx.diagnostics import mlp_kappa
from shapedtx.training import LanguageModel, load_corpus, train
from simulations.training_runs import summarise_log

FREE = {"mlp_slopes": "channel", "attention_gains": "trainable", "temperature": "trainable"}


def _model(**changes) -> LanguageModel:
    config = preset("shaped", width=32, depth=3, heads=4, mlp_ratio=4, causal=True, tau0=0.25)
    torch.manual_seed(0)
    return LanguageModel(config.replace(**changes), 16)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def test_gains_and_kappa_are_measured_per_block() -> None:
    model = _model(**FREE)
    with torch.no_grad():
        for b, block in enumerate(model.body.blocks):
            block.attention.gains["attn_beta"].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]) * (b + 1))
            block.mlp.gains["mlp_s_minus"].fill_(0.25 * b)
    log = Monitor(model, _tokens())(0)
    assert log is not None
    gains = list(log.gain.values)
    assert set(gains) == {
        "attn_alpha", "attn_beta", "attn_gamma", "attn_temperature", "mlp_s_plus", "mlp_s_minus"
    }  # fmt: skip
    beta = log["shape_gain"].sel(gain="attn_beta").values[0]
    np.testing.assert_allclose(beta, [2.5, 5.0, 7.5])  # the mean over heads, per block
    np.testing.assert_allclose(log["shape_gain"].sel(gain="attn_alpha").values[0], 1.0)
    kappa = log["mlp_kappa"].values[0]
    expected = [(1 - s) ** 2 / (2 * (1 + s**2)) for s in (0.0, 0.25, 0.5)]
    np.testing.assert_allclose(kappa, expected)


def test_kappa_of_fixed_slopes_and_of_models_without_relu() -> None:
    log = Monitor(_model(), _tokens())(0)
    s_minus = 1 - 1 / math.sqrt(32)
    np.testing.assert_allclose(
        log["mlp_kappa"].values[0], (1 - s_minus) ** 2 / (2 * (1 + s_minus**2))
    )
    assert "shape_gain" not in log  # no trainable gains
    gelu = Monitor(_model(mlp="gelu"), _tokens())(0)
    assert "mlp_kappa" not in gelu
    assert float(mlp_kappa(1.0, 0.0)) == 0.5
    assert float(mlp_kappa(torch.tensor([1.0, 1.0]), torch.tensor([1.0, -1.0]))) == 0.5


def test_max_logit_includes_the_trainable_temperature() -> None:
    model = _model(temperature="trainable")
    before = Monitor(model, _tokens())(0)["max_logit"].values
    with torch.no_grad():
        for block in model.body.blocks:
            block.attention.gains["attn_temperature"].copy_(torch.tensor([1.0, 2.0, 3.0, 0.5]))
    after = Monitor(model, _tokens())(0)["max_logit"].values
    # the first block reads the same input: its logits scale by each head's temperature
    np.testing.assert_allclose(
        after[0, 0], before[0, 0] * np.array([1.0, 2.0, 3.0, 0.5]), rtol=1e-5
    )
    assert not np.allclose(after[0, 1:], before[0, 1:], rtol=1e-3)  # later blocks moved too


@pytest.mark.parametrize("changes", [FREE, {}])
def test_the_trainer_logs_the_shape(tmp_path, changes) -> None:
    config = _model(**changes).config
    data = load_corpus(max_bytes=100_000)
    settings = TrainConfig(
        steps=4, batch_size=2, seq_len=16, lr=3e-2, warmup_steps=1, log_interval=2,
        eval_interval=2, eval_batches=1, metrics_batch=2,
    )  # fmt: skip
    log = train(config, data, settings, out_dir=tmp_path, progress=False).log
    assert list(log.step.values) == [0, 2, 4]
    kappa = log["mlp_kappa"].values
    assert kappa.shape == (3, 3) and np.isfinite(kappa).all()
    record = summarise_log(log, 4)  # what a study's result.json keeps of it
    assert record["mlp_kappa"]["step"] == [0, 2, 4]
    np.testing.assert_allclose(record["mlp_kappa"]["value"], kappa)
    top = log["max_logit"].values  # (step, block, head): the largest logits are kept
    np.testing.assert_allclose(record["max_logit"]["curve"]["value"], top.max((1, 2)))
    np.testing.assert_allclose(record["max_logit"]["peak"], top.max((0, 2)))
    if changes:
        assert record["shape_gain"]["gain"] == list(log.gain.values)
        np.testing.assert_allclose(record["shape_gain"]["value"], log["shape_gain"].values)
    else:
        assert "shape_gain" not in record
    if changes:
        s_minus = log["shape_gain"].sel(gain="mlp_s_minus").values
        assert s_minus[0] == pytest.approx(1 - 1 / math.sqrt(32))
        assert not np.allclose(s_minus[-1], s_minus[0])  # the slopes moved
        assert not np.allclose(kappa[-1], kappa[0])
    else:
        assert "shape_gain" not in log
        np.testing.assert_allclose(kappa[-1], kappa[0])  # fixed slopes: kappa constant
