"""The advise study's report: each prediction study's ``results.json`` and
``score_vs_loss.png`` from its ``runs.jsonl`` and ``scores.jsonl``, and ``results.md`` (every
part, with the finite-network check of ``finite_network.json``) from those; ``predict.py
--report`` or ``python examples/advise/report.py``. Nothing here is edited by hand."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from predict import (  # type: ignore[import-not-found]  # beside this script
    HERE,
    MEASURED,
    RANKING_SCORE,
    REJECTED,
    SCORE_STORE,
    SCORES,
    Setup,
    config_key,
    configurations,
    stored_advice,
)
from scipy.stats import rankdata, spearmanr

from shapedtx.files import atomic_path, write_json
from simulations.advise import DEFAULT_GAMMAS, DEFAULT_SPREAD_TARGET
from simulations.studies import STORE, RunStore

FINITE = "finite_network.json"


def val_loss(result: dict[str, Any], horizon: int | None = None) -> float | None:
    """A run's final validation loss at ``horizon`` (default: its only one; None if it
    diverged), from either result form (the Dask runs' per-horizon form, or the flat form of
    the runs made before it)."""
    if "horizons" not in result:
        return result["val_loss"]
    h = result["horizons"][str(horizon)] if horizon else next(iter(result["horizons"].values()))
    return None if h["diverged"] else h["val_loss"]


def bootstrap_spearman(
    x: Any, y: Any, n_boot: int = 2000, seed: int = 0
) -> tuple[float, list[float]]:
    """Spearman's r of ``x`` and ``y`` and its 95% bootstrap interval over the pairs (resamples
    where either side is constant left out). The resamples' r are computed together, exactly
    as ``scipy.stats.spearmanr`` computes each (average ranks, then ``np.corrcoef``'s
    arithmetic), so the interval is the one of a loop over ``spearmanr``."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    value = float(spearmanr(x, y).statistic)
    idx = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
    xs, ys = x[idx], y[idx]
    ok = (xs.min(axis=1) < xs.max(axis=1)) & (ys.min(axis=1) < ys.max(axis=1))
    if not ok.any():
        return value, [math.nan, math.nan]
    with np.errstate(invalid="ignore"):  # inf - inf: a resample with two diverged runs
        ranks = np.stack([rankdata(xs[ok], axis=1), rankdata(ys[ok], axis=1)], axis=1)
        ranks = ranks - ranks.mean(axis=2, keepdims=True)
        cov = (ranks @ ranks.transpose(0, 2, 1)) * np.true_divide(1, len(x) - 1)
        stats = np.clip(cov[:, 1, 0] / np.sqrt(cov[:, 1, 1]) / np.sqrt(cov[:, 0, 0]), -1, 1)
    lo, hi = np.nanpercentile(stats, [2.5, 97.5])
    return value, [float(lo), float(hi)]


