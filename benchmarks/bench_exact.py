"""Benchmark: ``simulate`` (exact, gram, default) against a plain-numpy QR-trick reference.

Causal shaped attention (one head, no W^O, no MLP), float64, CPU, m tokens,
equicorrelated V0 (rho0 = 0.2). The numpy reference is the plain QR-trick algorithm of
docs/theory.md#samplers written independently of the library: batched over all samples, ``x^T = Q
R`` by ``np.linalg.qr``, every linear map ``R^T Z / sqrt(n)`` with Z drawn by ``default_rng``
(queries, keys and values: 3 m n normals per sample and block), explicit attention matrix.
Methods run interleaved, round by round, so machine load affects them alike; the table gives
the median over rounds of each time (process CPU time by default) and of the per-round ratio
to numpy. A KS test on rho^{01} at the last layer checks that each method agrees in law with
the numpy reference.

    python benchmarks/bench_exact.py                                  # n 200 1024, m 4 8
    python benchmarks/bench_exact.py --widths 200 --tokens 4 --depth 100 --samples 1000

``--threads`` (default 1) is torch's thread count; the library then fills its random numbers
on that many threads. With more than one thread, run without ``OMP_NUM_THREADS`` so that
numpy's BLAS uses them too; the clock is then wall time (process CPU time counts every
thread).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from scipy import stats

from shapedtx import ModelConfig
from simulations import equicorrelated, simulate


def numpy_exact(cfg: ModelConfig, V0: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """V: (samples, depth + 1, m, m) of causal shaped attention, plain numpy QR trick."""
    rng = np.random.default_rng(seed)
    n, m = cfg.width, V0.shape[0]
    L = np.linalg.cholesky(V0)
    Q = np.linalg.qr(rng.standard_normal((samples, n, m)))[0]  # (s, n, m), orthonormal
    X = math.sqrt(n) * L @ Q.transpose(0, 2, 1)  # X X^T / n = V0
    C = np.tril(np.ones((m, m))) / np.arange(1, m + 1)[:, None]
    mask = np.tril(np.ones((m, m), dtype=bool))
    out = np.empty((samples, cfg.depth + 1, m, m))
    out[:, 0] = X @ X.transpose(0, 2, 1) / n
    for layer in range(1, cfg.depth + 1):
        R = np.linalg.qr(X.transpose(0, 2, 1), mode="r")  # (s, m, m)
        Rt = R.transpose(0, 2, 1) / math.sqrt(n)
        q = Rt @ rng.standard_normal((samples, m, cfg.key_dim))
        k = Rt @ rng.standard_normal((samples, m, cfg.key_dim))
        v = Rt @ rng.standard_normal((samples, m, n))
        Y = np.where(mask, q @ k.transpose(0, 2, 1) / cfg.tau, -np.inf)
        P = np.exp(Y - Y.max(-1, keepdims=True))
        A = np.eye(m) + P / P.sum(-1, keepdims=True) - C
        X = cfg.lam * X + cfg.gamma * A @ v
        out[:, layer] = X @ X.transpose(0, 2, 1) / n
    return out


def _runs(cfg: ModelConfig, V0: torch.Tensor, samples: int) -> dict:
    def lib(method: str | None):
        def run(seed: int) -> np.ndarray:
            kwargs = {} if method is None else {"method": method}
            return simulate(cfg, V0, samples, seed=seed, progress=False, **kwargs)["V"].values

        return run

    return {
        "numpy QR trick": lambda seed: numpy_exact(cfg, V0.numpy(), samples, seed),
        "exact": lib("exact"),
        "gram": lib("gram"),
        "default (auto)": lib(None),
    }


def _rho(V: np.ndarray) -> np.ndarray:
    return V[:, -1, 0, 1] / np.sqrt(V[:, -1, 0, 0] * V[:, -1, 1, 1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[200, 1024])
    p.add_argument("--tokens", type=int, nargs="+", default=[4, 8])
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--clock", choices=("cpu", "wall"), default=None, help="default: cpu at 1 thread, else wall"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock_name = args.clock or ("cpu" if args.threads == 1 else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    print(
        f"causal shaped attention, depth {args.depth}, {args.samples} samples, float64, CPU, "
        f"{args.threads} thread(s), median of {args.rounds} interleaved rounds, "
        f"{clock_name} clock"
    )
    # one-time costs of a process's first simulate call (xarray's lazy imports at the first
    # Dataset, about 0.15 s) are not the sampler's: paid before the timed rounds
    simulate(ModelConfig(width=16, depth=1), equicorrelated(2, 0.2), 2, progress=False)
    print("| n | m | method | median time (s) | time / numpy: median [min, max] | KS p vs numpy |")
    print("|---|---|---|---|---|---|")
    for n in args.widths:
        for m in args.tokens:
            cfg = ModelConfig(width=n, depth=args.depth, causal=True)
            V0 = equicorrelated(m, 0.2)
            runs = _runs(cfg, V0, args.samples)
            times: dict[str, list[float]] = {k: [] for k in runs}
            rhos: dict[str, list[np.ndarray]] = {k: [] for k in runs}
            for r in range(args.rounds):
                for name, fn in runs.items():
                    if args.threads > 1:
                        time.sleep(0.5)  # BLAS threads of the last run stop spinning
                    start = clock()
                    V = fn(r + 1)
                    times[name].append(clock() - start)
                    rhos[name].append(_rho(V))
            ref = np.concatenate(rhos["numpy QR trick"])
            for name, values in times.items():
                ratios = [t / b for t, b in zip(values, times["numpy QR trick"], strict=True)]
                pval = stats.ks_2samp(np.concatenate(rhos[name]), ref).pvalue
                print(
                    f"| {n} | {m} | {name} | {statistics.median(values):.3f} | "
                    f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] | "
                    f"{pval:.2g} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
