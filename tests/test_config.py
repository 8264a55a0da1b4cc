import dataclasses
import math
from unittest.mock import ANY

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shapedtx import ModelConfig
from simulations.cli._common import ArgumentParser, add_config_arguments, config_from_args
from simulations.grid import make_grid

from strategies import model_configs


def test_defaults_and_derived():
    c = ModelConfig()
    assert c.head_dim == c.width and c.key_dim == c.head_dim
    assert math.isclose(c.lam**2 + c.gamma**2, 1.0)
    assert math.isclose(c.tau, c.tau0 * math.sqrt(c.width * c.key_dim))
    assert math.isclose(c.T, c.depth / c.width)


def test_fixed_head_size_requires_out_proj():
    c = ModelConfig(width=64, heads=8, head_dim=16, out_proj=True)
    assert c.value_dim == 128 and c.key_dim == 16
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig(width=64, heads=8, head_dim=16, out_proj=False)


@pytest.mark.parametrize(
    "field, value",
    [
        ("width", 0),
        ("width", 2.5),
        ("depth", 0),
        ("attention", "linear"),
        ("mlp", "swiglu"),
        ("norm", "rms"),
        ("residual", "rezero"),
        ("init", "xavier"),
        ("mlp_ratio", 0),
        ("mlp_ratio", 1.5),
        ("bias", "no"),
        ("final_norm", 0),
        ("heads", 0),
        ("heads", 3),  # does not divide width=64
        ("key_dim", 0),
        ("head_dim", -1),
        ("out_proj", "yes"),
        ("tau0", 0.0),
        ("tau0", float("nan")),
        ("tau0", 1e-7),  # the SDE's k_att = gamma^4 / tau0^2 would overflow near 1e-154
        ("tau0", 1e7),
        ("c_plus", 1e7),  # the ReLU normaliser 2 / (s_+^2 + s_-^2) would overflow near 1e154
        ("gamma", 0.0),
        ("gamma", 1.5),
        ("c_plus", float("inf")),
        ("c_minus", -100.0),  # slope 1 + c/sqrt(64) < 0
        ("causal", 1),
    ],
)
def test_invalid_field_raises_naming_it(field, value):
    kwargs = {"width": 64, "mlp": "shaped_relu", field: value}
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_tau0_and_relu_constants_accept_their_whole_range():
    for tau0 in (1e-6, 1e6):
        assert ModelConfig(tau0=tau0).tau0 == tau0
    assert ModelConfig(width=64, mlp="shaped_relu", c_plus=1e6).c_plus == 1e6
    with pytest.raises(ValueError, match=r"tau0 must be in \[1e-06, 1e\+06\], got 1e-07"):
        ModelConfig(tau0=1e-7)


def test_unused_fields_are_exactly_the_ones_without_effect():
    # of the skipless residual, of a norm, of the depth_alpha multiplier, of muP's width
    # multiplier (init="mup", output_multiplier) and of the softmax's scale
    unused_by_default = {"mlp_gain", "norm_kind", "base_depth", "base_width", "attention_scale"}
    assert set(ModelConfig(mlp="shaped_relu").unused_fields()) == unused_by_default
    assert ModelConfig(mlp="shaped_relu", norm="pre").unused_fields() == {
        "mlp_gain": ANY,
        "base_depth": ANY,
        "base_width": ANY,
        "attention_scale": ANY,
    }
    unused = ModelConfig(attention="softmax", mlp="relu", residual="unit").unused_fields()
    assert set(unused) == {"tau0", "c_plus", "c_minus", "gamma"} | unused_by_default - {
        "attention_scale"
    }
    assert "softmax" in unused["tau0"] and "'relu'" in unused["c_plus"]
    mup = ModelConfig(attention="softmax", mlp="relu", residual="unit", init="mup")
    assert "base_width" not in mup.unused_fields()
    assert "base_width" not in ModelConfig(output_multiplier=True).unused_fields()
    no_attention = ModelConfig(attention="none", mlp="shaped_relu").unused_fields()
    assert set(no_attention) == {
        "heads", "key_dim", "head_dim", "out_proj", "tau0", "causal", "query_bias"
    } | unused_by_default  # fmt: skip
    assert set(ModelConfig().unused_fields()) == {"mlp_ratio", "c_plus", "c_minus"} | {
        "mlp_gain", "norm_kind", "base_depth", "base_width", "attention_scale"
    }  # fmt: skip
    sas = ModelConfig(attention="simplified", residual="skipless", mlp="relu", norm="pre")
    assert set(sas.unused_fields()) == {
        "tau0", "gamma", "c_plus", "c_minus", "base_depth", "base_width", "attention_scale"
    }  # fmt: skip


