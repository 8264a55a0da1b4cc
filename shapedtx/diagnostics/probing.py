"""Token covariance of any PyTorch model, through forward hooks on its residual blocks.

:func:`probe` runs ``model(inputs)`` once under ``torch.no_grad()`` (in eval mode, restored
afterwards; :func:`shapedtx.diagnostics.record_streams`), records the residual stream
``X_l: (B, m, n)`` entering the first block (layer 0, the embedding output) and leaving every
block (layer ``l``), and returns the covariance Dataset of :mod:`shapedtx.results`:
``V(sample, t, token_a, token_b)`` with ``V_l = X_l X_l^T / n`` computed in float64, one sample
per batch element, depth time ``t = layer / n`` (``n`` the width of the recorded stream) and a
``layer`` coordinate on ``t``. So :func:`shapedtx.detect_collapse`, ``simulations.compare``,
``simulations.collapse_report`` and the plots of ``simulations.plots`` work on it unchanged.

:class:`CovarianceProbe` does the same inside a user's training loop, every ``every`` steps on
a fixed batch, and returns the trainer's log format (``mean_rho(step, layer)``,
``stable_rank(step, layer)``, ... of :data:`shapedtx.metrics.METRICS`): a
:class:`shapedtx.Monitor` reduced to the covariance metrics.

The blocks are found by :func:`shapedtx.find_blocks` (the library's ``Transformer`` and
``LanguageModel``, ``transformers`` GPT-2 style models and nanoGPT, timm ViTs, Llama-style
models, models built on PyTorch's ``nn.TransformerEncoder`` / ``nn.TransformerDecoder``);
otherwise pass ``blocks=``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics
from .._validation import ParameterError, check_bool, check_int
from ..config import ModelConfig, check_config
from .attention import AttentionEntry
from .hooks import Blocks, find_blocks, record_streams
from .monitor import Monitor
from .updates import UpdateMeter

if TYPE_CHECKING:
    import xarray as xr


def _covariance(x: Tensor) -> Tensor:
    """The token covariance ``X X^T / n`` of a stream, in float64."""
    return metrics.covariance(x.detach().to(torch.float64))


def _record(
    model: nn.Module, inputs: Any, blocks: list[tuple[str, nn.Module]], eval_mode: bool
) -> tuple[Tensor, int, torch.dtype]:
    """Run the model once with hooks (:func:`shapedtx.diagnostics.record_streams`); returns V:
    (B, L + 1, m, m) float64 on the stream's device, the stream's width n and its dtype."""
    streams = record_streams(model, inputs, blocks, keep=_covariance, eval_mode=eval_mode)
    return torch.stack(streams.kept, dim=1), int(streams.shape[-1]), streams.dtype


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


class CovarianceProbe(Monitor):
    """Token-covariance metrics of a model during a user's own training loop: the
    :class:`Monitor` reduced to the covariance metrics, measured without a host synchronisation.

    Call it once per optimiser step; every ``every`` steps (0, K, 2K, ...) it runs
    ``model(inputs)`` on the fixed batch ``inputs`` as :func:`shapedtx.probe` does (no_grad,
    eval mode restored, hooks removed) and keeps the covariances on the model's device. Nothing
    is copied to the host until :meth:`dataset`, so a measurement does not synchronise with the
    device; the eigenvalue metrics are computed (on the device) at :meth:`dataset`, or every
    ``max_pending`` measurements to bound memory (``B (L + 1) m^2`` float64 numbers each)::

        cov = shapedtx.CovarianceProbe(model, {"input_ids": val_ids}, every=100)
        for step in range(steps):
            cov(step)                      # measures at steps 0, 100, 200, ...
            loss = ...; loss.backward(); opt.step()
        cov(steps)                         # and the trained model
        log = cov.dataset()                # mean_rho(step, layer), stable_rank(step, layer)

    ``cov()`` without a step counts calls from 0 and returns whether it measured.
    :meth:`dataset` returns the trainer's log format: the variables of
    :data:`shapedtx.metrics.METRICS` over ``(step, layer)``, batch-averaged, layer 0 the input
    of the first block.
    """

    _who = "probe"

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
        check_int("max_pending", max_pending, 1)
        self.max_pending = max_pending
        self.width: int | None = None
        self.stream_dtype: torch.dtype | None = None
        self._pending: list[Tensor] = []
        self._metrics: list[dict[str, Tensor]] = []
        super().__init__(model, inputs, every, blocks=blocks, eval=eval)

    def _instruments(self, attention: Sequence[AttentionEntry] | None) -> None:
        """None: the covariance metrics need no attention reader, weights, gains or slopes."""
        self.readers = [None] * len(self.blocks)
        self._meter = UpdateMeter(self.blocks, lambda name, parameter: None)
        self.weight_names, self.gain_names, self._gain_values = [], [], []
        self._has_slopes = False
        self.note = ""

    def __call__(self, step: int | None = None) -> bool:  # type: ignore[override]
        """Measure if ``step`` (default: the number of earlier calls) is a multiple of
        ``every``; returns whether it measured (no row: nothing is copied to the host)."""
        step = self._due(step)
        if step is None:
            return False
        V, self.width, self.stream_dtype = _record(self.model, self.inputs, self.blocks, self.eval)
        self.steps.append(step)
        self._pending.append(V)
        if len(self._pending) >= self.max_pending:
            self._flush()
        return True

    def _flush(self) -> None:
        self._metrics.extend(metrics.metric_tensors(V) for V in self._pending)
        self._pending.clear()

    def dataset(self) -> xr.Dataset:
        """The measurements so far: ``mean_rho(step, layer)``, ``stable_rank(step, layer)``,
        ``centred_stable_rank``, ``eigenvalue_ratio``, ``residual``; attrs ``model``,
        ``blocks``, ``every``, ``width``, ``stream_dtype``."""
        if not self.steps:
            raise ValueError("no measurement yet: call the probe at a step divisible by every")
        self._flush()
        data = {
            name: (("step", "layer"), torch.stack([m[name] for m in self._metrics]).cpu().numpy())
            for name in metrics.METRICS
        }
        attrs = {
            "width": int(self.width or 0),
            "stream_dtype": str(self.stream_dtype).removeprefix("torch."),
        }
        return self._frame(data, {}, self.steps, attrs)


def _covariance_dataset(*args: Any, **kwargs: Any) -> xr.Dataset:
    from ..results import covariance_dataset  # xarray is loaded only when a Dataset is built

    return covariance_dataset(*args, **kwargs)


__all__ = ["CovarianceProbe", "probe"]
