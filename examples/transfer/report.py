"""The transfer study's report: ``results.json``, ``tables.md`` and figures from the finished
runs (``study.py --report``).

Per parametrisation and shape (width, depth), at every horizon: the seed-0 validation loss of
every base lr, and the optimal log2(lr) located by a least-squares quadratic in log2(lr)
through the lowest point and the same number of points (two, or one next to the last finite
point) on each side (``fit_optimum``): a symmetric window, so that the loss curve's asymmetry
(steeper on the large-lr side) does not move the vertex differently from shape to shape.
Its interval is a parametric bootstrap: the fitted curve plus Gaussian noise with the
seed-to-seed standard deviation measured at the optimum (the 3-seed cells of the
parametrisation, pooled), refitted 1000 times; 2.5% and 97.5% quantiles. Independent noise
per point with the full seed-to-seed sd is conservative (seeds shift a loss curve mostly as a
whole, which does not move its optimum): the intervals are wider than the fit's own noise.
The drift across depth (width) is the optimum at the deepest (widest) shape minus the one at
the shallowest (narrowest), with the interval of the same bootstrap, and the least-squares
slope of the optimum against log2(depth) (log2(width)). The window is as wide as each shape's
grid allows, so a shape with fewer lrs run gets a narrower one, and the vertex moves with the
window where the curve is asymmetric: every optimum and drift is therefore also given from the
3-point fit (``fit_3pt``, ``*_drift_3pt``: one neighbour on each side at every shape).
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from study import REFERENCE_BASELINE, SAME_AT_PROXY_DEPTH, VARIANTS, Setup

from shapedtx.files import atomic_path, write_json
from simulations.training_runs import horizon_loss, one_corpus

BOOTSTRAP = 1000
"""Bootstrap resamples of every fit."""

_WINDOWS = {"": 2, "_3pt": 1}
"""The fit windows: summary key suffix (``fit``/``fit_3pt``, ``*_drift``/``*_drift_3pt``) ->
``fit_optimum``'s ``half_width``."""


def fit_optimum(x: list[float], y: list[float], half_width: int = 2) -> dict[str, Any]:
    """The optimum of ``y`` (losses, inf: diverged) over ``x`` (log2 lr, ascending): a quadratic
    through the lowest finite point and k = min(``half_width``, finite points on either side)
    finite neighbours on each side. ``at_edge``: the lowest point is the first or last finite
    one (the optimum is then that point, not a fit), and ``edge`` says why: ``"grid"`` (the
    grid ends there: a larger or smaller lr may be better) or ``"diverged"`` (the next lr
    diverged: the optimum is bounded by divergence); ``convex``: the fitted quadratic has a
    minimum (else the optimum is the lowest point)."""
    pts = [(a, b) for a, b in zip(x, y, strict=True) if math.isfinite(b)]
    if not pts:
        empty = ("log2_lr", "loss", "at_edge", "edge", "convex")
        return {**dict.fromkeys(empty), "points": []}
    xs = np.array([p[0] for p in pts], dtype=float)
    ys = np.array([p[1] for p in pts], dtype=float)
    i = int(np.argmin(ys))
    lowest = {"log2_lr": float(xs[i]), "loss": float(ys[i])}
    if i == 0 or i == len(xs) - 1:
        p = list(x).index(xs[i])
        ends = [p == 0] if i == 0 else []
        ends += [p == len(x) - 1] if i == len(xs) - 1 else []
        edge = "grid" if any(ends) else "diverged"
        return {**lowest, "at_edge": True, "edge": edge, "convex": None, "points": [i]}
    k = min(half_width, i, len(xs) - 1 - i)
    idx = list(range(i - k, i + k + 1))
    a, b, c = np.polyfit(xs[idx], ys[idx], 2)
    if a <= 0:
        return {**lowest, "at_edge": False, "edge": None, "convex": False, "points": idx}
    x_star = float(np.clip(-b / (2 * a), xs[idx[0]], xs[idx[-1]]))
    return {
        "log2_lr": x_star,
        "loss": float(np.polyval([a, b, c], x_star)),
        "at_edge": False,
        "edge": None,
        "convex": True,
        "points": idx,
        "coefficients": [float(a), float(b), float(c)],
    }


def bootstrap(
    x: list[float],
    y: list[float],
    sd: float | None,
    rng: np.random.Generator,
    half_width: int = 2,
) -> np.ndarray | None:
    """``BOOTSTRAP`` optima of the fit of ``fit_optimum`` (window ``half_width``) to its own
    curve plus N(0, sd^2) noise at each fitted point (None without a fit or an sd)."""
    fit = fit_optimum(x, y, half_width)
    if sd is None or not fit.get("convex"):
        return None
    xs = np.array([v for v, w in zip(x, y, strict=True) if math.isfinite(w)])[fit["points"]]
    mean = np.polyval(fit["coefficients"], xs)
    noisy = mean + rng.normal(0.0, sd, size=(BOOTSTRAP, len(xs)))
    # every resample's least-squares quadratic at once (the fit of np.polyfit, one solve)
    a2, b2, _ = np.linalg.lstsq(np.vander(xs, 3), noisy.T, rcond=None)[0]
    lowest = xs[np.argmin(noisy, axis=1)]
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.clip(-b2 / (2 * a2), xs[0], xs[-1])
    return np.where(a2 > 0, vertex, lowest)


def _rng(name: str, width: int, depth: int, horizon: int, half_width: int) -> np.random.Generator:
    """The bootstrap's generator of one fit, seeded by what the fit is of: an interval does
    not change when grid runs of other shapes or parametrisations are added (only when its
    own curve or the pooled seed-to-seed sd does)."""
    return np.random.default_rng([zlib.crc32(name.encode()), width, depth, horizon, half_width])


def _interval(samples: np.ndarray | None) -> list[float] | None:
    if samples is None:
        return None
    return [float(np.quantile(samples, 0.025)), float(np.quantile(samples, 0.975))]


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def seed_stats(runs: list[dict[str, Any]], horizon: int) -> dict[str, Any] | None:
    """Mean and sd over the seeds run at one lr (the lr with the most seeds; None: one seed)."""
    by_j: dict[int, list[float]] = {}
    for r in runs:
        by_j.setdefault(r["log2_lr"], []).append(horizon_loss(r, horizon))
    j, values = max(by_j.items(), key=lambda kv: len(kv[1]))
    ok = [v for v in values if math.isfinite(v)]
    if len(values) < 2:
        return None
    return {
        "log2_lr": j,
        "n": len(ok),
        "diverged": len(values) - len(ok),
        "mean": float(np.mean(ok)) if ok else None,
        "sd": float(np.std(ok, ddof=1)) if len(ok) > 1 else None,
    }


def _pooled_sd(cells: list[dict[str, Any] | None]) -> float | None:
    sds = [(c["sd"], c["n"]) for c in cells if c and c["sd"] is not None]
    if not sds:
        return None
    return float(math.sqrt(sum(s**2 * (n - 1) for s, n in sds) / sum(n - 1 for _, n in sds)))


def _drift(
    points: list[tuple[int, dict[str, Any]]],
    samples: dict[int, np.ndarray | None],
    fit: str = "fit",
) -> dict[str, Any] | None:
    """Drift of the optimum (each cell's ``fit``) along one axis: last minus first size,
    range, slope per doubling."""
    ok = [(size, c) for size, c in points if c[fit]["log2_lr"] is not None]
    if len(ok) < 2:
        return None
    sizes = np.log2([s for s, _ in ok])
    opt = np.array([c[fit]["log2_lr"] for _, c in ok])
    first, last = ok[0][0], ok[-1][0]
    a, b = samples.get(first), samples.get(last)
    return {
        "sizes": [s for s, _ in ok],
        "log2_lr_opt": opt.tolist(),
        "edges": sorted({c[fit]["edge"] for _, c in ok} - {None}),
        "last_minus_first": float(opt[-1] - opt[0]),
        "last_minus_first_interval": _interval(b - a) if a is not None and b is not None else None,
        "range": float(opt.max() - opt.min()),
        "slope_per_doubling": float(np.polyfit(sizes, opt, 1)[0]),
    }


def _device(run: dict[str, Any]) -> str:
    """The kind of device a run trained on (``cpu``, ``cuda``; ``unrecorded`` if none);
    ``cuda (own order)`` for a GPU run that drew its batches on the GPU (before its
    ``result.json`` recorded ``batch_generator``: a data order of its own)."""
    kind = str(run.get("device", "unrecorded")).split(":")[0]
    own_order = kind == "cuda" and run.get("batch_generator") != "cpu"
    return f"{kind} (own order)" if own_order else kind


