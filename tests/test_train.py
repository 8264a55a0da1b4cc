"""Trainer: loss decreases, exact resume, NaN detection, schedule, causality, log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xarray as xr

from shapedtx import PRESETS, ModelConfig, TrainConfig, TrainingDiverged, load_corpus, preset, train
from shapedtx.results import load_dataset
from shapedtx.training import (
    LanguageModel,
    ResumeMismatch,
    configs_of,
    final_val_loss,
    lr_factor,
    plot_collapse,
    plot_losses,
)

TEXT = (
    "the quick brown fox jumps over the lazy dog. a shaped transformer keeps its tokens apart.\n"
    * 40
)
MODEL = ModelConfig(
    width=16, depth=2, attention="shaped", mlp="shaped_relu", heads=2, out_proj=True, causal=True
)
TRAIN = TrainConfig(
    steps=12,
    batch_size=4,
    seq_len=16,
    lr=1e-2,
    warmup_steps=2,
    log_interval=2,
    eval_interval=4,
    eval_batches=2,
    metrics_batch=2,
    checkpoint_interval=4,
    seed=3,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text(TEXT)
    return load_corpus(path, val_fraction=0.2)


@pytest.mark.parametrize(
    ("attention", "norm", "mlp"),
    [("shaped", "none", "shaped_relu"), ("softmax", "pre", "relu"), ("softmax", "none", "relu")],
)
def test_few_steps_decrease_loss(corpus, attention, norm, mlp):
    config = MODEL.replace(attention=attention, norm=norm, mlp=mlp)
    result = train(config, corpus, TRAIN.replace(steps=40, eval_interval=20), progress=False)
    val = result.log["val_loss"].dropna("step")
    assert list(val.step.values) == [0, 20, 40]
    # initial loss ~ log(256) = 5.5; 40 steps on a repetitive text must cut it substantially
    assert float(val[0]) > 5.0
    assert float(val[-1]) < float(val[0]) - 1.5
    train_loss = result.log["train_loss"].values[1:]
    assert train_loss[-1] < train_loss[0] - 1.0
    assert final_val_loss(result.log) == float(val[-1])


def test_resume_reproduces_uninterrupted_run_bitwise(corpus, tmp_path):
    full = train(MODEL, corpus, TRAIN, out_dir=tmp_path / "full", progress=False)

    def interrupt(step, loss):
        if step == 7:
            raise KeyboardInterrupt
        return loss

    with pytest.raises(KeyboardInterrupt):
        train(MODEL, corpus, TRAIN, out_dir=tmp_path / "cut", progress=False, loss_hook=interrupt)
    kept = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert kept["step"] == 4
    assert load_dataset(tmp_path / "cut" / "log.nc").attrs["status"] == "running"
    assert load_dataset(tmp_path / "full" / "log.nc").attrs["status"] == "finished"
    resumed = train(MODEL, corpus, TRAIN, out_dir=tmp_path / "cut", progress=False)
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    xr.testing.assert_identical(full.log, resumed.log)
    assert resumed.log.attrs["status"] == "finished"
    # a finished run is returned as is; a different config refuses to resume
    again = train(MODEL, corpus, TRAIN, out_dir=tmp_path / "cut", progress=False)
    xr.testing.assert_identical(again.log, full.log)
    with pytest.raises(ValueError, match=r"train\.lr"):
        train(MODEL, corpus, TRAIN.replace(lr=0.02), out_dir=tmp_path / "cut", progress=False)


def test_resume_sees_a_different_seed_as_a_different_run(corpus, tmp_path):
    a = train(MODEL, corpus, TRAIN.replace(steps=4, warmup_steps=1), progress=False)
    b = train(MODEL, corpus, TRAIN.replace(steps=4, warmup_steps=1), progress=False)
    c = train(MODEL, corpus, TRAIN.replace(steps=4, warmup_steps=1, seed=4), progress=False)
    xr.testing.assert_identical(a.log, b.log)
    assert not np.allclose(a.log["train_loss"][1:], c.log["train_loss"][1:])


def test_a_checkpoint_with_a_device_generator_state_is_refused(corpus, tmp_path):
    """Runs on CUDA drew their batches with a CUDA generator until 2026-11-28: its state
    (16 bytes, not the CPU generator's) cannot continue the CPU order, so resuming says so."""
    config = TRAIN.replace(steps=4, checkpoint_interval=2)
    train(MODEL, corpus, config, out_dir=tmp_path, progress=False)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    state["step"], state["generator"] = 2, torch.zeros(16, dtype=torch.uint8)
    torch.save(state, tmp_path / "checkpoint.pt")
    (tmp_path / "log.nc").unlink()  # a run still going: no finished log
    with pytest.raises(ResumeMismatch, match="batch generator='a device generator'"):
        train(MODEL, corpus, config, out_dir=tmp_path, progress=False)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path):
    def poison(step, loss):
        return loss * math.nan if step == 7 else loss

    with pytest.raises(TrainingDiverged, match=r"non-finite .* at step 7") as info:
        train(MODEL, corpus, TRAIN, out_dir=tmp_path, progress=False, loss_hook=poison)
    err = info.value
    assert err.step == 7
    assert err.checkpoint == tmp_path / "checkpoint.pt"
    assert "last good checkpoint kept" in str(err) and "(step 4)" in str(err)
    state = torch.load(err.checkpoint, weights_only=True)
    assert state["step"] == 4
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    log = load_dataset(tmp_path / "log.nc")
    assert log.attrs["status"] == "diverged" and int(log.attrs["diverged_step"]) == 7
    assert np.isfinite(log["train_loss"].values[1:]).all()
    # resuming after the fix continues from the good checkpoint
    fixed = train(MODEL, corpus, TRAIN, out_dir=tmp_path, progress=False)
    assert int(fixed.log.step[-1]) == TRAIN.steps


