"""The shaped Transformer with a trainable shape (docs/theory.md#trainable-shape): trainable
shaped-ReLU slopes (per layer or per channel), per-head attention gains and temperature, and
multipliers of the residual weights lambda, gamma per sub-block.

At initialisation it is the fixed shaped model bit for bit (same seed); the new parameters
receive gradients, sit in the block-vector parameter group (no weight decay) and change the
function once they move."""

from __future__ import annotations

import math

import pytest
import torch

from shapedtx import ModelConfig, Monitor, ParameterError, Transformer, preset
from shapedtx.activation import shaped_relu, trainable_relu
from shapedtx.training import LanguageModel, TrainConfig
from shapedtx.training.trainer import _make_optimizer

BASE = preset("shaped", width=32, depth=3, heads=4, mlp_ratio=4, causal=True, tau0=0.25)
VARIANTS = {
    "slopes per layer": {"mlp_slopes": "layer"},
    "slopes per channel": {"mlp_slopes": "channel"},
    "attention gains": {"attention_gains": "trainable"},
    "temperature": {"temperature": "trainable"},
    "residual weights": {"residual_gains": "trainable"},
    "all": {
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "temperature": "trainable",
        "residual_gains": "trainable",
    },
}
VARIANTS["all, log gains"] = {**VARIANTS["all"], "log_gains": True}
NEW_PARAMETERS = {
    "slopes per layer": {"mlp_s_plus": (), "mlp_s_minus": ()},
    "slopes per channel": {"mlp_s_plus": (128,), "mlp_s_minus": (128,)},
    "attention gains": {"attn_alpha": (4,), "attn_beta": (4,), "attn_gamma": (4,)},
    "temperature": {"attn_temperature": (4,)},
    "residual weights": {
        f"res_{part}_{weight}": () for part in ("attn", "mlp") for weight in ("lambda", "gamma")
    },
}
NEW_PARAMETERS["all"] = {
    **NEW_PARAMETERS["slopes per channel"],
    **NEW_PARAMETERS["attention gains"],
    **NEW_PARAMETERS["temperature"],
    **NEW_PARAMETERS["residual weights"],
}
NEW_PARAMETERS["all, log gains"] = NEW_PARAMETERS["all"]


def _models(changes: dict[str, str]) -> tuple[LanguageModel, LanguageModel]:
    torch.manual_seed(3)
    fixed = LanguageModel(BASE, 24)
    torch.manual_seed(3)
    free = LanguageModel(BASE.replace(**changes), 24)
    return fixed, free


def _gains(model: LanguageModel) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".gains." in n}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_at_initialisation_it_is_the_fixed_model_bit_for_bit(name: str) -> None:
    fixed, free = _models(VARIANTS[name])
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(0))
    fixed_weights = dict(fixed.named_parameters())
    for key, p in free.named_parameters():
        if ".gains." not in key:
            assert torch.equal(p, fixed_weights[key]), key
    assert torch.equal(free(tokens[:, :-1]), fixed(tokens[:, :-1]))
    assert torch.equal(free.loss(tokens), fixed.loss(tokens))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_blocks_at_initialisation_are_the_fixed_blocks(
    name: str, causal: bool, fused: bool
) -> None:
    """Bit for bit on the fused path, to rounding on the explicit one, causal or not."""
    config = BASE.replace(causal=causal)
    torch.manual_seed(5)
    fixed = Transformer(config, fused=fused)
    torch.manual_seed(5)
    free = Transformer(config.replace(**VARIANTS[name]), fused=fused)
    X = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(6))
    if fused:
        assert torch.equal(free(X), fixed(X))
    else:
        torch.testing.assert_close(free(X), fixed(X))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_new_parameters_shapes_initial_values_and_gradients(name: str) -> None:
    _, free = _models(VARIANTS[name])
    gains = _gains(free)
    expected = NEW_PARAMETERS[name]
    assert len(gains) == BASE.depth * len(expected)
    initial = {"mlp_s_minus": 1 - 1 / 32**0.5}  # c_minus = -1 at width 32; the rest 1
    for key, p in gains.items():
        short = key.rsplit(".", 1)[1]
        assert tuple(p.shape) == expected[short], key
        value = 0.0 if "log" in name else initial.get(short, 1.0)  # log gains store theta
        torch.testing.assert_close(p.detach(), torch.full_like(p, value), rtol=0, atol=1e-7)
    tokens = torch.randint(0, 256, (4, 25), generator=torch.Generator().manual_seed(1))
    free.loss(tokens).backward()
    for key, p in gains.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, key


