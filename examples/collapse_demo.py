"""Rank collapse in one screen: standard vs shaped attention at initialisation.

Runs random ``Transformer`` modules (explicit weights) on an equicorrelated input and prints the
mean token correlation after each group of blocks (THEORY section 4).

    python examples/collapse_demo.py
"""

from __future__ import annotations

import math

import torch

from shapedtx import ModelConfig, Transformer
from shapedtx.metrics import mean_correlation


def equicorrelated_input(m: int, n: int, rho0: float, gen: torch.Generator) -> torch.Tensor:
    """X (m, n) with X X^T / n = (1 - rho0) I + rho0 11^T exactly."""
    V0 = (1 - rho0) * torch.eye(m) + rho0 * torch.ones(m, m)
    basis, _ = torch.linalg.qr(torch.randn(n, m, generator=gen))
    return math.sqrt(n) * torch.linalg.cholesky(V0) @ basis.T


def main(width: int = 200, depth: int = 50, tokens: int = 4, samples: int = 16) -> None:
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(0)
    X = torch.stack([equicorrelated_input(tokens, width, 0.2, gen) for _ in range(samples)])
    print(f"mean token correlation, width {width}, {samples} networks, rho0 = 0.2")
    print(f"{'layer':>6} {'standard':>10} {'shaped':>10}")
    rhos = {}
    for kind in ("softmax", "shaped"):
        torch.manual_seed(1)
        config = ModelConfig(width=width, depth=depth, attention=kind)
        with torch.no_grad():
            V = torch.stack([Transformer(config).covariances(x[None])[0] for x in X])
        rhos[kind] = mean_correlation(V).mean(0)
    for layer in (0, 1, 5, 10, 25, depth):
        print(f"{layer:>6} {rhos['softmax'][layer]:>10.3f} {rhos['shaped'][layer]:>10.3f}")


if __name__ == "__main__":
    main()
