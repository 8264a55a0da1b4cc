"""Signal propagation of any PyTorch model while it trains (docs/guide/monitor.md).

Per layer (the residual stream entering the first block, layer 0, and leaving every block):
``activation_rms``, ``kurtosis`` (excess kurtosis over features: outlier features) and the
token-covariance metrics of the trainer's log (:data:`shapedtx.metrics.METRICS`:
``mean_rho``, ``stable_rank``, ``centred_stable_rank``, ``eigenvalue_ratio``, ``residual``).
Per block and head: ``attention_entropy``, its reference ``entropy_reference`` and
``max_logit`` (:mod:`shapedtx.diagnostics.attention`). Per block and weight matrix:
``update_size``, ``||W_t - W_s||_F / ||W_s||_F`` since the previous measurement
(:class:`shapedtx.diagnostics.UpdateMeter`).

:class:`Monitor` measures them on a fixed batch in a user's training loop, in one forward pass
through :func:`shapedtx.diagnostics.record_streams`; ``shapedtx.train`` logs the same numbers
(the same code) into ``log.nc``. A model whose attention is not reachable gets the other
metrics and a note. ``shapedtx.CovarianceProbe`` is the monitor reduced to the covariance
metrics.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import metrics
from .._validation import ParameterError, check_bool, check_int
from ..activation import relu_slopes
from ..nn import MLP
from .attention import (
    ATTENTION_VARIABLES,
    AttentionEntry,
    Reader,
    as_float,
    attention_entropy,
    entropy_reference,
    find_attention,
    max_logit,
)
from .hooks import Blocks, NamedBlocks, find_blocks, record_streams
from .updates import UpdateMeter, matrix_name

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

LAYER_METRICS: tuple[str, ...] = ("activation_rms", "kurtosis")
"""Metrics of the residual stream per layer ``(step, layer)``, besides the covariance metrics
of :data:`shapedtx.metrics.METRICS`."""


# ---------------------------------------------------------------- metrics (pure functions)


def activation_rms(X: Tensor) -> Tensor:
    """``sqrt(mean_{i,k} X_ik^2)``, the RMS over tokens and features; X: (..., m, n) -> (...)."""
    return as_float(X).pow(2).mean(dim=(-2, -1)).sqrt()


def excess_kurtosis(X: Tensor) -> Tensor:
    """Excess kurtosis of each token over its features, ``mean_k (x_k - xbar)^4 /
    (mean_k (x_k - xbar)^2)^2 - 3`` (0 for Gaussian features; large when a few features carry
    outliers); X: (..., m, n) -> (..., m). docs/guide/monitor.md#activations."""
    x = as_float(X)
    centred = x - x.mean(dim=-1, keepdim=True)
    second = centred.pow(2).mean(-1)
    return centred.pow(4).mean(-1) / second.pow(2) - 3.0


def mlp_kappa(s_plus: Tensor | float, s_minus: Tensor | float) -> Tensor:
    """Mean over channels of ``kappa = (s_+ - s_-)^2 / (2 (s_+^2 + s_-^2))``, how far a ReLU
    MLP's kernel map is from linear (0: linear, 1/2: plain ReLU; docs/theory.md#kernel-map)."""
    sp = torch.as_tensor(s_plus, dtype=torch.float64)
    sm = torch.as_tensor(s_minus, dtype=torch.float64)
    return ((sp - sm) ** 2 / (2 * (sp**2 + sm**2))).mean()


# ---------------------------------------------------------------- measuring


def _gains(
    blocks: NamedBlocks,
) -> tuple[list[str], list[tuple[int, int, Callable[[], Tensor]]]]:
    """Names of the blocks' trainable gains (parameters ``...gains.<name>``: the simplified
    blocks' and the trainable shape's, docs/theory.md#trainable-shape), in order of first
    appearance, and (block, name index, its value now) of each: the owning module's ``gain``
    where it has one (the library's, which may store a gain as its log), else the parameter."""
    order: dict[str, None] = {}
    found: list[tuple[int, str, Callable[[], Tensor]]] = []
    for b, (_, block) in enumerate(blocks):
        for name, p in block.named_parameters():
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] == "gains":
                owner = block.get_submodule(".".join(parts[:-2]))
                read = getattr(owner, "gain", None)
                value = functools.partial(read, parts[-1]) if callable(read) else lambda p=p: p
                order[parts[-1]] = None
                found.append((b, parts[-1], value))
    names = list(order)
    return names, [(b, names.index(n), v) for b, n, v in found]