def test_empty_block_rejected():
    with pytest.raises(ValueError, match="attention"):
        ModelConfig(attention="none", mlp="none")


def test_attrs_round_trip():
    c = ModelConfig(width=48, depth=7, heads=4, head_dim=5, out_proj=True, causal=True, mlp="relu")
    attrs = c.to_attrs()
    assert all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in attrs.values())
    assert ModelConfig.from_attrs(attrs) == c


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({}, "no key starts with 'config.'"),
        ({"config.width": 8.9}, r"attrs\['config.width'\] must be an integer"),
        ({"config.width": "8"}, r"attrs\['config.width'\] must be an integer"),
        ({"config.causal": "0"}, r"attrs\['config.causal'\] must be True/False or 0/1"),
        ({"config.causal": 2}, r"attrs\['config.causal'\] must be True/False or 0/1"),
        ({"config.gamma": True}, r"attrs\['config.gamma'\] must be a number"),
        ({"config.mlp": 1}, r"attrs\['config.mlp'\] must be a string"),
    ],
)
def test_from_attrs_rejects_what_to_attrs_never_writes(attrs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_attrs(attrs)


def test_from_attrs_reads_netcdf_scalars():
    # netCDF gives NumPy scalars back, bools as 0/1 and integral floats where ints were
    attrs = {"config.width": np.int64(64), "config.depth": 9.0, "config.causal": np.int64(1)}
    attrs |= {"config.gamma": np.float64(0.5), "unrelated": "kept out"}
    assert ModelConfig.from_attrs(attrs) == ModelConfig(width=64, depth=9, causal=True, gamma=0.5)


# Round trips for every valid config (property-based) -----------------------------------------
@settings(deadline=None)
@given(model_configs(max_width=64, max_depth=300))
def test_every_config_round_trips_through_attrs_cli_and_grid(config):
    attrs = config.to_attrs()
    assert all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in attrs.values())
    assert ModelConfig.from_attrs(attrs) == config
    assert ModelConfig.from_attrs(config.to_attrs("x/"), "x/") == config
    # the netCDF/xarray path hands back numpy scalars
    assert ModelConfig.from_attrs({k: np.asarray(v)[()] for k, v in attrs.items()}) == config

    parser = ArgumentParser(prog="test")
    add_config_arguments(parser)
    argv, unused = [], config.unused_fields()  # the command line refuses unused options
    for f in dataclasses.fields(config):
        if f.name in unused:
            continue
        value = getattr(config, f.name)
        flag = "--" + f.name.replace("_", "-")
        argv += [flag if value else f"--no-{flag[2:]}"] if isinstance(value, bool) else [
            f"{flag}={value!r}" if isinstance(value, float) else f"{flag}={value}"
        ]  # fmt: skip
    parsed = config_from_args(parser.parse_args(argv))
    assert parsed.unused_fields() == unused
    assert parsed == config.replace(**{k: getattr(parsed, k) for k in unused})

    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    point = next(make_grid(fields).points())
    assert point.error is None and point.config == config
    listed = make_grid({**fields, "width": [config.width]}).points()
    assert next(listed).config == config


@settings(deadline=None)
@given(model_configs(), st.integers(1, 8))
def test_replace_keeps_unchanged_fields_and_validates(config, depth):
    changed = config.replace(depth=depth)
    assert changed.depth == depth and depth / config.width == changed.T
    assert dataclasses.replace(changed, depth=config.depth) == config
