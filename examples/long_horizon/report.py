"""The long-horizon study's report: ``results.json``, ``tables.md`` and figures from the
finished runs (``study.py --report``)."""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from study import (
    BASELINES,
    DEFAULT,
    GPU,
    HERE,
    MODELS,
    Setup,
    available_models,
    best_k,
    check_point,
)

from shapedtx.files import atomic_path, write_json
from simulations.studies import STORE, RunStore
from simulations.training_runs import horizon_loss, one_corpus

REPORTS: dict[str, Setup] = {
    ".": DEFAULT,
    "gpu_h2000": replace(
        GPU,
        horizons={16: (500, 2000)},
        models=("shaped advise", "pre-LN (GPT-2)"),
        max_extensions=1,
    ),
}
"""The committed reports: folder (relative to this script's) -> the setup its runs were
planned with (``gpu_h2000``: one lent GPU session, width 256, horizons 500 and 2000)."""

REFERENCE = "pre-LN (GPT-2)"
"""The model every other is divided by in the loss-ratio table."""


def _stats(values: list[float]) -> dict[str, Any]:
    ok = [v for v in values if math.isfinite(v)]
    return {
        "values": [v if math.isfinite(v) else None for v in values],
        "mean": float(np.mean(ok)) if ok else None,
        "sd": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
        "n": len(ok),
    }


def cell(runs: list[dict[str, Any]], horizon: int) -> dict[str, Any] | None:
    """One (model, depth, horizon): the best lr of seed 0 at this horizon, the seed-0 loss of
    every lr, and mean/sd over the seeds run at the best lr."""
    wsd = [r for r in runs if r["schedule"] == "wsd"]
    k = best_k(wsd, horizon)
    grid = sorted((r for r in wsd if r["seed"] == 0), key=lambda r: r["lr"])
    if not grid:
        return None
    out: dict[str, Any] = {
        "lr_curve": {
            "lr": [r["lr"] for r in grid],
            "val_loss": [_nan_none(horizon_loss(r, horizon)) for r in grid],
        },
        "diverged": sum(r["horizons"].get(str(horizon), {}).get("diverged", False) for r in wsd),
        "runs": sum(str(horizon) in r["horizons"] for r in wsd),
        "best_lr": None,
        "at_edge": None,
    }
    if k is None:
        return out
    seeds = sorted((r for r in wsd if r["k"] == k), key=lambda r: r["seed"])
    ks = sorted(r["k"] for r in grid)
    out.update(
        best_lr=seeds[0]["lr"],
        at_edge=k in (ks[0], ks[-1]),
        seeds=[r["seed"] for r in seeds],
        **_stats([horizon_loss(r, horizon) for r in seeds]),
    )
    return out


def _nan_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


LEVEL_MARGIN = 0.01
"""Two models within this fraction of each other's loss at a horizon are level there: three
seeds of one run differ by sd 0.2-0.4% at 1000 steps (the WSD check), and the 3x lr grid
misplaces each optimum by more. Where both cells ran two or more of the same seeds, twice the
standard error of their seed-paired difference widens it."""


def _paired(ca: dict[str, Any] | None, cb: dict[str, Any] | None) -> list[tuple[float, float]]:
    """The losses of the seeds both cells ran (each at its own best lr), seed by seed: every
    comparison of two models (order, level, ratio) is made on these, so a model with three
    seeds is compared with a model with one on seed 0, the seed that chose both lrs."""
    if not ca or not cb or ca.get("mean") is None or cb.get("mean") is None:
        return []
    b = {s: y for s, y in zip(cb["seeds"], cb["values"], strict=True) if y is not None}
    return [
        (x, b[s])
        for s, x in zip(ca["seeds"], ca["values"], strict=True)
        if x is not None and s in b
    ]


def _lead(ca: dict[str, Any] | None, cb: dict[str, Any] | None) -> int | None:
    """-1: a is ahead (lower loss), +1: b is ahead, 0: level; None: no seed in common."""
    pairs = _paired(ca, cb)
    if not pairs:
        return None
    xs, ys = (np.array(v) for v in zip(*pairs, strict=True))
    diff = float(np.mean(xs - ys))
    margin = LEVEL_MARGIN * min(float(np.mean(xs)), float(np.mean(ys)))
    if len(pairs) > 1:
        margin = max(margin, 2 * float(np.std(xs - ys, ddof=1)) / math.sqrt(len(pairs)))
    return 0 if abs(diff) <= margin else int(np.sign(diff))


