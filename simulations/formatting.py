"""The printed reports of every job (what each ``shapedtx`` command prints), in one place, on
one table and number formatter (:func:`table`, :func:`number`).

Each ``format_*`` function takes what its library call returns (a Dataset, a summary
dictionary, an :class:`simulations.Advice`, ...) and returns text, computing at most the few
summary statistics it prints. The module loads nothing heavy (no torch) until one is called,
so that the command line can import it for free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .ranking import ranking_rule

if TYPE_CHECKING:
    import xarray as xr

    from shapedtx.design import DesignRow, HeadSizeReport, Shape

    from .advise import Advice, Candidate
    from .sweep import SweepSummary


def table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: the header, a rule, one line per row; the first column is
    left-aligned, the others right-aligned, each as wide as its widest cell."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(
            c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def number(x: float | None, digits: int = 3, *, fixed: bool = False) -> str:
    """``x`` with ``digits`` significant digits, or (``fixed``) ``digits`` decimals in 6
    characters; None (a JSON null) prints as ``nan``, infinities as ``inf``."""
    value = float("nan") if x is None else x
    return f"{value:6.{digits}f}" if fixed else f"{value:.{digits}g}"


def p_value(x: float | None) -> str:
    """A p-value with sensible precision: ``> 0.999``, 3 decimals, or 2 significant digits."""
    if x is None:
        return "nan"
    if x > 0.999:
        return "> 0.999"
    return f"{x:.3f}" if x >= 0.01 else f"{x:.2g}"


# -- simulate, sde ----------------------------------------------------------------------------


def format_simulation(ds: xr.Dataset) -> str:
    """One line for :func:`simulations.simulate`'s Dataset: the sampler, sizes and the mean
    correlation at five layers (0, d/4, d/2, 3d/4, d)."""
    from shapedtx.results import with_metrics

    mean_rho = with_metrics(ds)["mean_rho"].mean("sample")
    width, depth = ds.attrs["config.width"], ds.attrs["config.depth"]
    layers = sorted({0, depth // 4, depth // 2, (3 * depth) // 4, depth})
    summary = ", ".join(f"{layer}: {mean_rho.values[layer]:.4f}" for layer in layers)
    return (
        f"simulate[{ds.attrs['method']}] width={width} depth={depth} m={ds.sizes['token_a']} "
        f"samples={ds.sizes['sample']}: mean rho by layer {{{summary}}}"
    )


def format_sde(ds: xr.Dataset) -> str:
    """Two lines for :func:`sde.solve`'s Dataset: the mean correlation of the paths that did
    not explode at five times, and the exploded fraction."""
    from shapedtx.results import with_metrics

    ok = ~ds["exploded"]
    mean_rho = with_metrics(ds)["mean_rho"].where(ok).mean("sample")
    picks = sorted({round(i * (ds.sizes["t"] - 1) / 4) for i in range(5)})
    summary = ", ".join(f"{ds['t'].values[i]:.3g}: {mean_rho.values[i]:.4f}" for i in picks)
    fraction = ds.attrs["exploded_fraction"]
    samples = ds.sizes["sample"]
    return (
        f"sde[{ds.attrs['method']}] m={ds.sizes['token_a']} samples={samples} "
        f"T={ds.attrs['T']:.4g} dt={ds.attrs['dt']:.4g}: mean rho by t {{{summary}}}\n"
        f"exploded fraction: {fraction:.4g} ({int(ds['exploded'].values.sum())} of {samples} "
        "paths frozen and flagged)"
        + ("" if math.isclose(fraction, 0.0) else "; mean rho above excludes them")
    )


# -- compare ----------------------------------------------------------------------------------


def format_collapse(report: xr.Dataset) -> str:
    """The rank-collapse table of a :func:`simulations.collapse_report` (as ``shapedtx
    compare`` prints it): per model the fraction collapsed, the median collapse layer
    (:data:`shapedtx.metrics.NEVER`, -1, where fewer than half collapse) and the final mean
    correlation."""
    from .experiment import collapse_summary

    return "\n".join(_collapse_lines(collapse_summary(report)))


def _collapse_lines(c: Mapping[str, Any]) -> list[str]:
    """The printed table of a ``collapse`` summary entry."""
    from shapedtx.metrics import NEVER

    lines = [
        f"rank collapse (mean rho > {c['threshold']:g}; median layer {NEVER}: never, fewer "
        "than half collapse):"
    ]
    width = max(len(m) for m in c["models"])
    lines.append(f"  {'model':{width}s}  collapsed  median layer  final mean rho")
    for m, r in c["models"].items():
        layer = "nan" if r["median_collapse_layer"] is None else f"{r['median_collapse_layer']:g}"
        lines.append(
            f"  {m:{width}s}  {r['fraction_collapsed']:9.0%}  {layer:>12s}  "
            f"{number(r['final_mean_rho'], fixed=True)}"
        )
    return lines


def format_summary(s: Mapping[str, Any]) -> str:
    """The compact table ``shapedtx compare`` prints (of :func:`simulations.run_comparison`'s
    summary, the numbers of ``summary.json``)."""
    c = s["config"]

    def fmt(x: float | None) -> str:
        return number(x, fixed=True)

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
        f"distances at T: rho KS {fmt(d['ks_rho'])} (p = {p_value(d['ks_rho_pvalue'])}), "
        f"W1 {fmt(d['w1_rho'])}; log V^aa KS {fmt(d['ks_logVaa'])} "
        f"(p = {p_value(d['ks_logVaa_pvalue'])}), W1 {fmt(d['w1_logVaa'])}"
    )
    e = s["sde"]
    lines.append(f"SDE paths exploded: {e['exploded']} of {e['samples']} (excluded)")
    if "dt" in e:  # a summary.json written before the step error was reported has no dt
        lines.append(_step_error_line(e))
    if "token_pairs" in s:
        tp = s["token_pairs"]
        cells = [
            f"{p} {fmt(n).strip()}/{fmt(q).strip()} (± {fmt(se).strip()})"
            for p, n, q, se in zip(tp["pairs"], tp["mean_rho_T"]["network"],
                                   tp["mean_rho_T"]["sde"], tp["mean_rho_T_se"]["network"],
                                   strict=True)
        ]  # fmt: skip
        lines.append("causal: mean rho at T by token pair, network/SDE: " + ", ".join(cells))
    lines += _collapse_lines(s["collapse"])
    cv = s["convergence"]
    if cv is not None:
        pts = ", ".join(
            f"{w}: {'nan' if v is None else f'{v:.4f}'}"
            for w, v in zip(cv["widths"], cv["w1_rho"], strict=True)
        )
        slope = cv["w1_rho_slope"]
        lines.append(
            f"convergence, W1(rho_T) by width {{{pts}}}; slope "
            + ("not fitted (too few widths above the noise floor)" if slope is None else
               f"{slope:.2f} ± {number(cv['w1_rho_slope_se'], 2, fixed=True).strip()}")
            + f" (theory about -0.5; noise floor {fmt(cv['w1_rho_noise_floor']).strip()})"
        )  # fmt: skip
    lines.append("run times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in s["run_times_s"].items()))
    return "\n".join(lines)


def _step_error_line(e: Mapping[str, Any]) -> str:
    """The SDE's step error at T (docs/theory.md#step-error), or that it was not estimated."""
    st = e.get("step_error")
    if st is None:
        return f"SDE step error at dt = {number(e['dt'], 4)}: not estimated"

    def worst(key: str) -> str:
        pairs = [(v, s) for v, s in zip(st[key]["step_error"], st[key]["step_error_se"],
                                        strict=True) if v is not None]  # fmt: skip
        v, se = max(pairs, key=lambda p: abs(p[0]), default=(float("nan"), float("nan")))
        return f"{v:+.4f} ± {number(se, 2)}"

    verdict = (
        "resolved above the Monte Carlo SE"
        if (st["resolved_ratio"] or -1.0) > 1
        else "below the Monte Carlo SE"
        if (st["ratio"] or 0.0) <= 1
        else "not resolved above the Monte Carlo SE"
    )
    return (
        f"SDE step error at T (dt = {number(e['dt'], 4)} vs {number(st['dt_half'], 4)}, same "
        f"paths; largest of the quantiles): rho {worst('rho_T')}, V^aa {worst('Vaa_T')}; "
        f"{verdict} (|error| / SE at most {number(st['ratio'], 2)})"
    )


