"""Benchmark the covariance SDE solvers (``sde.solve``).

1. Own batched Euler (``method="euler"``, PSD-safe factored; and ``"em"``) against
   ``torchsde.sdeint`` (``method="torchsde"``, Euler, general noise) on the same SDE: m tokens,
   many paths, a fixed number of steps; methods interleaved round by round, median time, ratio
   to torchsde measured in the same run.
2. The SDE against the finite network (``simulations.simulate(method="exact")``) at equal T and
   samples, for several widths (the network costs depth = T * width blocks).

    python benchmarks/bench_sde.py
    python benchmarks/bench_sde.py --paths 1024 --steps 20 --widths 256 --net-samples 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import sde
from shapedtx import ModelConfig, equicorrelated

CONFIGS = {
    "shaped attention (1 head)": ModelConfig(),
    "shaped block (attention + shaped ReLU)": ModelConfig(mlp="shaped_relu"),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def solvers(args: argparse.Namespace, device: torch.device) -> None:
    V0 = equicorrelated(args.tokens, 0.2, device=device)
    T = args.steps * args.dt
    print(
        f"## Own Euler vs torchsde: m={args.tokens}, {args.paths} paths, {args.steps} steps "
        f"(dt={args.dt}), {device}, float64, {torch.get_num_threads()} threads, "
        f"median of {args.rounds}\n"
    )
    print("| SDE | method | time (s) | speed-up vs torchsde | exploded |")
    print("|---|---|---|---|---|")
    for label, cfg in CONFIGS.items():
        times: dict[str, list[float]] = {m: [] for m in ("euler", "em", "torchsde")}
        exploded: dict[str, float] = {}
        for method in times:  # warm-up
            sde.solve(cfg, V0, 8, T=2 * args.dt, dt=args.dt, method=method, progress=False)
        for r in range(args.rounds):
            for method in times:

                def run(method=method, r=r, cfg=cfg, exploded=exploded):
                    ds = sde.solve(
                        cfg,
                        V0,
                        args.paths,
                        T=T,
                        dt=args.dt,
                        method=method,
                        seed=r,
                        device=device,
                        save_every=args.steps,
                        progress=False,
                    )
                    exploded[method] = ds.attrs["exploded_fraction"]

                times[method].append(_time(run, device))
        base = statistics.median(times["torchsde"])
        for method, ts in times.items():
            med = statistics.median(ts)
            print(
                f"| {label} | {method} | {med:.3f} | {base / med:.1f}x | {exploded[method]:.4f} |"
            )
    print()


def versus_network(args: argparse.Namespace, device: torch.device) -> None:
    from simulations import simulate

    V0 = equicorrelated(args.net_tokens, 0.2, device=device)
    print(
        f"## SDE vs finite network (exact sampler): shaped block, m={args.net_tokens}, "
        f"T={args.net_T}, {args.net_samples} samples, SDE dt={args.dt}\n"
    )
    print("| width | depth | network (s) | SDE (s) | network / SDE |")
    print("|---|---|---|---|---|")
    for width in args.widths:
        depth = max(1, round(args.net_T * width))
        cfg = ModelConfig(width=width, depth=depth, mlp="shaped_relu")
        simulate(cfg.replace(depth=1), V0, 2, progress=False)  # warm-up
        t_net = _time(
            lambda cfg=cfg: simulate(cfg, V0, args.net_samples, seed=1, progress=False), device
        )
        t_sde = _time(
            lambda cfg=cfg: sde.solve(cfg, V0, args.net_samples, dt=args.dt, progress=False),
            device,
        )
        print(f"| {width} | {depth} | {t_net:.2f} | {t_sde:.3f} | {t_net / t_sde:.0f}x |")
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--paths", type=int, default=4096)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dt", type=float, default=0.01)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--widths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--net-samples", type=int, default=32)
    p.add_argument("--net-T", type=float, default=0.25)
    p.add_argument("--net-tokens", type=int, default=4)
    p.add_argument("--skip-network", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    solvers(args, device)
    if not args.skip_network:
        versus_network(args, device)


if __name__ == "__main__":
    main()