def crossings(per_model: dict[str, dict[str, Any]], horizons: list[int]) -> list[dict[str, Any]]:
    """Every pair of models whose order (seed-paired, at each horizon's best lr) changes
    between two horizons, ignoring the horizons where they are level (``LEVEL_MARGIN``):
    ``between`` is the last horizon of the old order and the first of the new, ``level`` the
    horizons between them; ``provisional``: a best lr at either end is at an edge of its grid
    run so far, so a better lr may move the crossing."""
    out = []
    for a, b in itertools.combinations(per_model, 2):
        ca, cb = per_model[a], per_model[b]
        leads = [
            (h, lead)
            for h in horizons
            if (lead := _lead(ca.get(str(h)), cb.get(str(h)))) is not None
        ]
        ordered = [(h, lead) for h, lead in leads if lead]
        for (h0, s0), (h1, s1) in itertools.pairwise(ordered):
            if s0 != s1:
                ends = [c.get(str(h)) or {} for c in (ca, cb) for h in (h0, h1)]
                out.append(
                    {
                        "models": [a, b],
                        "between": [h0, h1],
                        "level": [h for h, lead in leads if h0 < h < h1],
                        "ahead_after": a if s1 < 0 else b,
                        "provisional": any(e.get("at_edge") for e in ends),
                    }
                )
    return out


def level_pairs(per_model: dict[str, dict[str, Any]], horizon: int) -> list[list[str]]:
    """The pairs of models level at ``horizon`` (``LEVEL_MARGIN``)."""
    return [
        [a, b]
        for a, b in itertools.combinations(per_model, 2)
        if _lead(per_model[a].get(str(horizon)), per_model[b].get(str(horizon))) == 0
    ]


def ratios(per_model: dict[str, dict[str, Any]], horizons: list[int]) -> dict[str, dict[str, Any]]:
    """model -> horizon -> loss / reference loss over the seeds both ran (``_paired``): the
    mean and sd over those pairs, and how many there are (1: seed 0's ratio)."""
    out: dict[str, dict[str, Any]] = {}
    ref = per_model.get(REFERENCE, {})
    for model, cells in per_model.items():
        if model == REFERENCE:
            continue
        row = {}
        for h in horizons:
            if pairs := _paired(cells.get(str(h)), ref.get(str(h))):
                values = [x / y for x, y in pairs]
                row[str(h)] = {
                    "ratio": float(np.mean(values)),
                    "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                    "pairs": len(values),
                }
        out[model] = row
    return out


def best_baselines(
    per_model: dict[str, dict[str, Any]], horizons: list[int]
) -> dict[str, dict[str, Any]]:
    """horizon -> the best baseline measured there: the one of ``BASELINES`` with the lowest
    mean over its seeds at its best lr, with that mean, sd and number of seeds."""
    out = {}
    for h in horizons:
        present = [
            (c["mean"], b)
            for b in BASELINES
            if (c := per_model.get(b, {}).get(str(h))) and c.get("mean") is not None
        ]
        if present:
            c = per_model[min(present)[1]][str(h)]
            out[str(h)] = {"model": min(present)[1], "mean": c["mean"], "sd": c["sd"], "n": c["n"]}
    return out


