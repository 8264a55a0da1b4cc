"""Parametrisations for learning-rate transfer (issue 37, item 2): the shaped model's gamma rule
(``gamma_t``), the unit residual's branch multiplier (``depth_alpha``), and the per-group Adam
learning rates of ``shapedtx.lr_multipliers`` and the trainer (docs/theory.md#transfer)."""

from __future__ import annotations

import math

import pytest
import torch

from shapedtx import ModelConfig, ParameterError, Transformer, lr_multipliers, lr_rule, preset
from shapedtx.presets import SHAPED_T_GAMMA_T
from shapedtx.training import LanguageModel, TrainConfig
from shapedtx.training.trainer import _make_optimizer
from shapedtx.training.transfer import GROUPS, eps_multiplier, proxy_config


def _config(name: str, width: int, depth: int) -> ModelConfig:
    return preset(name, width=width, depth=depth, causal=True)


@pytest.mark.parametrize(
    ("name", "depth", "multiplier"),
    [
        ("pre_ln_depth_mup", 4, 0.5),
        ("pre_ln_depth_mup", 16, 0.25),
        ("pre_ln_completep", 4, 0.25),
        ("pre_ln_completep", 16, 1 / 16),
        ("pre_ln", 16, 1.0),
    ],
)
def test_branch_multiplier_in_the_forward(name, depth, multiplier):
    """A block of each pre-LN parametrisation is X + m attn(LN X), then + m mlp(LN .), with
    m = depth^(-depth_alpha): computed by hand from the block's own sub-modules."""
    config = _config(name, 16, depth)
    assert config.depth_multiplier == pytest.approx(multiplier, rel=1e-12)
    torch.manual_seed(0)
    model = Transformer(config).double()
    block = model.blocks[1]
    X = torch.randn(2, 5, 16, dtype=torch.float64)
    H = X + multiplier * block.attention(block.norms["attn_norm"](X))
    expected = H + multiplier * block.mlp(block.norms["mlp_norm"](H))
    torch.testing.assert_close(block(X), expected, rtol=1e-12, atol=1e-12)


def test_base_depth_sets_where_the_multiplier_is_one():
    config = preset("pre_ln_completep", width=16, depth=32, base_depth=8)
    assert config.depth_multiplier == pytest.approx(0.25)
    assert preset("pre_ln_depth_mup", width=16, depth=8, base_depth=8).depth_multiplier == 1.0


@pytest.mark.parametrize(
    ("width", "depth", "gamma"),
    [(64, 8, math.sqrt(0.005625 * 8)), (64, 32, math.sqrt(0.005625 * 2)), (256, 8, 0.4242640687)],
)
def test_gamma_from_t_holds_gamma2_d_over_n(width, depth, gamma):
    """shaped_t: gamma = sqrt(gamma_t n / d), so gamma^2 d / n = 0.005625 at every size, and the
    block's residual is sqrt(1 - gamma^2) X + gamma f(X) with that gamma."""
    config = _config("shaped_t", width, depth)
    assert pytest.approx(0.005625, rel=1e-12) == SHAPED_T_GAMMA_T
    assert config.gamma == pytest.approx(gamma, rel=1e-9)
    assert config.gamma**2 * depth / width == pytest.approx(0.005625, rel=1e-12)
    torch.manual_seed(1)
    block = Transformer(config.replace(depth=2)).double().blocks[0]
    small = config.replace(depth=2)  # gamma follows the depth
    assert small.gamma == pytest.approx(math.sqrt(0.005625 * width / 2))
    X = torch.randn(2, 5, width, dtype=torch.float64)
    H = small.lam * X + small.gamma * block.attention(X)
    expected = small.lam * H + small.gamma * block.mlp(H)
    torch.testing.assert_close(block(X), expected, rtol=1e-12, atol=1e-12)


def test_gamma_t_round_trips_and_replaces_gamma():
    config = ModelConfig(width=64, depth=16, gamma=0.9, gamma_t=0.005625, causal=True)
    assert config.gamma == pytest.approx(0.15)
    assert ModelConfig.from_attrs(config.to_attrs()) == config
    assert "gamma" in config.unused_fields()
    assert "base_depth" in preset("pre_ln", width=16, depth=4).unused_fields()


