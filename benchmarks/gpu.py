"""The library on one device: simulator, SDE solver, compare and a training step.

For ``--device`` (``cuda``, ``cpu``, ...) runs, and times:

- ``simulate`` with methods exact, gram and the default (auto) on the device, and the same
  calls on the CPU (other random streams): two-sample KS test on rho^{01} at the last layer
  (CPU/device agreement in law, p-value reported, failure below ``--p-min``);
- ``sde.solve`` on the device and on the CPU (KS on rho at T, as above);
- ``simulations.compare`` of the device network against the device SDE;
- a few optimiser steps of ``shapedtx.training.LanguageModel`` (shaped attention) on the device.

Reports wall time per stage (device synchronised) and peak memory: ``max_memory_allocated``
on CUDA, peak RSS of the process on CPU. Writes ``--json`` if given. Exit status 1 if an
agreement test fails.

    python benchmarks/gpu.py --device cuda
    python benchmarks/gpu.py --device cpu --tiny          # a few seconds (run by the tests)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

import sde
from shapedtx import ModelConfig
from shapedtx.training import LanguageModel
from simulations import compare, equicorrelated, simulate


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _rho_last(ds) -> np.ndarray:
    V = ds["V"].values[:, -1]
    return V[:, 0, 1] / np.sqrt(V[:, 0, 0] * V[:, 1, 1])


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    cpu = torch.device("cpu")
    sizes = (
        {"width": 32, "depth": 8, "samples": 256, "paths": 256, "steps": 1, "seq": 16}
        if args.tiny
        else {"width": 256, "depth": 64, "samples": 4096, "paths": 4096, "steps": 5, "seq": 128}
    )
    # non-causal: the SDE covers it (the causal SDE is not derived in this tree)
    cfg = ModelConfig(width=sizes["width"], depth=sizes["depth"], gamma=0.6)
    V0 = equicorrelated(args.tokens, 0.2)
    rows: list[dict] = []
    failures: list[str] = []

    def timed(stage: str, fn, on: torch.device):
        _sync(on)
        _reset_peak(on)
        start = time.perf_counter()
        out = fn()
        _sync(on)
        rows.append(
            {
                "stage": stage,
                "device": str(on),
                "seconds": time.perf_counter() - start,
                "peak_mb": _peak_mb(on),
            }
        )
        return out

    def agree(stage: str, a: np.ndarray, b: np.ndarray) -> None:
        p = float(stats.ks_2samp(a, b).pvalue)
        rows[-1]["ks_p_vs_cpu"] = p
        if p < args.p_min:
            failures.append(f"{stage}: device vs CPU differ in law (KS p = {p:.2g})")

    places = [(device, 1)] + ([(cpu, 2)] if device.type != "cpu" else [])
    networks = {}
    for method in ("exact", "gram", None):
        name = f"simulate[{method or 'auto'}]"
        kwargs = {"method": method} if method else {}
        for on, seed in places:
            ds = timed(
                name,
                lambda on=on, seed=seed, kwargs=kwargs: simulate(
                    cfg,
                    V0,
                    sizes["samples"],
                    seed=seed,
                    device=on,
                    progress=False,
                    **kwargs,
                ),
                on,
            )
            networks[(name, on.type)] = ds
        if device.type != "cpu":
            agree(
                name, _rho_last(networks[(name, device.type)]), _rho_last(networks[(name, "cpu")])
            )
        else:  # on CPU: the method against exact, same device
            if method != "exact":
                agree(name, _rho_last(ds), _rho_last(networks[("simulate[exact]", "cpu")]))

    limits = {}
    for on, seed in places:
        limits[on.type] = timed(
            "sde.solve",
            lambda on=on, seed=seed: sde.solve(
                cfg, V0, sizes["paths"], dt=cfg.T / 32, seed=seed, device=on, progress=False
            ),
            on,
        )
    if device.type != "cpu":
        agree("sde.solve", _rho_last(limits[device.type]), _rho_last(limits["cpu"]))
    else:
        agree(
            "sde.solve vs network",
            _rho_last(limits["cpu"]),
            _rho_last(networks[("simulate[exact]", "cpu")]),
        )
        rows[-1]["note"] = "network vs SDE at T (finite-width effects expected to be small)"

    net = networks[("simulate[auto]", device.type)]
    lim = limits[device.type]
    timed("compare", lambda: compare(net, lim), cpu)

    train_cfg = ModelConfig(
        width=64 if args.tiny else 128,
        depth=2 if args.tiny else 8,
        heads=4,
        out_proj=True,
        causal=True,
        mlp="shaped_relu",
    )
    torch.manual_seed(0)
    model = LanguageModel(train_cfg, sizes["seq"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 256, (16, sizes["seq"] + 1), device=device)

    def train() -> float:
        for _ in range(sizes["steps"]):
            optimizer.zero_grad(set_to_none=True)
            loss = model.loss(tokens)
            loss.backward()
            optimizer.step()
        return float(loss.detach())

    loss = timed(f"train x{sizes['steps']} steps", train, device)
    if not np.isfinite(loss):
        failures.append(f"training loss not finite: {loss}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return {"device": name, "sizes": sizes, "rows": rows, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--tiny", action="store_true", help="small sizes (seconds; for the tests)")
    p.add_argument("--p-min", type=float, default=1e-3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    result = run(args)
    print(f"device: {result['device']}; sizes: {result['sizes']}")
    print("| stage | device | seconds | peak memory (MB) | KS p |")
    print("|---|---|---|---|---|")
    for r in result["rows"]:
        p_value = f"{r['ks_p_vs_cpu']:.2g}" if "ks_p_vs_cpu" in r else ""
        cells = [r["stage"], r["device"], f"{r['seconds']:.3f}", f"{r['peak_mb']:.0f}", p_value]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for failure in result["failures"]:
        print("FAILED:", failure, file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
