"""Attention matrices and their fused (no m x m matrix) forms (docs/theory.md#layers).

Shapes: queries/keys ``q, k: (..., m, n_k)``, values ``v: (..., m, d)``, logits
``Y = q k^T: (..., m, m)`` with rows indexing queries.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _compiled_centring


def causal_mask(m: int, device: torch.device | None = None) -> Tensor:
    """Boolean (m, m) lower-triangular mask: True where query i may attend to key j <= i."""
    return torch.ones(m, m, dtype=torch.bool, device=device).tril()


def causal_uniform(m: int, *, dtype: torch.dtype | None = None, device=None) -> Tensor:
    """Causal uniform matrix C (m, m): row i (0-based) holds 1/(i+1) on columns j <= i."""
    rows = torch.arange(1, m + 1, dtype=dtype or torch.get_default_dtype(), device=device)
    return causal_mask(m, device).to(rows.dtype) / rows[:, None]


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(..., m, h * d) -> (..., h, m, d)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(-3, -2)


def merge_heads(x: Tensor) -> Tensor:
    """(..., h, m, d) -> (..., m, h * d)."""
    return x.transpose(-3, -2).flatten(-2)


SMALL_SOFTMAX = 16
"""Up to this many keys, the softmax is computed from elementwise ops (max, exp, sum): on CPU
``torch.softmax`` over a short last dimension has a large per-row overhead
(benchmarks/HISTORY.md, "Gram sampler")."""


def _may_overwrite(Y: Tensor, overwrite: bool) -> bool:
    """``overwrite``, unless autograd needs Y (then Y is never modified)."""
    return overwrite and not (torch.is_grad_enabled() and Y.requires_grad)


@functools.lru_cache(maxsize=64)
def _causal_bias(m: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(m, m): 0 where query i may attend to key j <= i, -inf above the diagonal (added to
    the logits: on CPU cheaper than ``masked_fill``; benchmarks/HISTORY.md, "Gram sampler",
    fifth pass)."""
    bias = torch.zeros(m, m, dtype=dtype, device=device)
    return bias.masked_fill_(~causal_mask(m, device), -math.inf)


def _masked_softmax(
    Y: Tensor, scale: float, causal: bool, overwrite: bool = False, offset: Tensor | None = None
) -> Tensor:
    """``Softmax(scale Y)`` over the last dimension (keys j > i masked out if causal), plus
    ``offset`` if given (a constant (m, m) matrix); ``overwrite``: Y may be used as scratch
    memory (callers pass :func:`_may_overwrite`); then every step writes in place, the
    scaling and the causal mask in one pass (the same numbers as two)."""
    if causal and overwrite:  # -inf + a finite logit is -inf: one pass, no mask lookup
        Y = torch.add(_causal_bias(Y.shape[-1], Y.dtype, Y.device), Y, alpha=scale, out=Y)
    elif overwrite:
        Y = Y.mul_(scale)
    elif causal:
        Y = (Y * scale).masked_fill_(~causal_mask(Y.shape[-1], Y.device), -math.inf)
    else:
        Y = Y * scale
    if Y.shape[-1] > SMALL_SOFTMAX:
        A = torch.softmax(Y, dim=-1)
    elif overwrite:
        e = Y.sub_(Y.amax(dim=-1, keepdim=True)).exp_()
        A = e.mul_(e.sum(dim=-1, keepdim=True).reciprocal_())
    else:
        e = torch.exp(Y - Y.amax(dim=-1, keepdim=True))
        A = e * e.sum(dim=-1, keepdim=True).reciprocal()  # as above: the same numbers
    if offset is None:
        return A
    return A + offset if A.requires_grad else A.add_(offset)  # softmax's backward needs A


def softmax_attention_matrix(
    Y: Tensor,
    key_dim: int,
    *,
    causal: bool = False,
    overwrite: bool = False,
    scale: float | None = None,
) -> Tensor:
    """Standard attention ``A = Softmax(Y / sqrt(n_k))``; Y: (..., m, m) -> (..., m, m).

    ``scale`` replaces ``1 / sqrt(n_k)`` (``ModelConfig.softmax_scale``: muP's ``1 / n_k``).
    ``overwrite=True`` lets Y be used as scratch memory (ignored when autograd needs Y)."""
    scale = 1.0 / math.sqrt(key_dim) if scale is None else scale
    return _masked_softmax(Y, scale, causal, _may_overwrite(Y, overwrite))


