"""Benchmark: a training step under Dask's default worker environment and under the embedded
cluster's (``simulations.sweep``), which leaves glibc's ``MALLOC_TRIM_THRESHOLD_`` unset.

Dask's nannies start workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand freed memory back
to the OS). Setting any malloc tunable switches off glibc's adaptive mmap threshold, which then
stays at 128 KiB: every activation tensor of a training step is a fresh ``mmap`` whose pages
fault in, zeroed by the kernel, at first use. The embedded cluster of ``sweep``/``run_tasks``
(and so every training study) now starts its workers without it.

Per round, interleaved, a fresh child process per environment runs ``--steps`` optimiser steps
of ``LanguageModel`` (AdamW, batch 32 x 64 bytes, 1 torch thread) after 3 warm-up steps and
reports its wall time, user and system CPU time and minor page faults per step; the headline
is the median over rounds of the per-round ratio of wall times (Dask default / embedded).

    python benchmarks/bench_dask_env.py
    python benchmarks/bench_dask_env.py --presets shaped pre_ln --rounds 5 --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = """
import json, resource, sys, time
import torch
from shapedtx import preset
from shapedtx.training import LanguageModel
name, width, depth, steps = sys.argv[1], *map(int, sys.argv[2:5])
torch.set_num_threads(1)
torch.manual_seed(0)
cfg = preset(name, width=width, depth=depth, heads=4, mlp_ratio=4, causal=True)
model = LanguageModel(cfg, 64)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batch = torch.randint(0, 256, (32, 65))
def step():
    loss = model.loss(batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
for _ in range(3):
    step()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(steps):
    step()
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "wall": (t1 - t0) / steps,
    "user": (r1.ru_utime - r0.ru_utime) / steps,
    "sys": (r1.ru_stime - r0.ru_stime) / steps,
    "minflt": (r1.ru_minflt - r0.ru_minflt) / steps,
}))
"""


def _environments() -> dict[str, dict[str, str]]:
    """Dask's default pre-spawn environment of a nanny's worker, and the embedded cluster's."""
    import dask
    import distributed  # noqa: F401  (loads Dask's distributed config)

    dask_env = {
        k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
    }
    base = {k: v for k, v in os.environ.items() if k not in dask_env}
    embedded = {k: v for k, v in dask_env.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    return {"dask default": {**base, **dask_env}, "embedded": {**base, **embedded}}


def _run(env: dict[str, str], name: str, width: int, depth: int, steps: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, name, str(width), str(depth), str(steps)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["shaped", "pre_ln"])
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    envs = _environments()
    print("Dask default: MALLOC_TRIM_THRESHOLD_ =", envs["dask default"]["MALLOC_TRIM_THRESHOLD_"])
    ratios: dict[str, float] = {}
    for name in args.presets:
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in envs}
        for _ in range(args.rounds):
            for label, env in envs.items():
                rows[label].append(_run(env, name, args.width, args.depth, args.steps))
        per_round = [
            d["wall"] / e["wall"]
            for d, e in zip(rows["dask default"], rows["embedded"], strict=True)
        ]
        ratios[name] = statistics.median(per_round)
        for label, rs in rows.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(
                f"{name:8s} {label:12s} wall {med['wall'] * 1e3:7.1f} ms/step  user "
                f"{med['user'] * 1e3:6.1f}  sys {med['sys'] * 1e3:6.1f} ms/step  "
                f"minor faults {med['minflt']:8.0f}/step"
            )
        print(
            f"{name:8s} dask default / embedded wall per step: {ratios[name]:.2f} "
            f"[{min(per_round):.2f}, {max(per_round):.2f}] over {args.rounds} rounds"
        )
    return ratios


if __name__ == "__main__":
    main()
