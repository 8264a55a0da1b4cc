"""Training-step time per run and tokens/s: eager, compiled loss, compiled step, several runs.

Times the trainer's own steps (``shapedtx.training.train``'s loop, stepped one at a time:
batches, forward, backward, clipping, AdamW, scheduler; no log row inside the timed steps) of
the shaped model at each width, for each path:

- ``eager``: ``train(...)``;
- ``loss``: ``train(..., compile=True)`` (the loss and its backward through torch.compile);
- ``step``: ``train(..., compile="step")`` (the whole step compiled; CUDA graphs on CUDA);
- ``many``: ``train_many`` of ``--runs`` runs (each its own lr and seed) with ``--many-compile``,
  stepped in turn, each on its own CUDA stream: the time per run is the round's time / runs.

Each path's first ``--warmup`` steps (the compilation, CUDA-graph recording) are not timed.
The FLOP count is ``6 x parameters x tokens`` per step; divided by the device's peak matrix
throughput (``--peak-tflops``; known GPUs by name, see ``PEAK_TFLOPS``) it gives the time
floor of a step and the fraction of the peak reached (MFU).

    python benchmarks/bench_train_step.py --widths 32 --depth 2 --batch 4 --seq-len 16 \\
        --steps 3 --warmup 2 --runs 2                              # a check that it runs
    python benchmarks/bench_train_step.py --device cuda --json train_step.json  # the figures
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Generator
from typing import Any

import torch

from shapedtx import TrainConfig, load_corpus, preset
from shapedtx.training import TrainResult
from shapedtx.training.trainer import _prepare

PEAK_TFLOPS: dict[tuple[str, str], float] = {
    # dense matrix throughput, from the vendors' data sheets (float32 runs on TF32 tensor cores
    # only with torch.backends.cuda.matmul.allow_tf32; the default is plain FP32)
    ("H200", "float32"): 67.0,
    ("H200", "tf32"): 494.0,
    ("H200", "bfloat16"): 989.0,
    ("H100", "float32"): 67.0,
    ("H100", "tf32"): 494.0,
    ("H100", "bfloat16"): 989.0,
    ("A100", "float32"): 19.5,
    ("A100", "tf32"): 156.0,
    ("A100", "bfloat16"): 312.0,
}
MODES = ("eager", "loss", "step", "many")
COMPILE = {"eager": False, "loss": True, "step": "step"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device, precision: str, given: float | None) -> float | None:
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for (gpu, p), v in PEAK_TFLOPS.items() if gpu in name and p == precision), None)


def _runs(args: argparse.Namespace, width: int, count: int, compile: bool | str) -> list[Any]:
    """``count`` runs of the trainer (generators that yield after every step)."""
    model = preset(
        "shaped", width=width, depth=args.depth, heads=args.heads, causal=True
    )  # the study's shaped model at the benchmark's shape
    steps = args.warmup + args.steps + 1  # the last step's log row is not timed
    runs = []
    for k in range(count):
        config = TrainConfig(
            steps=steps, batch_size=args.batch, seq_len=args.seq_len, lr=1e-3 * 2**k, seed=k,
            log_interval=steps, eval_interval=steps, checkpoint_interval=0,
            autocast=args.autocast,
        )  # fmt: skip
        runs.append(
            _prepare(
                model,
                args.data,
                config,
                out_dir=None,
                device=args.device,
                dtype=torch.float32,
                resume=False,
                progress=False,
                loss_hook=None,
                snapshots=(),
                branch_from=None,
                compile=compile,
                deadline=None,
            )
        )
    return runs


def _time(args: argparse.Namespace, runs: list[Generator[None, None, TrainResult]]) -> float:
    """Seconds per round of one step of every run (each run on its own CUDA stream)."""
    device = args.device
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in runs]

    def round_() -> None:
        for run, stream in zip(runs, streams, strict=True):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                next(run)

    for _ in range(args.warmup):
        round_()
    _sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        round_()
    _sync(device)
    return (time.perf_counter() - start) / args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps (compilation)")
    parser.add_argument("--runs", type=int, default=6, help="runs of the 'many' path")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--many-compile", choices=("eager", "loss", "step"), default="step",
        help="the path of each run in 'many' (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--autocast", choices=("none", "bfloat16"), default="none")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args()
    args.device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.data = load_corpus(max_bytes=2_000_000)
    tf32 = torch.backends.cuda.matmul.allow_tf32 and args.device.type == "cuda"
    precision = "bfloat16" if args.autocast == "bfloat16" else ("tf32" if tf32 else "float32")
    peak = _peak(args.device, precision, args.peak_tflops)
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
    print(f"device {name} ({precision}), peak {peak} TFLOP/s, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}; depth {args.depth}, batch {args.batch} x "
          f"{args.seq_len}, {args.steps} timed steps after {args.warmup}")  # fmt: skip
    rows = []
    tokens = args.batch * args.seq_len
    for width in args.widths:
        for mode in args.modes:
            count = args.runs if mode == "many" else 1
            compile = COMPILE[args.many_compile if mode == "many" else mode]
            runs = _runs(args, width, count, compile)
            round_seconds = _time(args, runs)
            model = preset("shaped", width=width, depth=args.depth, heads=args.heads, causal=True)
            from shapedtx.training import LanguageModel

            params = sum(p.numel() for p in LanguageModel(model, args.seq_len).parameters())
            per_run = round_seconds / count
            flops = 6 * params * tokens
            floor = flops / (peak * 1e12) if peak else math.nan
            row = {
                "width": width, "mode": mode, "runs": count, "params": params,
                "seconds_per_step_per_run": per_run, "tokens_per_s": tokens / per_run,
                "gflop_per_step": flops / 1e9, "peak_floor_s": floor,
                "mfu": floor / per_run if peak else math.nan,
            }  # fmt: skip
            rows.append(row)
            print(f"width {width:4d} {mode:5s} x{count}: {per_run * 1e3:9.2f} ms/step/run, "
                  f"{tokens / per_run:10.0f} tokens/s, {flops / 1e9:7.1f} GFLOP/step, "
                  f"floor {floor * 1e3:7.3f} ms, MFU {row['mfu']:.3f}")  # fmt: skip
            del runs
    if args.json:
        meta = {"device": name, "precision": precision, "peak_tflops": peak,
                "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()
                                                     if k != "data"}}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
