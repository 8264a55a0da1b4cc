"""Monte Carlo assertions shared by the statistical tests: tolerances from standard errors."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


def mean_and_se(samples: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample mean and its standard error along ``dim``."""
    n = samples.shape[dim]
    return samples.mean(dim), samples.std(dim) / n**0.5


def assert_mean_within_se(
    samples: torch.Tensor, expected: torch.Tensor, z: float = 5.0, dim: int = 0, floor: float = 0.0
) -> float:
    """Assert |mean - expected| <= z * SE (+ floor) entrywise; returns the largest |diff| / SE."""
    mean, se = mean_and_se(samples, dim)
    diff = (mean - expected).abs()
    worst = (diff / (se + 1e-300)).max().item()
    bad = diff > z * se + floor
    assert not bool(bad.any()), (
        f"MC mean off by {worst:.2f} SE (z={z}); max |diff| = {diff.max().item():.3g}, "
        f"max SE = {se.max().item():.3g}"
    )
    return worst


def two_sample_pvalue(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov p-value of two 1-d samples."""
    a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
    b = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else b
    return float(stats.ks_2samp(np.ravel(a), np.ravel(b)).pvalue)
