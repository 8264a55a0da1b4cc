"""Batched products of many small matrices (the simulators' hot loop).

On CPU, ``torch.bmm`` on a batch of small float64 matrices calls BLAS once per matrix, while
numpy's stacked ``matmul`` is several times faster (benchmarks/HISTORY.md, "Exact sampler
vs a plain-numpy QR-trick reference", has the figures); :func:`small_matmul` uses numpy there
when no gradient is needed and torch otherwise (GPU, autograd, other dtypes). Same values up
to rounding.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_NUMPY_DTYPES = (torch.float32, torch.float64)


def small_matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """``a @ b`` (broadcast batch dimensions), through numpy for CPU tensors without grad;
    ``out``: a tensor of the result's shape and dtype to write it into (returned)."""
    if (
        a.device.type == "cpu"
        and b.device.type == "cpu"
        and a.dtype == b.dtype
        and a.dtype in _NUMPY_DTYPES
        and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
    ):
        with np.errstate(all="ignore"):  # overflow gives inf/nan silently, as in torch
            product = np.matmul(
                _blasable(a.numpy()),
                _blasable(b.numpy()),
                out=None if out is None else out.numpy(),
            )
        return torch.from_numpy(product) if out is None else out
    return a @ b if out is None else torch.matmul(a, b, out=out)


def transpose_into(x: Tensor, out: Tensor) -> Tensor:
    """``out = x^T`` (the last two dimensions) for x: (..., r, c), out: (..., c, r); through
    numpy on CPU (faster than torch's strided copy for stacks of 8 x 8 matrices;
    benchmarks/HISTORY.md, "Gram sampler", fifth pass)."""
    if x.device.type == "cpu" and out.device.type == "cpu" and x.dtype in _NUMPY_DTYPES:
        np.copyto(out.numpy(), x.detach().numpy().swapaxes(-1, -2))
        return out
    return out.copy_(x.mT)


TRANSPOSED_DIRECT = 2**12
"""Transposed (F-contiguous) matrices of at least this many entries go to numpy's matmul as
they are (its BLAS call with a transpose flag, or syrk for ``x @ x^T``: faster than a copy
for an 8 x 1024 factor); smaller ones are copied first (faster at 8 x 8; the figures:
benchmarks/HISTORY.md, "Gram sampler")."""


def _blasable(x: np.ndarray) -> np.ndarray:
    """x with C-contiguous matrices (any batch strides), or large F-contiguous ones: numpy's
    matmul then calls BLAS per matrix; its loop for other strides is several times slower."""
    if x.ndim >= 2:
        rows, cols = x.shape[-2:]
        if x.strides[-1] == x.itemsize and x.strides[-2] == cols * x.itemsize:
            return x
        transposed = x.strides[-2] == x.itemsize and x.strides[-1] == rows * x.itemsize
        if transposed and rows * cols >= TRANSPOSED_DIRECT:
            return x
    return np.ascontiguousarray(x)
