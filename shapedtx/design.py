"""Depth, width and head-size design rules (docs/theory.md#depth-width and #head-size).

Conventions: ``L`` = depth (number of residual blocks), ``d`` = width (d_x, the residual
stream), size ``N = 12 L d^2`` (non-embedding, d_ff = 4 d; docs/theory.md#depth-width).

The fitted optimal width ``ln d*(L) = a + b L`` with ``a = 5.039``, ``b = 0.0555`` is *not*
taken from [LW] directly: it is the restatement of the [LW] fit by the BigScience workshop,
as written in docs/theory.md#depth-width. Its checks (GPT-3 175B: L* ~ 80.5, d* ~ 13.4K; 1T
parameters: L* ~ 94.7, d* ~ 29.6K against the paper's quoted depth 92 and width 30K) are reproduced
by the tests, which is all the evidence this module has for the constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.special import lambertw

from ._validation import ParameterError, check_bool, check_int, check_number, check_positive
from .config import ModelConfig, check_config


@dataclass(frozen=True)
class DepthWidthFit:
    """Fitted optimal width per depth, ``ln d*(L) = a + b L`` (docs/theory.md#depth-width)."""

    a: float
    b: float

    def __post_init__(self) -> None:
        check_positive("a", self.a)
        check_positive("b", self.b)


#: BigScience restatement of the [LW] fit (docs/theory.md#depth-width): ln d*(L) = 5.039 + 0.0555 L.
LW_FIT = DepthWidthFit(a=5.039, b=0.0555)

DEFAULT_MULTIPLE = 128
"""Default width multiple of the rounded shape (:func:`optimal_shape`, :func:`design_row`,
:func:`gpt3_table`, ``shapedtx design --multiple``): widths of multiples of 128 suit head sizes
of 64 or 128 and GPU tiles. One default for Python and the CLI, so both give one answer."""

# GPT-3 family: Brown et al., "Language Models are Few-Shot Learners" (arXiv 2005.14165),
# Table 2.1 (n_layers, d_model, n_heads, d_head; context 2048 tokens for every size).
# The 13B row prints d_model = 5140 although 40 heads x 128 = 5120; kept as printed.
GPT3_CONTEXT = 2048
GPT3_MODELS: tuple[tuple[str, int, int, int, int], ...] = (
    # name, depth, width, heads, head size
    ("GPT-3 Small (125M)", 12, 768, 12, 64),
    ("GPT-3 Medium (350M)", 24, 1024, 16, 64),
    ("GPT-3 Large (760M)", 24, 1536, 16, 96),
    ("GPT-3 XL (1.3B)", 24, 2048, 24, 128),
    ("GPT-3 2.7B", 32, 2560, 32, 80),
    ("GPT-3 6.7B", 32, 4096, 32, 128),
    ("GPT-3 13B", 40, 5140, 40, 128),
    ("GPT-3 175B", 96, 12288, 96, 128),
)


# Depth threshold and regime -------------------------------------------------------------------
def depth_threshold(width: float) -> float:
    """``L_th = log_3(width)`` [LW] (docs/theory.md#depth-width); width >= 1."""
    width = check_number("width", width, 1.0)
    return math.log(width) / math.log(3.0)


def regime(depth: float, width: float) -> str:
    """``"depth-efficient"`` if depth < log_3(width), else ``"depth-inefficient"``.

    Below the threshold depth is double-exponentially more efficient than width; above it,
    depth and width contribute similarly [LW].
    """
    depth = check_positive("depth", depth)
    return "depth-efficient" if depth < depth_threshold(width) else "depth-inefficient"


# Fitted optimal shape -------------------------------------------------------------------------
def optimal_width(depth: float, *, fit: DepthWidthFit = LW_FIT) -> float:
    """Fitted optimal width ``d*(L) = exp(a + b L)`` for depth L > 0."""
    depth = check_positive("depth", depth)
    return math.exp(fit.a + fit.b * depth)


@dataclass(frozen=True)
class Shape:
    """A recommended shape for a parameter budget ``params = 12 L d^2``.

    ``depth``/``width`` are the real-valued optimum of the fit; ``(depth_rounded,
    width_rounded)`` is the integer shape, width a multiple of ``multiple``, that spends the
    budget most closely (see :func:`optimal_shape`).
    """

    params: float
    depth: float
    width: float
    depth_rounded: int
    width_rounded: int
    multiple: int = 1

    @property
    def params_rounded(self) -> int:
        """``12 L d^2`` of the rounded shape."""
        return 12 * self.depth_rounded * self.width_rounded**2


def optimal_shape(
    params: float, *, multiple: int = DEFAULT_MULTIPLE, fit: DepthWidthFit = LW_FIT
) -> Shape:
    """Optimal depth and width for a budget ``N = 12 L d^2`` (docs/theory.md#depth-width).

    Inverts ``N = 12 L exp(2a + 2bL)``: ``L* = W0(N b / (6 e^{2a})) / (2b)`` (Lambert W,
    principal branch) and ``d* = sqrt(N / (12 L*))`` (= ``optimal_width(L*)``). The
    rounded shape has a width multiple of ``multiple`` (default :data:`DEFAULT_MULTIPLE`,
    128, as ``shapedtx design``: 175e9 parameters give 81 x 13440 either way).
    """
    params = check_positive("params", params)
    multiple = check_int("multiple", multiple, 1)
    w = lambertw(params * fit.b / (6.0 * math.exp(2.0 * fit.a)), 0)
    depth = float(w.real) / (2.0 * fit.b)
    if not (math.isfinite(depth) and depth > 0 and abs(w.imag) < 1e-12):
        raise ParameterError("params", f"params={params!r} gives no finite positive optimal depth")
    width = math.sqrt(params / (12.0 * depth))
    depth_rounded, width_rounded = _round_shape(params, depth, multiple)
    return Shape(params, depth, width, depth_rounded, width_rounded, multiple)


def _round_shape(params: float, depth: float, multiple: int) -> tuple[int, int]:
    """Integer (depth, width multiple of ``multiple``) nearest the budget.

    Candidates: the two integer depths around the optimum, each with the two width multiples
    around the width that spends the budget there; and the two width multiples around the
    optimal width, each with the depth that spends the budget there. The candidate with the
    smallest ``|log(12 L d^2 / params)|``, counted in steps of 1%, wins (ties: the depth
    nearest the optimum), so a coarse ``multiple`` moves the depth instead of leaving the
    budget unspent.
    """

    def widths(target: float) -> set[int]:
        low = max(multiple, multiple * math.floor(target / multiple))
        return {low, low + multiple}

    candidates = set()
    for L in {max(1, math.floor(depth)), max(1, math.ceil(depth))}:
        candidates |= {(L, d) for d in widths(math.sqrt(params / (12.0 * L)))}
    for d in widths(math.sqrt(params / (12.0 * depth))):
        candidates.add((max(1, round(params / (12.0 * d * d))), d))
    return min(
        candidates,
        key=lambda c: (
            round(100 * abs(math.log(12.0 * c[0] * c[1] ** 2 / params))),
            abs(c[0] - depth),
        ),
    )


FIT_CHECKED_PARAMS = (1e6, 1e12)
"""Budgets between which the fit's optimum was checked (docs/theory.md#depth-width: depths about 6
to 95); outside, :func:`extrapolation_warning` says so."""


def extrapolation_warning(params: float) -> str | None:
    """A one-line warning when ``params`` lies outside :data:`FIT_CHECKED_PARAMS` by more than
    a factor 10, else None."""
    low, high = FIT_CHECKED_PARAMS
    if params < low / 10 or params > high * 10:
        return (
            f"warning: N = {params:.3g} is far outside the budgets the fit was checked on "
            f"({low:.0e} to {high:.0e} parameters): the shape is an extrapolation"
        )
    return None


def allocation(
    depth: float, width: float, *, tolerance: float = 0.1, fit: DepthWidthFit = LW_FIT
) -> str:
    """Compare a shape with the fit at its own size ``12 L d^2``.

    Returns ``"too deep"`` / ``"too shallow"`` when depth differs from the optimal depth for
    that size by more than ``tolerance`` (relative), else ``"near optimal"``. (At fixed size,
    too deep is the same as ``width < optimal_width(depth)``.)
    """
    depth = check_positive("depth", depth)
    width = check_positive("width", width)
    tolerance = check_number("tolerance", tolerance, 0.0)
    best = optimal_shape(12.0 * depth * width**2, fit=fit).depth
    if depth > best * (1 + tolerance):
        return "too deep"
    if depth < best * (1 - tolerance):
        return "too shallow"
    return "near optimal"


# Parameter counts -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamCount:
    """Non-embedding parameters of ``Transformer(config)`` and the ``12 L d^2`` convention.

    ``attention`` and ``mlp`` are totals over all blocks of the two branches' parameters
    (for He & Hofmann's blocks, the attention's trainable alpha, beta, gamma too), ``other``
    the rest (normalisation weights, the skipless blocks' scalar gains). The convention
    assumes ``4 d^2`` attention and ``8 d^2`` MLP weights (d_ff = 4 d), so ``total`` and
    ``convention`` differ where a model differs from that (``mlp_ratio`` 1, no W^O, ...).
    """

    attention: int
    mlp: int
    convention: int
    other: int = 0

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.other


def param_count(config: ModelConfig, *, bias: bool = False) -> ParamCount:
    """Parameter count of ``shapedtx.Transformer(config, bias=bias)`` (no embeddings),
    counted on the module itself, so every preset, ``mlp_ratio``, norm and gain is counted as
    the model has it: the first two blocks are built on PyTorch's ``meta`` device (shapes
    only, no memory) and every block after the first has the second's parameters (only the
    first block can differ: He & Hofmann's value map and input norm), so the cost does not
    grow with the depth.
    """
    check_config(config)
    check_bool("bias", bias)
    import torch

    from .nn import Transformer

    with torch.device("meta"):
        model = Transformer(config.replace(depth=min(config.depth, 2)), bias=bias)
    counts = {"attention": 0, "mlp": 0, "other": 0}
    for name, p in model.named_parameters():
        parts = name.split(".")
        in_block = len(parts) > 2 and parts[0] == "blocks"
        branch = parts[2] if in_block and parts[2] in counts else "other"
        copies = config.depth - 1 if in_block and parts[1] == "1" else 1
        counts[branch] += copies * p.numel()
    n, depth = config.width, config.depth
    return ParamCount(convention=12 * depth * n * n, **counts)


# Head size ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadSizeReport:
    """Head-size bottleneck check for one config at sequence length m [BH]
    (docs/theory.md#head-size).

    ``bottleneck`` is True when the query/key size per head ``key_dim`` is below ``seq_len``:
    each head's logit matrix then has rank <= key_dim < m and cannot express every attention
    pattern. Parameter counts are per layer: ``standard = 4 n^2`` (W^Q, W^K, W^V, W^O with
    head size n / n_h) and ``fixed = 4 n_h d_p n`` with the recommended ``d_p = seq_len``.
    """

    width: int
    heads: int
    head_dim: int
    key_dim: int
    seq_len: int
    bottleneck: bool
    max_logit_rank: int
    max_unbottlenecked_heads: int
    params_actual: int
    params_standard: int
    params_fixed: int

    @property
    def recommended_head_dim(self) -> int:
        return self.seq_len


def head_size_report(config: ModelConfig, seq_len: int) -> HeadSizeReport:
    """Flag heads whose size is below the sequence length and compare attention costs.

    ``max_unbottlenecked_heads = width // seq_len`` is the largest number of standard heads
    (head size width / heads) whose size still reaches seq_len (0: even one head is too small).
    ``params_actual`` is this config's attention parameter count per layer (no biases).
    """
    check_config(config)
    seq_len = check_int("seq_len", seq_len, 1)
    if config.attention == "none":
        raise ParameterError(
            "config", "config.attention must be 'shaped' or 'softmax' for a head-size report"
        )
    n, h = config.width, config.heads
    return HeadSizeReport(
        width=n,
        heads=h,
        head_dim=config.head_dim,
        key_dim=config.key_dim,
        seq_len=seq_len,
        bottleneck=config.key_dim < seq_len,
        max_logit_rank=min(config.key_dim, seq_len, n),
        max_unbottlenecked_heads=n // seq_len,
        params_actual=param_count(config).attention // config.depth,
        params_standard=4 * n * n,
        params_fixed=4 * h * seq_len * n,
    )


# Tables ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DesignRow:
    """One model next to the fitted recommendation for its size ``12 L d^2``."""

    name: str
    depth: int
    width: int
    heads: int
    head_dim: int
    seq_len: int
    threshold: float
    regime: str
    allocation: str
    recommended: Shape

    @property
    def params(self) -> int:
        return 12 * self.depth * self.width**2

    @property
    def bottleneck(self) -> bool:
        """Head size below the sequence length [BH]."""
        return self.head_dim < self.seq_len


def design_row(
    name: str,
    depth: int,
    width: int,
    heads: int,
    head_dim: int,
    seq_len: int,
    *,
    multiple: int = DEFAULT_MULTIPLE,
    fit: DepthWidthFit = LW_FIT,
) -> DesignRow:
    """Depth threshold, regime, allocation verdict and recommended shape of one model."""
    for key, value in (
        ("depth", depth), ("width", width), ("heads", heads), ("head_dim", head_dim),
        ("seq_len", seq_len),
    ):  # fmt: skip
        check_int(key, value, 1)
    return DesignRow(
        name=name,
        depth=depth,
        width=width,
        heads=heads,
        head_dim=head_dim,
        seq_len=seq_len,
        threshold=depth_threshold(width),
        regime=regime(depth, width),
        allocation=allocation(depth, width, fit=fit),
        recommended=optimal_shape(12.0 * depth * width**2, multiple=multiple, fit=fit),
    )


def gpt3_table(*, multiple: int = DEFAULT_MULTIPLE, fit: DepthWidthFit = LW_FIT) -> list[DesignRow]:
    """The eight GPT-3 sizes (``GPT3_MODELS``) with the fitted recommendation for each."""
    return [
        design_row(name, L, d, h, dp, GPT3_CONTEXT, multiple=multiple, fit=fit)
        for name, L, d, h, dp in GPT3_MODELS
    ]
