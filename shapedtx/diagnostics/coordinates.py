"""Coordinate check in the style of mup: activation and update sizes against width or depth.

:func:`coord_check` builds ``make_model(size)`` for every size of a sweep (widths or depths),
trains each model for ``steps`` optimiser steps on the given batches and records, at steps
``0..steps`` (step ``t``: after ``t`` updates) and for every residual block ``l = 1..L`` found
by :func:`shapedtx.find_blocks` (the library's models, ``transformers`` GPT-2, nanoGPT,
``nn.TransformerEncoder``, timm, Llama-style; else ``blocks=``):

- ``stream_rms``: the RMS over (batch, tokens, features) of the residual stream leaving
  block ``l``, ``sqrt(mean(X_l^2))`` with ``X_l: (B, m, n)``;
- ``branch_rms``: the RMS of what the block adds, ``sqrt(mean((X_l - X_{l-1})^2))`` with
  ``X_{l-1}`` the block's own input (the branch output for a residual block);
- ``update_rms``: per group of the block's parameters (attention / MLP matrices by default),
  the RMS of the last update, ``sqrt(sum ||W_t - W_{t-1}||^2 / number of entries)`` (NaN at
  step 0).

The activations are read by forward hooks during the training forward passes (step ``t < k``)
and one last forward pass at step ``k`` (no gradient), on the device, without a host
synchronisation until the end. In a parametrisation whose sizes are width-independent (muP,
or the shaped Transformer's scalings in depth) the lines of :func:`plot_coord_check` are flat
in the size at every step; a line that grows with the size is a coordinate that blows up.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from .._validation import (
    ParameterError,
    check_choice,
    check_device,
    check_dtype,
    check_int,
    check_positive,
)
from .hooks import BlockHooks, Blocks, NamedBlocks, find_blocks, residual_stream
from .updates import GroupRule, UpdateMeter

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd")
"""Optimisers :func:`coord_check` builds by name (torch defaults except ``lr``):
``torch.optim.AdamW``, ``torch.optim.Adam`` and ``torch.optim.SGD``."""

QUANTITIES: tuple[str, ...] = ("stream_rms", "branch_rms", "update_rms")
"""The sizes :func:`coord_check` records per block, in the order of the figure's panels."""

MAX_STEPS = 100_000
"""The most optimiser steps :func:`coord_check` takes (a coordinate check needs a few)."""

_ATTENTION = {"attn", "attention", "query", "key", "value", "qkv", "q", "k", "v", "o"}
_MLP = {"mlp", "ffn", "fc", "feed", "linear1", "linear2", "up", "down", "gate", "w1", "w2", "w3"}

Batch = Any
OptimizerFactory = Callable[[nn.Module, float], torch.optim.Optimizer]
LossFunction = Callable[[nn.Module, Batch], Tensor]


def default_group(name: str, parameter: Tensor) -> str | None:
    """The group of a block's parameter for ``update_rms``: ``"attention"`` or ``"mlp"`` for a
    matrix (``parameter.dim() >= 2``) whose name (relative to the block, e.g.
    ``"attn.c_attn.weight"``, ``"self_attn.in_proj_weight"``, ``"mlp.layers.mlp_in.weight"``,
    ``"linear1.weight"``) has an attention or MLP word as its first recognised part, else
    ``"other"``; ``None`` (not recorded) for vectors and scalars (biases, norm gains)."""
    if parameter.dim() < 2:
        return None
    for part in re.split(r"[._]", name.lower()):
        if part in _ATTENTION:
            return "attention"
        if part in _MLP or part.startswith("mlp"):
            return "mlp"
    return "other"


def _is_function(obj: Any) -> bool:
    """A callable that is not a module (``nn.Module`` and tensors are data, not functions)."""
    return callable(obj) and not isinstance(obj, (Tensor, nn.Module))


def _is_batch_list(data: Any) -> bool:
    return isinstance(data, list)


