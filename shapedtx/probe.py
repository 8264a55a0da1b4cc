"""Token covariance of any PyTorch model, through forward hooks on its residual blocks.

:func:`probe` runs ``model(inputs)`` once under ``torch.no_grad()`` (in eval mode, restored
afterwards), records the residual stream ``X_l: (B, m, n)`` entering the first block (layer 0,
the embedding output) and leaving every block (layer ``l``), and returns the covariance
Dataset of :mod:`shapedtx.results`: ``V(sample, t, token_a, token_b)`` with
``V_l = X_l X_l^T / n`` computed in float64, one sample per batch element, depth time
``t = layer / n`` (``n`` the width of the recorded stream) and a ``layer`` coordinate on ``t``.
So :func:`shapedtx.detect_collapse`, ``simulations.compare``, ``simulations.collapse_report``
and the plots of ``simulations.plots`` work on it unchanged.

:class:`CovarianceProbe` does the same inside a user's training loop, every ``every`` steps on
a fixed batch, and returns the trainer's log format (``mean_rho(step, layer)``,
``stable_rank(step, layer)``, ... of :data:`shapedtx.training.log.METRICS`).

The blocks are found by themselves (:data:`BLOCK_PATHS`) for the library's ``Transformer`` and
``LanguageModel``, ``transformers`` GPT-2 style models and nanoGPT (``transformer.h``), timm
ViTs (``blocks``), Llama-style models (``model.layers``) and models built on PyTorch's
``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` (wherever it sits); otherwise pass
``blocks=``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from ._validation import ParameterError, check_bool, check_int
from .config import ModelConfig, check_config
from .metrics import covariance

if TYPE_CHECKING:
    import xarray as xr

BLOCK_PATHS: tuple[str, ...] = (
    "blocks",
    "body.blocks",
    "transformer.h",
    "h",
    "model.layers",
    "layers",
)
"""Where :func:`find_blocks` looks for the residual blocks (a non-empty ``nn.ModuleList`` or
``nn.Sequential``), in this order: the library's ``Transformer`` and timm ViTs (``blocks``),
its ``LanguageModel`` (``body.blocks``), GPT-2 ``LMHeadModel``s and nanoGPT
(``transformer.h``), ``GPT2Model`` (``h``), Llama-style models (``model.layers``, ``layers``).
Failing those, the ``layers`` of the one ``torch.nn.TransformerEncoder`` (or
``TransformerDecoder``) anywhere in the model."""

Blocks = str | nn.Module | Sequence[str | nn.Module] | None


def _attribute(model: nn.Module, path: str) -> Any:
    obj: Any = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _submodule(
    modules: dict[str, nn.Module],
    names: dict[nn.Module, str],
    entry: Any,
    parameter: str,
    index: int,
) -> tuple[str, nn.Module]:
    """``(name, module)`` of ``entry``, a module of ``modules`` (``model.named_modules()``, with
    ``names`` its inverse) or its name; ParameterError naming ``parameter[index]`` otherwise."""
    if isinstance(entry, str):
        if entry not in modules:
            raise ParameterError(
                parameter, f"{parameter}[{index}]: model has no submodule named {entry!r}"
            )
        return entry, modules[entry]
    if not isinstance(entry, nn.Module) or entry not in names:
        raise ParameterError(parameter, f"{parameter}[{index}] is not a submodule of model")
    return names[entry], entry


def find_blocks(model: nn.Module, blocks: Blocks = None) -> list[tuple[str, nn.Module]]:
    """The residual blocks of ``model`` as ``(name, module)`` pairs, in order.

    ``blocks``: ``None`` (look in :data:`BLOCK_PATHS`), a list of modules or of names in
    ``model.named_modules()``, or one ``nn.ModuleList`` / ``nn.Sequential`` (or its name).
    """
    if not isinstance(model, nn.Module):
        raise ParameterError(
            "model", f"model must be a torch.nn.Module, got {type(model).__name__}"
        )
    names = {module: name for name, module in model.named_modules()}
    modules = dict(model.named_modules())
    if blocks is None:
        for path in BLOCK_PATHS:
            found = _attribute(model, path)
            if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found) > 0:
                return [(names[b], b) for b in found]
        stacks = [
            (name, m)
            for name, m in model.named_modules()
            if isinstance(m, (nn.TransformerEncoder, nn.TransformerDecoder)) and len(m.layers)
        ]
        if len(stacks) == 1:  # torch's own stack, wherever it sits in the model
            return [(names[b], b) for b in stacks[0][1].layers]
        if stacks:
            raise ParameterError(
                "blocks",
                f"{type(model).__name__} holds several torch Transformer stacks ("
                f"{', '.join(name or '(the model)' for name, _ in stacks)}); pass blocks= one "
                f"stack's layers, e.g. blocks={(stacks[0][0] + '.layers').lstrip('.')!r}",
            )
        raise ParameterError(
            "blocks",
            f"no residual blocks found in {type(model).__name__} (looked for "
            f"{', '.join(BLOCK_PATHS)}); pass blocks=[...]: the block modules, or their "
            f"names in model.named_modules(), in order",
        )
    if isinstance(blocks, str):
        if blocks not in modules:
            raise ParameterError("blocks", f"blocks: model has no submodule named {blocks!r}")
        blocks = modules[blocks]
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        blocks = list(blocks)
    if isinstance(blocks, nn.Module) or not isinstance(blocks, Sequence):
        raise ParameterError(
            "blocks",
            "blocks must be a list of modules or module names, or a ModuleList/Sequential, "
            f"got {type(blocks).__name__}",
        )
    if len(blocks) == 0:
        raise ParameterError("blocks", "blocks must name at least one block")
    out = [_submodule(modules, names, block, "blocks", i) for i, block in enumerate(blocks)]
    if len({id(b) for _, b in out}) != len(out):
        raise ParameterError("blocks", "blocks must not repeat a module")
    return out


def _stream(value: Any) -> Tensor | None:
    """The residual stream in a block's input or output: a tensor, the first element of a
    tuple/list (as ``transformers`` blocks return), or the first tensor of a mapping."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    if isinstance(value, Mapping):
        for item in value.values():
            if isinstance(item, Tensor):
                return item
    return None