def test_huge_learning_rate_without_clipping_is_caught(corpus):
    config = TRAIN.replace(lr=10.0, grad_clip=0.0, steps=40, warmup_steps=1, eps=1e-30)
    with pytest.raises(TrainingDiverged, match="non-finite"):
        train(MODEL.replace(attention="softmax", mlp="relu"), corpus, config, progress=False)


def test_lr_schedule_warmup_then_cosine():
    config = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    f = np.array([lr_factor(s, config) for s in range(101)])
    np.testing.assert_allclose(f[:10], np.arange(1, 11) / 10)
    assert f[10] == 1.0
    np.testing.assert_allclose(f[55], 0.1 + 0.9 * 0.5)  # half-way through the cosine
    np.testing.assert_allclose(f[100], 0.1)
    assert np.all(np.diff(f[10:]) < 0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"steps": 0}, "steps"),
        ({"lr": -1.0}, "lr"),
        ({"lr": math.nan}, "lr"),
        ({"warmup_steps": 5, "steps": 5}, "warmup_steps"),
        ({"eval_interval": 15, "log_interval": 10}, "eval_interval"),
        ({"checkpoint_interval": 5, "log_interval": 10}, "checkpoint_interval"),
        ({"grad_clip": -1.0}, "grad_clip"),
        ({"seq_len": 1}, "seq_len"),
    ],
)
def test_train_config_rejects_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes)


def test_train_config_round_trips_through_attrs():
    config = TrainConfig(steps=7, lr=0.5, warmup_steps=1)
    assert TrainConfig.from_attrs(config.to_attrs()) == config
    with pytest.raises(ValueError, match=r"no key starts with 'train\.'"):
        TrainConfig.from_attrs({"config.width": 8})
    with pytest.raises(ValueError, match=r"attrs\['train.steps'\] must be an integer"):
        TrainConfig.from_attrs({"train.steps": 7.5})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_config": "x"}, r"model_config must be a shapedtx\.ModelConfig"),
        ({"config": "x"}, "config must be a TrainConfig or None"),
        ({"data": "x"}, "data must be a ByteCorpus"),
        ({"device": "foo"}, "device must be"),
        ({"dtype": torch.int64}, "dtype must be a floating-point torch dtype"),
        ({"resume": "no"}, "resume must be True or False"),
        ({"progress": None}, "progress must be True or False"),
    ],
)
def test_train_checks_its_arguments(corpus, kwargs, message):
    args = {"model_config": MODEL, "data": corpus, "config": TRAIN, "progress": False} | kwargs
    with pytest.raises(ValueError, match=message):
        train(args.pop("model_config"), args.pop("data"), args.pop("config"), **args)


def test_resume_mismatch_names_the_first_changed_field_not_a_derived_one(tmp_path):
    from shapedtx.training.trainer import ResumeMismatch, _check_identity

    saved = MODEL.to_attrs()
    current = MODEL.replace(width=2 * MODEL.width, head_dim=None, key_dim=None).to_attrs()
    with pytest.raises(ResumeMismatch) as info:
        _check_identity(saved, current, tmp_path)
    assert info.value.key == "config.width"