@pytest.mark.parametrize(
    ("fields", "parameter"),
    [
        ({"residual": "unit", "gamma_t": 0.01}, "gamma_t"),
        ({"gamma_t": 0.5, "width": 64, "depth": 8}, "gamma_t"),  # gamma = 2 > 1
        ({"gamma_t": -1.0}, "gamma_t"),
        ({"depth_alpha": 0.5}, "depth_alpha"),  # residual="scaled"
        ({"residual": "unit", "depth_alpha": 1.5}, "depth_alpha"),
        ({"residual": "unit", "depth_alpha": 0.5, "base_depth": 0}, "base_depth"),
    ],
)
def test_bad_depth_rules_are_refused(fields, parameter):
    with pytest.raises(ParameterError) as err:
        ModelConfig(**fields)
    assert err.value.parameter == parameter


# (name, target (width, depth)) -> expected factors from the proxy (64, 8), by hand from the
# rules of docs/theory.md#transfer
EXPECTED = {
    ("pre_ln", (256, 64)): dict.fromkeys(GROUPS, 1.0),
    ("shaped", (256, 64)): {"hidden": 0.25, "readout": 0.25, "block_vector": 1.0},
    ("shaped_t", (32, 8)): {"hidden": 2.0, "readout": 2.0, "block_vector": 1.0},
    ("shaped_t", (64, 64)): {"hidden": 1.0, "readout": 1.0, "block_vector": 1.0},
    ("pre_ln_depth_mup", (64, 32)): {"hidden": 0.5, "readout": 1.0, "block_vector": 0.5},
    ("pre_ln_depth_mup", (256, 64)): {
        "hidden": 0.25 / math.sqrt(8),
        "readout": 0.25,
        "block_vector": 1 / math.sqrt(8),
    },
    ("pre_ln_completep", (64, 32)): {"hidden": 1.0, "readout": 1.0, "block_vector": 1.0},
    ("pre_ln_completep", (128, 4)): {"hidden": 0.5, "readout": 0.5, "block_vector": 1.0},
}


@pytest.mark.parametrize(("name", "target"), list(EXPECTED))
def test_lr_multipliers_at_two_sizes(name, target):
    proxy = _config(name, 64, 8)
    got = lr_multipliers(_config(name, *target), proxy)
    expected = {"embedding": 1.0, "final": 1.0, **EXPECTED[name, target]}
    assert got == pytest.approx(expected, rel=1e-12)
    assert lr_multipliers(proxy, proxy) == dict.fromkeys(GROUPS, 1.0)


def test_lr_rules_and_proxy_checks():
    assert [lr_rule(_config(n, 16, 4)) for n in ("pre_ln", "shaped", "pre_ln_completep")] == [
        "standard",
        "mup",
        "depth",
    ]
    with pytest.raises(ParameterError) as err:
        lr_multipliers(_config("pre_ln_completep", 64, 8), _config("pre_ln_depth_mup", 64, 4))
    assert err.value.parameter == "proxy"
    with pytest.raises(ParameterError):  # a fixed gamma must be the proxy's
        lr_multipliers(_config("shaped", 64, 8), _config("shaped", 32, 8).replace(gamma=0.1))
    with pytest.raises(ParameterError) as err:
        TrainConfig(lr_proxy_width=64)
    assert err.value.parameter == "lr_proxy_width"


def test_eps_multiplier_by_hand():
    """``m_N^-1 m_L^-a``: CompleteP (a = 1) from depth 4 to depth 64 at the proxy's width
    divides epsilon by 16, and by 2 * 4 from (16, 2) to (32, 8); muP (a = 0) ignores depth."""
    target = _config("pre_ln_completep", 16, 64)
    assert eps_multiplier(target, proxy_config(target, 16, 4)) == 1 / 16
    target = _config("pre_ln_completep", 32, 8)
    assert eps_multiplier(target, proxy_config(target, 16, 2)) == 1 / 8
    assert eps_multiplier(_config("shaped", 32, 8), _config("shaped", 16, 2)) == 1 / 2


def test_proxy_config_derives_head_sizes_only_when_the_target_derived_both():
    """Derived ``head_dim`` and ``key_dim`` follow the proxy's width; a ``key_dim`` set apart
    from the derived ``head_dim`` keeps both sizes (4 heads, width 32 -> 16)."""
    target = _config("pre_ln_completep", 32, 8)
    proxy = proxy_config(target, 16, 2)
    assert (proxy.width, proxy.depth, proxy.head_dim, proxy.key_dim) == (16, 2, 4, 4)
    proxy = proxy_config(target.replace(key_dim=4), 16, 2)
    assert (proxy.head_dim, proxy.key_dim) == (8, 4)