def _devices(runs: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``runs`` trained on each kind of device."""
    return dict(sorted(Counter(_device(r) for r in runs).items()))


def _walls(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per kind of device, the shortest and longest wall time (minutes) of the runs that
    trained every horizon in one call (a diverged run stops early; a resumed run's
    ``wall_seconds`` is its last call's)."""
    minutes: dict[str, list[float]] = {}
    for r in runs:
        whole = "wall_seconds" in r and not r.get("resumed", False)
        if whole and not any(h["diverged"] for h in r["horizons"].values()):
            minutes.setdefault(_device(r), []).append(r["wall_seconds"] / 60)
    return {kind: [min(v), max(v)] for kind, v in sorted(minutes.items())}


def summarise(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    axes: dict[tuple[str, int, str], tuple[list[Any], dict[int, Any]]] = {}
    out: dict[str, Any] = {
        "proxy": {"width": setup.proxy[0], "depth": setup.proxy[1]},
        "horizons": list(setup.horizons),
        "bootstrap": BOOTSTRAP,
        "runs": len(results),
        "devices": _devices(results),
        "corpus_fingerprint": one_corpus(results),
        "parametrisations": {},
    }
    for name in setup.parametrisations:
        mine = [r for r in results if r["parametrisation"] == name]
        per_h: dict[str, Any] = {}
        for h in setup.horizons:
            shapes: dict[str, Any] = {}
            seeds: dict[tuple[int, int], Any] = {}
            for width, depth in setup.shapes:
                runs = [r for r in mine if (r["width"], r["depth"]) == (width, depth)]
                if runs:
                    seeds[width, depth] = seed_stats(runs, h)
            sd = _pooled_sd(list(seeds.values()))
            # per fit window (summary key suffix): each shape's bootstrap optima
            samples: dict[str, dict[tuple[int, int], np.ndarray | None]] = {
                suffix: {} for suffix in _WINDOWS
            }
            for width, depth in setup.shapes:
                runs = [r for r in mine if (r["width"], r["depth"]) == (width, depth)]
                grid = sorted((r for r in runs if r["seed"] == 0), key=lambda r: r["log2_lr"])
                if not grid:
                    continue
                x = [float(r["log2_lr"]) for r in grid]
                y = [horizon_loss(r, h) for r in grid]
                fits = {}
                for suffix, k in _WINDOWS.items():
                    fit = fit_optimum(x, y, k)
                    fits[suffix] = {key: v for key, v in fit.items() if key != "points"}
                    rng = _rng(name, width, depth, h, k)
                    samples[suffix][width, depth] = bootstrap(x, y, sd, rng, k)
                trained = [(v, j) for j, v in zip(x, y, strict=True) if math.isfinite(v)]
                lowest = min(trained) if trained else None
                shapes[f"w{width}_d{depth}"] = {
                    "width": width,
                    "depth": depth,
                    "lr_curve": {"log2_lr": x, "val_loss": [_finite(v) for v in y]},
                    "best": None
                    if lowest is None
                    else {"log2_lr": lowest[1], "val_loss": lowest[0]},
                    "fit": fits[""],
                    "interval": _interval(samples[""][width, depth]),
                    "fit_3pt": {
                        **fits["_3pt"],
                        "interval": _interval(samples["_3pt"][width, depth]),
                    },
                    "seeds": seeds.get((width, depth)),
                    "devices": _devices(runs),
                    "wall_minutes": _walls(runs),
                }
            by = {(c["width"], c["depth"]): c for c in shapes.values()}
            keys = {
                "depth": [(d, (setup.width, d)) for d in setup.depths if (setup.width, d) in by],
                "width": [(w, (w, setup.depth)) for w in setup.widths if (w, setup.depth) in by],
            }
            per_h[str(h)] = {"seed_sd": sd, "shapes": shapes}
            for suffix in _WINDOWS:
                for axis, sizes in keys.items():
                    points = [(size, by[key]) for size, key in sizes]
                    drawn = {size: samples[suffix][key] for size, key in sizes}
                    per_h[str(h)][f"{axis}_drift{suffix}"] = _drift(points, drawn, f"fit{suffix}")
                    if not suffix:
                        axes[name, h, axis] = (points, drawn)
        out["parametrisations"][name] = per_h
    for h in setup.horizons:
        for axis in ("depth", "width"):
            _shared_drift(out["parametrisations"], axes, h, axis)
    return out


def _shared_drift(
    per_name: dict[str, Any],
    axes: dict[tuple[str, int, str], tuple[list[Any], dict[int, Any]]],
    horizon: int,
    axis: str,
) -> None:
    """Add ``<axis>_drift_shared`` (the drift over only the sizes whose optimum every
    parametrisation has located, so that drifts compare over one range) to each
    parametrisation whose own drift spans more sizes than that."""
    drifts = {n: p[str(horizon)][f"{axis}_drift"] for n, p in per_name.items()}
    located = [set(d["sizes"]) for d in drifts.values() if d is not None]
    if len(located) < 2:
        return
    shared = set.intersection(*located)
    for name, d in drifts.items():
        if d is None or set(d["sizes"]) == shared:
            continue
        points, samples = axes[name, horizon, axis]
        kept = [(s, c) for s, c in points if s in shared]
        per_name[name][str(horizon)][f"{axis}_drift_shared"] = _drift(kept, samples)


_EDGE_MARK = {None: "", "grid": "*", "diverged": "+"}
"""The tables' mark of an optimum that is not a fit (``fit_optimum``'s ``edge``)."""
_EDGE_MARKER = {"grid": "s", "diverged": "^"}
"""The figure's open marker for the same."""


_DRIFT_ROWS = {"": "", "_shared": " (range all share)", "_3pt": " (3-point fits)"}
"""The drift rows of the tables: key suffix in the summary -> the row's note."""


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _drift_text(d: dict[str, Any] | None) -> str:
    """One drift as a table cell: last - first [95% interval] (first->last)."""
    if d is None:
        return "-"
    iv = d["last_minus_first_interval"]
    marks = "".join(_EDGE_MARK[e] for e in d["edges"])
    interval = "" if iv is None else f" [{iv[0]:+.2f}, {iv[1]:+.2f}]"
    return f"{d['last_minus_first']:+.2f}{marks}{interval} ({d['sizes'][0]}->{d['sizes'][-1]})"


def summary_table(setup: Setup, summary: dict[str, Any]) -> list[str]:
    """Markdown rows comparing the parametrisations at the longest horizon: each one's drift
    of the optimal log2 lr across depth and width (report's and 3-point fits) and its best
    measured loss (the grid's lowest, seed 0: a fit's vertex can lie below every run) at the
    first and last size of each axis (the README quotes these rows)."""
    h = str(max(setup.horizons))
    rows = [
        "| parametrisation | depth drift | 3-point | width drift | 3-point | best loss, "
        "first -> last depth | best loss, first -> last width |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, per_h in summary["parametrisations"].items():
        cell = per_h[h]
        losses = []
        for axis, shape in (
            ("depth", lambda s: (setup.width, s)),
            ("width", lambda s: (s, setup.depth)),
        ):
            d = cell[f"{axis}_drift"]
            ends = [shape(d["sizes"][0]), shape(d["sizes"][-1])] if d else []
            loss = [cell["shapes"][f"w{w}_d{dd}"]["best"]["val_loss"] for w, dd in ends]
            losses.append(" -> ".join(f"{v:.3f}" for v in loss) or "-")
        rows.append(
            f"| {name} | {_drift_text(cell['depth_drift'])} | "
            f"{_drift_text(cell['depth_drift_3pt'])} | {_drift_text(cell['width_drift'])} | "
            f"{_drift_text(cell['width_drift_3pt'])} | {losses[0]} | {losses[1]} |"
        )
    return rows


SHAPE_HEADER = (
    "| parametrisation | width | depth | lrs run | best of the grid | optimal log2 lr | "
    "interval | loss at optimum | 3-point optimum | seeds (mean ± sd) | runs on | "
    "wall per run (min) |"
)
"""The per-shape table's header (tables.md; the study's results.md quotes rows under it)."""


def _shape_row(name: str, c: dict[str, Any]) -> str:
    """One shape's row under ``SHAPE_HEADER``."""
    f, f3, iv, seeds = c["fit"], c["fit_3pt"], c["interval"], c["seeds"]
    js = [int(j) for j in c["lr_curve"]["log2_lr"]]
    b = c["best"]
    best = "all diverged" if b is None else f"2^{b['log2_lr']:.0f}: {b['val_loss']:.3f}"
    seed_text = (
        f"{_fmt(seeds['mean'], '.3f')} ± {_fmt(seeds['sd'], '.3f')} (n={seeds['n']})"
        if seeds
        else "-"
    )
    cells = [
        name,
        str(c["width"]),
        str(c["depth"]),
        f"{len(js)}: 2^{js[0]} to 2^{js[-1]}",
        best,
        f"{_fmt(f['log2_lr'])}{_EDGE_MARK[f['edge']]}",
        "-" if iv is None else f"[{iv[0]:.2f}, {iv[1]:.2f}]",
        _fmt(f["loss"], ".3f"),
        f"{_fmt(f3['log2_lr'])}{_EDGE_MARK[f3['edge']]}",
        seed_text,
        ", ".join(f"{k} {n}" for k, n in c["devices"].items()),
        "; ".join(f"{k} {lo:.1f}-{hi:.1f}" for k, (lo, hi) in c["wall_minutes"].items()) or "-",
    ]
    return "| " + " | ".join(cells) + " |"


def shape_table(summary: dict[str, Any], horizon: str) -> list[str]:
    """Markdown rows, one per parametrisation and shape at ``horizon``: the lrs run, the grid's
    best, the fitted optima, the seeds, where the runs trained and how long they took."""
    lines = [SHAPE_HEADER, "|" + "---|" * SHAPE_HEADER.count(" | ") + "---|"]
    for name, per_h in summary["parametrisations"].items():
        lines += [_shape_row(name, c) for c in per_h[horizon]["shapes"].values()]
    return lines


def tables(setup: Setup, summary: dict[str, Any]) -> str:
    h = str(max(setup.horizons))
    lines = [
        f"# Transfer study: tables (horizon {h} steps; generated by report.py)",
        "",
        "Which parametrisation transfers: the drift of the optimal log2 lr from the first to "
        "the last size run on each axis (report's fit and 3-point fits; [ ] = 95% bootstrap "
        "interval, absent without seeds to give a seed-to-seed sd), and the best measured "
        "loss (the grid's lowest, seed 0) at the two ends.",
        "",
        *summary_table(setup, summary),
        "",
        f"Base lr tuned at width {setup.proxy[0]}, depth {setup.proxy[1]}; optimum = quadratic "
        "fit in log2(lr); [ ] = 95% bootstrap interval; * = lowest point at a grid edge (a "
        "better lr may lie beyond); + = the next lr diverged (the optimum is bounded by "
        "divergence, not fitted). 3-point optimum: the same fit through the lowest point and "
        "one neighbour on each side at every shape (one window everywhere, so that shapes "
        "with fewer lrs run compare like for like). Runs on: the devices its runs trained on "
        "(each `result.json` records its device and whether it compiled; every run reads the "
        "same corpus bytes); a GPU run draws the CPU's training batches, except those marked "
        "`cuda (own order)`, which drew theirs on the GPU (the sampler before 2026-11-28): "
        "they differ from a CPU run of one configuration as two seeds do, and far more next "
        "to divergence (measured in results.md). Wall per run: "
        "`result.json`'s `wall_seconds` of the runs that trained every horizon in one call "
        "(resumed runs left out), by device; "
        "a record of the load the runs shared their machine with, not a benchmark.",
        "",
        *shape_table(summary, h),
    ]
    lines += [
        "",
        "| parametrisation | axis | drift (last - first) | interval | range | slope per doubling |",
        "|---|---|---|---|---|---|",
    ]
    for name, per_h in summary["parametrisations"].items():
        for axis in ("depth", "width"):
            for label, note in _DRIFT_ROWS.items():
                d = per_h[h].get(f"{axis}_drift{label}")
                if d is None:
                    continue
                iv = d["last_minus_first_interval"]
                lines.append(
                    f"| {name} | {axis} {d['sizes'][0]}->{d['sizes'][-1]}{note} | "
                    f"{d['last_minus_first']:+.2f}"
                    f"{''.join(_EDGE_MARK[e] for e in d['edges'])} | "
                    f"{'-' if iv is None else f'[{iv[0]:+.2f}, {iv[1]:+.2f}]'} | "
                    f"{d['range']:.2f} | {d['slope_per_doubling']:+.2f} |"
                )
    return "\n".join(lines) + "\n"


def figures(setup: Setup, summary: dict[str, Any], folder: Path) -> None:
    """Per parametrisation, mup-style: loss against log2(base lr), one curve per depth (left)
    and per width (right), the fitted optimum marked; and the optima against depth and width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    h = str(max(setup.horizons))
    for name, per_h in summary["parametrisations"].items():
        shapes = per_h[h]["shapes"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, axis in zip(axes, ("depth", "width"), strict=True):
            sizes = setup.depths if axis == "depth" else setup.widths
            cmap = plt.get_cmap("viridis")
            for i, s in enumerate(sizes):
                key = f"w{setup.width}_d{s}" if axis == "depth" else f"w{s}_d{setup.depth}"
                c = shapes.get(key)
                if c is None:
                    continue
                colour = cmap(i / max(1, len(sizes) - 1))
                x = np.asarray(c["lr_curve"]["log2_lr"], float)
                y = np.array([np.nan if v is None else v for v in c["lr_curve"]["val_loss"]])
                ax.plot(x, y, "o-", color=colour, label=f"{axis} {s}")
                f = c["fit"]
                if f["log2_lr"] is not None and not f["at_edge"]:
                    # at its log2 lr on the measured curve: the parabola's own value can lie
                    # below every run, a loss no run reached
                    ok = np.isfinite(y)
                    on_curve = np.interp(f["log2_lr"], x[ok], y[ok])
                    ax.plot([f["log2_lr"]], [on_curve], "x", color=colour, ms=9)
            fixed = f"width {setup.width}" if axis == "depth" else f"depth {setup.depth}"
            ax.set_title(f"{name}: across {axis} ({fixed})")
            ax.set_xlabel("log2(base lr)")
            ax.legend(fontsize=8)
        axes[0].set_ylabel(f"validation loss at {h} steps (nats/byte)")
        note = "seed 0; x: fitted optimum (its lr, on the measured curve); missing points diverged"
        fig.text(0.01, 0.01, note, fontsize=7)
        fig.tight_layout()
        with atomic_path(folder / f"loss_vs_lr_{name}.png") as tmp:
            fig.savefig(tmp, dpi=90, format="png")
        plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, per_h in summary["parametrisations"].items():
        for ax, axis in zip(axes, ("depth", "width"), strict=True):
            # the 3-point fits: one window at every shape, so that shapes with more lrs run
            # (5-point fits) do not move against those with fewer (as tables.md compares)
            d = per_h[h][f"{axis}_drift_3pt"]
            if d is None:
                continue
            keys = [
                f"w{setup.width}_d{s}" if axis == "depth" else f"w{s}_d{setup.depth}"
                for s in d["sizes"]
            ]
            ivs = [per_h[h]["shapes"][k]["fit_3pt"]["interval"] for k in keys]
            lo = [o - iv[0] if iv else 0.0 for o, iv in zip(d["log2_lr_opt"], ivs, strict=True)]
            hi = [iv[1] - o if iv else 0.0 for o, iv in zip(d["log2_lr_opt"], ivs, strict=True)]
            line = ax.errorbar(d["sizes"], d["log2_lr_opt"], yerr=[lo, hi], marker="o",
                               capsize=3, label=name)  # fmt: skip
            # an optimum that is not a fit (a grid edge: a better lr may lie beyond; or next
            # to a diverged lr): an open marker, as tables.md's * and +
            for size, opt, k in zip(d["sizes"], d["log2_lr_opt"], keys, strict=True):
                fit = per_h[h]["shapes"][k]["fit_3pt"]
                if fit["at_edge"]:
                    ax.plot([size], [opt], _EDGE_MARKER[fit["edge"]], ms=10, mfc="white",
                            color=line[0].get_color())  # fmt: skip
    for ax, axis in zip(axes, ("depth", "width"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:  # no optimum located on this axis yet
            ax.text(0.5, 0.5, "no optimum located", ha="center", transform=ax.transAxes)
    axes[0].set_ylabel("optimal log2(base lr), 3-point fit")
    fig.text(
        0.01, 0.01, "3-point fits (the lowest lr and one neighbour each side), 95% bootstrap "
        "intervals; open square: lowest lr at a grid edge (a better lr may lie beyond);\nopen "
        "triangle: the next lr diverged (bounded, not fitted); a shape whose lrs all diverged "
        "has no point", fontsize=7,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    with atomic_path(folder / "optimum_drift.png") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


HERE = Path(__file__).parent
DRIFTS = HERE.parents[1] / "simulations" / "data" / "transfer_drifts.json"
"""The measured drifts as package data (``simulations.transfer_lr`` reads them)."""
DEVICE_CHECK = "device_check"
"""The folder (in the study's) of the GPU reruns of CPU runs and CPU reruns of GPU runs."""
TARGET = 0.5
"""The transfer target for ``shaped_t`` (README.md): the optimum moves by at most this much in
log2(lr) across depth."""
LONG_HORIZON = HERE.parent / "long_horizon" / "runs.jsonl"
"""The long-horizon study's runs (the cross-checks at depths 16 and 64)."""

DESCRIPTION = {
    "shaped_t": "The SDE's gamma rule: the shaped Transformer with `gamma^2 d / n` held fixed, "
    "muP's per-group rule across width, nothing in depth",
    "shaped": "A fixed gamma: the shaped Transformer with gamma fixed at every depth and width, "
    "muP's per-group rule across width (the control for `shaped_t`'s gamma rule)",
    "pre_ln": "GPT-2's block in standard parametrisation: GPT-2's init (`N(0, 0.02^2)`, output "
    "projections `0.02/sqrt(2d)`), one lr for every parameter, no branch multiplier",
    "pre_ln_depth_mup": "Depth-muP: pre-LN with a `1/sqrt(d)` branch multiplier, `1/fan_in` "
    "init and Tensor Programs VI's Adam rule",
    "pre_ln_completep": "CompleteP: pre-LN with a `1/d` branch multiplier, `1/fan_in` init and "
    "its Adam rule (hidden matrices at `lr * n0 / n`, constant in depth)",
}
"""Each parametrisation in words (docs/guide/transfer.md has the rules)."""


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _nums(values: list[float], spec: str = ".3f") -> str:
    return _and([format(v, spec) for v in values])


def _iv(iv: list[float] | None, label: str = "95% bootstrap ") -> str:
    return "" if iv is None else f" ({label}[{iv[0]:+.2f}, {iv[1]:+.2f}])"


def _resolved(d: dict[str, Any]) -> str:
    """Whether a drift's interval excludes no drift."""
    iv = d["last_minus_first_interval"]
    if iv is None:
        return "no interval: an end's optimum is not a fit"
    return "resolved: its interval excludes 0" if iv[0] > 0 or iv[1] < 0 else "not resolved"


def _trend(values: list[float], sizes: list[int], axis: str) -> str:
    """How a loss moves along an axis: falls, grows, or is lowest inside it."""
    if all(b < a for a, b in itertools.pairwise(values)):
        return f"falls with {axis}"
    if all(b > a for a, b in itertools.pairwise(values)):
        return f"grows with {axis}"
    i = int(np.argmin(values))
    return (
        f"is lowest at {axis} {sizes[i]} and {100 * (values[-1] / values[i] - 1):.0f}% above "
        f"that at {axis} {sizes[-1]}"
    )


def _axis(setup: Setup, axis: str, size: int) -> tuple[int, int]:
    return (setup.width, size) if axis == "depth" else (size, setup.depth)


def _shape(cell: dict[str, Any], setup: Setup, axis: str, size: int) -> dict[str, Any]:
    width, depth = _axis(setup, axis, size)
    return cell["shapes"][f"w{width}_d{depth}"]


def _pick(results: list[dict[str, Any]], name: str, width: int, depth: int) -> list[dict]:
    return [
        r for r in results if (r["parametrisation"], r["width"], r["depth"]) == (name, width, depth)
    ]


def _gamma_load(run: dict[str, Any]) -> float:
    """``gamma^2 d / n`` of a run's model."""
    c = run["model_config"]
    return float(c["config.gamma"] ** 2 * c["config.depth"] / c["config.width"])


def _axis_bullets(setup: Setup, name: str, cell: dict[str, Any], axis: str) -> list[str]:
    """The optimum and the best loss of one parametrisation along one axis."""
    d, d3 = cell[f"{axis}_drift"], cell[f"{axis}_drift_3pt"]
    if d is None:
        return []
    sizes = d["sizes"]
    shapes = [_shape(cell, setup, axis, s) for s in sizes]
    grid = [c["best"]["log2_lr"] for c in shapes]
    best = "the best lr of the grid is " + (
        f"2^{grid[0]:.0f} at every {axis}"
        if len(set(grid)) == 1
        else _and([f"2^{j:.0f}" for j in grid]) + f" at {axis}s {_and([str(s) for s in sizes])}"
    )
    fixed = f"width {setup.width}" if axis == "depth" else f"depth {setup.depth}"
    fits = [c["fit"]["log2_lr"] for c in shapes]
    fits3 = [c["fit_3pt"]["log2_lr"] for c in shapes]
    marks = "".join(_EDGE_MARK[e] for e in d["edges"])
    moves = (
        f"**Across {axis} ({fixed}) the optimum moves by {d['last_minus_first']:+.2f}{marks} "
        f"from {axis} {sizes[0]} to {sizes[-1]}**{_iv(d['last_minus_first_interval'])}, "
        f"{d['slope_per_doubling']:+.2f} per doubling ({_resolved(d)}); the report's fits are "
        f"{_nums(fits, '.2f')} at {axis}s {_and([str(s) for s in sizes])}; {best}. The 3-point "
        f"fits ({_nums(fits3, '.2f')}) move by {d3['last_minus_first']:+.2f}"
        f"{_iv(d3['last_minus_first_interval'], '')}, {d3['slope_per_doubling']:+.2f} per "
        f"doubling ({_resolved(d3)})."
    )
    edges = [s for s, c in zip(sizes, shapes, strict=True) if c["fit"]["edge"]]
    if edges:
        moves += (
            f" At {axis} {_and([str(s) for s in edges])} the lowest point is "
            + _and(
                [
                    f"{'at a grid edge' if c['fit']['edge'] == 'grid' else 'next to a diverged lr'}"
                    for c in shapes
                    if c["fit"]["edge"]
                ]
            )
            + " (marked; the drift there is a bound)."
        )
    losses = [c["best"]["val_loss"] for c in shapes]
    loss = (
        f"The best loss {_trend(losses, sizes, axis)} ({_nums(losses)} at {axis}s "
        f"{_and([str(s) for s in sizes])}; the grid's lowest, seed 0)."
    )
    return [moves, loss]


def _seed_bullet(setup: Setup, name: str, cell: dict[str, Any], results: list[dict]) -> str:
    parts = []
    for depth in setup.seed_depths:
        c = cell["shapes"].get(f"w{setup.width}_d{depth}")
        seeds = c and c["seeds"]
        if not seeds or seeds["mean"] is None:
            continue
        part = (
            f"{seeds['mean']:.3f} ± {_fmt(seeds['sd'], '.3f')} (n={seeds['n']}) at depth {depth} "
            f"(2^{seeds['log2_lr']})"
        )
        if seeds["n"] > len(setup.seeds):
            runs = sorted(
                (
                    r
                    for r in _pick(results, name, setup.width, depth)
                    if r["log2_lr"] == seeds["log2_lr"]
                ),
                key=lambda r: r["seed"],
            )
            v = [horizon_loss(r, max(setup.horizons)) for r in runs]
            first = float(np.std(v[: len(setup.seeds)], ddof=1))
            part += (
                f": seeds {runs[0]['seed']} to {runs[-1]['seed']} reach {_nums(v)}; the plan's "
                f"{len(setup.seeds)} gave sd {first:.3f}, seed {runs[int(np.argmax(v))]['seed']} "
                "the highest"
            )
        parts.append(part)
    if not parts:
        return ""
    return f"Seeds at the best lr of the seeded depths: {'; '.join(parts)}; pooled sd " + (
        f"{_fmt(cell['seed_sd'], '.3f')}, the sd behind the intervals."
    )


def _divergence_bullet(setup: Setup, name: str, results: list[dict]) -> str:
    """The largest lr that trains and the lrs that diverge at each depth (seed 0)."""
    h = str(max(setup.horizons))
    rows = []
    for depth in setup.depths:
        runs = [r for r in _pick(results, name, setup.width, depth) if r["seed"] == 0]
        bad = sorted((r for r in runs if r["horizons"][h]["diverged"]), key=lambda r: r["log2_lr"])
        ok = [r["log2_lr"] for r in runs if not r["horizons"][h]["diverged"]]
        if not bad:
            continue
        js = [r["log2_lr"] for r in bad]
        steps = [r["horizons"][h]["diverged_step"] or 0 for r in bad]
        lrs = f"2^{js[0]}" if len(js) == 1 else f"2^{js[0]} to 2^{js[-1]}"
        top = f"2^{max(ok)} trains, " if ok else "every lr diverged: "
        rows.append(f"depth {depth}: {top}{lrs} diverge (by step {max(steps)})")
    if not rows:
        return "No lr diverged at any depth."
    return "The largest stable lr: " + "; ".join(rows) + "."


def _horizon_bullet(setup: Setup, per_h: dict[str, Any]) -> str:
    drifts = [(h, per_h[str(h)]["depth_drift"]) for h in setup.horizons]
    drifts = [(h, d) for h, d in drifts if d is not None]
    if len(drifts) < 2:
        return ""
    text = _and(
        [
            f"{d['last_minus_first']:+.2f}{''.join(_EDGE_MARK[e] for e in d['edges'])} at {h} steps"
            for h, d in drifts
        ]
    )
    more = abs(drifts[0][1]["last_minus_first"]) > abs(drifts[-1][1]["last_minus_first"])
    tail = " (a rule read off short runs would over-correct for depth)" if more else ""
    return f"The depth drift at each horizon (report's fits): {text}{tail}."


def _long_horizon(depth: int, horizon: int) -> dict[str, tuple[float, float, float | None]]:
    """The long-horizon study's models at ``depth``: seed 0's best loss at ``horizon``, its lr
    and the model's ``gamma^2 d / n`` (None: not a shaped model); empty without that study."""
    from simulations.studies import RunStore

    out: dict[str, tuple[float, float, float | None]] = {}
    for r in RunStore(LONG_HORIZON).results():
        if r["depth"] != depth or r["seed"] != 0 or r.get("schedule", "wsd") != "wsd":
            continue
        v = horizon_loss(r, horizon)
        shaped = r["model_config"]["config.attention"] == "shaped"
        if math.isfinite(v) and v < out.get(r["model_name"], (math.inf,))[0]:
            out[r["model_name"]] = (v, r["lr"], _gamma_load(r) if shaped else None)
    return out


def _comparison(setup: Setup, summary: dict[str, Any]) -> list[str]:
    """The verdicts under the comparison table: which parametrisation's optimum moves least
    on each axis (3-point fits), and how the others move."""
    h = str(max(setup.horizons))
    cells = {n: p[h] for n, p in summary["parametrisations"].items()}
    out = []
    least = {}
    for axis in ("depth", "width"):
        drifts = {n: c[f"{axis}_drift_3pt"] for n, c in cells.items() if c[f"{axis}_drift_3pt"]}
        if drifts:
            least[axis] = min(drifts, key=lambda n: abs(drifts[n]["last_minus_first"]))
    if least and len(set(least.values())) == 1:
        name = next(iter(least.values()))
        axes = [
            f"across {a} {cells[name][f'{a}_drift_3pt']['last_minus_first']:+.2f}" for a in least
        ]
        out.append(
            f"**`{name}` transfers best of the {len(cells)}**: in 3-point fits (one window at "
            f"every shape) its optimum moves least on both axes ({_and(axes)})."
        )
    else:
        out += [
            f"**Across {a}, `{n}`'s optimum moves least** (3-point fits)." for a, n in least.items()
        ]
    for axis in ("depth", "width"):
        drifts = {n: c[f"{axis}_drift_3pt"] for n, c in cells.items() if c[f"{axis}_drift_3pt"]}
        if len(drifts) > 1:
            most = max(drifts, key=lambda n: abs(drifts[n]["last_minus_first"]))
            out.append(
                f"**Across {axis}, `{most}`'s optimum moves most** "
                f"({drifts[most]['last_minus_first']:+.2f}, 3-point fits)."
            )
    for name, c in cells.items():
        parts = []
        for axis in ("depth", "width"):
            d = c[f"{axis}_drift_3pt"]
            if d is None:
                continue
            word = "falls" if d["last_minus_first"] < 0 else "rises"
            parts.append(
                f"{word} by {abs(d['last_minus_first']):.2f} across {axis} ({d['sizes'][0]}->"
                f"{d['sizes'][-1]}, {_resolved(d)})"
            )
        if parts:
            out.append(f"`{name}`: its optimum {'; '.join(parts)}.")
    seed_sd = {n: c["seed_sd"] for n, c in cells.items() if c["seed_sd"] is not None}
    if len(seed_sd) > 1:
        top = sorted(seed_sd, key=seed_sd.get, reverse=True)
        out.append(
            f"The seed-to-seed sd (pooled) is largest for `{top[0]}`, {seed_sd[top[0]]:.3f}, "
            f"{seed_sd[top[0]] / seed_sd[top[1]]:.1f} times the next (`{top[1]}`, "
            f"{seed_sd[top[1]]:.3f}): its intervals are the widest."
        )
    return [f"- {line}" for line in out]


def _same_at_proxy(setup: Setup, summary: dict, results: list[dict]) -> list[str]:
    """A parametrisation whose runs at the proxy's depth are another's: how close they are."""
    h = max(setup.horizons)
    out = []
    for name, same in SAME_AT_PROXY_DEPTH.items():
        if not {name, same} <= set(setup.parametrisations):
            continue  # a study restricted to part of the plan
        mine = {(r["log2_lr"], r["seed"]): r for r in _pick(results, name, *setup.proxy)}
        theirs = {(r["log2_lr"], r["seed"]): r for r in _pick(results, same, *setup.proxy)}
        both = sorted(set(mine) & set(theirs))
        if not both:
            continue
        gaps = {}
        for key in both:
            a = [horizon_loss(mine[key], t) for t in setup.horizons]
            b = [horizon_loss(theirs[key], t) for t in setup.horizons]
            gaps[key] = max(
                abs(x - y) if math.isfinite(x - y) else math.inf for x, y in zip(a, b, strict=True)
            )
        equal = [k[0] for k in both if gaps[k] == 0]
        near = [k for k in both if 0 < gaps[k] < 1e-5]
        far = [k for k in both if gaps[k] >= 1e-5]
        parts = []
        if equal:
            parts.append(f"to the last bit at {_and([f'2^{j}' for j in equal])}")
        if near:
            parts.append(
                f"within {max(gaps[k] for k in near):.1e} at {_and([f'2^{k[0]}' for k in near])}"
            )
        for key in far:
            parts.append(
                f"apart at 2^{key[0]}: {horizon_loss(mine[key], h):.3f} against "
                f"{horizon_loss(theirs[key], h):.3f} at {h} steps"
            )
        c = summary["parametrisations"]
        shape = f"w{setup.proxy[0]}_d{setup.proxy[1]}"
        fits = [c[n][str(h)]["shapes"][shape]["fit"]["log2_lr"] for n in (name, same)]
        fits3 = [c[n][str(h)]["shapes"][shape]["fit_3pt"]["log2_lr"] for n in (name, same)]
        out.append(
            f"**At the proxy (width {setup.proxy[0]}, depth {setup.proxy[1]}) `{name}`'s runs "
            f"reproduce `{same}`'s** (the branch multiplier and every lr factor are 1 for both: "
            f"the same model), at every horizon {'; '.join(parts)}. Runs on two machines differ "
            "by rounding, which grows large next to divergence. The report's fits there are "
            f"{fits[0]:.2f} and {fits[1]:.2f}, the 3-point fits {fits3[0]:.2f} and "
            f"{fits3[1]:.2f}. The study does not plan `{name}`'s width axis (`{same}`'s)."
        )
    return out


def _device_check(setup: Setup, out: Path, summary: dict, results: list[dict]) -> list[str]:
    """The same configuration on the CPU and on a GPU (``device_check/``): below the optimum
    the same run up to rounding when the GPU draws the CPU's batches, far apart next to
    divergence whatever the batches."""
    folder = out / DEVICE_CHECK
    h = str(max(setup.horizons))
    summarised = summary["parametrisations"]
    checks = [
        c
        for c in (json.loads(p.read_text()) for p in sorted(folder.glob("*.json")))
        if f"w{c['width']}_d{c['depth']}"
        in summarised.get(c["parametrisation"], {}).get(h, {}).get("shapes", {})
    ]  # only the shapes this report summarises (a study restricted to part of the plan)
    if not checks:
        return []
    study = {
        (r["parametrisation"], r["width"], r["depth"], r["log2_lr"], r["seed"]): r for r in results
    }
    keys = sorted(
        {(c["parametrisation"], c["width"], c["depth"], c["log2_lr"], c["seed"]) for c in checks},
        key=lambda k: (-k[2], k[3]),
    )
    rows = [
        "| run, seed 0 | CPU | GPU, own order | GPU, CPU's batches |",
        "|---|---|---|---|",
    ]
    own, same = [], []
    for key in keys:
        runs = [
            c
            for c in checks
            if (c["parametrisation"], c["width"], c["depth"], c["log2_lr"], c["seed"]) == key
        ]
        if key in study:
            runs.append(study[key])
        loss = {_device(r): r["horizons"][h]["val_loss"] for r in runs}
        cpu = loss.get("cpu")
        if cpu is None:
            continue
        cells = []
        for kind, where in (("cuda (own order)", own), ("cuda", same)):
            v = loss.get(kind)
            if v is None:
                cells.append("-")
                continue
            where.append((key, abs(v - cpu)))
            cells.append(f"{v:.4f} ({abs(v - cpu):.1e} apart)")
        name, width, depth, j, _ = key
        rows.append(f"| `{name}` w{width} d{depth}, 2^{j} | {cpu:.4f} | {' | '.join(cells)} |")
    text = [
        "A GPU run that draws its batches on the GPU (`cuda (own order)` in the tables) "
        "follows another data order than the CPU run of one configuration, from the same "
        "weights; from the trainer's CPU batch generator on (`batch_generator: cpu` in "
        "`result.json`) it draws the CPU's batches. The same configurations on both "
        f"(`{DEVICE_CHECK}/` and the study's runs), validation loss at {h} steps:",
        "",
        *rows,
        "",
    ]
    best = {}
    for (name, width, depth, *_), _gap in same + own:
        c = summarised[name][h]["shapes"][f"w{width}_d{depth}"]
        best[name, width, depth] = c["best"]["log2_lr"]
    near = [g for k, g in same if abs(k[3] - best[k[:3]]) <= 2 and k[3] < best[k[:3]]]
    edge = [g for k, g in same + own if k[3] > best[k[:3]]]
    if near and edge:
        text.append(
            f"- **Below the optimum a GPU run with the CPU's batches is the CPU run up to "
            f"rounding** ({max(near):.1e} or less at {h} steps); **above it, next to "
            f"divergence, the two are {min(edge):.2f} to {max(edge):.2f} apart**, with the CPU's "
            "batches or without: a loss at the edge of stability carries a device-to-device "
            "spread whatever the batches, as it carries a machine-to-machine one. The 3-point "
            "fits, which stay at the optimum and its neighbours, are the ones to compare "
            "across devices."
        )
    swapped = _swap_fits(setup, summary, checks, results)
    if swapped:
        text.append(swapped)
    return text


REFERENCE_FIGURE = "figures/completep_reference.png"
"""The figure of :func:`reference_summary` (in the study's folder)."""


def _peak_logit(run: dict[str, Any], horizon: str) -> float | None:
    """The largest attention logit of a run over its training to ``horizon``, every block and
    head (None: its result predates the record, or no block has softmax logits)."""
    record = run["horizons"].get(horizon, {}).get("max_logit")
    peaks = [v for v in (record or {}).get("peak", []) if v is not None]
    return max(peaks) if peaks else None


def reference_summary(setup: Setup, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """CompleteP as its reference runs it: each :data:`study.VARIANTS` entry that has run and
    :data:`REFERENCE_BASELINE`, summarised like the study (:func:`summarise`) on the depth
    axis over only the depths and base lrs the variants have run, seed 0 (like for like,
    while the variants' grids are partial; one seed: no intervals), with each run's largest
    attention logit (``max_logit``, None where not recorded) and the runs still planned
    (None: no variant has run)."""
    from study import plan  # type: ignore[import-not-found]  # beside this script

    def mine(r: dict[str, Any]) -> bool:
        return r["width"] == setup.width and r["seed"] == 0

    ran = [r for r in results if r["parametrisation"] in VARIANTS and mine(r)]
    if not ran:
        return None
    names = [n for n in VARIANTS if any(r["parametrisation"] == n for r in ran)]
    depths = sorted({r["depth"] for r in ran})
    lrs = sorted({r["log2_lr"] for r in ran})
    base = [
        r
        for r in results
        if r["parametrisation"] == REFERENCE_BASELINE
        and mine(r)
        and r["depth"] in depths
        and r["log2_lr"] in lrs
    ]
    sub = replace(
        setup,
        parametrisations=(REFERENCE_BASELINE, *names),
        depths=tuple(depths),
        widths=(),
        seed_depths=(),
    )
    h = str(max(setup.horizons))
    logits = {
        name: {
            f"d{d}": {
                str(r["log2_lr"]): _peak_logit(r, h)
                for r in ran + base
                if (r["parametrisation"], r["depth"]) == (name, d)
            }
            for d in depths
        }
        for name in sub.parametrisations
    }
    by_cell: dict[tuple[str, int], list[dict[str, Any]]] = {}  # every seed, at this width
    for r in results:
        if r["width"] == setup.width:
            by_cell.setdefault((r["parametrisation"], r["depth"]), []).append(r)
    seeds = {
        name: {
            f"d{d}": seed_stats(by_cell[name, d], int(h)) for d in depths if (name, d) in by_cell
        }
        for name in sub.parametrisations
    }
    full = replace(setup, parametrisations=tuple(VARIANTS))
    return {
        "depths": depths,
        "log2_lrs": lrs,
        "runs": len(ran),
        "planned": len(plan(full, results)),
        "parametrisations": summarise(sub, base + ran)["parametrisations"],
        "max_logit": logits,
        "seeds": seeds,
    }


_FITS = ("fit", "fit_3pt")
"""The report's and the 3-point fit of a shape (its summary keys)."""


def _at_depth(cell: dict[str, Any], width: int, depth: int) -> dict[str, Any]:
    """One depth of a depth-axis cell at ``width`` ({} where it has not run; ``_shape`` raises)."""
    return cell["shapes"].get(f"w{width}_d{depth}") or {}


def _ends(cell: dict[str, Any], depths: list[int], width: int, fit: str) -> list[dict] | None:
    """A depth axis's optimum (``fit``) at the first and the last of ``depths`` (None: one of
    them not located)."""
    ends = [_at_depth(cell, width, d).get(fit) for d in (depths[0], depths[-1])]
    return None if any(e is None or e["log2_lr"] is None for e in ends) else ends


def _moved(cell: dict[str, Any], depths: list[int], width: int, fit: str) -> str:
    """How far a depth axis's optimum (``fit``) moves from the first of ``depths`` to the last,
    with the tables' marks of an optimum that is not a fit ("-": one of them not located)."""
    if (ends := _ends(cell, depths, width, fit)) is None:
        return "-"
    marks = "".join(sorted({_EDGE_MARK[e["edge"]] for e in ends}))
    return f"{ends[1]['log2_lr'] - ends[0]['log2_lr']:+.2f}{marks}"


def _located(cell: dict[str, Any], width: int, depth: int) -> dict[str, Any] | None:
    """The 3-point fit of ``cell``'s optimum at ``depth`` if it lies inside its grid."""
    fit = _at_depth(cell, width, depth).get("fit_3pt")
    return fit if fit and fit["log2_lr"] is not None and fit["edge"] is None else None


def _up_to_located(cell: dict[str, Any], depths: list[int], width: int) -> list[int] | None:
    """``depths`` up to the deepest where ``cell``'s optimum is inside its grid; None where
    fewer than two are (no drift between located optima)."""
    inside = [d for d in depths if _located(cell, width, d)]
    return depths[: depths.index(inside[-1]) + 1] if len(inside) > 1 else None


def _reference_verdict(per: dict[str, dict[str, Any]], setup: Setup) -> list[str]:
    """Whether ``REFERENCE_BASELINE``'s depth drift was its recipe: the drift (3-point fits, the
    window of the headline drift and the only one a variant's 3 lrs allow) of the whole recipe
    and of each change alone against the baseline's on the same depths, the changes ranked by
    how near zero each leaves it, and whether the recipe trains as well (best loss at each
    depth); only drifts fitted inside the grid at both ends count."""
    width, base, whole = setup.width, per[REFERENCE_BASELINE], per.get("pre_ln_completep_ref")
    if whole is None or whole["depth_drift"] is None:
        return []

    # the depths the recipe ran, compared up to the deepest where its optimum is inside the grid
    ran = whole["depth_drift"]["sizes"]
    sizes = _up_to_located(whole, ran, width)
    if sizes is None:
        return []

    def drift(cell: dict[str, Any], depths: list[int] = sizes) -> float | None:
        first, last = _located(cell, width, depths[0]), _located(cell, width, depths[-1])
        return None if first is None or last is None else last["log2_lr"] - first["log2_lr"]

    d_base, d_whole = drift(base), drift(whole)
    if d_base is None or d_whole is None:
        return []
    kept = abs(d_whole) / abs(d_base) if d_base else math.inf
    said = (
        "most of it was the recipe"
        if kept < 0.5
        else "part of it was the recipe"
        if kept < 0.9
        else "it holds with the recipe"
    )

    # the compared depths each model ran; the models with two or more of them; each change's
    # drift up to the deepest of them where its optimum is inside its grid (as the recipe's)
    own = {
        n: [d for d in sizes if _at_depth(c, width, d).get("best") is not None]
        for n, c in per.items()
    }
    compared = [n for n in per if n != REFERENCE_BASELINE and len(own[n]) > 1]
    changes = [n for n in compared if n != "pre_ln_completep_ref"]
    spans = {n: _up_to_located(per[n], own[n], width) for n in changes}
    alone = {
        n: (d, span[-1])
        for n, span in spans.items()
        if span is not None and (d := drift(per[n], span)) is not None
    }
    ranked = sorted(alone, key=lambda n: abs(alone[n][0]))
    unlocated = [f"`{n}`" for n in changes if n not in alone]
    lower = [
        n
        for n in compared
        if all(
            (theirs := _at_depth(base, width, d).get("best")) is not None
            and _at_depth(per[n], width, d)["best"]["val_loss"] < theirs["val_loss"]
            for d in own[n][-2:]
        )
    ]
    each = [
        f"`{n}` {alone[n][0]:+.2f}"
        + ("" if alone[n][1] == sizes[-1] else f" (to depth {alone[n][1]})")
        for n in ranked
    ]
    text = (
        f"**Was the drift the recipe?** From depth {sizes[0]} to {sizes[-1]} (seed 0, 3-point "
        f"fits) `{REFERENCE_BASELINE}`'s optimum moves {d_base:+.2f} octaves and with its "
        f"reference's whole recipe {d_whole:+.2f}: {said} ({100 * kept:.0f}% of the drift is "
        "left)."
        + (" Each change alone, nearest zero first: " + ", ".join(each) if each else "")
        + (f" (an optimum not inside the grid: {_and(unlocated)})" if unlocated else "")
        + ("." if each or unlocated else "")
        + f" The whole recipe's best losses are {_best_losses(whole, sizes, width)} against "
        f"{_best_losses(base, sizes, width)}"
    )
    text += (
        "; lower than the baseline's at the two deepest depths each ran: "
        + ", ".join(f"`{n}`" for n in lower)
        + "."
        if lower
        else "; no change is lower than the baseline's at the two deepest depths each ran."
    )
    for d in ran[len(sizes) :]:
        best = _at_depth(whole, width, d)["best"]
        text += (
            f" At depth {d} the recipe's optimum is not inside its grid yet (best measured "
            f"2^{best['log2_lr']:g}: {best['val_loss']:.3f})."
        )
    if max(sizes) < max(setup.depths):
        text += (
            f" Depth {max(sizes)} is the deepest with a located optimum: whether this holds "
            f"to depth {max(setup.depths)}, the depth axis's end, is open."
        )
    return [text]


def _best_losses(cell: dict[str, Any], depths: list[int], width: int) -> str:
    """The lowest loss run at each of ``depths`` ("-": none there), "a / b / c"."""
    best = [_at_depth(cell, width, d).get("best") for d in depths]
    return " / ".join("-" if b is None else f"{b['val_loss']:.3f}" for b in best)


def _reference_section(setup: Setup, summary: dict[str, Any]) -> list[str]:
    """``results.md``'s section on :func:`reference_summary` (none before a variant has run)."""
    ref = summary.get("completep_reference")
    if ref is None:
        return []
    h = str(max(setup.horizons))
    depths, lrs = ref["depths"], ref["log2_lrs"]
    per = {name: p[h] for name, p in ref["parametrisations"].items()}
    rows = [
        "| model | depth | " + " | ".join(f"2^{j}" for j in lrs) + " | optimum (fit, 3-point) |",
        "|---|---|" + "---|" * len(lrs) + "---|",
    ]
    for name, cell in per.items():
        for d in depths:
            c = cell["shapes"].get(f"w{setup.width}_d{d}")
            if c is None:
                continue
            loss = dict(zip(c["lr_curve"]["log2_lr"], c["lr_curve"]["val_loss"], strict=True))
            top = ref["max_logit"][name][f"d{d}"]
            cells = []
            for j in lrs:
                v, t = loss.get(float(j)), top.get(str(j))
                text = "-" if float(j) not in loss else ("div." if v is None else f"{v:.3f}")
                cells.append(text + ("" if t is None else f" ({t:.0f})"))
            fits = f"{_fmt(c['fit']['log2_lr'])}{_EDGE_MARK[c['fit']['edge']]}, "
            fits += f"{_fmt(c['fit_3pt']['log2_lr'])}{_EDGE_MARK[c['fit_3pt']['edge']]}"
            rows.append(f"| `{name}` | {d} | {' | '.join(cells)} | {fits} |")
    bullets = []
    base = per[REFERENCE_BASELINE]
    for name, cell in per.items():
        if name == REFERENCE_BASELINE:
            continue
        drift = cell["depth_drift"]
        if drift is None:
            continue
        ran = drift["sizes"]  # the drift up to the deepest depth with its optimum located
        sizes = _up_to_located(cell, ran, setup.width) or ran  # else between marked edges
        moves = [_moved(c, sizes, setup.width, fit) for c in (cell, base) for fit in _FITS]
        beyond = ran[len(sizes) :]
        bullets.append(
            f"`{name}`: the optimum moves {moves[0]} from depth {sizes[0]} to {sizes[-1]} "
            f"(3-point fits {moves[1]}), `{REFERENCE_BASELINE}`'s on the same depths and lrs "
            f"{moves[2]} (3-point {moves[3]})"
            + (
                f" (at depth {_and([str(d) for d in beyond])} its optimum is not inside the "
                "lrs run so far)"
                if beyond
                else ""
            )
            + f"; best measured loss at depths {_and([str(d) for d in ran])}: "
            f"{_best_losses(cell, ran, setup.width)}, against "
            f"{_best_losses(base, ran, setup.width)}."
        )
    bullets += _reference_verdict(per, setup)
    bullets += _reference_seeds(ref["seeds"])
    return [
        "## CompleteP as its reference runs it",
        "",
        f"`{REFERENCE_BASELINE}` with its reference's recipe (`pre_ln_completep_ref`) and "
        "with each of its changes alone ([README.md](README.md#completep-as-its-reference-"
        f"runs-it)), at depths {_and([str(d) for d in depths])} and base lrs 2^{lrs[0]} to "
        f"2^{lrs[-1]}: {ref['runs']} runs (seed 0); the plan of the whole depth axis lists "
        f"{ref['planned']} more (`study.py --completep-ref --plan`). Validation loss at {h} "
        "steps, in brackets the run's largest attention logit (every block and head, over "
        f"the run; none recorded for `{REFERENCE_BASELINE}`'s older runs), beside "
        f"`{REFERENCE_BASELINE}`'s runs at the same points; the optima and drifts are fitted "
        "over these lrs only:",
        "",
        *rows,
        "",
        *[f"- {b}" for b in bullets],
        "",
        f"![CompleteP's reference variants: loss against lr per depth]({REFERENCE_FIGURE})",
    ]


def _reference_seeds(seeds: dict[str, dict[str, dict[str, Any] | None]]) -> list[str]:
    """The section's bullet on the seeds run at one lr of a model and depth (mean ± sd, n),
    the scale against which to read its single-seed cells (none: no model ran seeds)."""
    parts = []
    for name, per_depth in seeds.items():
        cells = [
            f"depth {d[1:]} {s['mean']:.3f} ± {_fmt(s['sd'], '.3f')} (2^{s['log2_lr']:g}, "
            f"n={s['n']}" + (f", {s['diverged']} diverged" if s["diverged"] else "") + ")"
            for d, s in per_depth.items()
            if s is not None and s["mean"] is not None
        ]
        if cells:
            parts.append(f"`{name}` {', '.join(cells)}")
    if not parts:
        return []
    sds = [s["sd"] for p in seeds.values() for s in p.values() if s and s["sd"] is not None]
    return [
        "The cells above are one seed each (no intervals). Seeds at one lr (mean ± sd): "
        + "; ".join(parts)
        + (
            f". The seed-to-seed sd runs from {min(sds):.3f} to {max(sds):.3f}: a difference "
            "between two cells is resolved only where it is several times the larger sd of "
            "the models it compares (unmeasured for a model without seeds)."
            if sds
            else "."
        )
    ]


def _reference_figure(setup: Setup, ref: dict[str, Any], path: Path) -> None:
    """One panel per model of :func:`reference_summary`: loss against log2(base lr), one curve
    per depth (``figures/completep_reference.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = str(max(setup.horizons))
    names = list(ref["parametrisations"])
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.6), sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        for i, d in enumerate(ref["depths"]):
            c = ref["parametrisations"][name][h]["shapes"].get(f"w{setup.width}_d{d}")
            if c is None:
                continue
            y = [np.nan if v is None else v for v in c["lr_curve"]["val_loss"]]
            colour = cmap(i / max(1, len(ref["depths"]) - 1))
            ax.plot(c["lr_curve"]["log2_lr"], y, "o-", color=colour, label=f"depth {d}")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("log2(base lr)")
        ax.legend(fontsize=8)
    np.atleast_1d(axes)[0].set_ylabel(f"validation loss at {h} steps (nats/byte)")
    fig.text(0.01, 0.01, "seed 0, width 64; missing points diverged", fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def _swap_fits(setup: Setup, summary: dict, checks: list[dict], results: list[dict]) -> str:
    """How a shape's fits move when its GPU runs (own order) are replaced by their CPU
    reruns."""
    h = max(setup.horizons)
    parts = []
    for shape in sorted({(c["parametrisation"], c["width"], c["depth"]) for c in checks}):
        cpu = {
            c["log2_lr"]: c
            for c in checks
            if _device(c) == "cpu" and (c["parametrisation"], c["width"], c["depth"]) == shape
        }
        runs = {r["log2_lr"]: r for r in _pick(results, *shape) if r["seed"] == 0}
        swap = [j for j in cpu if j in runs and _device(runs[j]) == "cuda (own order)"]
        if not swap:
            continue
        x = sorted(runs)
        y = [horizon_loss(runs[j], h) for j in x]
        z = [horizon_loss(cpu[j], h) if j in swap else horizon_loss(runs[j], h) for j in x]
        five = [fit_optimum([float(j) for j in x], v, 2)["log2_lr"] for v in (y, z)]
        three = [fit_optimum([float(j) for j in x], v, 1)["log2_lr"] for v in (y, z)]
        moved = "not at all" if three[0] == three[1] else f"to {three[1]:.2f}"
        parts.append(
            f"`{shape[0]}` w{shape[1]} d{shape[2]}: with the CPU's losses at "
            f"{_and([f'2^{j}' for j in sorted(swap)])} in place of the GPU's (own order), its "
            f"5-point fit moves from {five[0]:.2f} to {five[1]:.2f} and its 3-point fit "
            f"({three[0]:.2f}) {moved}"
        )
    return "- " + "; ".join(parts) + "." if parts else ""


def _specific(setup: Setup, name: str, summary: dict, results: list[dict]) -> list[str]:
    """The findings of one parametrisation against the others."""
    h = max(setup.horizons)
    per = {n: p[str(h)] for n, p in summary["parametrisations"].items()}
    cell = per[name]
    out = []
    runs = [r for r in results if r["parametrisation"] == name]
    loads = {r["depth"]: _gamma_load(r) for r in runs if r["width"] == setup.width}
    if name.startswith("shaped") and loads:
        same = len({round(v, 12) for v in loads.values()}) == 1
        at = [f"{loads[d]:.4g} at depth {d}" for d in sorted(loads)]
        text = f"{next(iter(loads.values())):.4g} at every depth" if same else _and(at)
        out.append(f"`gamma^2 d / n` at width {setup.width}: {text}.")
    d = cell["depth_drift"]
    if name in ("shaped", "shaped_t") and d and d["last_minus_first"] < 0:
        fall = -d["last_minus_first"]
        out.append(
            f"A base lr tuned at depth {d['sizes'][0]} is about {2**fall:.0f} times too large "
            f"at depth {d['sizes'][-1]} (2^{fall:.2f})."
        )
        sizes, opt = d["sizes"], d["log2_lr_opt"]
        if name == "shaped_t" and 16 in sizes and sizes[-1] > 16:
            i = sizes.index(16)
            before = max(opt[: i + 1]) - min(opt[: i + 1])
            after = (opt[-1] - opt[i]) / math.log2(sizes[-1] / 16)
            out.append(
                f"Up to depth 16 the optimum stays within {before:.2f}; from 16 to "
                f"{sizes[-1]} it falls by about {abs(after):.2f} per doubling."
            )
        if name == "shaped_t":
            losses = [_shape(cell, setup, "depth", x)["best"]["val_loss"] for x in sizes]
            moved = abs(d["last_minus_first"]) <= TARGET
            worse = losses[-1] > min(losses)
            out.append(
                f"**Against the target** (README.md: the optimum moves by at most {TARGET} in "
                f"log2 from depth {sizes[0]} to {sizes[-1]}, and the loss at the optimum does "
                f"not get worse with depth): the drift is {d['last_minus_first']:+.2f} "
                f"({'met' if moved else 'missed'}), and the best loss at depth {sizes[-1]} is "
                f"{'above' if worse else 'not above'} the lowest of the shallower depths "
                f"({'missed' if worse else 'met'})."
            )
    other = per.get("shaped_t")
    if name == "shaped" and d and other and other["depth_drift"]:
        ratio = d["last_minus_first"] / other["depth_drift"]["last_minus_first"]
        out.append(f"Its depth drift is {ratio:.1f} times `shaped_t`'s over the same depths.")
    if name == "shaped" and other and cell["width_drift"] and other["width_drift"]:
        moved = {}
        for n, c in (("shaped", cell), ("shaped_t", other)):
            sizes, opt = c["width_drift"]["sizes"], c["width_drift"]["log2_lr_opt"]
            if setup.proxy[0] in sizes:
                moved[n] = (opt[-1] - opt[sizes.index(setup.proxy[0])], sizes[-1])
        gammas = {
            r["width"]: r["model_config"]["config.gamma"]
            for r in results
            if r["parametrisation"] == "shaped_t" and r["depth"] == setup.depth
        }
        if len(moved) == 2 and setup.proxy[0] in gammas:
            top = moved["shaped"][1]
            out.append(
                f"From width {setup.proxy[0]} to {top} its optimum moves by "
                f"{moved['shaped'][0]:+.2f} (muP's width rule alone), `shaped_t`'s by "
                f"{moved['shaped_t'][0]:+.2f}: `shaped_t`'s rule holds `gamma^2 d / n` fixed, "
                f"so its gamma grows as `sqrt(n)` along this axis ({gammas[setup.proxy[0]]:.2f} "
                f"at width {setup.proxy[0]}, {gammas.get(top, math.nan):.2f} at {top})."
            )
    w = cell["width_drift"]
    if w and w["last_minus_first"] < 0:
        i = w["sizes"].index(setup.proxy[0]) if setup.proxy[0] in w["sizes"] else None
        if i is not None and i < len(w["sizes"]) - 1:
            too = 2 ** (w["log2_lr_opt"][i] - w["log2_lr_opt"][-1])
            out.append(
                f"A base lr tuned at width {setup.proxy[0]} is about {too:.1f} times too large "
                f"at width {w['sizes'][-1]}."
            )
    mup = per.get("pre_ln_depth_mup")
    if name in ("pre_ln", "pre_ln_completep") and mup:
        gaps = []
        for depth in setup.depths:
            key = f"w{setup.width}_d{depth}"
            if key in cell["shapes"] and key in mup["shapes"]:
                gaps.append(
                    (
                        depth,
                        cell["shapes"][key]["best"]["val_loss"]
                        - mup["shapes"][key]["best"]["val_loss"],
                    )
                )
        if gaps and name == "pre_ln":
            out.append(
                "Its best loss against depth-muP's (`1/fan_in` init): "
                + _and([f"{g:+.3f} at depth {dd}" for dd, g in gaps])
                + f"; at the proxy's depth {setup.proxy[1]} the two differ only in the init."
            )
        elif gaps:
            out.append(
                f"Its best loss is within {max(abs(g) for _, g in gaps):.3f} of depth-muP's at "
                "every depth."
            )
        deep = f"w{setup.width}_d{max(setup.depths)}"
        a, b = cell["shapes"].get(deep, {}).get("seeds"), mup["shapes"].get(deep, {}).get("seeds")
        if name == "pre_ln_completep" and a and b and a["sd"] and b["sd"]:
            lead = b["mean"] - a["mean"]
            out.append(
                f"At depth {max(setup.depths)}, with seeds at each one's best lr, CompleteP "
                f"reaches {a['mean']:.3f} ± {a['sd']:.3f} (2^{a['log2_lr']}) and depth-muP "
                f"{b['mean']:.3f} ± {b['sd']:.3f} (2^{b['log2_lr']}): "
                + (
                    f"CompleteP is ahead by {lead:.3f}, {lead / a['sd']:.1f} times its seed sd."
                    if lead > 0
                    else f"depth-muP is ahead by {-lead:.3f}."
                )
            )
    if name == "pre_ln" and mup:
        proxy = f"w{setup.proxy[0]}_d{setup.proxy[1]}"
        b = cell["shapes"][proxy]["best"]
        c = mup["shapes"][proxy]["best"]
        out.append(
            f"At the proxy (width {setup.proxy[0]}, depth {setup.proxy[1]}) it reaches "
            f"{b['val_loss']:.3f} at its best lr, 2^{b['log2_lr']:.0f}, against "
            f"{c['val_loss']:.3f} for depth-muP (2^{c['log2_lr']:.0f}): the init alone."
        )
    return out


def _cross_checks(setup: Setup, summary: dict, results: list[dict]) -> list[str]:
    """The long-horizon study's models at the same width, data, batch, schedule and horizon
    (its own lr grid, no per-group rule; seed 0)."""
    h = max(setup.horizons)
    per = {n: p[str(h)] for n, p in summary["parametrisations"].items()}
    out = []
    for depth in (16, 64):
        long = _long_horizon(depth, h)
        shape = f"w{setup.width}_d{depth}"
        if not long or "shaped_t" not in per or shape not in per["shaped_t"]["shapes"]:
            continue
        ours = {
            n: per[n]["shapes"][shape]["best"]
            for n in ("shaped_t", "pre_ln_depth_mup", "pre_ln_completep")
            if n in per and shape in per[n]["shapes"]
        }
        theirs = _and(
            [
                f"`{m}` {v:.3f} ({lr:.2g}"
                + ("" if g is None else f"; `gamma^2 d / n` {g:.4g}")
                + ")"
                for m, (v, lr, g) in sorted(long.items(), key=lambda kv: kv[1][0])
            ]
        )
        mine = _and([f"`{n}` {b['val_loss']:.3f} (2^{b['log2_lr']:.0f})" for n, b in ours.items()])
        out.append(f"- **Depth {depth}**, {h} steps: here {mine}; the long-horizon study {theirs}.")
        ours_t = [r for r in _pick(results, "shaped_t", setup.width, depth) if r["seed"] == 0]
        load = _gamma_load(ours_t[0])
        shaped = sorted((g, v, m) for m, (v, _, g) in long.items() if g is not None)
        same = [(m, v, lr) for m, (v, lr, g) in long.items() if g and abs(g - load) < 1e-9]
        for m, v, lr in same:
            near = min(ours_t, key=lambda r: abs(math.log2(r["lr"] / lr)))
            out.append(
                f"  `{m}` there is `shaped_t`'s model (`gamma^2 d / n` {load:.4g}): {v:.3f} at "
                f"{lr:.2g} there, {horizon_loss(near, h):.3f} at 2^{near['log2_lr']} here."
            )
        mixed = [*shaped, (load, ours["shaped_t"]["val_loss"], "shaped_t")]
        mixed.sort()
        if not same and len(mixed) > 2:
            order = all(a[1] < b[1] for a, b in itertools.pairwise(mixed))
            out.append(
                "  Among the shaped models (both studies) the best loss "
                + ("grows with `gamma^2 d / n`" if order else "does not grow with `gamma^2 d / n`")
                + ": "
                + _and([f"{v:.3f} at {g:.4g} (`{m}`)" for g, v, m in mixed])
                + "."
            )
    return out


def results_md(setup: Setup, out: Path, summary: dict[str, Any], results: list[dict]) -> str:
    """The study's written report, every number computed from the runs (``results.md``)."""
    from study import plan  # type: ignore[import-not-found]  # beside this script

    h = str(max(setup.horizons))
    todo = plan(setup, results)
    gpu = sum(str(r.get("device", "")).startswith("cuda") for r in results)
    extra = [r for r in results if r["seed"] not in setup.seeds]
    extra_text = ""
    if extra:
        where = Counter((r["parametrisation"], r["depth"]) for r in extra)
        extra_text = "; beyond the plan's seeds, " + _and(
            [f"{n} more of `{p}` at depth {d}" for (p, d), n in sorted(where.items())]
        )
    lrs = [
        len(c["lr_curve"]["log2_lr"])
        for p in summary["parametrisations"].values()
        for c in p[h]["shapes"].values()
    ]
    status = (
        f"complete: the plan lists no run over the {len(results)} finished"
        if not todo
        else f"in progress: {len(todo)} runs planned now"
    )
    lines = [
        "# Results: learning-rate transfer across depth and width",
        "",
        f"Generated by `report.py` from `runs.jsonl` ({len(results)} finished runs, {gpu} of "
        f"them on a GPU; {status}). Do not edit: change `report.py` and run `python "
        "examples/transfer/report.py`. The tables are in [tables.md](tables.md), the numbers "
        "in [results.json](results.json); the question, the design and the commands in "
        "[README.md](README.md). `simulations.transfer_lr` quotes the measured drifts "
        "(package data written by this report).",
        "",
        "## Setup",
        "",
        f"- **Shapes.** Depths {_and([str(d) for d in setup.depths])} at width {setup.width}; "
        f"widths {_and([str(w) for w in setup.widths])} at depth {setup.depth}; "
        f"{min(lrs)} to {max(lrs)} base lrs 2x apart per shape, seed 0; "
        + (
            f"seeds {_and([str(s) for s in setup.seeds])} at the best lr of depths "
            f"{_and([str(d) for d in setup.seed_depths])}"
            if setup.seed_depths
            else "no seeds planned"
        )
        + f"{extra_text}.",
        f"- **Base lr.** Tuned at the proxy width {setup.proxy[0]}, depth {setup.proxy[1]}: "
        "every parameter group trains at the base lr times its parametrisation's factor "
        "(`TrainConfig(lr_proxy_width, lr_proxy_depth)`); a parametrisation transfers when "
        "the optimal base lr does not move with depth and width.",
        f"- **Training.** Batch {setup.batch_size} x {setup.seq_len} bytes, WSD schedule "
        f"({setup.warmup_steps} warm-up steps, a {setup.cooldown_fraction:.0%} cooldown), "
        f"horizons {_and([str(x) for x in setup.horizons])} steps from one run each; the "
        f"report works at {h} steps.",
        "- **Optimum.** A least-squares quadratic in log2(lr) through the lowest point and up "
        "to two finite neighbours each side (the report's fit) or one (the 3-point fit: one "
        "window at every shape, like for like); 95% intervals from a parametric bootstrap "
        "with the parametrisation's pooled seed-to-seed sd.",
        "",
        f"## Which parametrisation transfers ({h} steps)",
        "",
        "The drift of the optimal log2 base lr from the first to the last size of each axis "
        "(report's and 3-point fits; [ ] 95% bootstrap interval; `*`: an optimum at a grid "
        "edge, `+`: one bounded by a diverged lr), and the best measured loss (the grid's "
        "lowest, seed 0) at the two ends.",
        "",
        *summary_table(setup, summary),
        "",
        *_comparison(setup, summary),
        "",
        f"## Every shape ({h} steps)",
        "",
        "`tables.md`'s per-shape table: the base lrs run (seed 0), the grid's best, the fitted "
        "optimum with its interval and the parabola's value there (which can lie below every "
        "run), the 3-point optimum, the seeds at the best lr, the devices and the wall time "
        "per run (a record of the load, not a benchmark).",
        "",
        *shape_table(summary, h),
        "",
        "![optimum against depth and width](figures/optimum_drift.png)",
        "",
    ]
    for name, per_h in summary["parametrisations"].items():
        cell = per_h[h]
        bullets = _axis_bullets(setup, name, cell, "depth")
        bullets += _axis_bullets(setup, name, cell, "width")
        bullets += _specific(setup, name, summary, results)
        bullets += [
            _seed_bullet(setup, name, cell, results),
            _divergence_bullet(setup, name, results),
            _horizon_bullet(setup, per_h),
        ]
        if name in SAME_AT_PROXY_DEPTH:
            bullets += _same_at_proxy(setup, summary, results)
        lines += [f"## `{name}`", "", DESCRIPTION.get(name, name) + ".", ""]
        lines += [f"- {b}" for b in bullets if b]
        lines += ["", f"![loss vs lr, {name}](figures/loss_vs_lr_{name}.png)", ""]
    cross = _cross_checks(setup, summary, results)
    if cross:
        lines += [
            "## Against the long-horizon study",
            "",
            "The long-horizon study ([../long_horizon/results.md](../long_horizon/results.md)) "
            "trains at the same width, data, batch, schedule and horizon, on its own lr grid "
            "(3x apart, one lr for every parameter; seed 0's best lr):",
            "",
            *cross,
            "",
        ]
    reference = _reference_section(setup, summary)
    if reference:
        lines += [*reference, ""]
    check = _device_check(setup, out, summary, results)
    if check:
        lines += ["## The same runs on the CPU and on a GPU", "", *check, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def drifts(summary: dict[str, Any]) -> dict[str, Any]:
    """What ``simulations.transfer_lr`` quotes: per parametrisation, the drift of the optimum
    across depth and width at the longest horizon (``None``: not measured)."""
    h = str(max(summary["horizons"]))
    return {
        "study": "examples/transfer",
        "runs": summary["runs"],
        "horizon": int(h),
        "proxy": summary["proxy"],
        "parametrisations": {
            name: {f"{a}_drift": per_h[h][f"{a}_drift"] for a in ("depth", "width")}
            for name, per_h in summary["parametrisations"].items()
        },
    }


def _rounded(x: Any, digits: int = 9) -> Any:
    """``x`` with every float to ``digits`` significant digits (the report's files do not
    depend on the last bits of a machine's least-squares solver)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, digits) for v in x]
    return x


def report(
    setup: Setup, out: Path, results: list[dict[str, Any]], drifts_path: Path | None = None
) -> dict[str, Any]:
    """Write ``results.md``, ``results.json``, ``tables.md`` and ``figures/`` in ``out`` from
    the finished runs, and the measured drifts to ``drifts_path`` (the package data of
    :data:`DRIFTS` for the committed study; None: not written)."""
    summary = summarise(setup, results)
    summary["completep_reference"] = reference_summary(setup, results)
    summary = _rounded(summary)
    write_json(summary, out / "results.json", indent=1)
    with atomic_path(out / "tables.md") as tmp:
        Path(tmp).write_text(tables(setup, summary))
    with atomic_path(out / "results.md") as tmp:
        Path(tmp).write_text(results_md(setup, out, summary, results))
    if drifts_path is not None:
        write_json(drifts(summary), drifts_path, indent=1)
    figures(setup, summary, out / "figures")
    if summary["completep_reference"] is not None:
        _reference_figure(setup, summary["completep_reference"], out / REFERENCE_FIGURE)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Rebuild the committed report (and the package data) from ``runs.jsonl``."""
    import argparse

    from study import DEFAULT  # type: ignore[import-not-found]

    from simulations.studies import RunStore

    argparse.ArgumentParser(description=main.__doc__).parse_args(argv)
    report(DEFAULT, HERE, RunStore(HERE / "runs.jsonl").results(), DRIFTS)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