# -- advise -----------------------------------------------------------------------------------


def format_advice(advice: Advice, *, every: bool = False) -> str:
    """The human-readable report of an :class:`simulations.Advice`: the advice, criteria,
    ranking rule, sampling, a table of candidates (``every``: all of them; else the best few
    and each gamma's first failure) and the [LW] / [BH] checks."""
    cr = advice.criteria
    se = advice.mc_se
    lines = [
        f"shapedtx advise: width {advice.width}, depth {advice.depth}, tokens {advice.tokens}, "
        f"heads {advice.heads}, mlp {advice.mlp}, causal {advice.causal}: T = d/n = "
        f"{advice.T:.4g}",
    ]
    if advice.gamma is None or advice.tau0 is None:
        lines.append("NO candidate of the grid passes the criteria")
    else:
        lam = math.sqrt(1 - advice.gamma**2)
        lines.append(
            f"advice: gamma = {advice.gamma:g} (lambda = {lam:.4f}), tau0 = {advice.tau0:g}"
        )
    lines += [
        f"criteria: collapse P(max rho_T > {cr.rho_max:g}) < {cr.collapse:g}; exploded < "
        f"{cr.exploded:g}; q{100 * cr.norm_quantile:g}(V_T^aa/V_0^aa) < {cr.norm_ratio:g}",
        f"ranking: {ranking_rule(advice.spread_target)}",
        f"sampling: {advice.steps} Euler steps, screen {advice.screen_samples} paths, confirm "
        f"{advice.samples} paths, SDE with m = {advice.sim_tokens} tokens; "
        f"{advice.seconds:.1f} s (estimated {advice.estimated_seconds:.0f} s)",
        f"Monte Carlo SE at the thresholds (confirmed): collapse {se['collapse_confirm']:.2g}, "
        f"exploded {se['exploded_confirm']:.2g} (screen: {se['collapse_screen']:.2g}, "
        f"{se['exploded_screen']:.2g}); rows show each estimate's SE",
        "",
    ]
    shown = advice.candidates if every else _shortlist(advice.candidates)
    rows = [
        (
            f"{c.gamma:g}",
            f"{c.tau0:g}",
            c.stage,
            c.measurement.samples,
            f"{c.measurement.collapse:.4f}+-{c.measurement.collapse_se:.4f}",
            f"{c.measurement.exploded:.4f}+-{c.measurement.exploded_se:.4f}",
            f"{number(c.measurement.norm)}+-{number(c.measurement.norm_se, 2)}",
            f"{c.measurement.rho_spread:.3f}+-{c.measurement.rho_spread_se:.3f}",
            _verdict(c),
        )
        for c in shown
    ]
    header = ("gamma", "tau0", "stage", "N", "collapse", "exploded", "norm q", "rho_spread",
              "verdict")  # fmt: skip
    lines.append(table(header, rows))
    if not every and len(shown) < len(advice.candidates):
        lines.append(f"({len(advice.candidates) - len(shown)} more candidates: --all or --json)")
    d = advice.design
    lines += [
        "",
        f"[LW] depth threshold log_3(n) = {d.depth_threshold:.2f}: depth {advice.depth} is "
        f"{d.regime}; allocation for 12 L d^2: {d.allocation}",
        f"[BH] key size per head {d.key_dim} vs m = {advice.tokens}: "
        + ("ok (>= m - 1)" if d.head_size_ok else "TOO SMALL (< m - 1)")
        + f"; at most {d.max_unbottlenecked_heads} heads of size n/heads >= m",
    ]
    lines += [f"note: {n}" for n in advice.notes]
    lines += _trained_lines(advice)
    return "\n".join(lines)