def shaped_attention_matrix(
    Y: Tensor, tau: float, *, causal: bool = False, overwrite: bool = False
) -> Tensor:
    """Shaped attention ``A = I + Softmax(Y / tau) - 11^T/m``; Y: (..., m, m) -> (..., m, m).

    With ``causal`` the softmax is masked and the centring uses the causal uniform matrix C, so
    every row of A still sums to 1. ``tau = tau0 sqrt(n n_k)`` (see ``ModelConfig.tau``).
    ``overwrite=True`` lets Y be used as scratch memory (ignored when autograd needs Y).
    """
    offset = _identity_minus_centre(Y.shape[-1], causal, Y.dtype, Y.device)
    return _masked_softmax(Y, 1.0 / tau, causal, _may_overwrite(Y, overwrite), offset)


@functools.lru_cache(maxsize=64)
def _identity_minus_centre(
    m: int, causal: bool, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """(m, m): ``I - C`` (causal) or ``I - 11^T/m``, the constant part of shaped attention."""
    eye = torch.eye(m, dtype=dtype, device=device)
    if causal:
        return eye - causal_uniform(m, dtype=dtype, device=device)
    return eye - torch.full((m, m), 1.0 / m, dtype=dtype, device=device)


def token_mean(v: Tensor, *, causal: bool = False) -> Tensor:
    """``(11^T/m) v`` or, if causal, ``C v`` (running mean over tokens); v: (..., m, d)."""
    if not causal:
        return v.mean(dim=-2, keepdim=True).expand_as(v)
    return v - causal_centring(v)


def token_cumsum(x: Tensor, *, reverse: bool = False) -> Tensor:
    """Running sum over tokens, ``y_i = sum_{j <= i} x_j`` (or ``sum_{j >= i}`` if
    ``reverse``); x: (..., m, d) -> (..., m, d)."""
    if reverse:
        return x.flip(-2).cumsum(dim=-2).flip(-2)
    return x.cumsum(dim=-2)


def shaped_attention(
    q: Tensor, k: Tensor, v: Tensor, tau: float, *, causal: bool = False
) -> Tensor:
    """Fused ``A v`` for shaped attention: ``v + SDPA(q, k, v; scale 1/tau) - mean(v)``.

    q, k: (..., m, n_k); v: (..., m, d) -> (..., m, d). Never forms the m x m matrix: the
    softmax term goes through ``scaled_dot_product_attention`` (flash/memory-efficient kernels
    where available) and the centring ``v - token_mean(v)`` plus the sum is one fused
    operation (:func:`centred_sum`, with a hand-written backward).
    """
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0 / tau)
    return centred_sum(attended, v, causal=causal)


def shaped_attention_heads(
    q: Tensor, k: Tensor, values: Tensor, tau: float, *, causal: bool = False
) -> Tensor:
    """:func:`shaped_attention` of h heads, on and into the merged head layout.

    q, k: (..., h, m, n_k); values: (..., m, h d) (head j in columns ``j d .. (j + 1) d``) ->
    (..., m, h d), the heads' outputs side by side. The centring acts on tokens only, so it
    runs once on the contiguous merged values instead of per head (faster on CPU).
    """
    v = split_heads(values, q.shape[-3])  # (..., h, m, d)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0 / tau)
    # (..., m, h, d): added into the centred values without merging the heads first
    return centred_sum(attended.transpose(-3, -2), values, causal=causal)


def shaped_attention_heads_with_gains(
    q: Tensor,
    k: Tensor,
    values: Tensor,
    tau: float,
    alpha: Tensor | float,
    beta: Tensor | float,
    gamma: Tensor | float,
    *,
    causal: bool = False,
) -> Tensor:
    """:func:`shaped_attention_heads` with per-head gains: ``A = alpha I + beta Softmax(Y /
    tau) - gamma C`` (docs/theory.md#trainable-shape).

    q, k: (..., h, m, n_k); values: (..., m, h d); alpha, beta, gamma: (h,) -> (..., m, h d).
    Computed as the fixed form of ``beta``-scaled softmax values plus ``(alpha - 1) v -
    (gamma - 1) C v``, so at alpha = beta = gamma = 1 it is :func:`shaped_attention_heads`
    bit for bit (the trainable model at initialisation is the fixed one).
    """
    v = split_heads(values, q.shape[-3])  # (..., h, m, d)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0 / tau)
    out = centred_sum((attended * _per_head(beta)).transpose(-3, -2), values, causal=causal)
    rest = _per_head(alpha - 1.0) * v - _per_head(gamma - 1.0) * token_mean(v, causal=causal)
    return out + merge_heads(rest)


def centred_sum(attended: Tensor, v: Tensor, *, causal: bool = False) -> Tensor:
    """``attended + v - token_mean(v)`` (= ``attended + (I - C) v``, C the uniform or causal
    uniform matrix) as one autograd operation; v: (..., m, d) -> (..., m, d); attended:
    (..., m, d), or (..., m, h, d / h) (h heads side by side, any strides, e.g. a transposed
    view of SDPA's output). Causal on CPU in float32/64: one compiled pass forward and two
    backward, running sums in float64; elsewhere torch operations."""
    return _CentredSum.apply(attended, v, causal)