def _call(model: nn.Module, inputs: Any) -> Any:
    """``model(inputs)``; a tuple/list is passed as positional, a dict as keyword arguments."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _forward_once(
    model: nn.Module,
    inputs: Any,
    blocks: list[tuple[str, nn.Module]],
    *,
    on_input: Callable[[Tensor | None, Any], None],
    on_output: Callable[[int, Any], None],
    eval_mode: bool,
    who: str,
    attach: Callable[[], list[Any]] = list,
) -> None:
    """Call ``model(inputs)`` once without gradients, with ``on_input(stream, raw)`` at the
    first call of the first block's forward pre-hook (``stream`` is :func:`_stream` of its
    arguments, ``raw`` what it was taken from) and ``on_output(i, output)`` at the first call
    of block ``i``'s forward hook; ``attach()`` registers further hooks and returns their
    handles. Every hook is removed and every module's training flag restored, also on error;
    then ParameterError unless every block ran exactly once (``who`` names the caller)."""
    calls = [0] * len(blocks)
    seen_input = [False]

    def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen_input[0]:
            x = _stream(args) if args else _stream(kwargs.get("hidden_states", kwargs))
            on_input(x, args[0] if args else kwargs)
            seen_input[0] = True

    def post_hook(index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            calls[index] += 1
            if calls[index] == 1:
                on_output(index, output)

        return hook

    training = {module: module.training for module in model.modules()}
    handles = [blocks[0][1].register_forward_pre_hook(pre_hook, with_kwargs=True)]
    try:
        handles += [b.register_forward_hook(post_hook(i)) for i, (_, b) in enumerate(blocks)]
        handles += attach()
        if eval_mode:
            model.eval()
        with torch.no_grad():
            try:
                _call(model, inputs)
            except (RuntimeError, TypeError) as err:
                raise ParameterError(
                    "inputs",
                    f"model(inputs) failed ({type(err).__name__}: {err}); check that inputs "
                    f"has the type and shape the model expects",
                ) from err
    finally:
        for handle in handles:
            handle.remove()
        for module, mode in training.items():
            module.training = mode
    for (name, _), count in zip(blocks, calls, strict=True):
        if count != 1:
            raise ParameterError(
                "blocks",
                f"block {name!r} ran {count} times during model(inputs); the {who} needs "
                f"every block to run exactly once",
            )


def _record(
    model: nn.Module, inputs: Any, blocks: list[tuple[str, nn.Module]], eval_mode: bool
) -> tuple[Tensor, int, torch.dtype]:
    """Run the model once with hooks (:func:`_forward_once`); returns V: (B, L + 1, m, m)
    float64 on the stream's device, the stream's width n and its dtype."""
    covs: list[Tensor | None] = [None] * (len(blocks) + 1)
    info: dict[str, Any] = {}

    def store(index: int, where: str, x: Tensor | None, what: Any) -> None:
        if x is None:
            raise ParameterError(
                "blocks",
                f"{where} is {type(what).__name__}, not a tensor (or a tuple starting with "
                f"one): the probe records the residual stream, pass blocks= that return it",
            )
        if x.dim() != 3 or x.shape[-2] < 2:
            raise ParameterError(
                "inputs",
                f"{where} has shape {tuple(x.shape)}; the probe needs (batch, tokens, width) "
                f"with at least 2 tokens: check the shape of inputs (a batch dimension?)",
            )
        if "shape" in info and x.shape != info["shape"]:
            raise ParameterError(
                "blocks",
                f"{where} has shape {tuple(x.shape)}, the block input "
                f"{tuple(info['shape'])}: blocks must keep the residual stream's shape",
            )
        info.setdefault("shape", x.shape)
        info.setdefault("dtype", x.dtype)
        covs[index] = covariance(x.detach().to(torch.float64))

    def on_output(index: int, output: Any) -> None:
        where = f"the output of block {blocks[index][0]!r}"
        store(index + 1, where, _stream(output), output)

    _forward_once(
        model,
        inputs,
        blocks,
        on_input=lambda x, raw: store(0, f"the input of block {blocks[0][0]!r}", x, raw),
        on_output=on_output,
        eval_mode=eval_mode,
        who="probe",
    )
    # every block ran once (checked by _forward_once): each input and output was recorded
    V = torch.stack(cast(list[Tensor], covs), dim=1)
    return V, int(info["shape"][-1]), info["dtype"]


def _config(model: nn.Module, config: ModelConfig | None, width: int, depth: int):
    """(config, known): the given config, else the model's own ModelConfig if it matches the
    recorded width and depth, else ``ModelConfig(width, depth)`` marked unknown."""
    if config is not None:
        check_config(config)
        if (config.width, config.depth) != (width, depth):
            raise ParameterError(
                "config",
                f"config has width {config.width} and depth {config.depth}, the probed model "
                f"width {width} and {depth} blocks",
            )
        return config, True
    own = getattr(model, "config", None)
    if isinstance(own, ModelConfig) and (own.width, own.depth) == (width, depth):
        return own, True
    return ModelConfig(width=width, depth=depth), False


def probe(
    model: nn.Module,
    inputs: Any,
    blocks: Blocks = None,
    *,
    config: ModelConfig | None = None,
    eval: bool = True,
) -> xr.Dataset:
    """Token covariance of ``model`` after every block, as the library's covariance Dataset.

    Args:
        model: any ``nn.Module`` whose blocks map a residual stream ``(B, m, n)`` to one of
            the same shape (a tensor, or a tuple starting with one, as ``transformers``
            blocks return), on any device and in any dtype.
        inputs: what the model is called with: a tensor (``model(inputs)``), a tuple or list
            (``model(*inputs)``) or a dict (``model(**inputs)``, e.g.
            ``{"input_ids": ids}`` or ``{"inputs_embeds": X0}``).
        blocks: the residual blocks (modules or their names, or a ModuleList); default: found
            by :func:`find_blocks` for the library's models, GPT-2 / nanoGPT, timm ViTs and
            Llama-style models.
        config: the ModelConfig to store in ``attrs`` (default: the model's own for the
            library's models; otherwise only ``config.width`` and ``config.depth`` are
            stored, with ``attrs["config_known"] = 0``).
        eval: run in eval mode (no dropout); every module's training flag is restored.

    Returns:
        ``V(sample, t, token_a, token_b)`` float64 (sample = batch element, ``t = layer / n``
        for layers 0..L with layer 0 the input of the first block), coordinate ``layer``,
        attrs as :func:`shapedtx.covariance_dataset` with ``source="network"``,
        ``method="probe"``, ``seed=-1``, and ``model`` (class name), ``blocks`` (their
        names), ``stream_dtype``. The forward hooks are removed afterwards, also on error.

    Raises:
        ValueError: no blocks found, inputs the model cannot run on or that give no
            ``(batch, tokens, width)`` stream, a block returning no tensor.
    """
    check_bool("eval", eval)
    named = find_blocks(model, blocks)
    V, width, stream_dtype = _record(model, inputs, named, eval)
    depth = len(named)
    config, known = _config(model, config, width, depth)
    layer = np.arange(depth + 1)
    attrs = {
        "model": type(model).__qualname__,
        "blocks": ", ".join(name for name, _ in named),
        "stream_dtype": str(stream_dtype).removeprefix("torch."),
        "config_known": int(known),
    }
    ds = _covariance_dataset(
        V, layer / width, config, source="network", method="probe", seed=-1, layer=layer,
        attrs=attrs,
    )  # fmt: skip
    nonfinite = int((~torch.isfinite(V.flatten(1)).all(dim=1)).sum())
    ds.attrs["nonfinite"] = nonfinite
    if nonfinite:
        warnings.warn(
            f"probe: {nonfinite} of {V.shape[0]} sequences have non-finite covariances (the "
            "residual stream overflowed or is NaN); see the 'nonfinite' attribute",
            RuntimeWarning,
            stacklevel=2,
        )
    if not known:
        keep = ("config.width", "config.depth")
        ds.attrs = {k: v for k, v in ds.attrs.items() if not k.startswith("config.") or k in keep}
    return ds


def _due_step(step: int | None, calls: int, every: int, done: Sequence[int]) -> int | None:
    """The step a periodic measurement is at (``step``, default ``calls``, the number of earlier
    calls) if it is a multiple of ``every``, else None. ParameterError (``step``) for a negative
    step or a due one that does not follow the last recorded step in ``done``."""
    if step is None:
        step = calls
    check_int("step", step, 0)
    if step % every:
        return None
    if done and step <= done[-1]:
        raise ParameterError("step", f"step must increase, got {step} after {done[-1]}")
    return step


class CovarianceProbe:
    """Token-covariance metrics of a model during a user's own training loop.

    Call it once per optimiser step; every ``every`` steps (0, K, 2K, ...) it runs
    ``model(inputs)`` on the fixed batch ``inputs`` as :func:`probe` does (no_grad, eval mode
    restored, hooks removed) and keeps the covariances on the model's device. Nothing is
    copied to the host until :meth:`dataset`, so a measurement does not synchronise with the
    device; the eigenvalue metrics are computed (on the device) at :meth:`dataset`, or every
    ``max_pending`` measurements to bound memory (``B (L + 1) m^2`` float64 numbers each)::

        cov = shapedtx.CovarianceProbe(model, {"input_ids": val_ids}, every=100)
        for step in range(steps):
            cov(step)                      # measures at steps 0, 100, 200, ...
            loss = ...; loss.backward(); opt.step()
        cov(steps)                         # and the trained model
        log = cov.dataset()                # mean_rho(step, layer), stable_rank(step, layer)

    ``cov()`` without a step counts calls from 0. :meth:`dataset` returns the trainer's log
    format: the variables of :data:`shapedtx.training.log.METRICS` over ``(step, layer)``,
    batch-averaged, layer 0 the input of the first block.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        every: int = 1,
        *,
        blocks: Blocks = None,
        eval: bool = True,
        max_pending: int = 64,
    ) -> None:
        check_int("every", every, 1)
        check_int("max_pending", max_pending, 1)
        self.model, self.inputs, self.every, self.eval = model, inputs, every, eval
        self.max_pending = max_pending
        self.blocks = find_blocks(model, blocks)
        self.calls = 0
        self.width: int | None = None
        self.stream_dtype: torch.dtype | None = None
        self._steps: list[int] = []
        self._pending: list[Tensor] = []
        self._metrics: list[dict[str, Tensor]] = []

    def __call__(self, step: int | None = None) -> bool:
        """Measure if ``step`` (default: the number of earlier calls) is a multiple of
        ``every``; returns whether it measured."""
        step = _due_step(step, self.calls, self.every, self._steps)
        self.calls += 1
        if step is None:
            return False
        V, self.width, self.stream_dtype = _record(self.model, self.inputs, self.blocks, self.eval)
        self._steps.append(step)
        self._pending.append(V)
        if len(self._pending) >= self.max_pending:
            self._flush()
        return True

    def _flush(self) -> None:
        from .training.log import metric_tensors

        self._metrics.extend(metric_tensors(V) for V in self._pending)
        self._pending.clear()

    def dataset(self) -> xr.Dataset:
        """The measurements so far: ``mean_rho(step, layer)``, ``stable_rank(step, layer)``,
        ``centred_stable_rank``, ``eigenvalue_ratio``, ``residual``; attrs ``model``,
        ``blocks``, ``every``, ``width``, ``stream_dtype``."""
        import xarray as xr

        from .training.log import METRICS

        if not self._steps:
            raise ValueError("no measurement yet: call the probe at a step divisible by every")
        self._flush()
        stacked = {name: torch.stack([m[name] for m in self._metrics]) for name in METRICS}
        host = {name: value.cpu().numpy() for name, value in stacked.items()}
        data = {name: (("step", "layer"), value) for name, value in host.items()}
        coords = {
            "step": np.asarray(self._steps, dtype=np.int64),
            "layer": np.arange(len(self.blocks) + 1),
        }
        attrs = {
            "model": type(self.model).__qualname__,
            "blocks": ", ".join(name for name, _ in self.blocks),
            "every": self.every,
            "width": int(self.width or 0),
            "stream_dtype": str(self.stream_dtype).removeprefix("torch."),
        }
        ds = xr.Dataset(data, coords=coords, attrs=attrs)
        ds["step"].attrs["long_name"] = "optimiser step"
        return ds


def _covariance_dataset(*args: Any, **kwargs: Any) -> xr.Dataset:
    from .results import covariance_dataset  # xarray is loaded only when a Dataset is built

    return covariance_dataset(*args, **kwargs)
