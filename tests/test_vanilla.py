"""Vanilla Transformers as practitioners build them: unit residual, pre/post-LN, GELU, wide
MLP, GPT-2 initialisation, biases, presets; the modules against hand-written references."""

import math

import pytest
import torch

import sde
from shapedtx import PRESETS, ModelConfig, Transformer, equicorrelated, initial_tokens, preset
from shapedtx.blocks import gaussian_linear
from shapedtx.metrics import correlation
from shapedtx.training import LanguageModel
from simulations import simulate

from mc_stats import two_sample_pvalue


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Give every bias and LayerNorm gain a non-trivial value so the references must use them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(
                    torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3 + ("weight" in name)
                )


def _ln(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def _attention_ref(x: torch.Tensor, attn, cfg: ModelConfig) -> torch.Tensor:
    """Multi-head softmax attention written out: heads, logits / sqrt(n_k), causal mask, W^O."""
    L = attn.layers
    q, k, v = (L[name](x) for name in ("query", "key", "value"))
    B, m, _ = x.shape
    h = cfg.heads
    q, k, v = (t.view(B, m, h, -1).transpose(1, 2) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(cfg.key_dim)
    if cfg.causal:
        logits = logits.masked_fill(~torch.ones(m, m, dtype=torch.bool).tril(), -math.inf)
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, m, -1)
    return L["out"](out)


def _mlp_ref(x: torch.Tensor, mlp, cfg: ModelConfig) -> torch.Tensor:
    hidden = mlp.layers["mlp_in"](x)
    act = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))  # exact GELU
    return mlp.layers["mlp_out"](act)


def _block_ref(x: torch.Tensor, blk, cfg: ModelConfig) -> torch.Tensor:
    """One block written out for each (norm, residual) of the vanilla presets."""
    parts = (
        (lambda y: _attention_ref(y, blk.attention, cfg), "attn_norm"),
        (lambda y: _mlp_ref(y, blk.mlp, cfg), "mlp_norm"),
    )
    for f, norm in parts:
        if cfg.norm == "pre":
            x = x + f(_ln(x, blk.norms[norm]))
        elif cfg.norm == "post":
            x = _ln(x + f(x), blk.norms[norm])
        else:
            x = x + f(x)
    return x


