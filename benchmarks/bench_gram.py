"""Benchmark: the gram sampler against another source tree (e.g. the code before issue #18).

Each measurement runs ``simulate(method="gram")`` in a fresh subprocess whose PYTHONPATH is
this tree or ``--baseline`` (a checkout of another commit, e.g. from
``git archive 3ccbfbf | tar -x -C /tmp/base``); rounds interleave the two trees so that
machine load affects them alike. Cost per (sample x block), process CPU time after a warm-up
(wall time with ``--threads`` > 1: torch's thread count in both trees, OMP_NUM_THREADS then
left unset); medians over rounds (and the mean and range: a slow round shows) and of the
per-round ratios.

    python benchmarks/bench_gram.py --baseline /tmp/base            # m 8, n 1024
    python benchmarks/bench_gram.py --baseline /tmp/base --threads 2
    python benchmarks/bench_gram.py --baseline /tmp/base --only "causal shaped attention"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CONFIGS = {
    "causal shaped attention": {"causal": True},
    "shaped attention + shaped ReLU MLP": {"mlp": "shaped_relu"},
}


def _worker(args: argparse.Namespace) -> None:
    import torch

    from shapedtx import ModelConfig
    from simulations import equicorrelated, simulate

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(width=args.width, depth=args.depth, **json.loads(args.config))
    V0 = equicorrelated(args.tokens, 0.2)
    simulate(cfg.replace(depth=2), V0, 256, method="gram", progress=False)  # warm-up
    clock = _clock(args)
    start = clock()
    simulate(cfg, V0, args.samples, method="gram", progress=False)
    per_unit = (clock() - start) / (args.samples * args.depth)
    print(json.dumps({"per_unit": per_unit, "random_only": _random_only(cfg, V0, args)}))


def _clock(args: argparse.Namespace):
    return time.process_time if args.threads == 1 else time.perf_counter


def _random_only(cfg, V0, args) -> float | None:
    """CPU time per (sample x block) of drawing only the random numbers the gram sampler
    draws (counted in a short run, then drawn in bulk from the same generators): the floor
    of any exact sampler that needs these numbers. None for a tree without GroupedNormal's
    bulk draws (e.g. the code before issue #18)."""
    import numpy as np
    import torch

    from simulations import rng as rng_module
    from simulations import simulate

    cls = rng_module.GroupedNormal
    if not hasattr(cls, "fill_normal") or not hasattr(cls, "chi2"):
        return None
    counts = {"normal": 0, "chi2": 0}
    if hasattr(cls, "start"):  # every bulk draw goes through start()
        start_draw = cls.start

        def counting_start(self, normals, chi2_dof=None, chi2_dtype=None):
            counts["normal"] += sum(buf.numel() for buf in normals)
            if chi2_dof is not None:
                counts["chi2"] += chi2_dof.numel() * self.samples
            return start_draw(self, normals, chi2_dof, chi2_dtype)

        originals = {"start": start_draw}
        cls.start = counting_start
    else:
        fill, chi2 = cls.fill_normal, cls.chi2

        def counting_fill(self, buf):
            counts["normal"] += buf.numel()
            return fill(self, buf)

        def counting_chi2(self, dof, dtype):
            counts["chi2"] += dof.numel() * self.samples
            return chi2(self, dof, dtype)

        originals = {"fill_normal": fill, "chi2": chi2}
        cls.fill_normal, cls.chi2 = counting_fill, counting_chi2
    try:
        simulate(cfg.replace(depth=4), V0, 256, method="gram", progress=False)
    finally:
        for name, method in originals.items():
            setattr(cls, name, method)
    normals = counts["normal"] // (256 * 4)
    chis = counts["chi2"] // (256 * 4)
    group = 256
    groups = range(args.samples // group)
    workers = {"workers": args.threads} if args.threads > 1 else {}
    draws = cls(0, groups, [group] * len(groups), torch.device("cpu"), **workers)
    dof = torch.tensor(np.linspace(args.width - args.tokens, args.width, max(chis, 1)))
    buf = torch.zeros(draws.samples, normals, dtype=torch.float64)  # touched: no page faults
    clock = _clock(args)
    start = clock()
    for _ in range(args.depth):
        draws.fill_normal(buf)
        if chis:
            draws.chi2(dof, torch.float64)
    return (clock() - start) / (draws.samples * args.depth)


def _measure(tree: Path, args: argparse.Namespace, config: dict) -> float:
    cmd = [sys.executable, __file__, "--worker", "--config", json.dumps(config)]
    cmd += ["--width", str(args.width), "--depth", str(args.depth)]
    cmd += ["--tokens", str(args.tokens), "--samples", str(args.samples)]
    cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    if args.threads == 1:
        env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, required=False)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", help="run the configs whose name contains this text")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    print(
        f"gram sampler, n {args.width}, m {args.tokens}, depth {args.depth}, {args.samples} "
        f"samples, float64, CPU, {args.threads} thread(s), {args.rounds} interleaved rounds, "
        f"{'CPU' if args.threads == 1 else 'wall'} time"
    )
    print(
        "| config | tree | median us per (sample x block) | mean [min, max] us "
        "| speed-up vs baseline | its random numbers alone (us) |"
    )
    print("|---|---|---|---|---|---|")
    for name, config in CONFIGS.items():
        if args.only is not None and args.only not in name:
            continue
        runs: dict[str, list[dict]] = {"this": [], "baseline": []}
        for _ in range(args.rounds):
            runs["this"].append(_measure(HERE, args, config))
            if args.baseline is not None:
                runs["baseline"].append(_measure(args.baseline, args, config))
        times = {tree: [r["per_unit"] for r in values] for tree, values in runs.items()}
        speedups = [b / t for t, b in zip(times["this"], times["baseline"], strict=False)]
        for tree, values in times.items():
            if not values:
                continue
            extra = ""
            if tree == "this" and speedups:
                extra = (
                    f"{statistics.median(speedups):.2f}x [{min(speedups):.2f}, {max(speedups):.2f}]"
                )
            floors = [r["random_only"] for r in runs[tree] if r.get("random_only") is not None]
            floor = f"{1e6 * statistics.median(floors):.2f}" if floors else "-"
            spread = (
                f"{1e6 * statistics.mean(values):.2f} [{1e6 * min(values):.2f}, "
                f"{1e6 * max(values):.2f}]"
            )
            median = 1e6 * statistics.median(values)
            print(f"| {name} | {tree} | {median:.2f} | {spread} | {extra} | {floor} |")


if __name__ == "__main__":
    main()