def _trained_lines(advice: Advice) -> list[str]:
    """Which model the advice is for and what training found for it at this size
    (:func:`simulations.advise.trained_checks`), or that it was not checked there."""
    from .advise import trained_checks

    lines = [
        "",
        "model advised: the shaped Transformer at this gamma and tau0 at initialisation, the "
        "preset shaped and shaped_free (the same network at initialisation, slopes, "
        "attention gains and temperature trainable; docs/guide/models.md)",
    ]
    if not advice.checked:
        note = "only shaped ReLU MLP 4n, 4 heads, causal (this advice's model: not checked)"
        return [*lines, f"checked in training: {note}"]
    checks = trained_checks(advice.width, advice.depth)
    if not checks:
        sizes = sorted({(c["width"], c["depth"]) for c in trained_checks()})
        where = ", ".join(f"width {w} depth {d}" for w, d in sizes)
        return [*lines, f"checked in training: not at this size (checked: {where})"]
    for c in checks:
        tuned = "bracketed" if c["lr_bracketed"] else "not bracketed: tune it"
        best = (  # absent where no baseline was measured at the check's horizon
            f", vs the strongest baseline measured, {c['best_baseline']}, "
            f"{c['best_baseline_loss']:.3f} ({100 * c['vs_best_baseline']:+.1f}%)"
            if c.get("best_baseline")
            else ""
        )
        lines.append(
            f"checked in training: {c['preset']} at gamma {c['gamma']:g}, tau0 {c['tau0']:g}: "
            f"lr {c['lr']:g} ({tuned}), {c['horizon']} steps, {c['seeds']} seed(s): loss "
            f"{c['loss']:.3f} vs GPT-2 pre-LN {c['gpt2_pre_ln_loss']:.3f} "
            f"({100 * c['vs_gpt2_pre_ln']:+.1f}%){best}; {c['report']}"
        )
    return lines


