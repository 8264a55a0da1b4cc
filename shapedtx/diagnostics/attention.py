"""Attention logits of any PyTorch model, read by forward hooks, and their metrics.

Per block and head: the ``attention_entropy`` of the attention probabilities (mean over query
positions, nats), its reference ``entropy_reference`` (the entropy of uniform attention over
the keys a query may see: ``log(position)`` under a causal mask) and the ``max_logit``
(largest softmax argument); docs/guide/monitor.md#attention. The logits are read by forward
hooks (attached through :class:`shapedtx.diagnostics.BlockHooks`), for the library's
``Transformer`` (its query and key maps), ``transformers`` GPT-2 and nanoGPT (``c_attn``),
``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` (recomputed from
``in_proj_weight`` on the hooked inputs: PyTorch's fast path returns no weights).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import ParameterError
from ..attention import causal_mask, split_heads
from ..nn import Attention
from .hooks import Handle, NamedBlocks, named_submodule

HEAD_METRICS: tuple[str, ...] = ("attention_entropy", "max_logit")
"""Attention metrics per block and head ``(step, block, head)``."""

ATTENTION_VARIABLES: tuple[str, ...] = (*HEAD_METRICS, "entropy_reference")
"""The variables that need the attention logits (absent, with a note, when unreachable)."""


def as_float(x: Tensor) -> Tensor:
    """x in at least float32 (half precision is promoted)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def attention_entropy(logits: Tensor) -> Tensor:
    """Mean over query positions of the entropy (nats) of ``Softmax`` over keys.

    ``H = (1/m) sum_i -sum_j p_ij log p_ij`` with ``p_i = Softmax(logits_i)``.
    logits: (..., m, m_k), masked keys ``-inf`` -> (...); a query with no visible key gives
    NaN. docs/guide/monitor.md#attention.
    """
    p = torch.softmax(as_float(logits), dim=-1)
    return torch.special.entr(p).sum(-1).mean(-1)  # entr(p) = -p log p, entr(0) = 0


def entropy_reference(visible: Tensor) -> Tensor:
    """Entropy of uniform attention over the visible keys, mean over query positions:
    ``(1/m) sum_i log k_i`` with ``k_i`` the number of keys query i may see (``log(i)`` for a
    causal mask, ``i`` 1-based; ``log m_k`` without a mask). visible: (..., m, m_k) bool ->
    (...), float64. The largest value :func:`attention_entropy` can take."""
    return visible.sum(-1).double().log().mean(-1)


def max_logit(logits: Tensor) -> Tensor:
    """Largest attention logit (the softmax's argument, scale included) over queries and
    visible keys; logits: (..., m, m_k), masked keys ``-inf`` -> (...)."""
    return as_float(logits).amax(dim=(-2, -1))


# ---------------------------------------------------------------- attention readers


class Reader(ABC):
    """Hooks that record what a block's attention logits need during one forward pass;
    :meth:`take` returns the logits (B, h, m, m_k), masked keys ``-inf``, and forgets them."""

    name: str

    @abstractmethod
    def attach(self) -> list[Handle]:
        """Register the hooks on the block's modules; their handles."""

    @abstractmethod
    def take(self) -> Tensor | None:
        """The logits recorded by the last forward pass (None if none), then forgotten."""


def _causal(Y: Tensor) -> Tensor:
    m, k = Y.shape[-2:]
    visible = causal_mask(max(m, k), Y.device)[:m, :k]
    return Y.masked_fill(~visible, -math.inf)


