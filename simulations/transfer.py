"""``transfer_lr``: the learning rate to train a target with, from a small proxy's tuned one.

The companion of ``shapedtx advise`` for training: given the peak learning
rate tuned on a proxy (width, depth) and a target (width, depth) of the same parametrisation
(a ``shapedtx`` preset), the per-parameter-group Adam learning rates its rule prescribes
(:func:`shapedtx.lr_multipliers`, docs/guide/transfer.md), with the evidence the advice rests
on: the rule and its source, and the drift of the optimal learning rate that the transfer
study measured for this parametrisation (package data ``simulations/data/transfer_drifts.json``,
written by the study's report; no repository file is read). :meth:`TransferAdvice.train_config`
turns the advice into the ``TrainConfig`` whose trainer applies it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from shapedtx import ModelConfig, TrainConfig
from shapedtx._validation import ParameterError, check_choice, check_int, check_number
from shapedtx.presets import PRESETS, preset
from shapedtx.training.transfer import SOURCES, lr_multipliers, lr_rule

DRIFTS = "transfer_drifts.json"
"""The package data (in ``simulations/data``) of the drifts the transfer study measured."""

NOT_MEASURED = "not yet measured"

_EDGE_NOTES = {
    "grid": "some optima at a grid edge",
    "diverged": "some optima bounded by a diverged lr",
}
"""The study's reasons (``edges`` of a drift) why an optimum is a grid point, not a fit."""


@dataclass(frozen=True)
class TransferAdvice:
    """Learning rates for a target trained from a proxy's tuned lr, and their evidence.

    Attributes:
        parametrisation: the preset name.
        lr: the peak learning rate tuned on the proxy.
        proxy, target: (width, depth).
        rule: the learning-rate rule (:func:`shapedtx.lr_rule`).
        source: the rule's statement and the paper it comes from.
        lrs: parameter group (``shapedtx.training.transfer.GROUPS``) -> learning rate at the target.
        multipliers: group -> ``lrs[group] / lr``.
        evidence: the measured drift of the optimal lr for this parametrisation, or
            ``"not yet measured"``.
        measured: the study's numbers behind ``evidence`` (None when not measured).
        model: the target's model as the transfer study trains it: the preset at the
            target's width and depth, causal, its branch multiplier (depth-muP, CompleteP)
            relative to the proxy's depth.
    """

    parametrisation: str
    lr: float
    proxy: tuple[int, int]
    target: tuple[int, int]
    rule: str
    source: str
    lrs: dict[str, float]
    multipliers: dict[str, float]
    evidence: str
    measured: dict[str, Any] | None
    model: ModelConfig

    def train_config(self, **overrides: Any) -> TrainConfig:
        """The ``TrainConfig`` that trains :attr:`model` with this advice: ``lr`` the proxy's
        and the proxy's width and depth (``lr_proxy_width``, ``lr_proxy_depth``), from which
        the trainer gives each parameter group the multiplier of :attr:`multipliers`;
        ``overrides``: any other ``TrainConfig`` field (steps, batch, schedule, ...)."""
        for name in ("lr", "lr_proxy_width", "lr_proxy_depth"):
            if name in overrides:
                raise ParameterError(name, f"{name} is the advice's, not an override")
        return TrainConfig(
            lr=self.lr, lr_proxy_width=self.proxy[0], lr_proxy_depth=self.proxy[1], **overrides
        )

    def __str__(self) -> str:
        lrs = ", ".join(f"{k} {v:.3g}" for k, v in self.lrs.items())
        return (
            f"{self.parametrisation}: lr {self.lr:.3g} tuned at width {self.proxy[0]}, depth "
            f"{self.proxy[1]} -> width {self.target[0]}, depth {self.target[1]}: {lrs}\n"
            f"rule ({self.rule}): {self.source}\nevidence: {self.evidence}"
        )


def measured_drifts() -> dict[str, Any]:
    """The drifts of the optimal learning rate the transfer study measured (package data
    written by its report): ``runs``, ``horizon``, ``proxy`` and, per parametrisation, its
    ``depth_drift`` and ``width_drift`` (None: that axis not measured)."""
    text = files("simulations").joinpath("data").joinpath(DRIFTS).read_text()
    drifts: dict[str, Any] = json.loads(text)
    return drifts