@functools.lru_cache(maxsize=64)
def _inverse_counts(m: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(m, 1): 1 / (i + 1), the causal running-mean weights."""
    return 1.0 / torch.arange(1, m + 1, dtype=dtype, device=device)[:, None]


CUMSUM_BLOCK = 16
"""Block size of :func:`causal_centring` on CPU (sums within blocks of this many tokens by
one batched product with a weighted triangle of ones, then a running sum of the block
totals)."""


def causal_centring(x: Tensor, *, transpose: bool = False) -> Tensor:
    """``(I - C) x`` (or ``(I - C)^T x`` if ``transpose``), C the causal uniform matrix;
    x: (..., m, d) -> (..., m, d), a new tensor (plain differentiable operations).

    On CPU with m >= 2 ``CUMSUM_BLOCK`` tokens, blockwise: one batched product with block
    matrices (for ``(I - C) x`` ``I - diag(1/(i+1)) tril(1)``, the identity and the
    running-mean weights folded in), the block totals, a small running sum of them and one
    or two in-place passes. Elsewhere from ``torch.cumsum``. The same values up to rounding.
    """
    return _causal_centring(x, transpose, fresh=False)


def _causal_centring(x: Tensor, transpose: bool, fresh: bool) -> Tensor:
    """:func:`causal_centring`; with ``fresh`` (no autograd, no function transforms: the
    product writes through ``out=``) the blockwise result is a fresh tensor that is not a
    view, into which autograd can add another gradient in place (:class:`_CentredSum`)."""
    m, b = x.shape[-2], CUMSUM_BLOCK
    if x.device.type != "cpu" or m < 2 * b:
        inv = _inverse_counts(m, x.dtype, x.device)
        if transpose:  # C^T x = reversed running sum of x / counts
            return x - token_cumsum(x * inv, reverse=True)
        return torch.addcmul(x, token_cumsum(x), inv, value=-1.0)
    pad = -m % b
    xb = (F.pad(x, (0, 0, 0, pad)) if pad else x).unflatten(-2, (-1, b))  # (..., nb, b, d)
    W, inv_blocks = _centring_blocks(m + pad, b, transpose, x.dtype, x.device)
    # forward: x minus the weighted running sums within each block; transpose: those sums
    if fresh:
        result = x.new_empty((*x.shape[:-2], m + pad, x.shape[-1]))
        out = torch.matmul(W, xb, out=result.view(xb.shape))
    else:
        out = torch.matmul(W, xb)
        result = out.flatten(-3, -2)
    if transpose:  # block k needs the weighted totals of the blocks after it (its row 0)
        totals = out[..., 0, :]
        after = token_cumsum(totals, reverse=True) - totals
        out.add_(after.unsqueeze(-2))
        if fresh:
            torch.sub(xb, out, out=out)
        else:  # out= is not differentiable
            result = (xb - out).flatten(-3, -2)
    else:  # block k needs the plain totals of the blocks before it, weighted per row
        totals = xb.sum(dim=-2)
        before = token_cumsum(totals) - totals
        out.addcmul_(inv_blocks, before.unsqueeze(-2), value=-1.0)
    if not pad:
        return result
    return result[..., :m, :].clone() if fresh else result[..., :m, :]


@functools.lru_cache(maxsize=32)
def _centring_blocks(
    m: int, b: int, transpose: bool, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(nb, b, b) block matrices of :func:`causal_centring` and the weights (nb, b, 1):
    ``I - diag(1/(i+1)) tril(1)`` per block (the identity folded in: the product gives x
    minus the within-block part), or ``triu(1) diag(1/(i+1))`` if ``transpose`` (the product's
    row 0 is the block's weighted total, summed directly: accurate in low precision)."""
    inv = _inverse_counts(m, dtype, device).view(-1, b, 1)  # (nb, b, 1)
    ones = torch.ones(b, b, dtype=dtype, device=device)
    if transpose:
        return ones.triu() * inv.transpose(-1, -2), inv
    return torch.eye(b, dtype=dtype, device=device) - inv * ones.tril(), inv


class _CentredSum(torch.autograd.Function):
    """Forward: ``(I - C) v + attended`` or the mean form. Backward: ``d attended = g``,
    ``d v = (I - C)^T g``. Causal on CPU in float32/64 by the compiled kernels of
    :mod:`shapedtx._compiled_centring`, elsewhere by :func:`causal_centring`'s forms."""

    @staticmethod
    def forward(ctx, attended: Tensor, v: Tensor, causal: bool) -> Tensor:
        ctx.causal = causal
        ctx.attended_shape = attended.shape
        if causal and _compiled_centring.applies(v, attended):
            return _compiled_centring.causal_centred_sum(attended, v)
        out = _causal_centring(v, False, fresh=True) if causal else v - v.mean(dim=-2, keepdim=True)
        out.view(attended.shape).add_(attended)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        grad_v = None
        if ctx.needs_input_grad[1]:
            if not ctx.causal:
                grad_v = g - g.mean(dim=-2, keepdim=True)
            elif _compiled_centring.applies(g):
                grad_v = _compiled_centring.causal_centring_transpose(g)
            else:
                grad_v = _causal_centring(g, True, fresh=True)
        grad_attended = g.reshape(ctx.attended_shape) if ctx.needs_input_grad[0] else None
        return grad_attended, grad_v, None


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    key_dim: int | None = None,
    scale: float | None = None,
) -> Tensor:
    """Fused ``Softmax(q k^T / sqrt(n_k)) v``; q, k: (..., m, e), v: (..., m, d).

    ``n_k = key_dim`` (default: e, q's last size; the exact simulator passes queries and keys
    of fewer columns with the same logits in law, so it gives n_k explicitly). ``scale``
    replaces ``1 / sqrt(n_k)`` (``ModelConfig.softmax_scale``: muP's ``1 / n_k``).
    """
    if scale is None:
        scale = None if key_dim is None else 1.0 / math.sqrt(key_dim)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _per_head(gain: Tensor | float) -> Tensor | float:
    """A per-head gain (h,) as (h, 1, 1), to scale (..., h, m, m) or (..., h, m, d); a number
    or a 0-d tensor unchanged."""
    if isinstance(gain, Tensor) and gain.dim() == 1:
        return gain[:, None, None]
    return gain


