"""The shaped model's ablation: which part of shaping costs it its long-horizon gap.

Generated from the runs, never edited by hand: ``results.json`` (every number), ``results.md``
(the report) and ``figures/``. The ablation's runs are this folder's store (``runs.jsonl``, the
screen: ``../long_horizon/study.py --ablation``) and ``long/runs.jsonl`` (the screen's best
two to 5,000 steps at depth 16 and to 2,000 at depth 64: ``--ablation-long``; and (j) on,
questions that stage raised, at depth 16 to 5,000 steps without a screen); the shaped
model as it is, (a), and the baselines come from the long-horizon study's store (the same
recipe: width 64, 4 heads with W^O, MLP 4n, causal, batch 32 x 64 bytes, the default corpus,
WSD with 50 warm-up steps and a 20% cooldown branched at every horizon, seed 0 for the lr
grid).

Usage::

    python examples/ablation/report.py          # results.json, results.md, figures/
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sde import kernel_nonlinearity, sde_constants
from shapedtx import ModelConfig
from shapedtx.config import shaped_relu_slope
from shapedtx.files import atomic_path, write_json
from shapedtx.training import TrainConfig
from simulations.studies import STORE, RunStore

HERE = Path(__file__).parent
LONG_HORIZON = HERE.parent / "long_horizon"
SHAPED = "shaped advise"
"""(a): the shaped model at advise's gamma and tau0, from the long-horizon study."""
VARIANTS: dict[str, str] = {
    "shaped advise, relu": "(b) ReLU MLP",
    "shaped advise, gelu": "(c) GELU MLP",
    "shaped advise, slopes": "(d) trainable slopes (per channel)",
    "shaped advise, slopes+attn": "(e) (d) + trainable attention gains",
    "shaped advise, slopes+attn+tau": "(f) (e) + trainable temperature",
    "shaped advise, slopes+attn+res": "(g) (e) + trainable residual weights",
    "shaped advise, slopes+attn+final LN": "(h) (e) + final LayerNorm",
    "shaped advise, slopes+attn, muP lr": "(i) (e), matrices at 1/4 of the base lr",
    "shaped g=0.1, slopes+attn+tau": "(j) (f) at gamma 0.1 (depth 64's depth * gamma^2)",
    "shaped advise, slopes+attn+tau, pre-RMSNorm": "(k) (f) + RMSNorm before each branch "
    "and the readout",
    "shaped advise, slopes+attn+tau, biases": "(l) (f) + biases (zero at initialisation)",
    "shaped advise, slopes+attn+tau, biases, vectors lr/3": "(m) (l), gains, slopes and "
    "biases at 1/3 of the base lr",
    "shaped advise, slopes+attn+tau, biases, log gains": "(n) (l), gains and slopes stored as logs",
    "shaped advise, softmax attention, slopes, biases": "(o) (l) with softmax attention "
    "(not shaped)",
    "shaped advise, attn+tau, GELU, biases": "(p) (l) with a GELU MLP (not shaped)",
    "shaped advise, slopes+attn+tau, biases, vectors lr/3, cooldown 40%": "(q) (m) with a 40% "
    "cooldown",
}
"""The ablation's variants: one part of the shaped model changed (``study.py --ablation``)."""
_LAST = list(VARIANTS.values())[-1].split()[0]
"""The last variant's letter, as "(n)"."""
GPT2 = "pre-LN (GPT-2)"
COOLDOWN_40 = "pre-LN depth-muP, cooldown 40%"
"""Depth-muP pre-LN with (q)'s 40% cooldown: (q)'s change to the recipe given to the baseline
too (this folder's ``long/`` store)."""
BASELINES = (GPT2, "pre-LN depth-muP", COOLDOWN_40, "SAS-P")
"""The baselines a ratio is taken against: GPT-2's pre-LN, and the best of these measured at
a horizon (pre-LN with depth-muP where the long-horizon study has it)."""
SHOWN = (SHAPED, *BASELINES, "SAS-P no norm")
GOAL_MARGIN = 0.01
GOAL_SEEDS = 3
"""The issue's goal: a model the SDE describes at initialisation within this fraction of the
best baseline's loss at each depth's longest horizon, with this many seeds of each."""
STAGES = (HERE, HERE / "long")
"""The ablation's stores: the screen (depth 16, 2,000 steps) and its second stage (5,000 steps
at depth 16, 2,000 at depth 64)."""


