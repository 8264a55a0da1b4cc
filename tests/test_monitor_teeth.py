"""``shapedtx.Monitor`` readers: the masks of ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` on the axes PyTorch applies them (issue 66)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch
import xarray as xr
from torch import nn

import shapedtx
from shapedtx import Monitor
from shapedtx.diagnostics import (
    attention_entropy,
    max_logit,
    monitor_variables,
    plot_monitor,
)
from shapedtx.diagnostics.attention import as_float


def _entropy(p: torch.Tensor) -> torch.Tensor:
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return -(p * logp).sum(-1).mean(-1)


class _PaddedBlock(nn.Module):
    """A batch-first residual self-attention block called with a key padding mask."""

    def __init__(self, mha: nn.MultiheadAttention, pad: torch.Tensor, positional: bool) -> None:
        super().__init__()
        self.attn, self.pad, self.positional = mha, pad, positional

    def forward(self, x):
        if self.positional:  # query, key, value, key_padding_mask
            out = self.attn(x, x, x, self.pad, False)[0]
        else:
            out = self.attn(x, x, x, key_padding_mask=self.pad, need_weights=False)[0]
        return x + out


class _Net(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("positional", [False, True])
@pytest.mark.parametrize("float_mask", [False, True])
def test_multihead_key_padding_mask_hides_keys_not_queries(positional, float_mask):
    """A key padding mask (B, m_k) hides keys: the monitor's entropy, largest logit and
    entropy reference equal those of PyTorch's own attention weights with the same mask
    (each batch row pads a different number of keys, none of the queries loses its row)."""
    torch.manual_seed(3)
    B, m, n, h = 3, 6, 8, 2
    mha = nn.MultiheadAttention(n, h, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.mul_(4.0)
    pad = torch.zeros(B, m, dtype=torch.bool)
    pad[0, 4:] = True  # row 0: 4 keys visible
    pad[2, 1:3] = True  # row 2: keys 1, 2 hidden
    mask = pad.double().masked_fill(pad, -math.inf).float() if float_mask else pad
    X = torch.randn(B, m, n)
    ds = Monitor(_Net(_PaddedBlock(mha, mask, positional)), X)(0)
    _, P = mha(X, X, X, key_padding_mask=mask, need_weights=True, average_attn_weights=False)
    assert torch.all(P[0, :, :, 4:] == 0) and torch.all(P[2, :, :, 1:3] == 0)
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
    )
    visible = (~pad).sum(-1).double()  # keys per query in each row
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(float(visible.log().mean()))
    E = n
    q = (X @ mha.in_proj_weight[:E].T + mha.in_proj_bias[:E]).unflatten(-1, (h, n // h))
    k = (X @ mha.in_proj_weight[E : 2 * E].T + mha.in_proj_bias[E : 2 * E]).unflatten(
        -1, (h, n // h)
    )
    Y = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) / math.sqrt(n // h)
    Y = Y.masked_fill(pad[:, None, None, :], -math.inf)
    torch.testing.assert_close(torch.softmax(Y, -1), P, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ds["max_logit"][0, 0].values, Y.amax(dim=(0, 2, 3)).detach().numpy(), rtol=1e-5
    )


def test_encoder_layer_src_key_padding_mask_hides_keys():
    """``nn.TransformerEncoderLayer`` with ``src_key_padding_mask``: the monitor's entropy
    reference counts the visible keys of each row, and its entropy is that of the layer's
    self-attention weights with the same mask."""
    torch.manual_seed(4)
    B, m, n = 2, 5, 8
    layer = nn.TransformerEncoderLayer(n, 2, 16, dropout=0.0, batch_first=True)
    pad = torch.zeros(B, m, dtype=torch.bool)
    pad[1, 3:] = True

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([layer])

        def forward(self, x):
            return self.blocks[0](x, src_key_padding_mask=pad)

    X = torch.randn(B, m, n)
    ds = Monitor(Net(), X)(0)
    _, P = layer.self_attn(
        X, X, X, key_padding_mask=pad, need_weights=True, average_attn_weights=False
    )
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
    )
    reference = (math.log(5) + math.log(3)) / 2
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(reference)


# ---------------------------------------------------------------- the record and the figure


class _Blocks(nn.Module):
    """A model whose residual blocks are ``blocks`` (each maps (B, m, n) to itself)."""

    def __init__(self, *blocks: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class _Residual(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class _SelfAttention(nn.Module):
    def __init__(self, n: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(n, heads, batch_first=True)

    def forward(self, x):
        return x + self.attn(x, x, x, need_weights=False)[0]


def test_the_record_its_steps_attributes_and_blocks_of_fewer_heads():
    """Steps default to the call count; each call returns its row, :meth:`dataset` all rows;
    the attributes name the model, blocks, ``every`` and readers; a block with fewer heads
    gets NaN in the extra heads."""
    torch.manual_seed(5)
    model = _Blocks(_SelfAttention(8, 2), _SelfAttention(8, 4))
    X = torch.randn(2, 5, 8)
    monitor = Monitor(model, X, every=2)
    with pytest.raises(ValueError, match="no measurement yet"):
        monitor.dataset()
    first = monitor()  # step 0
    assert monitor() is None  # step 1: not due
    with torch.no_grad():
        model.blocks[0].attn.in_proj_weight.mul_(2.0)
    third = monitor()  # step 2
    ds = monitor.dataset()
    assert list(ds["step"].values) == [0, 2] and ds["step"].attrs["long_name"] == "optimiser step"
    assert list(ds["layer"].values) == [0, 1, 2] and list(ds["block"].values) == [0, 1]
    assert list(ds["head"].values) == [0, 1, 2, 3]
    assert ds.attrs["model"] == "_Blocks" and ds.attrs["blocks"] == "blocks.0, blocks.1"
    assert ds.attrs["every"] == 2 and ds.attrs["attention"] == "blocks.0.attn, blocks.1.attn"
    assert "missing" not in ds.attrs
    xr.testing.assert_identical(first, ds.isel(step=[0]))
    xr.testing.assert_identical(third, ds.isel(step=[1]))
    entropy = ds["attention_entropy"].values
    assert np.isnan(entropy[:, 0, 2:]).all() and np.isfinite(entropy[:, 0, :2]).all()
    assert np.isfinite(entropy[:, 1]).all()
    assert np.isnan(ds["max_logit"].values[:, 0, 2:]).all()
    assert (ds["activation_rms"].values > 0).all()
    np.testing.assert_allclose(ds["entropy_reference"].values, math.log(5), rtol=1e-12)
    # the update of block 0's query-key-value matrix: it doubled
    assert float(ds["update_size"].sel(step=2, block=0, weight="attn.in_proj_weight")) == (
        pytest.approx(1.0, rel=1e-6)
    )


def test_monitor_variables_fills_rows_without_a_variable_with_nan():
    """A row without a variable (an older checkpoint's) gets NaN; a variable in no row is left
    out; the head and weight coordinates come from the widest row and ``weights``."""
    rows = [
        {"activation_rms": np.array([1.0, 2.0]), "max_logit": np.array([[3.0]])},
        {"activation_rms": np.array([4.0, 5.0]), "update_size": np.array([[0.5, 0.25]])},
        {"activation_rms": np.array([6.0, 7.0]), "max_logit": np.array([[8.0, 9.0]])},
    ]
    data, coords = monitor_variables(rows, ["a", "b"], 1, gains=["g"])
    assert set(data) == {"activation_rms", "max_logit", "update_size"}
    dims, value = data["max_logit"]
    assert dims == ("step", "block", "head")
    np.testing.assert_array_equal(value, [[[3.0, np.nan]], [[np.nan, np.nan]], [[8.0, 9.0]]])
    np.testing.assert_array_equal(data["update_size"][1][[0, 2]], np.nan)
    np.testing.assert_array_equal(data["update_size"][1][1], [[0.5, 0.25]])
    assert list(coords["head"]) == [0, 1] and list(coords["weight"]) == ["a", "b"]
    assert list(coords["block"]) == [0] and "gain" not in coords


def _two_runs() -> dict:
    logs = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        # block 0 has one weight matrix, block 1 two others: NaN where a block lacks one
        model = _Blocks(_Residual(nn.Linear(4, 4)), _Residual(nn.Sequential(
            nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))))  # fmt: skip
        with pytest.warns(RuntimeWarning):
            monitor = Monitor(model, torch.randn(2, 3, 4))
        for step in range(3):
            monitor(step)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0 + 0.1 * (step + 1))
        logs[f"run {seed}"] = monitor.dataset()
    return logs


def test_plot_monitor_layout_labels_colours_and_update_means():
    """Rows are metrics and columns runs (3.6 x 2.2 inches each plus margins); the y labels on
    the first column, "step" on the last row, the titles on the first; colours run through
    viridis from the first layer to the last; ``update_size`` is the mean over the weights a
    block has (NaN ones skipped) on a log scale."""
    logs = _two_runs()
    fig = plot_monitor(logs, metrics=["activation_rms", "update_size"])
    np.testing.assert_allclose(fig.get_size_inches(), [3.6 * 2 + 0.8, 2.2 * 2 + 0.4])
    one = plot_monitor({"run 0": logs["run 0"]}, metrics=["kurtosis"])
    np.testing.assert_allclose(one.get_size_inches(), [3.6 + 0.8, 2.2 + 0.4])
    axes = fig.get_axes()
    assert len(axes) == 4
    (a, b), (c, d) = axes[:2], axes[2:]
    assert [ax.get_title() for ax in (a, b, c, d)] == ["run 0", "run 1", "", ""]
    assert [ax.get_xlabel() for ax in (a, b, c, d)] == ["", "", "step", "step"]
    assert a.get_ylabel() == "activation RMS" and b.get_ylabel() == ""
    assert c.get_ylabel().startswith("relative update") and d.get_ylabel() == ""
    assert a.get_legend() is None and b.get_legend() is not None and d.get_legend() is not None
    viridis = matplotlib.colormaps["viridis"]
    colours = [line.get_color() for line in a.get_lines()]
    assert colours == [viridis(0.0), viridis(0.5), viridis(1.0)]  # three layers
    labels = [line.get_label() for line in a.get_lines()]
    assert [x for x in labels if not x.startswith("_")] == ["layer 0", "layer 2"]
    assert [line.get_marker() for line in a.get_lines()] == ["."] * 3  # few steps: marked
    assert c.get_yscale() == "log" and a.get_yscale() == "linear"
    updates = logs["run 0"]["update_size"].values  # (step, block, weight)
    for j, line in enumerate(c.get_lines()):
        y = np.asarray(line.get_ydata(), dtype=float)
        assert np.isnan(y[0])  # the first measurement has no update
        np.testing.assert_allclose(y[1:], np.nanmean(updates[1:, j], axis=-1), rtol=1e-12)
        assert np.isfinite(y[1:]).all()


def test_plot_monitor_heads_reference_and_refusals():
    """``max_logit`` is the largest over heads, ``attention_entropy`` the mean, with the
    reference dashed; an empty or non-mapping ``logs`` and an empty ``metrics`` are refused,
    each naming its parameter; more than 20 steps are drawn without markers."""
    torch.manual_seed(2)
    model = _Blocks(_SelfAttention(8, 2))
    monitor = Monitor(model, torch.randn(2, 5, 8))
    for step in range(21):
        monitor(step)
    log = monitor.dataset()
    fig = plot_monitor({"a": log}, metrics=["attention_entropy", "max_logit"])
    top, bottom = fig.get_axes()
    entropy, reference = top.get_lines()
    np.testing.assert_allclose(entropy.get_ydata(), log["attention_entropy"][:, 0].mean("head"))
    np.testing.assert_allclose(reference.get_ydata(), log["entropy_reference"][:, 0])
    assert reference.get_linestyle() == "--" and reference.get_label() == "uniform"
    assert entropy.get_marker() in (None, "None", "")
    (largest,) = bottom.get_lines()
    np.testing.assert_allclose(largest.get_ydata(), log["max_logit"][:, 0].max("head"))
    for bad in ({}, [log]):
        with pytest.raises(ValueError, match="non-empty mapping") as err:
            plot_monitor(bad)
        assert err.value.parameter == "logs"
    with pytest.raises(ValueError, match="at least one variable") as err:
        plot_monitor({"a": log}, metrics=[])
    assert err.value.parameter == "metrics"


# ---------------------------------------------------------------- the readers: masks, axes


def _hand_logits(mha, q_in, k_in, attn_mask=None, pad=None):
    """``q k^T / sqrt(d)`` (B, h, m, m_k) from the projection, batch-first inputs, with an
    additive (or boolean: True hidden) ``attn_mask`` of (m, m_k) or (B h, m, m_k) and a
    key padding mask (B, m_k)."""
    E, h = mha.embed_dim, mha.num_heads
    if mha._qkv_same_embed_dim:
        w_q, w_k = mha.in_proj_weight[:E], mha.in_proj_weight[E : 2 * E]
    else:
        w_q, w_k = mha.q_proj_weight, mha.k_proj_weight
    b = mha.in_proj_bias
    q = q_in @ w_q.T + (b[:E] if b is not None else 0)
    k = k_in @ w_k.T + (b[E : 2 * E] if b is not None else 0)
    q = q.unflatten(-1, (h, E // h)).transpose(1, 2)
    k = k.unflatten(-1, (h, E // h)).transpose(1, 2)
    Y = q @ k.transpose(-1, -2) / math.sqrt(E // h)
    B, _, m, mk = Y.shape
    for mask in (attn_mask, None if pad is None else pad[:, None, None, :]):
        if mask is None:
            continue
        if mask.dim() == 3:
            mask = mask.view(B, h, m, mk)
        Y = Y.masked_fill(mask, -math.inf) if mask.dtype == torch.bool else Y + mask
    return Y


class _Call(nn.Module):
    """A residual block whose attention call is ``call(mha, x, need_weights=False)``."""

    def __init__(self, mha, call) -> None:
        super().__init__()
        self.attn, self.call = mha, call

    def forward(self, x):
        return x + self.call(self.attn, x, need_weights=False)[0]


def _check(ds, P, Y, block=0):
    """The monitor's entropy, largest logit and reference against PyTorch's weights P and
    the hand logits Y (checked against P first)."""
    torch.testing.assert_close(torch.softmax(Y, -1), P, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ds["attention_entropy"][0, block].values, _entropy(P).mean(0).numpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        ds["max_logit"][0, block].values, Y.amax(dim=(0, 2, 3)).numpy(), rtol=1e-5
    )
    visible = torch.isfinite(Y).sum(-1).double().log().mean(-1)  # (B, h), the same per head
    assert float(ds["entropy_reference"][0, block]) == pytest.approx(float(visible.mean()))


M, N, H = 5, 8, 2
_MEMORY = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(9))  # (B, m_k, kdim)
_FLOAT_MASK = torch.randn(M, M, generator=torch.Generator().manual_seed(10))
_HEAD_MASK = torch.rand(3 * H, M, M, generator=torch.Generator().manual_seed(11)) < 0.4
_HEAD_MASK[..., 0] = False  # every query sees key 0
_PAD = torch.tensor([[False] * 5, [False, False, False, True, True], [False, True] * 2 + [False]])


def _seq_first(mha, x, **kw):  # (m, B, n) inputs, (B, m_k) padding
    xs = x.transpose(0, 1)
    out, w = mha(xs, xs, xs, key_padding_mask=_PAD, **kw)
    return out.transpose(0, 1), w


def _cross(mha, x, **kw):  # keys of another length and width (kdim = vdim = 6)
    return mha(x, _MEMORY, _MEMORY, attn_mask=torch.ones(M, 7, dtype=torch.bool).triu(3), **kw)


def _unbatched(mha, x, **kw):  # B = 1, called on (m, n)
    out, w = mha(x[0], x[0], x[0], attn_mask=_FLOAT_MASK, **kw)
    return out[None], None if w is None else w[None]


CASES = {
    # name: (MultiheadAttention kwargs, the call, hand-logit masks, batch)
    "seq_first_padding": ({}, _seq_first, {"pad": _PAD}, 3),
    "float_attn_mask": (
        {},
        lambda a, x, **kw: a(x, x, x, attn_mask=_FLOAT_MASK, **kw),
        {"attn_mask": _FLOAT_MASK},
        3,
    ),
    "per_head_mask_and_padding": (
        {"bias": False},
        lambda a, x, **kw: a(x, x, x, _PAD, attn_mask=_HEAD_MASK, **kw),
        {"attn_mask": _HEAD_MASK, "pad": _PAD},
        3,
    ),
    "cross_kdim": ({"kdim": 6, "vdim": 6}, _cross, {}, 3),
    "unbatched": ({}, _unbatched, {"attn_mask": _FLOAT_MASK}, 1),
}


@pytest.mark.parametrize("case", list(CASES))
@torch.no_grad()
def test_multihead_reader_masks_and_axes(case):
    """Sequence-first inputs with padding, an additive mask, a per-head boolean mask (B h, m,
    m_k) with padding and no bias, keys of another length and width, and an unbatched call:
    the monitor's numbers are those of PyTorch's own weights for the same call."""
    kwargs, call, masks, B = CASES[case]
    torch.manual_seed(12)
    mha = nn.MultiheadAttention(N, H, batch_first=case != "seq_first_padding", **kwargs)
    for p in mha.parameters():
        if p.dim() == 2:
            p.mul_(3.0)
    if case != "per_head_mask_and_padding":
        mha.in_proj_bias.normal_()  # a bias that moves the logits
    X = torch.randn(B, M, N)
    ds = Monitor(_Blocks(_Call(mha, call)), X)(0)
    mha.eval()
    _, P = call(mha, X, need_weights=True, average_attn_weights=False)
    keys = _MEMORY if case == "cross_kdim" else X
    if case == "cross_kdim":
        masks = {"attn_mask": torch.ones(M, 7, dtype=torch.bool).triu(3)}
    _check(ds, P, _hand_logits(mha, X, keys, **masks))


@pytest.mark.parametrize("float_mask", [False, True])
@torch.no_grad()
def test_encoder_layer_src_mask_and_causal_hint(float_mask):
    """``nn.TransformerEncoderLayer`` with ``src_mask`` (boolean or additive, given by
    position) and ``is_causal``, against its self-attention's weights with the same mask."""
    torch.manual_seed(13)
    layer = nn.TransformerEncoderLayer(N, H, 16, dropout=0.0, batch_first=True)
    layer.self_attn.in_proj_weight.mul_(4.0)
    causal = torch.ones(M, M, dtype=torch.bool).triu(1)
    mask = torch.zeros(M, M).masked_fill(causal, -math.inf) if float_mask else causal

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([layer])

        def forward(self, x):
            return self.blocks[0](x, mask, None, True)

    X = torch.randn(2, M, N)
    ds = Monitor(Net(), X)(0)
    layer.eval()
    _, P = layer.self_attn(X, X, X, attn_mask=mask, need_weights=True, average_attn_weights=False)
    _check(ds, P, _hand_logits(layer.self_attn, X, X, attn_mask=mask))
    reference = sum(math.log(i) for i in range(1, M + 1)) / M
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(reference)


@torch.no_grad()
def test_a_causal_hint_without_a_mask_is_what_pytorch_computes():
    """``is_causal=True`` without a mask is only a hint: PyTorch (eval, no gradient: the
    monitor's pass) attends every key, and so does the monitor's reading."""
    torch.manual_seed(14)
    layer = nn.TransformerEncoderLayer(N, H, 16, dropout=0.0, batch_first=True)
    mha = nn.MultiheadAttention(N, H, batch_first=True)
    for attn in (layer.self_attn, mha):
        attn.in_proj_weight.mul_(4.0)

    class Hinted(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([layer, _Call(mha, lambda a, x, **kw: a(
                x, x, x, is_causal=True, **kw))])  # fmt: skip

        def forward(self, x):
            return self.blocks[1](self.blocks[0](x, is_causal=True))

    model = Hinted().eval()
    X = torch.randn(2, M, N)
    ds = Monitor(model, X)(0)
    plain = layer(X)
    np.testing.assert_allclose(layer(X, is_causal=True), plain)  # PyTorch ignores the hint
    for b, (attn, x) in enumerate([(layer.self_attn, X), (mha, plain)]):
        _, P = attn(x, x, x, need_weights=True, average_attn_weights=False)
        _check(ds, P, _hand_logits(attn, x, x), block=b)
        assert float(ds["entropy_reference"][0, b]) == pytest.approx(math.log(M))


def test_multihead_with_extra_key_rows_is_not_read():
    """``add_bias_kv`` and ``add_zero_attn`` add key rows the reader does not recompute: no
    reader, a note, and a refusal when named."""
    for extra in ({"add_bias_kv": True}, {"add_zero_attn": True}):
        model = _Blocks(_Call(nn.MultiheadAttention(N, H, batch_first=True, **extra),
                              lambda a, x, **kw: a(x, x, x, **kw)))  # fmt: skip
        with pytest.warns(RuntimeWarning, match="any block"):
            monitor = Monitor(model, torch.randn(2, M, N))
        assert not monitor.has_attention
        with pytest.raises(ValueError, match="not an attention module") as err:
            Monitor(model, torch.randn(2, M, N), attention=["blocks.0.attn"])
        assert err.value.parameter == "attention"


class _FusedAttention(nn.Module):
    """GPT-2 / nanoGPT-like attention: one ``c_attn`` map to q, k, v; causal."""

    def __init__(self, n: int, heads: int, names: dict, scaling: float | None = None) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n, 3 * n)
        self.n, self.h, self.s = n, heads, scaling
        for attr, value in names.items():
            setattr(self, attr, value)
        if scaling is not None:
            self.scaling = scaling

    def forward(self, x):
        q, k, v = self.c_attn(x).split(self.n, dim=-1)
        q, k, v = (t.unflatten(-1, (self.h, self.n // self.h)).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.s)
        return x + y.transpose(1, 2).flatten(-2)


@pytest.mark.parametrize(
    "names, scaling",
    [
        ({"num_heads": 2, "split_size": 8}, 0.3),  # GPT-2: scaling, split_size
        ({"n_head": 2, "n_embd": 8}, None),  # nanoGPT: 1 / sqrt(head_dim)
        ({"n_heads": 4, "embed_dim": 8}, 0.7),
    ],
)
@torch.no_grad()
def test_fused_reader_width_heads_and_scale(names, scaling):
    """The fused reader takes the heads from ``num_heads`` / ``n_head`` / ``n_heads``, the
    width from ``split_size`` / ``n_embd`` / ``embed_dim`` and the scale from ``scaling``
    (else ``1/sqrt(head_dim)``): its logits are the module's own, causal."""
    torch.manual_seed(15)
    heads = next(v for k, v in names.items() if k in ("num_heads", "n_head", "n_heads"))
    attn = _FusedAttention(8, heads, names, scaling)
    attn.c_attn.weight.mul_(3.0)
    X = torch.randn(2, M, 8)
    ds = Monitor(_Blocks(attn), X)(0)
    q, k, _ = attn.c_attn(X).split(8, dim=-1)
    q, k = (t.unflatten(-1, (heads, 8 // heads)).transpose(1, 2) for t in (q, k))
    scale = scaling if scaling is not None else 1 / math.sqrt(8 // heads)
    Y = (q @ k.transpose(-1, -2) * scale).masked_fill(
        ~torch.ones(M, M, dtype=torch.bool).tril(), -math.inf
    )
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values,
        _entropy(torch.softmax(Y, -1)).mean(0).numpy(),
        rtol=1e-5,
    )
    np.testing.assert_allclose(ds["max_logit"][0, 0].values, Y.amax(dim=(0, 2, 3)), rtol=1e-5)
    assert ds.sizes["head"] == heads


def test_modules_the_fused_reader_does_not_take():
    """Cross-attention, a width not divisible by the heads, and no head count are not read."""
    cases = [
        {"num_heads": 2, "split_size": 8, "is_cross_attention": True},
        {"num_heads": 3, "split_size": 8},
        {"split_size": 8},
        {"num_heads": 0, "split_size": 8},
        {"num_heads": 2},
    ]
    for names in cases:
        with pytest.warns(RuntimeWarning, match="any block"):
            monitor = Monitor(_Blocks(_FusedAttention(8, 2, names)), torch.randn(2, M, 8))
        assert not monitor.has_attention, names


def test_find_attention_entries_and_refusals():
    """``attention=`` takes one module or name per block (None for none); a string, a
    module or a non-sequence is refused, naming ``attention``."""
    torch.manual_seed(16)
    model = _Blocks(_SelfAttention(N, H), _SelfAttention(N, H))
    X = torch.randn(2, M, N)
    by_module = Monitor(model, X, attention=[model.blocks[0].attn, "blocks.1.attn"])
    assert by_module(0).attrs["attention"] == "blocks.0.attn, blocks.1.attn"
    with pytest.warns(RuntimeWarning, match="blocks blocks.0 "):
        partial = Monitor(model, X, attention=[None, "blocks.1.attn"])
    assert partial(0).attrs["attention"] == "-, blocks.1.attn"
    for bad in ("blocks.0.attn", model.blocks[0].attn, 3):
        with pytest.raises(ValueError, match="attention must be None or a list") as err:
            Monitor(model, X, attention=bad)
        assert err.value.parameter == "attention"


@torch.no_grad()
def test_library_attention_without_a_causal_mask_and_the_formulas_edges():
    """The library's non-causal attention sees every key (reference ``log m``); a query that
    sees no key has NaN entropy; half-precision logits are measured in float32."""
    torch.manual_seed(17)
    config = shapedtx.preset("pre_ln", width=16, depth=1, heads=2, causal=False)
    model = shapedtx.Transformer(config).double()
    X = torch.randn(2, 6, 16, dtype=torch.float64)
    ds = Monitor(model, X)(0)
    np.testing.assert_allclose(ds["entropy_reference"][0].values, math.log(6), rtol=1e-12)
    block = model.blocks[0]
    inner = block.norms["attn_norm"](X)
    P = block.attention.attention_matrix(inner)
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).numpy(), rtol=1e-9
    )
    Y = torch.tensor([[0.0, -math.inf], [-math.inf, -math.inf]])
    assert math.isnan(float(attention_entropy(Y)))
    half = torch.tensor([[0.0, 1.0], [2.0, 0.5]], dtype=torch.float16)
    assert attention_entropy(half).dtype == torch.float32 and max_logit(half) == 2.0
    assert max_logit(half).dtype == torch.float32
    assert as_float(torch.zeros(1, dtype=torch.float64)).dtype == torch.float64