def simplified_attention_matrix(
    Y: Tensor,
    key_dim: int,
    alpha: Tensor | float,
    beta: Tensor | float,
    gamma: Tensor | float,
    *,
    causal: bool = False,
) -> Tensor:
    """He & Hofmann's shaped attention ``A = alpha I + beta Softmax(Y / sqrt(n_k)) - gamma C``
    (docs/theory.md#simplified); Y: (..., h, m, m) -> (..., h, m, m).

    C is the causal uniform matrix if ``causal`` (the softmax then masked), else
    ``11^T / m``. alpha, beta, gamma: numbers or per-head tensors (h,) (trainable in the
    ``nn`` modules; all 1 at initialisation).
    """
    return gained_attention_matrix(Y, 1.0 / math.sqrt(key_dim), alpha, beta, gamma, causal=causal)


def gained_attention_matrix(
    Y: Tensor,
    scale: float,
    alpha: Tensor | float,
    beta: Tensor | float,
    gamma: Tensor | float,
    *,
    causal: bool = False,
) -> Tensor:
    """``A = alpha I + beta Softmax(scale Y) - gamma C``; Y: (..., h, m, m) -> (..., h, m, m):
    the simplified attention (``scale = 1/sqrt(n_k)``) and shaped attention with trainable
    gains (``scale = 1/tau``; docs/theory.md#trainable-shape). alpha, beta, gamma: numbers or
    per-head tensors (h,)."""
    m = Y.shape[-1]
    soft = _masked_softmax(Y, scale, causal)
    eye = torch.eye(m, dtype=soft.dtype, device=soft.device)
    if causal:
        centre = causal_uniform(m, dtype=soft.dtype, device=soft.device)
    else:
        centre = torch.full((m, m), 1.0 / m, dtype=soft.dtype, device=soft.device)
    return _per_head(alpha) * eye + _per_head(beta) * soft - _per_head(gamma) * centre


def simplified_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: Tensor | float,
    beta: Tensor | float,
    gamma: Tensor | float,
    *,
    causal: bool = False,
    key_dim: int | None = None,
) -> Tensor:
    """Fused ``A v`` of :func:`simplified_attention_matrix`: ``alpha v + beta SDPA(q, k, v) -
    gamma token_mean(v)``, never forming the m x m matrix.

    q, k: (..., h, m, n_k); v: (..., h, m, d) -> (..., h, m, d); ``n_k = key_dim`` (default:
    q's last size); alpha, beta, gamma: numbers or per-head tensors (h,).
    """
    scale = 1.0 / math.sqrt(q.shape[-1] if key_dim is None else key_dim)
    attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    mean = token_mean(v, causal=causal)
    return _per_head(alpha) * v + _per_head(beta) * attended - _per_head(gamma) * mean