def ratios_to_best(
    per_model: dict[str, dict[str, Any]], best: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """model -> horizon -> its mean loss (seeds at its best lr) / the best baseline's mean."""
    return {
        m: {
            h: c["mean"] / best[h]["mean"]
            for h, c in cells.items()
            if h in best and c.get("mean") is not None
        }
        for m, cells in per_model.items()
    }


STUCK_MARGIN = 0.02
"""A run within this fraction of the unigram baseline learned nothing beyond byte frequencies."""


def failures(
    runs: list[dict[str, Any]], horizon: int, unigram: float | None
) -> list[dict[str, Any]]:
    """The WSD runs that failed at ``horizon``: diverged (NaN, or above the initial loss), or
    stuck at the unigram baseline: at most ``STUCK_MARGIN`` (2%) below it, where a run that
    learned only the byte frequencies lands, up to the noise of the 16 validation batches
    (every finished depth-16 run that learned more was 27% or more below it at 250 steps)."""
    out = []
    for r in sorted(runs, key=lambda r: (r["model_name"], r["lr"], r["seed"])):
        h = r["horizons"].get(str(horizon))
        if r["schedule"] != "wsd" or h is None:
            continue
        if h["diverged"]:
            what = "diverged" + (f" at step {h['diverged_step']}" if h["diverged_step"] else "")
        elif unigram is not None and h["val_loss"] >= (1 - STUCK_MARGIN) * unigram:
            what = f"stuck at the unigram baseline ({h['val_loss']:.3f})"
        else:
            continue
        out.append({"model": r["model_name"], "lr": r["lr"], "seed": r["seed"], "what": what})
    return out


def baseline(results: list[dict[str, Any]]) -> dict[str, float] | None:
    """The unigram baseline of the runs' corpus as the runs recorded it: None when none
    recorded it, when they recorded different ones, or when a run that did not record it
    trained on a split of another size (runs from before it was recorded)."""
    recorded = [r for r in results if "unigram_baseline" in r]
    if not recorded or any(
        r["unigram_baseline"] != recorded[0]["unigram_baseline"] for r in recorded
    ):
        return None
    sizes = {r["train_bytes"] for r in recorded}
    if any(r["train_bytes"] not in sizes for r in results):
        return None
    return recorded[0]["unigram_baseline"]


def summarise(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    base = baseline(results)
    depths: dict[str, Any] = {}
    for depth in setup.depths:
        horizons = list(setup.horizons[depth])
        per_model: dict[str, dict[str, Any]] = {}
        for model in available_models(setup):
            runs = [r for r in results if (r["model_name"], r["depth"]) == (model, depth)]
            cells = {str(h): c for h in horizons if runs and (c := cell(runs, h))}
            if cells:
                per_model[model] = cells
        if not per_model:
            continue
        at_depth = [r for r in results if r["depth"] == depth]
        unigram = base["cross_entropy"] if base else None
        best = best_baselines(per_model, horizons)
        depths[str(depth)] = {
            "horizons": horizons,
            "models": per_model,
            "failures": failures(at_depth, max(horizons), unigram),
            "crossings": crossings(per_model, horizons),
            "level_at_longest": level_pairs(per_model, max(horizons)),
            "ratio_to_reference": ratios(per_model, horizons),
            "best_baseline": best,
            "ratio_to_best_baseline": ratios_to_best(per_model, best),
        }
    return {
        "setup": {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in vars(setup).items()
            if k != "horizons"
        }
        | {"horizons": {str(d): list(h) for d, h in setup.horizons.items()}},
        "unigram_baseline": base,
        "models": {m: MODELS[m] for m in available_models(setup)},
        "runs": len(results),
        "corpus_fingerprint": one_corpus(results),
        "depths": depths,
        "wsd_vs_cosine": wsd_vs_cosine(setup, results),
    }


def wsd_vs_cosine(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The check (``study.py --check``): full cosine runs against WSD runs of the same horizon
    (seeds paired by number), the difference of their means with its standard error, and
    whether seed 0's WSD run of that horizon alone equals the branch of the long run."""
    check = [r for r in results if r["schedule"] in ("cosine", "wsd-check")]
    if not check:
        return None
    # the lr the plan checks now; until one of its runs finishes, the lr checked most so far
    keys = [(r["model_name"], r["depth"], r["k"]) for r in check]
    planned = check_point(setup, results)
    key = planned if planned in keys else max(keys, key=keys.count)
    h = setup.check_horizon

    def of(schedule: str) -> list[dict[str, Any]]:
        runs = [
            r
            for r in results
            if r["schedule"] == schedule and (r["model_name"], r["depth"], r["k"]) == key
        ]
        return sorted(runs, key=lambda r: r["seed"])

    cosine, wsd, full = of("cosine"), of("wsd-check"), of("wsd")
    out: dict[str, Any] = {
        "model": key[0],
        "depth": key[1],
        "lr": next(r["lr"] for r in check if (r["model_name"], r["depth"], r["k"]) == key),
        "horizon": h,
        "cosine": _stats([horizon_loss(r, h) for r in cosine])
        | {"seeds": [r["seed"] for r in cosine]},
        "wsd": _stats([horizon_loss(r, h) for r in wsd]) | {"seeds": [r["seed"] for r in wsd]},
        "difference": None,
        "difference_se": None,
        "branch_equals_alone": None,
    }
    c, w = out["cosine"], out["wsd"]
    if c["mean"] is not None and w["mean"] is not None:
        out["difference"] = w["mean"] - c["mean"]
        if c["sd"] is not None and w["sd"] is not None:
            out["difference_se"] = math.sqrt(c["sd"] ** 2 / c["n"] + w["sd"] ** 2 / w["n"])
    alone = [r for r in wsd if r["seed"] == 0]
    branch = [r for r in full if r["seed"] == 0 and str(h) in r["horizons"]]
    if alone and branch:
        out["branch_equals_alone"] = horizon_loss(alone[0], h) == horizon_loss(branch[0], h)
    return out


def _fmt_cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "not run"
    if c.get("mean") is None:
        return f"all diverged ({c['diverged']}/{c['runs']})"
    sd = f" ± {c['sd']:.3f}" if c.get("sd") is not None else ""
    edge = "*" if c["at_edge"] else ""
    n = f"{c['n']}" + (f" of {len(c['values'])}" if len(c["values"]) > c["n"] else "")
    return f"{c['mean']:.3f}{sd} (n={n}, lr {c['best_lr']:.2g}{edge})"


def _header(columns: list[str]) -> list[str]:
    """The two header lines of a markdown table with a "model" column first."""
    return ["| model | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]


def tables(summary: dict[str, Any]) -> str:
    base = summary["unigram_baseline"]
    lines = [
        "Validation loss (nats/byte; bits/byte = nats / ln 2) at the best peak lr of each "
        "horizon (seed 0 chooses it; mean ± sd over the seeds run there, n = seeds that did "
        'not diverge, "of" the seeds run; * = the best lr is at an edge of the grid run so '
        "far). "
        + (
            f"Unigram baseline {base['cross_entropy']:.3f} nats/byte "
            f"({base['cross_entropy'] / math.log(2):.2f} bits/byte)."
            if base
            else "Unigram baseline not computed: the runs' corpus is not this machine's "
            "default corpus (another Python's standard library) or differs between runs."
        ),
        "",
    ]
    for depth, d in summary["depths"].items():
        hs = d["horizons"]
        lines += [
            f"### Depth {depth}",
            "",
            *_header([f"{h} steps" for h in hs]),
        ]
        for model, cells in d["models"].items():
            lines.append(
                f"| {model} | " + " | ".join(_fmt_cell(cells.get(str(h))) for h in hs) + " |"
            )
        lines.append("")
        if d["ratio_to_reference"]:
            lines += [
                f"Loss / {REFERENCE} loss, over the seeds both ran (mean ± sd; a value "
                "without sd is seed 0's, as is every comparison where one model has one seed):",
                "",
                *_header([str(h) for h in hs]),
            ]
            for model, row in d["ratio_to_reference"].items():
                cells = []
                for h in hs:
                    e = row.get(str(h))
                    sd = f" ± {e['sd']:.3f}" if e and e["sd"] is not None else ""
                    cells.append(f"{e['ratio']:.3f}{sd}" if e else "-")
                lines.append(f"| {model} | " + " | ".join(cells) + " |")
            lines.append("")
        failed = [f"{f['model']} lr {f['lr']:.3g} s{f['seed']}: {f['what']}" for f in d["failures"]]
        lines.append(f"Failed runs at {max(hs)} steps: {'; '.join(failed) or 'none'}.")
        lines.append("")
        margin = (
            f"within {LEVEL_MARGIN:.0%}, or 2 SE of the seed-paired difference where both ran "
            "several seeds; provisional: a best lr at a grid edge"
        )
        if d["crossings"]:
            lines.append(f"Order changes between horizons (level: {margin}):")
            for c in d["crossings"]:
                a, b = c["models"]
                level = c["level"]
                lines.append(
                    f"- {a} vs {b}: between {c['between'][0]} and {c['between'][1]} steps"
                    + (f" (level at {', '.join(map(str, level))})" if level else "")
                    + f"; ahead after: {c['ahead_after']}"
                    + ("; provisional" if c["provisional"] else "")
                )
        else:
            lines.append(f"No two models change order between the horizons run so far ({margin}).")
        level = "; ".join(f"{a} and {b}" for a, b in d["level_at_longest"])
        lines += ["", f"Level at {max(hs)} steps: {level or 'none'}."]
        lines.append("")
    check = summary["wsd_vs_cosine"]
    if check:
        diff = check["difference"]
        se = check["difference_se"]
        same = {True: "equals", False: "DIFFERS FROM", None: "not compared with"}
        lines += [
            "",
            f"WSD vs a full cosine run ({check['model']}, depth {check['depth']}, lr "
            f"{check['lr']:.3g}, {check['horizon']} steps): cosine "
            f"{_fmt_stats(check['cosine'])}, WSD {_fmt_stats(check['wsd'])}"
            + ("." if diff is None else f"; WSD - cosine {diff:+.4f}")
            + ("" if se is None else f" (SE {se:.4f}).")
            + f" Seed 0's WSD run of {check['horizon']} steps alone "
            f"{same[check['branch_equals_alone']]} the branch of its long run.",
        ]
    return "\n".join(lines) + "\n"


def _fmt_stats(s: dict[str, Any]) -> str:
    if s["mean"] is None:
        return "none finished"
    sd = f" ± {s['sd']:.3f}" if s["sd"] is not None else ""
    return f"{s['mean']:.3f}{sd} (n={s['n']})"


def figures(summary: dict[str, Any], results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Loss vs horizon per depth (log x, seed bands), and the per-layer mean rho and centred
    stable rank after training at the longest horizon (seed 0, best lr)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    depths = list(summary["depths"])
    if not depths:
        return []
    models = list(summary["models"])
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    paths = []
    fig = Figure(figsize=(5.5 * len(depths), 4.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(depths), squeeze=False)[0])
    for ax, depth in zip(axes, depths, strict=True):
        d = summary["depths"][depth]
        for model, cells in d["models"].items():
            hs = [h for h in d["horizons"] if cells.get(str(h), {}).get("mean") is not None]
            if not hs:
                continue
            means = [cells[str(h)]["mean"] for h in hs]
            ax.plot(hs, means, "o-", color=colours[model], label=model, ms=4)
            lo = [min(v for v in cells[str(h)]["values"] if v is not None) for h in hs]
            hi = [max(v for v in cells[str(h)]["values"] if v is not None) for h in hs]
            if any(cells[str(h)]["n"] > 1 for h in hs):
                ax.fill_between(hs, lo, hi, color=colours[model], alpha=0.2, lw=0)
        if summary["unigram_baseline"]:
            ax.axhline(
                summary["unigram_baseline"]["cross_entropy"],
                color="grey",
                ls=":",
                lw=1,
                label="unigram",
            )
        ax.set_xscale("log")
        ax.set_xticks(d["horizons"], [str(h) for h in d["horizons"]])
        ax.minorticks_off()
        ax.set_xlabel("training horizon (steps; each its own schedule)")
        ax.set_ylabel("validation loss (nats/byte)")
        runs = max(len(c["lr_curve"]["lr"]) for cells in d["models"].values()
                   for c in cells.values())  # fmt: skip
        ax.set_title(
            f"width {summary['setup']['width']}, depth {depth}: best of up to {runs} lr(s) run "
            "per model so far\n"
            "(band: min-max over seeds where run)",
            fontsize=9,
        )
        ax.legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_vs_horizon.png"))

    fig = Figure(figsize=(5.0 * len(depths), 6.4), layout="constrained")
    axes2 = fig.subplots(2, len(depths), squeeze=False)
    for j, depth in enumerate(depths):
        d = summary["depths"][depth]
        longest = str(max(d["horizons"]))
        for model, cells in d["models"].items():
            c = cells.get(longest)
            run = next(
                (
                    r
                    for r in results
                    if c
                    and c.get("best_lr") is not None
                    and (r["model_name"], r["depth"], r["lr"], r["seed"], r["schedule"])
                    == (model, int(depth), c["best_lr"], 0, "wsd")
                ),
                None,
            )
            if run is None:
                continue
            h = run["horizons"][longest]
            for i, name in enumerate(("mean_rho", "centred_stable_rank")):
                y = [np.nan if v is None else v for v in h[name]["final"]]
                axes2[i, j].plot(range(len(y)), y, color=colours[model], label=model)
                y0 = [np.nan if v is None else v for v in h[name]["init"]]
                axes2[i, j].plot(range(len(y0)), y0, color=colours[model], ls=":", lw=1)
        axes2[0, j].set_title(
            f"width {summary['setup']['width']}, depth {depth}, after {longest} steps "
            "(dotted: at init)"
        )
        axes2[0, j].set_ylabel("mean token correlation")
        axes2[1, j].set_ylabel("centred stable rank")
        axes2[1, j].set_xlabel("layer (0 = embeddings)")
        axes2[0, j].legend(fontsize=7)
    paths.append(_save(fig, folder / "covariance_by_layer.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path


def _lr(x: float) -> str:
    """A learning rate as the report writes it: ``3.3e-3``, ``1e-2``."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _setup_section(
    setup: Setup, summary: dict[str, Any], results: list[dict[str, Any]]
) -> list[str]:
    """The settings every run shares, read from the setup and the runs' recorded configs."""
    wsd = [r for r in results if r["schedule"] == "wsd"]
    train = wsd[0]["train_config"] if wsd else {}
    model = wsd[0]["model_config"] if wsd else {}
    lines = ["## Setup", ""]
    if sizes := sorted({r["train_bytes"] for r in results}):
        split = _and([f"{b:,}" for b in sizes])
        lines.append(
            f"- **Data.** A training split of {split} bytes (`train_bytes`), read as bytes."
        )
    if model:
        lines.append(
            f"- **Model.** Width {model['config.width']}, {model['config.heads']} heads"
            + (" with W^O" if model["config.out_proj"] else "")
            + f", MLP hidden width {model['config.mlp_ratio']}n, context {setup.seq_len}, causal."
        )
    if train:
        lines.append(
            f"- **Optimiser.** Batch {setup.batch_size}, AdamW (betas {train['train.beta1']}, "
            f"{train['train.beta2']}; weight decay {train['train.weight_decay']}), gradient "
            f"clipping at {train['train.grad_clip']}."
        )
    lines.append(
        f"- **Schedule.** Warmup-stable-decay: {setup.warmup_steps} warm-up steps, a constant "
        f"learning rate, then a linear cooldown to 0 over the last {setup.cooldown_fraction:.0%} "
        "of each horizon; each shorter horizon is a cooldown branched from the longest run."
    )
    for depth in summary["depths"]:
        hs = setup.horizons[int(depth)]
        runs = [r for r in wsd if r["depth"] == int(depth)]
        epochs = max((r["epochs_at_longest"] for r in runs), default=None)
        lines.append(
            f"- **Depth {depth}.** Horizons {_and([str(h) for h in hs])} steps"
            + (f"; the longest is {epochs:.2f} epochs of the training split." if epochs else ".")
        )
    lines.append(
        f"- **Evaluation.** Validation loss on {setup.eval_batches} fixed batches of "
        f"{setup.batch_size} windows ({setup.eval_batches * setup.batch_size * setup.seq_len:,} "
        "predicted bytes), in nats per byte (bits per byte = nats / ln 2)."
    )
    if base := summary["unigram_baseline"]:
        ce = base["cross_entropy"]
        lines.append(
            f"- **Unigram baseline.** {ce:.3f} nats/byte ({ce / math.log(2):.2f} bits/byte); "
            f"a run within {STUCK_MARGIN:.0%} of it learned only the byte frequencies."
        )
    lines += ["", "| model | preset and settings | " + " | ".join(
        f"gamma, tau0 at depth {d}" for d in summary["depths"]) + " |",
        "|---|---|" + "---|" * len(summary["depths"])]  # fmt: skip
    for m, fields in summary["models"].items():
        spec = "".join(
            f", {k} {v:.3g}" if isinstance(v, float) else f", {k} {v}"
            for k, v in fields.items()
            if k != "name"
        )
        cells = []
        for depth in summary["depths"]:
            run = next((r for r in wsd if (r["model_name"], r["depth"]) == (m, int(depth))), None)
            c = run["model_config"] if run else None
            cells.append(
                f"{c['config.gamma']:.3g}, {c['config.tau0']:.3g}"
                if c and c["config.attention"] == "shaped" else "-"
            )  # fmt: skip
        lines.append(f"| {m} | `{fields['name']}`{spec} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _grid_cell(h: dict[str, Any] | None, best: bool, stuck: float | None) -> str:
    if h is None:
        return "-"
    if h["diverged"]:
        step = h.get("diverged_step")
        return "diverged" + (f" at step {step}" if step else "")
    text = f"**{h['val_loss']:.3f}**" if best else f"{h['val_loss']:.3f}"
    return text + (" (unigram level)" if stuck is not None and h["val_loss"] >= stuck else "")


def grid_table(results: list[dict[str, Any]], models: list[str], horizons: list[int],
               unigram: float | None) -> list[str]:  # fmt: skip
    """Seed 0's loss at every lr run and every horizon; bold: the model's best lr at that
    horizon (models with one lr: none); a diverged run's later horizons are left empty."""
    stuck = None if unigram is None else (1 - STUCK_MARGIN) * unigram
    lines = _header(["lr", *[f"{h} steps" for h in horizons]])
    for m in models:
        mine = [r for r in results if r["model_name"] == m and r["schedule"] == "wsd"]
        runs = sorted((r for r in mine if r["seed"] == 0), key=lambda r: r["lr"])
        best = {h: best_k(runs, h) if len(runs) > 1 else None for h in horizons}
        for i, r in enumerate(runs):
            cells, gone = [], False
            for h in horizons:
                e = r["horizons"].get(str(h))
                cells.append("" if gone else _grid_cell(e, best[h] == r["k"], stuck))
                gone = gone or bool(e and e["diverged"] and e.get("diverged_step"))
            lines.append(f"| {m if i == 0 else ''} | {_lr(r['lr'])} | " + " | ".join(cells) + " |")
    return lines


def _best_lrs(cells: dict[str, Any], horizons: list[int]) -> str:
    """Which lr is best at which horizons, in order: ``3.3e-3 at 250 and 500 steps``."""
    runs: list[tuple[float | None, list[int]]] = []
    for h in horizons:
        lr = (cells.get(str(h)) or {}).get("best_lr")
        if runs and runs[-1][0] == lr:
            runs[-1][1].append(h)
        else:
            runs.append((lr, [h]))
    parts = []
    for lr, hs in runs:
        edge = any((cells.get(str(h)) or {}).get("at_edge") for h in hs)
        what = (
            "none (every lr diverged)" if lr is None else _lr(lr) + (" (grid edge)" if edge else "")
        )
        parts.append(f"{what} at {_and([str(h) for h in hs])} steps")
    return "; ".join(parts)


def _findings(summary: dict[str, Any], depth: str) -> list[str]:
    """The computed statements of one depth: best lrs, the ranking at the longest horizon,
    the seeded means, the ratios to the reference, order changes, level pairs, failures."""
    d = summary["depths"][depth]
    hs, longest = d["horizons"], str(max(d["horizons"]))
    lines = []
    tuned = [
        m
        for m, cells in d["models"].items()
        if all(c.get("best_lr") is not None and not c["at_edge"] for c in cells.values())
    ]
    lines.append(
        "- **Best lr (seed 0)**: "
        + "; ".join(f"{m}: {_best_lrs(cells, hs)}" for m, cells in d["models"].items())
        + f". Tuned (best lr inside the grid at every horizon): {_and(tuned) if tuned else 'none'}."
    )
    ranked = sorted(
        (min(v for v in c["lr_curve"]["val_loss"] if v is not None), m)
        for m, cells in d["models"].items()
        if (c := cells.get(longest)) and any(v is not None for v in c["lr_curve"]["val_loss"])
    )
    lines.append(
        f"- **Lowest at {longest} steps** (seed 0, each model at its best lr): "
        + ", ".join(f"{m} {loss:.3f}" for loss, m in ranked)
        + "."
    )
    seeded = [
        f"{m} {_fmt_stats(c)} at {_lr(c['best_lr'])}"
        for m, cells in d["models"].items()
        if (c := cells.get(longest)) and len(c.get("values", [])) > 1
    ]
    if seeded:
        lines.append(
            f"- **Seeds at {longest} steps** (mean ± sd at the best lr): {'; '.join(seeded)}."
        )
    paired = []
    for m, row in d["ratio_to_reference"].items():
        for h in hs:
            e = row.get(str(h))
            if e and e["pairs"] > 1:
                paired.append(
                    f"{m} at {h} steps {e['ratio']:.3f} ± {e['sd']:.3f} ({e['pairs']} seeds)"
                )
    if paired:
        lines.append(f"- **Loss / {REFERENCE} loss over paired seeds**: {'; '.join(paired)}.")
    best = d["best_baseline"]
    if best:
        lines.append(
            f"- **Best baseline** (the lowest of {_and(list(BASELINES))} measured, mean over "
            "its seeds at its best lr): "
            + "; ".join(
                f"{h} steps {b['model']} {b['mean']:.3f}"
                + (f" ± {b['sd']:.3f} ({b['n']} seeds)" if b["sd"] is not None else "")
                for h, b in best.items()
            )
            + f". Loss / best baseline at {longest} steps: "
            + ", ".join(
                f"{m} {row[longest]:.3f}"
                for m, row in d["ratio_to_best_baseline"].items()
                if longest in row
            )
            + "."
        )
    for c in d["crossings"]:
        a, b = c["models"]
        level = f", level at {_and([str(h) for h in c['level']])}" if c["level"] else ""
        lines.append(
            f"- **Order change**: {a} vs {b} between {c['between'][0]} and {c['between'][1]} "
            f"steps{level}; {c['ahead_after']} ahead after"
            + (" (provisional: a best lr at a grid edge)." if c["provisional"] else ".")
        )
    level = "; ".join(f"{a} and {b}" for a, b in d["level_at_longest"])
    lines.append(f"- **Level at {longest} steps**: {level or 'none'}.")
    failed = [f"{f['model']} lr {_lr(f['lr'])} s{f['seed']}: {f['what']}" for f in d["failures"]]
    lines.append(f"- **Failed runs at {longest} steps**: {'; '.join(failed) or 'none'}.")
    return lines


def _depth_section(summary: dict[str, Any]) -> list[str]:
    """Each model's seeded mean at the depths' common longest horizon, depth against depth."""
    depths = list(summary["depths"])
    if len(depths) < 2:
        return []
    common = set.intersection(*(set(summary["depths"][d]["horizons"]) for d in depths))
    if not common:
        return []
    h = str(max(common))
    rows = []
    for m in summary["models"]:
        cells = [summary["depths"][d]["models"].get(m, {}).get(h) for d in depths]
        if all(c and c.get("mean") is not None for c in cells):
            rows.append(f"| {m} | " + " | ".join(_fmt_cell(c) for c in cells) + " |")
    if not rows:
        return []
    return [f"## Depth against depth at {h} steps", "", *_header([f"depth {d}" for d in depths]),
            *rows, ""]  # fmt: skip


FIXED_NOTES = """\
## Method notes (fixed text, not computed from the runs)

- Each shorter horizon is a cooldown branched from a snapshot of the longest run at that
  horizon's cooldown start, bitwise the run trained to that horizon from the start
  (`tests/test_train_schedule.py`); the WSD-vs-cosine check above measures it on the runs.
- Seed 0 chooses each model's best lr; the seeds run at that lr give the mean ± sd. Two
  models are compared on the seeds both ran (one seed against three: seed 0 against seed 0).
- Signal propagation during training (attention entropy, outlier features) is measured by
  `monitor.py` from the runs' logs, which stay on the machine that trained them; its output
  is [monitor.md](monitor.md) and `figures/monitor_d*.png`.
- The pre-LN reference is GPT-2's pre-LN block with GPT-2's init and one lr for every
  parameter. pre-LN depth-muP is the transfer study's recipe
  ([../transfer/results.md](../transfer/results.md)): branch multiplier (depth / 8)^(-1/2),
  1/fan_in init, its base lr tuned at width 64 and depth 8 and transferred by its rule.
"""


def results_md(setup: Setup, summary: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The study's written report, every number computed from the runs (``results.md``)."""
    from study import plan  # type: ignore[import-not-found]  # beside this script

    todo = len(plan(setup, results))
    depths = list(summary["depths"])
    unigram = summary["unigram_baseline"]["cross_entropy"] if summary["unigram_baseline"] else None
    lines = [
        f"# Results: training claims at long horizons (width {setup.width}, "
        + ("depths " if len(depths) > 1 else "depth ")
        + f"{_and(depths)})",
        "",
        f"Generated by `report.py` from `runs.jsonl` ({len(results)} finished runs; "
        + (f"{todo} more planned now" if todo else "none planned: the study is complete")
        + "). Do not edit: change `report.py` and run `python examples/long_horizon/report.py`. "
        "The tables of means over seeds are in [tables.md](tables.md), the numbers in "
        "[results.json](results.json).",
        "",
        *_setup_section(setup, summary, results),
    ]
    for depth in depths:
        d = summary["depths"][depth]
        at_depth = [r for r in results if r["depth"] == int(depth)]
        lines += [
            f"## Depth {depth}",
            "",
            "Seed 0's validation loss (nats/byte) at every lr run; bold: the model's best lr "
            "at that horizon.",
            "",
            *grid_table(at_depth, list(d["models"]), d["horizons"], unigram),
            "",
            *_findings(summary, depth),
            "",
        ]
    lines += _depth_section(summary)
    if check := summary["wsd_vs_cosine"]:
        diff, se = check["difference"], check["difference_se"]
        verdict = ""
        if diff is not None and se is not None:
            within = abs(diff) <= 2 * se
            verdict = f" The difference is {'within' if within else 'beyond'} two standard errors."
        same = {True: "equals", False: "differs from", None: "was not compared with"}
        lines += [
            f"## WSD against a full cosine schedule ({check['horizon']} steps)",
            "",
            f"{check['model']}, depth {check['depth']}, lr {_lr(check['lr'])}: cosine "
            f"{_fmt_stats(check['cosine'])}, WSD {_fmt_stats(check['wsd'])}"
            + ("" if diff is None else f"; WSD - cosine {diff:+.4f}")
            + ("" if se is None else f" (SE {se:.4f})")
            + f".{verdict} Seed 0's WSD run of {check['horizon']} steps alone "
            f"{same[check['branch_equals_alone']]} the branch of its long run.",
            "",
        ]
    lines += [
        "## Figures",
        "",
        "![loss vs horizon](figures/loss_vs_horizon.png)",
        "",
        "![covariance by layer](figures/covariance_by_layer.png)",
        "",
        FIXED_NOTES,
    ]
    return "\n".join(lines)


def report(setup: Setup, out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write ``results.md``, ``results.json``, ``tables.md`` and ``figures/`` from the
    finished runs."""
    summary = summarise(setup, results)
    write_json(summary, out / "results.json", indent=1)
    with atomic_path(out / "tables.md") as tmp:
        tmp.write_text(tables(summary))
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text(results_md(setup, summary, results))
    figures(summary, results, out / "figures")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Rebuild the committed reports (``REPORTS``) from their ``runs.jsonl``."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("folders", nargs="*", default=list(REPORTS), help="default: all of them")
    args = p.parse_args(argv)
    for folder in args.folders:
        if folder not in REPORTS:
            p.error(f"no committed report {folder!r}; choose from {', '.join(REPORTS)}")
        out = HERE / folder
        report(REPORTS[folder], out, RunStore(out / STORE).results())
    return 0


if __name__ == "__main__":
    sys.exit(main())