def _slopes(block: nn.Module) -> tuple[Tensor | float, Tensor | float] | None:
    """(s_+, s_-) of a library block's ReLU MLP (its trainable slopes, else the configured
    constants); None for any other block."""
    mlp = getattr(block, "mlp", None)
    if not isinstance(mlp, MLP) or mlp.config.mlp not in ("shaped_relu", "relu"):
        return None
    if "mlp_s_plus" in mlp.gains:
        return mlp.gain("mlp_s_plus"), mlp.gain("mlp_s_minus")
    s_plus, s_minus, _ = relu_slopes(mlp.config)
    return s_plus, s_minus


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


class Monitor:
    """Signal-propagation metrics of a model on a fixed batch, for a user's training loop.

    Every ``every`` steps (0, K, 2K, ...) a call runs ``model(inputs)`` once under
    ``torch.no_grad()`` (in eval mode, every module's flag restored; hooks removed, also on
    error) and returns that step's row as a Dataset; :meth:`dataset` returns all rows::

        mon = shapedtx.Monitor(model, {"input_ids": val_ids}, every=100)
        for step in range(steps):
            mon(step)                         # measures at steps 0, 100, 200, ...
            loss = ...; loss.backward(); opt.step()
        mon(steps)
        log = mon.dataset()                   # the variables of shapedtx.train's log.nc

    Variables (docs/guide/monitor.md): ``activation_rms``, ``kurtosis`` and the covariance
    metrics ``mean_rho``, ``stable_rank``, ``centred_stable_rank``, ``eigenvalue_ratio``,
    ``residual`` over ``(step, layer)`` (layer 0 the input of the first block);
    ``attention_entropy``, ``max_logit`` over ``(step, block, head)`` and
    ``entropy_reference(step, block)``; ``update_size(step, block, weight)`` (NaN at the first
    measurement, and where a block lacks that matrix); where blocks have trainable gains
    (``...gains.<name>`` parameters: the simplified blocks', the trainable shape's)
    ``shape_gain(step, block, gain)``, each gain's mean over heads or channels (NaN where a block
    lacks it); for the library's ReLU MLPs ``mlp_kappa(step, block)``, the mean over
    channels of the slopes' kernel nonlinearity (:func:`mlp_kappa`). Where attention is not
    reachable the attention variables are NaN for those blocks (absent if no block has
    reachable attention) and ``attrs["missing"]`` says so (also as a warning at construction).

    Args:
        model, inputs, blocks: as :func:`shapedtx.probe`.
        every: measure at steps divisible by ``every``.
        attention: one entry per block (module, name or None); default: found in each block
            (:func:`find_attention`).
        eval: measure in eval mode (no dropout).
    """

    _who = "monitor"  # the name in the hooks' error messages

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        every: int = 1,
        *,
        blocks: Blocks = None,
        attention: Sequence[AttentionEntry] | None = None,
        eval: bool = True,
    ) -> None:
        check_int("every", every, 1)
        check_bool("eval", eval)
        self.model, self.inputs, self.every, self.eval = model, inputs, every, eval
        self.blocks = find_blocks(model, blocks)
        self.calls = 0
        self.steps: list[int] = []
        self.rows: list[dict[str, np.ndarray]] = []
        self.heads = 0
        self._instruments(attention)

    def _instruments(self, attention: Sequence[AttentionEntry] | None) -> None:
        """The attention readers, the update meter, the gains and slopes, and the note."""
        self.readers: list[Reader | None] = find_attention(self.model, self.blocks, attention)
        self._meter = UpdateMeter(self.blocks, matrix_name)
        self.weight_names: list[str] = self._meter.groups
        self.gain_names, self._gain_values = _gains(self.blocks)
        self._has_slopes = any(_slopes(block) is not None for _, block in self.blocks)
        self.note = _note(self.blocks, self.readers)
        if self.note:
            warnings.warn(f"Monitor: {self.note}", RuntimeWarning, stacklevel=3)

    @property
    def has_attention(self) -> bool:
        """Whether any block's attention logits are reachable."""
        return any(r is not None for r in self.readers)

    def remember_weights(self) -> None:
        """Keep the current weights as the reference of the next ``update_size``."""
        self._meter.remember()

    def _due(self, step: int | None) -> int | None:
        """The step to measure at now (None if not due); counts the call."""
        due = _due_step(step, self.calls, self.every, self.steps)
        self.calls += 1
        return due

    def measure(self) -> dict[str, np.ndarray]:
        """One measurement now: {variable: array} (the trainer's log row, without ``step``)."""
        logits: list[Tensor | None] = [None] * len(self.blocks)

        def on_output(index: int, output: Any) -> None:
            reader = self.readers[index]
            if reader is not None:
                logits[index] = reader.take()

        X = record_streams(
            self.model, self.inputs, self.blocks, on_output=on_output, eval_mode=self.eval,
            who=self._who, attach=lambda: [h for r in self.readers if r for h in r.attach()],
        ).kept  # fmt: skip
        with torch.no_grad():
            V = torch.stack([metrics.covariance(x.double()) for x in X], dim=1)
            row = dict(metrics.metric_tensors(V))
            row["activation_rms"] = torch.stack([activation_rms(x.flatten(0, -2)) for x in X])
            row["kurtosis"] = torch.stack([excess_kurtosis(x).mean() for x in X])
            if self.has_attention:
                row.update(self._attention_rows(logits))
            row["update_size"] = self._meter.relative()
            row.update(self._shape_rows())
        return {name: value.double().cpu().numpy() for name, value in row.items()}

    def _shape_rows(self) -> dict[str, Tensor]:
        """{shape_gain: (L, G) means, mlp_kappa: (L,)}, each only where some block has it."""
        rows: dict[str, Tensor] = {}
        if self._gain_values:
            gain = torch.full(
                (len(self.blocks), len(self.gain_names)), math.nan, dtype=torch.float64
            )
            for b, g, value in self._gain_values:
                gain[b, g] = value().detach().double().mean().cpu()
            rows["shape_gain"] = gain
        if self._has_slopes:
            slopes = [_slopes(block) for _, block in self.blocks]  # now: a gain may be a log
            rows["mlp_kappa"] = torch.stack(
                [
                    mlp_kappa(*[x.detach().cpu() if isinstance(x, Tensor) else x for x in s])
                    if s is not None
                    else torch.tensor(math.nan, dtype=torch.float64)
                    for s in slopes
                ]
            )
        return rows

    def _attention_rows(self, logits: list[Tensor | None]) -> dict[str, Tensor]:
        """{attention_entropy, max_logit: (L, H), entropy_reference: (L,)}, NaN where a
        block's logits are missing (or it has fewer heads)."""
        present = [Y for Y in logits if Y is not None]
        self.heads = heads = max([self.heads, *(Y.shape[-3] for Y in present)])
        device = present[0].device if present else None
        shape = (len(logits), heads)
        entropy = torch.full(shape, math.nan, dtype=torch.float64, device=device)
        top = torch.full(shape, math.nan, dtype=torch.float64, device=device)
        reference = torch.full(shape[:1], math.nan, dtype=torch.float64, device=device)
        for b, Y in enumerate(logits):
            if Y is None:
                continue
            h = Y.shape[-3]
            entropy[b, :h] = attention_entropy(Y).mean(0)  # (B, h): mean over the batch
            top[b, :h] = max_logit(Y).amax(0)  # largest over the batch
            reference[b] = entropy_reference(torch.isfinite(Y)).mean()
        return {"attention_entropy": entropy, "max_logit": top, "entropy_reference": reference}

    def __call__(self, step: int | None = None) -> xr.Dataset | None:
        """Measure if ``step`` (default: the number of earlier calls) is a multiple of
        ``every``; returns that step's row as a Dataset (None if not due)."""
        step = self._due(step)
        if step is None:
            return None
        row = self.measure()
        self.steps.append(step)
        self.rows.append(row)
        return self._dataset([{"step": step, **row}])

    def dataset(self) -> xr.Dataset:
        """All measurements so far (see the class docstring)."""
        if not self.rows:
            raise ValueError("no measurement yet: call the monitor at a step divisible by every")
        return self._dataset([{"step": s, **r} for s, r in zip(self.steps, self.rows, strict=True)])

    def _dataset(self, rows: list[dict[str, Any]]) -> xr.Dataset:
        data, coords = monitor_variables(
            rows, self.weight_names, len(self.blocks), gains=self.gain_names
        )
        for name in metrics.METRICS:
            data[name] = (("step", "layer"), np.stack([r[name] for r in rows]))
        attrs = {"attention": ", ".join(r.name if r else "-" for r in self.readers)}
        if self.note:
            attrs["missing"] = self.note
        return self._frame(data, coords, [r["step"] for r in rows], attrs)

    def _frame(
        self,
        data: dict[str, Any],
        coords: dict[str, Any],
        steps: Sequence[int],
        attrs: dict[str, Any],
    ) -> xr.Dataset:
        """The Dataset of ``data`` over ``steps`` and the layers, attrs ``model``, ``blocks``,
        ``every`` and ``attrs``."""
        import xarray as xr

        coords["step"] = np.asarray(steps, dtype=np.int64)
        coords["layer"] = np.arange(len(self.blocks) + 1)
        base = {
            "model": type(self.model).__qualname__,
            "blocks": ", ".join(name for name, _ in self.blocks),
            "every": self.every,
        }
        ds = xr.Dataset(data, coords=coords, attrs={**base, **attrs})
        ds["step"].attrs["long_name"] = "optimiser step"
        return ds