@pytest.mark.parametrize("name", ["pre_ln", "post_ln", "no_norm"])
@pytest.mark.parametrize("causal", [False, True])
def test_vanilla_modules_match_hand_written_reference(name, causal):
    torch.manual_seed(0)
    cfg = preset(name, width=16, depth=3, causal=causal)
    model = Transformer(cfg).double()
    _randomise(model)
    X = torch.randn(2, 5, 16, dtype=torch.float64)
    ref = X
    for blk in model.blocks:
        ref = _block_ref(ref, blk, cfg)
    torch.testing.assert_close(model(X), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mlp", ["relu", "shaped_relu"])
def test_scaled_residual_and_relu_gain_by_init(mlp):
    """Scaled residual ``lambda X + gamma f``; the ReLU gain sqrt(c) is the theory's (fan_in
    init) and absent under the GPT-2 init."""
    torch.manual_seed(1)
    for init, gain in (("fan_in", None), ("gpt2", 1.0)):
        cfg = ModelConfig(width=16, depth=2, attention="none", mlp=mlp, mlp_ratio=3, init=init,
                          gamma=0.6, c_minus=-2.0)  # fmt: skip
        model = Transformer(cfg).double()
        X = torch.randn(3, 4, 16, dtype=torch.float64)
        blk = model.blocks[0]
        s_plus, s_minus = (1.0, 0.0) if mlp == "relu" else (1.0, 1 - 2 / 4)
        c = 2 / (s_plus**2 + s_minus**2)
        g = math.sqrt(c) if gain is None else gain
        h = blk.mlp.layers["mlp_in"](X)
        phi = s_plus * h.clamp(min=0) + s_minus * h.clamp(max=0)
        expected = 0.8 * X + 0.6 * g * blk.mlp.layers["mlp_out"](phi)
        assert blk.mlp.layers["mlp_in"].weight.shape == (48, 16)
        torch.testing.assert_close(blk(X), expected, rtol=1e-10, atol=1e-10)


def test_post_ln_differs_from_pre_ln_and_normalises_the_stream():
    torch.manual_seed(2)
    post = Transformer(preset("post_ln", width=32, depth=2)).double()
    pre = Transformer(preset("pre_ln", width=32, depth=2, init="fan_in", final_norm=False))
    pre = pre.double()
    pre.load_state_dict(post.state_dict())
    X = 3 * torch.randn(2, 6, 32, dtype=torch.float64)
    out_post, out_pre = post(X), pre(X)
    assert (out_post - out_pre).abs().max() > 0.1
    # post-LN: every token of the output has zero feature mean and unit feature variance
    torch.testing.assert_close(out_post.mean(-1), torch.zeros(2, 6, dtype=torch.float64),
                               atol=1e-10, rtol=0)  # fmt: skip
    var = out_post.var(-1, unbiased=False)
    torch.testing.assert_close(var, torch.ones_like(var), atol=1e-4, rtol=0)


def test_gpt2_init_has_the_stated_weight_scales():
    torch.manual_seed(3)
    depth, n = 6, 128
    cfg = preset("pre_ln", width=n, depth=depth, causal=True)
    lm = LanguageModel(cfg, 32)
    blk = lm.body.blocks[0]
    layers = {**blk.attention.layers, **blk.mlp.layers}
    residual_std = 0.02 / math.sqrt(2 * depth)
    for name, layer in layers.items():
        target = residual_std if name in ("out", "mlp_out") else 0.02
        # the sample std of k entries has relative SE 1/sqrt(2k); k >= 16384 here
        assert layer.weight.std().item() == pytest.approx(target, rel=0.03), name
        assert torch.count_nonzero(layer.bias) == 0, name
    assert layers["mlp_in"].weight.shape == (4 * n, n)
    for emb in (lm.embed.weight, lm.position, lm.unembed.weight):
        assert emb.std().item() == pytest.approx(0.02, rel=0.05)
    assert lm.final_norm is not None
    fan_in = LanguageModel(cfg.replace(init="fan_in"), 32)
    w = fan_in.body.blocks[0].mlp.layers["mlp_out"].weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(4 * n), rel=0.03)
    assert fan_in.embed.weight.std().item() == pytest.approx(math.sqrt(0.5), rel=0.05)


def test_gaussian_linear_follows_the_init():
    gen = torch.Generator().manual_seed(0)
    cfg = preset("pre_ln", width=8, depth=2)
    x = torch.eye(400, dtype=torch.float64).expand(2, 400, 400)
    W = gaussian_linear(gen, cfg)(x, 300, "out")  # x = I: the output is W itself
    assert W.std().item() == pytest.approx(0.02 / 2, rel=0.01)
    W = gaussian_linear(gen, cfg.replace(init="fan_in"))(x, 300, "query")
    assert W.std().item() == pytest.approx(1 / 20, rel=0.01)


def test_modules_and_simulator_agree_in_law_at_initialisation(monkeypatch):
    """The nn modules (fresh model per sample) and the exact sampler draw the same network:
    catches an init scale applied in one and not the other (e.g. W^O's 1/sqrt(2 depth))."""
    cfg = preset("no_norm", width=16, depth=3, init="gpt2", heads=2)
    V0 = equicorrelated(4, 0.2)
    samples = 400
    gen = torch.Generator().manual_seed(0)
    X0 = initial_tokens(V0, 16, samples, gen)
    torch.manual_seed(1)
    V_mod = torch.stack([Transformer(cfg).double().covariances(X0[i : i + 1])[0, -1]
                         for i in range(samples)])  # fmt: skip
    V_sim = torch.from_numpy(simulate(cfg, V0, samples, seed=3)["V"].values[:, -1])
    for stat in (lambda V: V[:, 0, 0], lambda V: correlation(V)[:, 0, 3]):
        assert two_sample_pvalue(stat(V_mod), stat(V_sim)) > 1e-3
    # power: the same test rejects a simulator without the residual-projection scaling
    monkeypatch.setattr("shapedtx.blocks.weight_std", lambda config, name, fan_in: 0.02)
    V_wrong = torch.from_numpy(simulate(cfg, V0, samples, seed=4)["V"].values[:, -1])
    assert two_sample_pvalue(V_mod[:, 0, 0], V_wrong[:, 0, 0]) < 1e-3


