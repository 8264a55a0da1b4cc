"""``shapedtx.Monitor``: attention entropy and logits, activation RMS and kurtosis, update sizes,
for the library's models, GPT-2, ``nn.TransformerEncoder`` and the trainer's log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import xarray as xr
from torch import nn

import shapedtx
from shapedtx import ModelConfig, TrainConfig, load_corpus, train
from shapedtx.attention import causal_uniform, split_heads
from shapedtx.diagnostics import (
    Monitor,
    activation_rms,
    attention_entropy,
    entropy_reference,
    excess_kurtosis,
    max_logit,
    plot_monitor,
    relative_update,
)
from shapedtx.training import LanguageModel


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy of probabilities p: (..., m, m_k), mean over queries (0 log 0 = 0)."""
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return -(p * logp).sum(-1).mean(-1)


# ---------------------------------------------------------------- the formulas themselves


def test_metric_formulas_against_hand_values():
    # two keys with logits 0 and log 3: p = (1/4, 3/4)
    Y = torch.tensor([[[0.0, -math.inf], [0.0, math.log(3.0)]]], dtype=torch.float64)
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert float(attention_entropy(Y)) == pytest.approx(h1 / 2, rel=1e-12)  # query 0: H = 0
    assert float(max_logit(Y)) == pytest.approx(math.log(3.0))
    # causal mask: mean over positions i = 1..m of log i
    m = 7
    visible = torch.ones(m, m, dtype=torch.bool).tril()
    expected = sum(math.log(i) for i in range(1, m + 1)) / m
    assert float(entropy_reference(visible)) == pytest.approx(expected, rel=1e-12)
    # uniform logits reach the reference
    causal_zero = torch.zeros(m, m).masked_fill(~visible, -math.inf)
    assert float(attention_entropy(causal_zero)) == pytest.approx(expected, rel=1e-6)
    # activations: one token (1, -1, 3, -3): rms sqrt(5), centred moments 5 and 41
    X = torch.tensor([[[1.0, -1.0, 3.0, -3.0]]], dtype=torch.float64)
    assert float(activation_rms(X)) == pytest.approx(math.sqrt(5.0))
    assert float(excess_kurtosis(X)) == pytest.approx(41.0 / 25.0 - 3.0)
    old = torch.tensor([[3.0, 4.0]])
    assert float(relative_update(torch.tensor([[3.0, 5.0]]), old)) == pytest.approx(0.2)


def test_kurtosis_of_gaussian_features_is_zero_and_of_an_outlier_large():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(8, 64, 4096, generator=gen, dtype=torch.float64)
    k = excess_kurtosis(X)
    # standard error of the sample excess kurtosis: sqrt(24 / n) per token, / sqrt(512) tokens
    assert abs(float(k.mean())) < 4 * math.sqrt(24 / 4096) / math.sqrt(512)
    X[..., 0] = 50.0  # one outlier feature
    assert float(excess_kurtosis(X).mean()) > 100


# ---------------------------------------------------------------- models