def _note(blocks: NamedBlocks, readers: Sequence[Reader | None]) -> str:
    """The one-line note on the blocks without reachable attention ('' if none)."""
    missing = [name for (name, _), r in zip(blocks, readers, strict=True) if r is None]
    if not missing:
        return ""
    where = "any block" if len(missing) == len(blocks) else f"blocks {', '.join(missing)}"
    return (
        f"{', '.join(ATTENTION_VARIABLES)} not measured: no attention logits reachable in "
        f"{where} (pass attention= the attention modules)"
    )


def monitor_variables(
    rows: Sequence[Mapping[str, Any]],
    weights: Sequence[str],
    depth: int,
    *,
    gains: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Dataset variables and coordinates of the monitor's rows (dicts holding
    ``activation_rms``, ``kurtosis``: (L + 1,); ``attention_entropy``, ``max_logit``:
    (L, H); ``entropy_reference``, ``mlp_kappa``: (L,); ``update_size``: (L, W);
    ``shape_gain``: (L, G), G the names ``gains``). A variable absent from every row is left
    out; rows without it (an older checkpoint's) get NaN."""
    dims = {
        "shape_gain": ("step", "block", "gain"),
        "mlp_kappa": ("step", "block"),
        "activation_rms": ("step", "layer"),
        "kurtosis": ("step", "layer"),
        "attention_entropy": ("step", "block", "head"),
        "max_logit": ("step", "block", "head"),
        "entropy_reference": ("step", "block"),
        "update_size": ("step", "block", "weight"),
    }
    data: dict[str, Any] = {}
    coords: dict[str, Any] = {"block": np.arange(depth)}
    for name, dim in dims.items():
        present = [np.asarray(r[name], dtype=np.float64) for r in rows if name in r]
        if not present:
            continue
        shape = max((p.shape for p in present), key=lambda s: s[-1] if s else 0)
        stacked = np.full((len(rows), *shape), np.nan)
        for i, r in enumerate(rows):
            if name in r:
                value = np.asarray(r[name], dtype=np.float64)
                stacked[i][tuple(slice(0, s) for s in value.shape)] = value
        data[name] = (dim, stacked)
        if "head" in dim:
            coords["head"] = np.arange(shape[-1])
    if "update_size" in data:
        coords["weight"] = np.asarray(list(weights), dtype=str)
    if "shape_gain" in data:
        coords["gain"] = np.asarray(list(gains), dtype=str)
    return data, coords


# ---------------------------------------------------------------- figure

PLOTTED: tuple[str, ...] = (
    "attention_entropy",
    "max_logit",
    "activation_rms",
    "kurtosis",
    "mean_rho",
    "centred_stable_rank",
    "update_size",
)
"""The panels of :func:`plot_monitor` by default (those present in every log)."""


_YLABEL = {
    "attention_entropy": "attention entropy\n(nats, mean over heads)",
    "max_logit": "largest logit\n(max over heads)",
    "activation_rms": "activation RMS",
    "kurtosis": "excess kurtosis\n(over features)",
    "update_size": "relative update since\nprevious row (mean)",
}


def plot_monitor(logs: Mapping[str, xr.Dataset], metrics: Sequence[str] | None = None) -> Figure:
    """One panel per metric (rows) and run (columns, side by side, shared y axis per metric),
    one line per layer or block against step (colour: depth).

    ``attention_entropy`` is the mean over heads (dashed: ``entropy_reference``, uniform
    attention), ``max_logit`` the largest over heads, ``update_size`` the mean over the
    block's weight matrices (log scale). ``logs``: label -> a training ``log.nc`` or a
    :meth:`Monitor.dataset`.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if not isinstance(logs, Mapping) or not logs:
        raise ParameterError("logs", "logs must be a non-empty mapping label -> Dataset")
    if metrics is None:
        metrics = [m for m in PLOTTED if all(m in ds for ds in logs.values())]
    if not metrics:
        raise ParameterError("metrics", "metrics must name at least one variable of the logs")
    for name in metrics:
        for label, ds in logs.items():
            if name not in ds:
                raise ParameterError("metrics", f"log {label!r} has no variable {name!r}")
    cols = len(logs)
    fig = Figure(figsize=(3.6 * cols + 0.8, 2.2 * len(metrics) + 0.4), layout="constrained")
    axes = np.asarray(fig.subplots(len(metrics), cols, sharey="row", squeeze=False))
    cmap = colormaps["viridis"]
    for c, (label, ds) in enumerate(logs.items()):
        steps = ds["step"].values
        for r, name in enumerate(metrics):
            ax = axes[r, c]
            value = ds[name]
            if "head" in value.dims:
                value = value.max("head") if name == "max_logit" else value.mean("head")
            if "weight" in value.dims:
                value = value.mean("weight", skipna=True)
                ax.set_yscale("log")
            depth_dim = "layer" if "layer" in value.dims else "block"
            lines = value.transpose("step", depth_dim).values
            count = lines.shape[1]
            marker = "." if len(steps) <= 20 else None  # few measurements: show where they are
            for j in range(count):
                colour = cmap(j / max(count - 1, 1))
                first_or_last = j in (0, count - 1)
                ax.plot(
                    steps, lines[:, j], color=colour, lw=1.0, marker=marker, ms=3,
                    label=f"{depth_dim} {j}" if first_or_last else None,
                )  # fmt: skip
            if name == "attention_entropy" and "entropy_reference" in ds:
                ref = ds["entropy_reference"].mean("block").values
                ax.plot(steps, ref, "k--", lw=0.8, label="uniform")
            if r == 0:
                ax.set_title(label)
            if c == 0:
                ax.set_ylabel(_YLABEL.get(name, name), fontsize="small")
            if r == len(metrics) - 1:
                ax.set_xlabel("step")
    for r in range(len(metrics)):
        axes[r, -1].legend(fontsize="x-small", loc="best")
    return fig


__all__ = [
    "LAYER_METRICS",
    "PLOTTED",
    "Monitor",
    "activation_rms",
    "excess_kurtosis",
    "mlp_kappa",
    "monitor_variables",
    "plot_monitor",
]
