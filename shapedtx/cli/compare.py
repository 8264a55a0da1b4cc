"""``shapedtx compare``: finite networks vs the covariance SDE, and the rank-collapse report.

The main job (README): one shaped model simulated as a finite network and as its SDE limit,
compared time by time (``simulations.compare``), a convergence study in the width at fixed T
(``simulations.convergence``), the standard-attention baselines (rank collapse,
``shapedtx.detect_collapse``), figures (``simulations.plots``) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._common import (
    DTYPES,
    UsageError,
    add_config_arguments,
    config_from_args,
    parse_device,
    set_threads,
)

FIGURES = ("mean_correlation", "rho_density", "quantile_bands", "convergence")


def register(subparsers: argparse._SubParsersAction) -> None:
    from simulations import SAMPLERS
    from simulations.presets import PRESETS

    parser = subparsers.add_parser(
        "compare",
        help="finite network vs SDE limit, convergence in width, rank-collapse report",
        description="Simulate a shaped model as a finite network and as its covariance SDE, "
        "compare the distributions of token correlations and norms over depth, measure the "
        "convergence in the width at fixed T = depth/width, and contrast with standard "
        "attention (no norm, pre-LN), which rank-collapses. Writes network.nc, sde.nc, "
        "comparison.nc, collapse.nc, convergence.nc, summary.json and figures/ to --out. "
        f"Presets: {', '.join(f'{k} ({p.description})' for k, p in PRESETS.items())}. "
        "Model options below override the preset.",
    )
    parser.add_argument("--out", required=True, help="output folder (created if needed)")
    parser.add_argument("--preset", choices=tuple(PRESETS), default="block")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (width 32, 256 samples): a smoke test"
    )
    add_config_arguments(parser, PRESETS["block"].config)
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
    g.add_argument("--dt", type=float, default=0.01, help="SDE step (default 0.01)")
    g.add_argument("--sde-method", choices=("euler", "em", "torchsde"), default="euler")
    g.add_argument(
        "--method",
        choices=("auto", *SAMPLERS),
        default="auto",
        help="finite-network sampler; auto (default): 'gram' where it applies (no LayerNorm, "
        "one head without W^O), else 'exact'. All are exact in distribution",
    )
    g.add_argument(
        "--threshold", type=float, default=0.99, help="collapse: mean rho above this (0.99)"
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    g.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the work is many small batched operations, and "
        "on a busy machine 2 threads measured 10x slower than 1)",
    )
    g.add_argument("--no-figures", action="store_true", help="skip the figures")
    g.add_argument("--no-progress", action="store_true", help="no progress bars or stage lines")
    parser.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The preset merged with --quick and the explicit options; validated."""
    from simulations.presets import PRESETS, QUICK

    preset = PRESETS[args.preset]
    s: dict[str, Any] = {
        "tokens": preset.tokens,
        "rho0": preset.rho0,
        "samples": preset.samples,
        "baseline_samples": preset.baseline_samples,
        "widths": preset.convergence_widths,
    }
    if args.quick:
        for key in ("width", "depth"):  # explicit options still win
            if getattr(args, key) is None:
                setattr(args, key, QUICK[key])
        s.update({k: QUICK[k] for k in ("samples", "baseline_samples", "widths")})
    s["config"] = config_from_args(args, preset.config)
    for key in ("tokens", "rho0", "samples", "baseline_samples"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    for key, minimum in (("tokens", 2), ("samples", 2), ("baseline_samples", 2)):
        if s[key] < minimum:
            raise UsageError(f"--{key.replace('_', '-')} must be >= {minimum}, got {s[key]}")
    if args.convergence_widths is not None:
        text = args.convergence_widths.strip().lower()
        try:
            s["widths"] = () if text == "none" else tuple(int(w) for w in text.split(","))
        except ValueError:
            raise UsageError(
                f"--convergence-widths must be comma-separated integers or 'none', "
                f"got {args.convergence_widths!r}"
            ) from None
    s["widths"] = tuple(sorted(set(s["widths"]) - {s["config"].width}))
    if not (math.isfinite(args.dt) and args.dt > 0):
        raise UsageError(f"--dt must be a finite number > 0, got {args.dt}")
    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold must be in (0, 1), got {args.threshold}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    return s


def _method(name: str, config: Any) -> str:
    """The sampler for ``config``: ``name``, or for ``"auto"`` the library's choice
    (:func:`simulations.resolve_method`: the fastest exact-in-law method that applies)."""
    from simulations import resolve_method

    return resolve_method(config, name)


class _Stages:
    """Stage lines on stderr and wall times per stage."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.k = total, quiet, 0
        self.times: dict[str, float] = {}
        self.start = time.perf_counter()

    def __call__(self, name: str, text: str) -> _Stages:
        self.k += 1
        self.name = name
        if not self.quiet:
            print(f"[{self.k}/{self.total}] {text} ...", file=sys.stderr, flush=True)
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.times[self.name] = time.perf_counter() - self.t0


def run(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # --threads is for this command only


def _run(args: argparse.Namespace) -> int:
    from simulations.compare import collapse_report, compare
    from simulations.convergence import at_width, convergence
    from simulations.presets import PRESETS, baselines, model_label

    from ..covariance import equicorrelated
    from ..results import save_dataset

    s = _settings(args)
    config = s["config"]
    for w in s["widths"]:
        at_width(config, w)  # fail before any work: T * width must be an integer
    from sde import sde_constants

    sde_constants(config, s["tokens"])  # fail before any work: the model needs an SDE limit
    device = parse_device(args.device)
    dtype = DTYPES[args.dtype]
    set_threads(args.threads)
    V0 = equicorrelated(s["tokens"], s["rho0"], device=device, dtype=dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quiet = args.no_progress
    progress = False if quiet else None
    common = {"device": device, "dtype": dtype, "progress": progress}
    stage = _Stages(5 + bool(s["widths"]) + (not args.no_figures), quiet)

    from sde import solve
    from simulations import simulate

    with stage("network", f"finite network: {model_label(config)}, width {config.width}, "
               f"depth {config.depth}, {s['samples']} samples"):  # fmt: skip
        network = simulate(config, V0, s["samples"], method=_method(args.method, config),
                           seed=args.seed, **common)  # fmt: skip
    with stage("sde", f"SDE limit to T = {config.T:g}, dt {args.dt:g}, {s['samples']} paths"):
        limit = solve(config, V0, s["samples"], T=config.T, dt=args.dt, method=args.sde_method,
                      seed=args.seed + 1, **common)  # fmt: skip
    base_cfgs = baselines(config)
    models = {f"shaped ({model_label(config)})": network}
    with stage("baselines", f"baselines: {', '.join(base_cfgs)}, {s['baseline_samples']} "
               "samples each"):  # fmt: skip
        for k, (label, cfg) in enumerate(base_cfgs.items()):
            models[f"{label} ({model_label(cfg)})"] = simulate(
                cfg, V0, s["baseline_samples"], method=_method(args.method, cfg),
                seed=args.seed + 2 + k,
                **common,
            )  # fmt: skip
    with stage("statistics", "comparison statistics and collapse report"):
        comparison = compare(network, limit)
        collapse = collapse_report(models, args.threshold)
    conv = None
    if s["widths"]:
        with stage("convergence", f"convergence at T = {config.T:g}: widths "
                   f"{', '.join(map(str, s['widths']))} (+ {config.width})"):  # fmt: skip
            conv = convergence(
                config, [*s["widths"], config.width], V0, s["samples"], limit=limit,
                networks={config.width: network}, method=_method(args.method, config),
                seed=args.seed, **common,
            )  # fmt: skip
    files = []
    with stage("write", f"writing Datasets to {out}"):
        for name, ds in (("network", network), ("sde", limit), ("comparison", comparison),
                         ("collapse", collapse), ("convergence", conv)):  # fmt: skip
            if ds is not None:
                files.append(save_dataset(ds, out / f"{name}.nc"))
    if not args.no_figures:
        with stage("figures", f"figures in {out / 'figures'}"):
            files += _figures(out / "figures", models, network, limit, comparison, conv,
                              args.threshold)  # fmt: skip
    stage.times["total"] = time.perf_counter() - stage.start
    summary = _summary(args, s, comparison, collapse, conv, limit, stage.times, PRESETS)
    summary["files"] = [*sorted(str(p.relative_to(out)) for p in files), "summary.json"]
    _write_json(summary, out / "summary.json")
    print(_table(summary))
    print(f"wrote {out}/: {', '.join(summary['files'])}")
    return 0


def _figures(folder, models, network, limit, comparison, conv, threshold) -> list[Path]:
    from simulations import plots

    paths = []
    figs = {
        "mean_correlation": lambda p: plots.plot_mean_correlation(models, threshold=threshold,
                                                                  path=p),
        "rho_density": lambda p: plots.plot_rho_density(network, limit, path=p),
        "quantile_bands": lambda p: plots.plot_quantile_bands(comparison, path=p),
        "convergence": lambda p: plots.plot_convergence(conv, path=p),
    }  # fmt: skip
    for name in FIGURES:
        if name == "convergence" and conv is None:
            continue
        figs[name](folder / name)
        paths += [folder / f"{name}.png", folder / f"{name}.pdf"]
    return paths


def _num(x: Any) -> float | None:
    """A JSON number: finite float, else None (null)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _nums(x: Any) -> list[float | None]:
    return [_num(v) for v in np.ravel(x)]


def _summary(args, s, comparison, collapse, conv, limit, times, presets) -> dict[str, Any]:
    """The headline numbers (README: how to read summary.json)."""
    config = s["config"]
    last = comparison.isel(t=-1)
    summary: dict[str, Any] = {
        "preset": args.preset,
        "description": presets[args.preset].description,
        "quick": bool(args.quick),
        "config": config.to_attrs(prefix=""),
        "T": config.T,
        "tokens": s["tokens"],
        "rho0": s["rho0"],
        "samples": s["samples"],
        "dtype": args.dtype,
        "seed": args.seed,
        "threads": args.threads,
        "method": {"network": comparison.attrs["network_method"], "sde": args.sde_method},
        "t_final": {"network": float(last["t_network"]), "sde": float(last["t_limit"])},
        "quantiles": _nums(comparison["quantile"].values),
    }
    for var in ("rho", "Vaa"):
        summary[f"{var}_T"] = {
            src: {
                "quantiles": _nums(last[f"{var}_quantile"].sel(source=src).values),
                "se": _nums(last[f"{var}_quantile_se"].sel(source=src).values),
            }
            for src in ("network", "sde")
        }
    summary["distances_T"] = {
        k: _num(last[k])
        for k in ("ks_rho", "ks_rho_pvalue", "w1_rho", "ks_logVaa", "ks_logVaa_pvalue",
                  "w1_logVaa")
    }  # fmt: skip
    summary["max_over_t"] = {
        "ks_rho": _num(comparison["ks_rho"].max()),
        "w1_rho": _num(comparison["w1_rho"].max()),
        "min_ks_rho_pvalue": _num(comparison["ks_rho_pvalue"].min()),
    }
    summary["sde"] = {
        "method": args.sde_method,
        "dt": _num(limit.attrs.get("dt", args.dt)),
        "exploded": int(limit["exploded"].sum()) if "exploded" in limit else 0,
        "samples": int(limit.sizes["sample"]),
        "excluded": int(comparison.attrs["n_excluded_limit"]),
    }
    summary["network_excluded"] = int(comparison.attrs["n_excluded_network"])
    summary["collapse"] = {
        "threshold": args.threshold,
        "models": {
            str(m): {
                "fraction_collapsed": _num(collapse["fraction_collapsed"].sel(model=m)),
                "median_collapse_layer": _num(collapse["median_collapse_layer"].sel(model=m)),
                "final_mean_rho": _num(collapse["final_mean_rho"].sel(model=m)),
                "samples": int(collapse["samples"].sel(model=m)),
            }
            for m in collapse["model"].values
        },
    }
    if conv is not None:
        summary["convergence"] = {
            "widths": [int(w) for w in conv["width"].values],
            "depths": [int(d) for d in conv["depth"].values],
            **{k: _nums(conv[k].values) for k in ("w1_rho", "ks_rho", "median_rho_gap",
                                                  "median_rho_gap_se")},
            "w1_rho_slope": _num(conv.attrs["w1_rho_slope"]),
            "w1_rho_slope_se": _num(conv.attrs["w1_rho_slope_se"]),
            "w1_rho_noise_floor": _num(conv.attrs["w1_rho_noise_floor"]),
        }  # fmt: skip
    else:
        summary["convergence"] = None
    summary["run_times_s"] = {k: round(v, 2) for k, v in times.items()}
    return summary


def _table(s: dict[str, Any]) -> str:
    """The compact table printed at the end."""
    c = s["config"]
    fmt = lambda x: "   nan" if x is None else f"{x:6.3f}"  # noqa: E731
    lines = [
        f"shapedtx compare [{s['preset']}] {s['description']}",
        f"  width {c['width']}, depth {c['depth']}, T = {s['T']:g}, m = {s['tokens']}, "
        f"rho0 = {s['rho0']:g}, gamma = {c['gamma']:.4g}, tau0 = {c['tau0']:g}, "
        f"{s['samples']} samples",
        f"rho at T ({'/'.join(f'{100 * q:g}%' for q in s['quantiles'])} quantiles, ± max SE):",
    ]
    for src in ("network", "sde"):
        r = s["rho_T"][src]
        se = max((v for v in r["se"] if v is not None), default=float("nan"))
        lines.append(f"  {src:8s} " + " ".join(fmt(v) for v in r["quantiles"]) + f"   ± {se:.3f}")
    d = s["distances_T"]
    lines.append(
        f"distances at T: rho KS {fmt(d['ks_rho'])} (p = {_g(d['ks_rho_pvalue'])}), "
        f"W1 {fmt(d['w1_rho'])}; log V^aa KS {fmt(d['ks_logVaa'])} "
        f"(p = {_g(d['ks_logVaa_pvalue'])}), W1 {fmt(d['w1_logVaa'])}"
    )
    e = s["sde"]
    lines.append(f"SDE paths exploded: {e['exploded']} of {e['samples']} (excluded)")
    lines.append(f"rank collapse (mean rho > {s['collapse']['threshold']:g}):")
    width = max(len(m) for m in s["collapse"]["models"])
    lines.append(f"  {'model':{width}s}  collapsed  median layer  final mean rho")
    for m, r in s["collapse"]["models"].items():
        layer = "never" if r["median_collapse_layer"] is None else f"{r['median_collapse_layer']:g}"
        lines.append(
            f"  {m:{width}s}  {r['fraction_collapsed']:9.0%}  {layer:>12s}  "
            f"{fmt(r['final_mean_rho'])}"
        )
    cv = s["convergence"]
    if cv is not None:
        pts = ", ".join(
            f"{w}: {'nan' if v is None else f'{v:.4f}'}"
            for w, v in zip(cv["widths"], cv["w1_rho"], strict=True)
        )
        slope = cv["w1_rho_slope"]
        lines.append(
            f"convergence, W1(rho_T) by width {{{pts}}}; slope "
            f"{'nan' if slope is None else f'{slope:.2f}'} (theory about -0.5; noise floor "
            f"{fmt(cv['w1_rho_noise_floor']).strip()})"
        )
    lines.append("run times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in s["run_times_s"].items()))
    return "\n".join(lines)


def _g(x: float | None) -> str:
    return "nan" if x is None else f"{x:.2g}"


def _write_json(data: dict[str, Any], path: Path) -> None:
    """Atomic JSON write (temporary file in the same folder, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