@pytest.mark.parametrize("preset", ["shaped", "pre_ln"])
@torch.no_grad()
def test_library_transformer_against_its_attention_matrix(preset):
    torch.manual_seed(0)
    config = shapedtx.preset(preset, width=32, depth=3, heads=4, causal=True)
    model = shapedtx.Transformer(config).double()
    with torch.no_grad():  # trained-like queries: non-uniform attention
        for block in model.blocks:
            for name in ("query", "key"):
                block.attention.layers[name].weight.normal_(0.0, 0.5)
    X = torch.randn(3, 9, 32, dtype=torch.float64)
    ds = Monitor(model, X)(0)
    _, hidden = model(X, return_hidden=True)
    for b, block in enumerate(model.blocks):
        inner = block.norms["attn_norm"](hidden[b]) if "attn_norm" in block.norms else hidden[b]
        q = split_heads(block.attention.layers["query"](inner), config.heads)
        k = split_heads(block.attention.layers["key"](inner), config.heads)
        Y = q @ k.transpose(-1, -2)
        A = block.attention.attention_matrix(inner)
        if preset == "shaped":  # A = I + Softmax(Y / tau) - C: the probabilities are A - I + C
            eye = torch.eye(9, dtype=A.dtype)
            P = A - eye + causal_uniform(9, dtype=A.dtype)
            scale = 1.0 / config.tau
        else:
            P, scale = A, 1.0 / math.sqrt(config.key_dim)
        mask = torch.ones(9, 9, dtype=torch.bool).tril()
        expected_entropy = _entropy(P).mean(0)
        expected_max = (Y * scale).masked_fill(~mask, -math.inf).amax(dim=(0, 2, 3))
        got = ds["attention_entropy"].isel(step=0, block=b).values
        np.testing.assert_allclose(got, expected_entropy.numpy(), rtol=1e-9)
        np.testing.assert_allclose(
            ds["max_logit"].isel(step=0, block=b).values, expected_max.numpy(), rtol=1e-9
        )
        assert float(expected_entropy.min()) < 0.9 * float(ds["entropy_reference"][0, b])
    # activations against the hidden states
    for layer, h in enumerate(hidden):
        rms = h.pow(2).mean().sqrt()
        c = h - h.mean(-1, keepdim=True)
        kurt = (c.pow(4).mean(-1) / c.pow(2).mean(-1).pow(2) - 3).mean()
        assert float(ds["activation_rms"][0, layer]) == pytest.approx(float(rms), rel=1e-12)
        assert float(ds["kurtosis"][0, layer]) == pytest.approx(float(kurt), rel=1e-10)
    reference = sum(math.log(i) for i in range(1, 10)) / 9
    np.testing.assert_allclose(ds["entropy_reference"][0].values, reference, rtol=1e-12)


