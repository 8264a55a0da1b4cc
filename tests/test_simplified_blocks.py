"""He & Hofmann's simplified blocks (docs/theory.md#simplified): the presets ``sas``, ``sas_p``
and ``sas_p_no_norm`` against a forward written out here with plain torch operations from the
model's own parameters, their initialisation (W^Q = 0, A = I), the gradients of the trainable
gains, the preset fields, simulation at initialisation and the SDE's refusal."""

import math

import numpy as np
import pytest
import torch

import sde
from shapedtx import PRESETS, ModelConfig, Transformer, equicorrelated, initial_tokens, preset
from shapedtx.blocks import block
from shapedtx.training import LanguageModel
from simulations import simulate

from mc_stats import two_sample_pvalue

SIMPLIFIED = ("sas", "sas_p", "sas_p_no_norm")


def _config(name: str, **changes) -> ModelConfig:
    return preset(name, **{"width": 16, "depth": 3, "causal": True, **changes})


# --------------------------------------------------------------------------------------------
# The reference forward, from the parameters only
# --------------------------------------------------------------------------------------------
def _norm_ref(x: torch.Tensor, module: torch.nn.Module, kind: str) -> torch.Tensor:
    if kind == "rms":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + module.eps) * module.weight
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + module.eps) * module.weight + module.bias


def _attention_ref(
    x: torch.Tensor, attn, cfg: ModelConfig, first: bool, centring: bool = True
) -> torch.Tensor:
    """Per head ``(alpha I + beta Softmax(q k^T / sqrt(n_k) + M) - gamma C) v`` with v the
    head's columns of x (of x W^V in the first block); ``centring=False``: without gamma C."""
    L, g = attn.layers, attn.gains
    q = x @ L["query"].weight.T
    if L["query"].bias is not None:  # the trainable query bias of the presets
        q = q + L["query"].bias
    k = x @ L["key"].weight.T
    v = x
    if first and cfg.first_value == "reparametrised":  # x (r W + s I)^T
        value = L["value"]
        v = x @ (value.r * value.weight + value.s * torch.eye(x.shape[-1], dtype=x.dtype)).T
    elif first:
        v = x @ L["value"].weight.T
    m, n = x.shape[-2:]
    h, dk, dv = cfg.heads, cfg.key_dim, n // cfg.heads
    allowed = torch.ones(m, m, dtype=torch.bool).tril()
    C = allowed.to(x.dtype) / torch.arange(1, m + 1, dtype=x.dtype)[:, None]
    eye = torch.eye(m, dtype=x.dtype)
    heads = []
    for j in range(h):
        Y = q[..., j * dk : (j + 1) * dk] @ k[..., j * dk : (j + 1) * dk].transpose(-1, -2)
        S = torch.softmax((Y / math.sqrt(dk)).masked_fill(~allowed, -math.inf), dim=-1)
        A = g["attn_alpha"][j] * eye + g["attn_beta"][j] * S
        if centring:
            A = A - g["attn_gamma"][j] * C
        heads.append(A @ v[..., j * dv : (j + 1) * dv])
    return torch.cat(heads, dim=-1)


def _mlp_ref(x: torch.Tensor, mlp) -> torch.Tensor:
    hidden = torch.clamp(x @ mlp.layers["mlp_in"].weight.T, min=0.0)
    return hidden @ mlp.layers["mlp_out"].weight.T


def _block_ref(
    X: torch.Tensor, blk, cfg: ModelConfig, first: bool, *, centring: bool = True, mlp_gain=None
) -> torch.Tensor:
    g = blk.gains
    g_mlp = g["mlp_gain"] if mlp_gain is None else mlp_gain
    if first and cfg.norm == "none":
        X = _norm_ref(X, blk.norms["input_norm"], "layer")

    def pre(x, name):
        return _norm_ref(x, blk.norms[name], cfg.norm_kind) if cfg.norm == "pre" else x

    x = pre(X, "attn_norm")
    attended = _attention_ref(x, blk.attention, cfg, first, centring)
    if cfg.layout == "parallel":
        return g["attn_gain"] * attended + g_mlp * _mlp_ref(x, blk.mlp)
    H = g["attn_gain"] * attended
    return g["mlp_skip"] * H + g_mlp * _mlp_ref(pre(H, "mlp_norm"), blk.mlp)