def test_a_model_too_large_for_the_memory_is_refused_before_it_is_built(corpus):
    with pytest.raises(ValueError, match=r"model_config: about .* parameters need at least .* GiB"):
        train(MODEL.replace(depth=10**9), corpus, TRAIN, progress=False)


def test_seq_len_longer_than_data_is_rejected(corpus):
    with pytest.raises(ValueError, match="seq_len"):
        train(MODEL, corpus, TRAIN.replace(seq_len=10_000), progress=False)


@pytest.mark.parametrize("attention", ["shaped", "softmax"])
def test_language_model_is_causal(attention):
    torch.manual_seed(0)
    model = LanguageModel(MODEL.replace(attention=attention, final_norm=True), 12)
    tokens = torch.randint(0, 256, (3, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 256
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_language_model_requires_causal():
    with pytest.raises(ValueError, match="causal"):
        LanguageModel(MODEL.replace(causal=False), 8)


def test_log_contents_save_and_plots(corpus, tmp_path):
    result = train(MODEL.replace(depth=3), corpus, TRAIN, out_dir=tmp_path, progress=False)
    log = load_dataset(tmp_path / "log.nc")
    xr.testing.assert_allclose(log, result.log)
    assert log.sizes == {"step": 7, "block": 3, "layer": 4, "head": 2, "weight": 6}
    assert log["grad_norm_block"].dims == ("step", "block")
    assert np.isfinite(log["grad_norm_block"].values[1:]).all()
    assert (log["grad_norm_block"].values[1:] > 0).all()
    np.testing.assert_allclose(log["lr"].values[1], TRAIN.lr)  # step 2: end of warm-up
    for name in ("mean_rho", "stable_rank", "eigenvalue_ratio", "residual"):
        assert log[name].dims == ("step", "layer")
        assert np.isfinite(log[name].values).all()
    assert (log["stable_rank"].values >= 1 - 1e-9).all()
    assert (log["stable_rank"].values <= TRAIN.seq_len + 1e-9).all()
    assert configs_of(log) == (MODEL.replace(depth=3), TRAIN)
    plot_losses({"a": log}).savefig(tmp_path / "loss.png")
    plot_collapse(log).savefig(tmp_path / "collapse.png")
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert (tmp_path / "collapse.png").stat().st_size > 1000


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_argument(corpus, dtype):
    result = train(
        MODEL, corpus, TRAIN.replace(steps=4, warmup_steps=1), dtype=dtype, progress=False
    )
    assert all(p.dtype == dtype for p in result.model.parameters())
    assert result.log.attrs["dtype"] == str(dtype).removeprefix("torch.")
    assert np.isfinite(result.log["train_loss"].values[1:]).all()
    assert np.isfinite(result.log["mean_rho"].values).all()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_and_logs_per_layer_covariance(corpus, name):
    """The per-layer covariance log works for every architecture; for post-LN it is measured
    on the normalised stream the next block reads (every token has unit feature variance)."""
    config = preset(name, width=16, depth=2, causal=True)
    short = TRAIN.replace(steps=4, eval_interval=4, log_interval=2, checkpoint_interval=4)
    result = train(config, corpus, short, progress=False)
    log = result.log
    for metric in ("mean_rho", "stable_rank", "centred_stable_rank"):
        assert log[metric].dims == ("step", "layer") and log[metric].shape == (3, 3)
        assert np.isfinite(log[metric].values).all()
    if name == "post_ln":  # at initialisation the LayerNorm gains are 1
        hidden = LanguageModel(config, 16).hidden_states(torch.randint(0, 256, (2, 16)))
        for h in hidden[1:]:
            var = h.var(-1, unbiased=False)
            torch.testing.assert_close(var, torch.ones_like(var), atol=1e-3, rtol=0)


# --------------------------------------------------------------------------------------------
# The objective and the optimiser, pinned by their contracts
# --------------------------------------------------------------------------------------------
def test_loss_is_next_byte_cross_entropy():
    """For a window w (m + 1 bytes) the loss is the mean over positions i = 0..m-1 of
    -log softmax(logits(w[:m]))_i[w[i + 1]]: the logit at position i predicts byte i + 1."""
    torch.manual_seed(1)
    model = LanguageModel(MODEL, 8)
    batch = torch.randint(0, 256, (3, 9))
    logits = model(batch[:, :-1]).double()
    assert logits.shape == (3, 8, 256)
    logp = logits.log_softmax(-1)
    by_hand = -np.mean([logp[b, i, batch[b, i + 1]].item() for b in range(3) for i in range(8)])
    assert model.loss(batch).item() == pytest.approx(by_hand, rel=1e-5)
    current = -np.mean([logp[b, i, batch[b, i]].item() for b in range(3) for i in range(8)])
    assert abs(by_hand - current) > 1e-3  # the check tells next from current byte


def _optimizer_grad_norms(monkeypatch) -> list[float]:
    """Record the global gradient norm the optimiser sees at every step."""
    norms: list[float] = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norms.append(torch.stack([gr.norm() for gr in grads]).norm().item())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return norms


def test_gradient_clipping_bounds_the_norm_the_optimiser_sees(corpus, monkeypatch):
    """grad_clip c: every optimiser step sees a global gradient norm <= c (= c when the raw
    norm, logged as ``grad_norm``, exceeds it); grad_clip 0: the raw gradient."""
    config = TRAIN.replace(steps=4, warmup_steps=1, log_interval=1, eval_interval=4,
                           checkpoint_interval=0, grad_clip=0.05)  # fmt: skip
    norms = _optimizer_grad_norms(monkeypatch)
    log = train(MODEL, corpus, config, progress=False).log
    raw = log["grad_norm"].values[1:]
    assert len(norms) == 4 and (raw > 0.05).all()
    np.testing.assert_allclose(norms, np.minimum(raw, 0.05), rtol=1e-4)
    norms.clear()
    log = train(MODEL, corpus, config.replace(grad_clip=0.0), progress=False).log
    np.testing.assert_allclose(norms, log["grad_norm"].values[1:], rtol=1e-4)


def test_weight_decay_applies_to_weight_matrices_only():
    """Decoupled weight decay on the linear maps' weights and the token embedding; never on
    biases, gains or the position embeddings."""
    from shapedtx.training.trainer import _make_optimizer

    model = LanguageModel(MODEL.replace(norm="pre"), 16)
    optimizer = _make_optimizer(model, TRAIN.replace(weight_decay=0.1))
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(decay) == len(names)  # every parameter is optimised, once
    linear = {
        f"{name}.weight"
        for name, mod in model.named_modules()
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding))
    }
    assert "embed.weight" in linear and "unembed.bias" in names and "position" in names
    for name, p in names.items():
        assert decay[id(p)] == (0.1 if name in linear else 0.0), name