def _verdict(c: Candidate) -> str:
    if c.verdict == "pass":
        return "pass"
    if c.verdict == "unresolved":  # the details (paths needed) are in --json
        names = ", ".join(" ".join(u.split()[:2]) if u.startswith("norm") else u.split()[0]
                          for u in c.unresolved)  # fmt: skip
        return f"unresolved (passes by < 2 SE): {names}"
    return ("unresolved (within 2 SE): " if c.plausible else "") + "; ".join(c.violations)


def _shortlist(cands: Sequence[Candidate]) -> list[Candidate]:
    """The best candidate, the best few others, and one row per gamma's first failure."""
    out = list(cands[:6])
    seen = {c.gamma for c in out if not c.plausible}
    for c in cands[6:]:
        if not c.plausible and c.gamma not in seen:
            out.append(c)
            seen.add(c.gamma)
    return out


# -- design -----------------------------------------------------------------------------------


def _fit_note() -> str:
    from shapedtx.design import LW_FIT

    return (
        f"fit: ln d*(L) = {LW_FIT.a} + {LW_FIT.b} L, size N = 12 L d^2 (BigScience restatement "
        "of Levine et al. 2020; docs/theory.md#depth-width)"
    )


def format_shape(params: float, shape: Shape) -> str:
    """The report of :func:`shapedtx.design.optimal_shape` for a budget of ``params``
    non-embedding parameters: real and rounded shape, and the side of the depth threshold."""
    from shapedtx.design import depth_threshold, extrapolation_warning, regime

    rows = [
        ("optimal (real)", f"{shape.depth:.2f}", f"{shape.width:.1f}", f"{shape.params:.4g}"),
        (
            f"rounded (width multiple of {shape.multiple})",
            shape.depth_rounded,
            shape.width_rounded,
            f"{shape.params_rounded:.4g}",
        ),
    ]
    w = shape.width_rounded
    above = regime(shape.depth_rounded, w) == "depth-inefficient"
    return "\n".join(
        [
            f"Recommended shape for N = {params:.4g} non-embedding parameters",
            _fit_note(),
            *filter(None, [extrapolation_warning(params)]),
            "",
            table(("", "depth L", "width d", "12 L d^2"), rows),
            f"rounded shape spends {shape.params_rounded / params:.1%} of the budget",
            "",
            f"depth threshold log_3(d) = {depth_threshold(w):.2f}: depth {shape.depth_rounded} is "
            + (
                "above it, where depth and width contribute similarly (true of every practical "
                "model; the fitted optimum above is the recommendation)"
                if above
                else "below it, where depth is far more efficient than width"
            ),
        ]
    )


def format_head_sizes(seq_len: int, reports: Mapping[str, tuple[int, int, HeadSizeReport]]) -> str:
    """The head-size table at sequence length ``seq_len`` of
    :func:`shapedtx.design.head_size_report`s: ``reports[layout] = (heads, d_p, report)``,
    the first one the standard layout."""
    rows = [
        (layout, heads, d_p, r.max_logit_rank, "yes" if r.bottleneck else "no",
         f"{r.params_actual:.4g}")
        for layout, (heads, d_p, r) in reports.items()
    ]  # fmt: skip
    standard = next(iter(reports.values()))[2]
    return "\n".join(
        [
            f"Head size at sequence length m = {seq_len} (Bhojanapalli et al. 2020; "
            "docs/theory.md#head-size)",
            table(
                ("layout", "heads", "d_p", "logit rank <=", "d_p < m", "attn params/layer"), rows
            ),
            f"standard layout (4 d^2 = {standard.params_standard:.4g} per layer): at most "
            f"{standard.max_unbottlenecked_heads} heads of size d / heads >= m",
        ]
    )