def _loss(result: dict[str, Any], horizon: int) -> float:
    """Final validation loss at ``horizon`` (inf: diverged or not run)."""
    h = result["horizons"].get(str(horizon))
    return math.inf if h is None or h["diverged"] else float(h["val_loss"])


def cell(runs: list[dict[str, Any]], horizon: int) -> dict[str, Any] | None:
    """One model at one horizon: seed 0's loss at every lr of the grid, the best lr and
    whether a worse (or diverged) lr lies on both sides of it, and the seeds at the best lr
    (mean, sd and each seed's loss); None if no run has this horizon."""
    grid = sorted(
        (r for r in runs if r["seed"] == 0 and str(horizon) in r["horizons"]),
        key=lambda r: r["lr"],
    )
    if not grid:
        return None
    losses = [_loss(r, horizon) for r in grid]
    best = int(np.argmin(losses))
    lr = grid[best]["lr"]
    at_lr = [r for r in runs if r["lr"] == lr and str(horizon) in r["horizons"]]
    seeds = [_loss(r, horizon) for r in at_lr]
    finite = [v for v in seeds if math.isfinite(v)]
    return {
        "lr": [r["lr"] for r in grid],
        "loss": [v if math.isfinite(v) else None for v in losses],
        "diverged": sum(not math.isfinite(v) for v in losses),
        "best_lr": lr if math.isfinite(losses[best]) else None,
        "bracketed": 0 < best < len(grid) - 1,
        "mean": float(np.mean(finite)) if finite else None,
        "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else None,
        "seeds": len(finite),
        "by_seed": {
            str(r["seed"]): v for r, v in zip(at_lr, seeds, strict=True) if math.isfinite(v)
        },
    }


def _identity(r: dict[str, Any]) -> tuple[Any, ...]:
    return r["model_name"], r["depth"], r["lr"], r["seed"], r["schedule"]


