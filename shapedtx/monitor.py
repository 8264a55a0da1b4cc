"""Signal propagation of any PyTorch model while it trains (docs/guide/monitor.md).

Per layer (the residual stream entering the first block, layer 0, and leaving every block):
``activation_rms``, ``kurtosis`` (excess kurtosis over features: outlier features) and the
token-covariance metrics of the trainer's log (``mean_rho``, ``stable_rank``,
``centred_stable_rank``, ``eigenvalue_ratio``, ``residual``). Per block and head: the
``attention_entropy`` of the attention probabilities (mean over query positions, nats), its
reference ``entropy_reference`` (the entropy of uniform attention over the keys a query may
see: ``log(position)`` under a causal mask) and the ``max_logit`` (largest softmax argument).
Per block and weight matrix: ``update_size``, ``||W_t - W_s||_F / ||W_s||_F`` since the
previous measurement.

:class:`Monitor` measures them on a fixed batch in a user's training loop; ``shapedtx.train``
logs the same numbers (the same code) into ``log.nc``. The attention logits are read by
forward hooks, for the library's ``Transformer`` (its query and key maps), ``transformers``
GPT-2 and nanoGPT (``c_attn``), ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
(recomputed from ``in_proj_weight`` on the hooked inputs: PyTorch's fast path returns no
weights); a model whose attention is not reachable gets the other metrics and a note.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import ParameterError, check_bool, check_int
from .attention import causal_mask, split_heads
from .metrics import covariance
from .probe import Blocks, _due_step, _forward_once, _stream, _submodule, find_blocks

if TYPE_CHECKING:
    import xarray as xr
    from matplotlib.figure import Figure

LAYER_METRICS: tuple[str, ...] = ("activation_rms", "kurtosis")
"""Metrics of the residual stream per layer ``(step, layer)``, besides the covariance metrics
of ``shapedtx.training.log.METRICS``."""

HEAD_METRICS: tuple[str, ...] = ("attention_entropy", "max_logit")
"""Attention metrics per block and head ``(step, block, head)``."""

ATTENTION_VARIABLES: tuple[str, ...] = (*HEAD_METRICS, "entropy_reference")
"""The variables that need the attention logits (absent, with a note, when unreachable)."""


# ---------------------------------------------------------------- metrics (pure functions)


def _float(x: Tensor) -> Tensor:
    """x in at least float32 (half precision is promoted)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def attention_entropy(logits: Tensor) -> Tensor:
    """Mean over query positions of the entropy (nats) of ``Softmax`` over keys.

    ``H = (1/m) sum_i -sum_j p_ij log p_ij`` with ``p_i = Softmax(logits_i)``.
    logits: (..., m, m_k), masked keys ``-inf`` -> (...); a query with no visible key gives
    NaN. docs/guide/monitor.md#attention.
    """
    p = torch.softmax(_float(logits), dim=-1)
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
    return _float(logits).amax(dim=(-2, -1))


def activation_rms(X: Tensor) -> Tensor:
    """``sqrt(mean_{i,k} X_ik^2)``, the RMS over tokens and features; X: (..., m, n) -> (...)."""
    return _float(X).pow(2).mean(dim=(-2, -1)).sqrt()


def excess_kurtosis(X: Tensor) -> Tensor:
    """Excess kurtosis of each token over its features, ``mean_k (x_k - xbar)^4 /
    (mean_k (x_k - xbar)^2)^2 - 3`` (0 for Gaussian features; large when a few features carry
    outliers); X: (..., m, n) -> (..., m). docs/guide/monitor.md#activations."""
    x = _float(X)
    centred = x - x.mean(dim=-1, keepdim=True)
    second = centred.pow(2).mean(-1)
    return centred.pow(4).mean(-1) / second.pow(2) - 3.0


def relative_update(new: Tensor, old: Tensor) -> Tensor:
    """``||W_t - W_s||_F / ||W_s||_F`` (float64, 0-d), ``new = W_t``, ``old = W_s`` of one shape."""
    old64 = old.detach().double()
    diff = torch.linalg.vector_norm(new.detach().double() - old64)
    return diff / torch.linalg.vector_norm(old64)


# ---------------------------------------------------------------- attention readers