@pytest.mark.parametrize("name", list(VARIANTS))
def test_new_parameters_are_block_vectors_without_weight_decay(name: str) -> None:
    _, free = _models(VARIANTS[name])
    for key in _gains(free):
        assert free.parameter_group(key) == "block_vector"
    optimizer = _make_optimizer(free, TrainConfig(steps=10, lr=1e-3, weight_decay=0.1))
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    for key, p in _gains(free).items():
        assert decay_of[id(p)] == 0.0, key
    assert sorted(decay_of.values())[-1] == 0.1  # the matrices are decayed


@pytest.mark.parametrize("proxy", [0, 16])
def test_vector_lr_factor_scales_the_block_vectors_lr_alone(proxy: int) -> None:
    """``vector_lr_factor`` multiplies the lr of the block vectors (the gains and slopes, the
    biases) and of nothing else, on top of the transfer rule's factor where there is one."""
    _, free = _models({**VARIANTS["all"], "bias": True})
    base = TrainConfig(steps=10, lr=1e-2, lr_proxy_width=proxy, lr_proxy_depth=proxy and 2)
    lrs = [
        {id(p): g["lr"] for g in _make_optimizer(free, c).param_groups for p in g["params"]}
        for c in (base, base.replace(vector_lr_factor=0.1))
    ]
    groups = {free.parameter_group(n) for n, _ in free.named_parameters()}
    assert "block_vector" in groups and len(groups) > 1
    for name, p in free.named_parameters():
        factor = 0.1 if free.parameter_group(name) == "block_vector" else 1.0
        assert lrs[1][id(p)] == pytest.approx(factor * lrs[0][id(p)], rel=1e-12), name
    with pytest.raises(ValueError, match="vector_lr_factor"):
        base.replace(vector_lr_factor=0.0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_moving_the_new_parameters_changes_the_function(name: str) -> None:
    fixed, free = _models(VARIANTS[name])
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for p in _gains(free).values():
            p.sub_(0.3)
        assert not torch.allclose(free(tokens[:, :-1]), fixed(tokens[:, :-1]), atol=1e-4)


def test_log_gains_are_their_initial_value_times_exp_theta() -> None:
    """With log_gains each gain reads initial * exp(theta): moving theta by log(r) gives the
    network whose gains are r times the initial ones, and every reader (the blocks, the
    explicit attention matrix, the monitor) sees the gain, not theta."""
    changes = {**VARIANTS["all"], "bias": True}
    _, log = _models({**changes, "log_gains": True})
    _, linear = _models(changes)
    ratios = {"attn_beta": 0.5, "attn_temperature": 2.0, "mlp_s_minus": 0.25, "res_mlp_gamma": 3.0}
    with torch.no_grad():
        for key, p in _gains(log).items():
            r = ratios.get(key.rsplit(".", 1)[1], 1.0)
            p.fill_(math.log(r))
            dict(linear.named_parameters())[key].mul_(r)
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(log(tokens[:, :-1]), linear(tokens[:, :-1]))
    first = (log.body.blocks[0].attention, linear.body.blocks[0].attention)
    X = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(first[0].attention_matrix(X), first[1].attention_matrix(X))
    seen = [Monitor(m, tokens[:, :-1])(0) for m in (log, linear)]
    for name in ("shape_gain", "mlp_kappa", "max_logit"):
        torch.testing.assert_close(
            torch.from_numpy(seen[0][name].values), torch.from_numpy(seen[1][name].values)
        )
    assert float(seen[0]["shape_gain"].sel(gain="attn_beta").mean()) == pytest.approx(0.5)


def test_log_gains_need_a_trainable_shape_and_nonzero_slopes() -> None:
    with pytest.raises(ParameterError, match=r"log_gains.*trainable shape"):
        BASE.replace(log_gains=True)
    with pytest.raises(ParameterError, match=r"log_gains.*nonzero initial slopes"):
        BASE.replace(log_gains=True, mlp_slopes="layer", c_minus=-(32**0.5))


def test_attention_gains_give_the_stated_matrix() -> None:
    """alpha I + beta Softmax(t Y / tau) - gamma C, per head, from the explicit path."""
    config = BASE.replace(attention_gains="trainable", temperature="trainable")
    _, free = _models({"attention_gains": "trainable", "temperature": "trainable"})
    attention = free.body.blocks[0].attention
    g = attention.gains
    with torch.no_grad():
        for name, values in {
            "attn_alpha": [0.5, 1.0, 1.5, 2.0],
            "attn_beta": [2.0, 0.1, 1.0, 0.3],
            "attn_gamma": [0.0, 1.0, 0.5, 3.0],
            "attn_temperature": [1.0, 2.0, 0.5, 4.0],
        }.items():
            g[name].copy_(torch.tensor(values))
    X = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(4))
    A = attention.attention_matrix(X)
    q = attention.layers["query"](X).unflatten(-1, (4, 8)).transpose(1, 2)
    k = attention.layers["key"](X).unflatten(-1, (4, 8)).transpose(1, 2)
    t = g["attn_temperature"][:, None, None]
    Y = (q * t) @ k.transpose(-1, -2) / config.tau
    Y = Y.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    C = torch.ones(6, 6).tril() / torch.arange(1, 7)[:, None]
    expected = (
        g["attn_alpha"][:, None, None] * torch.eye(6)
        + g["attn_beta"][:, None, None] * torch.softmax(Y, -1)
        - g["attn_gamma"][:, None, None] * C
    )
    torch.testing.assert_close(A, expected)
    # the fused branch applies the same matrix
    v = attention.layers["value"](X).unflatten(-1, (4, 8)).transpose(1, 2)
    out = attention.layers["out"]((A @ v).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(attention(X), out, rtol=1e-5, atol=1e-6)


def test_trainable_relu_is_the_shaped_relu_at_equal_slopes() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    for s_minus in (0.875, 0.3, 0.0):
        got = trainable_relu(x, torch.tensor(1.0), torch.tensor(s_minus))
        assert torch.equal(got, shaped_relu(x, 1.0, s_minus))
    got = trainable_relu(x, torch.tensor(2.0), torch.tensor(0.5))
    torch.testing.assert_close(got, torch.where(x > 0, 2 * x, 0.5 * x))


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"mlp": "gelu", "mlp_slopes": "layer"}, "mlp_slopes"),
        ({"mlp": "relu", "mlp_slopes": "channel"}, "mlp_slopes"),
        ({"attention": "softmax", "attention_gains": "trainable"}, "attention_gains"),
        ({"attention": "softmax", "temperature": "trainable"}, "temperature"),
        ({"mlp_slopes": "per_head"}, "mlp_slopes"),
        ({"attention_gains": "yes"}, "attention_gains"),
        ({"residual": "unit", "residual_gains": "trainable"}, "residual_gains"),
        ({"residual_gains": "channel"}, "residual_gains"),
    ],
)
def test_invalid_trainable_shape_is_refused_by_name(changes: dict, parameter: str) -> None:
    fields = {**preset("shaped").__dict__, **changes}
    with pytest.raises(ParameterError) as err:
        ModelConfig(**fields)
    assert err.value.parameter == parameter


