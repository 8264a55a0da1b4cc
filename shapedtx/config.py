"""The one configuration object shared by layers, simulator, SDE solver and trainer.

See docs/theory.md#notation and #layers for the meaning of every field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from ._validation import ParameterError, check_bool, check_choice, check_int, check_number

Attention = Literal["shaped", "softmax", "simplified", "none"]
MLPKind = Literal["shaped_relu", "relu", "gelu", "none"]
Norm = Literal["none", "pre", "post"]
NormKind = Literal["layer", "rms"]
Residual = Literal["scaled", "unit", "skipless"]
Layout = Literal["sequential", "parallel"]
Init = Literal["fan_in", "gpt2", "mup"]
AttentionScale = Literal["inverse_sqrt", "inverse"]
Slopes = Literal["fixed", "layer", "channel"]
Trainable = Literal["fixed", "trainable"]
FirstValue = Literal["matrix", "reparametrised"]

ATTENTIONS: tuple[str, ...] = ("shaped", "softmax", "simplified", "none")
MLPS: tuple[str, ...] = ("shaped_relu", "relu", "gelu", "none")
NORMS: tuple[str, ...] = ("none", "pre", "post")
NORM_KINDS: tuple[str, ...] = ("layer", "rms")
RESIDUALS: tuple[str, ...] = ("scaled", "unit", "skipless")
LAYOUTS: tuple[str, ...] = ("sequential", "parallel")
INITS: tuple[str, ...] = ("fan_in", "gpt2", "mup")
ATTENTION_SCALES: tuple[str, ...] = ("inverse_sqrt", "inverse")
SLOPES: tuple[str, ...] = ("fixed", "layer", "channel")
TRAINABLE: tuple[str, ...] = ("fixed", "trainable")
FIRST_VALUES: tuple[str, ...] = ("matrix", "reparametrised")
TAU0_RANGE = (1e-6, 1e6)
"""Accepted ``tau0``: far beyond any useful temperature, and finite SDE coefficients."""
C_RANGE = (-1e6, 1e6)
"""Accepted shaped-ReLU constants ``c_plus``, ``c_minus``."""
MLP_GAIN_RANGE = (0.0, 1e6)
"""Accepted initial MLP branch gain ``mlp_gain`` (of ``residual="skipless"``), 0 excluded."""
CHOICES: dict[str, tuple[str, ...]] = {
    "attention": ATTENTIONS,
    "mlp": MLPS,
    "norm": NORMS,
    "norm_kind": NORM_KINDS,
    "residual": RESIDUALS,
    "layout": LAYOUTS,
    "init": INITS,
    "mlp_slopes": SLOPES,
    "attention_gains": TRAINABLE,
    "temperature": TRAINABLE,
    "residual_gains": TRAINABLE,
    "first_value": FIRST_VALUES,
    "attention_scale": ATTENTION_SCALES,
}
"""The accepted values of every string field."""

GPT2_STD = 0.02
"""Weight and embedding standard deviation of ``init="gpt2"`` (GPT-2, nanoGPT), and the base
standard deviation of ``init="mup"``."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a (shaped or vanilla) Transformer at initialisation.

    Attributes:
        width: n, the residual-stream width.
        depth: d, the number of residual blocks (attention + MLP count as one block).
        attention: ``"shaped"`` (I + softmax(Y/tau) - 11^T/m), ``"softmax"`` (standard),
            ``"simplified"`` (He & Hofmann's shaped attention ``alpha I + beta Softmax(Y /
            sqrt(n_k)) - gamma C`` with trainable per-head alpha, beta, gamma initialised to
            1, W^Q zero at initialisation (so A = I there) and identity value and output
            maps: no W^V except a trainable identity-initialised one in the first block,
            no W^O, so ``out_proj`` must be False; docs/theory.md#simplified) or ``"none"``.
        mlp: ``"shaped_relu"``, ``"relu"``, ``"gelu"`` (exact erf GELU) or ``"none"``.
        mlp_ratio: MLP hidden width = ``mlp_ratio * width`` (1 in the theory models, 4 in
            GPT-2).
        norm: ``"none"``, ``"pre"`` (each branch sees LayerNorm(X): ``X + f(LN X)``) or
            ``"post"`` (LayerNorm after the residual sum: ``LN(X + f(X))``, the original
            Transformer).
        norm_kind: the normalisation of ``norm``: ``"layer"`` (LayerNorm) or ``"rms"``
            (RMSNorm: divide each token by its root mean square, no centring).
        residual: ``"scaled"`` (``lambda X + gamma f(X)``, the shaped models) or ``"unit"``
            (``X + f(X)``, as practitioners build them; ``gamma`` is then unused) or
            ``"skipless"`` (He & Hofmann's blocks, requires ``attention="simplified"`` and
            ``norm`` "none" or "pre": no attention skip, trainable scalar gains; sequential
            ``H = g_A A(N X)``, ``X' = s_M H + g_M MLP(N H)``; parallel ``X' = g_A A(N X) +
            g_M MLP(N X)``; g_A = s_M = 1 and g_M = ``mlp_gain`` at initialisation; with
            ``norm="none"`` the first block normalises its input by a LayerNorm;
            docs/theory.md#simplified).
        query_bias: the query map has a trainable bias, zero at initialisation, whatever
            ``bias`` says (He & Hofmann's code; the key bias would not change the softmax).
        first_value: the first simplified block's trainable value map: ``"matrix"`` (a
            matrix initialised to the identity) or ``"reparametrised"`` (``r W + s I`` with W
            zero-initialised and trainable scalars r = s = 1, as He & Hofmann's code builds
            it); the identity at initialisation either way (docs/theory.md#simplified).
        layout: ``"sequential"`` (attention sub-block, then MLP sub-block) or ``"parallel"``
            (both branches read the same input and are summed, GPT-J style; requires
            ``residual="skipless"``).
        mlp_gain: initial MLP branch gain g_M of ``residual="skipless"`` (0.1 in He &
            Hofmann's code, where it is meant to scale as O(1/sqrt(depth))); in (0, 1e6].
        init: ``"fan_in"`` (every weight N(0, 1/fan_in), the theory's), ``"gpt2"``
            (weights and embeddings N(0, 0.02^2), the residual output projections W^O and
            W_2 scaled by ``1/sqrt(2 depth)``, except under ``residual="skipless"``, whose
            trainable gains take that role) or ``"mup"`` (muP's init as CompleteP's reference
            runs it: every block weight N(0, 0.02^2 / m_N) with ``m_N = width /
            base_width``, no depth factor; the language model's embeddings and unembedding
            N(0, 0.02^2); docs/theory.md#transfer); see :func:`weight_std`.
        bias: the ``nn`` modules carry (zero-initialised) biases; at initialisation they do
            not change the law of the network, so the simulators ignore them.
        final_norm: the language model applies LayerNorm before the unembedding.
        heads: n_h, the number of attention heads.
        key_dim: n_k, query/key size per head (default: ``head_dim``).
        head_dim: d_p, value size per head (default ``width // heads``; may be set independently
            of ``heads``: the fixed-head-size layer of docs/theory.md#head-size).
        out_proj: whether the attention output goes through W^O (n_h d_p -> n). Without it,
            ``heads * head_dim`` must equal ``width``.
        tau0: shaped-attention temperature constant, tau = tau0 sqrt(n n_k); in [1e-6, 1e6].
        gamma: branch weight; the skip weight is lambda = sqrt(1 - gamma^2).
        c_plus, c_minus: shaped-ReLU slopes s_pm = 1 + c_pm / sqrt(n); in [-1e6, 1e6].
        causal: causal mask (and causal uniform centring for shaped attention).
        mlp_slopes: the shaped-ReLU slopes s_+, s_- during training (``mlp="shaped_relu"``):
            ``"fixed"`` (the constants of ``c_plus``, ``c_minus``), ``"layer"`` (two trainable
            scalars per block) or ``"channel"`` (two trainable slopes per hidden unit and
            block); trainable slopes start at the shaped values, so the network at
            initialisation is the fixed one (docs/theory.md#trainable-shape).
        attention_gains: ``"trainable"`` makes shaped attention ``A = alpha I + beta
            Softmax(Y/tau) - gamma_c C`` with trainable per-head alpha, beta, gamma_c
            initialised to 1 (the shaped attention at initialisation); ``"fixed"``: all 1.
        temperature: ``"trainable"`` multiplies each head's shaped-attention logits by a
            trainable inverse temperature initialised to 1 (``tau`` at initialisation).
        residual_gains: ``"trainable"`` makes the residual weights of ``residual="scaled"``
            trainable: each sub-block computes ``g_l lambda X + g_g gamma f(X)`` with its own
            trainable multipliers g_l, g_g initialised to 1 (the fixed residual at
            initialisation; multipliers, so that Adam moves the weights relative to their
            size; docs/theory.md#trainable-shape).
        log_gains: the trainable shape's gains and slopes (``attention_gains``,
            ``temperature``, ``mlp_slopes``, ``residual_gains``) are each stored as a
            parameter theta initialised to 0 and used as ``initial * exp(theta)``: the same
            network at initialisation, and Adam, which moves theta by about its lr per step,
            moves each gain by a share of itself however far it has shrunk (default False:
            the parameter is the gain; docs/theory.md#trainable-shape). Requires one of them
            trainable and nonzero initial slopes.
        gamma_t: the shaped model's depth rule (``residual="scaled"``): if > 0, ``gamma`` is
            derived as ``sqrt(gamma_t * width / depth)``, so that ``gamma^2 d / n = gamma_t``
            at every depth and width (the law of the covariance SDE at the network's end
            depends on gamma and T = d / n through gamma^2 T, docs/theory.md#transfer); a
            given ``gamma`` is then replaced. ``0`` (default): ``gamma`` as given. In [0, 1e6];
            the derived gamma must be at most 1.
        depth_alpha: residual-branch multiplier of ``residual="unit"``: ``X + (depth /
            base_depth)^(-depth_alpha) f(X)``. ``0`` (default): ``X + f(X)``; ``0.5``:
            depth-muP (Yang et al. 2023, Tensor Programs VI; Bordelon et al. 2023); ``1``:
            CompleteP (Dey et al. 2025). In [0, 1] (docs/theory.md#transfer).
        base_depth: the depth at which the ``depth_alpha`` multiplier is 1 (default 1: the
            multiplier is ``depth^(-depth_alpha)``).
        attention_scale: the softmax attention's logit scale: ``"inverse_sqrt"`` (default,
            ``q k^T / sqrt(n_k)``) or ``"inverse"`` (``q k^T / n_k``, muP's, as CompleteP's
            reference runs it; docs/theory.md#transfer). ``"inverse"`` requires
            ``attention="softmax"``.
        base_width: the width at which muP's width multiplier ``m_N = width / base_width``
            is 1: it sets ``init="mup"``'s block-weight variance and the
            ``output_multiplier`` (default 1; unused otherwise).
        output_multiplier: the language model's unembedding reads the last hidden state times
            ``1 / m_N = base_width / width`` (muP's output multiplier, as CompleteP's reference
            runs it; its Adam lr is then width-independent, :func:`shapedtx.lr_multipliers`).
            Default False: no multiplier.
    """

    width: int = 200
    depth: int = 150
    attention: Attention = "shaped"
    mlp: MLPKind = "none"
    mlp_ratio: int = 1
    norm: Norm = "none"
    norm_kind: NormKind = "layer"
    residual: Residual = "scaled"
    layout: Layout = "sequential"
    query_bias: bool = False
    first_value: FirstValue = "matrix"
    mlp_gain: float = 0.1
    init: Init = "fan_in"
    bias: bool = False
    final_norm: bool = False
    heads: int = 1
    # None (the default) is replaced in __post_init__, so the attributes are always ints;
    # typed as such for the readers (the constructor accepts None, see Attributes).
    key_dim: int = None  # type: ignore[assignment]  # derived in __post_init__
    head_dim: int = None  # type: ignore[assignment]  # derived in __post_init__
    out_proj: bool = False
    tau0: float = 1.0
    gamma: float = 2**-1.5
    c_plus: float = 0.0
    c_minus: float = -1.0
    causal: bool = False
    mlp_slopes: Slopes = "fixed"
    attention_gains: Trainable = "fixed"
    temperature: Trainable = "fixed"
    residual_gains: Trainable = "fixed"
    log_gains: bool = False
    gamma_t: float = 0.0
    depth_alpha: float = 0.0
    base_depth: int = 1
    attention_scale: AttentionScale = "inverse_sqrt"
    base_width: int = 1
    output_multiplier: bool = False

    def __post_init__(self) -> None:
        check_int("width", self.width, 1)
        check_int("depth", self.depth, 1)
        for name, choices in CHOICES.items():
            check_choice(name, getattr(self, name), choices)
        check_int("mlp_ratio", self.mlp_ratio, 1)
        if self.attention == "none" and self.mlp == "none":
            raise ParameterError(
                "attention", "attention and mlp cannot both be 'none' (the block would be empty)"
            )
        check_int("heads", self.heads, 1)
        if self.head_dim is None:
            if self.width % self.heads:
                raise ParameterError(
                    "heads",
                    f"heads must divide width when head_dim is not given, "
                    f"got width={self.width}, heads={self.heads}",
                )
            object.__setattr__(self, "head_dim", self.width // self.heads)
        check_int("head_dim", self.head_dim, 1)
        if self.key_dim is None:
            object.__setattr__(self, "key_dim", self.head_dim)
        check_int("key_dim", self.key_dim, 1)
        for name in (
            "out_proj",
            "causal",
            "bias",
            "final_norm",
            "query_bias",
            "output_multiplier",
            "log_gains",
        ):
            check_bool(name, getattr(self, name))
        check_int("base_width", self.base_width, 1)
        if self.attention_scale != "inverse_sqrt" and self.attention != "softmax":
            raise ParameterError(
                "attention_scale",
                f"attention_scale={self.attention_scale!r} requires attention='softmax' (it is "
                f"the softmax's logit scale), got attention={self.attention!r}",
            )
        self._check_simplified()
        self._check_trainable_shape()
        if (
            self.attention != "none"
            and not self.out_proj
            and self.heads * self.head_dim != self.width
        ):
            raise ParameterError(
                "head_dim",
                f"head_dim must equal width / heads when out_proj is False "
                f"(heads * head_dim = {self.heads * self.head_dim}, width = {self.width}); "
                f"set out_proj=True for a fixed head size",
            )
        # stored as the checked Python floats (NumPy scalars would leak into derived values)
        # bounded so that every derived constant (tau, the SDE's 1 / tau0^2 terms, the ReLU
        # normaliser) is a finite float64 far from overflow
        object.__setattr__(self, "tau0", check_number("tau0", self.tau0, *TAU0_RANGE))
        object.__setattr__(
            self, "gamma", check_number("gamma", self.gamma, 0.0, 1.0, low_open=True)
        )
        self._check_depth_rules()
        for name in ("c_plus", "c_minus"):
            object.__setattr__(self, name, check_number(name, getattr(self, name), *C_RANGE))
        if self.mlp == "shaped_relu":
            root = math.sqrt(self.width)
            slopes = {
                name: shaped_relu_slope(getattr(self, name), self.width)
                for name in ("c_plus", "c_minus")
            }
            for name, slope in slopes.items():
                if slope < 0:
                    raise ParameterError(
                        name,
                        f"{name} must be >= -sqrt(width) = {-root:.4g} "
                        f"(the slope 1 + {name}/sqrt(width) must be non-negative), "
                        f"got {getattr(self, name)!r}",
                    )
            if not any(slopes.values()):
                raise ParameterError(
                    "c_minus",
                    f"c_plus and c_minus must not both be -sqrt(width) = {-root:.4g}: both "
                    "slopes 0 make the MLP identically zero (its normaliser 2 / (s_+^2 + s_-^2) "
                    "is undefined)",
                )
            if self.log_gains and self.mlp_slopes != "fixed" and not all(slopes.values()):
                raise ParameterError(
                    "log_gains",
                    f"log_gains=True requires nonzero initial slopes (0 * exp(theta) stays 0), "
                    f"got c_plus={self.c_plus}, c_minus={self.c_minus} (a slope 0)",
                )

    def _check_depth_rules(self) -> None:
        """``gamma_t`` (derives gamma) and ``depth_alpha`` / ``base_depth`` (branch multiplier)."""
        object.__setattr__(self, "gamma_t", check_number("gamma_t", self.gamma_t, 0.0, 1e6))
        object.__setattr__(
            self, "depth_alpha", check_number("depth_alpha", self.depth_alpha, 0.0, 1.0)
        )
        check_int("base_depth", self.base_depth, 1)
        if self.gamma_t > 0:
            if self.residual != "scaled":
                raise ParameterError(
                    "gamma_t",
                    f"gamma_t > 0 requires residual='scaled' (it sets the branch weight gamma), "
                    f"got residual={self.residual!r}",
                )
            gamma = math.sqrt(self.gamma_t * self.width / self.depth)
            if gamma > 1.0:
                raise ParameterError(
                    "gamma_t",
                    f"gamma_t must give gamma = sqrt(gamma_t * width / depth) <= 1, i.e. "
                    f"gamma_t <= depth / width = {self.depth / self.width:.4g}, got "
                    f"gamma_t={self.gamma_t!r} (gamma = {gamma:.4g})",
                )
            object.__setattr__(self, "gamma", gamma)
        if self.depth_alpha > 0 and self.residual != "unit":
            raise ParameterError(
                "depth_alpha",
                f"depth_alpha > 0 requires residual='unit' (X + m f(X)), got "
                f"residual={self.residual!r}",
            )

    def _check_trainable_shape(self) -> None:
        """Trainable slopes need the shaped ReLU, trainable attention gains and temperature
        the shaped attention, trainable residual weights the scaled residual
        (docs/theory.md#trainable-shape)."""
        if self.residual_gains != "fixed" and self.residual != "scaled":
            raise ParameterError(
                "residual_gains",
                f"residual_gains={self.residual_gains!r} requires residual='scaled' (the "
                f"weights are its lambda and gamma), got residual={self.residual!r}",
            )
        if self.mlp_slopes != "fixed" and self.mlp != "shaped_relu":
            raise ParameterError(
                "mlp_slopes",
                f"mlp_slopes={self.mlp_slopes!r} requires mlp='shaped_relu' (the slopes are "
                f"the shaped ReLU's), got mlp={self.mlp!r}",
            )
        for name in ("attention_gains", "temperature"):
            if getattr(self, name) != "fixed" and self.attention != "shaped":
                raise ParameterError(
                    name,
                    f"{name}='trainable' requires attention='shaped', got "
                    f"attention={self.attention!r}",
                )
        trainable = [
            name
            for name in ("mlp_slopes", "attention_gains", "temperature", "residual_gains")
            if getattr(self, name) != "fixed"
        ]
        if self.log_gains and not trainable:
            raise ParameterError(
                "log_gains",
                "log_gains=True requires a trainable shape (mlp_slopes, attention_gains, "
                "temperature or residual_gains not 'fixed'), got none",
            )

    def _check_simplified(self) -> None:
        """The rules of the simplified (He & Hofmann) attention, residual and layout."""
        if self.attention == "simplified" and self.out_proj:
            raise ParameterError(
                "out_proj",
                "out_proj must be False for attention='simplified' (its value and output "
                "maps are the identity, docs/theory.md#simplified)",
            )
        if self.first_value != "matrix" and self.attention != "simplified":
            raise ParameterError(
                "first_value",
                f"first_value={self.first_value!r} requires attention='simplified' (only its "
                f"first block has a trainable value map), got attention={self.attention!r}",
            )
        if self.residual == "skipless":
            if self.attention != "simplified":
                raise ParameterError(
                    "residual",
                    f"residual='skipless' requires attention='simplified' (without an "
                    f"attention skip the identity in A carries the signal), got "
                    f"attention={self.attention!r}",
                )
            if self.norm == "post":
                raise ParameterError(
                    "residual", "residual='skipless' requires norm 'none' or 'pre', got 'post'"
                )
        if self.layout == "parallel" and self.residual != "skipless":
            raise ParameterError(
                "layout",
                f"layout='parallel' requires residual='skipless', got residual={self.residual!r}",
            )
        object.__setattr__(
            self,
            "mlp_gain",
            check_number("mlp_gain", self.mlp_gain, *MLP_GAIN_RANGE, low_open=True),
        )

    # Derived quantities -----------------------------------------------------------------
    @property
    def lam(self) -> float:
        """Skip weight: lambda = sqrt(1 - gamma^2) (``residual="scaled"``), 1 (``"unit"``)."""
        if self.residual == "unit":
            return 1.0
        return math.sqrt(max(1.0 - self.gamma**2, 0.0))

    @property
    def branch_weight(self) -> float:
        """Branch weight: gamma (``residual="scaled"``), ``(depth / base_depth)^(-depth_alpha)``
        (``"unit"``: 1 unless ``depth_alpha`` is set)."""
        return self.depth_multiplier if self.residual == "unit" else self.gamma

    @property
    def depth_multiplier(self) -> float:
        """``(depth / base_depth)^(-depth_alpha)``: the residual-branch multiplier of
        ``residual="unit"`` (1 when ``depth_alpha`` is 0; docs/theory.md#transfer)."""
        return float((self.depth / self.base_depth) ** (-self.depth_alpha))

    @property
    def width_multiplier(self) -> float:
        """muP's ``m_N = width / base_width`` (of ``init="mup"`` and ``output_multiplier``)."""
        return self.width / self.base_width

    @property
    def softmax_scale(self) -> float:
        """The softmax attention's logit scale: ``1 / sqrt(n_k)``, or ``1 / n_k`` under
        ``attention_scale="inverse"`` (also the simplified attention's ``1 / sqrt(n_k)``)."""
        if self.attention_scale == "inverse":
            return 1.0 / self.key_dim
        return 1.0 / math.sqrt(self.key_dim)

    @property
    def mlp_width(self) -> int:
        """MLP hidden width ``mlp_ratio * width``."""
        return self.mlp_ratio * self.width

    @property
    def tau(self) -> float:
        """Shaped-attention temperature tau = tau0 sqrt(n n_k) (docs/theory.md#layers)."""
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

    def unused_fields(self) -> dict[str, str]:
        """The fields that have no effect on this model, each with the reason (e.g.
        ``{"tau0": "attention='softmax' (tau0 is the shaped-attention temperature)"}``): the
        command line refuses an option it would ignore."""
        unused: dict[str, str] = {}
        if self.attention == "none":
            for name in (
                "heads",
                "key_dim",
                "head_dim",
                "out_proj",
                "tau0",
                "causal",
                "query_bias",
            ):
                unused[name] = "attention='none' (no attention)"
        elif self.attention in ("softmax", "simplified"):
            unused["tau0"] = (
                f"attention={self.attention!r} (tau0 is the shaped-attention temperature)"
            )
        if self.mlp == "none":
            unused["mlp_ratio"] = "mlp='none' (no MLP)"
        if self.mlp != "shaped_relu":
            for name in ("c_plus", "c_minus"):
                unused[name] = f"mlp={self.mlp!r} (c_+ and c_- shape the shaped-ReLU MLP)"
        if self.residual == "unit":
            unused["gamma"] = "residual='unit' (X + f(X) has no branch weight)"
        if self.gamma_t > 0:
            unused["gamma"] = "gamma_t > 0 (gamma = sqrt(gamma_t * width / depth))"
        if self.depth_alpha == 0:
            unused["base_depth"] = "depth_alpha=0 (base_depth sets the depth_alpha multiplier)"
        if self.residual == "skipless":
            unused["gamma"] = "residual='skipless' (its branch gains are trainable parameters)"
        if self.residual != "skipless" or self.mlp == "none":
            unused["mlp_gain"] = "mlp_gain is the MLP branch gain of residual='skipless'"
        if self.norm == "none":
            unused["norm_kind"] = "norm='none' (no normalisation in the blocks)"
        if self.init != "mup" and not self.output_multiplier:
            unused["base_width"] = (
                "base_width sets init='mup' and output_multiplier, neither of which is in use"
            )
        if self.attention != "softmax":
            unused["attention_scale"] = "attention_scale is the softmax attention's logit scale"
        return unused

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
        """Inverse of :meth:`to_attrs` (ignores unrelated keys; a missing field takes its
        default). ValueError if no key starts with ``prefix`` or a value has the wrong type."""
        return cls(**_fields_from_attrs(cls, FIELD_TYPES, attrs, prefix))


def shaped_relu_slope(c: float, width: int) -> float:
    """The shaped-ReLU slope ``1 + c / sqrt(width)`` of ``c_plus`` or ``c_minus``
    (docs/theory.md#layers)."""
    return 1.0 + c / math.sqrt(width)


def check_config(config: Any, name: str = "config") -> ModelConfig:
    """``config`` if it is a :class:`ModelConfig`; else ParameterError naming ``name``."""
    if not isinstance(config, ModelConfig):
        raise ParameterError(
            name, f"{name} must be a shapedtx.ModelConfig, got {type(config).__name__}"
        )
    return config


def weight_std(config: ModelConfig, name: str, fan_in: int) -> float:
    """Initial standard deviation of the weight matrix ``name`` with ``fan_in`` inputs.

    ``init="fan_in"``: ``1/sqrt(fan_in)``. ``init="gpt2"``: 0.02, and ``0.02 / sqrt(2 depth)``
    for the residual output projections ``"out"`` (W^O) and ``"mlp_out"`` (W_2), as GPT-2
    and nanoGPT do; not under ``residual="skipless"`` (He & Hofmann's blocks draw every
    weight N(0, 0.02^2) and scale the MLP branch by the gain ``mlp_gain`` instead).
    ``init="mup"``: ``0.02 / sqrt(m_N)`` for every block weight, ``m_N = width / base_width``
    (muP's hidden-weight variance ~ 1/width, without GPT-2's depth factor, as CompleteP's
    reference runs it; docs/theory.md#transfer).
    """
    if config.init == "fan_in":
        return 1.0 / math.sqrt(fan_in)
    if config.init == "mup":
        return GPT2_STD / math.sqrt(config.width_multiplier)
    if name in ("out", "mlp_out") and config.residual != "skipless":
        return GPT2_STD / math.sqrt(2 * config.depth)
    return GPT2_STD


def _fields_from_attrs(
    cls: type, types: dict[str, type], attrs: dict[str, Any], prefix: str
) -> dict[str, Any]:
    """Keyword arguments of the dataclass ``cls`` read back from flat attrs (the keys
    ``prefix + field`` that are present; ``types``: :func:`_field_types`). Strict: an int
    field takes an integral number, a bool field a bool or 0/1, a float field a real number,
    a str field a string; anything else is a ValueError naming the key, as is attrs with no
    key starting with ``prefix`` (not a saved configuration)."""
    if not any(isinstance(key, str) and key.startswith(prefix) for key in attrs):
        raise ParameterError(
            "attrs", f"attrs hold no {cls.__name__}: no key starts with {prefix!r}"
        )
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if key in attrs:
            kwargs[f.name] = _read_attr(key, attrs[key], types[f.name])
    return kwargs


def _read_attr(key: str, value: Any, kind: type) -> Any:
    """``value`` (a Python or NumPy scalar) as ``kind``; ValueError naming ``key`` if it is
    not one (see :func:`_fields_from_attrs`)."""
    value = value.item() if hasattr(value, "item") else value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is bool and (isinstance(value, bool) or (number and value in (0, 1))):
        return bool(value)
    if kind is int and number and float(value).is_integer():
        return int(value)
    if kind is float and number:
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    what = {bool: "True/False or 0/1", int: "an integer", float: "a number", str: "a string"}
    raise ParameterError("attrs", f"attrs[{key!r}] must be {what[kind]}, got {value!r}")


def _field_types(cls: type, optional_ints: tuple[str, ...] = ()) -> dict[str, type]:
    """Field name -> the type that reads it back from attrs (bool, int, float or str) of the
    dataclass ``cls``, from each field's default; ``optional_ints``: int fields whose default
    is None (derived in ``__post_init__``)."""
    types: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        default = f.default
        if isinstance(default, bool):
            types[f.name] = bool
        elif isinstance(default, int) or f.name in optional_ints:
            types[f.name] = int
        elif isinstance(default, float):
            types[f.name] = float
        else:
            types[f.name] = str
    return types


FIELD_TYPES: dict[str, type] = _field_types(ModelConfig, ("key_dim", "head_dim"))
"""Every ModelConfig field and its type (bool, int, float or str): the one field list."""