def format_gpt3(rows: Sequence[DesignRow], multiple: int) -> str:
    """The GPT-3 family table of :func:`shapedtx.design.gpt3_table` against the fitted optimum
    for each size."""
    from shapedtx.design import GPT3_CONTEXT

    cells = [
        (r.name, r.depth, r.width, r.heads, r.head_dim, f"{r.params:.3g}", f"{r.threshold:.1f}",
         "above" if r.regime == "depth-inefficient" else "below", r.allocation,
         f"{r.recommended.depth:.1f}", f"{r.recommended.width:.0f}",
         f"{r.recommended.depth_rounded} x {r.recommended.width_rounded}",
         "yes" if r.bottleneck else "no")
        for r in rows
    ]  # fmt: skip
    header = ("model", "L", "d", "heads", "d_p", "12 L d^2", "log3 d", "L vs log3 d", "verdict",
              "L*", "d*", f"rounded L x d (mult. {multiple})", f"d_p < {GPT3_CONTEXT}")  # fmt: skip
    return "\n".join(
        [
            "GPT-3 family (Brown et al. 2020, Table 2.1) against the fitted optimum for its size",
            _fit_note(),
            "verdict: depth vs L* for the same 12 L d^2, +-10%",
            "",
            table(header, cells),
        ]
    )


# -- sweep, probe, train ---------------------------------------------------------------------------


def format_sweep(summary: SweepSummary, kind: str, *, listed: int = 20) -> str:
    """The report of :func:`simulations.sweep`: counts, then the first ``listed`` failures."""
    lines = [
        f"sweep[{kind}] {summary.total} points: {summary.computed} computed, "
        f"{summary.skipped} already done, {len(summary.failed)} failed; store {summary.store}"
    ]
    for label, error in list(summary.failed.items())[:listed]:
        lines.append(f"  failed: {label}: {error.splitlines()[0] if error else ''}")
    if len(summary.failed) > listed:
        lines.append(f"  ... and {len(summary.failed) - listed} more (simulations.open_sweep)")
    return "\n".join(lines)


def format_probe(ds: xr.Dataset, threshold: float) -> str:
    """One line for :func:`shapedtx.training.probing.probe_run`'s Dataset: how many windows
    collapse (mean rho above ``threshold``, :func:`shapedtx.detect_collapse`), the median
    first layer where they do, and the mean correlation after the last block."""
    import numpy as np
    import torch

    from shapedtx.metrics import detect_collapse, mean_correlation

    V = torch.from_numpy(ds["V"].values)
    hit = detect_collapse(V, threshold)
    first = hit.first_index[hit.collapsed].numpy()
    rho = mean_correlation(V[:, -1]).numpy()
    where = f", first at layer {int(np.median(first))} (median)" if first.size else ""
    return (
        f"step {ds.attrs['step']}: {int(hit.collapsed.sum())}/{V.shape[0]} windows collapsed "
        f"(mean rho > {threshold:g}){where}; mean rho after the last block "
        f"{float(np.nanmean(rho)):.4f}"
    )


def format_stability_map(ds: xr.Dataset) -> str:
    """The printed report of a :func:`stability_map` Dataset: one row per gamma, one column
    per tau0, each cell ``network / SDE`` median exit time (``c``: censored median), then the
    agreement numbers."""
    a = ds.attrs
    med, cen = ds["median_exit"], ds["censored"]
    lines = [
        f"median first t out of [{a['low']:g}, {a['high']:g}] (cap T_max = {a['T_max']:g}; "
        f"network / SDE; c: half the paths or more never leave):",
        "gamma \\ tau0 " + "".join(f"{t:>16g}" for t in ds["tau0"].values),
    ]
    for i, g in enumerate(ds["gamma"].values):
        cells = []
        for j in range(ds["tau0"].size):
            parts = []
            for source in ds["source"].values:
                v = float(med.sel(source=source).values[i, j])
                c = "c" if float(cen.sel(source=source).values[i, j]) >= 0.5 else ""
                parts.append("-" if math.isnan(v) else f"{v:.3g}{c}")
            cells.append(f"{' / '.join(parts):>16}")
        lines.append(f"{g:<12g}" + "".join(cells))
    if "fraction_within_10pct" in a:
        lines.append(
            f"agreement: {100 * a['fraction_within_10pct']:.0f}% of cells within 10% "
            f"({a['cells_censored_both']} censored on both sides); worst cell gamma = "
            f"{a['worst_gamma']:g}, tau0 = {a['worst_tau0']:g}: network "
            f"{a['worst_network']:.3g}, SDE {a['worst_sde']:.3g}"
        )
    return "\n".join(lines)


__all__ = [
    "format_advice",
    "format_collapse",
    "format_gpt3",
    "format_head_sizes",
    "format_probe",
    "format_sde",
    "format_shape",
    "format_simulation",
    "format_stability_map",
    "format_summary",
    "format_sweep",
    "number",
    "p_value",
    "table",
]