def _read(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _worst(x: float | None) -> float:
    return math.inf if x is None else x


def summarise_at(
    s: Setup, results: list[dict[str, Any]], scores: dict[str, Any], horizon: int | None
) -> dict[str, Any]:
    """The report at one horizon (``None``: the runs' only one): every finished configuration
    (scored, every lr of ``s`` trained) with its best loss over the lrs, the Spearman of every
    score against that loss, and the advice check per depth."""
    runs = {(r["depth"], r["gamma"], r["tau0"], r["lr"]): r for r in results}
    table = []
    for depth, gamma, tau0, role in configurations(s, stored_advice(scores)):
        score = scores.get(f"scores/{config_key(depth, gamma, tau0)}")
        done = [runs[k] for lr in s.lrs if (k := (depth, gamma, tau0, lr)) in runs]
        if score is None or len(done) < len(s.lrs):
            continue  # unfinished
        losses = [_worst(val_loss(r, horizon)) for r in done]
        best = int(np.argmin(losses))
        table.append(
            {
                **score,
                "role": role,
                "loss": _finite(losses[best]),
                "best_lr": done[best]["lr"] if math.isfinite(losses[best]) else None,
                "losses": {f"{r['lr']:g}": val_loss(r, horizon) for r in done},
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
        loss = [_worst(t["loss"]) for t in table]
        per_score = {}
        for name in SCORES:
            value, ci = bootstrap_spearman([_worst(t[name]) for t in table], loss, seed=s.seed)
            per_score[name] = {"value": value, "ci": ci, "runs": len(table)}
        result["scores"] = per_score
        by_depth = {}
        for depth in s.depths:
            at = [i for i, t in enumerate(table) if t["depth"] == depth]
            if len(at) >= 3:
                by_depth[str(depth)] = {
                    name: float(
                        spearmanr(
                            [_worst(table[i][name]) for i in at], [loss[i] for i in at]
                        ).statistic
                    )
                    for name in SCORES
                }
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


def summarise(s: Setup, results: list[dict[str, Any]], scores: dict[str, Any]) -> dict[str, Any]:
    """``results.json``: the report at ``s.steps`` or, with ``s.horizons``, at the longest
    horizon, with every horizon's under ``"by_horizon"``."""
    if not s.horizons:
        return summarise_at(s, results, scores, None)
    by = {str(h): summarise_at(s, results, scores, h) for h in s.horizons}
    return {**by[str(max(s.horizons))], "by_horizon": by}


def figure(table: list[dict[str, Any]], path: Path) -> None:
    """Every score against the best loss (colour: depth; *: advised, x: rejected)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SCORES), figsize=(4 * len(SCORES), 3.6))
    finite = [t["loss"] for t in table if t["loss"] is not None]
    # configurations that diverged at every learning rate: drawn on a row above the losses
    top = max(finite) + 0.1 * (max(finite) - min(finite) + 1e-3) if finite else 1.0
    depths = sorted({r["depth"] for r in table})
    for ax, name in zip(axes, SCORES, strict=True):
        for t in table:
            loss = t["loss"] if t["loss"] is not None else top
            x = t[name] if t[name] is not None else np.nan
            marker = {"advised": "*", "rejected": "x"}.get(t["role"], "o")
            colour = f"C{depths.index(t['depth'])}"
            hollow = t["loss"] is None and marker != "x"
            ax.scatter(
                x,
                loss,
                marker=marker,
                s=60 if marker == "*" else 25,
                facecolors="none" if hollow else colour,
                edgecolors=None if marker == "x" else colour,
            )
        ax.axhline(top, color="gray", lw=0.5, ls=":")
        ax.set_xlabel(name + " (SDE, at init)")
        if name in ("collapse", "exploded"):
            ax.set_xscale("symlog", linthresh=1e-3)
    axes[0].set_ylabel("best final val loss")
    axes[0].annotate(
        "diverged at every lr",
        (0.02, top),
        xycoords=("axes fraction", "data"),
        va="bottom",
        fontsize="small",
        color="gray",
    )
    fig.suptitle(
        "init-time SDE scores vs trained loss (colour: depth; *: advised, x: rejected; "
        "top row: diverged)"
    )
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def report(
    s: Setup, out: Path, results: list[dict[str, Any]], scores: dict[str, Any]
) -> dict[str, Any]:
    """Write ``out/results.json`` and ``out/score_vs_loss.png``; for a measured study (a
    folder of :data:`predict.MEASURED`), ``results.md`` beside this script too."""
    result = summarise(s, results, scores)
    write_json(result, Path(out) / "results.json", indent=1)
    if result["configs"]:
        figure(result["configs"], Path(out) / "score_vs_loss.png")
    if any((HERE / name).resolve() == Path(out).resolve() for name in MEASURED):
        write_results_md(HERE)
    return result


# ---- results.md ------------------------------------------------------------------------------


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ordinal(n: int) -> str:
    words = {1: "the best", 2: "second", 3: "3rd"}
    return words.get(n, f"{n}th")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _lr(lr: float) -> str:
    """A learning rate as the commands write it (3e-3, 1e-2)."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _cfg(c: dict[str, Any]) -> str:
    return f"gamma {c['gamma']:g} / tau0 {c['tau0']:g}"


def command(name: str) -> str:
    """The command that runs the measured study ``name`` (its options beyond the defaults)."""
    s, default = MEASURED[name], Setup()
    parts = ["python examples/advise/predict.py"]
    if (HERE / name).resolve() != (HERE / ("long_horizon" if s.horizons else ".")).resolve():
        parts.append(f"--out examples/advise/{name}")
    for option in ("width", "depths", "gammas", "tau0s", "lrs", "steps", "horizons"):
        value = getattr(s, option)
        if value == getattr(default, option) or (option == "steps" and s.horizons):
            continue
        values = value if isinstance(value, tuple) else (value,)
        text = [_lr(v) if option == "lrs" else f"{v:g}" for v in values]
        parts.append(f"--{option} {' '.join(text)}")
    return " ".join(parts)


def _load(folder: Path, name: str) -> tuple[Setup, dict[str, Any], list[dict], dict[str, Any]]:
    out = folder / name
    scores = dict(RunStore(out / SCORE_STORE).records())
    return MEASURED[name], _read(out / "results.json"), RunStore(out / STORE).results(), scores


def _finite_network(data: dict[str, Any]) -> list[str]:
    sizes = data["results"]
    criteria = sizes[0]["criteria"]
    samples = sizes[0]["samples"]
    head = (
        "| (n, d, m), T | configuration | gamma | tau0 | SDE verdict (N) | network: collapse | "
        "exploded | norm q99 | rho_spread (network / SDE) | network verdict |"
    )
    rows = [head, "|---" * 10 + "|"]
    for r in sizes:
        size = f"({', '.join(str(v) for v in r['size'])}), {r['T']:g}"
        for name, c in r["configs"].items():
            sde, net = c["sde"], c["network"]
            if not c["sde_violations"]:
                verdict = f"pass ({sde['samples']})"
            else:
                kind = "rejected" if c["sde_significant_violations"] else "unresolved"
                verdict = f"{kind}: {'; '.join(c['sde_violations'])} ({sde['samples']})"
            network = (
                "pass" if c["network_passes"] else "fails: " + "; ".join(c["network_violations"])
            )
            rows.append(
                f"| {size} | {name} | {c['gamma']:g} | {c['tau0']:g} | {verdict} | "
                f"{net['collapse']:.3f} ± {net['collapse_se']:.3f} | {net['exploded']:.3f} | "
                f"{net['norm']:.3g} | {net['rho_spread']:.3f} / {sde['rho_spread']:.3f} | "
                f"{network} |"
            )
    configs = [(r, name, c) for r in sizes for name, c in r["configs"].items()]

    def at(r: dict[str, Any]) -> str:
        return f"({', '.join(str(v) for v in r['size'])})"

    advised = [(r, c) for r, name, c in configs if name == "advised"]
    rejected = [(r, c) for r, _, c in configs if c["sde_significant_violations"]]
    unresolved = [
        (r, c) for r, _, c in configs if c["sde_violations"] and not c["sde_significant_violations"]
    ]
    seconds = [
        f"{sum(c['seconds'] for c in r['configs'].values()):.0f} s at {at(r)}" for r in sizes
    ]
    lines = [
        f"For (n, d, m) = {_and([at(r) for r in sizes])} `validate.py` runs the advisor "
        f"(default grid and criteria), then samples {samples} finite networks per configuration "
        f"with the {sizes[0]['method']} sampler at the advised configuration and at "
        "configurations the advisor rejects or leaves unresolved, and measures the same "
        'criteria on the last layer\'s covariances (a network "exploded" when its covariance '
        "is non-finite or exceeds 1e8 V0 somewhere, the SDE solver's rule). Numbers: "
        f"[{FINITE}]({FINITE}).",
        "",
        *rows,
        "",
        '(SDE verdict: the advisor\'s; "unresolved" = violations at the screening that are '
        "within 2 standard errors, never confirmed because a smaller gamma was chosen first.) "
        f"Sampling time, the 4 configurations of a size together: {_and(seconds)}.",
        "",
        "What this shows:",
        "",
    ]
    passes = all(c["network_passes"] for _, c in advised)
    spreads = _and(
        [f"{c['network']['rho_spread']:.3f} vs {c['sde']['rho_spread']:.3f}" for _, c in advised]
    )
    lines.append(
        f"- At {'every size' if passes else 'not every size'} the advised configuration "
        "passes every criterion on the finite network, and the network's `rho_spread` (the "
        f"ranking score) against the SDE's is {spreads}."
    )
    failing = [c for _, c in rejected if not c["network_passes"]]
    kinds = sorted({v.split(" ")[0] for c in failing for v in c["network_violations"]})
    verdicts = [
        f"{_cfg(c)} at {at(r)} {'passes' if c['network_passes'] else 'fails'}"
        + ("" if c["network_passes"] else f" ({'; '.join(c['network_violations'])})")
        for r, c in unresolved
    ]
    lines.append(
        f"- {len(failing)} of the {len(rejected)} configurations the advisor rejects "
        f"significantly also fail on the finite network (criteria failed: {_and(kinds)}). "
        f'For the borderline "unresolved" ones: {_and(verdicts)}.'
    )
    blown = [(r, c) for r, c in rejected if c["sde"]["exploded"] >= criteria["exploded"]]
    norms = [c["network"]["norm"] for _, c in blown]
    exploded = [
        f"{round(c['network']['exploded'] * samples)} of {samples} at {_cfg(c)}, {at(r)}"
        for r, _, c in configs
        if c["network"]["exploded"] > 0
    ]
    ones = [c for _, c in rejected if c["gamma"] == 1.0]
    lines.append(
        '- Finite networks do not "explode" the way the SDE does (networks past 1e8 V0: '
        f"{_and(exploded) if exploded else 'none'}): where the SDE's paths blow up, the "
        f"networks' norm 99th percentile is {min(norms):.3g} to {max(norms):.3g} times V0, so "
        "the explosion criterion is a proxy for huge norms and collapse. "
        + (
            "For gamma 1 the networks' `rho_spread` ("
            + _and([f"{c['network']['rho_spread']:.2f}" for c in ones])
            + ") against the SDE's ("
            + _and([f"{c['sde']['rho_spread']:.2f}" for c in ones])
            + "): far from the SDE regime finite networks differ, but both are far beyond "
            "the criteria."
            if ones
            else ""
        )
    )
    se = math.sqrt(criteria["collapse"] * (1 - criteria["collapse"]) / samples)
    lines += [
        "",
        f"Monte Carlo error at {samples} networks: a fraction's SE is "
        f"`sqrt(p (1 - p) / {samples})`, {_pct(se)} at the {_pct(criteria['collapse'])} "
        f"collapse threshold; the {_pct(criteria['exploded'])} explosion threshold cannot be "
        f"resolved with {samples} networks (one exploded network is {_pct(1 / samples)}), so "
        f'for the explosion criterion the finite check only says "none of {samples}".',
    ]
    return lines


SCORE_LABELS = {
    "rho_spread": "`rho_spread` (the ranking score)",
    "gamma2T": "`gamma2T` (gamma^2 T)",
    "collapse": "`collapse` fraction",
    "exploded": "`exploded` fraction",
    "norm": "`norm` (q99 of V^aa_T / V^aa_0)",
}
SAFETY = ("collapse", "exploded", "norm")


def _ordered_scores(res: dict[str, Any]) -> list[str]:
    """The ranking score, then the others by their r, largest first."""
    rest = sorted(
        (n for n in SCORES if n != RANKING_SCORE), key=lambda n: -res["scores"][n]["value"]
    )
    return [RANKING_SCORE, *rest]


def _r_ci(x: dict[str, Any]) -> str:
    return f"{x['value']:.2f} [{x['ci'][0]:.2f}, {x['ci'][1]:.2f}]"


def _setup_text(s: Setup, res: dict[str, Any]) -> str:
    depths = _and([f"{d}" for d in s.depths])
    Ts = _and([f"{d / s.width:g}" for d in s.depths])
    per_depth = len(s.gammas) * len(s.tau0s)
    horizon = (
        f"each configuration trained once per learning rate with a warmup-stable-decay "
        f"schedule to {max(s.horizons):,} steps, every shorter horizon a linear cooldown "
        "branched from the constant phase"
        if s.horizons
        else f"{s.steps} steps"
    )
    return (
        f"Width {s.width} ({s.heads} heads with W^O, shaped ReLU MLP of width n, causal byte "
        f"LM), depth{'s' if len(s.depths) > 1 else ''} {depths} (T = {Ts}); gamma in "
        f"{{{', '.join(f'{g:g}' for g in s.gammas)}}} x tau0 in "
        f"{{{', '.join(f'{t:g}' for t in s.tau0s)}}} ({per_depth} configurations per depth) "
        "plus at every depth the advised configuration and the rejected gamma "
        f"{REJECTED[0]:g} / tau0 {REJECTED[1]:g}; {horizon}, batches of {s.batch_size} x "
        f"{s.seq_len} bytes, the learning rate tuned on {{{', '.join(_lr(lr) for lr in s.lrs)}}}, "
        f"seed {s.seed}; scores from the causal SDE (m = {s.sde_tokens}, {s.sde_samples} paths). "
        f"Finished: {len(res['configs'])} configurations."
    )


def _rank(at: dict[str, Any], role: str = "advised") -> tuple[int, float, float]:
    """(rank of the ``role`` configuration among those that trained, its loss, the best)."""
    losses = sorted(c["loss"] for c in at["configs"] if c["loss"] is not None)
    loss = next(c["loss"] for c in at["configs"] if c["role"] == role)
    return losses.index(loss) + 1, loss, losses[0]


def _best(configs: list[dict[str, Any]]) -> dict[str, Any]:
    return min((c for c in configs if c["loss"] is not None), key=lambda c: c["loss"])


def _fixed(s: Setup, res: dict[str, Any], scores: dict[str, Any]) -> list[str]:
    depths = [str(d) for d in s.depths]
    n = res["spearman"]["runs"]
    head = (
        f"| init-time score (SDE) | Spearman r with the final loss, {n} configurations "
        f"(95% bootstrap CI) | " + " | ".join(f"depth {d}" for d in depths) + " |"
    )
    rows = [head, "|---" * (2 + len(depths)) + "|"]
    for name in _ordered_scores(res):
        x = res["scores"][name]
        r = _r_ci(x) if name != RANKING_SCORE else f"**{x['value']:.2f}** {_r_ci(x)[5:]}"
        by = " | ".join(f"{res['scores_by_depth'][d][name]:.2f}" for d in depths)
        rows.append(f"| {SCORE_LABELS[name]} | {r} | {by} |")
    values = {k: v["value"] for k, v in res["scores"].items()}
    lowest = min(v["ci"][0] for v in res["scores"].values())
    predicts = lowest > 0
    rank, gamma2 = values[RANKING_SCORE], values["gamma2T"]
    versus = (
        "predict equally well"
        if abs(rank - gamma2) < 0.01
        else ("predicts better than" if rank > gamma2 else "predicts less well than")
    )
    safety = max(values[k] for k in SAFETY)
    lines = [
        f"```bash\n{command('.')}\n```",
        "",
        _setup_text(s, res),
        "",
        *rows,
        "",
        f"- The init-time scores {'**do predict**' if predicts else 'do not all predict'} "
        'the training outcome in this regime (every score is meant as "higher is worse"): '
        f"every score's 95% interval lies above {lowest:.2f}. `rho_spread` and the naive "
        f"`gamma2T` {versus} ({rank:.2f} and {gamma2:.2f})"
        + (
            "; the safety criteria alone (collapse, exploded, norm) predict less well "
            f"(at most {safety:.2f})."
            if safety < min(rank, gamma2)
            else "."
        ),
    ]
    advice = stored_advice(scores)
    per = []
    for check in res["advice_check"]:
        d = check["depth"]
        at = [c for c in res["configs"] if c["depth"] == d]
        place, loss, _ = _rank({"configs": at})
        a = advice[d]
        per.append(
            f"at depth {d} `advise({s.width}, {d}, {s.sde_tokens}, heads={s.heads}, "
            f"causal=True)` gives gamma {a['gamma']:g}, tau0 {a['tau0']:g}: "
            f"{_ordinal(place)} of {len(at)} (loss {loss:.3f}; best {check['best_loss']:.3f}; "
            f"within 2% of the best: {'yes' if check['within_2_percent'] else 'no'})"
        )
    rejected = [c for c in res["configs"] if c["role"] == "rejected"]
    all_div = all(all(v is None for v in c["losses"].values()) for c in rejected)
    lines.append(
        f"- The advice: {'; '.join(per)}. The rejected gamma {REJECTED[0]:g} / tau0 "
        f"{REJECTED[1]:g} "
        + (
            "diverged at every learning rate at every depth."
            if all_div
            else "trained at some learning rates (see results.json)."
        )
    )
    bests = {d: _best([c for c in res["configs"] if c["depth"] == int(d)]) for d in depths}
    smallest = min(s.gammas)
    small_wins = [d for d, b in bests.items() if b["gamma"] == smallest]
    within = all(c["within_2_percent"] for c in res["advice_check"])
    lines.append(
        f"- The ranking rule (`simulations.advise.rank_key`, spread target "
        f"{DEFAULT_SPREAD_TARGET:g}): "
        + (
            "the evidence supports it (the score predicts, and the advice is within 2% of the "
            "best at every depth)"
            if predicts and within
            else "the evidence does not support it at every depth"
        )
        + ". Caveats: one seed, "
        f"{s.steps} steps, width {s.width}, {len(s.lrs)} learning rates; the best "
        "configuration of each depth: "
        + _and([f"{_cfg(b)} at depth {d}" for d, b in bests.items()])
        + (
            f" (the smallest gamma tried, {smallest:g}, wins at depth {_and(small_wins)}, so "
            "the experiment cannot tell whether an even smaller gamma would be better still)"
            if small_wins
            else ""
        )
        + ". Longer training: below, and the shaped models of "
        "[../long_horizon/results.md](../long_horizon/results.md)."
    )
    return lines


def _diverged_steps(
    runs: list[dict[str, Any]], lr: float, horizon: int, roles: dict[tuple[float, float], str]
) -> list[str]:
    advised = {k: f" ({v})" for k, v in roles.items() if v != "grid"}
    out = []
    for r in sorted(runs, key=lambda r: (r["tau0"], r["gamma"])):
        h = r["horizons"][str(horizon)]
        if r["lr"] == lr and h["diverged"]:
            out.append(
                f"{_cfg(r)}{advised.get((r['gamma'], r['tau0']), '')} at step {h['diverged_step']}"
            )
    return out


def _long(
    s: Setup,
    res: dict[str, Any],
    runs: list[dict[str, Any]],
    scores: dict[str, Any],
    fixed: dict[str, Any],
    wide: dict[str, Any],
) -> list[str]:
    by = res["by_horizon"]
    horizons = [int(h) for h in by]
    lrs = [f"{lr:g}" for lr in s.lrs]
    adv = next(c for c in res["configs"] if c["role"] == "advised")
    head = (
        f"| horizon (steps) | `rho_spread` r [95% CI] | `gamma2T` r | best lr {' / '.join(lrs)} "
        f"/ diverged | advised ({adv['gamma']:g}, {adv['tau0']:g}): loss, rank | best "
        "configuration: loss |"
    )
    rows = [head, "|---" * 6 + "|"]
    ranks = {}
    for h, at in by.items():
        counts = at["best_lr_counts"]
        rank, advised, best = _rank(at)
        ranks[int(h)] = rank
        b = _best(at["configs"])
        rows.append(
            f"| {int(h):,} | {_r_ci(at['spearman'])} | {at['scores']['gamma2T']['value']:.2f} | "
            + " / ".join(str(counts[lr]) for lr in [*lrs, "diverged"])
            + f" | {advised:.3f}, {rank} of {len(at['configs'])} | {best:.3f} "
            f"({_cfg(b).replace(' /', ',')}, lr {b['best_lr']:g}) |"
        )
    r = [round(by[str(h)]["spearman"]["value"], 2) for h in horizons]
    g = [by[str(h)]["scores"]["gamma2T"]["value"] for h in horizons]
    n = len(res["configs"])
    depth = s.depths[0]
    short = fixed["scores_by_depth"].get(str(depth), {}).get(RANKING_SCORE)
    gamma_better = all(
        gh >= by[str(h)]["spearman"]["value"] - 0.005 for gh, h in zip(g, horizons, strict=True)
    )
    lines = [
        f"```bash\n{command('long_horizon')}\n```",
        "",
        _setup_text(s, res)
        + " At each horizon every configuration takes its best lr of that horizon. Files: "
        "`long_horizon/results.json` (`by_horizon`, with `best_lr_counts`), "
        f"`long_horizon/score_vs_loss.png` ({max(horizons):,} steps).",
        "",
        *rows,
        "",
        f"- **The init-time score {'still predicts' if min(r) > 0 else 'does not predict'} "
        f"the trained loss at every horizon**: Spearman r of `rho_spread` with the loss is "
        f"{min(r):.2f}-{max(r):.2f} from {horizons[0]:,} to {horizons[-1]:,} steps ({n} "
        "configurations, the diverged ones ranked worst)"
        + (
            f", against {short:.2f} for the same {n} at {fixed['horizon']} steps"
            if short is not None
            else ""
        )
        + f". The naive `gamma2T` gives {min(g):.2f}-{max(g):.2f}"
        + (
            ", as well or slightly better at every horizon: on this grid the SDE's score adds "
            "no ranking information beyond gamma^2 T."
            if gamma_better
            else "."
        ),
    ]
    groups: list[tuple[int, list[int]]] = []
    for h in horizons:
        if groups and groups[-1][0] == ranks[h]:
            groups[-1][1].append(h)
        else:
            groups.append((ranks[h], [h]))
    said = []
    for i, (rank, hs) in enumerate(groups):
        at = (
            f"from {hs[0]:,} on"
            if i == len(groups) - 1 and len(hs) > 1
            else "at " + _and([f"{h:,}" for h in hs]) + " steps"
        )
        said.append(f"{_ordinal(rank)} {at}")
    first = by[str(horizons[0])]
    advised_loss = _rank(first)[1]
    ahead = sorted(
        (c for c in first["configs"] if c["loss"] is not None and c["loss"] < advised_loss),
        key=lambda c: c["loss"],
    )
    top_lr = max(s.lrs)
    longest = max(horizons)
    roles = {(c["gamma"], c["tau0"]): c["role"] for c in res["configs"]}
    diverged = _diverged_steps(runs, top_lr, longest, roles)
    last = by[str(longest)]
    rank, advised, best = _rank(last)
    winner = _best(last["configs"])

    def same(c: dict[str, Any]) -> bool:
        return all(c[k] == winner[k] for k in ("gamma", "tau0", "best_lr"))

    wins_from = [
        h for h in horizons if all(same(_best(by[str(k)]["configs"])) for k in horizons if k >= h)
    ]
    smallest_always = all(_best(by[str(h)]["configs"])["gamma"] == min(s.gammas) for h in horizons)
    behind = advised / best - 1
    adv_gamma = next(c["gamma"] for c in last["configs"] if c["role"] == "advised")
    never = [c for c in last["configs"] if c["loss"] is None]
    wide_best = _best(wide["configs"])
    lines.append(
        f"- **The advice is {_and(said)}.** Ahead of it at {horizons[0]:,} steps: "
        + _and([f"{_cfg(c)} ({c['loss']:.3f}, lr {c['best_lr']:g})" for c in ahead])
        + f". At lr {top_lr:g}, {len(diverged)} runs diverge before {longest:,} steps: "
        + _and(diverged)
        + " (a shorter horizon whose cooldown ended before that step keeps its loss)."
        + (
            f" From {wins_from[0]:,} steps on {_cfg(winner)} at lr {_lr(winner['best_lr'])}"
            + (", the smallest gamma of the grid," if winner["gamma"] == min(s.gammas) else "")
            + f" is the best and is {_pct(behind)} lower at {longest:,} ({best:.3f} against "
            f"{advised:.3f} nats/byte), {'outside' if behind > 0.02 else 'inside'} the 2% "
            "that the fixed-horizon check allowed"
            + ("; the smallest gamma is the best at every horizon." if smallest_always else ".")
            if winner["gamma"] < adv_gamma
            else ""
        )
        + (
            " So, at this width and depth, the advisor's spread target picks a gamma on the "
            "safe side of the long-horizon optimum, not the optimum"
            + (
                "; as at width 64, depth 64 (below), the smallest gamma tried trains best."
                if wide_best["gamma"] == min(wide["setup"]["gammas"])
                else "."
            )
            if winner["gamma"] < adv_gamma
            else ""
        )
        + " Diverged at every lr: "
        + _and(
            [_cfg(c) + (" (the rejected one)" if c["role"] == "rejected" else "") for c in never]
        )
        + "."
    )
    below = [lr for lr in s.lrs if lr < top_lr]
    two = summarise_at(Setup(**{**s.__dict__, "lrs": tuple(below)}), runs, scores, horizons[0])
    trained = [c for c in last["configs"] if c["loss"] is not None]
    at_edge = sum(
        min(
            (lr for lr in below if c["losses"][f"{lr:g}"] is not None),
            key=lambda lr: c["losses"][f"{lr:g}"],
            default=None,
        )
        == max(below)
        for c in trained
    )
    top_counts = [by[str(h)]["best_lr_counts"][f"{top_lr:g}"] for h in horizons]
    none_from = next((h for i, h in enumerate(horizons) if not any(top_counts[i:])), None)
    prefers = [f"{c}" for c in top_counts if c]
    two_rank = _rank(two)[0]
    lines.append(
        f"- **The lr grid's top edge.** With lrs {_and([_lr(lr) for lr in below])} only, "
        f"{at_edge} of the {len(trained)} configurations that train were best at "
        f"{_lr(max(below))}, the top of that grid, at {longest:,} steps; the extension to "
        f"{_lr(top_lr)} "
        + (
            f"changes nothing from {none_from:,} steps on (no configuration prefers it there), "
            "while "
            if none_from
            else ""
        )
        + f"at {_and([f'{h:,}' for h, c in zip(horizons, top_counts, strict=True) if c])} "
        f"steps it is the best lr of {_and(prefers)} configurations. With "
        f"{len(below)} lrs the Spearman at {horizons[0]:,} steps was "
        f"{_r_ci(two['spearman'])} and the advice {_ordinal(two_rank)} of "
        f"{len(two['configs'])}."
    )
    top = sorted(c["loss"] for c in first["configs"] if c["loss"] is not None)[: _rank(first)[0]]
    lines.append(
        f"- **Caveats.** One seed; the top {len(top)} at {horizons[0]:,} steps lie within "
        f"{_pct(top[-1] / top[0] - 1)} of each other ({top[0]:.3f} to {top[-1]:.3f}), which a "
        "second seed could reorder."
    )
    return lines


def _wide(
    s: Setup, res: dict[str, Any], scores: dict[str, Any], fixed: dict[str, Any]
) -> list[str]:
    (depth,) = s.depths
    a = stored_advice(scores)[depth]
    configs = {(c["gamma"], c["tau0"]): c for c in res["configs"]}
    best = _best(res["configs"])

    def cell(c: dict[str, Any] | None) -> str:
        if c is None:
            return ""
        if c["loss"] is None:
            return "div."
        text = f"{c['loss']:.3f} (lr {_lr(c['best_lr'])})"
        return f"**{text[:5]}**{text[5:]}" if c is best else text

    rows = [
        "| gamma \\ tau0 | " + " | ".join(f"{t:g}" for t in s.tau0s) + " |",
        "|---" * (1 + len(s.tau0s)) + "|",
    ]
    for g in s.gammas:
        label = f"{g:g}" + (f" (advised at tau0 {a['tau0']:g})" if g == a["gamma"] else "")
        rows.append(f"| {label} | " + " | ".join(cell(configs.get((g, t))) for t in s.tau0s) + " |")
    rej = configs.get(REJECTED)
    rows.append(
        f"| {REJECTED[0]:g} (rejected, tau0 {REJECTED[1]:g}) | {cell(rej)} |"
        + " |" * (len(s.tau0s) - 1)
    )
    (check,) = res["advice_check"]
    behind = check["advised_loss"] / check["best_loss"] - 1
    smallest_advisor = min(DEFAULT_GAMMAS)
    never = sorted(
        {c["gamma"] for c in res["configs"] if c["loss"] is None and c["role"] != "rejected"}
    )
    some = [
        c
        for c in res["configs"]
        if c["loss"] is not None and any(v is None for v in c["losses"].values())
    ]
    fixed_best = {
        d: _best([c for c in fixed["configs"] if c["depth"] == d]) for d in fixed["setup"]["depths"]
    }
    fixed_small = [
        d
        for d in fixed["setup"]["depths"]
        if fixed_best[d]["gamma"] == min(fixed["setup"]["gammas"])
    ]
    ordered = _ordered_scores(res)
    values = sorted(ordered, key=lambda n: -res["scores"][n]["value"])
    lines = [
        f"```bash\n{command('width64_depth64')}\n```",
        "",
        _setup_text(s, res)
        + f" `advise({s.width}, {depth}, {s.sde_tokens}, heads={s.heads})` (default criteria, "
        f"{s.advise_samples} paths, {a['seconds']:.1f} s) gives **gamma {a['gamma']:g}, tau0 "
        f'{a["tau0"]:g}**. Best validation loss over the learning rates ("div." = non-finite '
        "at every learning rate; files: `width64_depth64/results.json`, "
        "`width64_depth64/score_vs_loss.png`):",
        "",
        *rows,
        "",
        f"- **The advised configuration trains to within 2% of the best of the hand grid**: "
        f"{check['advised_loss']:.3f} against {check['best_loss']:.3f}, {_pct(behind)} worse."
        if check["within_2_percent"]
        else f"- **The advised configuration is not within 2% of the best of the hand grid**: "
        f"{check['advised_loss']:.3f} against {check['best_loss']:.3f}, {_pct(behind)} worse.",
    ]
    if best["gamma"] != a["gamma"]:
        outside = best["gamma"] < smallest_advisor
        lines[-1] += (
            f" It is *not* the best: {_cfg(best)}"
            + (
                f" (outside the advisor's grid, whose smallest gamma is {smallest_advisor:g})"
                if outside
                else ""
            )
            + " trained better"
            + (
                f", as at width {fixed['setup']['width']} the smallest gamma tried won at depth "
                f"{_and([str(d) for d in fixed_small])}"
                if fixed_small
                else ""
            )
            + ". The advice is on the safe side of the optimum"
            + (
                ", but the best gamma at this horizon is below the advisor's grid; extending "
                "the grid downwards would need a criterion against too small a gamma (a "
                "network that barely moves its input), which none of the safety criteria is."
                if outside
                else "."
            )
        )
    lines.append(
        f"- **The rejected configuration {'diverged' if rej and rej['loss'] is None else 'trained'}"
        f"** at every learning rate"
        + (f", and so did every gamma >= {min(never):g}" if never else "")
        + "; "
        + _and(
            [
                f"{_cfg(c)} trained only at lr "
                + _and([k for k, v in c["losses"].items() if v is not None])
                for c in some
            ]
        )
        + "."
    )
    lines.append(
        f"- **Prediction at depth {depth}** ({res['spearman']['runs']} configurations, "
        "diverged ranked worst, 95% bootstrap CI over configurations): Spearman r between the "
        "init-time score and the loss is "
        + _and([f"{_r_ci(res['scores'][n])} for `{n}`" for n in values])
        + f": the best predictor is `{res['best_predictor']}`, the weakest `{values[-1]}`."
    )
    lines.append(
        f"- Caveats: one seed, {s.steps} steps, {len(s.lrs)} learning rates; differences of "
        "a few hundredths between neighbouring configurations may be within what a second "
        "seed could change."
    )
    return lines


def results_md(folder: Path = HERE) -> str:
    """The study's written report, every number computed from its stores and
    ``finite_network.json``."""
    s_fix, fixed, _, fixed_scores = _load(folder, ".")
    s_long, long_res, long_runs, long_scores = _load(folder, "long_horizon")
    s_wide, wide, _, wide_scores = _load(folder, "width64_depth64")
    runs = sum(len(RunStore(folder / n / STORE)) for n in MEASURED)
    default = Setup()
    lines = [
        "# Results: validating `shapedtx advise`",
        "",
        f"Generated by `report.py` from `{FINITE}` and the `runs.jsonl` and `scores.jsonl` of "
        f"the three prediction studies ({runs} finished runs). Do not edit: change `report.py` "
        "and run `python examples/advise/report.py`. What is measured and how to run it: "
        "[README.md](README.md).",
        "",
        "## 1. Finite networks meet the same criteria (`validate.py`)",
        "",
        *_finite_network(_read(folder / FINITE)),
        "",
        "## 2. Do the init-time scores predict training? (`predict.py`)",
        "",
        f"### At {s_fix.steps} steps: width {s_fix.width}, depths "
        f"{_and([str(d) for d in s_fix.depths])}",
        "",
        *_fixed(s_fix, fixed, fixed_scores),
        "",
        f"### At long horizons: width {s_long.width}, depth "
        f"{_and([str(d) for d in s_long.depths])}, up to {max(s_long.horizons):,} steps",
        "",
        *_long(s_long, long_res, long_runs, long_scores, fixed, wide),
        "",
        f"### The training check at width {s_wide.width}, depth "
        f"{_and([str(d) for d in s_wide.depths])}",
        "",
        *_wide(s_wide, wide, wide_scores, fixed),
        "",
        f"**Not run:** the full default study (width {default.width}, depths "
        f"{_and([str(d) for d in default.depths])}, {default.steps} steps, learning rates "
        f"{_and([_lr(lr) for lr in default.lrs])}).",
    ]
    return "\n".join(lines) + "\n"


def write_results_md(folder: Path = HERE) -> Path:
    path = folder / "results.md"
    with atomic_path(path) as tmp:
        tmp.write_text(results_md(folder))
    return path


def main(argv: list[str] | None = None) -> int:
    """Rebuild the measured studies' reports from their stores."""
    import argparse

    argparse.ArgumentParser(description=main.__doc__).parse_args(argv)
    for name, s in MEASURED.items():
        out = HERE / name
        scores = dict(RunStore(out / SCORE_STORE).records())
        result = summarise(s, RunStore(out / STORE).results(), scores)
        write_json(result, out / "results.json", indent=1)
        figure(result["configs"], out / "score_vs_loss.png")
    write_results_md(HERE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
