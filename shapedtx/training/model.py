"""Causal byte-level language model around ``shapedtx.Transformer`` (no new layer code)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import Transformer, init_linear
from ..norm import layer_norm
from .data import VOCAB


class LanguageModel(nn.Module):
    """Bytes -> embedding -> ``Transformer(config)`` -> [LayerNorm] -> unembedding -> logits.

    Token and learned position embeddings are N(0, 1/2) each, so the input token covariance has
    unit diagonal (V^{aa} = 1, THEORY section 1). The unembedding is ``init_linear`` (N(0, 1/n),
    with bias). ``config.causal`` must be True (the causal shaped attention of THEORY section 2
    goes through the fused SDPA path).

    tokens: (B, m) int64 -> logits (B, m, 256).
    """

    def __init__(self, config: ModelConfig, max_len: int, *, final_norm: bool = False) -> None:
        super().__init__()
        if not config.causal:
            raise ValueError("config.causal must be True for a causal language model")
        self.config, self.final_norm = config, final_norm
        n = config.width
        self.embed = nn.Embedding(VOCAB, n)
        self.position = nn.Parameter(torch.empty(max_len, n))
        nn.init.normal_(self.embed.weight, std=math.sqrt(0.5))
        nn.init.normal_(self.position, std=math.sqrt(0.5))
        self.body = Transformer(config, fused=True)
        self.unembed = init_linear(n, VOCAB, bias=True)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """tokens (B, m) -> X0 (B, m, n)."""
        return self.embed(tokens) + self.position[: tokens.shape[-1]]

    def readout(self, X: Tensor) -> Tensor:
        """Last hidden state (B, m, n) -> logits (B, m, 256)."""
        return self.unembed(layer_norm(X) if self.final_norm else X)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.readout(self.body(self.embed_tokens(tokens)))

    def loss(self, batch: Tensor) -> Tensor:
        """Mean next-byte cross-entropy (nats) of windows batch (B, m + 1) -> scalar."""
        logits = self(batch[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

    @torch.no_grad()
    def hidden_states(self, tokens: Tensor) -> list[Tensor]:
        """The depth + 1 residual streams (embedding output first), each (B, m, n)."""
        _, hidden = self.body(self.embed_tokens(tokens), return_hidden=True)
        return hidden
