"""Finite-width bias: network minus SDE for the median and mean of V^{aa} and of rho at fixed T,
against the width n.

The model is a ``shapedtx compare`` preset (default ``attention``: shaped attention, one head,
value weights only; gamma = 1/sqrt(8), tau0 = 1), m = 4 tokens, rho0 = 0.2, T = d/n = 0.75;
or ``--preset shaped``: the library's ``preset("shaped")`` (4 heads with W^O, head size n / 4,
and the shaped ReLU MLP), the model of ``examples/probe_gpt2``, there at m = 8 and T = 1
(``--tokens 8 --T 1``).
Networks come from the gram sampler (exact in law; O(m^3) per block for attention-only
networks, so every width costs the same per block), in chunks of ``--chunk`` samples with
seeds ``seed + 1000 w + c`` (w the width's index, c the chunk's). The SDE reference is the
factored Euler scheme at two steps dt and dt/2 (``sde.solve_batch``, float64, final state
only), extrapolated to dt -> 0 (Richardson, weak order 1: ``2 S(dt/2) - S(dt)``), so that the
scheme's own time-step bias is not read as finite-width bias; the value at dt alone is
reported too.

Statistics at T (pooled over tokens or token pairs, one cluster per sample): median with the
cluster-robust SE of ``simulations.compare.quantiles_with_se``; mean with the SE of the
per-sample means. The fit ``gap(n) = A n^(-p)`` is a weighted least-squares fit of the
*relative* gap (network - SDE) / SDE over the widths, and its interval a parametric bootstrap
that redraws every width's network statistic and, once per replicate, the SDE's (the SDE
reference is shared by all widths, so its error is common to them).

Usage:
    nice -n 10 python examples/finite_width/finite_width.py            # results.json, .md, .png
    nice -n 10 python examples/finite_width/finite_width.py --quick    # seconds, a smoke test
    nice -n 10 python examples/finite_width/finite_width.py --preset shaped --tokens 8 --T 1
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from scipy import optimize

import simulations
from shapedtx import ModelConfig, preset
from shapedtx.covariance import equicorrelated
from simulations.compare import quantiles_with_se
from simulations.presets import PRESET_MODELS

RHO0 = 0.2
MODELS: dict[str, ModelConfig] = {
    **{name: config for name, (config, _) in PRESET_MODELS.items()},
    "shaped": preset("shaped"),
}
"""The models by ``--preset``: the ``compare`` presets and the library's ``preset("shaped")``."""
STATS = ("median_Vaa", "mean_Vaa", "median_rho", "mean_rho")


def values_at_T(V: np.ndarray) -> dict[str, np.ndarray]:
    """V: (N, m, m) -> ``Vaa`` (N, m) and ``rho`` (N, m (m - 1) / 2)."""
    d = np.einsum("nii->ni", V)
    iu = np.triu_indices(V.shape[-1], 1)
    rho = V[:, iu[0], iu[1]] / np.sqrt(d[:, iu[0]] * d[:, iu[1]])
    return {"Vaa": d, "rho": rho}


def statistics(V: np.ndarray) -> dict[str, tuple[float, float]]:
    """(value, SE) of each of :data:`STATS` from final covariances V: (N, m, m)."""
    out = {}
    for name, x in values_at_T(V).items():
        q, se = quantiles_with_se(x[:, None, :], (0.5,))
        out[f"median_{name}"] = (float(q[0, 0]), float(se[0, 0]))
        per_sample = x.mean(axis=1)
        out[f"mean_{name}"] = (
            float(per_sample.mean()),
            float(per_sample.std(ddof=1) / math.sqrt(len(per_sample))),
        )
    return out


def network_final(config, V0, samples: int, chunk: int, seed: int) -> np.ndarray:
    """Final covariances (samples, m, m) of ``samples`` networks, in chunks (the sampler keeps
    every layer; only the last is needed)."""
    out = []
    for c, start in enumerate(range(0, samples, chunk)):
        ds = simulations.simulate(
            config, V0, min(chunk, samples - start), method="gram", seed=seed + c, progress=False
        )
        out.append(np.array(ds["V"].isel(t=-1).values))
    return np.concatenate(out)


