"""shapedtx.ParameterError: every validated parameter of the public entry points is refused
with the error naming it (``.parameter``), and the command line blames the option of that
attribute, not a word of the message (issue #36, item 3). Every case fails in validation,
before any computation."""

from __future__ import annotations

import dataclasses
import math
import pickle

import numpy as np
import pytest
import torch

import sde
import shapedtx
from shapedtx import ModelConfig, ParameterError, TrainConfig, equicorrelated
from shapedtx.config import FIELD_TYPES
from simulations import advise, compare, simulate
from simulations.cli import main
from simulations.cli._common import option_error

SMALL = ModelConfig(width=8, depth=2)
V0 = equicorrelated(4, 0.2)


def test_a_parameter_error_is_a_value_error_that_pickles():
    err = ParameterError("width", "width must be an integer >= 1, got 0")
    assert isinstance(err, ValueError) and shapedtx.ParameterError is ParameterError
    assert "ParameterError" in shapedtx.__all__
    copy = pickle.loads(pickle.dumps(err))  # Dask workers send errors back pickled
    assert type(copy) is ParameterError
    assert (copy.parameter, str(copy)) == ("width", str(err))


def _bad_field(name: str, kind: type):
    """A value of the wrong kind or range for the field ``name`` of ``kind``."""
    if kind is bool:
        return "yes"
    if kind is int:
        return 0
    if kind is float:
        return math.nan
    return "bogus"  # a choice


@pytest.mark.parametrize(("name", "kind"), FIELD_TYPES.items(), ids=list(FIELD_TYPES))
def test_every_model_config_field_is_named(name, kind):
    with pytest.raises(ParameterError) as info:
        ModelConfig(**{name: _bad_field(name, kind)})
    assert info.value.parameter == name
    assert str(info.value).startswith(name)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        (dict(attention="none", mlp="none"), "attention"),
        (dict(width=64, heads=3), "heads"),
        (dict(width=64, heads=2, head_dim=8), "head_dim"),
        (dict(width=4, mlp="shaped_relu", c_plus=-3.0), "c_plus"),
        (dict(width=4, mlp="shaped_relu", c_minus=-3.0), "c_minus"),
        # both slopes 0: an identically zero MLP (found by test_simulate's property test)
        (dict(width=4, mlp="shaped_relu", c_plus=-2.0, c_minus=-2.0), "c_minus"),
        (dict(attention="simplified", out_proj=True), "out_proj"),
        (dict(residual="skipless"), "residual"),
        (dict(attention="simplified", residual="skipless", norm="post"), "residual"),
        (dict(layout="parallel"), "layout"),
    ],
)
def test_model_config_rules_between_fields_name_a_field(kwargs, parameter):
    with pytest.raises(ParameterError) as info:
        ModelConfig(**kwargs)
    assert info.value.parameter == parameter


TRAIN_FIELDS = {f.name: type(TrainConfig().__getattribute__(f.name)) for f in
                dataclasses.fields(TrainConfig)}  # fmt: skip


@pytest.mark.parametrize("name", TRAIN_FIELDS)
def test_every_train_config_field_is_named(name):
    kind = TRAIN_FIELDS[name]
    bad = -1 if kind is int else _bad_field(name, kind)
    with pytest.raises(ParameterError) as info:
        TrainConfig(**{name: bad})
    assert info.value.parameter == name


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        (dict(steps=10, warmup_steps=10), "warmup_steps"),
        (dict(steps=100, warmup_steps=50, schedule="wsd", cooldown_fraction=0.9),
         "cooldown_fraction"),
        (dict(log_interval=10, eval_interval=15), "eval_interval"),
        (dict(log_interval=10, checkpoint_interval=15), "checkpoint_interval"),
    ],
)  # fmt: skip
def test_train_config_rules_between_fields_name_a_field(kwargs, parameter):
    with pytest.raises(ParameterError) as info:
        TrainConfig(**kwargs)
    assert info.value.parameter == parameter


