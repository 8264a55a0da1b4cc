"""Causal byte-level language model around ``shapedtx.Transformer`` (no new layer code)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validation import ParameterError
from ..config import GPT2_STD, ModelConfig
from ..nn import MLP, Attention, Transformer, init_linear, layer_norm_module
from .data import VOCAB


class LanguageModel(nn.Module):
    """Bytes -> embedding -> ``Transformer(config)`` -> [LayerNorm] -> unembedding -> logits.

    ``init="fan_in"``: token and learned position embeddings are N(0, 1/2) each, so the input
    token covariance has unit diagonal (V^{aa} = 1, docs/theory.md#notation), and the unembedding is
    N(0, 1/n). ``init="gpt2"`` and ``"mup"``: embeddings and unembedding N(0, 0.02^2)
    (untied). The unembedding has a zero bias; ``config.final_norm`` adds an affine LayerNorm
    before it; ``config.output_multiplier`` multiplies its input by ``1 / m_N = base_width /
    width`` (muP's output multiplier, docs/theory.md#transfer).
    ``config.causal`` must be True (the causal shaped attention of docs/theory.md#layers goes
    through the fused SDPA path).

    tokens: (B, m) int64 -> logits (B, m, 256).
    """

    def __init__(self, config: ModelConfig, max_len: int) -> None:
        super().__init__()
        if not config.causal:
            raise ParameterError("config", "config.causal must be True for a causal language model")
        self.config = config
        n = config.width
        small = config.init in ("gpt2", "mup")  # N(0, 0.02^2), as GPT-2 and muP's reference
        std = GPT2_STD if small else math.sqrt(0.5)
        self.embed = nn.Embedding(VOCAB, n)
        self.position = nn.Parameter(torch.empty(max_len, n))
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.normal_(self.position, std=std)
        self.body = Transformer(config, fused=True)
        self.final_norm = layer_norm_module(n) if config.final_norm else None
        self.unembed = init_linear(n, VOCAB, bias=True, std=GPT2_STD if small else None)
        # muP's output multiplier 1 / m_N (None: no multiplier, the unchanged graph)
        self.output_scale = 1.0 / config.width_multiplier if config.output_multiplier else None

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """tokens (B, m) -> X0 (B, m, n)."""
        return self.embed(tokens) + self.position[: tokens.shape[-1]]

    def readout(self, X: Tensor) -> Tensor:
        """Last hidden state (B, m, n) -> logits (B, m, 256)."""
        X = self.final_norm(X) if self.final_norm is not None else X
        return self.unembed(X if self.output_scale is None else X * self.output_scale)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.readout(self.body(self.embed_tokens(tokens)))

    def loss(self, batch: Tensor) -> Tensor:
        """Mean next-byte cross-entropy (nats) of windows batch (B, m + 1) -> scalar."""
        logits = self(batch[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

    def parameter_groups(self) -> dict[str, str]:
        """Parameter name (as in ``named_parameters()``) -> its learning-rate transfer group
        (:data:`shapedtx.training.transfer.GROUPS`), by the module that holds it: ``hidden``
        the weight of every linear map of the blocks' attention and MLP, ``block_vector`` every
        other parameter of the blocks (biases, norm gains, trainable gains), ``embedding`` the
        token and position embeddings, ``readout`` the unembedding matrix, ``final`` the final
        LayerNorm and the unembedding bias (docs/theory.md#transfer)."""
        maps = [m for m in self.body.modules() if isinstance(m, (Attention, MLP))]
        hidden = {id(getattr(layer, "weight", None)) for m in maps for layer in m.layers.values()}
        owner: dict[int, str] = {id(self.embed.weight): "embedding", id(self.position): "embedding"}
        owner[id(self.unembed.weight)] = "readout"
        final = [self.unembed.bias, *(self.final_norm.parameters() if self.final_norm else ())]
        owner.update(dict.fromkeys(map(id, final), "final"))
        for p in self.body.parameters():
            owner[id(p)] = "hidden" if id(p) in hidden else "block_vector"
        return {name: owner[id(p)] for name, p in self.named_parameters()}

    def parameter_group(self, name: str) -> str:
        """The transfer group of the parameter ``name`` (:meth:`parameter_groups`);
        ParameterError for a name that is not one of the model's parameters."""
        groups = self.parameter_groups()
        if name not in groups:
            raise ParameterError(
                "name", f"name is not a parameter of this LanguageModel, got {name!r}"
            )
        return groups[name]

    @torch.no_grad()
    def hidden_states(self, tokens: Tensor) -> list[Tensor]:
        """The depth + 1 residual streams (embedding output first), each (B, m, n)."""
        _, hidden = self.body(self.embed_tokens(tokens), return_hidden=True)
        return hidden