class _Reader(ABC):
    """Hooks that record what a block's attention logits need during one forward pass;
    :meth:`take` returns the logits (B, h, m, m_k), masked keys ``-inf``, and forgets them."""

    name: str

    @abstractmethod
    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
        """Register the hooks on the block's modules; their handles."""

    @abstractmethod
    def take(self) -> Tensor | None:
        """The logits recorded by the last forward pass (None if none), then forgotten."""


def _causal(Y: Tensor) -> Tensor:
    m, k = Y.shape[-2:]
    visible = causal_mask(max(m, k), Y.device)[:m, :k]
    return Y.masked_fill(~visible, -math.inf)


class _QueryKeyReader(_Reader):
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
        temperature: Tensor | None = None,
    ) -> None:
        self.name, self.query, self.key = name, query, key
        self.heads, self.scale, self.causal = heads, scale, causal
        self.temperature = temperature  # per-head inverse temperature (h,), trainable
        self.q: Tensor | None = None
        self.k: Tensor | None = None

    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
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
        q, k = split_heads(_float(self.q), self.heads), split_heads(_float(self.k), self.heads)
        self.q = self.k = None
        Y = (q @ k.transpose(-1, -2)) * self.scale
        if self.temperature is not None:
            Y = Y * _float(self.temperature.detach())[:, None, None]
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

    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
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
    is_causal: bool,
) -> Tensor:
    """The logits ``q k^T / sqrt(head_dim)`` (B, h, m, m_k) of ``nn.MultiheadAttention``
    recomputed from its input projection, with its masks (boolean: True = not allowed; float:
    added)."""
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
    q = split_heads(F.linear(_float(query), _float(w_q), b_q), h)
    k = split_heads(F.linear(_float(key), _float(w_k), b_k), h)
    Y = (q @ k.transpose(-1, -2)) / math.sqrt(E // h)
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dim() == 2 else attn_mask.view(Y.shape)
        boolean = mask.dtype == torch.bool
        Y = Y.masked_fill(mask, -math.inf) if boolean else Y + mask.to(Y.dtype)
    elif is_causal:
        Y = _causal(Y)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        Y = Y.masked_fill(pad, -math.inf) if pad.dtype == torch.bool else Y + pad.to(Y.dtype)
    return Y


def _argument(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


class _MultiheadReader(_Reader):
    """``nn.MultiheadAttention``: a pre-hook on the module records its inputs and masks."""

    def __init__(self, name: str, mha: nn.MultiheadAttention) -> None:
        self.name, self.mha = name, mha
        self.Y: Tensor | None = None

    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            with torch.no_grad():
                self.Y = _mha_logits(
                    self.mha,
                    _argument(args, kwargs, 0, "query"),
                    _argument(args, kwargs, 1, "key"),
                    _argument(args, kwargs, 5, "attn_mask"),
                    _argument(args, kwargs, 3, "key_padding_mask"),
                    bool(_argument(args, kwargs, 7, "is_causal", False)),
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

    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
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
                    bool(_argument(args, kwargs, 3, "is_causal", False)),
                )

        return [self.layer.register_forward_pre_hook(hook, with_kwargs=True)]


def _heads_of(module: nn.Module) -> int | None:
    for attr in ("num_heads", "n_head", "n_heads"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _reader(name: str, module: nn.Module) -> _Reader | None:
    """The reader of one attention module (or encoder layer), None if not recognised."""
    from .nn import Attention

    if isinstance(module, nn.TransformerEncoderLayer):
        return _EncoderLayerReader(name, module)
    if isinstance(module, Attention):
        cfg = module.config
        scale = 1.0 / cfg.tau if cfg.attention == "shaped" else cfg.softmax_scale
        layers = module.layers
        temperature = module.gains.get("attn_temperature")
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
    blocks: Sequence[tuple[str, nn.Module]],
    attention: Sequence[AttentionEntry] | None = None,
) -> list[_Reader | None]:
    """One attention reader per block (None where no attention is reachable).

    ``attention=None``: the block itself if it is an ``nn.TransformerEncoderLayer``, else the
    first module inside it that is the library's ``Attention``, an ``nn.MultiheadAttention``
    or a GPT-2 / nanoGPT attention (``c_attn`` and ``num_heads`` / ``n_head``). Otherwise one
    entry per block: a module, its name in ``model.named_modules()``, or None.
    """
    if attention is None:
        found: list[_Reader | None] = []
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
    readers: list[_Reader | None] = []
    for i, entry in enumerate(attention):
        if entry is None:
            readers.append(None)
            continue
        name, entry = _submodule(modules, names, entry, "attention", i)
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


# ---------------------------------------------------------------- measuring


def _weights(
    blocks: Sequence[tuple[str, nn.Module]],
) -> tuple[list[str], list[dict[str, Tensor]]]:
    """Names (relative to their block, in order of first appearance) of the blocks' weight
    matrices (parameters of 2 or more dimensions), and each block's {name: parameter}."""
    order: dict[str, None] = {}
    per_block: list[dict[str, Tensor]] = []
    for _, block in blocks:
        params: dict[str, Tensor] = {n: p for n, p in block.named_parameters() if p.dim() >= 2}
        order.update(dict.fromkeys(params))
        per_block.append(params)
    return list(order), per_block


def _gains(
    blocks: Sequence[tuple[str, nn.Module]],
) -> tuple[list[str], list[tuple[int, int, Tensor]]]:
    """Names of the blocks' trainable gains (parameters ``...gains.<name>``: the simplified
    blocks' and the trainable shape's, docs/theory.md#trainable-shape), in order of first
    appearance, and (block, name index, parameter) of each."""
    order: dict[str, None] = {}
    found: list[tuple[int, str, Tensor]] = []
    for b, (_, block) in enumerate(blocks):
        for name, p in block.named_parameters():
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] == "gains":
                order[parts[-1]] = None
                found.append((b, parts[-1], p))
    names = list(order)
    return names, [(b, names.index(n), p) for b, n, p in found]


def _slopes(block: nn.Module) -> tuple[Tensor | float, Tensor | float] | None:
    """(s_+, s_-) of a library block's ReLU MLP (its trainable slopes, else the configured
    constants); None for any other block."""
    from .activation import relu_slopes
    from .nn import MLP

    mlp = getattr(block, "mlp", None)
    if not isinstance(mlp, MLP) or mlp.config.mlp not in ("shaped_relu", "relu"):
        return None
    if "mlp_s_plus" in mlp.gains:
        return mlp.gains["mlp_s_plus"], mlp.gains["mlp_s_minus"]
    s_plus, s_minus, _ = relu_slopes(mlp.config)
    return s_plus, s_minus


def mlp_kappa(s_plus: Tensor | float, s_minus: Tensor | float) -> Tensor:
    """Mean over channels of ``kappa = (s_+ - s_-)^2 / (2 (s_+^2 + s_-^2))``, how far a ReLU
    MLP's kernel map is from linear (0: linear, 1/2: plain ReLU; docs/theory.md#kernel-map)."""
    sp = torch.as_tensor(s_plus, dtype=torch.float64)
    sm = torch.as_tensor(s_minus, dtype=torch.float64)
    return ((sp - sm) ** 2 / (2 * (sp**2 + sm**2))).mean()


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
        self.readers = find_attention(model, self.blocks, attention)
        self.weight_names, params = _weights(self.blocks)
        self.gain_names, self._gain_params = _gains(self.blocks)
        self._slopes = [_slopes(block) for _, block in self.blocks]
        index = {name: w for w, name in enumerate(self.weight_names)}
        self._flat = [(b, index[n], p) for b, ps in enumerate(params) for n, p in ps.items()]
        self._previous: list[Tensor] | None = None
        self._previous_norms: list[Tensor] = []
        self.calls = 0
        self.steps: list[int] = []
        self.rows: list[dict[str, np.ndarray]] = []
        self.heads = 0
        self.note = _note(self.blocks, self.readers)
        if self.note:
            warnings.warn(f"Monitor: {self.note}", RuntimeWarning, stacklevel=2)

    @property
    def has_attention(self) -> bool:
        """Whether any block's attention logits are reachable."""
        return any(r is not None for r in self.readers)

    def remember_weights(self) -> None:
        """Keep the current weights as the reference of the next ``update_size``."""
        self._previous = [p.detach().clone() for _, _, p in self._flat]
        self._previous_norms = list(torch._foreach_norm(self._previous)) if self._previous else []

    def _updates(self) -> Tensor:
        """(L, W) relative updates (:func:`relative_update`) since the remembered weights (NaN
        where none), on the weights' device, in their precision (one fused norm per list)."""
        device = self._flat[0][2].device if self._flat else None
        shape = (len(self.blocks), len(self.weight_names))
        out = torch.full(shape, math.nan, dtype=torch.float64, device=device)
        if self._previous is not None and self._flat:
            current = [p.detach() for _, _, p in self._flat]
            change = torch._foreach_norm(torch._foreach_sub(current, self._previous))
            ratio = torch.stack(change).double() / torch.stack(self._previous_norms).double()
            rows = torch.tensor([b for b, _, _ in self._flat], device=device)
            cols = torch.tensor([w for _, w, _ in self._flat], device=device)
            out[rows, cols] = ratio
        self.remember_weights()
        return out

    def measure(self) -> dict[str, np.ndarray]:
        """One measurement now: {variable: array} (the trainer's log row, without ``step``)."""
        from .training.log import metric_tensors

        depth = len(self.blocks)
        streams: list[Tensor | None] = [None] * (depth + 1)
        logits: list[Tensor | None] = [None] * depth

        def on_input(x: Tensor | None, raw: Any) -> None:
            streams[0] = _checked(x, self.blocks[0][0], "input")

        def on_output(index: int, output: Any) -> None:
            streams[index + 1] = _checked(_stream(output), self.blocks[index][0], "output")
            reader = self.readers[index]
            if reader is not None:
                logits[index] = reader.take()

        def attach() -> list[Any]:
            return [h for r in self.readers if r is not None for h in r.attach()]

        _forward_once(
            self.model,
            self.inputs,
            self.blocks,
            on_input=on_input,
            on_output=on_output,
            eval_mode=self.eval,
            who="monitor",
            attach=attach,
        )
        X = [x for x in streams if x is not None]
        with torch.no_grad():
            V = torch.stack([covariance(x.double()) for x in X], dim=1)
            row = dict(metric_tensors(V))
            row["activation_rms"] = torch.stack([activation_rms(x.flatten(0, -2)) for x in X])
            row["kurtosis"] = torch.stack([excess_kurtosis(x).mean() for x in X])
            if self.has_attention:
                row.update(self._attention_rows(logits))
            row["update_size"] = self._updates()
            row.update(self._shape_rows())
        return {name: value.double().cpu().numpy() for name, value in row.items()}

    def _shape_rows(self) -> dict[str, Tensor]:
        """{shape_gain: (L, G) means, mlp_kappa: (L,)}, each only where some block has it."""
        rows: dict[str, Tensor] = {}
        if self._gain_params:
            gain = torch.full(
                (len(self.blocks), len(self.gain_names)), math.nan, dtype=torch.float64
            )
            for b, g, p in self._gain_params:
                gain[b, g] = p.detach().double().mean().cpu()
            rows["shape_gain"] = gain
        if any(s is not None for s in self._slopes):
            rows["mlp_kappa"] = torch.stack(
                [
                    mlp_kappa(*[x.detach().cpu() if isinstance(x, Tensor) else x for x in s])
                    if s is not None
                    else torch.tensor(math.nan, dtype=torch.float64)
                    for s in self._slopes
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
        step = _due_step(step, self.calls, self.every, self.steps)
        self.calls += 1
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
        import xarray as xr

        data, coords = monitor_variables(
            rows, self.weight_names, len(self.blocks), gains=self.gain_names
        )
        from .training.log import METRICS

        for name in METRICS:
            data[name] = (("step", "layer"), np.stack([r[name] for r in rows]))
        coords["step"] = np.asarray([r["step"] for r in rows], dtype=np.int64)
        coords["layer"] = np.arange(len(self.blocks) + 1)
        attrs = {
            "model": type(self.model).__qualname__,
            "blocks": ", ".join(name for name, _ in self.blocks),
            "attention": ", ".join(r.name if r else "-" for r in self.readers),
            "every": self.every,
        }
        if self.note:
            attrs["missing"] = self.note
        ds = xr.Dataset(data, coords=coords, attrs=attrs)
        ds["step"].attrs["long_name"] = "optimiser step"
        return ds


def _checked(x: Tensor | None, name: str, what: str) -> Tensor:
    if x is None or x.dim() != 3:
        shape = None if x is None else tuple(x.shape)
        raise ParameterError(
            "blocks",
            f"the {what} of block {name!r} is not a (batch, tokens, width) tensor (got "
            f"{shape}): the monitor records the residual stream, pass blocks= that carry it",
        )
    return x.detach()


def _note(blocks: Sequence[tuple[str, nn.Module]], readers: Sequence[_Reader | None]) -> str:
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