def _check_lm_batch(batch: Any, where: str) -> None:
    if not isinstance(batch, Tensor):
        raise ParameterError(
            "data",
            f"{where} must be a tensor of token ids (B, m + 1) for a language model (loss=None), "
            f"got {type(batch).__name__}; pass loss= for a model that is not a language model",
        )
    if batch.dtype.is_floating_point or batch.dtype.is_complex or batch.dtype == torch.bool:
        raise ParameterError(
            "data", f"{where} must hold integer token ids (loss=None), got dtype {batch.dtype}"
        )
    if batch.dim() != 2 or batch.shape[0] < 1 or batch.shape[1] < 2:
        raise ParameterError(
            "data",
            f"{where} must have shape (B, m + 1) with B >= 1 and m + 1 >= 2 (inputs and next "
            f"tokens), got {tuple(batch.shape)}",
        )
    if int(batch.min()) < 0:
        raise ParameterError("data", f"{where} must hold token ids >= 0, got {int(batch.min())}")


def _batches(data: Any, size: int, language_model: bool) -> list[Batch]:
    """The batches of one size: ``data(size)`` if callable, a list as given, else ``[data]``;
    checked (token ids (B, m + 1) for a language model)."""
    where = "data"
    if _is_function(data):
        data = data(size)
        where = f"data({size})"
    batches = list(data) if _is_batch_list(data) else [data]
    if not batches:
        raise ParameterError("data", f"{where} must hold at least one batch, got an empty list")
    if language_model:
        for i, batch in enumerate(batches):
            _check_lm_batch(batch, f"{where}[{i}]" if _is_batch_list(data) else where)
    return batches


def _to(batch: Batch, device: torch.device, dtype: torch.dtype) -> Batch:
    """``batch`` on ``device``, its floating tensors in ``dtype`` (tuples, lists, dicts
    followed)."""
    if isinstance(batch, Tensor):
        cast = dtype if batch.dtype.is_floating_point else None
        return batch.to(device=device, dtype=cast)
    if isinstance(batch, Mapping):
        return {k: _to(v, device, dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device, dtype) for v in batch)
    return batch


def _lm_loss(model: nn.Module, batch: Tensor) -> Tensor:
    """Next-token cross-entropy of ``model(batch[:, :-1])`` (logits ``(B, m, V)``, a tensor or
    an output with ``.logits`` or a tuple starting with them) against ``batch[:, 1:]``."""
    out = model(batch[:, :-1])
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise ParameterError(
            "loss",
            "loss=None needs a language model whose output is logits (B, m, vocab) (or has "
            f".logits), got {type(out).__name__}; pass loss=",
        )
    targets = batch[:, 1:]
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _optimizer(
    optimizer: str | OptimizerFactory, model: nn.Module, lr: float
) -> torch.optim.Optimizer:
    build: Any = optimizer  # a class, a factory or a name
    if isinstance(build, type) and issubclass(build, torch.optim.Optimizer):
        return cast(Any, build)(model.parameters(), lr=lr)  # a subclass taking lr
    if callable(build):
        opt = build(model, lr)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ParameterError(
                "optimizer",
                f"optimizer(model, lr) must return a torch.optim.Optimizer, got "
                f"{type(opt).__name__}",
            )
        return opt
    cls: dict[str, Any] = {
        "adamw": torch.optim.AdamW,
        "adam": torch.optim.Adam,
        "sgd": torch.optim.SGD,
    }
    return cls[build](model.parameters(), lr=lr)