# factors from width 16, depth 2 to width 32, depth 8 (m_N = 2, m_L = 4), written out by hand:
# (hidden, readout, block_vector); embeddings and the final LN keep 1
_HAND_FACTORS = {
    "pre_ln_depth_mup": (0.5 * 4**-0.5, 0.5, 4**-0.5),
    "pre_ln_completep": (0.5, 0.5, 1.0),
    "shaped_t": (0.5, 0.5, 1.0),
    "pre_ln": (1.0, 1.0, 1.0),
}


@pytest.mark.parametrize("name", sorted(_HAND_FACTORS))
def test_trainer_gives_each_parameter_its_group_lr(name):
    """With lr_proxy_width/depth, every parameter's AdamW lr is lr times its group's factor
    (each group seen in the model; the factors written out by hand), and without them every lr
    is the base lr."""
    target = _config(name, 32, 8)
    model = LanguageModel(target, 8)
    config = TrainConfig(lr=1e-2, lr_proxy_width=16, lr_proxy_depth=2, steps=10)
    hidden, readout, vector = _HAND_FACTORS[name]
    factors = {"hidden": hidden, "readout": readout, "block_vector": vector}
    factors |= {"embedding": 1.0, "final": 1.0}
    assert lr_multipliers(target, proxy_config(target, 16, 2)) == pytest.approx(factors)
    lr_of = {
        id(p): g["lr"] for g in _make_optimizer(model, config).param_groups for p in g["params"]
    }
    seen = set()
    for pname, p in model.named_parameters():
        group = model.parameter_group(pname)
        seen.add(group)
        assert lr_of[id(p)] == pytest.approx(1e-2 * factors[group], rel=1e-12), pname
    # the shaped model has no biases and no norms: no vectors in its blocks
    assert seen == set(GROUPS) - ({"block_vector"} if name == "shaped_t" else set())
    plain = _make_optimizer(model, config.replace(lr_proxy_width=0, lr_proxy_depth=0))
    assert {g["lr"] for g in plain.param_groups} == {1e-2}
    assert _make_optimizer(model, config).param_groups[0]["lr"] == 1e-2  # the logged lr


def test_parameter_groups_by_name():
    """LanguageModel.parameter_group sorts its parameters by the module that holds them."""
    model = LanguageModel(_config("pre_ln", 16, 4).replace(final_norm=True), 8)
    assert model.parameter_group("body.blocks.3.attention.layers.query.weight") == "hidden"
    assert model.parameter_group("body.blocks.0.mlp.layers.mlp_out.bias") == "block_vector"
    assert model.parameter_group("body.blocks.0.norms.attn_norm.weight") == "block_vector"
    assert model.parameter_group("unembed.weight") == "readout"
    assert model.parameter_group("unembed.bias") == "final"
    assert model.parameter_group("final_norm.weight") == "final"
    assert model.parameter_group("position") == "embedding"
    assert model.parameter_group("embed.weight") == "embedding"
    assert set(model.parameter_groups()) == {name for name, _ in model.named_parameters()}
    with pytest.raises(ParameterError):
        model.parameter_group("head.weight")


@pytest.mark.parametrize("name", ["pre_ln_depth_mup", "pre_ln_completep"])
def test_depth_rule_presets_init_hidden_weights_at_one_over_fan_in(name):
    """The depth rules' hidden matrices start at N(0, 1/fan_in) at every depth: no GPT-2
    1/sqrt(2 depth) factor on the output projections (the branch multiplier does that job).
    Tolerance: 5 standard errors of a sample standard deviation, sqrt(1 / (2 N)) relative."""
    torch.manual_seed(0)
    for depth in (2, 16):
        model = LanguageModel(_config(name, 64, depth), 8)
        for pname, w in model.named_parameters():
            if model.parameter_group(pname) != "hidden":
                continue
            fan_in = w.shape[1]
            rel_se = (2 * w.numel()) ** -0.5
            ratio = float(w.detach().std()) * fan_in**0.5
            assert abs(ratio - 1.0) < 5 * rel_se, (depth, pname, ratio)
