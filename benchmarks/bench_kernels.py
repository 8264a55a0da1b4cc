"""Benchmark: the compiled CPU kernels against what they replace, in one run.

- N(0, 1) numbers: ``simulations._compiled_random.random_fill`` (numba) against numpy's
  ``Generator.standard_normal(out=...)`` and float64 ``torch.randn``, 2^16 numbers per call;
- chi-square variables (the Bartlett diagonals of the gram sampler: 2 x 8 shapes around
  n / 2 = 512): the compiled fill against numpy's ``Generator.standard_gamma`` (numpy's
  ``chisquare``), 256 samples per call;
- Cholesky factors of a stack of m x m matrices: ``simulations._compiled_cholesky`` against
  torch's batched LAPACK call (``cholesky_ex``, as the gram sampler called it), for m from 4
  to 64 (the kernel is used up to ``MAX_SIZE``);
- the causal centring of shaped attention in training, forward ``(I - C) v + attended`` and
  backward ``(I - C)^T g``: ``shapedtx._compiled_centring`` against the blockwise torch form
  it replaces on CPU (``shapedtx.attention._causal_centring``, plus the in-place add of
  ``attended`` for the forward), float32, at the ``bench_centring.py`` size (16, 128, 128)
  and a larger (32, 512, 256).

Each row checks first that both sides give the same numbers (bit for bit for the random
numbers, to 1e-13 for the factors, to 1e-5 of max |result| for the float32 centring).
Variants alternate call by call; the table gives the median time per number (or per factor,
per element) and the median over rounds of the per-round ratio, with its range. One thread.

    python benchmarks/bench_kernels.py
    python benchmarks/bench_kernels.py --rounds 51
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from shapedtx import _compiled_centring
from shapedtx.attention import _causal_centring
from simulations._compiled_cholesky import MAX_SIZE
from simulations._compiled_cholesky import _compiled as _compiled_cholesky
from simulations._compiled_random import random_fill


def _time(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, alternating call by call after one warm-up each."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _rows(title: str, times: dict[str, list[float]], per_call: int, unit: str) -> list[str]:
    """Table rows: median per number (ns) and the ratio to the first variant per round."""
    names = list(times)
    base = times[names[0]]
    out = []
    for name in names:
        ratios = [t / b for t, b in zip(times[name], base, strict=True)]
        ratio = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        ns = statistics.median(times[name]) / per_call * 1e9
        out.append(f"| {title} | {name} | {ns:.3g} {unit} | {ratio} |")
    return out


def normals(rounds: int) -> list[str]:
    size = 2**16
    a, b = np.empty(size), np.empty(size)
    gen_a, gen_b = (np.random.Generator(np.random.SFC64(1)) for _ in range(2))
    random_fill(gen_a, [a])
    gen_b.standard_normal(out=b)
    assert np.array_equal(a, b), "the compiled normals differ from numpy's"
    t = torch.empty(size, dtype=torch.float64)
    torch_gen = torch.Generator().manual_seed(1)
    times = _time(
        {
            "compiled": lambda: random_fill(gen_a, [a]),
            "numpy": lambda: gen_b.standard_normal(out=b),
            "torch.randn": lambda: torch.randn(size, out=t, generator=torch_gen),
        },
        rounds,
    )
    return _rows("N(0, 1), float64", times, size, "ns / number")


def chi_square(rounds: int) -> list[str]:
    half = np.concatenate([1024 - np.arange(8.0), 1016 - np.arange(8.0)]) / 2
    a, b = np.empty((256, half.size)), np.empty((256, half.size))
    gen_a, gen_b = (np.random.Generator(np.random.SFC64(2)) for _ in range(2))
    random_fill(gen_a, [], half, a)
    gen_b.standard_gamma(half, size=b.shape, out=b)
    assert np.array_equal(a, 2 * b), "the compiled chi-square variables differ from numpy's"
    times = _time(
        {
            "compiled": lambda: random_fill(gen_a, [], half, a),
            "numpy": lambda: gen_b.standard_gamma(half, size=b.shape, out=b),
        },
        rounds,
    )
    return _rows("chi-square, dof 1009-1024", times, a.size, "ns / number")


def cholesky(rounds: int) -> list[str]:
    kernel = _compiled_cholesky()  # the compiled loop itself, also above MAX_SIZE
    return [row for m in (4, 8, 16, 32, 64) for row in _cholesky_rows(m, kernel, rounds)]


def _cholesky_rows(m: int, kernel: Callable[..., None], rounds: int) -> list[str]:
    samples = max(16, 2**15 // m**2)
    M = torch.randn(
        samples, m, 2 * m, generator=torch.Generator().manual_seed(m), dtype=torch.float64
    )
    V = M @ M.mT
    L, U = np.empty(V.shape), torch.empty_like(V)
    info, bad = torch.empty(samples, dtype=torch.int32), np.empty(samples, dtype=np.bool_)
    V_np = V.numpy()
    variants = {
        "LAPACK (cholesky_ex)": lambda: torch.linalg.cholesky_ex(V, upper=True, out=(U.mT, info)),
        "compiled": lambda: kernel(V_np, L, bad),
    }
    times = _time(variants, rounds)
    assert np.abs(L - U.numpy()).max() <= 1e-13 * float(U.abs().max()) and not bad.any()
    used = "used" if m <= MAX_SIZE else "not used"
    return _rows(f"Cholesky, m = {m} ({used})", times, samples, "ns / factor")


def centring(rounds: int) -> list[str]:
    return [
        row
        for shape in ((16, 128, 128), (32, 512, 256))
        for transpose in (False, True)
        for row in _centring_rows(shape, transpose, rounds)
    ]


def _torch_centred_sum(attended: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = _causal_centring(v, False, fresh=True)
    return out.add_(attended)


def _centring_rows(shape: tuple[int, ...], transpose: bool, rounds: int) -> list[str]:
    gen = torch.Generator().manual_seed(3)
    x, a = (torch.randn(shape, generator=gen) for _ in range(2))
    if transpose:
        variants = {
            "torch form": lambda: _causal_centring(x, True, fresh=True),
            "compiled": lambda: _compiled_centring.causal_centring_transpose(x),
        }
    else:
        variants = {
            "torch form": lambda: _torch_centred_sum(a, x),
            "compiled": lambda: _compiled_centring.causal_centred_sum(a, x),
        }
    torch_form, compiled = (fn() for fn in variants.values())
    assert (compiled - torch_form).abs().max() <= 1e-5 * torch_form.abs().max()
    times = _time(variants, rounds)
    title = f"centring {'backward' if transpose else 'forward'}, {tuple(shape)} float32"
    return _rows(title, times, x.numel(), "ns / element")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=31)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"compiled CPU kernels, 1 thread, {args.rounds} alternating rounds")
    print("| kernel | variant | median time | time / first variant: median [min, max] |")
    print("|---|---|---|---|")
    for kernel in (normals, chi_square, cholesky, centring):
        rows = kernel(args.rounds)
        print("\n".join(rows))


if __name__ == "__main__":
    main()