def _forward_ref(model: Transformer, X: torch.Tensor, **kwargs) -> torch.Tensor:
    for i, blk in enumerate(model.blocks):
        X = _block_ref(X, blk, model.config, i == 0, **kwargs)
    return X


def _perturb(model: torch.nn.Module, seed: int = 0) -> None:
    """Move every parameter (W^Q, the gains, the norms' affine parameters, ...) away from its
    initial value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)


# --------------------------------------------------------------------------------------------
# (1) forward against the reference; (2) initialisation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", SIMPLIFIED)
def test_forward_matches_reference_at_init_and_perturbed(name, fused):
    torch.manual_seed(0)
    cfg = _config(name)
    model = Transformer(cfg, fused=fused).double()
    X = torch.randn(3, 7, cfg.width, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(X), _forward_ref(model, X), rtol=1e-10, atol=1e-10)
        _perturb(model)
        out = model(X)
        torch.testing.assert_close(out, _forward_ref(model, X), rtol=1e-10, atol=1e-10)
        # power: the reference without the centring term or with MLP gain 1 is far away
        for wrong in ({"centring": False}, {"mlp_gain": 1.0}):
            assert (out - _forward_ref(model, X, **wrong)).abs().max() > 1e-2


@pytest.mark.parametrize("name", SIMPLIFIED)
def test_initialisation_query_zero_attention_identity(name):
    torch.manual_seed(1)
    cfg = _config(name)
    model = Transformer(cfg).double()
    X = torch.randn(2, 6, cfg.width, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64).expand(2, cfg.heads, 6, 6)
    for i, blk in enumerate(model.blocks):
        attn = blk.attention
        assert torch.count_nonzero(attn.layers["query"].weight) == 0
        assert torch.count_nonzero(attn.layers["key"].weight) == attn.layers["key"].weight.numel()
        for gain in ("attn_alpha", "attn_beta", "attn_gamma"):
            assert attn.gains[gain].shape == (cfg.heads,)
            assert torch.equal(attn.gains[gain], torch.ones(cfg.heads, dtype=torch.float64))
        torch.testing.assert_close(attn.attention_matrix(X), eye, rtol=0, atol=1e-14)
        torch.testing.assert_close(attn(X), X, rtol=0, atol=1e-14)
        # identity W^V and W^O: no weights, except the first block's trainable W^V = I
        assert set(attn.layers) == ({"query", "key", "value"} if i == 0 else {"query", "key"})
        if i == 0:  # r W + s I with W = 0, r = s = 1 (first_value="reparametrised")
            value = attn.layers["value"]
            assert torch.equal(value.weight, torch.zeros(cfg.width, cfg.width).double())
            assert value.r.item() == value.s.item() == 1.0
            assert value.weight.requires_grad and value.r.requires_grad and value.s.requires_grad
        assert torch.equal(attn.layers["query"].bias, torch.zeros(cfg.width).double())
        assert blk.gains["attn_gain"].item() == 1.0
        assert blk.gains["mlp_gain"].item() == pytest.approx(0.1)
        assert ("mlp_skip" in blk.gains) == (cfg.layout == "sequential")
    # the samplers' shortcut: gain=None (the attention sub-layer as the identity) is the
    # module at initialisation
    Y = X
    for i, blk in enumerate(model.blocks):
        Y = block(Y, cfg, blk._linear, first=i == 0)
    torch.testing.assert_close(model(X), Y, rtol=1e-6, atol=1e-9)  # float32-made mlp_gain


def test_non_causal_centring_is_the_uniform_mean():
    torch.manual_seed(2)
    cfg = _config("sas_p", causal=False)
    model = Transformer(cfg).double()
    _perturb(model)
    attn = model.blocks[1].attention
    X = torch.randn(2, 5, cfg.width, dtype=torch.float64)
    q = attn.layers["query"](X).unflatten(-1, (cfg.heads, -1)).transpose(1, 2)
    k = attn.layers["key"](X).unflatten(-1, (cfg.heads, -1)).transpose(1, 2)
    S = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(cfg.key_dim), dim=-1)
    g = {name: attn.gains[name][:, None, None] for name in attn.gains}
    A = g["attn_alpha"] * torch.eye(5) + g["attn_beta"] * S - g["attn_gamma"] / 5
    with torch.no_grad():
        torch.testing.assert_close(attn.attention_matrix(X), A)
        for fused in (True, False):
            attn.fused = fused
            expected = (A @ X.unflatten(-1, (cfg.heads, -1)).transpose(1, 2)).transpose(1, 2)
            torch.testing.assert_close(attn(X), expected.flatten(-2))


# --------------------------------------------------------------------------------------------
# (3) the trainable gains and W^Q get gradients through the language model
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SIMPLIFIED)
def test_language_model_backpropagates_into_gains(name):
    torch.manual_seed(3)
    cfg = _config(name, depth=2)
    model = LanguageModel(cfg, max_len=8)
    assert isinstance(model.body.blocks, torch.nn.ModuleList) and len(model.body.blocks) == 2
    model.loss(torch.randint(0, 256, (4, 9))).backward()
    for blk in model.body.blocks:
        attn = blk.attention
        for gain in ("attn_alpha", "attn_beta", "attn_gamma"):
            grad = attn.gains[gain].grad
            assert grad is not None and bool((grad != 0).all()), gain
        assert attn.layers["query"].weight.grad.abs().sum() > 0
        for gain, p in blk.gains.items():
            assert p.grad is not None and p.grad.item() != 0, gain
    value = model.body.blocks[0].attention.layers["value"].weight
    assert value.grad is not None and value.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# (4) the presets' fields; (7) round trips and validation
# --------------------------------------------------------------------------------------------
_COMMON = {
    "attention": "simplified",
    "mlp": "relu",
    "mlp_ratio": 4,
    "residual": "skipless",
    "mlp_gain": 0.1,
    "init": "gpt2",
    "heads": 4,
    "out_proj": False,
    "bias": False,
    "final_norm": True,
    "query_bias": True,
    "first_value": "reparametrised",
}
EXPECTED = {
    "sas": {**_COMMON, "layout": "sequential", "norm": "pre", "norm_kind": "rms"},
    "sas_p": {**_COMMON, "layout": "parallel", "norm": "pre", "norm_kind": "rms"},
    "sas_p_no_norm": {**_COMMON, "layout": "parallel", "norm": "none"},
}


@pytest.mark.parametrize("name", SIMPLIFIED)
def test_preset_fields_as_documented(name):
    assert PRESETS[name] == EXPECTED[name]
    cfg = preset(name, width=64, depth=18)
    for field, value in {**EXPECTED[name], "causal": False, "key_dim": 16}.items():
        assert getattr(cfg, field) == value, field
    assert cfg.mlp_width == 256 and cfg.head_dim == 16
    assert preset(name, width=64, depth=2, causal=True).causal


@pytest.mark.parametrize("name", SIMPLIFIED)
def test_gpt2_init_without_depth_scaling(name):
    """Every weight N(0, 0.02^2): the skipless residual's gain replaces GPT-2's 1/sqrt(2d)."""
    torch.manual_seed(4)
    cfg = preset(name, width=128, depth=50)
    blk = Transformer(cfg.replace(depth=1)).blocks[0]
    for layer in ("mlp_in", "mlp_out"):
        assert blk.mlp.layers[layer].weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert blk.attention.layers["key"].weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_config_round_trip():
    configs = [preset(name, width=32, depth=5, causal=True) for name in SIMPLIFIED]
    configs.append(
        ModelConfig(
            width=12, attention="simplified", residual="skipless", layout="parallel",
            mlp="gelu", mlp_gain=0.25, norm="pre", norm_kind="rms", heads=3, key_dim=5,
        )
    )  # fmt: skip
    for cfg in configs:
        attrs = cfg.to_attrs()
        assert attrs["config.mlp_gain"] == cfg.mlp_gain
        assert ModelConfig.from_attrs(attrs) == cfg


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"attention": "simplified", "out_proj": True}, "out_proj"),
        ({"residual": "skipless"}, "residual='skipless' requires attention='simplified'"),
        ({"layout": "parallel"}, "layout='parallel' requires residual='skipless'"),
        ({"attention": "simplified", "residual": "skipless", "norm": "post"}, "norm"),
        ({"attention": "simplified", "residual": "skipless", "mlp_gain": 0.0}, "mlp_gain"),
        ({"norm_kind": "batch"}, "norm_kind"),
    ],
)
def test_invalid_combinations_raise_naming_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(width=16, heads=4, mlp="relu", **fields)


# --------------------------------------------------------------------------------------------
# (5) simulation at initialisation; (6) the SDE refuses them
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SIMPLIFIED)
def test_simulate_runs_and_is_finite(name):
    cfg = _config(name, width=16, depth=3)
    for method in ("auto", "weights"):
        ds = simulate(cfg, equicorrelated(4, 0.2), 32, method=method, seed=1, progress=False)
        V = ds["V"].values
        assert V.shape == (32, 4, 4, 4) and np.isfinite(V).all()
        # every block normalises (pre-norm, or the first block's LayerNorm): unit diagonal
        # plus the small MLP branch
        np.testing.assert_allclose(np.diagonal(V[:, 1:], axis1=-2, axis2=-1), 1.0, atol=0.2)


def test_simulate_matches_the_module_at_initialisation():
    """The samplers' identity attention sub-layer is the module's in law: the diagonal and
    a correlation after three blocks of sas_p_no_norm agree in distribution (fan_in init and
    a larger MLP gain, so that the MLP branch matters)."""
    cfg = _config("sas_p_no_norm", init="fan_in", mlp_gain=0.5)
    V0, samples = equicorrelated(4, 0.2).double(), 300
    V_sim = simulate(cfg, V0, samples, seed=2, progress=False)["V"].values[:, -1]
    torch.manual_seed(5)
    X0 = initial_tokens(V0, cfg.width, samples, torch.Generator().manual_seed(6))
    with torch.no_grad():
        X = torch.cat([Transformer(cfg).double()(X0[i : i + 1]) for i in range(samples)])
    V_mod = (X @ X.transpose(-1, -2) / cfg.width).numpy()
    for stat in (lambda V: V[:, 0, 0], lambda V: V[:, 0, 3] / np.sqrt(V[:, 0, 0] * V[:, 3, 3])):
        assert (
            two_sample_pvalue(torch.from_numpy(stat(V_sim)), torch.from_numpy(stat(V_mod))) > 1e-3
        )


@pytest.mark.parametrize("name", SIMPLIFIED)
def test_sde_refuses_naming_the_field(name):
    with pytest.raises(ValueError, match="attention='simplified'"):
        sde.sde_constants(_config(name), 4)
    bare = ModelConfig(width=16, attention="simplified", mlp="shaped_relu")
    with pytest.raises(ValueError, match=r"^attention='simplified' has no derived covariance SDE"):
        sde.sde_constants(bare, 4)
    with pytest.raises(ValueError, match="attention='simplified'"):
        sde.solve(bare, equicorrelated(4, 0.2), 8)
