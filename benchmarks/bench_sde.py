"""Benchmark the covariance SDE solvers (``sde.solve``).

1. Own batched Euler (``method="euler"``, PSD-safe factored; and ``"em"``) against
   ``torchsde.sdeint`` (``method="torchsde"``, Euler, general noise) on the same SDE: m tokens,
   many paths, a fixed number of steps; methods interleaved round by round, median time, ratio
   to torchsde measured in the same run.
2. The SDE against the finite network (``simulations.simulate(method="exact")``) at equal T and
   samples, for several widths (the network costs depth = T * width blocks).
3. ``--step-sizes``: the lean factored Euler step (5 m x m products, O(m^2) auxiliaries, fused
   passes, numpy normals) against the first implementation
   (``sde.solvers._ReferenceFactoredEulerStep`` with ``torch.randn`` normals) per path-step
   through ``sde.integrate`` at m = 8 ... 128, shaped block with gamma 0.1, causal and not,
   interleaved round by round in one run (median ratio); and float32 against float64 with the
   same normals (its speed and its error on rho and log V^aa at T).

    python benchmarks/bench_sde.py
    python benchmarks/bench_sde.py --paths 1024 --steps 20 --widths 256 --net-samples 8
    python benchmarks/bench_sde.py --step-sizes 8 32 64 128 --skip-solvers --skip-network
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


def lean_step(args: argparse.Namespace, device: torch.device) -> None:
    from sde.solvers import (
        FactoredEulerStep,
        _ReferenceFactoredEulerStep,
        gaussian_noise,
        integrate,
    )

    paths, steps = args.step_paths, args.step_steps
    print(
        f"## Lean factored Euler step vs the first implementation: shaped block, gamma 0.1, "
        f"{paths} paths, {steps} steps of 0.01, {device}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} interleaved rounds\n"
    )
    print(
        "| m | causal | reference f64 (ms / path-step) | lean f64 | speed-up f64 | lean f32 | "
        "f32 vs f64 | f32 error: max abs rho / log V^aa at T |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def run(stepper, V0, dtype, noise_kind, seed):
        m = V0.shape[-1]
        V0s = V0.to(dtype).expand(paths, m, m).contiguous()
        gen = torch.Generator(device=device).manual_seed(seed)
        if noise_kind == "torch":

            def noise(k):
                return torch.randn((paths, 2, m, m), generator=gen, dtype=dtype, device=device)
        elif noise_kind == "fixed":
            table = torch.randn((steps, paths, 2, m, m), generator=gen, dtype=torch.float64)

            def noise(k):
                return table[k].to(dtype)
        else:
            noise = gaussian_noise((paths, 2, m, m), gen, dtype, device)
        start = time.perf_counter()
        sol = integrate(stepper, V0s, steps=steps, dt=0.01, save_every=steps, noise=noise,
                        bound=1e8, progress=False)  # fmt: skip
        _sync(device)
        return (time.perf_counter() - start) / (paths * steps) * 1e3, sol.V[:, -1].double()

    for m in args.step_sizes:
        for causal in (False, True):
            if causal and m > args.step_causal_max:  # the causal reference is O(m^4)
                continue
            cfg = ModelConfig(mlp="shaped_relu", gamma=0.1, causal=causal)
            V0 = equicorrelated(m, 0.2, device=device).double()
            ref, lean = _ReferenceFactoredEulerStep(cfg, m), FactoredEulerStep(cfg, m)
            times: dict[str, list[float]] = {"ref": [], "f64": [], "f32": []}
            run(lean, V0, torch.float64, "numpy", 0)  # warm-up
            for r in range(args.rounds):
                times["ref"].append(run(ref, V0, torch.float64, "torch", r)[0])
                times["f64"].append(run(lean, V0, torch.float64, "numpy", r)[0])
                times["f32"].append(run(lean, V0, torch.float32, "numpy", r)[0])
            ref_t, f64_t, f32_t = times["ref"], times["f64"], times["f32"]
            ratio = statistics.median(a / b for a, b in zip(ref_t, f64_t, strict=True))
            ratio32 = statistics.median(a / b for a, b in zip(f64_t, f32_t, strict=True))
            _, V64 = run(lean, V0, torch.float64, "fixed", 99)
            _, V32 = run(lean, V0, torch.float32, "fixed", 99)

            def rho_logd(V):
                d = torch.diagonal(V, dim1=-2, dim2=-1)
                return V / (d[:, :, None] * d[:, None, :]).sqrt(), d.log()

            (r64, l64), (r32, l32) = rho_logd(V64), rho_logd(V32)
            print(
                f"| {m} | {causal} | {statistics.median(times['ref']):.3f} | "
                f"{statistics.median(times['f64']):.3f} | **{ratio:.2f}x** | "
                f"{statistics.median(times['f32']):.3f} | {ratio32:.2f}x | "
                f"{(r64 - r32).abs().max():.1e} / {(l64 - l32).abs().max():.1e} |",
                flush=True,
            )
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
    p.add_argument("--skip-solvers", action="store_true")
    p.add_argument("--step-sizes", type=int, nargs="*", default=[], help="m for section 3")
    p.add_argument("--step-paths", type=int, default=64)
    p.add_argument("--step-steps", type=int, default=10)
    p.add_argument("--step-causal-max", type=int, default=64, help="largest causal m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if not args.skip_solvers:
        solvers(args, device)
    if args.step_sizes:
        lean_step(args, device)
    if not args.skip_network:
        versus_network(args, device)


if __name__ == "__main__":
    main()
