"""``shapedtx.Monitor`` readers: the masks of ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` on the axes PyTorch applies them (issue 66)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from shapedtx import Monitor


def _entropy(p: torch.Tensor) -> torch.Tensor:
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return -(p * logp).sum(-1).mean(-1)


class _PaddedBlock(nn.Module):
    """A batch-first residual self-attention block called with a key padding mask."""

    def __init__(self, mha: nn.MultiheadAttention, pad: torch.Tensor, positional: bool) -> None:
        super().__init__()
        self.attn, self.pad, self.positional = mha, pad, positional

    def forward(self, x):
        if self.positional:  # query, key, value, key_padding_mask
            out = self.attn(x, x, x, self.pad, False)[0]
        else:
            out = self.attn(x, x, x, key_padding_mask=self.pad, need_weights=False)[0]
        return x + out


class _Net(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.mark.parametrize("positional", [False, True])
@pytest.mark.parametrize("float_mask", [False, True])
def test_multihead_key_padding_mask_hides_keys_not_queries(positional, float_mask):
    """A key padding mask (B, m_k) hides keys: the monitor's entropy, largest logit and
    entropy reference equal those of PyTorch's own attention weights with the same mask
    (each batch row pads a different number of keys, none of the queries loses its row)."""
    torch.manual_seed(3)
    B, m, n, h = 3, 6, 8, 2
    mha = nn.MultiheadAttention(n, h, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.mul_(4.0)
    pad = torch.zeros(B, m, dtype=torch.bool)
    pad[0, 4:] = True  # row 0: 4 keys visible
    pad[2, 1:3] = True  # row 2: keys 1, 2 hidden
    mask = pad.double().masked_fill(pad, -math.inf).float() if float_mask else pad
    X = torch.randn(B, m, n)
    ds = Monitor(_Net(_PaddedBlock(mha, mask, positional)), X)(0)
    _, P = mha(X, X, X, key_padding_mask=mask, need_weights=True, average_attn_weights=False)
    assert torch.all(P[0, :, :, 4:] == 0) and torch.all(P[2, :, :, 1:3] == 0)
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
    )
    visible = (~pad).sum(-1).double()  # keys per query in each row
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(float(visible.log().mean()))
    E = n
    q = (X @ mha.in_proj_weight[:E].T + mha.in_proj_bias[:E]).unflatten(-1, (h, n // h))
    k = (X @ mha.in_proj_weight[E : 2 * E].T + mha.in_proj_bias[E : 2 * E]).unflatten(
        -1, (h, n // h)
    )
    Y = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) / math.sqrt(n // h)
    Y = Y.masked_fill(pad[:, None, None, :], -math.inf)
    torch.testing.assert_close(torch.softmax(Y, -1), P, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        ds["max_logit"][0, 0].values, Y.amax(dim=(0, 2, 3)).detach().numpy(), rtol=1e-5
    )


def test_encoder_layer_src_key_padding_mask_hides_keys():
    """``nn.TransformerEncoderLayer`` with ``src_key_padding_mask``: the monitor's entropy
    reference counts the visible keys of each row, and its entropy is that of the layer's
    self-attention weights with the same mask."""
    torch.manual_seed(4)
    B, m, n = 2, 5, 8
    layer = nn.TransformerEncoderLayer(n, 2, 16, dropout=0.0, batch_first=True)
    pad = torch.zeros(B, m, dtype=torch.bool)
    pad[1, 3:] = True

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([layer])

        def forward(self, x):
            return self.blocks[0](x, src_key_padding_mask=pad)

    X = torch.randn(B, m, n)
    ds = Monitor(Net(), X)(0)
    _, P = layer.self_attn(
        X, X, X, key_padding_mask=pad, need_weights=True, average_attn_weights=False
    )
    np.testing.assert_allclose(
        ds["attention_entropy"][0, 0].values, _entropy(P).mean(0).detach().numpy(), rtol=1e-5
    )
    reference = (math.log(5) + math.log(3)) / 2
    assert float(ds["entropy_reference"][0, 0]) == pytest.approx(reference)
