"""Do the advisor's init-time scores predict training? (issue #20, item 4)

Over a grid of shaped configurations (gamma x tau0 at several depths, plus at every depth the
configuration ``simulations.advise`` recommends and a rejected one, gamma 1 / tau0 0.2), this
computes every init-time score from the covariance SDE before training (the three safety
criteria and the ranking score ``rho_spread``, plus the naive ``gamma^2 T``), then trains a
causal byte-level LM (``shapedtx.train``) for each configuration on a learning-rate grid and
keeps the best final validation loss per configuration. It reports the Spearman rank
correlation between each score and the loss with a bootstrap interval over configurations,
and checks the advice: does the advised configuration (its lr tuned) train to within 2% of
the best configuration of the same depth, and does the rejected one train worse?

Resumable: every SDE score and every training run writes its own JSON file atomically when it
finishes (training itself checkpoints; the runs are tasks of the project's Dask machinery,
``simulations.run_trainings``: an embedded local cluster of ``--workers`` processes, or
``--scheduler ADDRESS``), so a second invocation skips finished work;
``--report`` rebuilds ``results.json`` and ``score_vs_loss.png`` from the finished runs only.

Usage::

    python examples/advise/predict.py --quick --out /tmp/predict     # < 1 min, tiny sizes
    python examples/advise/predict.py                                 # the study (hours, CPU)
    python examples/advise/predict.py --device cuda                   # the same on a GPU
    python examples/advise/predict.py --report                        # results from finished runs
    python examples/advise/predict.py --depths 16 --horizons 250 1000 5000   # long_horizon/
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from shapedtx import ModelConfig, TrainConfig
from shapedtx.covariance import equicorrelated
from shapedtx.files import write_json
from simulations.advise import Criteria, advise, measure, solve_batch
from simulations.training_runs import TrainingRun, run_trainings

HERE = Path(__file__).parent
SCORES = ("rho_spread", "collapse", "exploded", "norm", "gamma2T")
RANKING_SCORE = "rho_spread"
REJECTED = (1.0, 0.2)


@dataclass(frozen=True)
class Setup:
    width: int = 64
    depths: tuple[int, ...] = (16, 32, 64)
    gammas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.6, 0.9)
    tau0s: tuple[float, ...] = (0.25, 1.0)
    lrs: tuple[float, ...] = (3e-3, 1e-2, 3e-2)
    heads: int = 4
    steps: int = 1000
    horizons: tuple[int, ...] = ()  # WSD runs with these horizons (steps = the longest)
    batch_size: int = 16
    seq_len: int = 64
    max_bytes: int = 8_000_000
    sde_tokens: int = 8
    sde_samples: int = 2048
    advise_samples: int = 4096
    seed: int = 0


QUICK = Setup(
    width=16,
    depths=(2, 4),
    gammas=(0.1, 0.5, 0.9),
    tau0s=(0.5, 1.0),
    lrs=(3e-3, 1e-2),
    heads=2,
    steps=20,
    batch_size=4,
    seq_len=16,
    max_bytes=200_000,
    sde_tokens=4,
    sde_samples=128,
    advise_samples=256,
)


def _write_json(obj: Any, path: Path) -> None:
    write_json(obj, path, indent=1)  # atomic, umask-honouring (shapedtx.files)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def model_config(s: Setup, depth: int, gamma: float, tau0: float, causal: bool = True):
    return ModelConfig(
        width=s.width,
        depth=depth,
        attention="shaped",
        mlp="shaped_relu",
        heads=s.heads,
        out_proj=s.heads > 1,
        causal=causal,
        gamma=gamma,
        tau0=tau0,
    )


def configurations(s: Setup, out: Path) -> list[tuple[int, float, float, str]]:
    """(depth, gamma, tau0, role) for the hand grid, the advice and the rejected config."""
    rows = [(d, g, t, "grid") for d in s.depths for g in s.gammas for t in s.tau0s]
    for d in s.depths:
        path = out / "advice" / f"d{d}.json"
        if path.exists():
            adv = json.loads(path.read_text())
        else:
            a = advise(
                s.width, d, s.sde_tokens, heads=s.heads, samples=s.advise_samples, seed=s.seed
            )
            adv = {"gamma": a.gamma, "tau0": a.tau0, "T": a.T, "seconds": a.seconds}
            _write_json(adv, path)
        if adv["gamma"] is not None:
            key = (d, adv["gamma"], adv["tau0"])
            rows = [r for r in rows if r[:3] != key] + [(*key, "advised")]
        rows = [r for r in rows if r[:3] != (d, *REJECTED)] + [(d, *REJECTED, "rejected")]
    return rows


def _name(depth: int, gamma: float, tau0: float) -> str:
    return f"d{depth}/g{gamma:g}_t{tau0:g}"


def sde_scores(s: Setup, out: Path, depth: int, gamma: float, tau0: float) -> dict[str, Any]:
    """The init-time scores of one configuration from the SDE (cached in scores/)."""
    path = out / "scores" / f"{_name(depth, gamma, tau0).replace('/', '_')}.json"
    if path.exists():
        return json.loads(path.read_text())
    V0 = equicorrelated(s.sde_tokens, 0.2)
    T = depth / s.width
    steps = max(50, math.ceil(50 * T))
    config = model_config(s, depth, gamma, tau0)  # causal, as the trained models
    ((VT, ex),) = solve_batch([config], V0, s.sde_samples, T=T, steps=steps, seed=s.seed)
    m = measure(V0, VT, ex, Criteria())
    result = {
        "depth": depth,
        "gamma": gamma,
        "tau0": tau0,
        "T": T,
        "sde_causal": config.causal,
        "samples": s.sde_samples,
        "violations": list(m.violations(Criteria())),
        "rho_spread": m.rho_spread,
        "rho_spread_se": m.rho_spread_se,
        "collapse": m.collapse,
        "exploded": m.exploded,
        "norm": _finite(m.norm),
        "gamma2T": gamma**2 * T,
    }
    _write_json(result, path)
    return result


def training_run(s: Setup, out: Path, depth: int, gamma: float, tau0: float, lr: float,
                 device: str) -> TrainingRun:  # fmt: skip
    """One configuration at one lr; its result is ``runs/<name>/lr<lr>/result.json``."""
    horizons = s.horizons or (s.steps,)
    steps = max(horizons)
    if s.horizons:  # every shorter horizon's cooldown start must fall on a log row
        starts = [h - max(1, round(0.2 * h)) for h in horizons if h != steps]
        log_every = eval_every = math.gcd(*starts) if starts else max(1, steps // 20)
    else:
        log_every = max(1, steps // 20)
        eval_every = log_every * 5 if steps >= 100 else log_every
    tc = TrainConfig(
        steps=steps,
        batch_size=s.batch_size,
        seq_len=s.seq_len,
        lr=lr,
        warmup_steps=max(1, min(50, min(horizons) // 10) if s.horizons else steps // 20),
        schedule="wsd" if s.horizons else "cosine",
        log_interval=log_every,
        eval_interval=eval_every,
        checkpoint_interval=eval_every,  # an interrupted run resumes from here
        seed=s.seed,
    )
    return TrainingRun(
        model=model_config(s, depth, gamma, tau0),
        train=tc,
        horizons=horizons,
        folder=str(out / "runs" / _name(depth, gamma, tau0) / _lr_folder(s, lr)),
        max_bytes=s.max_bytes,
        device=device,
        labels={"depth": depth, "gamma": gamma, "tau0": tau0, "lr": lr},
    )


def default_out(s: Setup) -> Path:
    """Where a study's files go by default: this folder for the fixed-horizon study, its
    ``long_horizon/`` subfolder for the per-horizon (WSD) one."""
    return HERE / "long_horizon" if s.horizons else HERE


def _lr_folder(s: Setup, lr: float) -> str:
    return f"lr{lr:g}_wsd" if s.horizons else f"lr{lr:g}"


def val_loss(result: dict[str, Any], horizon: int | None = None) -> float | None:
    """A run's final validation loss at ``horizon`` (default: its only one; None if it
    diverged), from either result form (the Dask runs' per-horizon form, or the flat form of
    the runs made before it)."""
    if "horizons" not in result:
        return result["val_loss"]
    h = result["horizons"][str(horizon)] if horizon else next(iter(result["horizons"].values()))
    return None if h["diverged"] else h["val_loss"]


def _bootstrap_spearman(x, y, n_boot: int = 2000, seed: int = 0) -> tuple[float, list[float]]:
    x, y = np.asarray(x, float), np.asarray(y, float)
    value = float(spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(x), len(x))
        if np.unique(x[idx]).size > 1 and np.unique(y[idx]).size > 1:
            stats.append(spearmanr(x[idx], y[idx]).statistic)
    lo, hi = np.nanpercentile(stats, [2.5, 97.5]) if stats else (math.nan, math.nan)
    return value, [float(lo), float(hi)]


def report(s: Setup, out: Path, rows) -> dict[str, Any]:
    """Spearman of every score against the best loss, and the advice check, at the horizon of
    ``s.steps`` (or the longest of ``s.horizons``) and, with ``s.horizons``, per horizon under
    ``"by_horizon"``; writes results.json and score_vs_loss.png."""
    if not s.horizons:
        result = _report_at(s, out, rows, None)
    else:
        by = {str(h): _report_at(s, out, rows, h) for h in s.horizons}
        result = {**by[str(max(s.horizons))], "by_horizon": by}
    _write_json(result, out / "results.json")
    if result["configs"]:
        _figure(result["configs"], out / "score_vs_loss.png")
    return result


def _report_at(s: Setup, out: Path, rows, horizon: int | None) -> dict[str, Any]:
    table = []
    for depth, gamma, tau0, role in rows:
        score_path = out / "scores" / f"{_name(depth, gamma, tau0).replace('/', '_')}.json"
        folder = out / "runs" / _name(depth, gamma, tau0)
        paths = [folder / _lr_folder(s, lr) / "result.json" for lr in s.lrs]
        runs = [json.loads(p.read_text()) for p in paths if p.exists()]
        if not score_path.exists() or len(runs) < len(s.lrs):
            continue  # unfinished
        losses = [v if (v := val_loss(r, horizon)) is not None else math.inf for r in runs]
        best = int(np.argmin(losses))
        table.append(
            {
                **json.loads(score_path.read_text()),
                "role": role,
                "loss": _finite(losses[best]),
                "best_lr": runs[best]["lr"] if math.isfinite(losses[best]) else None,
                "losses": {f"{r['lr']:g}": val_loss(r, horizon) for r in runs},
            }
        )
    result: dict[str, Any] = {"setup": s.__dict__, "configs": table}
    # how many configurations take each lr as their best: a count piled on the smallest or the
    # largest lr says the grid should be extended there (--lrs; finished runs are reused)
    result["best_lr_counts"] = {
        f"{lr:g}": sum(t["best_lr"] == lr for t in table) for lr in s.lrs
    } | {"diverged": sum(t["best_lr"] is None for t in table)}
    if len(table) >= 3:
        # diverged runs rank as worst (loss +inf); norm inf as the largest score
        loss = [t["loss"] if t["loss"] is not None else math.inf for t in table]
        per_score = {}
        for name in SCORES:
            score = [t[name] if t[name] is not None else math.inf for t in table]
            value, ci = _bootstrap_spearman(score, loss, seed=s.seed)
            per_score[name] = {"value": value, "ci": ci, "runs": len(table)}
        result["scores"] = per_score
        by_depth = {}
        for depth in s.depths:
            at = [i for i, t in enumerate(table) if t["depth"] == depth]
            if len(at) >= 3:
                by_depth[str(depth)] = {
                    name: float(
                        spearmanr(
                            [table[i][name] if table[i][name] is not None else math.inf
                             for i in at],
                            [loss[i] for i in at],
                        ).statistic
                    )
                    for name in SCORES
                }  # fmt: skip
        result["scores_by_depth"] = by_depth
        result["spearman"] = {**per_score[RANKING_SCORE], "score": RANKING_SCORE}
        finite = {k: v for k, v in per_score.items() if math.isfinite(v["value"])}
        # the score with the strongest rank correlation either way; every score is meant as
        # "higher is worse", so a negative value means the score predicts the wrong way round
        result["best_predictor"] = (
            max(finite, key=lambda k: abs(finite[k]["value"])) if finite else None
        )
    checks = []
    for depth in s.depths:
        at = [t for t in table if t["depth"] == depth]
        finished = [t["loss"] for t in at if t["loss"] is not None]
        adv = [t for t in at if t["role"] == "advised"]
        rej = [t for t in at if t["role"] == "rejected"]
        if not finished or not adv:
            continue
        best = min(finished)
        a_loss = adv[0]["loss"]
        checks.append(
            {
                "depth": depth,
                "advised": [adv[0]["gamma"], adv[0]["tau0"]],
                "advised_loss": a_loss,
                "best_loss": best,
                "within_2_percent": a_loss is not None and a_loss <= 1.02 * best,
                "rejected_loss": rej[0]["loss"] if rej else None,
                "rejected_worse": bool(rej)
                and (rej[0]["loss"] is None or (a_loss is not None and rej[0]["loss"] > a_loss)),
            }
        )
    result["advice_check"] = checks
    result["horizon"] = horizon or s.steps
    return result


def _figure(table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCORES), figsize=(4 * len(SCORES), 3.6))
    finite = [t["loss"] for t in table if t["loss"] is not None]
    # configurations that diverged at every learning rate: drawn on a row above the losses
    top = max(finite) + 0.1 * (max(finite) - min(finite) + 1e-3) if finite else 1.0
    for ax, name in zip(axes, SCORES, strict=True):
        for t in table:
            loss = t["loss"] if t["loss"] is not None else top
            x = t[name] if t[name] is not None else np.nan
            marker = {"advised": "*", "rejected": "x"}.get(t["role"], "o")
            colour = f"C{sorted({r['depth'] for r in table}).index(t['depth'])}"
            hollow = t["loss"] is None and marker != "x"
            ax.scatter(x, loss, marker=marker, s=60 if marker == "*" else 25,
                       facecolors="none" if hollow else colour,
                       edgecolors=None if marker == "x" else colour)  # fmt: skip
        ax.axhline(top, color="gray", lw=0.5, ls=":")
        ax.set_xlabel(name + " (SDE, at init)")
        ax.set_xscale("symlog", linthresh=1e-3) if name in ("collapse", "exploded") else None
    axes[0].set_ylabel("best final val loss")
    axes[0].annotate("diverged at every lr", (0.02, top), xycoords=("axes fraction", "data"),
                     va="bottom", fontsize="small", color="gray")  # fmt: skip
    fig.suptitle("init-time SDE scores vs trained loss (colour: depth; *: advised, x: rejected; "
                 "top row: diverged)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (< 1 min)")
    parser.add_argument("--report", action="store_true", help="rebuild results only")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder (default: beside this script; long_horizon/ there with "
        "--horizons, so the short study's results.json is kept)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2, help="embedded Dask workers")
    parser.add_argument("--scheduler", default=None, help="address of a running Dask scheduler")
    parser.add_argument("--width", type=int)
    parser.add_argument("--depths", type=int, nargs="+")
    parser.add_argument("--gammas", type=float, nargs="+")
    parser.add_argument("--tau0s", type=float, nargs="+")
    parser.add_argument("--lrs", type=float, nargs="+")
    parser.add_argument("--steps", type=int)
    parser.add_argument(
        "--horizons", type=int, nargs="+", help="WSD runs reporting every horizon (steps)"
    )
    args = parser.parse_args(argv)
    s = QUICK if args.quick else Setup()
    changes = {
        k: (tuple(v) if isinstance(v, list) else v)
        for k in ("width", "depths", "gammas", "tau0s", "lrs", "steps", "horizons")
        if (v := getattr(args, k)) is not None
    }
    s = Setup(**{**s.__dict__, **changes})
    if args.out is None:
        args.out = default_out(s)
    rows = configurations(s, args.out)
    if not args.report:
        for depth, gamma, tau0, _ in rows:
            sde_scores(s, args.out, depth, gamma, tau0)
        runs = [
            training_run(s, args.out, depth, gamma, tau0, lr, args.device)
            for depth, gamma, tau0, _ in rows
            for lr in s.lrs
        ]
        summary = run_trainings(
            runs,
            client=args.scheduler,
            workers=None if args.scheduler else args.workers,
            describe=lambda key, r: f"d{r['depth']} g{r['gamma']:g} t{r['tau0']:g} lr {r['lr']:g}",
        )
        for key, error in summary.failed.items():
            print(f"predict.py: run {key} failed: {error}", file=sys.stderr)
    res = report(s, args.out, rows)
    print(json.dumps({k: res.get(k) for k in ("spearman", "best_predictor", "advice_check")},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