def sde_pair(
    config, V0, samples: int, T: float, dt: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Final covariances (N, m, m) at ``T`` of the SDE at step ``dt`` and ``dt / 2`` driven by
    the same Brownian paths (a coarse step's normals are the two fine steps' normals summed /
    sqrt 2; fine step k's normals from a generator seeded ``seed * 10^6 + k``), with the canonical
    factor ``V^{1/2}`` so that the two schemes are coupled path by path
    (:class:`sde.solvers.FactoredEulerStep`, ``canonical=True``). Paths flagged as blown up
    in either run are dropped from both."""
    from sde.solvers import FactoredEulerStep, integrate

    m = V0.shape[-1]
    coarse = math.ceil(T / dt - 1e-9)
    V0s = V0.to(torch.float64).expand(samples, m, m).contiguous()

    def fine_noise(k: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 10**6 + k)
        return torch.randn((samples, 2, m, m), generator=g, dtype=torch.float64)

    def coarse_noise(k: int) -> torch.Tensor:
        return (fine_noise(2 * k) + fine_noise(2 * k + 1)) / math.sqrt(2)

    out = []
    for steps, noise in ((coarse, coarse_noise), (2 * coarse, fine_noise)):
        sol = integrate(
            FactoredEulerStep(config, m, canonical=True),
            V0s,
            steps=steps,
            dt=T / steps,
            save_every=steps,
            noise=noise,
            bound=1e8,
        )
        out.append((sol.V[:, -1].numpy(), sol.exploded.numpy()))
    keep = ~(out[0][1] | out[1][1])
    return out[0][0][keep], out[1][0][keep]


def extrapolated(Vc: np.ndarray, Vf: np.ndarray, reps: int, rng) -> dict[str, tuple[float, float]]:
    """Richardson ``2 S(dt/2) - S(dt)`` of each statistic with its SE from a paired bootstrap
    over paths (the two runs share their Brownian paths, so the pair is resampled together)."""
    point = {s: 2 * statistics(Vf)[s][0] - statistics(Vc)[s][0] for s in STATS}
    draws = {s: [] for s in STATS}
    N = len(Vc)
    for _ in range(reps):
        i = rng.integers(0, N, N)
        f, c = _point_stats(Vf[i]), _point_stats(Vc[i])
        for s in STATS:
            draws[s].append(2 * f[s] - c[s])
    return {s: (point[s], float(np.std(draws[s], ddof=1))) for s in STATS}


def _point_stats(V: np.ndarray) -> dict[str, float]:
    v = values_at_T(V)
    return {
        "median_Vaa": float(np.median(v["Vaa"])),
        "mean_Vaa": float(v["Vaa"].mean()),
        "median_rho": float(np.median(v["rho"])),
        "mean_rho": float(v["rho"].mean()),
    }


def power_fit(n: np.ndarray, gap: np.ndarray, se: np.ndarray) -> tuple[float, float]:
    """Weighted least squares of ``gap = A n^(-p)``: (A, p)."""

    def model(x, A, p):
        return A * x ** (-p)

    p0 = (gap[0] * n[0], 1.0)
    (A, p), _ = optimize.curve_fit(
        model, n, gap, p0=p0, sigma=se, absolute_sigma=True, maxfev=20000
    )
    return float(A), float(p)


def bootstrap_fit(n, net, net_se, ref, ref_se, reps: int, rng) -> dict[str, float]:
    """Fit of the relative gap and its parametric-bootstrap 95% interval (see module doc)."""
    rel = (net - ref) / ref
    rel_se = np.hypot(net_se, ref_se * net / ref) / ref
    A, p = power_fit(n, rel, rel_se)
    draws = []
    for _ in range(reps):
        r = ref + ref_se * rng.standard_normal()
        x = net + net_se * rng.standard_normal(len(n))
        try:
            draws.append(power_fit(n, (x - r) / r, rel_se))
        except RuntimeError:  # no convergence: counted as a failed replicate
            continue
    d = np.array(draws)
    lo, hi = np.quantile(d[:, 1], [0.025, 0.975])
    # width at which the fitted |relative gap| is 1%
    n1 = (abs(A) / 0.01) ** (1 / p) if p > 0 else math.inf
    n1_draws = np.array([(abs(a) / 0.01) ** (1 / q) if q > 0 else math.inf for a, q in d])
    n1_lo, n1_hi = np.quantile(n1_draws, [0.025, 0.975])
    return {
        "A": A,
        "p": p,
        "p_ci95": [float(lo), float(hi)],
        "n_at_1pct": float(n1),
        "n_at_1pct_ci95": [float(n1_lo), float(n1_hi)],
        "bootstrap_replicates": len(d),
        "bootstrap_failed": reps - len(d),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="attention", choices=sorted(MODELS))
    parser.add_argument("--tokens", type=int, default=4, help="m (default 4)")
    parser.add_argument("--T", type=float, default=0.75, help="depth / width (default 0.75)")
    parser.add_argument("--widths", default="16,32,64,128,256,512,1024")
    parser.add_argument("--samples", type=int, default=16384, help="networks per width")
    parser.add_argument("--sde-samples", type=int, default=32768)
    parser.add_argument("--dt", type=float, default=0.01, help="SDE step (and dt / 2)")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--sde-bootstrap", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--out", default=None, help="folder (default: next to this script, "
                        "named after the preset)")  # fmt: skip
    parser.add_argument(
        "--samples-at",
        default="",
        help="per-width sample counts overriding --samples, e.g. '1024:2048,512:4096'",
    )
    args = parser.parse_args()
    if args.tokens < 2:
        parser.error(f"--tokens must be >= 2, got {args.tokens}")
    if not args.T > 0:
        parser.error(f"--T must be > 0, got {args.T}")
    if args.quick:
        args.widths, args.samples, args.sde_samples = "16,32,64", 512, 1024
        args.bootstrap, args.sde_bootstrap = 50, 20
    torch.set_num_threads(1)
    widths = [int(w) for w in args.widths.split(",")]
    samples_at = {
        int(k): int(v) for k, v in (item.split(":") for item in args.samples_at.split(",") if item)
    }
    base = MODELS[args.preset]
    T = args.T
    V0 = equicorrelated(args.tokens, RHO0)
    start = time.time()

    t0 = time.time()
    Vc, Vf = sde_pair(base, V0, args.sde_samples, T, args.dt, args.seed + 1)
    sde_stats = {"dt": statistics(Vc), "dt/2": statistics(Vf)}
    ref = extrapolated(Vc, Vf, args.sde_bootstrap, np.random.default_rng(args.seed + 2))
    sde_kept = len(Vc)
    print(f"SDE dt = {args.dt:g} and dt / 2: {time.time() - t0:.0f} s", file=sys.stderr)

    net_stats = {}
    seconds = {}
    for w, n in enumerate(widths):
        t0 = time.time()
        config = base.replace(width=n, depth=round(T * n), head_dim=None, key_dim=None)
        count = samples_at.get(n, args.samples)
        VT = network_final(config, V0, count, args.chunk, args.seed + 1000 * (w + 1))
        net_stats[n] = statistics(VT)
        seconds[n] = time.time() - t0
        print(f"n = {n}: {seconds[n]:.0f} s", file=sys.stderr)

    rng = np.random.default_rng(args.seed)
    n_arr = np.array(widths, dtype=float)
    fits = {}
    for s in STATS:
        net = np.array([net_stats[n][s][0] for n in widths])
        net_se = np.array([net_stats[n][s][1] for n in widths])
        gap = net - ref[s][0]
        z = np.abs(gap) / np.hypot(net_se, ref[s][1])
        entry = {"resolved_widths": [n for n, zz in zip(widths, z, strict=True) if zz > 2]}
        if (z > 2).sum() >= 2:
            entry.update(bootstrap_fit(n_arr, net, net_se, *ref[s], args.bootstrap, rng))
        else:
            entry["fit"] = "not resolved: fewer than two widths with |gap| > 2 SE"
        fits[s] = entry

    results = {
        "command": "nice -n 10 python examples/finite_width/finite_width.py "
        + " ".join(sys.argv[1:]),
        "preset": args.preset,
        "config": {
            k: v for k, v in base.to_attrs(prefix="").items() if k not in ("width", "depth")
        },
        "T": T,
        "tokens": args.tokens,
        "rho0": RHO0,
        "samples": args.samples,
        "samples_at": {str(k): v for k, v in samples_at.items()},
        "sde_samples": args.sde_samples,
        "sde_dt": [args.dt, args.dt / 2],
        "sde_paths_kept": sde_kept,
        "sde": {label: {s: list(v) for s, v in st.items()} for label, st in sde_stats.items()},
        "sde_extrapolated": {s: list(v) for s, v in ref.items()},
        "network": {str(n): {s: list(v) for s, v in st.items()} for n, st in net_stats.items()},
        "fits": fits,
        "seconds_per_width": {str(n): round(v, 1) for n, v in seconds.items()},
        "seconds_total": round(time.time() - start, 1),
        "note": "times on a shared 2-core machine under load, 1 thread",
    }
    out = Path(args.out) if args.out else Path(__file__).parent / args.preset
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (out / f"results{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"results{suffix}.md").write_text(markdown(results, widths))
    figure(results, widths).savefig(out / f"finite_width{suffix}.png", dpi=150)
    print(markdown(results, widths))


def markdown(r: dict, widths: list[int]) -> str:
    lines = [
        f"# Finite-width bias ({r['preset']} preset, T = {r['T']}, m = {r['tokens']}, "
        f"rho0 = {r['rho0']})",
        "",
        f"Command: `{r['command']}` ({r['seconds_total']:.0f} s; {r['note']}).",
        f"Networks: {r['samples']} per width (gram sampler; other counts: "
        f"{r['samples_at'] or 'none'}). SDE: {r['sde_samples']} paths at "
        f"dt = {r['sde_dt'][0]:g} and {r['sde_dt'][1]:g} on the same Brownian paths "
        f"({r['sde_paths_kept']} kept), Richardson-extrapolated to dt -> 0.",
        "",
        "Network minus SDE (dt -> 0), value +- SE, and in units of the SE (z):",
        "",
        "| n | " + " | ".join(STATS) + " |",
        "|---|" + "---|" * len(STATS),
    ]
    for n in widths:
        cells = []
        for s in STATS:
            v, se = r["network"][str(n)][s]
            ref, ref_se = r["sde_extrapolated"][s]
            comb = math.hypot(se, ref_se)
            cells.append(f"{v - ref:+.4f} +- {comb:.4f} ({(v - ref) / comb:+.1f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "SDE reference:",
        "",
        "| statistic | dt | dt/2 | extrapolated |",
        "|---|---|---|---|",
    ]
    for s in STATS:
        a, b, c = r["sde"]["dt"][s], r["sde"]["dt/2"][s], r["sde_extrapolated"][s]
        lines.append(
            f"| {s} | {a[0]:.4f} +- {a[1]:.4f} | {b[0]:.4f} +- {b[1]:.4f} | "
            f"{c[0]:.4f} +- {c[1]:.4f} |"
        )
    lines += ["", "Fit of the relative gap (network - SDE) / SDE = A n^-p (95% bootstrap):", ""]
    for s in STATS:
        f = r["fits"][s]
        if "p" in f:
            lines.append(
                f"- {s}: A = {f['A']:+.3g}, p = {f['p']:.2f} [{f['p_ci95'][0]:.2f}, "
                f"{f['p_ci95'][1]:.2f}]; |gap| = 1% at n = {f['n_at_1pct']:.0f} "
                f"[{f['n_at_1pct_ci95'][0]:.0f}, {f['n_at_1pct_ci95'][1]:.0f}]; resolved "
                f"(|z| > 2) at n = {f['resolved_widths']}"
            )
        else:
            lines.append(f"- {s}: {f['fit']} (resolved at n = {f['resolved_widths']})")
    return "\n".join(lines) + "\n"


def figure(r: dict, widths: list[int]) -> Figure:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    n = np.array(widths, dtype=float)
    for ax, group in zip(
        axes, (("median_Vaa", "mean_Vaa"), ("median_rho", "mean_rho")), strict=True
    ):
        for s, color in zip(group, ("tab:blue", "tab:orange"), strict=True):
            ref, ref_se = r["sde_extrapolated"][s]
            v = np.array([r["network"][str(w)][s][0] for w in widths])
            se = np.array([r["network"][str(w)][s][1] for w in widths])
            rel = (v - ref) / ref
            rel_se = np.hypot(se, ref_se) / abs(ref)
            ax.errorbar(
                n, rel, yerr=2 * rel_se, fmt="o", color=color, capsize=3, label=f"{s} (bars: 2 SE)"
            )
            f = r["fits"][s]
            if "p" in f:
                x = np.geomspace(n.min(), n.max(), 100)
                ax.plot(
                    x,
                    f["A"] * x ** (-f["p"]),
                    color=color,
                    lw=1,
                    label=f"fit: {f['A']:+.2g} n^-{f['p']:.2f}",
                )
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"width n (depth = {r['T']:g} n)")
        ax.set_ylabel(f"(network - SDE) / SDE at T = {r['T']:g}")
        ax.legend(fontsize=8)
    axes[0].set_title("V^aa")
    axes[1].set_title("rho")
    return fig


if __name__ == "__main__":
    main()
