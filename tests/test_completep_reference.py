"""CompleteP as its reference runs it (docs/guide/transfer.md, "CompleteP as its reference runs
it"): each ModelConfig / TrainConfig field changes exactly what it says, its rule between
fields names the field, the defaults keep today's model, and the transfer study plans the
recipe and its changes one at a time on its depth axis."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from run_history import load_script

from shapedtx import (
    Attention,
    ModelConfig,
    Monitor,
    ParameterError,
    TrainConfig,
    eps_multiplier,
    load_corpus,
    lr_multipliers,
    preset,
    train,
)
from shapedtx.attention import split_heads
from shapedtx.config import GPT2_STD, weight_std
from shapedtx.training import COMPLETEP_REFERENCE, LanguageModel, completep_reference_train
from shapedtx.training.trainer import _make_optimizer
from shapedtx.training.transfer import proxy_config

STUDY = Path(__file__).parents[1] / "examples" / "transfer"
SOFTMAX = ModelConfig(
    width=32, depth=2, attention="softmax", mlp="gelu", heads=2, out_proj=True, causal=True
)


def _att_config(scale: str) -> ModelConfig:
    return SOFTMAX.replace(attention_scale=scale)


# ---- attention scale -------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["inverse_sqrt", "inverse"])
def test_attention_scale_is_the_softmax_logit_scale_of_both_paths(scale):
    """The fused branch and the explicit attention matrix compute Softmax(c q k^T) v W^O with
    c = 1/sqrt(n_k) or 1/n_k, checked against the formula written out."""
    config = _att_config(scale).replace(width=16, heads=2)
    torch.manual_seed(0)
    module = Attention(config).double()
    X = torch.randn(3, 7, 16, dtype=torch.float64)
    layers = module.layers
    q = split_heads(layers["query"](X), 2)
    k = split_heads(layers["key"](X), 2)
    v = split_heads(layers["value"](X), 2)
    c = 1.0 / config.key_dim if scale == "inverse" else 1.0 / math.sqrt(config.key_dim)
    assert config.softmax_scale == c
    Y = (q @ k.transpose(-1, -2)) * c
    Y = Y.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -math.inf)
    A = torch.softmax(Y, -1)
    expected = layers["out"]((A @ v).transpose(-3, -2).flatten(-2))
    torch.testing.assert_close(module(X), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(module.attention_matrix(X), A, rtol=1e-10, atol=1e-12)


def test_monitor_max_logit_follows_the_attention_scale():
    """Same weights and tokens: the largest logit of 1/n_k is that of 1/sqrt(n_k) divided by
    sqrt(n_k) in the first block (the monitor reads the scale the model uses; later blocks
    read streams the scale has changed)."""
    tops = {}
    for scale in ("inverse_sqrt", "inverse"):
        torch.manual_seed(1)
        model = LanguageModel(_att_config(scale).replace(depth=1), max_len=8)
        tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(2))
        ds = Monitor(model, tokens)(0)
        tops[scale] = ds["max_logit"].isel(step=0).values
    assert np.isfinite(tops["inverse"]).all()
    np.testing.assert_allclose(
        tops["inverse"], tops["inverse_sqrt"] / math.sqrt(SOFTMAX.key_dim), rtol=1e-5
    )


# ---- init and output multiplier --------------------------------------------------------------
def test_mup_init_draws_each_parameter_at_its_std():
    """init="mup" (base width 16, width 64: m_N = 4): every block weight N(0, 0.02^2 / 4),
    embeddings and unembedding N(0, 0.02^2); each sample sd within 5 standard errors
    (sd / sqrt(2 N)) of its value."""
    config = preset("pre_ln_completep_ref", width=64, depth=2, base_width=16, causal=True)
    assert weight_std(config, "mlp_out", 256) == weight_std(config, "query", 64) == 0.01
    torch.manual_seed(0)
    model = LanguageModel(config, max_len=64)
    checked = 0
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        std = 0.01 if name.startswith("body.") else GPT2_STD
        se = std / math.sqrt(2 * p.numel())
        sd = float(p.detach().std())
        assert abs(sd - std) < 5 * se, (name, sd, std)
        checked += 1
    assert checked == 2 * 6 + 3  # q, k, v, W^O, W_1, W_2 per block; embed, position, unembed


def test_output_multiplier_divides_the_unembeddings_input_by_m_n():
    """output_multiplier: logits = W (x / m_N) + b with m_N = width / base_width = 4; the same
    seed draws the same weights with and without it."""
    config = preset("pre_ln_completep", width=32, depth=2, causal=True, init="mup", base_width=8)
    logits = {}
    for on in (False, True):
        torch.manual_seed(0)
        model = LanguageModel(config.replace(output_multiplier=on), max_len=8)
        with torch.no_grad():
            model.unembed.bias.copy_(torch.linspace(-1.0, 1.0, 256))
        tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            logits[on] = model(tokens) - model.unembed.bias
    torch.testing.assert_close(logits[True], logits[False] / 4, rtol=1e-5, atol=1e-7)


# ---- AdamW epsilon and beta2, and the lr rule with the output multiplier -----------------------
def test_eps_scaling_sets_completeps_epsilon_in_every_group():
    """eps_scaling="completep" from the base (64, 4) to width 128, depth 16: epsilon 1e-12 /
    (m_N m_L) = 1e-12 / 8 in every parameter group; beta2 0.95; "constant" keeps eps."""
    config = preset("pre_ln_completep_ref", width=128, depth=16, causal=True)
    assert eps_multiplier(config, proxy_config(config, 64, 4)) == 1 / 8
    torch.manual_seed(0)
    model = LanguageModel(config, max_len=8)
    ref = completep_reference_train(64, 4, steps=10)
    assert (ref.beta2, ref.eps, ref.eps_scaling) == (0.95, 1e-12, "completep")
    assert {k: getattr(ref, k) for k in COMPLETEP_REFERENCE} == COMPLETEP_REFERENCE
    groups = _make_optimizer(model, ref).param_groups
    assert len(groups) > 1 and all(g["eps"] == pytest.approx(1e-12 / 8, rel=1e-12) for g in groups)
    assert all(g["betas"] == (0.9, 0.95) for g in groups)
    constant = ref.replace(eps_scaling="constant")
    assert all(g["eps"] == 1e-12 for g in _make_optimizer(model, constant).param_groups)


def test_eps_multiplier_is_one_over_m_n_times_m_l_to_the_minus_alpha():
    for name, alpha in (("pre_ln_completep", 1.0), ("pre_ln_depth_mup", 0.5)):
        target = preset(name, width=256, depth=32, base_depth=8)
        proxy = proxy_config(target, 64, 8)
        assert eps_multiplier(target, proxy) == pytest.approx(0.25 * 4**-alpha, rel=1e-12)
        assert eps_multiplier(proxy, proxy) == 1.0


def test_output_multiplier_makes_the_readout_lr_width_independent():
    """With the multiplier 1/m_N in the forward pass the readout keeps the base lr (the
    reference's tied unembedding); without it the readout's lr is 1/m_N."""
    target = preset("pre_ln_completep", width=256, depth=8)
    proxy = proxy_config(target, 64, 8)
    assert lr_multipliers(target, proxy)["readout"] == 0.25
    with_multiplier = target.replace(output_multiplier=True, base_width=64)
    factors = lr_multipliers(with_multiplier, proxy_config(with_multiplier, 64, 8))
    assert factors["readout"] == 1.0 and factors["hidden"] == 0.25


# ---- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: ModelConfig(attention="shaped", attention_scale="inverse"), "attention_scale"),
        (lambda: SOFTMAX.replace(attention_scale="sqrt"), "attention_scale"),
        (lambda: SOFTMAX.replace(base_width=0), "base_width"),
        (lambda: SOFTMAX.replace(init="muP"), "init"),
        (lambda: SOFTMAX.replace(output_multiplier="yes"), "output_multiplier"),
        (lambda: TrainConfig(eps_scaling="completep"), "eps_scaling"),
        (lambda: TrainConfig(eps_scaling="table1"), "eps_scaling"),
    ],
)
def test_bad_reference_settings_name_their_field(make, parameter):
    with pytest.raises(ParameterError) as info:
        make()
    assert info.value.parameter == parameter


def test_unused_reference_fields_are_listed():
    unused = ModelConfig().unused_fields()
    assert "base_width" in unused and "attention_scale" in unused
    ref = preset("pre_ln_completep_ref").unused_fields()
    assert "base_width" not in ref and "attention_scale" not in ref


# ---- the defaults keep today's model ------------------------------------------------------------
def test_defaults_keep_the_model_and_its_training(tmp_path):
    """At their defaults the new fields change nothing: the scale is 1/sqrt(n_k) exactly, the
    readout is unembed(LN(x)) exactly, every group's epsilon is eps; and naming the defaults
    trains the same run bit for bit (same seed, same losses)."""
    config = preset("pre_ln_completep", width=16, depth=2, causal=True, base_depth=2)
    assert config.softmax_scale == 1.0 / math.sqrt(config.key_dim)
    torch.manual_seed(0)
    model = LanguageModel(config, max_len=8)
    X = torch.randn(2, 8, 16)
    assert torch.equal(model.readout(X), model.unembed(model.final_norm(X)))
    run = TrainConfig(steps=6, batch_size=2, seq_len=8, warmup_steps=1, log_interval=2,
                      eval_interval=2, eval_batches=1, metrics_batch=2, checkpoint_interval=2,
                      lr=1e-2, lr_proxy_width=16, lr_proxy_depth=2)  # fmt: skip
    assert all(g["eps"] == run.eps for g in _make_optimizer(model, run).param_groups)
    path = tmp_path / "tiny.txt"
    path.write_text("a shaped transformer keeps its tokens apart. " * 40)
    corpus = load_corpus(path, val_fraction=0.2)
    named = config.replace(attention_scale="inverse_sqrt", output_multiplier=False, base_width=1)
    logs = [
        train(c, corpus, t, progress=False).log
        for c, t in ((config, run), (named, run.replace(eps_scaling="constant")))
    ]
    for key in ("train_loss", "val_loss", "max_logit"):
        np.testing.assert_array_equal(logs[0][key].values, logs[1][key].values)


def test_reference_recipe_trains_and_logs_its_largest_logits(tmp_path):
    """pre_ln_completep_ref with completep_reference_train: a few steps give finite losses and
    the largest attention logit of every block and head (1/d_head scale) in the log."""
    path = tmp_path / "tiny.txt"
    path.write_text("a shaped transformer keeps its tokens apart. " * 40)
    corpus = load_corpus(path, val_fraction=0.2)
    config = preset("pre_ln_completep_ref", width=16, depth=4, base_width=16, base_depth=2)
    run = completep_reference_train(16, 2, steps=4, batch_size=2, seq_len=8, warmup_steps=1,
                                    log_interval=2, eval_interval=2, eval_batches=1,
                                    metrics_batch=2, checkpoint_interval=2, lr=1e-2)  # fmt: skip
    log = train(config.replace(causal=True), corpus, run, progress=False).log
    assert np.isfinite(log["train_loss"].values[1:]).all()
    assert log["max_logit"].dims == ("step", "block", "head")
    assert log["max_logit"].shape == (3, 4, 4) and np.isfinite(log["max_logit"].values).all()
    assert log.attrs["train.eps_scaling"] == "completep"
    assert log.attrs["config.attention_scale"] == "inverse"


# ---- the transfer study's variants ---------------------------------------------------------------
@pytest.fixture
def study(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    return load_script(STUDY / "study.py", "study", monkeypatch)


def test_study_plans_the_completep_variants_on_the_depth_axis_only(study):
    setup = replace(
        study.DEFAULT, parametrisations=tuple(study.VARIANTS), half_grid=0, seed_depths=()
    )
    jobs = study.plan(setup, [])
    assert {(name, w, d) for name, w, d, _, _ in jobs} == {
        (name, 64, d) for name in study.VARIANTS for d in (4, 8, 16, 32, 64)
    }
    # depths without the width axis's depth: still the depth axis only
    quick = replace(setup, width=16, depth=2, depths=(4, 8), widths=(8, 16), proxy=(16, 2))
    assert {(w, d) for _, w, d, _, _ in study.plan(quick, [])} == {(16, 4), (16, 8)}
    assert study.plan(study.DEFAULT, []) == study.plan(
        replace(study.DEFAULT, parametrisations=study.PARAMETRISATIONS), []
    )  # the default study is unchanged
    assert study.setup_of(study.parse(["--completep-ref"])).parametrisations == tuple(
        study.VARIANTS
    )


def test_study_variants_change_one_setting_each(study):
    """Each variant's model and train configs differ from pre_ln_completep's in its own
    settings only; the recipe takes them all, with base depth 4 (the smallest)."""
    setup = study.DEFAULT

    def configs(name: str, depth: int) -> tuple[dict, dict]:
        proxy = study.proxy_of(setup, name)
        model = study.model_config(name, 64, depth, proxy[1], proxy[0])
        run = study.train_config(setup, -7, 0, name)
        return model.to_attrs(), run.to_attrs()

    base_model, base_train = configs("pre_ln_completep", 16)
    expected = {
        "completep_base_depth": ({"config.base_depth": 4}, {"train.lr_proxy_depth": 4}),
        "completep_attention_scale": ({"config.attention_scale": "inverse"}, {}),
        "completep_init": (
            {"config.init": "mup", "config.output_multiplier": 1, "config.base_width": 64},
            {},
        ),
        "completep_eps": ({}, {"train.eps": 1e-12, "train.eps_scaling": "completep"}),
        "completep_beta2": ({}, {"train.beta2": 0.95}),
    }
    recipe_model, recipe_train = {}, {}
    for name, (model_changes, train_changes) in expected.items():
        model, run = configs(name, 16)
        assert {k: v for k, v in model.items() if base_model[k] != v} == model_changes, name
        assert {k: v for k, v in run.items() if base_train[k] != v} == train_changes, name
        recipe_model |= model_changes
        recipe_train |= train_changes
    model, run = configs("pre_ln_completep_ref", 16)
    assert {k: v for k, v in model.items() if base_model[k] != v} == recipe_model
    assert {k: v for k, v in run.items() if base_train[k] != v} == recipe_train
    ref = preset("pre_ln_completep_ref", width=64, depth=16)
    assert ref.depth_multiplier == 0.25 and ref.softmax_scale == 1 / 16