def test_log_rows_hold_the_mean_loss_the_lr_used_and_the_final_evaluation(corpus):
    """train_loss of a row = mean of the step losses since the previous row; lr = the rate
    the optimiser used at that step (lr * lr_factor(step - 1)); the last val_loss = the mean
    loss of the final model over the fixed validation windows; the block gradient norms are
    parts of the global one."""
    from shapedtx.training.data import fixed_windows
    from shapedtx.training.trainer import evaluate

    losses: dict[int, float] = {}

    def record(step, loss):
        losses[step] = loss.item()
        return loss

    config = TRAIN.replace(steps=6, log_interval=3, eval_interval=3, checkpoint_interval=0)
    result = train(MODEL, corpus, config, progress=False, loss_hook=record)
    log = result.log
    assert log["step"].values.tolist() == [0, 3, 6]
    np.testing.assert_allclose(log["train_loss"].values[1:],
                               [np.mean([losses[s] for s in (1, 2, 3)]),
                                np.mean([losses[s] for s in (4, 5, 6)])], rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(log["lr"].values[1:], [TRAIN.lr * lr_factor(s - 1, config)
                                                      for s in (3, 6)], rtol=1e-12)  # fmt: skip
    val = fixed_windows(corpus.val, config.eval_batches * config.batch_size, config.seq_len)
    expected = evaluate(result.model, list(val.split(config.batch_size)))
    assert log["val_loss"].values[-1] == pytest.approx(expected.item(), rel=1e-6)
    blocks = log["grad_norm_block"].values[1:]
    assert (np.sqrt((blocks**2).sum(-1)) <= log["grad_norm"].values[1:] * (1 + 1e-6)).all()


def test_evaluate_is_the_mean_batch_loss_and_restores_the_mode():
    from shapedtx.training.trainer import evaluate

    torch.manual_seed(2)
    model = LanguageModel(MODEL, 8)
    batches = [torch.randint(0, 256, (2, 9)) for _ in range(3)]
    model.train()
    value = evaluate(model, batches)
    assert model.training
    assert value.item() == pytest.approx(np.mean([model.loss(b).item() for b in batches]))


def test_covariance_metrics_average_the_metrics_over_the_batch():
    """Per layer: the batch mean of each shapedtx.metrics function of V = h h^T / n; a
    non-finite hidden state makes that layer's value NaN, not the others'."""
    from shapedtx import metrics
    from shapedtx.metrics import covariance_metrics

    g = torch.Generator().manual_seed(3)
    hidden = [torch.randn(3, 4, 6, generator=g) for _ in range(3)]
    hidden[2][1, 0, 0] = math.inf
    out = covariance_metrics(hidden)
    for name, fn in (("mean_rho", metrics.mean_correlation), ("stable_rank", metrics.stable_rank),
                     ("eigenvalue_ratio", metrics.eigenvalue_ratio),
                     ("residual", metrics.covariance_residual)):  # fmt: skip
        assert out[name].shape == (3,)
        for layer in range(2):
            V = metrics.covariance(hidden[layer].double())
            assert out[name][layer] == pytest.approx(fn(V).mean().item(), rel=1e-12)
        assert np.isnan(out[name][2])


@pytest.mark.parametrize("final_norm", [False, True])
def test_language_model_is_embedding_body_norm_unembedding(final_norm):
    """logits = W_U [LN](body(E[tokens] + P[:m])) + b, rebuilt from the parameters (m < max_len,
    random bias and LayerNorm affine so that every term is seen); the positions are those of the
    last (sequence) axis, so an unbatched sequence gives the logits of a batch of one."""
    torch.manual_seed(2)
    model = LanguageModel(MODEL.replace(final_norm=final_norm), 12)
    with torch.no_grad():
        model.unembed.bias.normal_()
        if final_norm:
            model.final_norm.weight.normal_()
            model.final_norm.bias.normal_()
    tokens = torch.randint(0, 256, (3, 7))
    X0 = model.embed.weight[tokens] + model.position[:7]
    with torch.no_grad():
        torch.testing.assert_close(model.hidden_states(tokens)[0], X0)
        H = model.body(X0)
        if final_norm:
            mean = H.mean(-1, keepdim=True)
            var = (H - mean).pow(2).mean(-1, keepdim=True)
            H = (H - mean) / torch.sqrt(var + model.final_norm.eps)
            H = H * model.final_norm.weight + model.final_norm.bias
        expected = H @ model.unembed.weight.T + model.unembed.bias
        logits = model(tokens)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(tokens[1]), logits[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("init", ["fan_in", "gpt2"])
def test_language_model_initial_scales(init):
    """fan_in: token and position embeddings N(0, 1/2) (unit input diagonal), unembedding
    N(0, 1/n); gpt2: all N(0, 0.02^2); zero unembedding bias. The sample variance of k
    entries has relative standard error sqrt(2 / k) (k = 16384: 1.1%)."""
    torch.manual_seed(0)
    n = 64
    model = LanguageModel(MODEL.replace(width=n, heads=4, init=init), 256)
    embed_var = 0.02**2 if init == "gpt2" else 0.5
    unembed_var = 0.02**2 if init == "gpt2" else 1 / n
    for weights, var in (
        (model.embed.weight, embed_var),
        (model.position, embed_var),
        (model.unembed.weight, unembed_var),
    ):
        k = weights.numel()
        sample = weights.detach().double().pow(2).mean().item()
        assert abs(sample - var) < 5 * var * math.sqrt(2 / k), (weights.shape, sample, var)
    assert torch.count_nonzero(model.unembed.bias) == 0


def test_train_config_defaults_are_the_documented_ones():
    """The defaults listed in the TrainConfig docstring are the dataclass defaults (the
    ``warmup_steps`` default is derived: ``min(50, steps // 10)``)."""
    import dataclasses
    import re

    text = re.search(r"Defaults: ``(.*?)``", TrainConfig.__doc__, re.S).group(1)
    documented = eval(f"dict({text})")  # our own docstring
    assert documented == {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert TrainConfig().warmup_steps == 50 and TrainConfig(steps=30).warmup_steps == 3


@pytest.mark.parametrize(
    "changes",
    [
        {"steps": 1},
        {"batch_size": 1},
        {"seq_len": 2},
        {"warmup_steps": 0},
        {"log_interval": 1, "eval_interval": 1},
        {"eval_batches": 1, "metrics_batch": 1, "checkpoint_interval": 0, "seed": 0},
        {"lr": 10.0},
        {"min_lr_ratio": 0.0},
        {"min_lr_ratio": 1.0},
        {"weight_decay": 0.0},
        {"weight_decay": 1.0},
        {"beta1": 0.0, "beta2": 0.0},
        {"beta1": 0.999999, "beta2": 0.999999},
        {"eps": 1.0},
        {"grad_clip": 0.0},
        {"grad_clip": 1e6},
    ],
)
def test_train_config_accepts_the_ends_of_its_ranges(changes):
    """Integers from their minimum (steps, batch_size, intervals >= 1; seq_len >= 2;
    warmup_steps, checkpoint_interval, seed >= 0); lr in (0, 10], min_lr_ratio and weight_decay
    in [0, 1], betas in [0, 0.999999], eps in (0, 1], grad_clip in [0, 1e6]."""
    config = TrainConfig(**changes)
    assert all(getattr(config, name) == value for name, value in changes.items())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"log_interval": 0}, "log_interval"),
        ({"eval_batches": 0}, "eval_batches"),
        ({"metrics_batch": 0}, "metrics_batch"),
        ({"seed": -1}, "seed"),
        ({"lr": 0.0}, "lr"),
        ({"lr": 10.5}, "lr"),
        ({"lr": True}, "lr"),
        ({"min_lr_ratio": -0.01}, "min_lr_ratio"),
        ({"min_lr_ratio": 1.05}, "min_lr_ratio"),
        ({"weight_decay": 1.05}, "weight_decay"),
        ({"beta1": 1.0}, "beta1"),
        ({"beta2": 1.0}, "beta2"),
        ({"beta1": -0.01}, "beta1"),
        ({"eps": 0.0}, "eps"),
        ({"grad_clip": 2e6}, "grad_clip"),
    ],
)
def test_train_config_rejects_values_just_outside_its_ranges(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes)


