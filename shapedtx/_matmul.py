"""Batched products of many small matrices (the simulators' hot loop).

On CPU, ``torch.bmm`` on a batch of small float64 matrices calls BLAS once per matrix (about
4 us per 4 x 4 by 4 x 200 product on the 2-core benchmark machine), while numpy's stacked
``matmul`` is about 6x faster; :func:`small_matmul` uses numpy there when no gradient is
needed and torch otherwise (GPU, autograd, other dtypes). Same values up to rounding.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_NUMPY_DTYPES = (torch.float32, torch.float64)


def small_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` (broadcast batch dimensions), through numpy for CPU tensors without grad."""
    if (
        a.device.type == "cpu"
        and b.device.type == "cpu"
        and a.dtype == b.dtype
        and a.dtype in _NUMPY_DTYPES
        and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
    ):
        with np.errstate(all="ignore"):  # overflow gives inf/nan silently, as in torch
            return torch.from_numpy(np.matmul(_blasable(a.numpy()), _blasable(b.numpy())))
    return a @ b


def _blasable(x: np.ndarray) -> np.ndarray:
    """x with C-contiguous matrices (any batch strides): numpy's matmul then calls BLAS per
    matrix; its fallback loop for transposed or strided matrices is several times slower."""
    if x.ndim >= 2 and x.strides[-1] == x.itemsize and x.strides[-2] == x.shape[-1] * x.itemsize:
        return x
    return np.ascontiguousarray(x)