class _Activations:
    """The mean squares of each block's output ``X_l`` and of ``X_l - X_{l-1}`` (its own input)
    in every forward pass run inside it, read through :class:`BlockHooks` and kept as 0-d
    tensors on the stream's device (no host synchronisation). Use as a context manager;
    :meth:`take` returns ``(stream, branch)``, each ``(L,)``, of the last forward pass."""

    def __init__(self, blocks: NamedBlocks) -> None:
        self.blocks = blocks
        depth = len(blocks)
        self.inputs: list[Tensor | None] = [None] * depth
        self.stream: list[Tensor | None] = [None] * depth
        self.branch: list[Tensor | None] = [None] * depth
        self.numel = [1] * depth
        self.width: int | None = None
        self.hooks = BlockHooks(
            blocks, on_input=self._input, on_output=self._output, all_inputs=True
        )

    def _input(self, index: int, x: Tensor | None, raw: Any) -> None:
        self.inputs[index] = x.detach() if x is not None else None

    def _output(self, index: int, output: Any) -> None:
        name = self.blocks[index][0]
        x, x_in = residual_stream(output), self.inputs[index]
        if x is None or x_in is None:
            what = "output" if x is None else "input"
            raise ParameterError(
                "blocks",
                f"the {what} of block {name!r} is not a tensor (or a tuple starting with "
                f"one): the coordinate check records the residual stream, pass blocks= "
                f"that carry it",
            )
        if x.shape != x_in.shape:
            raise ParameterError(
                "blocks",
                f"block {name!r} maps {tuple(x_in.shape)} to {tuple(x.shape)}: blocks "
                f"must keep the residual stream's shape",
            )
        x = x.detach()
        if not x.dtype.is_floating_point or x.element_size() < 4:
            x, x_in = x.float(), x_in.float()
        self.width, self.numel[index] = int(x.shape[-1]), x.numel()
        # norms (one reduction each); squared and divided by the size in take()
        self.stream[index] = torch.linalg.vector_norm(x)
        self.branch[index] = torch.linalg.vector_norm(x - x_in)
        self.inputs[index] = None

    def __enter__(self) -> _Activations:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.__exit__()

    def take(self) -> tuple[Tensor, Tensor]:
        """``(stream, branch)`` mean squares ``(L,)`` of the last forward pass; ParameterError
        if a block did not run exactly once."""
        self.hooks.check("coordinate check", "in one forward pass")
        stream = torch.stack([s for s in self.stream if s is not None])
        branch = torch.stack([b for b in self.branch if b is not None])
        numel = torch.tensor(self.numel, dtype=stream.dtype).to(stream.device, non_blocking=True)
        return stream.square() / numel, branch.square() / numel


