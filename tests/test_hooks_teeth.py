"""The instruments' shared machinery (``shapedtx.diagnostics.hooks`` and ``.updates``) stated
exactly: where :func:`find_blocks` looks and what it refuses, the residual stream of each
kind of block input and output, :class:`BlockHooks`' first calls and counts, :func:`run_once`'s
modes, gradients and errors, :func:`record_streams`' layers and refusals, and
:class:`UpdateMeter`'s groups, references and both measures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from shapedtx import ParameterError
from shapedtx.diagnostics import (
    BlockHooks,
    UpdateMeter,
    find_blocks,
    matrix_name,
    record_streams,
    relative_update,
    run_once,
)
from shapedtx.diagnostics.hooks import call_model, residual_stream


class _Add(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return x + self.lin(x)


def _holder(**children: nn.Module) -> nn.Module:
    m = nn.Module()
    for name, child in children.items():
        m.add_module(name, child)
    return m


# ---------------------------------------------------------------- find_blocks


def test_find_blocks_looks_in_order_and_skips_empty_or_other_containers():
    a, b = nn.ModuleList([_Add(), _Add()]), nn.ModuleList([_Add()])
    assert [n for n, _ in find_blocks(_holder(blocks=a, layers=b))] == ["blocks.0", "blocks.1"]
    assert [n for n, _ in find_blocks(_holder(blocks=nn.ModuleList(), layers=b))] == ["layers.0"]
    assert [n for n, _ in find_blocks(_holder(blocks=_Add(), layers=b))] == ["layers.0"]
    body = _holder(blocks=nn.Sequential(_Add(), _Add()))
    assert [n for n, _ in find_blocks(_holder(body=body))] == ["body.blocks.0", "body.blocks.1"]
    gpt = _holder(transformer=_holder(h=nn.ModuleList([_Add()])), h=nn.ModuleList([_Add()]))
    assert [n for n, _ in find_blocks(gpt)] == ["transformer.h.0"]
    llama = _holder(model=_holder(layers=nn.ModuleList([_Add()])), layers=b)
    assert [n for n, _ in find_blocks(llama)] == ["model.layers.0"]
    layer = nn.TransformerEncoderLayer(4, 2, 8, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    assert [n for n, _ in find_blocks(_holder(inner=_holder(enc=enc)))] == [
        "inner.enc.layers.0", "inner.enc.layers.1"]  # fmt: skip


def test_find_blocks_refusals_name_blocks_or_model():
    layer = nn.TransformerEncoderLayer(4, 2, 8, batch_first=True)
    two = _holder(
        a=nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
        b=nn.TransformerEncoder(layer, 1, enable_nested_tensor=False),
    )
    with pytest.raises(ParameterError, match="several torch Transformer stacks \\(a, b\\)") as e:
        find_blocks(two)
    assert e.value.parameter == "blocks" and "blocks='a.layers'" in str(e.value)
    with pytest.raises(ParameterError, match="no residual blocks found in Linear") as e:
        find_blocks(nn.Linear(2, 2))
    assert e.value.parameter == "blocks"
    with pytest.raises(ParameterError, match=r"model must be a torch\.nn\.Module") as e:
        find_blocks("model")  # type: ignore[arg-type]
    assert e.value.parameter == "model"
    model = _holder(blocks=nn.ModuleList([_Add(), _Add()]))
    other = _Add()
    for bad, match in [
        ("nothing", "no submodule named 'nothing'"),
        (other, "must be a list of modules"),
        (3, "must be a list of modules"),
        ([], "at least one block"),
        (["blocks.0", "blocks.0"], "must not repeat"),
        ([other], "blocks\\[0\\] is not a submodule"),
        (["blocks.0", "nope"], "blocks\\[1\\]: model has no submodule named 'nope'"),
    ]:
        with pytest.raises(ParameterError, match=match) as e:
            find_blocks(model, bad)
        assert e.value.parameter == "blocks", bad
    given = find_blocks(model, ["blocks.1", model.blocks[0]])
    assert [n for n, _ in given] == ["blocks.1", "blocks.0"] and given[1][1] is model.blocks[0]
    assert [n for n, _ in find_blocks(model, "blocks")] == ["blocks.0", "blocks.1"]
    assert [n for n, _ in find_blocks(model, model.blocks)] == ["blocks.0", "blocks.1"]


def test_residual_stream_and_call_model():
    x = torch.zeros(1)
    assert residual_stream(x) is x
    assert residual_stream((x, 1)) is x and residual_stream([x]) is x
    assert residual_stream(()) is None and residual_stream((1, x)) is None
    assert residual_stream({"a": 1, "b": x}) is x and residual_stream({"a": 1}) is None
    assert residual_stream(3) is None
    seen = []

    class Echo(nn.Module):
        def forward(self, *args, **kwargs):
            seen.append((args, kwargs))

    echo = Echo()
    call_model(echo, {"a": 1})
    call_model(echo, (1, 2))
    call_model(echo, [3])
    call_model(echo, x)
    assert seen == [((), {"a": 1}), ((1, 2), {}), ((3,), {}), ((x,), {})]


# ---------------------------------------------------------------- BlockHooks and run_once


class _Twice(nn.Module):
    """Runs block 0 on the input, then block 1 twice."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Add(), _Add()])

    def forward(self, x):
        x = self.blocks[0](x)
        return self.blocks[1](self.blocks[1](x))