def test_presets_are_valid_and_overridable():
    for name in PRESETS:
        cfg = preset(name, width=64, depth=3)
        # the simplified blocks' output map is the identity (docs/theory.md#simplified)
        assert cfg.width == 64 and cfg.heads == 4 and cfg.out_proj != (name.startswith("sas"))
    cfg = preset("pre_ln", width=64, depth=3)
    assert (cfg.norm, cfg.residual, cfg.mlp, cfg.mlp_ratio, cfg.init) == (
        "pre", "unit", "gelu", 4, "gpt2"
    )  # fmt: skip
    assert cfg.bias and cfg.final_norm
    assert preset("post_ln", width=64, depth=3).norm == "post"
    assert ModelConfig.from_attrs(cfg.to_attrs()) == cfg
    with pytest.raises(ValueError, match="name must be one of"):
        preset("gpt5")
    with pytest.raises(ValueError, match="heads"):
        preset("pre_ln", width=30, depth=2)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"residual": "unit"}, "residual"),
        ({"mlp": "gelu"}, "gelu"),
        ({"norm": "post"}, "norm"),
        ({"init": "gpt2"}, "init"),
    ],
)
def test_sde_refuses_vanilla_fields_naming_them(changes, field):
    cfg = ModelConfig(width=16, depth=2, **changes)
    with pytest.raises(ValueError, match=field):
        sde.drift(cfg, equicorrelated(3, 0.2))


def test_gram_refuses_vanilla_fields():
    with pytest.raises(ValueError, match="gelu"):
        simulate(preset("no_norm", width=16, depth=2, heads=1, out_proj=False),
                 equicorrelated(3, 0.2), 4, method="gram")  # fmt: skip
    # unit residual alone is supported: same law as the exact sampler
    cfg = ModelConfig(width=16, depth=3, attention="softmax", residual="unit")
    a = simulate(cfg, equicorrelated(3, 0.2), 600, method="gram", seed=0)["V"].values[:, -1]
    b = simulate(cfg, equicorrelated(3, 0.2), 600, method="exact", seed=1)["V"].values[:, -1]
    assert two_sample_pvalue(a[:, 0, 0], b[:, 0, 0]) > 1e-3
    assert two_sample_pvalue(a[:, 0, 1], b[:, 0, 1]) > 1e-3


def test_vanilla_collapse_at_initialisation_as_measured_by_users():
    """The issue's numbers (width 64, depth 6, m = 4, rho0 = 0.2, GELU 4n, unit residual,
    fan_in init): median final rho about 0.76 (pre-LN), 0.97 (post-LN), 0.96 and V^aa about
    370 (no norm), shaped about 0.2; tolerances about 3 SE of a median at 256 samples."""
    V0 = equicorrelated(4, 0.2)

    def medians(cfg):
        V = torch.from_numpy(simulate(cfg, V0, 256, seed=0)["V"].values[:, -1])
        rho = correlation(V)[:, 0, 1:].mean(-1)
        return rho.median().item(), V[:, 0, 0].median().item()

    size = {"width": 64, "depth": 6}
    assert medians(preset("pre_ln", init="fan_in", **size))[0] == pytest.approx(0.76, abs=0.05)
    assert medians(preset("post_ln", **size))[0] == pytest.approx(0.97, abs=0.03)
    rho, vaa = medians(preset("no_norm", **size))
    assert rho == pytest.approx(0.96, abs=0.03) and vaa == pytest.approx(370, rel=0.2)
    assert medians(preset("shaped", **size))[0] == pytest.approx(0.2, abs=0.05)