def _check_sizes(sizes: Any) -> list[int]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ParameterError(
            "sizes", f"sizes must be a list of integers >= 1 (widths or depths), got {sizes!r}"
        )
    if len(sizes) == 0:
        raise ParameterError("sizes", "sizes must hold at least one integer >= 1, got []")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ParameterError(
                "sizes", f"sizes must hold integers >= 1, got {size!r} in {list(sizes)!r}"
            )
    if len(set(sizes)) != len(sizes):
        raise ParameterError("sizes", f"sizes must not repeat a size, got {list(sizes)!r}")
    return [int(s) for s in sizes]


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def coord_check(
    make_model: Callable[[int], nn.Module],
    sizes: Sequence[int],
    data: Batch | list[Batch] | Callable[[int], Batch | list[Batch]],
    *,
    steps: int = 3,
    lr: float = 1e-3,
    optimizer: str | OptimizerFactory = "adamw",
    loss: LossFunction | None = None,
    blocks: Blocks | Callable[[nn.Module], Blocks] = None,
    groups: GroupRule | None = None,
    size_label: str = "width",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> xr.Dataset:
    """Sizes of the residual stream, the branches and the weight updates over a size sweep.

    For every size: ``torch.manual_seed(seed)``, ``model = make_model(size)`` moved to
    ``device`` and ``dtype`` in training mode, then ``steps`` optimiser steps; at step ``t``
    (after ``t`` updates) the forward pass on batch ``t % len(batches)`` is recorded through
    forward hooks on the model's blocks (the training forward for ``t < steps``, a last
    forward without gradient for ``t = steps``).

    Args:
        make_model: ``size -> nn.Module`` (a width or a depth; the parametrisation to check is
            the model's own, e.g. muP's or the shaped Transformer's).
        sizes: the sizes, distinct integers >= 1 (the ``size`` coordinate, in this order).
        data: one batch (used at every step), a ``list`` of batches (batch ``t % len`` at step
            ``t``), or ``size -> batch or list`` (inputs whose width follows the size). With
            ``loss=None`` a batch is a language-model batch of token ids ``(B, m + 1)`` (bytes
            for the library's ``LanguageModel``): the loss is the next-token cross-entropy of
            ``model(batch[:, :-1])`` (logits ``(B, m, vocab)``, or ``.logits``).
        steps: optimiser steps k, in [1, 100000]; steps 0..k are recorded.
        lr: learning rate > 0 of the optimiser.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"`` (torch defaults but ``lr``), a
            ``torch.optim.Optimizer`` class (built with ``lr``), or
            ``(model, lr) -> torch.optim.Optimizer`` (e.g. per-layer learning rates of muP).
        loss: ``(model, batch) -> scalar tensor`` for a model that is not a language model;
            batches are then passed as given (tensors moved to ``device``, floating ones cast
            to ``dtype``).
        blocks: the residual blocks, as :func:`shapedtx.find_blocks` takes them, or
            ``model -> blocks`` (block names change with the depth); default: found.
        groups: ``(name in the block, parameter) -> group name or None`` for ``update_rms``;
            default :func:`default_group` (attention / MLP / other matrices).
        size_label: what the sizes are (``"width"``, ``"depth"``): the ``size`` coordinate's
            ``long_name`` and the figure's x label.
        device: torch device (default CPU); dtype: torch.float32 or torch.float64.
        seed: integer >= 0, the torch seed before each ``make_model(size)``.

    Returns:
        Dataset with dims ``(size, step, layer)`` (and ``group``): ``stream_rms``,
        ``branch_rms`` ``(size, step, layer)``; ``update_rms(size, step, layer, group)`` (NaN
        at step 0 and where a block lacks a group); ``loss(size, step)`` (the loss of the
        recorded forward pass); ``depth(size)``, ``width(size)`` (the stream's last dim).
        Layers are ``1..L`` (block ``l``'s output); sizes with fewer blocks are NaN beyond
        their depth. ``attrs``: the configuration (``steps``, ``lr``, ``optimizer``,
        ``loss``, ``seed``, ``dtype``, ``device``, ``size_label``, ``groups``, ``model``,
        ``blocks`` of the last size).

    Raises:
        ValueError (:class:`shapedtx.ParameterError`): a bad argument, naming it and what is
            accepted, before any model is built; blocks not found or not carrying a stream.
    """
    if not callable(make_model) or isinstance(make_model, nn.Module):
        raise ParameterError(
            "make_model", f"make_model must be a callable size -> nn.Module, got {make_model!r}"
        )
    size_list = _check_sizes(sizes)
    check_int("steps", steps, 1, MAX_STEPS)
    lr = check_positive("lr", lr)
    if not callable(optimizer):
        check_choice("optimizer", optimizer, OPTIMIZERS)
    if loss is not None and not callable(loss):
        raise ParameterError(
            "loss", f"loss must be None (language model) or (model, batch) -> loss, got {loss!r}"
        )
    if groups is not None and not callable(groups):
        raise ParameterError(
            "groups", f"groups must be None or (name, parameter) -> group name, got {groups!r}"
        )
    if not isinstance(size_label, str) or not size_label.strip():
        raise ParameterError(
            "size_label", f"size_label must be a non-empty string, got {size_label!r}"
        )
    if not (blocks is None or isinstance(blocks, (str, nn.Module, Sequence)) or callable(blocks)):
        raise ParameterError(
            "blocks",
            "blocks must be None (found), block modules or names, a ModuleList, or "
            f"model -> blocks, got {type(blocks).__name__}",
        )
    dev = check_device(device)
    check_dtype(dtype)
    check_int("seed", seed, 0)
    language_model = loss is None
    all_batches = [_batches(data, size, language_model) for size in size_list]
    loss_fn: LossFunction = _lm_loss if loss is None else loss
    rule = default_group if groups is None else groups

    runs = []
    block_names = ""
    model_name = ""
    for size, batches in zip(size_list, all_batches, strict=True):
        torch.manual_seed(seed)
        model = make_model(size)
        if not isinstance(model, nn.Module):
            raise ParameterError(
                "make_model",
                f"make_model({size}) must return a torch.nn.Module, got {type(model).__name__}",
            )
        model = model.to(device=dev, dtype=dtype).train()
        chosen: Any = blocks
        named = find_blocks(model, chosen(model) if _is_function(chosen) else chosen)
        block_names = ", ".join(name for name, _ in named)
        model_name = type(model).__qualname__
        batches = [_to(b, dev, dtype) for b in batches]
        runs.append(_run(model, named, batches, loss_fn, optimizer, lr, rule, steps))
        del model
    return _dataset(
        size_list, runs, steps,
        {
            "steps": steps, "lr": lr, "optimizer": optimizer if isinstance(optimizer, str)
            else _name(optimizer), "loss": "next-token cross-entropy" if loss is None
            else _name(loss), "seed": seed, "dtype": str(dtype).removeprefix("torch."),
            "device": str(dev), "size_label": size_label, "groups": _name(rule),
            "model": model_name, "blocks": block_names,
        },
    )  # fmt: skip


def _run(
    model: nn.Module,
    blocks: NamedBlocks,
    batches: list[Batch],
    loss_fn: LossFunction,
    optimizer: str | OptimizerFactory,
    lr: float,
    rule: GroupRule,
    steps: int,
) -> dict[str, Any]:
    """Train one model, recording every step; returns host arrays ``stream, branch (k+1, L)``,
    ``update (k+1, L, G)``, ``loss (k+1,)``, the group names and the stream width."""
    opt = _optimizer(optimizer, model, lr)
    meter = UpdateMeter(blocks, rule)
    meter.remember()
    streams, branches, updates, losses = [], [], [], []
    with _Activations(blocks) as hooks:
        for t in range(steps + 1):
            batch = batches[t % len(batches)]
            if t < steps:
                opt.zero_grad(set_to_none=True)
                value = loss_fn(model, batch)
                stream, branch = hooks.take()
                value.backward()
                opt.step()
                updates.append(meter.mean_square())
            else:
                with torch.no_grad():
                    value = loss_fn(model, batch)
                stream, branch = hooks.take()
            streams.append(stream)
            branches.append(branch)
            losses.append(value.detach().float())
    update = torch.stack(updates).cpu().double().numpy()  # one synchronisation at the end
    blank = np.full((1, *update.shape[1:]), np.nan)
    return {
        "stream": torch.stack(streams).cpu().double().sqrt().numpy(),
        "branch": torch.stack(branches).cpu().double().sqrt().numpy(),
        "update": np.sqrt(np.concatenate([blank, update])),
        "loss": torch.stack(losses).cpu().double().numpy(),
        "groups": meter.groups,
        "width": hooks.width,
    }


def _dataset(
    sizes: list[int], runs: list[dict[str, Any]], steps: int, attrs: dict[str, Any]
) -> xr.Dataset:
    import xarray as xr

    depth = max(run["stream"].shape[1] for run in runs)
    groups: list[str] = []
    for run in runs:
        groups += [g for g in run["groups"] if g not in groups]
    shape = (len(sizes), steps + 1, depth)
    stream, branch = np.full(shape, np.nan), np.full(shape, np.nan)
    update = np.full((*shape, len(groups)), np.nan)
    for i, run in enumerate(runs):
        layers = run["stream"].shape[1]
        stream[i, :, :layers] = run["stream"]
        branch[i, :, :layers] = run["branch"]
        for j, group in enumerate(run["groups"]):
            update[i, :, :layers, groups.index(group)] = run["update"][:, :, j]
    ds = xr.Dataset(
        {
            "stream_rms": (("size", "step", "layer"), stream),
            "branch_rms": (("size", "step", "layer"), branch),
            "update_rms": (("size", "step", "layer", "group"), update),
            "loss": (("size", "step"), np.stack([run["loss"] for run in runs])),
            "depth": ("size", np.array([run["stream"].shape[1] for run in runs])),
            "width": ("size", np.array([run["width"] for run in runs])),
        },
        coords={
            "size": np.array(sizes, dtype=np.int64),
            "step": np.arange(steps + 1),
            "layer": np.arange(1, depth + 1),
            "group": np.array(groups, dtype=object),
        },
        attrs=attrs,
    )
    ds["size"].attrs["long_name"] = attrs["size_label"]
    ds["step"].attrs["long_name"] = "optimiser steps taken"
    ds["layer"].attrs["long_name"] = "block (its output)"
    ds["stream_rms"].attrs["long_name"] = "RMS of the residual stream X_l"
    ds["branch_rms"].attrs["long_name"] = "RMS of X_l - X_{l-1} (the branch output)"
    ds["update_rms"].attrs["long_name"] = "RMS of W_t - W_{t-1}"
    return ds


def plot_coord_check(ds: xr.Dataset, *, layer: int | None = None) -> Figure:
    """mup's coordinate-check figure: size against RMS on log-log axes, one line per step.

    Panels: ``stream_rms``, ``branch_rms``, then ``update_rms`` once per parameter group
    (steps 1..k; step 0 has no update). Each value is the mean over the blocks (layers beyond
    a size's depth are NaN and skipped), or block ``layer`` alone.

    Args:
        ds: a Dataset of :func:`coord_check`.
        layer: ``None`` (mean over layers) or a block number in ``ds.layer``.

    Returns:
        a ``matplotlib.figure.Figure`` (built without pyplot; ``fig.savefig`` renders it).

    Raises:
        ValueError: ``ds`` lacks the variables of :func:`coord_check`, or a bad ``layer``.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    missing = [q for q in QUANTITIES if q not in getattr(ds, "data_vars", {})]
    if missing:
        raise ParameterError(
            "ds", f"ds must be a Dataset of coord_check (with {', '.join(QUANTITIES)}), "
            f"missing {', '.join(missing)}",
        )  # fmt: skip
    layers = [int(v) for v in ds["layer"].values]
    if layer is not None and (isinstance(layer, bool) or layer not in layers):
        raise ParameterError(
            "layer", f"layer must be None (mean) or one of {layers[0]}..{layers[-1]}, got {layer!r}"
        )
    panels: list[tuple[str, Any]] = []
    for name in QUANTITIES[:2]:
        panels.append((name.replace("_", " "), ds[name]))
    for group in ds["group"].values:
        panels.append((f"update rms: {group}", ds["update_rms"].sel(group=group)))
    steps = ds["step"].values
    colours = colormaps["viridis"](np.linspace(0.0, 0.9, len(steps)))
    columns = len(panels) if len(panels) <= 4 else 3
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(4.2 * columns, 3.4 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    label = str(ds.attrs.get("size_label", "size"))
    sizes = ds["size"].values
    where = "mean over blocks" if layer is None else f"block {layer}"
    for ax, (title, values) in zip(axes, panels, strict=False):
        values = values.sel(layer=layer) if layer is not None else values.mean("layer")
        for step, colour in zip(steps, colours, strict=True):
            line = values.sel(step=step).values
            if np.isfinite(line).any():
                ax.plot(sizes, line, "o-", color=colour, ms=3, label=f"step {step}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(label)
        ax.set_ylabel("RMS")
        ax.set_title(f"{title} ({where})", fontsize="medium")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize="small")
    return fig
