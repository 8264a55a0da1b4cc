"""``shapedtx compare``: finite networks vs the covariance SDE, and the rank-collapse report.

The main job (README): one shaped model simulated as a finite network and as its SDE limit,
compared time by time (``simulations.compare``), a convergence study in the width at fixed T
(``simulations.convergence``), the standard-attention baselines (rank collapse,
``shapedtx.detect_collapse``), figures (``simulations.plots``) and ``summary.json``.
With ``--causal`` (docs/theory.md#causal-sde) the tokens are not exchangeable: the run also writes
``token_pairs.nc`` and ``figures/token_pairs`` (mean rho of the pairs (1, 2), (1, m) and
(m - 1, m) over time, network vs SDE) and a ``token_pairs`` entry in ``summary.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from shapedtx._validation import ParameterError

from . import add_command
from ._common import (
    SDE_METHODS,
    RunArgs,
    UsageError,
    add_config_arguments,
    add_method_argument,
    add_run_options,
    check_output_folder,
    config_from_args,
    option_error,
    staged_folder,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from simulations.presets import PRESET_MODELS  # plain data: no torch for --help

    parser = add_command(
        subparsers,
        "compare",
        run,
        "Simulate a shaped model as a finite network and as its covariance SDE, "
        "compare the distributions of token correlations and norms over depth, measure the "
        "convergence in the width at fixed T = depth/width, and contrast with standard "
        "attention (no norm, pre-LN), which rank-collapses. Writes network.nc, sde.nc, "
        "comparison.nc, collapse.nc, convergence.nc, summary.json and figures/ to --out. "
        f"Presets: {', '.join(f'{k} ({d})' for k, (_, d) in PRESET_MODELS.items())}. "
        "Model options below override the preset.",
    )
    parser.add_argument("--out", required=True, help="output folder (created if needed)")
    parser.add_argument("--preset", choices=tuple(PRESET_MODELS), default="block")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (width 32, 256 samples): a smoke test"
    )
    add_config_arguments(parser, PRESET_MODELS["block"][0])
    g = parser.add_argument_group("experiment (defaults from the preset)")
    g.add_argument("--tokens", type=int, default=None, help="m, number of tokens (4)")
    g.add_argument("--rho0", type=float, default=None, help="initial correlation (0.2)")
    g.add_argument("--samples", type=int, default=None, help="networks and SDE paths (4096)")
    g.add_argument("--baseline-samples", type=int, default=None, help="per baseline (256)")
    g.add_argument(
        "--convergence-widths",
        default=None,
        help="comma-separated widths for the convergence study, besides --width "
        "(default 4,8,16,32,64; 'none' to skip); depth = T * width must be an integer",
    )
    g.add_argument(
        "--dt",
        type=float,
        default=0.005,
        help="SDE step (default 0.005: its step error is below the default run's Monte Carlo SE)",
    )
    g.add_argument("--sde-method", choices=SDE_METHODS, default="euler")
    g.add_argument(
        "--no-step-error",
        action="store_true",
        help="skip the SDE's step-error estimate (a second solve at dt/2 on the same paths, "
        "docs/theory.md#step-error; never with --sde-method torchsde)",
    )
    add_method_argument(g)
    g.add_argument(
        "--threshold", type=float, default=0.99, help="collapse: mean rho above this (0.99)"
    )
    g.add_argument(
        "--no-sde",
        action="store_true",
        help="the rank-collapse report only (simulations.run_collapse): any model, vanilla ones "
        "included (e.g. --model post_ln), since it needs no SDE limit; writes collapse.nc, "
        "network.nc and figures/ (mean_correlation, collapse_metrics)",
    )
    g.add_argument("--no-figures", action="store_true", help="skip the figures")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out folder (its old files are removed)",
    )
    add_run_options(
        parser,
        defaults={"threads": min(2, os.cpu_count() or 1)},
        helps={
            "threads": "torch CPU threads, 2 or the cores if fewer: the simulations fill their "
            "random numbers on them (1.35x faster than 1 thread when idle, as fast with one "
            "core busy)",
            "progress": "progress bars and stage lines",
        },
    )


def experiment_from_args(args: argparse.Namespace) -> Any:
    """The :class:`simulations.Experiment` of the options: the preset, ``--quick`` sizes, then
    the explicit options; a UsageError (one line, exit 2) names a bad option."""
    from simulations.presets import PRESET_MODELS, QUICK

    s: dict[str, Any] = {}  # the preset's fields that the options replace
    if args.quick:
        for key in ("width", "depth"):  # explicit options still win
            if getattr(args, key) is None:
                setattr(args, key, QUICK[key])
        s.update({k: QUICK[k] for k in ("samples", "baseline_samples", "convergence_widths")})
    config = config_from_args(args, PRESET_MODELS[args.preset][0])  # torch-free
    for key in ("tokens", "rho0", "samples", "baseline_samples"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    if args.convergence_widths is not None:
        text = args.convergence_widths.strip().lower()
        try:
            s["convergence_widths"] = (
                () if text == "none" else tuple(int(w) for w in text.split(","))
            )
        except ValueError:
            raise UsageError(
                f"--convergence-widths must be comma-separated integers or 'none', "
                f"got {args.convergence_widths!r}"
            ) from None
    settings = RunArgs.from_args(args)
    from simulations.presets import PRESETS  # the checks above load no torch; these do

    preset = PRESETS[args.preset]
    device = settings.torch_device()
    try:
        return dataclasses.replace(
            preset,
            config=config,
            **s,
            method=args.method,
            sde_method=args.sde_method,
            dt=args.dt,
            step_error=not args.no_step_error and args.sde_method != "torchsde",
            threshold=args.threshold,
            seed=settings.seed,
            device=str(device),
            dtype=settings.dtype,
            sde=not args.no_sde,
        )
    except ValueError as err:
        flags = ("convergence_widths", "baseline_samples", "tokens", "rho0", "samples", "dt",
                 "threshold", "seed", "sde_method", "method")  # fmt: skip
        if "covariance SDE" in str(err):  # a vanilla model: its collapse report needs none
            err = ParameterError(
                getattr(err, "parameter", "config"),
                f"{err}; or pass --no-sde for the rank-collapse report alone",
            )
        raise option_error(err, flags) from None


def run(args: argparse.Namespace) -> int:
    experiment = experiment_from_args(args)  # usage errors first, most before torch loads
    import torch

    threads = torch.get_num_threads()
    try:
        return _run(args, experiment)
    finally:
        torch.set_num_threads(threads)  # --threads is for this command only


def _run(args: argparse.Namespace, experiment: Any) -> int:
    from simulations import run_comparison
    from simulations.formatting import format_collapse, format_summary

    out = Path(args.out)
    check_output_folder(out, args.overwrite)  # before any computation
    settings = RunArgs.from_args(args)
    settings.apply_threads()
    quiet = settings.progress is False

    def stages(k: int, total: int, text: str) -> None:
        if not quiet:
            print(f"[{k}/{total}] {text} ...", file=sys.stderr, flush=True)

    if args.no_sde:
        from simulations import run_collapse

        stages(1, 2, f"collapse report: the model and its baselines, {experiment.samples} and "
               f"{experiment.baseline_samples} samples")  # fmt: skip
        with staged_folder(out) as staging:
            report, _ = run_collapse(
                experiment,
                progress=settings.progress,
                out=staging,
                figures=not args.no_figures,
            )
            stages(2, 2, f"writing to {out}")
            files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        print(format_collapse(report))
        print(f"wrote {out}/: {', '.join(files)}")
        return 0
    with staged_folder(out) as staging:
        result = run_comparison(
            experiment,
            staging,
            figures=not args.no_figures,
            progress=settings.progress,
            stages=stages,
        )
    print(format_summary(result.summary))
    print(f"wrote {out}/: {', '.join(result.summary['files'])}")
    return 0
