"""The shaped-vs-vanilla study's report: ``results.md``, ``results.json``, ``tables.md`` and
figures from its finished runs (``runs.jsonl``; ``study.py --report`` or ``python
examples/shaped_vs_vanilla/report.py``). Nothing here is edited by hand."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
from study import DEFAULT, Setup, best_lr, flat_result

from shapedtx import load_corpus
from shapedtx.files import atomic_path, write_json
from shapedtx.training import unigram_baseline as corpus_unigram
from simulations.studies import RunStore

HERE = Path(__file__).parent


def _key(r: dict[str, Any]) -> tuple[str, int]:
    return r["model"], r["depth"]


def unigram_baseline(max_bytes: int) -> dict[str, float]:
    """Cross-entropy of the validation split under the training split's byte frequencies and
    the validation split's entropy (``shapedtx.training.unigram_baseline``)."""
    return corpus_unigram(load_corpus(max_bytes=max_bytes))


def summarise(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    """``results.json``: per model and depth the best lr, the final validation loss of every
    seed there, divergences and the loss-vs-lr curve."""
    models: dict[str, Any] = {}
    for model in setup.models:
        per_depth = {}
        for depth in setup.depths:
            runs = [r for r in results if _key(r) == (model, depth)]
            if not runs:
                continue
            best = best_lr(runs)
            seeds = sorted((r for r in runs if r["lr"] == best), key=lambda r: r["seed"])
            losses = [r["val_loss"] for r in seeds if not r["diverged"]]
            grid = sorted((r for r in runs if r["seed"] == 0), key=lambda r: r["lr"])
            per_depth[str(depth)] = {
                "lr": best,
                "seeds": [r["seed"] for r in seeds],
                "val_loss": [r["val_loss"] for r in seeds],
                "val_loss_mean": float(np.mean(losses)) if losses else None,
                "val_loss_std": float(np.std(losses, ddof=1)) if len(losses) > 1 else None,
                "diverged": sum(r["diverged"] for r in runs),
                "runs": len(runs),
                "lr_curve": {
                    "lr": [r["lr"] for r in grid],
                    "val_loss": [r["val_loss"] for r in grid],
                    "diverged": [r["diverged"] for r in grid],
                },
                "trainable_lrs": [r["lr"] for r in grid if not r["diverged"]],
                "params": seeds[0]["params"] if seeds else None,
            }
        models[model] = {"depth": per_depth}
    return {
        "setup": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(setup).items()},
        "unigram_baseline": unigram_baseline(setup.max_bytes),
        "models": models,
    }


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def results_table(summary: dict[str, Any]) -> str:
    """Markdown table: model x depth -> mean ± sd final validation loss (best lr, seeds)."""
    depths = summary["setup"]["depths"]
    head = "| model | " + " | ".join(f"depth {d}" for d in depths) + " |"
    lines = [head, "|---" * (len(depths) + 1) + "|"]
    for model, entry in summary["models"].items():
        cells = []
        for d in depths:
            e = entry["depth"].get(str(d))
            if e is None:
                cells.append("not run")
            elif e["val_loss_mean"] is None:
                cells.append(f"all diverged ({e['diverged']}/{e['runs']})")
            else:
                sd = f" ± {e['val_loss_std']:.3f}" if e["val_loss_std"] is not None else ""
                n = sum(v is not None for v in e["val_loss"])
                cells.append(
                    f"{e['val_loss_mean']:.3f}{sd} (n={n}, lr {e['lr']:.2g}, "
                    f"div {e['diverged']}/{e['runs']})"
                )
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(summary: dict[str, Any], results: list[dict[str, Any]], folder: Path) -> list[Path]:
    """final loss vs depth, loss vs lr per depth, loss curves and per-layer covariance."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    depths = summary["setup"]["depths"]
    models = list(summary["models"])
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    paths = []

    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    top = summary["unigram_baseline"]["cross_entropy"] + 0.15
    for k, model in enumerate(models):
        xs, means, sds = [], [], []
        for d in depths:
            e = summary["models"][model]["depth"].get(str(d))
            if e and e["val_loss_mean"] is not None and e["val_loss_mean"] <= top:
                x = d * (1 + 0.03 * (k - len(models) / 2))  # small offsets: bars do not overlap
                xs.append(x)
                means.append(e["val_loss_mean"])
                sds.append(e["val_loss_std"] or 0.0)
                pts = [v for v in e["val_loss"] if v is not None]
                ax.plot([x] * len(pts), pts, ".", color=colours[model], alpha=0.5, ms=4)
        ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, color=colours[model], label=model)
    ax.axhline(summary["unigram_baseline"]["cross_entropy"], color="grey", ls=":", lw=1,
               label="unigram baseline")  # fmt: skip
    low = min((v for e in summary["models"].values() for c in e["depth"].values()
               for v in c["val_loss"] if v is not None), default=top - 1)  # fmt: skip
    for k, model in enumerate(models):  # losses above the unigram baseline: off scale
        for d in depths:
            e = summary["models"][model]["depth"].get(str(d))
            if e and e["val_loss_mean"] is not None and e["val_loss_mean"] > top:
                x = d * (1 + 0.03 * (k - len(models) / 2))
                ax.plot([x], [top - 0.02], "^", color=colours[model], ms=9)
                ax.annotate(f"{e['val_loss_mean']:.3g}", (x, top - 0.02), fontsize=7,
                            xytext=(4, -10), textcoords="offset points")  # fmt: skip
    ax.set_ylim(low - 0.05, top)
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel("final validation loss (nats/byte)")
    ax.set_title(
        "best lr per model and depth: mean ± sd over seeds (dots: seeds;\n"
        "triangles: off scale, above the unigram baseline)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_vs_depth.png"))

    fig = Figure(figsize=(4.0 * len(depths), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(depths), sharey=True))
    for ax, d in zip(axes, depths, strict=True):
        for model in models:
            e = summary["models"][model]["depth"].get(str(d))
            if not e:
                continue
            c = e["lr_curve"]
            ok = [(lr, v) for lr, v, bad in zip(c["lr"], c["val_loss"], c["diverged"],
                                                 strict=True) if not bad]  # fmt: skip
            if ok:
                ax.plot(*zip(*ok, strict=True), "o-", color=colours[model], label=model, ms=4)
            bad = [lr for lr, b in zip(c["lr"], c["diverged"], strict=True) if b]
            if bad:
                ax.plot(bad, [1.0] * len(bad), "x", color=colours[model], ms=8,
                        transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
        ax.set_xscale("log")
        ax.set_ylim(top=summary["unigram_baseline"]["cross_entropy"] + 0.8)
        ax.set_xlabel("peak learning rate")
        ax.set_title(f"depth {d} (x at top: diverged)")
    axes[0].set_ylabel("final validation loss, seed 0 (nats/byte)")
    axes[-1].legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_vs_lr.png"))

    fig = Figure(figsize=(4.0 * len(depths), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(depths), sharey=True))
    for ax, d in zip(axes, depths, strict=True):
        for model in models:
            e = summary["models"][model]["depth"].get(str(d))
            if not e or e["lr"] is None:
                continue
            for r in results:
                if (r["model"], r["depth"], r["lr"]) == (model, d, e["lr"]):
                    c = r["curve"]
                    ax.plot(c["step"], c["val_loss"], color=colours[model], alpha=0.7,
                            label=model if r["seed"] == 0 else None)  # fmt: skip
        ax.set_xlabel("step")
        ax.set_title(f"depth {d}, best lr, all seeds")
    axes[0].set_ylabel("validation loss (nats/byte)")
    axes[-1].legend(fontsize=7)
    paths.append(_save(fig, folder / "loss_curves.png"))

    for metric, label in (("mean_rho", "mean token correlation"),
                          ("centred_stable_rank", "centred stable rank")):  # fmt: skip
        fig = Figure(figsize=(4.0 * len(depths), 6.4), layout="constrained")
        axes = fig.subplots(2, len(depths), squeeze=False, sharey="row")
        for j, d in enumerate(depths):
            for model in models:
                e = summary["models"][model]["depth"].get(str(d))
                run = next((r for r in results if e and (r["model"], r["depth"], r["lr"],
                            r["seed"]) == (model, d, e["lr"], 0)), None)  # fmt: skip
                if run is None or metric not in run:
                    continue
                for i, when in enumerate(("init", "final")):
                    y = [np.nan if v is None else v for v in run[metric][when]]
                    axes[i, j].plot(range(len(y)), y, color=colours[model], label=model)
            axes[0, j].set_title(f"depth {d}: at initialisation")
            axes[1, j].set_title(f"depth {d}: after training")
            axes[1, j].set_xlabel("layer (0 = embeddings)")
        for i in range(2):
            axes[i, 0].set_ylabel(label)
        axes[0, -1].legend(fontsize=7)
        paths.append(_save(fig, folder / f"{metric}_by_layer.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path


LEARNED = 0.95
"""A cell learned when its mean final loss is below this fraction of the unigram baseline (a
model at the baseline learned only the byte frequencies)."""
LONG_HORIZON = HERE.parent / "long_horizon" / "results.json"
"""The long-horizon study's generated summary (the caveat on this study's horizon)."""


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _cell(summary: dict[str, Any], model: str, depth: int) -> dict[str, Any] | None:
    c: dict[str, Any] | None = summary["models"][model]["depth"].get(str(depth))
    return c


def _ms(c: dict[str, Any]) -> str:
    sd = "" if c["val_loss_std"] is None else f" ± {c['val_loss_std']:.3f}"
    return f"{c['val_loss_mean']:.3f}{sd}"


def _learned(summary: dict[str, Any], c: dict[str, Any] | None) -> bool:
    base = summary["unigram_baseline"]["cross_entropy"]
    return bool(c and c["val_loss_mean"] is not None and c["val_loss_mean"] < LEARNED * base)


def bold_table(summary: dict[str, Any]) -> str:
    """``results_table`` with the best mean of each depth in bold."""
    depths = summary["setup"]["depths"]
    best = {}
    for d in depths:
        cells = {m: _cell(summary, m, d) for m in summary["models"]}
        ok = {m: c["val_loss_mean"] for m, c in cells.items() if c and c["val_loss_mean"]}
        best[d] = min(ok, key=ok.__getitem__) if ok else None
    lines = results_table(summary).splitlines()
    out = lines[:2]
    for line, model in zip(lines[2:], summary["models"], strict=True):
        cells = line.split(" | ")
        for i, d in enumerate(depths, start=1):
            if best[d] == model:
                value, rest = cells[i].split(" (", 1)
                cells[i] = f"**{value}** ({rest}"
        out.append(" | ".join(cells))
    return "\n".join(out)


def _shaped(summary: dict[str, Any]) -> list[str]:
    return [m for m in summary["models"] if m.startswith("shaped g=")]


def _last_layer_rho(results: list[dict], summary: dict, model: str, depth: int, when: str):
    """Seed 0's last-layer mean rho at the best lr (``when``: init or final)."""
    c = _cell(summary, model, depth)
    runs = [r for r in results if (r["model"], r["depth"], r["seed"]) == (model, depth, 0)]
    runs = [r for r in runs if c and r["lr"] == c["lr"]]
    if not runs or not runs[0].get("mean_rho"):
        return None
    value = runs[0]["mean_rho"][when][-1]
    return None if value is None else float(value)