def merge(ablation: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float | None]:
    """One run per (model, depth, lr, seed, schedule), the one with the most horizons (a longer
    run's shorter horizons are the same WSD branches), and the largest difference between the
    losses of the horizons two such runs share (0.0: the longer run reproduced the shorter;
    None: no run was repeated)."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    diff: float | None = None
    for r in ablation:
        other = kept.get(_identity(r))
        if other is not None:
            for h in set(r["horizons"]) & set(other["horizons"]):
                a, b = _loss(r, int(h)), _loss(other, int(h))
                d = 0.0 if a == b else abs(a - b)
                diff = d if diff is None else max(diff, d)
        if other is None or len(r["horizons"]) > len(other["horizons"]):
            kept[_identity(r)] = r
    return list(kept.values()), diff


def summarise(ablation: list[dict[str, Any]], long_horizon: list[dict[str, Any]]) -> dict[str, Any]:
    """Every number of the report, per depth the ablation ran (:func:`at_depth`).
    ``ablation``: the runs of every stage (:func:`merge` keeps the longest of a repeated run)."""
    stored = len(ablation)
    ablation, repeated = merge(ablation)
    depths = sorted({r["depth"] for r in ablation})
    return {
        "widths": sorted({r["model_config"]["config.width"] for r in ablation}),
        "depths": {str(d): at_depth(ablation, long_horizon, d) for d in depths},
        "runs": stored,
        "repeated_max_diff": repeated,
        # model -> its WSD cooldown's share of each horizon
        "cooldown_fractions": {
            r["model_name"]: r["train_config"]["train.cooldown_fraction"]
            for r in long_horizon + ablation
            if r["depth"] in depths and r["schedule"] == "wsd"
        },
        # (model, depth) whose grid has half steps (``study.py --refine``)
        "refined": [
            list(md)  # as JSON reads it back
            for md in sorted(
                {(r["model_name"], r["depth"]) for r in ablation + long_horizon if r["k"] % 1}
            )
            if md[1] in depths
        ],
        "fingerprints": sorted(
            {
                r.get("corpus_fingerprint", "")
                for r in ablation + long_horizon
                if r["depth"] in depths and r["schedule"] == "wsd"
            }
            - {""}
        ),
    }


def at_depth(
    ablation: list[dict[str, Any]], long_horizon: list[dict[str, Any]], depth: int
) -> dict[str, Any]:
    """One depth: per model and horizon its :func:`cell`, the ratio of its best loss to GPT-2's
    pre-LN and to the best baseline, and its difference from (a); how the shape moved and
    which runs diverged. The horizons are the ablation's at this depth."""
    ablation = [r for r in ablation if r["depth"] == depth]
    runs = [r for r in ablation + long_horizon if r["depth"] == depth and r["schedule"] == "wsd"]
    horizons = sorted({int(h) for r in ablation for h in r["horizons"]})
    models = [m for m in (*SHOWN, *VARIANTS) if any(r["model_name"] == m for r in runs)]
    cells = {
        m: {h: cell([r for r in runs if r["model_name"] == m], h) for h in horizons} for m in models
    }
    # advise's gamma and tau0: (a)'s, as every variant's but (j)'s
    config = next((r for r in runs if r["model_name"] == SHAPED), ablation[0])["model_config"]
    out: dict[str, Any] = {
        "gamma": config["config.gamma"],
        "tau0": config["config.tau0"],
        "width": config["config.width"],
        "horizons": horizons,
        "models": {},
    }
    for m in models:
        rows = {}
        for h in horizons:
            c = cells[m][h]
            if c is None:
                continue
            present = [b for b in BASELINES if b in cells and cells[b][h] and cells[b][h]["mean"]]
            best = min(present, key=lambda b: cells[b][h]["mean"]) if present else None
            row = dict(c)
            if c["mean"] is not None:
                if GPT2 in present:
                    row["vs_gpt2"] = c["mean"] / cells[GPT2][h]["mean"] - 1
                if best is not None:
                    row["best_baseline"] = best
                    row["vs_best"] = c["mean"] / cells[best][h]["mean"] - 1
                    row["best_baseline_sd"] = cells[best][h]["sd"]
                shaped = cells.get(SHAPED, {}).get(h)
                if shaped and shaped["mean"] is not None and m != SHAPED:
                    row["minus_shaped"] = c["mean"] - shaped["mean"]
            rows[str(h)] = row
        out["models"][m] = rows
    out["shape"] = shape_moves(ablation, out)
    out["cooldown"] = cooldown(runs, out)
    out["goal"] = goal(runs, out)
    out["diverged"] = diverged_runs(ablation)
    return out