@pytest.mark.parametrize("name", ["sas", "sas_p", "sas_p_no_norm"])
def test_simplified_presets_are_built_as_the_reference_code_builds_them(name: str) -> None:
    """Query bias (zero) and the first value map r W + s I (W = 0, r = s = 1): the same
    function at initialisation as the plain identity-initialised value matrix, with every new
    parameter trained."""
    config = preset(name, width=32, depth=3, causal=True)
    assert config.query_bias and config.first_value == "reparametrised"
    torch.manual_seed(0)
    new = LanguageModel(config, 24)
    old = LanguageModel(config.replace(query_bias=False, first_value="matrix"), 24)
    state = old.state_dict()
    for key, value in new.state_dict().items():
        if key in state and state[key].shape == value.shape and "value" not in key:
            state[key] = value
    old.load_state_dict(state)
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(new.loss(tokens), old.loss(tokens), rtol=0, atol=1e-6)
    value = new.body.blocks[0].attention.layers["value"]
    assert torch.equal(value.weight, torch.zeros(32, 32))
    assert value.r.item() == value.s.item() == 1.0
    assert "value" not in new.body.blocks[1].attention.layers
    new.loss(tokens).backward()
    for block in new.body.blocks:
        bias = block.attention.layers["query"].bias
        assert torch.equal(bias, torch.zeros(32)) and bias.grad.abs().sum() > 0
    for p in (value.weight, value.s):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert value.r.grad == 0  # r multiplies W = 0: it moves once W has
    assert new.parameter_group("body.blocks.0.attention.layers.value.r") == "block_vector"
    assert new.parameter_group("body.blocks.0.attention.layers.value.weight") == "hidden"


