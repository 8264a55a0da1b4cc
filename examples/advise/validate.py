"""Finite networks at the advised (gamma, tau0) meet the advisor's criteria; rejected ones do not.

For each (width, depth, tokens) the advisor (``simulations.advise``, default grid and criteria)
is run, then finite networks are sampled with the exact sampler (docs/theory.md#samplers,
``simulations.simulate``) at the advised configuration and at configurations the advisor
rejects: the least-rejected one next to the advice (the smallest rejected gamma at the advised
tau0) and an extreme one (gamma 1, tau0 0.25), and, if there is one, the smallest gamma left
unresolved by the screening (violations within 2 SE). The same criteria are measured on the
networks' covariances at the last layer (``simulations.measure_dataset``). Writes
``finite_network.json``.

Usage::

    python examples/advise/validate.py                       # (256, 512, 8) and (64, 256, 8)
    python examples/advise/validate.py --sizes 32x32x4 --samples 64   # seconds
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from shapedtx.covariance import equicorrelated
from shapedtx.files import json_safe
from simulations import advise, measure_dataset, simulate

HERE = Path(__file__).parent


def check(width: int, depth: int, tokens: int, samples: int, seed: int) -> dict:
    start = time.perf_counter()
    advice = advise(width, depth, tokens, seed=seed)
    advise_s = time.perf_counter() - start
    if advice.config is None:
        return {"size": [width, depth, tokens], "advice": None}
    table = {(c.gamma, c.tau0): c for c in advice.candidates}
    rejected = sorted(
        (c for c in advice.candidates if not c.plausible and c.tau0 == advice.tau0),
        key=lambda c: c.gamma,
    )
    unresolved = sorted(
        (c for c in advice.candidates if c.plausible and not c.passed and c.tau0 == advice.tau0),
        key=lambda c: c.gamma,
    )
    configs = {"advised": (advice.gamma, advice.tau0)}
    if unresolved:
        configs["unresolved at screening (nearest)"] = (unresolved[0].gamma, unresolved[0].tau0)
    if rejected:
        configs["rejected (nearest)"] = (rejected[0].gamma, rejected[0].tau0)
    configs["rejected (gamma 1, tau0 0.25)"] = (1.0, 0.25)
    V0 = equicorrelated(tokens, advice.rho0)
    rows = {}
    for name, (gamma, tau0) in configs.items():
        config = advice.config.replace(gamma=gamma, tau0=tau0)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # blown-up networks
            ds = simulate(config, V0, samples, seed=seed, progress=False)
        meas = measure_dataset(ds, advice.criteria)
        sde_cand = table.get((gamma, tau0))
        rows[name] = {
            "gamma": gamma,
            "tau0": tau0,
            "network": asdict(meas),
            "network_violations": list(meas.violations(advice.criteria)),
            "network_passes": not meas.violations(advice.criteria),
            "sde": asdict(sde_cand.measurement) if sde_cand else None,
            "sde_violations": list(sde_cand.violations) if sde_cand else None,
            "sde_significant_violations": list(sde_cand.significant) if sde_cand else None,
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"n={width} d={depth} m={tokens} {name}: gamma={gamma} tau0={tau0} "
            f"network passes={rows[name]['network_passes']} {rows[name]['network_violations']}"
            f" collapse={meas.collapse:.4f}+-{meas.collapse_se:.4f} exploded={meas.exploded:.4f}"
            f" norm={meas.norm:.3g} spread={meas.rho_spread:.3f} (SDE: "
            f"{'n/a' if sde_cand is None else f'{sde_cand.measurement.rho_spread:.3f}'})",
            flush=True,
        )
    return {
        "size": [width, depth, tokens],
        "T": advice.T,
        "advice": {"gamma": advice.gamma, "tau0": advice.tau0, "seconds": advise_s},
        "samples": samples,
        "method": "exact",
        "criteria": asdict(advice.criteria),
        "configs": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["256x512x8", "64x256x8"])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "finite_network.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for size in args.sizes:
        width, depth, tokens = (int(x) for x in size.split("x"))
        results.append(check(width, depth, tokens, args.samples, args.seed))
    text = json.dumps(json_safe({"results": results}), indent=1, default=str, allow_nan=False)
    args.out.write_text(text + "\n")  # non-finite numbers as null (shapedtx.files.json_number)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