def cooldown(runs: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """Where the gap to the best baseline opens at the longest horizon: per model, its seed-0
    run at its best lr, the validation loss at the end of the constant-lr phase (the WSD
    cooldown's first step) and after the cooldown, each against the seed-0 run at its best
    lr of the best baseline (lowest mean) whose cooldown starts at the same step; only
    models whose run records its validation curve."""
    horizon = str(max(summary["horizons"]))
    best = {m: rows[horizon] for m, rows in summary["models"].items() if horizon in rows}
    out: dict[str, Any] = {}
    for m, row in best.items():
        run = next(
            (
                r
                for r in runs
                if (r["model_name"], r["seed"], r["lr"]) == (m, 0, row["best_lr"])
                and "val_curve" in r["horizons"][horizon]
            ),
            None,
        )
        if run is None:
            continue
        curve = run["horizons"][horizon]["val_curve"]
        config = TrainConfig.from_attrs(run["train_config"]).replace(steps=int(horizon))
        start = config.cooldown_start
        if start not in curve["step"]:
            continue
        out[m] = {
            "lr": row["best_lr"],
            "step": start,
            "before": curve["loss"][curve["step"].index(start)],
            "after": _loss(run, int(horizon)),
        }
    for entry in out.values():  # the best baseline whose cooldown starts at the same step
        same = [b for b in BASELINES if b in out and out[b]["step"] == entry["step"]]
        if same:
            ref = out[min(same, key=lambda b: best[b]["mean"])]
            entry["baseline"] = next(b for b in same if out[b] is ref)
            entry["vs_best_before"] = entry["before"] / ref["before"] - 1
            entry["vs_best_after"] = entry["after"] / ref["after"] - 1
    return out


def _described_by_sde(model_config: dict[str, Any]) -> bool:
    """Whether the covariance SDE describes the model at initialisation (docs/theory.md#sde):
    ``sde.sde_constants`` accepts its configuration."""
    try:
        sde_constants(ModelConfig.from_attrs(model_config))
    except ValueError:
        return False
    return True


def goal(runs: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """The goal at the longest horizon: per shaped model (a) and variant, whether the SDE
    describes it at initialisation, its loss (mean over its seeds at its best lr) against the
    best baseline's, the ratio minus 1 with its standard error from both seed spreads (where
    both ran two or more seeds), the same ratio seed by seed over the seeds both ran (paired:
    the same data order), and the verdict: "met" (``GOAL_SEEDS`` seeds each, ratio at most
    ``GOAL_MARGIN`` above), "not met", "open" (fewer seeds), or, for a model the SDE does not
    describe at initialisation, "not shaped at initialisation"."""
    horizon = str(max(summary["horizons"]))
    out: dict[str, Any] = {}
    for m, rows in summary["models"].items():
        row = rows.get(horizon)
        if m not in (SHAPED, *VARIANTS) or row is None or row.get("best_baseline") is None:
            continue
        base = summary["models"][row["best_baseline"]][horizon]
        ratio = row["vs_best"]
        se = None
        if row["sd"] is not None and base["sd"] is not None:
            se = (1 + ratio) * math.sqrt(
                (row["sd"] / row["mean"]) ** 2 / row["seeds"]
                + (base["sd"] / base["mean"]) ** 2 / base["seeds"]
            )
        common = sorted(set(row["by_seed"]) & set(base["by_seed"]), key=int)
        paired = [row["by_seed"][s] / base["by_seed"][s] - 1 for s in common]
        shaped = _described_by_sde(next(r["model_config"] for r in runs if r["model_name"] == m))
        enough = min(row["seeds"], base["seeds"]) >= GOAL_SEEDS
        verdict = "open" if not enough else "met" if ratio <= GOAL_MARGIN else "not met"
        out[m] = {
            "sde_at_init": shaped,
            "horizon": int(horizon),
            "seeds": row["seeds"],
            "baseline": row["best_baseline"],
            "baseline_seeds": base["seeds"],
            "ratio": ratio,
            "ratio_se": se,
            "paired": float(np.mean(paired)) if paired else None,
            "paired_se": (
                float(np.std(paired, ddof=1)) / math.sqrt(len(paired)) if len(paired) > 1 else None
            ),
            "pairs": len(paired),
            "verdict": verdict if shaped else "not shaped at initialisation",
        }
    return out


def diverged_runs(ablation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every variant's run (seed 0) whose longest horizon diverged: its lr, the step at which
    the loss or gradient stopped being finite, and the largest attention logit over blocks and
    heads (the monitor's ``max_logit``) at initialisation and at the last log before it."""
    out = []
    order = list(VARIANTS)
    for r in sorted(
        (r for r in ablation if r["model_name"] in VARIANTS and r["seed"] == 0),
        key=lambda r: (order.index(r["model_name"]), r["lr"]),
    ):
        record = r["horizons"][str(max(int(h) for h in r["horizons"]))]
        if not record["diverged"]:
            continue
        curve = record.get("max_logit", {}).get("curve", {"step": [], "value": []})
        logged = len(curve["step"]) > 1
        out.append(
            {
                "model": r["model_name"],
                "lr": r["lr"],
                "step": record.get("diverged_step"),
                "logit_init": curve["value"][0] if curve["value"] else None,
                "logit_last": curve["value"][-1] if logged else None,
                "logit_last_step": curve["step"][-1] if logged else None,
            }
        )
    return out


def shape_moves(ablation: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """How the trainable shape moved (the trainer's ``mlp_kappa`` and ``shape_gain``, kept in
    each horizon's result): per variant, at its best lr of each horizon (seed 0), the mean
    over blocks of kappa at initialisation and at the end, and each gain's mean over blocks at
    the end; only runs whose log has them."""
    out: dict[str, Any] = {}
    for m, rows in summary["models"].items():
        if m not in VARIANTS:
            continue
        for h, row in rows.items():
            run = next(
                (
                    r
                    for r in ablation
                    if r["model_name"] == m and r["seed"] == 0 and r["lr"] == row["best_lr"]
                ),
                None,
            )
            record = run["horizons"].get(h, {}) if run else {}
            if "mlp_kappa" not in record:
                continue
            kappa = np.asarray(record["mlp_kappa"]["value"], dtype=float)
            config = run["model_config"]  # kappa at initialisation: the configured slopes
            width = config["config.width"]
            slopes = (
                shaped_relu_slope(config[f"config.{c}"], width) for c in ("c_plus", "c_minus")
            )
            entry: dict[str, Any] = {
                "kappa_init": kernel_nonlinearity(*slopes),
                "kappa_final": float(np.nanmean(kappa[-1])),
            }
            if "shape_gain" in record:
                gains = np.asarray(record["shape_gain"]["value"], dtype=float)[-1]
                names = record["shape_gain"]["gain"]
                entry["gains_final"] = {
                    g: float(np.nanmean(gains[:, i])) for i, g in enumerate(names)
                }
            out.setdefault(m, {})[h] = entry
    return out


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _label(m: str) -> str:
    return VARIANTS.get(m, "(a) shaped ReLU" if m == SHAPED else m)


def _refined(refined: list[list[Any]]) -> str:
    """The grids with half steps, as the report's first paragraph names them."""
    if not refined:
        return ""
    named = ", ".join(f"{_label(m)} at depth {d}" for m, d in refined)
    return (
        "; half steps, x 3^(1/2), on each side of the best lr at the longest horizon where "
        f"a goal margin asked for them: {named}"
    )


def _absent_baselines(at: dict[str, Any]) -> list[str]:
    """Which baselines no horizon of one depth has yet, and which horizons each present one
    lacks."""
    lines = []
    for b in BASELINES:
        rows = at["models"].get(b, {})
        missing = [str(h) for h in at["horizons"] if rows.get(str(h), {}).get("mean") is None]
        if len(missing) == len(at["horizons"]):
            lines.append(f"{b} has no finished run at this recipe yet: not among the baselines.")
        elif missing:
            lines.append(f"{b} has no finished run at {', '.join(missing)} steps yet.")
    return lines


def _cooldown_fractions(fractions: dict[str, float]) -> list[str]:
    """The report's sentence on the WSD cooldowns: the share most models ran, and the others."""
    shares = sorted(set(fractions.values()), key=list(fractions.values()).count, reverse=True)
    if len(shares) < 2:
        return [f"Every run's WSD cooldown is the last {shares[0]:.0%} of its horizon."]
    others = "; ".join(
        f"the last {share:.0%} for "
        + "; ".join(_label(m) for m, f in fractions.items() if f == share)
        for share in shares[1:]
    )
    return [f"Every run's WSD cooldown is the last {shares[0]:.0%} of its horizon, but {others}."]


def _repeated(diff: float | None) -> list[str]:
    if diff is None:
        return []
    same = "the same losses" if diff == 0 else f"losses within {diff:.2g}"
    return [
        "The screen's runs that went on to 5,000 steps were trained again from scratch; their",
        f"shorter horizons (the same WSD branches) gave {same}.",
    ]


def markdown(summary: dict[str, Any]) -> str:
    """The report (``results.md``), every number from ``summary``."""
    depths = ("Depths " if len(summary["depths"]) > 1 else "Depth ") + ", ".join(summary["depths"])
    lines = [
        "# Ablation: what costs the shaped model its long-horizon gap",
        "",
        "*Generated by `examples/ablation/report.py` from `runs.jsonl`, `long/runs.jsonl` and",
        "the long-horizon study's runs; do not edit.*",
        "",
        f"{depths}, width {', '.join(map(str, summary['widths']))}, seed 0 for the lr grid"
        f" (3x spacing{_refined(summary['refined'])}); validation",
        "loss (nats per byte) at each horizon's own WSD cooldown, at its best lr. The shaped",
        "model is changed in one part at a time, at `advise`'s gamma and tau0 for the depth;",
        f"(j)-{_LAST}, questions the 5,000-step stage raised, ran at depth 16 without a screen.",
        *_cooldown_fractions(summary["cooldown_fractions"]),
        f"Ablation runs so far: {summary['runs']}.",
        *_repeated(summary["repeated_max_diff"]),
        "",
        "How to read the tables. Loss: ± is the sd over seeds at the best lr where several ran;",
        "† marks a best lr at an edge of the grid run so far (no worse lr measured on one side):",
        "not yet tuned. Ratios: to GPT-2's pre-LN and to the best baseline measured at that",
        "depth and horizon (the lowest of " + "; ".join(BASELINES) + " present), and the",
        "difference from (a) in nats (negative: the change helps). Shape: the MLP's kernel",
        "nonlinearity kappa = (s+ - s-)^2 / (2 (s+^2 + s-^2)) (0: linear, 1/2: a plain ReLU;",
        "docs/theory.md#kernel-map), mean over blocks, at initialisation and at the end of",
        "training, and each trainable gain's mean over blocks at the end, at the best lr (runs",
        "whose log records them). Diverged runs: seed 0 runs whose loss or gradient stopped",
        "being finite, with the largest attention logit over blocks and heads",
        "(docs/guide/monitor.md) at initialisation and at the last log before the step.",
    ]
    for depth, at in summary["depths"].items():
        lines += ["", f"## Depth {depth} (gamma {at['gamma']:g}, tau0 {at['tau0']:g})", ""]
        lines += _depth_tables(at)
    lines += ["", "![loss against horizon](figures/loss_vs_horizon.png)", ""]
    return "\n".join(lines)


def _depth_tables(at: dict[str, Any]) -> list[str]:
    """One depth's tables: loss at the best lr, ratios, lr grids, shape, diverged runs."""
    horizons, models = at["horizons"], at["models"]
    lines = [
        "### Loss at the best lr",
        "",
        "| model | " + " | ".join(f"{h} steps" for h in horizons) + " |",
        "|---|" + "---|" * len(horizons),
    ]
    for m, rows in models.items():
        cells = []
        for h in horizons:
            r = rows.get(str(h))
            if r is None or r["mean"] is None:
                cells.append("-" if r is None else "diverged")
                continue
            sd = f" ± {r['sd']:.3f}" if r["sd"] is not None else ""
            mark = "" if r["bracketed"] else "†"
            cells.append(f"{r['mean']:.3f}{sd}{mark} (lr {r['best_lr']:.3g})")
        lines.append(f"| {_label(m)} | " + " | ".join(cells) + " |")
    absent = _absent_baselines(at)
    lines += ["", "### Against the baselines and against (a)", *(["", *absent] if absent else [])]
    lines += [
        "",
        "| model | horizon | vs GPT-2 pre-LN | vs best baseline (which, its sd) | minus (a) |",
        "|---|---|---|---|---|",
    ]
    for m, rows in models.items():
        if m != SHAPED and m not in VARIANTS:
            continue
        for h in horizons:
            r = rows.get(str(h))
            if r is None or r["mean"] is None:
                continue
            best = r.get("best_baseline")
            sd = r.get("best_baseline_sd")
            which = f"{best}, sd {_num(sd)}" if best and sd is not None else (best or "-")
            lines.append(
                f"| {_label(m)} | {h} | {_pct(r.get('vs_gpt2'))} | {_pct(r.get('vs_best'))}"
                f" ({which}) | {_num(r.get('minus_shaped'), 3)} |"
            )
    lines += _goal_table(at["goal"])
    lines += ["", "### Learning-rate grids (seed 0)", ""]
    lines += ["| model | horizon | lr: loss |", "|---|---|---|"]
    for m, rows in models.items():
        if m not in VARIANTS:
            continue
        for h in horizons:
            r = rows.get(str(h))
            if r is None:
                continue
            grid = ", ".join(
                f"{lr:.3g}: {_num(v)}" if v is not None else f"{lr:.3g}: diverged"
                for lr, v in zip(r["lr"], r["loss"], strict=True)
            )
            lines.append(f"| {_label(m)} | {h} | {grid} |")
    lines += ["", "### How the shape moved", ""]
    if not at["shape"]:
        lines.append("No run at this depth recorded its shape yet.")
    else:
        lines += [
            "| model | horizon | kappa, init -> end | gains at the end |",
            "|---|---|---|---|",
        ]
        for m, rows in at["shape"].items():
            for h, e in rows.items():
                gains = ", ".join(f"{g} {v:.3f}" for g, v in e.get("gains_final", {}).items())
                lines.append(
                    f"| {_label(m)} | {h} | {e['kappa_init']:.4f} -> {e['kappa_final']:.4f} "
                    f"| {gains or '-'} |"
                )
    lines += ["", f"### Before and after the cooldown ({max(horizons)} steps, seed 0)", ""]
    if not at["cooldown"]:
        lines.append("No run logged its validation loss at the cooldown's first step.")
    else:
        lines += [
            "| model | lr | loss at the cooldown's start (step) | after it | the cooldown's gain "
            "| vs the best baseline with that cooldown: before, after |",
            "|---|---|---|---|---|---|",
        ]
    for m, e in at["cooldown"].items():
        lines.append(
            f"| {_label(m)} | {e['lr']:.3g} | {e['before']:.3f} ({e['step']}) | {e['after']:.3f}"
            f" | {e['after'] - e['before']:+.3f} | {_pct(e.get('vs_best_before'))}, "
            f"{_pct(e.get('vs_best_after'))} |"
        )
    lines += ["", "### Diverged runs", ""]
    if not at["diverged"]:
        lines.append("None.")
    else:
        lines += [
            "| model | lr | step | largest logit: init -> last log (step) |",
            "|---|---|---|---|",
        ]
        for d in at["diverged"]:
            last = (
                "-"
                if d["logit_last"] is None
                else f"{d['logit_init']:.3g} -> {d['logit_last']:.3g} ({d['logit_last_step']})"
            )
            lines.append(f"| {_label(d['model'])} | {d['lr']:.3g} | {d['step']} | {last} |")
    return lines


def _goal_table(goal: dict[str, Any]) -> list[str]:
    """The goal's table (:func:`goal`)."""
    if not goal:
        return []
    horizon = next(iter(goal.values()))["horizon"]
    lines = [
        "",
        f"### The goal: within {GOAL_MARGIN:.0%} of the best baseline at {horizon} steps, "
        f"{GOAL_SEEDS} seeds each",
        "",
        "SDE at init: the covariance SDE describes the model at initialisation (`sde` accepts",
        "its configuration). Ratio: its mean loss over its seeds at its best lr against the best",
        "baseline's, ± the standard error from both seed spreads (where both ran two or more);",
        "paired: seed by seed over the seeds both ran (the same data order), ± its standard",
        f"error. Met: {GOAL_SEEDS} seeds each and the ratio at most +{GOAL_MARGIN:.0%}; open: "
        "fewer seeds;",
        "the goal asks for a model the SDE describes at initialisation.",
        "",
        "| model | SDE at init | seeds | vs best baseline (which, seeds) | paired (pairs) | goal |",
        "|---|---|---|---|---|---|",
    ]
    for m, g in goal.items():
        se = f" ± {100 * g['ratio_se']:.1f}%" if g["ratio_se"] is not None else ""
        paired = "-"
        if g["paired"] is not None:
            pse = f" ± {100 * g['paired_se']:.1f}%" if g["paired_se"] is not None else ""
            paired = f"{_pct(g['paired'])}{pse} ({g['pairs']})"
        lines.append(
            f"| {_label(m)} | {'yes' if g['sde_at_init'] else 'no'} | {g['seeds']} | "
            f"{_pct(g['ratio'])}{se} ({g['baseline']}, {g['baseline_seeds']}) | {paired} | "
            f"{g['verdict']} |"
        )
    return lines


def figure(summary: dict[str, Any], path: Path) -> Path:
    """Best loss against horizon, one panel per depth, one line (one colour) per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = summary["depths"]
    palette = (*plt.get_cmap("tab20").colors, *plt.get_cmap("tab20b").colors)
    colours = dict(zip((*SHOWN, *VARIANTS), palette, strict=False))
    fig, axes = plt.subplots(1, len(depths), figsize=(7 * len(depths), 4.5), squeeze=False)
    for ax, (depth, at) in zip(axes[0], depths.items(), strict=True):
        for m, rows in at["models"].items():
            pts = [(int(h), r["mean"]) for h, r in rows.items() if r["mean"] is not None]
            if pts:
                x, y = zip(*sorted(pts), strict=True)
                style = "--" if m in SHOWN else "-"
                ax.plot(x, y, style, marker="o", color=colours[m], label=_label(m))
        ax.set_xscale("log")
        ax.set_xlabel("training horizon (steps)")
        ax.set_ylabel("validation loss at the best lr (nats/byte)")
        ax.set_title(f"Ablation of the shaped model, depth {depth}, width {at['width']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


CHECKS = HERE.parents[1] / "simulations" / "data" / "trained_checks.json"
"""Package data for ``shapedtx advise`` (``simulations.advise.trained_checks``): what training
found for the advised models, generated here (the library reads no study file)."""
CHECKED = {SHAPED: "shaped", "shaped advise, slopes+attn+tau": "shaped_free"}
"""The models whose training ``advise`` quotes: study model -> preset."""


def trained_checks(summary: dict[str, Any]) -> list[dict]:
    """At each depth's longest horizon, for the shaped model and ``shaped_free`` at advise's
    gamma and tau0: the best lr found (and whether a worse lr brackets it), the seeds, the
    loss and its ratio to GPT-2's pre-LN and to the best baseline."""
    checks = []
    for depth, at in summary["depths"].items():
        h = str(max(at["horizons"]))
        for model, name in CHECKED.items():
            row = at["models"].get(model, {}).get(h)
            if row is None or row["mean"] is None:
                continue
            best = row.get("best_baseline")
            checks.append(
                {
                    "preset": name,
                    "gamma": at["gamma"],
                    "tau0": at["tau0"],
                    "width": at["width"],
                    "depth": int(depth),
                    "horizon": int(h),
                    "lr": row["best_lr"],
                    "lr_bracketed": row["bracketed"],
                    "seeds": row["seeds"],
                    "loss": row["mean"],
                    "gpt2_pre_ln_loss": at["models"][GPT2][h]["mean"],
                    "vs_gpt2_pre_ln": row.get("vs_gpt2"),
                    "best_baseline": best,
                    "best_baseline_loss": at["models"][best][h]["mean"] if best else None,
                    "vs_best_baseline": row.get("vs_best"),
                    "report": "examples/ablation/results.md",
                }
            )
    return checks


def load() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ablation's runs (every stage's store, after taking in finished run folders) and the
    long-horizon study's."""
    ablation = [r for folder in STAGES for r in RunStore(folder / STORE).finished()]
    return ablation, RunStore(LONG_HORIZON / STORE).results()


def report(folder: Path = HERE) -> dict[str, Any]:
    """Write ``results.json``, ``results.md`` and ``figures/`` into ``folder``."""
    ablation, long_horizon = load()
    summary = summarise(ablation, long_horizon)
    write_json(summary, folder / "results.json", indent=1)
    write_json(trained_checks(summary), CHECKS, indent=1)
    with atomic_path(folder / "results.md") as tmp:
        Path(tmp).write_text(markdown(summary))
    figure(summary, folder / "figures" / "loss_vs_horizon.png")
    return summary


if __name__ == "__main__":
    report()
    print(json.dumps({"written": str(HERE / "results.md")}))
    sys.exit(0)