def _raises(parameter, call, *args, **kwargs):
    with pytest.raises(ParameterError) as info:
        call(*args, **kwargs)
    assert info.value.parameter == parameter, str(info.value)


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("config", dict(config="shaped")),
        ("V0", dict(V0="x")),
        ("V0", dict(V0=equicorrelated(9, 0.2))),  # more tokens than the width 8
        ("samples", dict(samples=0)),
        ("method", dict(method="gaussian")),
        ("seed", dict(seed=-1)),
        ("device", dict(device="tpu")),
        ("dtype", dict(dtype=torch.float16)),
        ("chunk_size", dict(chunk_size=0)),
        ("memory_budget", dict(memory_budget=0)),
        ("progress", dict(progress="yes")),
    ],
)
def test_simulate_names_its_arguments(parameter, changes):
    args = {**dict(config=SMALL, V0=V0, samples=2), **changes}
    _raises(parameter, simulate, args.pop("config"), args.pop("V0"), args.pop("samples"), **args)


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("config", dict(config=None)),
        ("attention", dict(config=ModelConfig(attention="softmax"))),  # no SDE limit
        ("config", dict(config=shapedtx.preset("post_ln"))),  # several fields at once
        ("V0", dict(V0=np.eye(3) * -1)),
        ("samples", dict(samples=0)),
        ("T", dict(T=-1.0)),
        ("dt", dict(dt=0.0)),
        ("dt", dict(T=1.0, dt=1e-12)),  # too many steps
        ("dt", dict(method=sde.FactoredEuler(0.1), dt=0.2)),
        ("method", dict(method="rk4")),
        ("seed", dict(seed=-1)),
        ("device", dict(device="nowhere")),
        ("dtype", dict(dtype=torch.int64)),
        ("save_every", dict(save_every=0)),
        ("bound", dict(bound=0.0)),
        ("progress", dict(progress=1)),
        ("warn", dict(warn=None)),
    ],
)
def test_sde_solve_names_its_arguments(parameter, changes):
    args = dict(config=ModelConfig(width=8, depth=2, mlp="shaped_relu"), V0=V0, samples=2)
    args.update(changes)
    _raises(parameter, sde.solve, args.pop("config"), args.pop("V0"), args.pop("samples"), **args)


def _dataset(samples: int = 4, tokens: int = 3, times: int = 3):
    V = equicorrelated(tokens, 0.2).expand(samples, times, tokens, tokens).clone()
    t = np.linspace(0.0, 0.25, times)
    return shapedtx.covariance_dataset(V, t, SMALL, source="network", method="exact", seed=0)


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("network", dict(network=_dataset().drop_vars("V"))),
        ("limit", dict(limit=_dataset().rename(token_a="a", token_b="b"))),
        ("limit", dict(limit=_dataset(tokens=2))),
        ("network", dict(network=_dataset(samples=1), limit=_dataset(samples=1))),
        ("quantiles", dict(quantiles=[0.5, 1.5])),
        ("tolerance", dict(tolerance=-1.0)),
    ],
)
def test_compare_names_its_arguments(parameter, changes):
    args = {**dict(network=_dataset(), limit=_dataset()), **changes}
    _raises(parameter, compare, args.pop("network"), args.pop("limit"), **args)


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("width", dict(width=0)),
        ("depth", dict(depth=0)),
        ("tokens", dict(tokens=1)),
        ("tokens", dict(tokens=9)),  # more tokens than the width 8
        ("heads", dict(heads=0)),
        ("heads", dict(heads=3)),  # does not divide the width
        ("mlp", dict(mlp="relu")),
        ("causal", dict(causal=1)),
        ("gammas", dict(gammas=0.3)),
        ("gammas", dict(gammas=[])),
        ("gammas", dict(gammas=[0.1, 1.5])),
        ("tau0s", dict(tau0s=[-1.0])),
        ("spread_target", dict(spread_target=0.0)),
        ("rho0", dict(rho0=1.0)),
        ("samples", dict(samples=8)),
        ("screen_samples", dict(screen_samples=8)),
        ("steps", dict(steps=0)),
        ("depth", dict(depth=10**12)),  # too many SDE steps
        ("max_confirm", dict(max_confirm=0)),
        ("seed", dict(seed=-1)),
        ("max_tokens", dict(max_tokens=1)),
    ],
)
def test_advise_names_its_arguments(parameter, changes):
    args = {**dict(width=8, depth=4, tokens=4, progress=False), **changes}
    _raises(parameter, advise, args.pop("width"), args.pop("depth"), args.pop("tokens"), **args)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from shapedtx.training import load_corpus

    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    return load_corpus(path)


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("model_config", dict(model_config="small")),
        ("config", dict(config={"steps": 2})),
        ("data", dict(data=b"bytes")),
        ("seq_len", dict(config=TrainConfig(seq_len=4096))),  # longer than the data
        ("device", dict(device="tpu")),
        ("dtype", dict(dtype=torch.int32)),
        ("resume", dict(resume=None)),
        ("progress", dict(progress="no")),
        ("compile", dict(compile=1)),
        ("snapshots", dict(snapshots=[5])),  # no out_dir
        ("branch_from", dict(branch_from="/no/such/checkpoint.pt")),
    ],
)
def test_train_names_its_arguments(parameter, changes, corpus):
    args = dict(
        model_config=ModelConfig(width=8, depth=1, causal=True),
        data=corpus,
        config=TrainConfig(steps=10, seq_len=8, batch_size=2),
        progress=False,
    )
    args.update(changes)
    _raises(parameter, shapedtx.train, args.pop("model_config"), args.pop("data"), **args)


