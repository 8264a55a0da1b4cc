"""Stability map over (gamma, tau0): network and SDE side by side.

Runs :func:`simulations.stability_map` on the attention-only preset of ``shapedtx compare``
(shaped attention, one head, value weights only), m = 4 tokens, rho0 = 0.2, and writes
``results.json``, ``results.md`` and ``stability_map.png`` here. The choices are explained in
docs/guide/stability.md.

Usage:
    nice -n 10 python examples/stability_map/stability_map.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import simulations
from shapedtx.covariance import equicorrelated
from simulations.presets import PRESET_MODELS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="attention", choices=sorted(PRESET_MODELS))
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--gammas", default="0.05,0.1,0.2,0.4,0.7,1.0")
    parser.add_argument("--tau0s", default="0.05,0.1,0.25,0.5,1,2.5")
    parser.add_argument("--T-max", type=float, default=2.0)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = PRESET_MODELS[args.preset][0].replace(
        width=args.width, depth=args.width, head_dim=None, key_dim=None
    )
    gammas = [float(x) for x in args.gammas.split(",")]
    tau0s = [float(x) for x in args.tau0s.split(",")]
    start = time.time()
    ds = simulations.stability_map(
        base,
        equicorrelated(4, 0.2),
        gammas,
        tau0s,
        T_max=args.T_max,
        samples=args.samples,
        seed=args.seed,
    )
    seconds = time.time() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    simulations.plot_stability_map(ds, out / "stability_map")
    attrs = {k: v for k, v in ds.attrs.items() if not k.startswith("config.")}
    results = {
        "command": "nice -n 10 python examples/stability_map/stability_map.py "
        + " ".join(sys.argv[1:]),
        "preset": args.preset,
        "width": args.width,
        "seconds": round(seconds, 1),
        "note": "time on a shared 2-core machine under load, 1 thread",
        "attrs": {k: (float(v) if isinstance(v, np.floating) else v) for k, v in attrs.items()},
        "gamma": gammas,
        "tau0": tau0s,
        **{
            f"{var}_{source}": np.round(ds[var].sel(source=source).values, 4).tolist()
            for var in ("median_exit", "median_se", "censored")
            for source in ("network", "sde")
        },
        "sde_exploded": np.round(ds["exploded"].values, 4).tolist(),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(ds, results))
    print(markdown(ds, results))


def markdown(ds, r: dict) -> str:
    a = r["attrs"]
    lines = [
        f"# Stability map ({r['preset']} preset, width {r['width']}, m = {a['tokens']}, "
        f"rho0 = 0.2)",
        "",
        f"Command: `{r['command']}` ({r['seconds']:.0f} s; {r['note']}).",
        f"{a['samples']} networks ({a['method']} sampler, depth {a['depth']}) and "
        f"{a['sde_samples']} SDE paths (dt = {a['dt']:g}) per cell; region "
        f"[{a['low']:g}, {a['high']:g}], cap T_max = {a['T_max']:g}.",
        "",
        f"Agreement: {100 * a['fraction_within_10pct']:.0f}% of cells within 10% "
        f"({a['cells_censored_both']} cells censored on both sides, which agree trivially; "
        f"{100 * a['fraction_within_10pct_uncensored']:.0f}% of the others); worst cell "
        f"gamma = {a['worst_gamma']:g}, tau0 = {a['worst_tau0']:g}: network "
        f"{a['worst_network']:.3g}, SDE {a['worst_sde']:.3g} "
        f"(relative difference {a['worst_relative_difference']:+.2f}).",
        "",
        "Median exit t, network / SDE (c: censored median, half the paths or more reach "
        "T_max; SDE blown-up fraction in brackets):",
        "",
        "| gamma \\ tau0 | " + " | ".join(f"{t:g}" for t in r["tau0"]) + " |",
        "|---|" + "---|" * len(r["tau0"]),
    ]
    for i, g in enumerate(r["gamma"]):
        cells = []
        for j in range(len(r["tau0"])):
            parts = []
            for source in ("network", "sde"):
                v = r[f"median_exit_{source}"][i][j]
                c = "c" if r[f"censored_{source}"][i][j] >= 0.5 else ""
                parts.append(f"{v:.3g}{c}")
            cells.append(" / ".join(parts) + f" [{r['sde_exploded'][i][j]:.2f}]")
        lines.append(f"| {g:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
