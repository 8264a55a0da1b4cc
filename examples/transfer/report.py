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

import math
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from study import Setup

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
    out = np.empty(BOOTSTRAP)
    for b in range(BOOTSTRAP):
        noisy = mean + rng.normal(0.0, sd, size=len(xs))
        a2, b2, _ = np.polyfit(xs, noisy, 2)
        lowest = float(xs[int(np.argmin(noisy))])
        out[b] = float(np.clip(-b2 / (2 * a2), xs[0], xs[-1])) if a2 > 0 else lowest
    return out


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


def report(setup: Setup, out: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    summary = summarise(setup, results)
    write_json(summary, out / "results.json", indent=1)
    with atomic_path(out / "tables.md") as tmp:
        Path(tmp).write_text(tables(setup, summary))
    figures(setup, summary, out / "figures")
    return summary