def test_first_value_needs_simplified_attention() -> None:
    with pytest.raises(ParameterError) as err:
        preset("shaped", first_value="reparametrised")
    assert err.value.parameter == "first_value"


def test_shaped_free_preset_is_simulated_as_the_shaped_model() -> None:
    """Side by side: the simulators (and so ``compare`` and the SDE, which read only the
    initial law) give the same numbers for ``shaped_free`` as for the shaped model it starts
    from, bit for bit for the same seed."""
    from shapedtx import equicorrelated
    from simulations import simulate

    free = preset("shaped_free", width=16, depth=4, causal=True, tau0=0.25, gamma=0.3)
    assert (free.mlp_slopes, free.attention_gains, free.temperature) == (
        "channel", "trainable", "trainable"
    )  # fmt: skip
    fixed = free.replace(mlp_slopes="fixed", attention_gains="fixed", temperature="fixed")
    X0 = equicorrelated(4, 0.2)
    a = simulate(free, X0, 64, seed=3)
    b = simulate(fixed, X0, 64, seed=3)
    assert a["V"].equals(b["V"])
    assert set(free.to_attrs()) - set(a.attrs) == set()  # the full configuration in attrs
    assert a.attrs["config.mlp_slopes"] == "channel"


def test_residual_gains_multiply_lambda_and_gamma() -> None:
    """``g_l lambda X + g_g gamma f(X)`` per sub-block: multipliers of the fixed weights, not
    the weights themselves (docs/theory.md#trainable-shape)."""
    from shapedtx.blocks import residual

    config = BASE.replace(residual_gains="trainable")
    X, branch = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(7)).unbind(0)
    gains = {"res_mlp_lambda": torch.tensor(2.0), "res_mlp_gamma": torch.tensor(0.5)}
    got = residual(X, branch, config, gains.__getitem__, "mlp")
    expected = 2.0 * config.lam * X + 0.5 * config.gamma * branch
    torch.testing.assert_close(got, expected)
    fixed = torch.add(config.lam * X, branch, alpha=config.gamma)
    assert torch.equal(residual(X, branch, config), fixed)  # gain=None: at initialisation


def test_zero_biases_leave_the_function_at_initialisation_unchanged() -> None:
    """The ablation's (l): (f) with biases, zero at initialisation. Their initialisation draws
    from the RNG (so the same seed gives other weights: the shaped model in law); given (f)'s
    weights, the model is (f)'s function bit for bit, and its biases receive gradients."""
    config = BASE.replace(
        mlp_slopes="channel", attention_gains="trainable", temperature="trainable"
    )
    torch.manual_seed(3)
    plain = LanguageModel(config, 24)
    biased = LanguageModel(config.replace(bias=True), 24)
    biases = {n: p for n, p in biased.named_parameters() if n not in dict(plain.named_parameters())}
    assert biases and all(n.endswith(".bias") for n in biases)
    assert all(torch.count_nonzero(p) == 0 for p in biases.values())
    missing = biased.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert set(missing) == set(biases)
    tokens = torch.randint(0, 256, (2, 25), generator=torch.Generator().manual_seed(0))
    assert torch.equal(biased(tokens[:, :-1]), plain(tokens[:, :-1]))
    biased.loss(tokens).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in biases.values())
