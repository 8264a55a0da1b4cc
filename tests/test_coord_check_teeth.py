"""``shapedtx.coord_check`` restated exactly on small hand-written models: every field of its
Dataset against a training loop written out (stream, branch and update RMS, the loss, the
batch of each step, the groups of every size), the options (optimisers by name, class and
factory; losses; batches as tensors, tuples and dicts cast to ``dtype``; ``data(size)``),
the refusals of blocks that do not carry a stream, and the figure's layout."""

from __future__ import annotations

import itertools
import math

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

import shapedtx
from shapedtx import ParameterError
from shapedtx.diagnostics import default_group


class _Block(nn.Module):
    """``x + attn(x) + mlp(tanh x)`` (two matrices with biases); ``extra`` adds a third."""

    def __init__(self, n: int, extra: bool = False) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(n, n), nn.Linear(n, n)
        self.extra = nn.Linear(n, n, bias=False) if extra else None

    def forward(self, x):
        out = x + self.attn(x) + self.mlp(torch.tanh(x))
        return out + self.extra(x) if self.extra is not None else out


class _Net(nn.Module):
    def __init__(self, n: int, depth: int = 2, extra: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(n, extra) for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _loss(model: nn.Module, batch) -> torch.Tensor:
    return model(batch).square().mean()


def _batches(n: int, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return [torch.randn(2, 3, n, generator=g, dtype=torch.float64) for _ in range(count)]


def _by_hand(make, size, batches, steps, opt_of, groups=("attention", "mlp"), dtype=torch.float64):
    """The coordinate check written out: stream, branch (k+1, L), update (k+1, L, G), loss."""
    torch.manual_seed(0)
    model = make(size).to(dtype).train()
    opt = opt_of(model)
    stream, branch, loss = [], [], []
    update = [np.full((len(model.blocks), len(groups)), np.nan)]
    for t in range(steps + 1):
        x = batches[t % len(batches)]
        xs = [x]
        for block in model.blocks:
            xs.append(block(xs[-1]))
        stream.append([float(h.detach().square().mean().sqrt()) for h in xs[1:]])
        branch.append(
            [float((b - a).detach().square().mean().sqrt()) for a, b in itertools.pairwise(xs)]
        )
        value = xs[-1].square().mean()
        loss.append(float(value.detach()))
        if t == steps:
            break
        old = [{k: p.detach().clone() for k, p in b.named_parameters()} for b in model.blocks]
        opt.zero_grad()
        value.backward()
        opt.step()
        rows = []
        for block, before in zip(model.blocks, old, strict=True):
            row = []
            for g in groups:
                names = [k for k, p in block.named_parameters() if p.dim() == 2
                         and default_group(k, p) == g]  # fmt: skip
                now = dict(block.named_parameters())
                diff = sum(float((now[k].detach() - before[k]).square().sum()) for k in names)
                count = sum(before[k].numel() for k in names)
                row.append(math.sqrt(diff / count) if count else math.nan)
            rows.append(row)
        update.append(np.array(rows))
    return {
        "stream": np.array(stream), "branch": np.array(branch), "update": np.stack(update),
        "loss": np.array(loss),
    }  # fmt: skip


def test_default_group_words_first_recognised_part_and_vectors():
    """Attention or MLP by the first recognised part of the name (split at ``.`` and ``_``,
    any case; an MLP part may be a word starting with ``mlp``), else "other"; None for
    vectors and scalars."""
    matrix, vector = torch.zeros(2, 2), torch.zeros(2)
    for word in ("attn", "attention", "query", "key", "value", "qkv", "q", "k", "v", "o"):
        assert default_group(f"blk.{word}.weight", matrix) == "attention", word
    for word in ("mlp", "ffn", "fc", "feed", "linear1", "linear2", "up", "down", "gate", "w1",
                 "w2", "w3", "mlpblock"):  # fmt: skip
        assert default_group(f"blk_{word}.weight", matrix) == "mlp", word
    assert default_group("Self_Attn.in_proj_weight", matrix) == "attention"
    assert default_group("mlp.attn.weight", matrix) == "mlp"  # the first recognised part
    assert default_group("attn.mlp.weight", matrix) == "attention"
    assert default_group("embedding.weight", matrix) == "other"
    assert default_group("attn.weight", torch.zeros(2, 2, 2)) == "attention"
    assert default_group("attn.bias", vector) is None
    assert default_group("mlp.scale", torch.tensor(1.0)) is None


@pytest.mark.parametrize(
    "optimizer, build",
    [
        ("sgd", lambda m: torch.optim.SGD(m.parameters(), lr=0.05)),
        ("adam", lambda m: torch.optim.Adam(m.parameters(), lr=0.05)),
        ("adamw", lambda m: torch.optim.AdamW(m.parameters(), lr=0.05)),
        (torch.optim.Adagrad, lambda m: torch.optim.Adagrad(m.parameters(), lr=0.05)),
    ],
)
def test_every_field_against_the_loop_written_out(optimizer, build):
    """Two batches over three steps (batch ``t % 2`` at step ``t``), float64: stream, branch,
    update RMS per group, loss, depth and width equal the loop written out, whichever way
    the optimiser is given; the attributes record the configuration."""
    batches = _batches(4, 2)
    ds = shapedtx.coord_check(
        lambda n: _Net(n), [4], batches, steps=3, lr=0.05, optimizer=optimizer, loss=_loss,
        dtype=torch.float64, seed=0,
    )  # fmt: skip
    want = _by_hand(lambda n: _Net(n), 4, batches, 3, build)
    got = ds.sel(size=4)
    np.testing.assert_allclose(got["stream_rms"].values, want["stream"], rtol=1e-12)
    np.testing.assert_allclose(got["branch_rms"].values, want["branch"], rtol=1e-12)
    np.testing.assert_allclose(got["loss"].values, want["loss"], rtol=1e-6)
    update = got["update_rms"].sel(group=["attention", "mlp"]).values
    assert np.isnan(update[0]).all()
    np.testing.assert_allclose(update[1:], want["update"][1:], rtol=1e-10)
    assert list(ds["group"].values) == ["attention", "mlp"]
    assert int(got["depth"]) == 2 and int(got["width"]) == 4
    assert list(ds["step"].values) == [0, 1, 2, 3] and list(ds["layer"].values) == [1, 2]
    name = optimizer if isinstance(optimizer, str) else "Adagrad"
    assert ds.attrs == {
        "steps": 3, "lr": 0.05, "optimizer": name, "loss": "_loss", "seed": 0,
        "dtype": "float64", "device": "cpu", "size_label": "width", "groups": "default_group",
        "model": "_Net", "blocks": "blocks.0, blocks.1",
    }  # fmt: skip
    assert ds["step"].attrs["long_name"] == "optimiser steps taken"
    assert ds["layer"].attrs["long_name"] == "block (its output)"
    assert ds["size"].attrs["long_name"] == "width"
    assert ds["stream_rms"].attrs["long_name"] == "RMS of the residual stream X_l"
    assert ds["branch_rms"].attrs["long_name"] == "RMS of X_l - X_{l-1} (the branch output)"
    assert ds["update_rms"].attrs["long_name"] == "RMS of W_t - W_{t-1}"


def test_depth_sweep_pads_layers_and_groups_a_size_lacks():
    """Sizes keep their order; layers beyond a size's depth and groups a size's blocks lack
    are NaN; groups in order of first appearance over the sizes; ``data(size)`` is called
    with each size; a factory optimiser and a custom group rule are named in the attrs."""
    seen: list[int] = []

    def data(depth):
        seen.append(depth)
        return _batches(4, 1)

    def make(depth):
        return _Net(4, depth, extra=depth == 3)

    def groups(name, p):
        return default_group(name, p) if p.dim() == 2 else None

    def sgd(model, lr):
        return torch.optim.SGD(model.parameters(), lr=lr)

    ds = shapedtx.coord_check(make, [3, 1], data, steps=1, lr=0.1, optimizer=sgd, loss=_loss,
                              groups=groups, size_label="depth")  # fmt: skip
    assert seen == [3, 1] and list(ds["size"].values) == [3, 1]
    assert list(ds["depth"].values) == [3, 1] and list(ds["group"].values) == [
        "attention", "mlp", "other"]  # fmt: skip
    assert np.isnan(ds["stream_rms"].sel(size=1, layer=[2, 3])).all()
    assert np.isfinite(ds["stream_rms"].sel(size=1, layer=1)).all()
    assert np.isnan(ds["update_rms"].sel(size=1, group="other")).all()
    assert np.isfinite(ds["update_rms"].sel(size=3, step=1)).all()
    assert np.isfinite(ds["update_rms"].sel(size=1, step=1, layer=1, group="mlp"))
    assert (
        ds.attrs["optimizer"] == "test_depth_sweep_pads_layers_and_groups_a_size_lacks.<locals>.sgd"
    )
    assert ds.attrs["groups"].endswith("groups") and ds.attrs["blocks"] == "blocks.0"
    assert ds.attrs["size_label"] == "depth" and ds.attrs["dtype"] == "float32"
    # the same seed before each size: the size-1 model is the first block of a fresh seed
    torch.manual_seed(0)
    first = _Net(4, 1)
    x = _batches(4, 1)[0].float()
    assert float(ds["stream_rms"].sel(size=1, step=0, layer=1)) == pytest.approx(
        float(first.blocks[0](x).square().mean().sqrt()), rel=1e-6
    )


class _Pair(nn.Module):
    """Takes ``(x, ids)`` or ``{"x": x, "ids": ids}``; checks the casts."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(n)])

    def forward(self, x, ids):
        assert x.dtype == torch.float64 and ids.dtype == torch.long
        return self.blocks[0](x + ids[..., None])


def test_tuple_and_dict_batches_are_cast_floats_only():
    x, ids = torch.randn(2, 3, 4), torch.randint(0, 3, (2, 3))
    for batch, loss in (
        ((x, ids), lambda m, b: m(*b).square().mean()),
        ([x, ids], lambda m, b: m(*b).square().mean()),
        ({"x": x, "ids": ids}, lambda m, b: m(**b).square().mean()),
    ):
        ds = shapedtx.coord_check(_Pair, [4], [batch], steps=1, loss=loss, dtype=torch.float64)
        assert np.isfinite(ds["stream_rms"]).all() and ds.attrs["loss"].endswith("<lambda>")


class _LM(nn.Module):
    """Token ids (B, m) -> logits (B, m, 5), returned as a tensor, a tuple or ``.logits``."""

    def __init__(self, n: int, how: str) -> None:
        super().__init__()
        self.embed, self.blocks, self.out = nn.Embedding(5, n), nn.ModuleList([_Block(n)]), (
            nn.Linear(n, 5))  # fmt: skip
        self.how = how

    def forward(self, ids):
        logits = self.out(self.blocks[0](self.embed(ids)))
        if self.how == "tuple":
            return logits, None
        if self.how == "logits":
            return type("Out", (), {"logits": logits})()
        return logits if self.how == "tensor" else logits[0]


@pytest.mark.parametrize("how", ["tensor", "tuple", "logits"])
def test_the_language_model_loss_of_each_output_kind(how):
    """``loss=None``: the next-token cross-entropy of ``model(batch[:, :-1])`` against
    ``batch[:, 1:]``, from a tensor, a tuple or ``.logits``; 2-d logits are refused naming
    ``loss``."""
    batch = torch.randint(0, 5, (2, 6), generator=torch.Generator().manual_seed(1))
    ds = shapedtx.coord_check(lambda n: _LM(n, how), [4], batch, steps=1, lr=0.1)
    torch.manual_seed(0)
    model = _LM(4, "tensor")
    want = nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
    assert float(ds["loss"][0, 0]) == pytest.approx(float(want), rel=1e-6)
    assert ds.attrs["loss"] == "next-token cross-entropy"
    with pytest.raises(ParameterError, match="logits") as err:
        shapedtx.coord_check(lambda n: _LM(n, "flat"), [4], batch, steps=1)
    assert err.value.parameter == "loss"


class _Odd(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.inner, self.how = nn.Linear(4, 4), how

    def forward(self, *args):
        x = args[-1]
        if self.how == "output":
            return {"not": "a tensor"}
        if self.how == "shape":
            return self.inner(x)[..., :2]
        return x + self.inner(x)


def test_blocks_that_do_not_carry_a_stream_are_refused():
    """A block whose output or input is not a tensor, or that changes the stream's shape, or
    that runs twice in a forward pass, is refused naming ``blocks``."""
    x = torch.randn(2, 3, 4)

    class Net(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.blocks = nn.ModuleList([_Odd(how)])
            self.how = how

        def forward(self, x):
            if self.how == "input":
                return self.blocks[0]("a tag first", x)
            y = self.blocks[0](x)
            return self.blocks[0](y) if self.how == "twice" else y

    for how, match in (("output", "output of block"), ("input", "input of block"),
                       ("shape", "keep the residual"), ("twice", "once")):  # fmt: skip
        with pytest.raises(ParameterError, match=match) as err:
            shapedtx.coord_check(lambda n, h=how: Net(h), [4], x, steps=1, loss=lambda m, b: (
                m(b).sum() if not isinstance(m(b), dict) else torch.zeros(())))  # fmt: skip
        assert err.value.parameter == "blocks", how


def test_an_optimizer_factory_must_return_an_optimizer():
    with pytest.raises(ParameterError, match=r"must return a torch\.optim\.Optimizer") as err:
        shapedtx.coord_check(lambda n: _Net(n), [4], _batches(4, 1), steps=1, loss=_loss,
                             optimizer=lambda model, lr: "sgd")  # fmt: skip
    assert err.value.parameter == "optimizer"


def test_figure_panels_lines_colours_and_labels():
    """Stream, branch, then one update panel per group; four panels or fewer in one row, more
    in rows of three (4.2 x 3.4 inches each, spare axes hidden); one line per step where
    finite (no update line at step 0), coloured viridis 0..0.9; each value the mean over
    the blocks (NaN layers skipped) or one block; the legend on the first panel."""
    ds = shapedtx.coord_check(lambda d: _Net(4, d, extra=d == 3), [1, 3], _batches(4, 1),
                              steps=2, lr=0.1, loss=_loss, size_label="depth")  # fmt: skip
    fig = shapedtx.plot_coord_check(ds)  # 2 + 3 groups = 5 panels: rows of three
    np.testing.assert_allclose(fig.get_size_inches(), [4.2 * 3, 3.4 * 2])
    axes = fig.axes
    assert [ax.get_visible() for ax in axes] == [True] * 5 + [False]
    titles = [ax.get_title() for ax in axes[:5]]
    assert titles == [
        "stream rms (mean over blocks)", "branch rms (mean over blocks)",
        "update rms: attention (mean over blocks)", "update rms: mlp (mean over blocks)",
        "update rms: other (mean over blocks)",
    ]  # fmt: skip
    viridis = matplotlib.colormaps["viridis"]
    stream = axes[0].get_lines()
    assert [line.get_label() for line in stream] == ["step 0", "step 1", "step 2"]
    assert {
        (line.get_marker(), line.get_linestyle(), line.get_markersize()) for line in stream
    } == {("o", "-", 3)}
    for line, c in zip(stream, np.linspace(0.0, 0.9, 3), strict=True):
        np.testing.assert_allclose(line.get_color(), viridis(c))
    mean = ds["stream_rms"].mean("layer")  # size 1: its one layer
    for step, line in enumerate(stream):
        np.testing.assert_allclose(line.get_ydata(), mean.sel(step=step).values)
        np.testing.assert_array_equal(line.get_xdata(), [1, 3])
    assert [line.get_label() for line in axes[2].get_lines()] == ["step 1", "step 2"]
    (only,) = axes[4].get_lines()[:1]  # "other": size 1 lacks it, size 3 has it
    assert np.isnan(only.get_ydata()[0]) and np.isfinite(only.get_ydata()[1])
    for ax in axes[:5]:
        assert ax.get_xlabel() == "depth" and ax.get_ylabel() == "RMS"
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "3"]
    assert axes[0].get_legend() is not None and axes[1].get_legend() is None
    one = shapedtx.plot_coord_check(ds, layer=2)
    assert one.axes[0].get_title() == "stream rms (block 2)"
    (line0,) = one.axes[0].get_lines()[:1]
    np.testing.assert_allclose(line0.get_ydata(), ds["stream_rms"].sel(layer=2, step=0).values)
    small = shapedtx.plot_coord_check(ds.sel(group=["mlp", "other"]))  # four panels: one row
    np.testing.assert_allclose(small.get_size_inches(), [4.2 * 4, 3.4])
    for bad in (True, 0):
        with pytest.raises(ParameterError, match="layer must be None") as err:
            shapedtx.plot_coord_check(ds, layer=bad)
        assert err.value.parameter == "layer"
    with pytest.raises(ParameterError, match="missing stream_rms, branch_rms") as err:
        shapedtx.plot_coord_check(ds.drop_vars(["stream_rms", "branch_rms"]))
    assert err.value.parameter == "ds"


def test_the_documented_defaults():
    """Three AdamW steps at lr 1e-3, seed 0, float32 on the CPU, sizes called "width", the
    default groups: the same Dataset as with every default written out."""
    batches = _batches(4, 1)
    ds = shapedtx.coord_check(lambda n: _Net(n), [4], batches, loss=_loss)
    assert ds.sizes["step"] == 4 and ds.attrs["steps"] == 3 and ds.attrs["lr"] == 1e-3
    assert ds.attrs["optimizer"] == "adamw" and ds.attrs["seed"] == 0
    assert ds.attrs["dtype"] == "float32" and ds.attrs["device"] == "cpu"
    assert ds.attrs["size_label"] == "width" and ds.attrs["groups"] == "default_group"
    want = _by_hand(
        lambda n: _Net(n).float(), 4, [b.float() for b in batches], 3,
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), dtype=torch.float32,
    )  # fmt: skip
    np.testing.assert_allclose(ds["stream_rms"].sel(size=4).values, want["stream"], rtol=1e-5)
    np.testing.assert_allclose(
        ds["update_rms"].sel(size=4, group=["attention", "mlp"]).values[1:],
        want["update"][1:], rtol=1e-4,
    )  # fmt: skip