def _findings(summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    depths = summary["setup"]["depths"]
    base = summary["unigram_baseline"]["cross_entropy"]
    shaped = _shaped(summary)
    ref = "pre-LN (GPT-2)"
    out = []
    deep = depths[1:]
    # 1. the best shaped model against pre-LN at depth
    best_shaped = {
        d: min(
            (m for m in shaped if _cell(summary, m, d)),
            key=lambda m: _cell(summary, m, d)["val_loss_mean"],
        )
        for d in depths
    }
    parts = []
    for d in deep:
        a, b = _cell(summary, best_shaped[d], d), _cell(summary, ref, d)
        diff = b["val_loss_mean"] - a["val_loss_mean"]
        sd = float(np.hypot(a["val_loss_std"] or 0.0, b["val_loss_std"] or 0.0))
        parts.append(
            f"at depth {d} `{best_shaped[d]}` reaches {_ms(a)} against {_ms(b)} for GPT-2's "
            f"pre-LN (difference {diff:+.2f}, {diff / sd:.1f} times the combined sd)"
        )
    smallest = shaped[0]
    top = [
        d
        for d in deep
        if best_shaped[d]
        == min(
            (
                m
                for m in summary["models"]
                if _cell(summary, m, d) and _cell(summary, m, d)["val_loss_mean"] is not None
            ),
            key=lambda m: _cell(summary, m, d)["val_loss_mean"],
        )
    ]
    grows = all(
        [_cell(summary, m, d)["val_loss_mean"] for m in shaped]
        == sorted(_cell(summary, m, d)["val_loss_mean"] for m in shaped)
        for d in depths
    )
    gaps = [
        _cell(summary, shaped[-1], d)["val_loss_mean"]
        - _cell(summary, shaped[0], d)["val_loss_mean"]
        for d in depths
    ]
    worse = [
        d
        for d in depths
        if _cell(summary, shaped[-1], d)["val_loss_mean"] > _cell(summary, ref, d)["val_loss_mean"]
    ]
    out.append(
        f"**After {summary['setup']['steps']} steps at width {summary['setup']['width']}, the "
        + (
            f"shaped model is the best of the models tried at depth {_and([str(d) for d in top])}"
            if top
            else "shaped model is the best of the models tried at no depth"
        )
        + f", and the smallest branch weight ({smallest}) is the best shaped one**: "
        + "; ".join(parts)
        + ". Among the shaped models the loss "
        + (
            "grows with gamma at every depth"
            if grows
            else "does not grow with gamma at every depth"
        )
        + f", and the gap from `{shaped[0]}` to `{shaped[-1]}` is "
        + _and([f"{g:.2f} at depth {d}" for g, d in zip(gaps, depths, strict=True)])
        + (
            f" (`{shaped[-1]}` is worse than pre-LN at depth {_and([str(d) for d in worse])})"
            if worse
            else ""
        )
        + ". The covariance SDE's parameter is gamma^2 T: a deep network needs a small gamma "
        "(`shapedtx advise` chooses gamma from T for that reason)."
    )
    # 2. deeper is not better here
    if len(depths) >= 3:
        d1, d2 = depths[-2], depths[-1]
        both = [
            m
            for m in summary["models"]
            if _learned(summary, _cell(summary, m, d1)) and _learned(summary, _cell(summary, m, d2))
        ]
        better = [
            m
            for m in both
            if _cell(summary, m, d2)["val_loss_mean"] < _cell(summary, m, d1)["val_loss_mean"]
        ]
        params = [_cell(summary, ref, d)["params"] for d in (d1, d2)]
        text = _and(
            [
                f"`{m}` ({_cell(summary, m, d1)['val_loss_mean']:.2f} to "
                f"{_cell(summary, m, d2)['val_loss_mean']:.2f}, "
                f"{sum(v is not None for v in _cell(summary, m, d2)['val_loss'])} of "
                f"{len(_cell(summary, m, d2)['val_loss'])} seeds)"
                for m in better
            ]
        )
        out.append(
            f"**Every model that learns at both depths {d1} and {d2} loses from {d1} to {d2} "
            f"here" + (f", except {text}" if better else "") + f".** {summary['setup']['steps']} "
            f"steps are too few for a deeper network to use its extra parameters ({params[1]:,} "
            f"against {params[0]:,} for pre-LN); the study compares models at equal depth and "
            "budget, not the value of depth."
        )
    # 3. the norm-free vanilla model
    nf, gpt2 = "no-norm fan_in", "no-norm gpt2"
    if nf in summary["models"]:
        d0 = depths[0]
        best0 = min(summary["models"], key=lambda m: _cell(summary, m, d0)["val_loss_mean"] or 1e9)
        parts = [
            f"at depth {d0} `{nf}` reaches {_ms(_cell(summary, nf, d0))}"
            + (", better than every other model" if best0 == nf else "")
        ]
        for d in deep:
            c = _cell(summary, nf, d)
            runs = [r for r in results if (r["model"], r["depth"]) == (nf, d)]
            init = (
                min(r["init_val_loss"] for r in runs if r["init_val_loss"] is not None)
                if any(r["init_val_loss"] is not None for r in runs)
                else None
            )
            if c["val_loss_mean"] is None:
                steps = sorted({r["status"] for r in runs if r["diverged"]})
                parts.append(f"at depth {d} every run diverged ({_and(steps)})")
            elif not _learned(summary, c):
                parts.append(
                    f"at depth {d} its initial loss is {init:.3g} and it ends at "
                    f"{c['val_loss_mean']:.4g} nats/byte, above the unigram baseline"
                )
        out.append(
            f"**The norm-free vanilla model (`{nf}`) trains when shallow and fails when deep**: "
            + "; ".join(parts)
            + "."
        )
    if gpt2 in summary["models"]:
        cells = [_cell(summary, gpt2, d) for d in depths]
        if all(_learned(summary, c) for c in cells):
            c = cells[-1]
            n = sum(v is not None for v in c["val_loss"])
            out.append(
                f"With GPT-2's init (`{gpt2}`) the same architecture learns at every depth "
                f"({c['val_loss_mean']:.3f} at depth {depths[-1]}, {c['diverged']} of "
                f"{c['runs']} runs diverged there and {n} seeds finished at the best lr)."
            )
    # 4. post-LN
    post = "post-LN"
    if post in summary["models"]:
        failed = [d for d in depths if not _learned(summary, _cell(summary, post, d))]
        if failed:
            runs = [
                r
                for r in results
                if r["model"] == post and r["depth"] in failed and not r["diverged"]
            ]
            losses = [r["val_loss"] for r in runs]
            lrs = [r["lr"] for r in runs]
            rho = [
                (
                    _last_layer_rho(results, summary, post, d, "init"),
                    _last_layer_rho(results, summary, post, d, "final"),
                )
                for d in failed
            ]
            out.append(
                f"**Post-LN fails at depth {_and([str(d) for d in failed])} at this budget**: "
                f"every lr from {min(lrs):.2g} to {max(lrs):.2g} ends at {min(losses):.2f} to "
                f"{max(losses):.2f}, at or near the unigram baseline ({base:.3f}); its last "
                "layer's mean rho (seed 0, best lr) is "
                + _and(
                    [
                        f"{a:.2f} at initialisation and {b:.2f} after training at depth {d}"
                        for (a, b), d in zip(rho, failed, strict=True)
                    ]
                )
                + f": collapsed tokens that {summary['setup']['steps']} steps of Adam do not "
                "recover. No warm-up beyond "
                f"{max(1, summary['setup']['steps'] // 10)} steps was tried, the classic remedy."
            )
    # 5. divergences
    per_model = {
        m: (
            sum(c["diverged"] for c in e["depth"].values()),
            sum(c["runs"] for c in e["depth"].values()),
        )
        for m, e in summary["models"].items()
    }
    never = [f"`{m}` ({k}/{n})" for m, (k, n) in per_model.items() if k == 0]
    top = []
    for m in shaped:
        c = _cell(summary, m, depths[-1])
        if c and c["trainable_lrs"]:
            top.append(f"{max(c['trainable_lrs']):.2g} for `{m}`")
    edge = []
    for m in shaped:
        for d in depths:
            runs = [r for r in results if (r["model"], r["depth"]) == (m, d)]
            bad = [r["lr"] for r in runs if r["diverged"]]
            good = [r["lr"] for r in runs if not r["diverged"]]
            if bad:
                top_lr = min(bad) > max(good, default=0.0)
                edge.append((top_lr, f"`{m}` at {min(bad):.2g}, depth {d}"))
    if edge:
        where = _and([t for _, t in edge])
        out.append(
            (
                "**The shaped models diverge only at the largest learning rates of their grid** "
                if all(e for e, _ in edge)
                else "**The shaped models diverge** "
            )
            + f"({where})."
        )
    out.append(
        "**Divergences** (all runs of a model): "
        + _and([f"`{m}` {k}/{n}" for m, (k, n) in per_model.items()])
        + (f"; never: {_and(never)}" if never else "")
        + f". The largest lr that trains at depth {depths[-1]}: {_and(top)} "
        "(`figures/loss_vs_lr.png`)."
    )
    return out


def _covariance(summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    depths = summary["setup"]["depths"]
    init, final, csr = {}, {}, {}
    for m in summary["models"]:
        for d in depths:
            a = _last_layer_rho(results, summary, m, d, "init")
            b = _last_layer_rho(results, summary, m, d, "final")
            if a is not None:
                init[m, d] = a
            if b is not None:
                final[m, d] = b
            c = _cell(summary, m, d)
            runs = [
                r
                for r in results
                if (r["model"], r["depth"], r["seed"]) == (m, d, 0)
                and c
                and r["lr"] == c["lr"]
                and r.get("centred_stable_rank")
            ]
            if runs and runs[0]["centred_stable_rank"]["final"][-1] is not None:
                csr[m, d] = float(runs[0]["centred_stable_rank"]["final"][-1])
    learned = {k for k in final if _learned(summary, _cell(summary, *k))}

    def span(values: list[float]) -> str:
        return f"{min(values):.2f}-{max(values):.2f}" if values else "-"

    collapsed = sorted(k for k, v in init.items() if v > 0.9)
    low = [v for k, v in init.items() if k not in collapsed]
    rows = [
        f"At initialisation the last layer's mean rho is {span(low)} for every model and depth "
        "but "
        + _and([f"`{m}` at depth {d} ({init[m, d]:.2f})" for m, d in collapsed])
        + " (collapsed tokens)."
        if collapsed
        else f"At initialisation the last layer's mean rho is {span(low)}.",
        f"After training every model that learned has correlated last-layer tokens: mean rho "
        f"{span([final[k] for k in learned])}"
        + (
            f" (`{_shaped(summary)[0]}`: "
            + _and(
                [
                    f"{final[_shaped(summary)[0], d]:.2f} at depth {d}"
                    for d in depths[1:]
                    if (_shaped(summary)[0], d) in final
                ]
            )
            + "; pre-LN "
            + _and(
                [
                    f"{final['pre-LN (GPT-2)', d]:.2f}"
                    for d in depths[1:]
                    if ("pre-LN (GPT-2)", d) in final
                ]
            )
            + ")"
        )
        + ': training re-aligns the tokens in every architecture, so "no rank collapse at '
        'initialisation" is not a property that survives training. The centred stable rank '
        f"after training is {span([csr[k] for k in learned if k in csr])} for the models that "
        f"learned and {span([v for k, v in csr.items() if k not in learned])} for those that "
        "did not: it does not separate shaped from pre-LN.",
    ]
    return [f"- {r}" for r in rows]


def _caveats(setup: Setup, summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    cap = max(setup.lrs) * 3.0**setup.max_extensions
    capped = [
        f"`{m}` at depth {d}"
        for m, e in summary["models"].items()
        for d, c in e["depth"].items()
        if c["lr"] and c["lr"] >= cap / 1.01
    ]
    params = [r["params"] for r in results if r.get("params")]
    out = [
        f"**Scale.** Width {setup.width}, {summary['setup']['steps']} steps, "
        f"{min(params) / 1e6:.2g}-{max(params) / 1e6:.2g}M parameters: a short-horizon, "
        "tiny-model regime. The ranking can change with longer training and with width.",
        f"**The lr grid hit its cap** ({cap:.2g}, {setup.max_extensions} extensions above "
        f"{max(setup.lrs):.2g}) for {_and(capped)}: those cells could improve with a larger lr, "
        "so their numbers are upper bounds."
        if capped
        else "No best lr is at the grid's cap.",
        f"**Seeds.** {len(setup.seeds)} seeds give a rough sd (its own relative error is about "
        f"{100 / np.sqrt(2 * (len(setup.seeds) - 1)):.0f}%): differences within about twice "
        "the combined sd are not resolved.",
        "**Same recipe for all.** Warm-up, schedule, clipping and batch are shared; post-LN in "
        "particular is usually trained with a longer warm-up. No weight decay.",
        "The shaped models use a 4n MLP with the shaped ReLU (for parameter parity), which has "
        "no derived SDE (the SDE covers `mlp_ratio = 1`).",
    ]
    return [f"- {c}" for c in out]


def is_default(setup: Setup) -> bool:
    """Whether ``setup`` is the study's default, by value: run as ``python study.py``, the
    study is ``__main__`` and this module's ``from study import`` loads a second copy, whose
    ``Setup`` is another class (so ``==`` between the two is always False)."""
    return dataclasses.astuple(setup) == dataclasses.astuple(DEFAULT)


def _horizon_caveat() -> list[str]:
    """The long-horizon study's verdict on the same pair (its generated results.json)."""
    if not LONG_HORIZON.exists():
        return []
    import json

    d = json.loads(LONG_HORIZON.read_text())
    depth = "16"
    ratios = d["depths"][depth]["ratio_to_reference"].get("shaped advise")
    models = d["depths"][depth]["models"]
    if not ratios:
        return []
    first, last = min(ratios, key=int), max(ratios, key=int)
    a, b = models["shaped advise"][last], models["pre-LN (GPT-2)"][last]
    return [
        f"> **Horizon: {DEFAULT.steps} steps.** The shaped model's lead over pre-LN below does "
        f"not survive longer training: at width {d['setup']['width']}, depth {depth}, each at "
        f"its best lr, the shaped model's loss is {ratios[first]['ratio']:.3f} times pre-LN's "
        f"at {first} steps and {ratios[last]['ratio']:.2f} times at {last} ({a['mean']:.3f} ± "
        f"{a['sd']:.3f} against {b['mean']:.3f} ± {b['sd']:.3f} nats/byte, {a['n']} seeds; "
        "[../long_horizon/results.md](../long_horizon/results.md)). Read this page as the first "
        f"{DEFAULT.steps} steps of training.",
        "",
    ]


def results_md(setup: Setup, summary: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The study's written report, every number computed from the runs (``results.md``)."""
    from study import plan  # type: ignore[import-not-found]  # beside this script

    depths = summary["setup"]["depths"]
    base = summary["unigram_baseline"]["cross_entropy"]
    todo = plan(setup, results)
    status = "none planned: the study is complete" if not todo else f"{len(todo)} planned now"
    lines = [
        "# Results: shaped vs vanilla Transformers (CPU study)",
        "",
        f"Generated by `report.py` from `runs.jsonl` ({len(results)} finished runs; {status}). "
        "Do not edit: change `report.py` and run `python examples/shaped_vs_vanilla/report.py`. "
        "The design: [README.md](README.md); the numbers: [results.json](results.json).",
        "",
        *(_horizon_caveat() if is_default(setup) else []),
        f"Width {setup.width}, depths {_and([str(d) for d in depths])}, "
        f"{summary['setup']['steps']} steps of {setup.batch_size} x {setup.seq_len} bytes, "
        f"learning rate tuned per model and depth, {len(setup.seeds)} seeds at the best "
        "learning rate. Final validation loss in nats/byte, mean ± sd over seeds (n = seeds "
        "that did not diverge), the best peak lr, and divergences among all runs of the cell; "
        f"bold: the best of each depth. Unigram baseline of the validation split: **{base:.3f}**.",
        "",
        bold_table(summary),
        "",
        "![final loss vs depth](figures/loss_vs_depth.png)",
        "",
        "## What the numbers show",
        "",
        *[f"{i}. {f}" for i, f in enumerate(_findings(summary, results), start=1)],
        "",
        "![loss vs learning rate](figures/loss_vs_lr.png)",
        "",
        "## Covariance during training (seed 0, best lr; `figures/*_by_layer.png`)",
        "",
        *_covariance(summary, results),
        "",
        "![mean rho by layer](figures/mean_rho_by_layer.png)",
        "",
        "## What it does not show, and caveats",
        "",
        *_caveats(setup, summary, results),
    ]
    return "\n".join(lines) + "\n"


def report(setup: Setup, out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write ``results.md``, ``results.json``, ``tables.md`` and the figures from the
    finished runs (flat form, ``study.flat_result``)."""
    summary = summarise(setup, results)
    write_json(summary, out / "results.json", indent=1)
    base = summary["unigram_baseline"]
    text = (
        f"Final validation loss (nats/byte) at the best peak lr per model and depth, mean ± sd "
        f"over seeds; div = diverged runs of all runs of that cell (every lr and seed). "
        f"Unigram baseline of the validation split: {base['cross_entropy']:.3f} "
        f"(entropy {base['val_entropy']:.3f}). Generated by report.py from runs.jsonl.\n\n"
        f"{results_table(summary)}\n"
    )
    with atomic_path(out / "tables.md") as tmp:
        tmp.write_text(text)
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text(results_md(setup, summary, results))
    figures(summary, results, out / "figures")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Rebuild the committed report from ``runs.jsonl``."""
    import argparse

    argparse.ArgumentParser(description=main.__doc__).parse_args(argv)
    results = [flat_result(r) for r in RunStore(HERE / "runs.jsonl").results()]
    report(DEFAULT, HERE, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