def test_block_hooks_first_calls_counts_and_check():
    """``on_input`` at each block's first call (the first block only unless ``all_inputs``),
    ``on_output`` at its first call; :meth:`check` names a block that ran twice and resets
    the counts; ``attach``'s handles and the hooks are removed on leaving."""
    model = _Twice()
    blocks = find_blocks(model)
    x = torch.randn(2, 3, 4)
    for all_inputs, expected in ((False, [0]), (True, [0, 1])):
        inputs, outputs, extra = [], [], []

        def attach(extra=extra):
            return [model.register_forward_hook(lambda *a: extra.append(1))]

        hooks = BlockHooks(
            blocks, on_input=lambda i, s, raw, inputs=inputs: inputs.append((i, s, raw)),
            on_output=lambda i, out, outputs=outputs: outputs.append((i, out)),
            all_inputs=all_inputs, attach=attach,
        )  # fmt: skip
        with hooks:
            model(x)
        y0 = model.blocks[0](x)
        y1 = model.blocks[1](y0)
        assert [i for i, _, _ in inputs] == expected
        assert inputs[0][1] is x and inputs[0][2] is x
        if all_inputs:
            assert torch.equal(inputs[1][1], y0)
        assert [i for i, _ in outputs] == [0, 1] and torch.equal(outputs[1][1], y1)
        assert hooks.calls == [1, 2] and extra == [1]
        with pytest.raises(
            ParameterError, match=r"block 'blocks\.1' ran 2 times in it; the me"
        ) as e:
            hooks.check("me", "in it")
        assert e.value.parameter == "blocks" and hooks.calls == [0, 0]
        model(x)
        assert hooks.calls == [0, 0] and extra == [1]  # no hook left
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_block_hooks_read_keyword_inputs():
    """A block called with keywords: the stream is ``hidden_states`` if given, else the first
    tensor of the keywords."""

    class KW(nn.Module):
        def forward(self, hidden_states=None, other=None):
            return hidden_states if hidden_states is not None else other

    class Net(nn.Module):
        def __init__(self, key):
            super().__init__()
            self.blocks, self.key = nn.ModuleList([KW()]), key

        def forward(self, x):
            return self.blocks[0](**{self.key: x})

    x = torch.randn(2, 3, 4)
    for key in ("hidden_states", "other"):
        net = Net(key)
        got: list = []
        run_once(net, x, find_blocks(net), on_input=lambda i, s, raw, got=got: got.append((s, raw)))
        assert got[0][0] is x and got[0][1] == {key: x}