class _QueryKeyReader(Reader):
    """Separate query and key maps (the library's ``Attention``: ``layers["query"]``,
    ``layers["key"]``), outputs (B, m, h n_k): logits ``scale q k^T`` per head."""

    def __init__(
        self,
        name: str,
        query: nn.Module,
        key: nn.Module,
        heads: int,
        scale: float,
        causal: bool,
        temperature: Callable[[], Tensor] | None = None,
    ) -> None:
        self.name, self.query, self.key = name, query, key
        self.heads, self.scale, self.causal = heads, scale, causal
        self.temperature = temperature  # per-head inverse temperature (h,) now, trainable
        self.q: Tensor | None = None
        self.k: Tensor | None = None

    def attach(self) -> list[Handle]:
        def keep(which: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
                setattr(self, which, output.detach())

            return hook

        return [
            self.query.register_forward_hook(keep("q")),
            self.key.register_forward_hook(keep("k")),
        ]

    def take(self) -> Tensor | None:
        if self.q is None or self.k is None:
            return None
        q, k = split_heads(as_float(self.q), self.heads), split_heads(as_float(self.k), self.heads)
        self.q = self.k = None
        Y = (q @ k.transpose(-1, -2)) * self.scale
        if self.temperature is not None:
            Y = Y * as_float(self.temperature().detach())[:, None, None]
        return _causal(Y) if self.causal else Y


class _FusedQKVReader(_QueryKeyReader):
    """GPT-2 (``transformers``) and nanoGPT attention: one map ``c_attn`` whose output
    (B, m, 3n) holds q, k, v side by side; causal, scale ``module.scaling`` (GPT-2) or
    ``1/sqrt(head_dim)``."""

    def __init__(self, name: str, module: nn.Module, heads: int, width: int) -> None:
        scale = getattr(module, "scaling", None)
        if not isinstance(scale, (int, float)):
            scale = 1.0 / math.sqrt(width // heads)
        c_attn = module.get_submodule("c_attn")
        super().__init__(name, c_attn, c_attn, heads, float(scale), True)
        self.width = width

    def attach(self) -> list[Handle]:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> None:
            q, k = output.detach().split(self.width, dim=-1)[:2]
            self.q, self.k = q, k

        return [self.query.register_forward_hook(hook)]


def _mha_logits(
    mha: nn.MultiheadAttention,
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
) -> Tensor:
    """The logits ``q k^T / sqrt(head_dim)`` (B, h, m, m_k) of ``nn.MultiheadAttention``
    recomputed from its input projection, with its masks (boolean: True = not allowed; float:
    added). ``is_causal`` is only PyTorch's hint that ``attn_mask`` is causal: without a mask
    PyTorch either refuses it or (eval mode without gradients, the monitor's pass) attends
    every key, so it is not read."""
    if query.dim() == 2:  # unbatched
        query, key = query[None], key[None]
    elif not mha.batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    E, h = mha.embed_dim, mha.num_heads
    if mha._qkv_same_embed_dim:
        w_q, w_k = mha.in_proj_weight[:E], mha.in_proj_weight[E : 2 * E]
    else:
        w_q, w_k = mha.q_proj_weight, mha.k_proj_weight
    bias = mha.in_proj_bias
    b_q, b_k = (bias[:E], bias[E : 2 * E]) if bias is not None else (None, None)
    q = split_heads(F.linear(as_float(query), as_float(w_q), b_q), h)
    k = split_heads(F.linear(as_float(key), as_float(w_k), b_k), h)
    Y = (q @ k.transpose(-1, -2)) / math.sqrt(E // h)
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dim() == 2 else attn_mask.view(Y.shape)
        boolean = mask.dtype == torch.bool
        Y = Y.masked_fill(mask, -math.inf) if boolean else Y + mask.to(Y.dtype)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        Y = Y.masked_fill(pad, -math.inf) if pad.dtype == torch.bool else Y + pad.to(Y.dtype)
    return Y


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


class _MultiheadReader(Reader):
    """``nn.MultiheadAttention``: a pre-hook on the module records its inputs and masks."""

    def __init__(self, name: str, mha: nn.MultiheadAttention) -> None:
        self.name, self.mha = name, mha
        self.Y: Tensor | None = None

    def attach(self) -> list[Handle]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            with torch.no_grad():
                self.Y = _mha_logits(
                    self.mha,
                    _argument(args, kwargs, 0, "query"),
                    _argument(args, kwargs, 1, "key"),
                    _argument(args, kwargs, 5, "attn_mask"),
                    _argument(args, kwargs, 3, "key_padding_mask"),
                )

        return [self.mha.register_forward_pre_hook(hook, with_kwargs=True)]

    def take(self) -> Tensor | None:
        Y, self.Y = self.Y, None
        return Y


class _EncoderLayerReader(_MultiheadReader):
    """``nn.TransformerEncoderLayer``: its self-attention's inputs from the layer's own
    (``norm1(src)`` if ``norm_first``), so PyTorch's fast path (which never calls
    ``self_attn``) is covered."""

    def __init__(self, name: str, layer: nn.TransformerEncoderLayer) -> None:
        super().__init__(name, layer.self_attn)
        self.layer = layer

    def attach(self) -> list[Handle]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            src = _argument(args, kwargs, 0, "src")
            with torch.no_grad():
                x = self.layer.norm1(src) if self.layer.norm_first else src
                self.Y = _mha_logits(
                    self.mha,
                    x,
                    x,
                    _argument(args, kwargs, 1, "src_mask"),
                    _argument(args, kwargs, 2, "src_key_padding_mask"),
                )

        return [self.layer.register_forward_pre_hook(hook, with_kwargs=True)]


def _heads_of(module: nn.Module) -> int | None:
    for attr in ("num_heads", "n_head", "n_heads"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _reader(name: str, module: nn.Module) -> Reader | None:
    """The reader of one attention module (or encoder layer), None if not recognised."""
    if isinstance(module, nn.TransformerEncoderLayer):
        return _EncoderLayerReader(name, module)
    if isinstance(module, Attention):
        cfg = module.config
        scale = 1.0 / cfg.tau if cfg.attention == "shaped" else cfg.softmax_scale
        layers = module.layers
        temperature = (
            functools.partial(module.gain, "attn_temperature")
            if "attn_temperature" in module.gains
            else None
        )
        return _QueryKeyReader(
            name, layers["query"], layers["key"], cfg.heads, scale, bool(cfg.causal), temperature
        )
    if isinstance(module, nn.MultiheadAttention):
        if module.bias_k is not None or module.add_zero_attn:
            return None  # extra key rows: not recomputed
        return _MultiheadReader(name, module)
    c_attn, heads = getattr(module, "c_attn", None), _heads_of(module)
    if isinstance(c_attn, nn.Module) and heads and not getattr(module, "is_cross_attention", 0):
        width = getattr(module, "split_size", None) or getattr(module, "n_embd", None)
        if not isinstance(width, int):
            width = getattr(module, "embed_dim", None)
        if isinstance(width, int) and width % heads == 0:
            return _FusedQKVReader(name, module, heads, width)
    return None


AttentionEntry = str | nn.Module | None


def find_attention(
    model: nn.Module,
    blocks: NamedBlocks,
    attention: Sequence[AttentionEntry] | None = None,
) -> list[Reader | None]:
    """One attention reader per block (None where no attention is reachable).

    ``attention=None``: the block itself if it is an ``nn.TransformerEncoderLayer``, else the
    first module inside it that is the library's ``Attention``, an ``nn.MultiheadAttention``
    or a GPT-2 / nanoGPT attention (``c_attn`` and ``num_heads`` / ``n_head``). Otherwise one
    entry per block: a module, its name in ``model.named_modules()``, or None.
    """
    if attention is None:
        found: list[Reader | None] = []
        for block_name, block in blocks:
            reader = None
            for sub_name, sub in block.named_modules():
                full = f"{block_name}.{sub_name}".strip(".")
                reader = _reader(full, sub)
                if reader is not None:
                    break
            found.append(reader)
        return found
    if isinstance(attention, (str, nn.Module)) or not isinstance(attention, Sequence):
        raise ParameterError(
            "attention",
            f"attention must be None or a list with one entry per block (a module, its name or "
            f"None), got {type(attention).__name__}",
        )
    if len(attention) != len(blocks):
        raise ParameterError(
            "attention",
            f"attention must have one entry per block ({len(blocks)}), got {len(attention)}",
        )
    modules = dict(model.named_modules())
    names = {module: name for name, module in modules.items()}
    readers: list[Reader | None] = []
    for i, entry in enumerate(attention):
        if entry is None:
            readers.append(None)
            continue
        name, entry = named_submodule(modules, names, entry, "attention", i)
        reader = _reader(name, entry)
        if reader is None:
            raise ParameterError(
                "attention",
                f"attention[{i}] ({name!r}, {type(entry).__name__}) is not an attention "
                f"module the monitor can read (the library's Attention, nn.MultiheadAttention, "
                f"nn.TransformerEncoderLayer, or a module with c_attn and num_heads / n_head)",
            )
        readers.append(reader)
    return readers


__all__ = [
    "ATTENTION_VARIABLES",
    "HEAD_METRICS",
    "AttentionEntry",
    "Reader",
    "as_float",
    "attention_entropy",
    "entropy_reference",
    "find_attention",
    "max_logit",
]
