"""Argument checks shared by the packages: one ValueError wording everywhere."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``; else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_dtype(dtype: Any, name: str = "dtype") -> Any:
    """``dtype`` if it is torch.float32 or torch.float64; else ValueError naming it."""
    import torch

    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name} must be torch.float32 or torch.float64, got {dtype!r}")
    return dtype


def check_device(device: Any, name: str = "device") -> Any:
    """``device`` as a ``torch.device`` (None: cpu); ValueError naming it if it is not a
    device or is not available (CUDA without a GPU, an index beyond the GPU count)."""
    import torch

    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{name} must be a torch device such as 'cpu' or 'cuda', got "
                         f"{device!r} ({err})") from None  # fmt: skip
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {device!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"{name} {device!r}: only {torch.cuda.device_count()} CUDA device(s) available"
            )
    elif dev.type not in ("cpu", "mps", "meta"):
        raise ValueError(f"{name} must be 'cpu' or 'cuda[:index]', got {device!r}")
    return dev