def test_load_corpus_names_its_arguments(tmp_path):
    from shapedtx.training import load_corpus

    _raises("path", load_corpus, tmp_path / "missing")
    _raises("suffix", load_corpus, __file__, suffix=".py")
    _raises("val_fraction", load_corpus, __file__, val_fraction=1.0)


# Command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--gamma", "2"], "error: --gamma must be in (0, 1], got 2.0"),
        (["simulate", "--heads", "7"], "error: --heads must divide width"),
        (["simulate", "--width", "3"], "error: --tokens: width must be >= the number of tokens"),
        (["sde", "--dt", "0"], "error: --dt must be a finite number > 0, got 0.0"),
        (["sde", "--attention", "softmax"], "error: --attention='softmax' has no covariance SDE"),
        (["train", "--lr", "-1"], "error: --lr must be in (0, 10], got -1.0"),
        (["train", "--data", "/no/such/file"], "error: --data: data path must be an existing"),
        (["advise", "--width", "8", "--depth", "4", "--tokens", "4", "--max-collapse", "2"],
         "error: --max-collapse must be in (0, 1), got 2.0"),
        (["advise", "--width", "8", "--depth", "4", "--tokens", "9"], "error: --tokens: width"),
    ],
)  # fmt: skip
def test_the_command_line_names_the_option_of_the_parameter(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_option_comes_from_the_attribute_not_the_message(monkeypatch, capsys):
    """A message that does not start with the parameter's name still names the option."""
    import simulations.cli.simulate as command

    def refuse(args):
        raise ParameterError("samples", "too many paths for this machine, got 10**12")

    monkeypatch.setattr(command, "run_setup", refuse)
    assert main(["simulate"]) == 2
    err = capsys.readouterr().err
    assert (
        err == "shapedtx simulate: error: --samples: too many paths for this machine, got 10**12\n"
    )


def test_option_error():
    names = ("width", "max_tokens")
    assert str(option_error(ParameterError("max_tokens", "max_tokens must be >= 2"), names)) == (
        "--max-tokens must be >= 2"
    )
    # renamed options; a parameter that is an option already; a prefix is not the name
    renamed = {"collapse": "--max-collapse"}
    assert str(option_error(ParameterError("collapse", "collapse < 1"), (), renamed)) == (
        "--max-collapse < 1"
    )
    assert str(option_error(ParameterError("--rho0", "--rho0 must be"))) == "--rho0 must be"
    assert str(option_error(ParameterError("width", "widths: x"), names)) == "--width: widths: x"
    # no parameter, or one without an option: the message as it is (never parsed)
    assert str(option_error(ValueError("width must be > 0"), names)) == "width must be > 0"
    assert str(option_error(ParameterError("depth", "depth must be"), names)) == "depth must be"


@pytest.mark.parametrize(
    ("parameter", "changes"),
    [
        ("config", dict(config="shaped")),
        ("name", dict(name=3)),
        ("description", dict(description=None)),
        ("tokens", dict(tokens=1)),
        ("tokens", dict(tokens=9)),  # more tokens than the width 8
        ("rho0", dict(rho0=1.0)),
        ("samples", dict(samples=1)),
        ("baseline_samples", dict(baseline_samples=1)),
        ("device", dict(device="tpu")),
        ("convergence_widths", dict(convergence_widths=(0,))),
        ("convergence_widths", dict(convergence_widths=(3,))),  # T * 3 is not an integer
        ("method", dict(method="gaussian")),
        ("sde_method", dict(sde_method="rk4")),
        ("dt", dict(dt=0.0)),
        ("threshold", dict(threshold=1.0)),
        ("seed", dict(seed=-1)),
        ("seed", dict(seed=2**64 - 1)),  # the SDE's seed + 1 must be a 64-bit seed
        ("dtype", dict(dtype="float16")),
        ("sde", dict(sde=1)),
        ("attention", dict(config=ModelConfig(width=8, depth=2, attention="softmax"))),
    ],
)
def test_experiment_names_its_fields(parameter, changes):
    from simulations import Experiment

    args = {**dict(config=ModelConfig(width=8, depth=2, mlp="shaped_relu")), **changes}
    _raises(parameter, Experiment, **args)
