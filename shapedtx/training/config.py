"""Optimisation settings of the language-model trainer (the architecture is ``ModelConfig``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from .._validation import ParameterError, check_choice, check_int, check_number
from ..config import _field_types, _fields_from_attrs

Schedule = Literal["cosine", "wsd"]
SCHEDULES: tuple[str, ...] = ("cosine", "wsd")
Autocast = Literal["none", "bfloat16"]
AUTOCASTS: tuple[str, ...] = ("none", "bfloat16")
EpsScaling = Literal["constant", "completep"]
EPS_SCALINGS: tuple[str, ...] = ("constant", "completep")


@dataclass(frozen=True)
class TrainConfig:
    """Causal byte-level language-model training (AdamW, warm-up + decay, clipping).

    Attributes:
        steps: optimiser steps in total (the token budget is ``steps * batch_size * seq_len``).
        batch_size: sequences per step.
        seq_len: m, tokens (bytes) per sequence.
        lr: peak learning rate, reached after ``warmup_steps`` (linear warm-up from 0).
        min_lr_ratio: the decay ends at ``lr * min_lr_ratio`` at ``steps``.
        warmup_steps: linear warm-up length (``< steps``); default ``min(50, steps // 10)``.
        schedule: ``"cosine"`` (warm-up, then cosine decay over the remaining steps) or
            ``"wsd"`` (warmup-stable-decay: warm-up, constant ``lr`` until
            :attr:`cooldown_start`, then a linear cooldown to ``lr * min_lr_ratio``; Hagele et
            al. 2024). Two WSD runs that differ only in ``steps`` follow the same learning
            rates up to the earlier cooldown start, so a shorter horizon branches from a
            checkpoint of a longer run (``train(..., branch_from=...)``).
        cooldown_fraction: WSD only: the cooldown's share of ``steps`` (rounded to a step).
        weight_decay: AdamW decoupled weight decay, applied to weight matrices only (the
            linear maps and the token embedding; not biases, gains, position embeddings).
        beta1, beta2, eps: AdamW moments.
        grad_clip: maximum global gradient norm (``0`` disables clipping).
        log_interval: steps between log rows (train loss, lr, gradient norms, covariance
            metrics on the fixed batch); the only steps at which the device is synchronised.
        eval_interval: steps between held-out evaluations (a multiple of ``log_interval``).
        eval_batches: batches of ``batch_size`` fixed validation windows per evaluation.
        metrics_batch: sequences in the fixed batch on which token covariances are measured.
        checkpoint_interval: steps between checkpoints (a multiple of ``log_interval``;
            ``0``: only at the end).
        seed: seeds the initialisation and the data order.
        autocast: ``"none"`` (default: every operation in the model's dtype) or
            ``"bfloat16"``: the forward and backward passes run under
            ``torch.autocast(dtype=torch.bfloat16)`` (matrix products in bfloat16, the loss,
            the weights, their gradients and AdamW in the model's dtype): about twice the
            matrix throughput on a GPU. Part of the run's identity (a checkpoint resumes
            only with the same value).
        lr_proxy_width, lr_proxy_depth: the proxy at which ``lr`` was tuned: when both are
            set, each parameter group trains at ``lr`` times the factor its parametrisation's
            transfer rule gives from the proxy to the model (:func:`shapedtx.lr_multipliers`,
            docs/guide/transfer.md). ``0`` (default, both): ``lr`` for every parameter.
        vector_lr_factor: the blocks' vectors (biases, norm gains and the shaped model's
            trainable gains and slopes: the ``block_vector`` group of
            :meth:`shapedtx.training.LanguageModel.parameter_groups`) train at ``lr`` times this
            factor, times their transfer factor if any (default 1). Adam moves a parameter by
            about its lr per step whatever its size, so a gain that has shrunk to 0.15 moves
            by a larger share of itself than a matrix entry does (docs/guide/training.md).
        eps_scaling: ``"constant"`` (default: AdamW's epsilon is ``eps``) or ``"completep"``:
            ``eps`` times CompleteP's ``m_N^-1 m_L^-a`` from the proxy (``lr_proxy_width``,
            ``lr_proxy_depth``, which must be set) to the model, for every parameter group as
            CompleteP's reference applies it (:func:`shapedtx.eps_multiplier`,
            docs/theory.md#transfer).

    Defaults: ``steps=1000, batch_size=16, seq_len=64, lr=1e-3, min_lr_ratio=0.1,
    warmup_steps=None, schedule="cosine", cooldown_fraction=0.2, weight_decay=0.0, beta1=0.9,
    beta2=0.99, eps=1e-8, grad_clip=1.0,
    log_interval=10, eval_interval=50, eval_batches=4, metrics_batch=4,
    checkpoint_interval=100, seed=0, lr_proxy_width=0, lr_proxy_depth=0, autocast="none",
    eps_scaling="constant", vector_lr_factor=1.0``. :func:`completep_reference_train` gives
    CompleteP's reference settings (beta2 0.95, epsilon 1e-12 scaled by
    ``eps_scaling="completep"``).

    The architecture, the readout LayerNorm included (``ModelConfig.final_norm``), is the
    ``ModelConfig``.
    """

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    # None (the default) is replaced in __post_init__: the attribute is always an int.
    warmup_steps: int = None  # type: ignore[assignment]  # derived in __post_init__
    schedule: Schedule = "cosine"
    cooldown_fraction: float = 0.2
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    grad_clip: float = 1.0
    log_interval: int = 10
    eval_interval: int = 50
    eval_batches: int = 4
    metrics_batch: int = 4
    checkpoint_interval: int = 100
    seed: int = 0
    lr_proxy_width: int = 0
    lr_proxy_depth: int = 0
    autocast: Autocast = "none"
    eps_scaling: EpsScaling = "constant"
    vector_lr_factor: float = 1.0

    def __post_init__(self) -> None:
        check_int("steps", self.steps, 1)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", min(50, self.steps // 10))
        for name, minimum in (
            ("steps", 1),
            ("batch_size", 1),
            ("seq_len", 2),
            ("warmup_steps", 0),
            ("log_interval", 1),
            ("eval_interval", 1),
            ("eval_batches", 1),
            ("metrics_batch", 1),
            ("checkpoint_interval", 0),
            ("seed", 0),
            ("lr_proxy_width", 0),
            ("lr_proxy_depth", 0),
        ):
            check_int(name, getattr(self, name), minimum)
        # stored as the checked Python floats (NumPy scalars would leak into the optimiser)
        for name, low, high, low_open in (
            ("lr", 0.0, 10.0, True),
            ("min_lr_ratio", 0.0, 1.0, False),
            ("weight_decay", 0.0, 1.0, False),
            ("beta1", 0.0, 0.999999, False),
            ("beta2", 0.0, 0.999999, False),
            ("eps", 0.0, 1.0, True),
            ("grad_clip", 0.0, 1e6, False),
            ("cooldown_fraction", 0.0, 1.0, True),
            ("vector_lr_factor", 0.0, 1e3, True),
        ):
            value = check_number(name, getattr(self, name), low, high, low_open=low_open)
            object.__setattr__(self, name, value)
        if self.warmup_steps >= self.steps:
            raise ParameterError(
                "warmup_steps",
                f"warmup_steps must be < steps, got warmup_steps={self.warmup_steps}, "
                f"steps={self.steps}",
            )
        if (self.lr_proxy_width == 0) != (self.lr_proxy_depth == 0):
            raise ParameterError(
                "lr_proxy_width",
                f"lr_proxy_width and lr_proxy_depth must both be set (> 0) or both be 0, got "
                f"{self.lr_proxy_width} and {self.lr_proxy_depth}",
            )
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("autocast", self.autocast, AUTOCASTS)
        check_choice("eps_scaling", self.eps_scaling, EPS_SCALINGS)
        if self.eps_scaling != "constant" and not self.lr_proxy_width:
            raise ParameterError(
                "eps_scaling",
                f"eps_scaling={self.eps_scaling!r} scales epsilon from the proxy: it requires "
                f"lr_proxy_width and lr_proxy_depth (> 0), got {self.lr_proxy_width} and "
                f"{self.lr_proxy_depth}",
            )
        if self.schedule == "wsd" and self.cooldown_start < self.warmup_steps:
            raise ParameterError(
                "cooldown_fraction",
                f"cooldown_fraction must leave the warm-up before the cooldown "
                f"(cooldown starts at step {self.cooldown_start} = steps - "
                f"round(cooldown_fraction * steps), warmup_steps={self.warmup_steps}), got "
                f"cooldown_fraction={self.cooldown_fraction}",
            )
        for name in ("eval_interval", "checkpoint_interval"):
            value = getattr(self, name)
            if value % self.log_interval:
                raise ParameterError(
                    name,
                    f"{name} must be a multiple of log_interval={self.log_interval}, got {value}",
                )

    @property
    def cooldown_start(self) -> int:
        """WSD: the 0-based step at which the linear cooldown begins (``steps`` for cosine)."""
        if self.schedule != "wsd":
            return self.steps
        return self.steps - max(1, round(self.cooldown_fraction * self.steps))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_attrs(self, prefix: str = "train.") -> dict[str, int | float]:
        """Flat netCDF-safe dictionary (bools as 0/1) with keys ``prefix + field``."""
        out: dict[str, int | float] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[prefix + f.name] = int(value) if isinstance(value, bool) else value
        return out

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], prefix: str = "train.") -> TrainConfig:
        """Inverse of :meth:`to_attrs` (ignores unrelated keys; a missing field takes its
        default). ValueError if no key starts with ``prefix`` or a value has the wrong type."""
        return cls(**_fields_from_attrs(cls, _FIELD_TYPES, attrs, prefix))


COMPLETEP_REFERENCE: dict[str, Any] = {"beta2": 0.95, "eps": 1e-12, "eps_scaling": "completep"}
"""The AdamW settings of CompleteP's reference (EleutherAI/nanoGPT-mup, branch ``completep``:
``beta2 = 0.95``, base epsilon ``1e-12`` scaled by ``m_N^-1 m_L^-a``; docs/guide/transfer.md)."""


def completep_reference_train(base_width: int, base_depth: int, **fields: Any) -> TrainConfig:
    """A :class:`TrainConfig` with CompleteP's reference AdamW settings
    (:data:`COMPLETEP_REFERENCE`) and its lr and epsilon rules taken from the base model
    (``lr_proxy_width=base_width``, ``lr_proxy_depth=base_depth``: the reference's base
    shape, whose depth is the smallest one trained); ``fields`` set the rest (steps, lr, ...)
    and may override any of these. Pair it with ``preset("pre_ln_completep_ref",
    base_width=base_width, base_depth=base_depth)``.

    >>> completep_reference_train(64, 4, lr=2**-7).eps
    1e-12
    """
    return TrainConfig(
        **{
            **COMPLETEP_REFERENCE,
            "lr_proxy_width": base_width,
            "lr_proxy_depth": base_depth,
            **fields,
        }
    )


_FIELD_TYPES = _field_types(TrainConfig, ("warmup_steps",))
"""Every TrainConfig field and the type that reads it back from attrs."""