def _measured(
    parametrisation: str, target: tuple[int, int], summary: dict[str, Any]
) -> tuple[str, dict[str, Any] | None]:
    """The evidence sentence and numbers of the measured drifts (:func:`measured_drifts`) for
    this parametrisation (``NOT_MEASURED`` when it is absent)."""
    cell = summary.get("parametrisations", {}).get(parametrisation)
    if not cell:
        return NOT_MEASURED, None
    horizon = summary["horizon"]
    parts = []
    measured: dict[str, Any] = {
        "study": summary.get("study", "examples/transfer"),
        "horizon": int(horizon),
        "runs": summary["runs"],
    }
    proxy = summary.get("proxy", {})
    for axis, index in (("depth", 1), ("width", 0)):
        drift = cell.get(f"{axis}_drift")  # None: not measured on that axis
        if drift is None:
            if target[index] != proxy.get(axis):
                parts.append(f"no drift measured across {axis} (target {axis} {target[index]})")
            continue
        measured[f"{axis}_drift"] = drift
        iv = drift["last_minus_first_interval"]
        interval = f" (95% bootstrap [{iv[0]:+.2f}, {iv[1]:+.2f}])" if iv else ""
        edge = "".join(f"; {_EDGE_NOTES[e]}" for e in drift["edges"])
        sizes = drift["sizes"]
        parts.append(
            f"optimal log2(lr) moves {drift['last_minus_first']:+.2f}{interval} from {axis} "
            f"{sizes[0]} to {sizes[-1]} (range {drift['range']:.2f}{edge})"
        )
        if not sizes[0] <= target[index] <= sizes[-1]:
            parts.append(
                f"target {axis} {target[index]} is outside the measured {sizes[0]}-{sizes[-1]}"
            )
    if "depth_drift" not in measured and "width_drift" not in measured:
        return NOT_MEASURED, None
    head = (
        f"{measured['study']}, {summary['runs']} runs, horizon {horizon} steps, proxy width "
        f"{proxy.get('width')}, depth {proxy.get('depth')}: "
    )
    return head + "; ".join(parts), measured


def transfer_lr(
    lr: float,
    proxy_width: int,
    proxy_depth: int,
    target_width: int,
    target_depth: int,
    parametrisation: str = "shaped_t",
    *,
    drifts: dict[str, Any] | None = None,
) -> TransferAdvice:
    """Per-group learning rates at the target from ``lr`` tuned at the proxy.

    Args:
        lr: the proxy's tuned peak learning rate, in (0, 10].
        proxy_width, proxy_depth, target_width, target_depth: the two sizes (the preset's
            4 heads must divide the widths).
        parametrisation: a ``shapedtx`` preset (docs/guide/transfer.md: ``shaped_t``,
            ``shaped``, ``pre_ln``, ``pre_ln_depth_mup``, ``pre_ln_completep``; any preset is
            accepted and gets the rule of :func:`shapedtx.lr_rule`).
        drifts: the measured drifts the evidence quotes, in the form of
            :func:`measured_drifts` (default: the package data it reads).

    >>> transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_completep").lrs["hidden"]
    0.001
    """
    lr = check_number("lr", lr, 0.0, 10.0, low_open=True)
    for name, value in (
        ("proxy_width", proxy_width),
        ("proxy_depth", proxy_depth),
        ("target_width", target_width),
        ("target_depth", target_depth),
    ):
        check_int(name, value, 1)
    check_choice("parametrisation", parametrisation, tuple(PRESETS))
    try:
        proxy = preset(parametrisation, width=proxy_width, depth=proxy_depth)
    except ParameterError as err:
        raise ParameterError("proxy_width", f"proxy: {err}") from None
    try:
        target = preset(parametrisation, width=target_width, depth=target_depth)
    except ParameterError as err:
        raise ParameterError("target_width", f"target: {err}") from None
    factors = lr_multipliers(target, proxy)
    rule = lr_rule(target)
    summary = measured_drifts() if drifts is None else drifts
    evidence, measured = _measured(parametrisation, (target_width, target_depth), summary)
    return TransferAdvice(
        parametrisation=parametrisation,
        lr=lr,
        proxy=(proxy_width, proxy_depth),
        target=(target_width, target_depth),
        rule=rule,
        source=SOURCES[rule],
        lrs={k: float(f"{lr * v:.12g}") for k, v in factors.items()},
        multipliers=factors,
        evidence=evidence,
        measured=measured,
        model=target.replace(
            causal=True, base_depth=proxy_depth if target.depth_alpha else target.base_depth
        ),
    )


__all__ = ["DRIFTS", "NOT_MEASURED", "TransferAdvice", "measured_drifts", "transfer_lr"]
