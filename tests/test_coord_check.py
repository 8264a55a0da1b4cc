"""shapedtx.coord_check: the recorded sizes against the models' own hidden states, computed
independently (the library's hidden-state methods, nn.TransformerEncoder's layers run by hand,
transformers' output_hidden_states), the update RMS against parameter differences taken by
hand, and every bad argument refused with a ParameterError naming it before any model is
built."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import shapedtx
from shapedtx import ParameterError
from shapedtx.training.model import LanguageModel

STEPS = 2
LR = 1e-2


def rms(x: Tensor) -> float:
    """sqrt(mean(x^2)) over every entry, in float64."""
    return float(x.double().square().mean().sqrt())


def hand_group(name: str, p: Tensor) -> str | None:
    """Groups by the first part of the name, written out per model family (not default_group)."""
    if p.dim() < 2:
        return None
    first = name.split(".")[0]
    table = {
        "attention": "attention",
        "mlp": "mlp",
        "attn": "attention",
        "self_attn": "attention",
        "linear1": "mlp",
        "linear2": "mlp",
    }
    return table[first]


def replicate(
    make: Callable[[int], nn.Module],
    size: int,
    batches: list[Any],
    blocks_of: Callable[[nn.Module], list[nn.Module]],
    hidden: Callable[[nn.Module, Any], list[Tensor]],
    loss: Callable[[nn.Module, Any], Tensor],
    optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    steps: int = STEPS,
) -> dict[str, np.ndarray]:
    """The coordinate check written out: train by hand, and at every step take the hidden
    states ``hidden(model, batch)`` (the L + 1 streams, input first) and the parameter
    differences of every block. Returns stream, branch (k+1, L) and update (k+1, L, G) with
    the groups attention, mlp."""
    torch.manual_seed(0)
    model = make(size).train()
    opt = optimizer(model)
    groups = ["attention", "mlp"]
    stream, branch, update = [], [], [np.full((len(blocks_of(model)), 2), np.nan)]
    for t in range(steps + 1):
        batch = batches[t % len(batches)]
        with torch.no_grad():
            h = hidden(model, batch)
        stream.append([rms(x) for x in h[1:]])
        branch.append([rms(b - a) for a, b in itertools.pairwise(h)])
        if t == steps:
            break
        before = [
            {n: p.detach().clone() for n, p in block.named_parameters()}
            for block in blocks_of(model)
        ]
        opt.zero_grad()
        loss(model, batch).backward()
        opt.step()
        rows = []
        for block, old in zip(blocks_of(model), before, strict=True):
            sums, counts = [0.0, 0.0], [0, 0]
            for n, p in block.named_parameters():
                group = hand_group(n, p)
                if group is None:
                    continue
                g = groups.index(group)
                sums[g] += float((p.detach().double() - old[n].double()).square().sum())
                counts[g] += p.numel()
            rows.append([math.sqrt(s / c) for s, c in zip(sums, counts, strict=True)])
        update.append(np.array(rows))
    return {"stream": np.array(stream), "branch": np.array(branch), "update": np.stack(update)}


def lm_batches(count: int = 3, batch: int = 3, tokens: int = 9) -> list[Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (batch, tokens), generator=g) for _ in range(count)]


def lm_loss(model: nn.Module, batch: Tensor) -> Tensor:
    out = model(batch[:, :-1])
    logits = getattr(out, "logits", out)
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def check_against(ds: Any, size: int, want: dict[str, np.ndarray], layers: int) -> None:
    got = ds.sel(size=size)
    np.testing.assert_allclose(
        got["stream_rms"].values[:, :layers], want["stream"][:, :layers], rtol=1e-5
    )
    np.testing.assert_allclose(
        got["branch_rms"].values[:, :layers], want["branch"][:, :layers], rtol=1e-4, atol=1e-7
    )
    update = got["update_rms"].sel(group=["attention", "mlp"]).values
    assert np.isnan(update[0]).all()
    np.testing.assert_allclose(update[1:], want["update"][1:], rtol=1e-4)


def make_lm(width: int) -> LanguageModel:
    return LanguageModel(shapedtx.preset("shaped", width=width, depth=3, causal=True), 8)


def test_library_language_model_matches_its_hidden_states():
    batches = lm_batches()
    ds = shapedtx.coord_check(make_lm, [8, 16], batches, steps=STEPS, lr=LR)
    assert ds["stream_rms"].dims == ("size", "step", "layer")
    assert list(ds["size"].values) == [8, 16] and list(ds["step"].values) == [0, 1, 2]
    assert list(ds["layer"].values) == [1, 2, 3] and list(ds["width"].values) == [8, 16]
    assert ds.attrs["steps"] == STEPS and ds.attrs["optimizer"] == "adamw"
    assert ds.attrs["blocks"] == "body.blocks.0, body.blocks.1, body.blocks.2"
    for size in (8, 16):
        want = replicate(
            make_lm, size, batches, lambda m: list(m.body.blocks),
            lambda m, b: m.hidden_states(b[:, :-1]), lm_loss, adamw,
        )  # fmt: skip
        check_against(ds, size, want, 3)
    # AdamW's first update moves every entry by lr (sign of the gradient): RMS = lr
    np.testing.assert_allclose(ds["update_rms"].sel(step=1).values, LR, rtol=1e-3)


def test_library_transformer_with_a_loss_and_inputs_per_width():
    def make(width: int) -> shapedtx.Transformer:
        return shapedtx.Transformer(shapedtx.preset("pre_ln", width=width, depth=2))

    def data(width: int) -> list[Tensor]:
        g = torch.Generator().manual_seed(width)
        return [torch.randn(2, 4, width, generator=g) for _ in range(2)]

    def loss(model: nn.Module, x: Tensor) -> Tensor:
        return model(x).square().mean()

    ds = shapedtx.coord_check(make, [8, 16], data, loss=loss, steps=STEPS, lr=LR, seed=0)
    assert ds.attrs["loss"].endswith("loss")
    for size in (8, 16):
        want = replicate(
            make, size, data(size), lambda m: list(m.blocks),
            lambda m, x: m(x, return_hidden=True)[1], loss, adamw,
        )  # fmt: skip
        check_against(ds, size, want, 2)


def make_encoder(width: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_torch_transformer_encoder_matches_its_layers_run_by_hand():
    def data(width: int) -> Tensor:
        return torch.randn(2, 5, width, generator=torch.Generator().manual_seed(width))

    def loss(model: nn.Module, x: Tensor) -> Tensor:
        return model(x).square().mean()

    def by_hand(model: nn.TransformerEncoder, x: Tensor) -> list[Tensor]:
        hidden = [x]
        for layer in model.layers:
            hidden.append(layer(hidden[-1]))
        return hidden

    def sgd(model: nn.Module, lr: float = LR) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    ds = shapedtx.coord_check(
        make_encoder, [8, 16], data, loss=loss, optimizer=sgd, steps=STEPS, lr=LR
    )
    assert ds.attrs["blocks"] == "layers.0, layers.1"
    for size in (8, 16):
        want = replicate(
            make_encoder, size, [data(size)], lambda m: list(m.layers), by_hand, loss, sgd
        )
        check_against(ds, size, want, 2)


def test_transformers_gpt2_matches_output_hidden_states():
    transformers = pytest.importorskip("transformers")

    def make(width: int) -> nn.Module:
        config = transformers.GPT2Config(
            vocab_size=256, n_positions=16, n_embd=width, n_layer=3, n_head=2,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)

    def hidden(model: nn.Module, batch: Tensor) -> list[Tensor]:
        return list(model(batch[:, :-1], output_hidden_states=True).hidden_states)

    batches = lm_batches()
    ds = shapedtx.coord_check(make, [8, 16], batches, steps=STEPS, lr=LR)
    assert ds.attrs["blocks"] == "transformer.h.0, transformer.h.1, transformer.h.2"
    for size in (8, 16):
        want = replicate(
            make, size, batches, lambda m: list(m.transformer.h), hidden, lm_loss, adamw
        )
        # hidden_states[L] is ln_f of the last block's output: compare blocks 1..L-1
        check_against(ds, size, want, 2)


def test_depth_sweep_pads_layers_and_the_figure_has_a_panel_per_quantity():
    def make(depth: int) -> LanguageModel:
        return LanguageModel(shapedtx.preset("shaped", width=8, depth=depth, causal=True), 8)

    ds = shapedtx.coord_check(
        make, [1, 3], lm_batches(1), steps=1, size_label="depth", optimizer="sgd"
    )
    assert list(ds["depth"].values) == [1, 3] and ds.sizes["layer"] == 3
    assert np.isnan(ds["stream_rms"].sel(size=1, layer=[2, 3])).all()
    assert np.isfinite(ds["stream_rms"].sel(size=3)).all()
    assert ds["size"].attrs["long_name"] == "depth"
    fig = shapedtx.plot_coord_check(ds)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == 2 + ds.sizes["group"]
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    assert fig.axes[0].get_xlabel() == "depth"
    assert len(fig.axes[0].get_lines()) == 2  # one line per step
    shapedtx.plot_coord_check(ds, layer=1)
    with pytest.raises(ParameterError, match="layer") as err:
        shapedtx.plot_coord_check(ds, layer=4)
    assert err.value.parameter == "layer"
    with pytest.raises(ParameterError, match="ds"):
        shapedtx.plot_coord_check(ds.drop_vars("update_rms"))


def test_hooks_are_removed_and_parameters_of_a_custom_grouping():
    built: list[nn.Module] = []

    def make(width: int) -> nn.Module:
        built.append(make_lm(width))
        return built[-1]

    ds = shapedtx.coord_check(
        make, [8], lm_batches(1), steps=1, groups=lambda name, p: name.split(".")[0]
    )
    assert set(ds["group"].values) == {"attention", "mlp"}
    for block in built[0].body.blocks:
        assert not block._forward_hooks and not block._forward_pre_hooks


GOOD: dict[str, Any] = {"sizes": [8], "steps": 1}


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"make_model": None}, "make_model"),
        ({"make_model": nn.Linear(2, 2)}, "make_model"),
        ({"sizes": []}, "sizes"),
        ({"sizes": [8, 0]}, "sizes"),
        ({"sizes": [8, 8]}, "sizes"),
        ({"sizes": "8"}, "sizes"),
        ({"sizes": [8.0]}, "sizes"),
        ({"sizes": [True]}, "sizes"),
        ({"data": []}, "data"),
        ({"data": torch.zeros(2, 5)}, "data"),
        ({"data": torch.zeros(2, 1, dtype=torch.long)}, "data"),
        ({"data": torch.zeros(5, dtype=torch.long)}, "data"),
        ({"data": torch.full((2, 5), -1)}, "data"),
        ({"data": [torch.zeros(2, 5, dtype=torch.long), "x"]}, "data"),
        ({"data": lambda size: []}, "data"),
        ({"steps": 0}, "steps"),
        ({"steps": 1.5}, "steps"),
        ({"steps": 10**6}, "steps"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"lr": "1e-3"}, "lr"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"loss": "mse"}, "loss"),
        ({"groups": {"attention": "attn"}}, "groups"),
        ({"size_label": ""}, "size_label"),
        ({"device": "tpu"}, "device"),
        ({"dtype": torch.float16}, "dtype"),
        ({"seed": -1}, "seed"),
        ({"blocks": 5}, "blocks"),
    ],
)
def test_bad_arguments_are_refused_before_any_model_is_built(kwargs, parameter):
    built: list[int] = []

    def make(width: int) -> nn.Module:
        built.append(width)
        return make_lm(width)

    args = {"make_model": make, "data": lm_batches(1)[0], **GOOD, **kwargs}
    make_model, sizes, data = args.pop("make_model"), args.pop("sizes"), args.pop("data")
    with pytest.raises(ValueError, match=parameter) as err:
        shapedtx.coord_check(make_model, sizes, data, **args)
    assert isinstance(err.value, ParameterError) and err.value.parameter == parameter
    assert not built


@pytest.mark.parametrize(
    ("make", "parameter"),
    [(lambda width: "model", "make_model"), (lambda width: nn.Linear(width, width), "blocks")],
)
def test_bad_models_are_refused_naming_the_parameter(make, parameter):
    with pytest.raises(ParameterError) as err:
        shapedtx.coord_check(make, [8], lm_batches(1)[0], steps=1)
    assert err.value.parameter == parameter


def test_blocks_given_as_a_module_list_or_as_a_function_of_the_model():
    batch = lm_batches(1)[0]
    found = shapedtx.coord_check(make_lm, [8], batch, steps=1, optimizer=torch.optim.SGD)
    for blocks in ("body.blocks", lambda model: model.body.blocks):
        ds = shapedtx.coord_check(make_lm, [8], batch, steps=1, optimizer=torch.optim.SGD,
                                  blocks=blocks)  # fmt: skip
        np.testing.assert_array_equal(ds["stream_rms"].values, found["stream_rms"].values)
    one = shapedtx.coord_check(
        make_lm, [8], batch, steps=1, optimizer=torch.optim.SGD,
        blocks=lambda model: [model.body.blocks[1]],
    )  # fmt: skip
    assert one.attrs["blocks"] == "body.blocks.1"
    np.testing.assert_allclose(
        one["stream_rms"].sel(layer=1).values, found["stream_rms"].sel(layer=2).values
    )