def test_a_block_that_adds_an_attach_failure_removes_the_hooks():
    model = _Twice()

    def attach():
        raise RuntimeError("attach failed")

    hooks = BlockHooks(find_blocks(model), on_output=lambda i, o: None, attach=attach)
    with pytest.raises(RuntimeError, match="attach failed"), hooks:
        pass
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


class _Probe(nn.Module):
    """Records its mode and whether gradients are on; fails on request."""

    def __init__(self, error: type[Exception] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Add()])
        self.drop = nn.Dropout(0.5)
        self.error, self.seen = error, []

    def forward(self, x):
        self.seen.append((self.training, self.drop.training, torch.is_grad_enabled()))
        if self.error is not None:
            raise self.error("broken")
        return self.blocks[0](x)


def test_run_once_modes_gradients_errors_and_restored_flags():
    x = torch.randn(2, 3, 4)
    model = _Probe().train()
    model.drop.eval()  # a mixed state, restored module by module
    run_once(model, x, find_blocks(model))
    run_once(model, x, find_blocks(model), eval_mode=False)
    assert model.seen == [(False, False, False), (True, False, False)]
    assert model.training and not model.drop.training and model.blocks[0].training
    for error in (RuntimeError, TypeError):
        broken = _Probe(error).train()
        with pytest.raises(ParameterError, match=f"model\\(inputs\\) failed \\({error.__name__}"):
            run_once(broken, x, find_blocks(broken))
        assert broken.training and broken.drop.training
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in broken.modules())
    other = _Probe(KeyError)
    with pytest.raises(KeyError):
        run_once(other, x, find_blocks(other))
    twice = _Twice()
    with pytest.raises(ParameterError, match="ran 2 times during model\\(inputs\\); the mon") as e:
        run_once(twice, x, find_blocks(twice), who="mon")
    assert e.value.parameter == "blocks"


# ---------------------------------------------------------------- record_streams


def test_record_streams_runs_in_eval_mode_unless_told():
    model = _Probe()
    record_streams(model, torch.randn(2, 3, 4), find_blocks(model))
    record_streams(model, torch.randn(2, 3, 4), find_blocks(model), eval_mode=False)
    assert model.seen == [(False, False, False), (True, True, False)] and model.training