@pytest.mark.parametrize("norm_first", [False, True])
@torch.no_grad()
def test_transformer_encoder_fast_path_against_explicit_softmax(norm_first):
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(
        16, 4, dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    model = nn.Sequential(nn.Linear(16, 16), encoder)
    with torch.no_grad():
        for mod in encoder.layers:
            mod.self_attn.in_proj_weight.mul_(6.0)
    X = torch.randn(2, 7, 16)
    monitor = Monitor(model, X)
    # eval + no_grad: PyTorch's fast path never calls self_attn; the monitor still reads it
    ds = monitor(0)
    assert monitor.has_attention
    x = model[0](X)
    for b, mod in enumerate(encoder.layers):
        mod.eval()
        inner = mod.norm1(x) if norm_first else x
        E, h = 16, 4
        W, bias = mod.self_attn.in_proj_weight, mod.self_attn.in_proj_bias
        q = (inner @ W[:E].T + bias[:E]).unflatten(-1, (h, E // h)).transpose(1, 2)
        k = (inner @ W[E : 2 * E].T + bias[E : 2 * E]).unflatten(-1, (h, E // h)).transpose(1, 2)
        Y = q @ k.transpose(-1, -2) / math.sqrt(E // h)
        P = torch.exp(Y - Y.amax(-1, keepdim=True))
        P = P / P.sum(-1, keepdim=True)
        # the module's own weights (need_weights, per head) agree with the explicit softmax
        _, own = mod.self_attn(inner, inner, inner, need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(own, P, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            ds["attention_entropy"][0, b].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
        )
        np.testing.assert_allclose(
            ds["max_logit"][0, b].values, Y.amax(dim=(0, 2, 3)).detach().numpy(), rtol=1e-5
        )
        np.testing.assert_allclose(ds["entropy_reference"][0, b], math.log(7), rtol=1e-12)
        x = mod(x)


@torch.no_grad()
def test_multihead_attention_with_causal_mask_against_explicit_softmax():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.MultiheadAttention(8, 2, batch_first=False)])

        def forward(self, x):  # (m, B, n), causal
            m = x.shape[0]
            mask = torch.ones(m, m, dtype=torch.bool).triu(1)
            for attn in self.blocks:
                x = x + attn(x, x, x, attn_mask=mask, need_weights=False)[0]
            return x.transpose(0, 1)  # the monitor reads (B, m, n) streams

    torch.manual_seed(2)
    net = Net()
    with torch.no_grad():
        net.blocks[0].in_proj_weight.mul_(5.0)

    class Wrapped(nn.Module):  # the block maps (B, m, n) to (B, m, n)
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([_SeqFirst(net.blocks[0])])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    model = Wrapped()
    X = torch.randn(3, 6, 8)
    ds = Monitor(model, X)(0)
    mha = net.blocks[0]
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
    xs = X.transpose(0, 1)
    _, P = mha(xs, xs, xs, attn_mask=mask, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
    )
    reference = sum(math.log(i) for i in range(1, 7)) / 6
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(reference)
    # the largest logit: log-probability differences fix the logits up to a row constant;
    # recomputed by hand from the projection
    E = 8
    q = (X @ mha.in_proj_weight[:E].T + mha.in_proj_bias[:E]).unflatten(-1, (2, 4)).transpose(1, 2)
    k = (X @ mha.in_proj_weight[E : 2 * E].T + mha.in_proj_bias[E : 2 * E]).unflatten(-1, (2, 4))
    Y = (q @ k.transpose(1, 2).transpose(-1, -2)) / 2.0
    Y = Y.masked_fill(mask, -math.inf)
    torch.testing.assert_close(torch.softmax(Y, -1), P, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ds["max_logit"][0, 0].values, Y.amax(dim=(0, 2, 3)).detach().numpy(), rtol=1e-5
    )


class _SeqFirst(nn.Module):
    """A residual block around a sequence-first ``nn.MultiheadAttention`` with a causal mask."""

    def __init__(self, attn: nn.MultiheadAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x):
        m = x.shape[1]
        mask = torch.ones(m, m, dtype=torch.bool).triu(1)
        xs = x.transpose(0, 1)
        return x + self.attn(xs, xs, xs, attn_mask=mask, need_weights=False)[0].transpose(0, 1)


@torch.no_grad()
def test_gpt2_against_output_attentions():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=50, attn_implementation="eager"
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(20.0)
    ids = torch.randint(0, 50, (2, 10))
    ds = Monitor(model, {"input_ids": ids})(0)
    out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for b, P in enumerate(out.attentions):  # (B, h, m, m)
        np.testing.assert_allclose(
            ds["attention_entropy"][0, b].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
        )
        # the logits by hand from the block's input, ln_1 and c_attn
        block = model.transformer.h[b]
        x = block.ln_1(out.hidden_states[b])
        q, k, _ = (x @ block.attn.c_attn.weight + block.attn.c_attn.bias).split(32, dim=-1)
        q, k = q.unflatten(-1, (4, 8)).transpose(1, 2), k.unflatten(-1, (4, 8)).transpose(1, 2)
        Y = (q @ k.transpose(-1, -2)) / math.sqrt(8)
        Y = Y.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), -math.inf)
        torch.testing.assert_close(torch.softmax(Y, -1), P, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            ds["max_logit"][0, b].values, Y.amax(dim=(0, 2, 3)).detach().numpy(), rtol=1e-5
        )
    assert entropy_reference(torch.ones(10, 10, dtype=torch.bool).tril()) == pytest.approx(
        float(ds["entropy_reference"][0, 0])
    )


@torch.no_grad()
def test_nanogpt_style_attention_given_by_name():
    class CausalSelfAttention(nn.Module):  # nanoGPT's, using SDPA (no probabilities)
        def __init__(self, n_embd, n_head):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.n_head, self.n_embd = n_head, n_embd

        def forward(self, x):
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            B, T, C = x.shape
            q, k, v = (
                t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)
            )
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(16)
            self.mixer = CausalSelfAttention(16, 2)

        def forward(self, x):
            return x + self.mixer(self.ln(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers_list = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for b in self.layers_list:
                x = b(x)
            return x

    torch.manual_seed(4)
    net = Net()
    X = torch.randn(2, 5, 16)
    names = ["layers_list.0.mixer", "layers_list.1.mixer"]
    ds = Monitor(net, X, blocks="layers_list", attention=names)(0)
    auto = Monitor(net, X, blocks="layers_list")(0)  # found without names too
    xr.testing.assert_identical(ds.drop_attrs(), auto.drop_attrs())
    x = X
    for b, block in enumerate(net.layers_list):
        q, k, _ = block.mixer.c_attn(block.ln(x)).split(16, dim=-1)
        q, k = q.unflatten(-1, (2, 8)).transpose(1, 2), k.unflatten(-1, (2, 8)).transpose(1, 2)
        Y = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(
            ~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf
        )
        P = torch.softmax(Y, -1)
        np.testing.assert_allclose(
            ds["attention_entropy"][0, b].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
        )
        x = block(x)
    with pytest.raises(ValueError, match="attention must have one entry per block"):
        Monitor(net, X, blocks="layers_list", attention=names[:1])
    with pytest.raises(ValueError, match="not an attention module"):
        Monitor(net, X, blocks="layers_list", attention=["layers_list.0.ln", None])


def test_model_without_reachable_attention_gets_the_other_metrics_and_a_note():
    torch.manual_seed(5)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    X = torch.randn(2, 5, 8)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = model

        def forward(self, x):
            return self.blocks(x)

    with pytest.warns(RuntimeWarning, match="attention_entropy, max_logit, entropy_reference not"):
        monitor = Monitor(Net(), X)
    ds = monitor(0)
    assert "attention_entropy" not in ds and "max_logit" not in ds
    assert "attention_entropy" in ds.attrs["missing"]
    for name in ("activation_rms", "kurtosis", "mean_rho", "stable_rank", "centred_stable_rank"):
        assert np.isfinite(ds[name].values).all(), name
    # a library model with an attention-free block gets NaN there, not zero
    config = shapedtx.preset("pre_ln", width=16, depth=2, causal=True)
    net = shapedtx.Transformer(config)
    with pytest.warns(RuntimeWarning, match="blocks blocks.1"):
        ds = Monitor(net, torch.randn(2, 5, 16), attention=["blocks.0.attention", None])(0)
    assert np.isfinite(ds["attention_entropy"][0, 0]).all()
    assert np.isnan(ds["attention_entropy"][0, 1]).all()
    assert "blocks.1" in ds.attrs["missing"]


def test_update_size_between_measurements():
    torch.manual_seed(6)
    config = shapedtx.preset("shaped", width=16, depth=2, causal=True)
    model = shapedtx.Transformer(config)
    X = torch.randn(2, 5, 16)
    monitor = Monitor(model, X, every=2)
    first = monitor(0)
    assert np.isnan(first["update_size"]).all()
    assert monitor(1) is None  # not due
    W = model.blocks[1].attention.layers["key"].weight
    old = W.detach().clone()
    with torch.no_grad():
        W.add_(0.1 * torch.randn_like(W))
    ds = monitor(2)
    expected = float((W.detach().double() - old.double()).norm() / old.double().norm())
    value = ds["update_size"].sel(step=2, block=1, weight="attention.layers.key.weight")
    # in the weights' precision (float32 here): agrees with the float64 formula to rounding
    assert float(value) == pytest.approx(expected, rel=1e-6)
    assert float(relative_update(W, old)) == pytest.approx(expected, rel=1e-12)
    others = ds["update_size"][0].values.copy()
    others[1, list(ds["weight"].values).index("attention.layers.key.weight")] = 0
    assert (others == 0).all()  # nothing else moved
    assert list(monitor.dataset()["step"].values) == [0, 2]
    # a matrix that was zero: inf once it moves, NaN (0 / 0) while it stays zero
    Q0, Q1 = (model.blocks[i].attention.layers["query"].weight for i in (0, 1))
    with torch.no_grad():
        Q0.zero_()
        Q1.zero_()
    monitor(4)
    with torch.no_grad():
        Q1.add_(0.1)
    ds = monitor(6)
    name = "attention.layers.query.weight"
    assert np.isnan(float(ds["update_size"].sel(step=6, block=0, weight=name)))
    assert float(ds["update_size"].sel(step=6, block=1, weight=name)) == np.inf


# ---------------------------------------------------------------- the trainer's log

TEXT = "the quick brown fox jumps over the lazy dog. a shaped transformer keeps its tokens.\n" * 40
MODEL = ModelConfig(
    width=16, depth=2, attention="shaped", mlp="shaped_relu", heads=2, out_proj=True, causal=True
)
TRAIN = TrainConfig(
    steps=4,
    batch_size=4,
    seq_len=16,
    lr=1e-2,
    warmup_steps=1,
    log_interval=2,
    eval_interval=2,
    eval_batches=1,
    metrics_batch=2,
    checkpoint_interval=2,
    seed=3,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text(TEXT)
    return load_corpus(path, val_fraction=0.2)


def test_trainer_log_has_the_monitor_variables_and_equals_the_user_loop_monitor(corpus, tmp_path):
    from shapedtx.results import load_dataset
    from shapedtx.training.data import fixed_windows

    result = train(MODEL, corpus, TRAIN, out_dir=tmp_path, progress=False, snapshots=[2])
    log = load_dataset(tmp_path / "log.nc")
    dims = {
        "activation_rms": ("step", "layer"),
        "kurtosis": ("step", "layer"),
        "attention_entropy": ("step", "block", "head"),
        "max_logit": ("step", "block", "head"),
        "entropy_reference": ("step", "block"),
        "update_size": ("step", "block", "weight"),
    }
    for name, dim in dims.items():
        assert log[name].dims == dim, name
    assert log.sizes["head"] == MODEL.heads and log.sizes["layer"] == MODEL.depth + 1
    assert np.isnan(log["update_size"].sel(step=0)).all()
    assert np.isfinite(log["update_size"].sel(step=[2, 4])).all()
    # the same numbers from a user's loop: the models at steps 2 and 4 on the metrics batch
    tokens = fixed_windows(corpus.val, TRAIN.metrics_batch, TRAIN.seq_len)[:, :-1]
    model = LanguageModel(MODEL, TRAIN.seq_len)
    model.load_state_dict(torch.load(tmp_path / "checkpoint-2.pt", weights_only=True)["model"])
    monitor = Monitor(model, tokens)
    monitor(2)
    model.load_state_dict(result.model.state_dict())
    monitor(4)
    ds = monitor.dataset()
    for name in ds.data_vars:
        steps = [4] if name == "update_size" else [2, 4]  # the first measurement has no update
        mine, logged = ds[name].sel(step=steps), log[name].sel(step=steps)
        xr.testing.assert_allclose(mine, logged, rtol=1e-12, atol=0)
    assert set(dims) | {"mean_rho", "stable_rank", "centred_stable_rank"} <= set(ds.data_vars)


def test_trainer_log_notes_a_model_without_attention(corpus):
    config = MODEL.replace(attention="none")
    log = train(config, corpus, TRAIN.replace(steps=2, checkpoint_interval=0), progress=False).log
    assert "attention_entropy" not in log and "max_logit" not in log
    assert "attention_entropy" in log.attrs["monitor_missing"]
    assert np.isfinite(log["kurtosis"]).all()


def test_plot_monitor_two_runs_side_by_side():
    torch.manual_seed(7)
    logs = {}
    for preset in ("shaped", "pre_ln"):
        model = shapedtx.Transformer(shapedtx.preset(preset, width=16, depth=2, causal=True))
        monitor = Monitor(model, torch.randn(2, 5, 16))
        monitor(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        monitor(1)
        logs[preset] = monitor.dataset()
    fig = plot_monitor(logs)
    axes = fig.get_axes()
    assert len(axes) == 7 * 2
    assert axes[0].get_title() == "shaped" and axes[1].get_title() == "pre_ln"
    assert len(axes[0].get_lines()) == 2 + 1  # two blocks and the uniform reference
    assert axes[0].get_ylabel().startswith("attention entropy")
    with pytest.raises(ValueError, match="no variable"):
        plot_monitor(logs, metrics=["nothing"])


def test_bad_arguments_are_named():
    config = shapedtx.preset("shaped", width=16, depth=2, causal=True)
    model = shapedtx.Transformer(config)
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        Monitor(model, torch.randn(2, 5, 16), every=0)
    with pytest.raises(ValueError, match="model\\(inputs\\) failed") as err:
        Monitor(model, torch.randn(2, 5, 8))(0)
    assert err.value.parameter == "inputs"
    assert all(not (m._forward_hooks or m._forward_pre_hooks) for m in model.modules())
    monitor = Monitor(model, torch.randn(2, 5, 16))
    monitor(3)
    with pytest.raises(ValueError, match="step must increase"):
        monitor(3)