def test_tokens_per_step_is_the_batch_token_count():
    assert TrainConfig(batch_size=3, seq_len=7).tokens_per_step == 21


def _collapse_log(mean_rho: np.ndarray) -> xr.Dataset:
    steps, layers = mean_rho.shape
    ds = xr.Dataset(
        {
            "mean_rho": (("step", "layer"), mean_rho),
            "stable_rank": (
                ("step", "layer"),
                5.0 + np.arange(steps * layers).reshape(mean_rho.shape),
            ),
        },
        coords={"step": np.arange(steps) * 10, "layer": np.arange(layers)},
    )
    ds.attrs.update(
        {"config.attention": "shaped", "config.norm": "none", "config.depth": layers - 1}
    )
    return ds


@pytest.mark.parametrize("metric", ["mean_rho", "stable_rank"])
def test_collapse_plot_shows_the_last_layer_and_the_embedding_in_range(metric):
    """Right panel: the last layer's and the embedding's (layer 0) values against step, with
    a y-range that holds every plotted value; for the mean correlation it spans [0, 1] at least
    (and reaches below 0 for negative correlations)."""
    rho = np.array([[0.30, 0.4, 0.5], [0.35, 0.6, 0.8], [0.40, 0.7, 0.9], [0.45, 0.5, -0.1]])
    ds = _collapse_log(rho)
    fig = plot_collapse(ds, metric)
    right = fig.axes[1]
    lines = {line.get_label(): line for line in right.get_lines()}
    values = ds[metric].values
    np.testing.assert_array_equal(lines["last layer"].get_ydata(), values[:, -1])
    np.testing.assert_array_equal(lines["embedding"].get_ydata(), values[:, 0])
    np.testing.assert_array_equal(lines["last layer"].get_xdata(), ds["step"].values)
    low, high = right.get_ylim()
    assert low < values[:, [0, -1]].min() and high > values[:, [0, -1]].max()
    if metric == "mean_rho":
        assert low < 0.0 and high > 1.0
        positive = plot_collapse(_collapse_log(np.abs(rho)), metric).axes[1].get_ylim()
        assert positive[0] < 0.0 and positive[1] > 1.0


def test_progress_bar_counts_the_optimiser_steps(corpus, capsys):
    """``progress=True``: the tqdm bar advances by one per optimiser step and ends at
    steps/steps."""
    train(MODEL, corpus, TRAIN.replace(steps=4, log_interval=2, eval_interval=4), progress=True)
    frames = [f for f in capsys.readouterr().err.replace("\n", "\r").split("\r") if f.strip()]
    assert frames and all("train" in f for f in frames)
    assert "100%" in frames[-1] and "4/4" in frames[-1], frames[-1]