def test_record_streams_keeps_every_layer_and_refuses_bad_streams():
    torch.manual_seed(0)
    model = _holder(blocks=nn.ModuleList([_Add(), _Add()]))
    model.forward = lambda x: model.blocks[1](model.blocks[0](x))  # type: ignore[method-assign]
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    model.double()
    outputs = []
    got = record_streams(model, x, find_blocks(model), keep=lambda t: t * 2,
                         on_output=lambda i, o: outputs.append(i))  # fmt: skip
    y0 = model.blocks[0](x)
    want = [x, y0, model.blocks[1](y0)]
    assert len(got.kept) == 3 and outputs == [0, 1]
    for k, w in zip(got.kept, want, strict=True):
        torch.testing.assert_close(k, 2 * w.detach())
    assert got.shape == (2, 3, 4) and got.dtype == torch.float64

    class Bad(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.blocks, self.how = nn.ModuleList([_Add()]), how

        def forward(self, x):
            y = self.blocks[0](x)
            return y

    cases = [
        (torch.randn(3, 4), "inputs", "shape \\(3, 4\\); the who needs"),
        (torch.randn(2, 1, 4), "inputs", "at least 2 tokens"),
    ]
    for bad_x, parameter, match in cases:
        net = Bad("x")
        with pytest.raises(ParameterError, match=match) as e:
            record_streams(net, bad_x, find_blocks(net), who="who")
        assert e.value.parameter == parameter

    class Shrink(nn.Module):
        def forward(self, x):
            return x[:, :2]

    class NotTensor(nn.Module):
        def forward(self, x):
            return {"no": 1}

    for block, match in ((Shrink(), "has shape \\(2, 2, 4\\), the block input \\(2, 3, 4\\)"),
                         (NotTensor(), "is dict, not a tensor")):  # fmt: skip
        net = _holder(blocks=nn.ModuleList([block]))
        net.forward = lambda x, n=net: n.blocks[0](x)  # type: ignore[method-assign]
        with pytest.raises(ParameterError, match=match) as e:
            record_streams(net, torch.randn(2, 3, 4), find_blocks(net))
        assert e.value.parameter == "blocks"


# ---------------------------------------------------------------- UpdateMeter


def _meter_model(dtype=torch.float32):
    torch.manual_seed(1)
    model = _holder(blocks=nn.ModuleList([
        _holder(a=nn.Linear(3, 2), b=nn.Linear(2, 2, bias=False)),
        _holder(b=nn.Linear(2, 4, bias=False)),
    ])).to(dtype)  # fmt: skip
    return model, find_blocks(model)


def test_update_meter_groups_and_relative_update():
    """Groups in order of first appearance (vectors left out by :func:`matrix_name`); NaN
    before a reference and where a block lacks a group; each cell the relative change of
    its one matrix; the reference moves to the current weights after each call."""
    model, blocks = _meter_model()
    meter = UpdateMeter(blocks, matrix_name)
    assert meter.groups == ["a.weight", "b.weight"] and meter.depth == 2
    assert torch.isnan(meter.relative()).all()  # no reference yet; now remembered
    w_a, w_b0, w_b1 = model.blocks[0].a.weight, model.blocks[0].b.weight, model.blocks[1].b.weight
    olds = [w.detach().clone() for w in (w_a, w_b0, w_b1)]
    with torch.no_grad():
        w_a.mul_(1.5)
        w_b1.add_(0.25)
    out = meter.relative()
    assert out.shape == (2, 2) and out.dtype == torch.float64
    assert float(out[0, 0]) == pytest.approx(0.5, rel=1e-6)
    assert float(out[0, 1]) == 0.0 and math.isnan(float(out[1, 0]))
    assert float(out[1, 1]) == pytest.approx(float(relative_update(w_b1, olds[2])), rel=1e-6)
    assert float(meter.relative()[0, 0]) == 0.0  # measured against the new reference
    kept = meter.previous[0]
    meter.remember()
    assert meter.previous[0] is kept  # copied in place after the first
    assert float(relative_update(torch.tensor([[3.0, 5.0]]), torch.tensor([[3.0, 4.0]]))) == (
        pytest.approx(0.2, rel=1e-12))  # fmt: skip
    shared = UpdateMeter(blocks, lambda name, p: "all" if p.dim() == 2 else None)
    shared.remember()
    with pytest.raises(ValueError, match="one parameter per"):
        shared.relative()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_meter_mean_square_per_group(dtype):
    """``mean_square``: the summed squared change of a cell's parameters over its entries
    (biases too, if the rule keeps them), NaN where a block lacks the group, in float64 if a
    parameter is; refused without a reference; empty without parameters."""
    model, blocks = _meter_model(dtype)
    meter = UpdateMeter(blocks, lambda name, p: name.split(".")[0])
    assert meter.groups == ["a", "b"]
    with pytest.raises(ValueError, match="needs a reference"):
        meter.mean_square()
    meter.remember()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    out = meter.mean_square()
    assert out.shape == (2, 2) and out.dtype == dtype

    def ms(names):
        total = sum(float((dict(model.named_parameters())[n].detach() - before[n]).square().sum())
                    for n in names)  # fmt: skip
        return total / sum(before[n].numel() for n in names)

    expected = [[ms(["blocks.0.a.weight", "blocks.0.a.bias"]), ms(["blocks.0.b.weight"])],
                [math.nan, ms(["blocks.1.b.weight"])]]  # fmt: skip
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    assert float(meter.mean_square()[0, 0]) == 0.0  # the reference moved
    empty = UpdateMeter(blocks, lambda name, p: None)
    assert empty.mean_square().shape == (2, 0) and empty.groups == []
    with pytest.raises(ParameterError, match="must return a group name \\(str\\) or None") as e:
        UpdateMeter(blocks, lambda name, p: 1)
    assert e.value.parameter == "groups"
