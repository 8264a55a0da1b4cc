"""The one configuration object shared by layers, simulator, SDE solver and trainer.

See THEORY.md sections 1-2 for the meaning of every field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from ._validation import check_int

Attention = Literal["shaped", "softmax", "none"]
MLPKind = Literal["shaped_relu", "relu", "none"]
Norm = Literal["none", "pre"]

ATTENTIONS: tuple[str, ...] = ("shaped", "softmax", "none")
MLPS: tuple[str, ...] = ("shaped_relu", "relu", "none")
NORMS: tuple[str, ...] = ("none", "pre")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def _check_finite(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a (shaped or vanilla) Transformer at initialisation.

    Attributes:
        width: n, the residual-stream width.
        depth: d, the number of residual blocks (attention + MLP count as one block).
        attention: ``"shaped"`` (I + softmax(Y/tau) - 11^T/m), ``"softmax"`` (standard) or
            ``"none"``.
        mlp: ``"shaped_relu"``, ``"relu"`` or ``"none"``.
        norm: ``"none"`` or ``"pre"`` (pre-LN: each branch sees LayerNorm(X)).
        heads: n_h, the number of attention heads.
        key_dim: n_k, query/key size per head (default: ``head_dim``).
        head_dim: d_p, value size per head (default ``width // heads``; may be set independently
            of ``heads``: the fixed-head-size layer of THEORY section 8).
        out_proj: whether the attention output goes through W^O (n_h d_p -> n). Without it,
            ``heads * head_dim`` must equal ``width``.
        tau0: shaped-attention temperature constant, tau = tau0 sqrt(n n_k).
        gamma: branch weight; the skip weight is lambda = sqrt(1 - gamma^2).
        c_plus, c_minus: shaped-ReLU slopes s_pm = 1 + c_pm / sqrt(n).
        causal: causal mask (and causal uniform centring for shaped attention).
    """

    width: int = 200
    depth: int = 150
    attention: Attention = "shaped"
    mlp: MLPKind = "none"
    norm: Norm = "none"
    heads: int = 1
    key_dim: int | None = None
    head_dim: int | None = None
    out_proj: bool = False
    tau0: float = 1.0
    gamma: float = 2**-1.5
    c_plus: float = 0.0
    c_minus: float = -1.0
    causal: bool = False

    def __post_init__(self) -> None:
        check_int("width", self.width, 1)
        check_int("depth", self.depth, 1)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_choice("mlp", self.mlp, MLPS)
        _check_choice("norm", self.norm, NORMS)
        if self.attention == "none" and self.mlp == "none":
            raise ValueError("attention and mlp cannot both be 'none' (the block would be empty)")
        check_int("heads", self.heads, 1)
        if self.head_dim is None:
            if self.width % self.heads:
                raise ValueError(
                    f"heads must divide width when head_dim is not given, "
                    f"got width={self.width}, heads={self.heads}"
                )
            object.__setattr__(self, "head_dim", self.width // self.heads)
        check_int("head_dim", self.head_dim, 1)
        if self.key_dim is None:
            object.__setattr__(self, "key_dim", self.head_dim)
        check_int("key_dim", self.key_dim, 1)
        if not isinstance(self.out_proj, bool):
            raise ValueError(f"out_proj must be True or False, got {self.out_proj!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        if (
            self.attention != "none"
            and not self.out_proj
            and self.heads * self.head_dim != self.width
        ):
            raise ValueError(
                f"head_dim must equal width / heads when out_proj is False "
                f"(heads * head_dim = {self.heads * self.head_dim}, width = {self.width}); "
                f"set out_proj=True for a fixed head size"
            )
        _check_finite("tau0", self.tau0)
        if self.tau0 <= 0:
            raise ValueError(f"tau0 must be > 0, got {self.tau0!r}")
        _check_finite("gamma", self.gamma)
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma!r}")
        _check_finite("c_plus", self.c_plus)
        _check_finite("c_minus", self.c_minus)
        if self.mlp == "shaped_relu":
            for name in ("c_plus", "c_minus"):
                if 1 + getattr(self, name) / math.sqrt(self.width) < 0:
                    raise ValueError(
                        f"{name} must be >= -sqrt(width) = {-math.sqrt(self.width):.4g} "
                        f"(the slope 1 + {name}/sqrt(width) must be non-negative)"
                    )

    # Derived quantities -----------------------------------------------------------------
    @property
    def lam(self) -> float:
        """Skip weight lambda = sqrt(1 - gamma^2)."""
        return math.sqrt(max(1.0 - self.gamma**2, 0.0))

    @property
    def tau(self) -> float:
        """Shaped-attention temperature tau = tau0 sqrt(n n_k) (THEORY section 2)."""
        return self.tau0 * math.sqrt(self.width * self.key_dim)

    @property
    def T(self) -> float:
        """Depth-to-width ratio d / n (the SDE time horizon)."""
        return self.depth / self.width

    @property
    def value_dim(self) -> int:
        """Total value size n_h d_p (the attention output width before W^O)."""
        return self.heads * self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # Serialisation (netCDF-safe flat attributes) ------------------------------------------
    def to_attrs(self, prefix: str = "config.") -> dict[str, int | float | str]:
        """Flat, netCDF-safe dictionary (bools as 0/1) with keys ``prefix + field``."""
        out: dict[str, int | float | str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[prefix + f.name] = int(value) if isinstance(value, bool) else value
        return out

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], prefix: str = "config.") -> ModelConfig:
        """Inverse of :meth:`to_attrs` (ignores unrelated keys)."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = prefix + f.name
            if key not in attrs:
                continue
            value = attrs[key]
            if hasattr(value, "item"):
                value = value.item()
            if f.name in ("out_proj", "causal"):
                value = bool(value)
            elif f.name in ("width", "depth", "heads", "key_dim", "head_dim"):
                value = int(value)
            elif f.name in ("tau0", "gamma", "c_plus", "c_minus"):
                value = float(value)
            else:
                value = str(value)
            kwargs[f.name] = value
        return cls(**kwargs)
