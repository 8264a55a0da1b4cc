"""Width scaling of the three simulation methods, and the finite-width correction to the SDE.

Part 1 (cost): seconds per (block x sample) of ``simulations.simulate`` against the width n for
``weights`` (explicit n x n matrices, O(n^2)), ``exact`` (docs/theory.md#samplers, O(m^2 n)) and
``gram`` (width-independent Markov chain, O(m^3)), on one attention-only shaped network
(one head, value only, n_k = n), m tokens, float64, one torch thread, best of ``--repeats``;
plus ``gram`` with a shaped-ReLU MLP (its exact hidden Gram matrix costs O(m^2 n)). Each
measurement uses enough samples x blocks to last about ``--target`` seconds; ``weights``
stops at the first width whose single block-sample takes more than ``--weights-limit``
seconds. The log-log slope is fitted on the widest half of each method's widths (at least
three; at small widths fixed per-call overheads dominate).

Part 2 (finite-width correction): distance between the network and the SDE at T = depth / n
(shaped attention, one head, m = 4, rho0 = 0.2; default gamma = 0.7, tau0 = 2, T = 0.5: large
finite-width effects, SDE blow-up below 1e-3; the section 6 configuration gamma = 2^-1.5,
tau0 = 1 has gaps at the Monte Carlo floor for every n >= 16) for widths 8 to ``--max-width``
with the gram sampler (depth = T n blocks, only the final layer kept), cross-checked with
``exact`` at the small widths; the SDE is ``sde.solve`` with step ``--dt`` (default 2^-10, far
below 1/n where the gap is resolved). Distances from :func:`simulations.convergence` (W1 and
KS of pooled rho_T, median gap with its standard error, Monte Carlo noise floor), plus the
slope over the resolved widths (distance above twice its floor).

    python benchmarks/bench_scaling.py                    # about 4 minutes on 2 cores
    python benchmarks/bench_scaling.py --quick            # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import torch
from matplotlib.figure import Figure

import sde
from shapedtx import ModelConfig, covariance_dataset
from simulations import GramSampler, GroupedNormal, equicorrelated, simulate
from simulations.convergence import at_width, convergence
from simulations.plots import plot_convergence, save_figure

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# Part 1: cost per block-sample
# --------------------------------------------------------------------------------------------
def _seconds(cfg: ModelConfig, V0: torch.Tensor, method: str, samples: int, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        with warnings.catch_warnings():  # the driver's chunk estimate assumes 64-sample groups
            warnings.filterwarnings("ignore", "memory_budget", RuntimeWarning)
            start = time.perf_counter()
            ds = simulate(cfg, V0, samples, method=method, seed=0, progress=False)
            best = min(best, time.perf_counter() - start)
    assert ds.attrs["nonfinite"] == 0
    return best


def _cost(method: str, cfg: ModelConfig, V0, args) -> float:
    """Seconds per block-sample: calibrate on one block, then time about ``args.target`` s.

    gram is batched (up to one generator group of 256 samples: its per-sample cost depends on
    the batch); the token samplers use at most 16 samples."""
    one = _seconds(cfg.replace(depth=1), V0, method, 1, 1)
    cap = GramSampler.group_size if method == "gram" else 16
    samples = max(1, min(cap, round(args.target / one)))
    per = _seconds(cfg.replace(depth=1), V0, method, samples, 1) / samples
    blocks = max(1, min(64, round(args.target / (per * samples))))
    return _seconds(cfg.replace(depth=blocks), V0, method, samples, args.repeats) / (
        samples * blocks
    )


def _fit_slope(n: list[int], cost: list[float]) -> tuple[float, list[int]]:
    """Least-squares log-log slope over the widest half of the widths (at least 3)."""
    k = max(3, math.ceil(len(n) / 2))
    x, y = np.log(np.asarray(n[-k:], float)), np.log(np.asarray(cost[-k:]))
    return float(np.polyfit(x, y, 1)[0]), n[-k:]


def cost_study(args) -> dict:
    V0 = equicorrelated(args.tokens, 0.2)
    widths = [2**k for k in range(args.min_log2, args.max_log2 + 1)]
    series = {"weights": {}, "exact": {}, "gram": {}, "gram (with MLP)": {}}
    for n in widths:
        cfg = ModelConfig(width=n, depth=1, attention="shaped", mlp="none")
        for name, method, c in (
            ("weights", "weights", cfg),
            ("exact", "exact", cfg),
            ("gram", "gram", cfg),
            ("gram (with MLP)", "gram", cfg.replace(mlp="shaped_relu")),
        ):
            if name == "weights" and series[name].get("stopped"):
                continue
            per = _cost(method, c, V0, args)
            series[name][n] = per
            print(
                f"cost  n = {n:>8}  {name:>16}: {1e6 * per:12.1f} us per block-sample", flush=True
            )
            if name == "weights" and per > args.weights_limit:
                series[name]["stopped"] = n
    out = {}
    for name, s in series.items():
        ns = [k for k in s if k != "stopped"]
        cost = [s[k] for k in ns]
        slope, fitted = _fit_slope(ns, cost)
        out[name] = {"widths": ns, "seconds": cost, "slope": slope, "fit_widths": fitted}
        print(f"slope {name:>16}: {slope:.2f} (widths {fitted[0]}..{fitted[-1]})")
    return out


# --------------------------------------------------------------------------------------------
# Part 2: finite-width correction at fixed T
# --------------------------------------------------------------------------------------------
def final_covariances(cfg: ModelConfig, V0: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    """V_depth: (samples, m, m) of the gram sampler, the same numbers as
    ``simulate(..., method="gram")`` in one chunk, without recording every layer (the driver
    keeps (samples, depth + 1, m, m), too much at depth = T n for large n)."""
    G = GramSampler.group_size
    sizes = [min(G, samples - g * G) for g in range(math.ceil(samples / G))]
    rng = GroupedNormal(seed, range(len(sizes)), sizes, V0.device)
    sampler = GramSampler(cfg, rng)
    L = sampler.init(V0, samples)
    for _ in range(cfg.depth):
        L = sampler.step(L)
    return sampler.covariance(L)


def _network_dataset(cfg, V0, samples, seed) -> tuple:
    start = time.perf_counter()
    VT = final_covariances(cfg, V0, samples, seed)
    seconds = time.perf_counter() - start
    V = torch.stack([V0.expand_as(VT), VT], dim=1)
    ds = covariance_dataset(V, np.array([0.0, cfg.T]), cfg, source="network", method="gram",
                            seed=seed, layer=np.array([0, cfg.depth]))  # fmt: skip
    return ds, seconds


def width_study(args) -> dict:
    depth = args.T * 8
    if depth != round(depth):
        raise ValueError(f"T * 8 must be an integer (the smallest width is 8), got T = {args.T}")
    cfg0 = ModelConfig(width=8, depth=round(depth), gamma=args.gamma, tau0=args.tau0)
    V0 = equicorrelated(4, 0.2)
    # consistency: the final-layer loop reproduces simulate() exactly
    small = at_width(cfg0, 16)
    ref = torch.from_numpy(simulate(small, V0, 300, method="gram", seed=3)["V"].values[:, -1])
    assert torch.equal(final_covariances(small, V0, 300, 3), ref)

    start = time.perf_counter()
    limit = sde.solve(cfg0, V0, args.sde_samples, dt=args.dt, seed=10**6, progress=False)
    sde_seconds = time.perf_counter() - start
    print(f"SDE: {args.sde_samples} paths, dt = {args.dt:g}, {sde_seconds:.1f} s, "
          f"exploded {limit.attrs['exploded_fraction']:.4f}", flush=True)  # fmt: skip

    widths = [2**k for k in range(3, int(math.log2(args.max_width)) + 1)]
    nets, seconds = {}, {}
    for n in widths:
        cfg = at_width(cfg0, n)
        nets[n], seconds[n] = _network_dataset(cfg, V0, args.samples, seed=n)
        print(f"gram  n = {n:>6}, depth {cfg.depth:>6}: {seconds[n]:7.1f} s", flush=True)
    result = convergence(cfg0, widths, V0, args.samples, limit=limit, networks=nets)
    exact_widths = [n for n in widths if n <= args.exact_max_width]
    exact = convergence(cfg0, exact_widths, V0, args.samples, limit=limit, method="exact",
                        seed=1, progress=False) if len(exact_widths) > 1 else None  # fmt: skip
    rows = []
    for i, n in enumerate(widths):
        r = result.isel(width=i)
        row = {
            "width": n,
            "depth": int(r["depth"]),
            "seconds": seconds[n],
            "w1_rho": float(r["w1_rho"]),
            "ks_rho": float(r["ks_rho"]),
            "ks_rho_pvalue": float(r["ks_rho_pvalue"]),
            "w1_logVaa": float(r["w1_logVaa"]),
            "median_rho_gap": float(r["median_rho_gap"]),
            "median_rho_gap_se": float(r["median_rho_gap_se"]),
        }
        if exact is not None and n in exact_widths:
            row["exact_w1_rho"] = float(exact["w1_rho"].sel(width=n))
            row["exact_median_rho_gap"] = float(exact["median_rho_gap"].sel(width=n))
        rows.append(row)
        print("width " + json.dumps(row), flush=True)
    attrs = {k: float(v) for k, v in result.attrs.items() if "slope" in k or "floor" in k}
    # slope over the resolved widths only (distance above twice its Monte Carlo floor): the
    # fit of simulations.convergence uses every width and is flattened by the floor
    for stat in ("w1_rho", "ks_rho", "w1_logVaa"):
        d = np.array([r[stat] for r in rows])
        ok = d > 2 * attrs[f"{stat}_noise_floor"]
        n_ok = np.array(widths, float)[ok]
        attrs[f"{stat}_resolved_max_width"] = float(n_ok.max()) if ok.any() else math.nan
        slope, intercept = (
            np.polyfit(np.log(n_ok), np.log(d[ok]), 1) if ok.sum() >= 2 else (math.nan,) * 2
        )
        attrs[f"{stat}_resolved_slope"] = float(slope)
        attrs[f"{stat}_resolved_intercept"] = float(intercept)
    return {"rows": rows, "attrs": attrs, "result": result, "exact": exact,
            "sde_seconds": sde_seconds}  # fmt: skip


# --------------------------------------------------------------------------------------------
def _figure(costs: dict, widths: dict, path: Path) -> None:
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    ax_cost, ax_w1, ax_gap = fig.subplots(1, 3)
    for (name, s), marker in zip(costs.items(), "osD^", strict=True):
        ax_cost.loglog(s["widths"], s["seconds"], marker + "-",
                       label=f"{name}: slope {s['slope']:.2f}")  # fmt: skip
    ax_cost.set_xlabel("width n")
    ax_cost.set_ylabel("seconds per block-sample")
    ax_cost.set_title("Cost per block-sample (attention-only shaped network)")
    ax_cost.grid(alpha=0.3, which="both")
    ax_cost.legend(fontsize="small")
    shown = widths["result"].copy()  # draw the fit over the resolved widths (see width_study)
    shown.attrs["w1_rho_slope"] = widths["attrs"]["w1_rho_resolved_slope"]
    shown.attrs["w1_rho_intercept"] = widths["attrs"]["w1_rho_resolved_intercept"]
    plot_convergence(shown, statistic="w1_rho", ax=ax_w1)
    if widths["exact"] is not None:
        ex = widths["exact"]
        ax_w1.loglog(ex["width"].values, ex["w1_rho"].values, "x", color="tab:green",
                     label="w1_rho, exact sampler")  # fmt: skip
        ax_w1.legend(fontsize="small")
    rows = widths["rows"]
    n = np.array([r["width"] for r in rows], float)
    gap = np.array([r["median_rho_gap"] for r in rows])
    se = np.array([r["median_rho_gap_se"] for r in rows])
    ax_gap.errorbar(n, gap, yerr=2 * se, fmt="o-", capsize=3, label="network - SDE (± 2 SE)")
    ax_gap.axhline(0, color="k", lw=0.8)
    ax_gap.set_xscale("log")
    ax_gap.set_xlabel("width n (depth = T n), gram sampler")
    ax_gap.set_ylabel("median of rho_T: network - SDE")
    at = widths["result"].attrs
    ax_gap.set_title(
        f"median rho_T gap (gamma={at['config.gamma']:g}, tau0={at['config.tau0']:g}, "
        f"T={at['T']:g}, m=4)"
    )
    ax_gap.grid(alpha=0.3, which="both")
    ax_gap.legend(fontsize="small")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8, help="m for the cost study (default 8)")
    parser.add_argument("--min-log2", type=int, default=8)
    parser.add_argument("--max-log2", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.5, help="seconds per timing")
    parser.add_argument("--repeats", type=int, default=2, help="best of N (default 2)")
    parser.add_argument(
        "--weights-limit",
        type=float,
        default=1.0,
        help="stop weights after a block-sample costs this many seconds",
    )
    parser.add_argument("--gamma", type=float, default=0.7, help="part 2 (default 0.7)")
    parser.add_argument("--tau0", type=float, default=2.0, help="part 2 (default 2)")
    parser.add_argument("--T", type=float, default=0.5, help="part 2: depth / width (0.5)")
    parser.add_argument("--samples", type=int, default=8000, help="networks per width")
    parser.add_argument("--sde-samples", type=int, default=16000)
    parser.add_argument("--dt", type=float, default=2**-10)
    parser.add_argument("--max-width", type=int, default=2**12)
    parser.add_argument("--exact-max-width", type=int, default=2**7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "figures" / "scaling")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_log2, args.target, args.repeats = 10, 0.05, 1
        args.samples, args.sde_samples, args.dt, args.max_width = 200, 400, 0.01, 2**6
        args.exact_max_width = 2**4
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    costs = cost_study(args)
    widths = width_study(args)
    _figure(costs, widths, args.out)
    summary = {
        "costs": costs,
        "widths": widths["rows"],
        "fits": widths["attrs"],
        "sde_seconds": widths["sde_seconds"],
        "total_seconds": time.perf_counter() - start,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({"fits": widths["attrs"], "total_seconds": summary["total_seconds"]}))


if __name__ == "__main__":
    main()
