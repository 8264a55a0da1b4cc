"""``simulations.formatting``, every printed report of the command line, on small fixed inputs
built by hand (summary dictionaries, tiny Datasets, Advice and design objects): the exact text
where the layout is the contract (alignment, rule line, precision, ``nan`` for None, the
optional clauses and lines). Fast: no simulation runs."""

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from shapedtx.design import DesignRow, HeadSizeReport, Shape
from simulations.advise import Advice, Candidate, Criteria, DesignChecks, Measurement
from simulations.formatting import (
    format_advice,
    format_collapse,
    format_gpt3,
    format_head_sizes,
    format_probe,
    format_sde,
    format_shape,
    format_simulation,
    format_stability_map,
    format_summary,
    format_sweep,
    number,
    p_value,
    table,
)
from simulations.sweep import SweepSummary

# -- table, number, p_value -------------------------------------------------------------------


def test_table_aligns_first_column_left_the_others_right_under_a_rule():
    """Each column as wide as its widest cell (header included), two spaces between columns,
    the rule as the second line, trailing blanks stripped (an empty last cell)."""
    text = table(("name", "n", "x"), [("a", 1, "0.5"), ("bbbbbb", 22, "")])
    assert text == "\n".join(
        [
            "name     n    x",
            "------  --  ---",
            "a        1  0.5",
            "bbbbbb  22",
        ]
    )
    assert table(("a",), []) == "a\n-"


def test_table_refuses_a_row_longer_than_its_header():
    """A row with more cells than the header is an error, not silently cut to the header."""
    with pytest.raises(ValueError):
        table(("a", "b"), [("x", 1, "extra")])


def test_number_significant_digits_fixed_decimals_nan_and_inf():
    assert number(0.123456) == "0.123"  # default: 3 significant digits
    assert number(12345.678) == "1.23e+04"
    assert number(2 / 3, 2) == "0.67"
    assert number(None) == "nan" and number(math.nan) == "nan"
    assert number(math.inf) == "inf" and number(-math.inf) == "-inf"
    assert number(0.5, fixed=True) == " 0.500"  # 3 decimals in 6 characters
    assert number(-1.23456, 2, fixed=True) == " -1.23"
    assert number(None, fixed=True) == "   nan"
    assert number(12.0, 1, fixed=True) == "  12.0"


def test_p_value_precision_switches_at_0_01_and_caps_at_0_999():
    assert p_value(None) == "nan"
    assert p_value(1.0) == "> 0.999" and p_value(0.9995) == "> 0.999"
    assert p_value(0.999) == "0.999"  # the cap is strict
    assert p_value(0.5) == "0.500"
    assert p_value(0.01) == "0.010"  # 0.01 itself: 3 decimals
    assert p_value(0.0102) == "0.010"
    assert p_value(0.0012345) == "0.0012"  # below 0.01: 2 significant digits
    assert p_value(1e-7) == "1e-07"


# -- simulate, sde ----------------------------------------------------------------------------


def _correlations(rho: np.ndarray) -> np.ndarray:
    """V (..., 2, 2) with unit diagonal and off-diagonal ``rho`` (the mean correlation)."""
    V = np.ones((*rho.shape, 2, 2))
    V[..., 0, 1] = V[..., 1, 0] = rho
    return V


def test_format_simulation_reports_five_layers():
    """depth 8: layers 0, 2, 4, 6, 8; the mean over samples of the mean correlation."""
    k = np.arange(9.0)
    rho = np.stack([0.1 * k + 0.04, 0.1 * k + 0.06])  # (sample, t): mean 0.1 k + 0.05
    ds = xr.Dataset(
        {"V": (("sample", "t", "token_a", "token_b"), _correlations(rho))},
        attrs={"config.width": 16, "config.depth": 8, "method": "exact"},
    )
    assert format_simulation(ds) == (
        "simulate[exact] width=16 depth=8 m=2 samples=2: mean rho by layer "
        "{0: 0.0500, 2: 0.2500, 4: 0.4500, 6: 0.6500, 8: 0.8500}"
    )


def _sde_dataset(exploded: list[bool]) -> xr.Dataset:
    """9 times on [0, 1]; the paths not exploded have mean rho 0.1 k + 0.05 at time k, the
    exploded ones 0.99."""
    k = np.arange(9.0)
    rho = np.stack([np.full(9, 0.99) if e else 0.1 * k + 0.05 for e in exploded])
    return xr.Dataset(
        {
            "V": (("sample", "t", "token_a", "token_b"), _correlations(rho)),
            "exploded": (("sample",), np.array(exploded)),
        },
        coords={"t": k / 8},
        attrs={"method": "euler", "T": 1.0, "dt": 0.125,
               "exploded_fraction": float(np.mean(exploded))},
    )  # fmt: skip


def test_format_sde_excludes_exploded_paths_and_says_so():
    """Five times (indices 0, 2, 4, 6, 8 of 9), the mean over the paths that did not explode,
    and the exploded clause only when some did."""
    first = (
        "sde[euler] m=2 samples=4 T=1 dt=0.125: mean rho by t "
        "{0: 0.0500, 0.25: 0.2500, 0.5: 0.4500, 0.75: 0.6500, 1: 0.8500}"
    )
    assert format_sde(_sde_dataset([False, False, True, False])) == (
        first + "\nexploded fraction: 0.25 (1 of 4 paths frozen and flagged); "
        "mean rho above excludes them"
    )
    assert format_sde(_sde_dataset([False] * 4)) == (
        first + "\nexploded fraction: 0 (0 of 4 paths frozen and flagged)"
    )


# -- compare ----------------------------------------------------------------------------------


def test_format_collapse_table():
    """Per model: fraction collapsed as a percentage, the median layer (-1: never; nan from a
    NaN), the final mean correlation with 3 decimals; the model column as wide as the longest
    name."""
    report = xr.Dataset(
        {
            "fraction_collapsed": ("model", [0.75, 0.0, 1.0]),
            "median_collapse_layer": ("model", [3.0, -1.0, math.nan]),
            "final_mean_rho": ("model", [0.5, 0.123456, math.nan]),
            "samples": ("model", [64, 64, 8]),
        },
        coords={"model": ["network", "sde", "baseline"]},
        attrs={"threshold": 0.99},
    )
    assert format_collapse(report).splitlines() == [
        "rank collapse (mean rho > 0.99; median layer -1: never, fewer than half collapse):",
        "  model     collapsed  median layer  final mean rho",
        "  network         75%             3   0.500",
        "  sde              0%            -1   0.123",
        "  baseline       100%           nan     nan",
    ]


def _summary(**changes):
    """A ``summary.json``-shaped dictionary (simulations.experiment.summarise), causal, with
    convergence; None is a JSON null."""
    s = {
        "preset": "tiny",
        "description": "a tiny run",
        "config": {"width": 32, "depth": 8, "gamma": 0.123456, "tau0": 1.0},
        "T": 0.25,
        "tokens": 3,
        "rho0": 0.2,
        "samples": 64,
        "quantiles": [0.05, 0.5, 0.95],
        "rho_T": {
            "network": {"quantiles": [0.1, 0.2, 0.3], "se": [0.01, None, 0.02]},
            "sde": {"quantiles": [0.11, None, 0.31], "se": [None, None, None]},
        },
        "distances_T": {"ks_rho": 0.1, "ks_rho_pvalue": 0.0005, "w1_rho": 0.02,
                        "ks_logVaa": None, "ks_logVaa_pvalue": 0.9995, "w1_logVaa": 0.5},
        "sde": {"exploded": 2, "samples": 64},
        "token_pairs": {
            "pairs": ["0-1", "0-2", "1-2"],
            "mean_rho_T": {"network": [0.5, 0.25, None], "sde": [0.51, 0.26, 0.3]},
            "mean_rho_T_se": {"network": [0.01, 0.02, 0.03], "sde": [0.01, 0.01, 0.01]},
        },
        "collapse": {
            "threshold": 0.9,
            "models": {
                "network": {"fraction_collapsed": 0.5, "median_collapse_layer": 2,
                            "final_mean_rho": 0.95, "samples": 64},
                "sde": {"fraction_collapsed": 0.0, "median_collapse_layer": -1,
                        "final_mean_rho": None, "samples": 64},
            },
        },
        "convergence": {"widths": [16, 32, 64], "w1_rho": [0.1, None, 0.05],
                        "w1_rho_slope": -0.5123, "w1_rho_slope_se": 0.2,
                        "w1_rho_noise_floor": 0.01},
        "run_times_s": {"network": 12.34, "sde": 0.06},
    }  # fmt: skip
    return s | changes


_HEAD = [
    "shapedtx compare [tiny] a tiny run",
    "  width 32, depth 8, T = 0.25, m = 3, rho0 = 0.2, gamma = 0.1235, tau0 = 1, 64 samples",
    "rho at T (5%/50%/95% quantiles, ± max SE):",
    "  network   0.100  0.200  0.300   ± 0.020",
    "  sde       0.110    nan  0.310   ± nan",
    "distances at T: rho KS  0.100 (p = 0.0005), W1  0.020; log V^aa KS    nan "
    "(p = > 0.999), W1  0.500",
    "SDE paths exploded: 2 of 64 (excluded)",
]
_PAIRS = (
    "causal: mean rho at T by token pair, network/SDE: 0-1 0.500/0.510 (± 0.010), "
    "0-2 0.250/0.260 (± 0.020), 1-2 nan/0.300 (± 0.030)"
)
_COLLAPSE = [
    "rank collapse (mean rho > 0.9; median layer -1: never, fewer than half collapse):",
    "  model    collapsed  median layer  final mean rho",
    "  network        50%             2   0.950",
    "  sde             0%            -1     nan",
]
_WIDTHS = "convergence, W1(rho_T) by width {16: 0.1000, 32: nan, 64: 0.0500}; slope "
_FLOOR = " (theory about -0.5; noise floor 0.010)"
_TIMES = "run times (s): network 12.3, sde 0.1"


def test_format_summary_in_full():
    """The compare table: quantiles in 6 characters with 3 decimals and the largest SE among
    those given, p-values by p_value, the causal token-pair line, the collapse table, the
    convergence line with the fitted slope and its SE, the run times with 1 decimal."""
    assert format_summary(_summary()).splitlines() == [
        *_HEAD,
        _PAIRS,
        *_COLLAPSE,
        _WIDTHS + "-0.51 ± 0.20" + _FLOOR,
        _TIMES,
    ]


def test_format_summary_optional_lines():
    """No token_pairs (not causal): no causal line; convergence None: no convergence line; a
    slope not fitted (None) says so; a missing slope SE prints nan; an SE of exactly 0 prints
    0.00."""
    s = _summary(convergence=None)
    del s["token_pairs"]
    assert format_summary(s).splitlines() == [*_HEAD, *_COLLAPSE, _TIMES]
    cv = _summary()["convergence"]
    unfitted = _summary(convergence=cv | {"w1_rho_slope": None, "w1_rho_slope_se": None})
    assert format_summary(unfitted).splitlines()[-2] == (
        _WIDTHS + "not fitted (too few widths above the noise floor)" + _FLOOR
    )
    no_se = _summary(convergence=cv | {"w1_rho_slope_se": None})
    assert format_summary(no_se).splitlines()[-2] == _WIDTHS + "-0.51 ± nan" + _FLOOR
    zero_se = _summary(convergence=cv | {"w1_rho_slope_se": 0.0})
    assert format_summary(zero_se).splitlines()[-2] == _WIDTHS + "-0.51 ± 0.00" + _FLOOR


def test_format_summary_refuses_lists_of_different_lengths():
    """Per-pair and per-width lists that disagree are an error, not silently cut short."""
    tp = _summary()["token_pairs"]
    with pytest.raises(ValueError):
        format_summary(_summary(token_pairs=tp | {"pairs": ["0-1", "0-2"]}))
    cv = _summary()["convergence"]
    with pytest.raises(ValueError):
        format_summary(_summary(convergence=cv | {"widths": [16, 32]}))


# -- advise -----------------------------------------------------------------------------------

_DESIGN = DesignChecks(depth_threshold=3.7856, regime="depth-inefficient", allocation="too deep",
                       key_dim=32, head_dim=32, head_size_ok=True, bh_bottleneck=False,
                       max_unbottlenecked_heads=16)  # fmt: skip
_RULE = "largest safe gamma with rho_spread <= 0.1, then smallest tau0; else smallest rho_spread"
_ADVICE_HEADER = ("gamma", "tau0", "stage", "N", "collapse", "exploded", "norm q", "rho_spread",
                  "verdict")  # fmt: skip


def _advice(candidates, gamma=0.6, tau0=0.5, design=_DESIGN, notes=("a note",)):
    return Advice(
        gamma=gamma, tau0=tau0, T=0.125, width=64, depth=8, tokens=4, heads=2,
        mlp="shaped_relu", causal=True, rho0=0.2, criteria=Criteria(), spread_target=0.1,
        candidates=tuple(candidates), design=design, steps=50, screen_samples=100, samples=400,
        seconds=12.34, notes=notes, sim_tokens=4, estimated_seconds=20.4,
    )  # fmt: skip


_PASS = Candidate(0.6, 0.5, Measurement(400, 0.0, 0.0, 0.0, 0.0, 2.5, 0.1234, 0.0912, 0.0031,
                                        0.3), (), "confirmed")  # fmt: skip
_UNRESOLVED = Candidate(
    0.6, 1.0, Measurement(400, 0.0075, 0.0043, 0.0, 0.0, 9.5, 0.8, 0.0953, 0.0036, 0.3), (),
    "confirmed",
    unresolved=("collapse 0.0075 < 0.01 by less than 2 SE (0.005); resolving it needs about "
                "634 paths", "norm q99 9.5 < 10 but its 2-SE upper bound is 10.4"),
)  # fmt: skip
_PLAUSIBLE_FAIL = Candidate(  # screened, violated but not significantly: plausible
    0.5, 0.5, Measurement(100, 0.0, 0.0, 0.01, 0.0099, 3.0, 0.25, 0.08, 0.006, 0.3),
    ("exploded 0.01 >= 0.001",), "screen",
)  # fmt: skip
_FAIL = Candidate(
    0.7, 0.5, Measurement(100, 0.5, 0.05, 0.0, 0.0, 20.0, 1.5, 0.2, 0.01, 0.8),
    ("collapse 0.5 >= 0.01", "norm q99 20 >= 10"), "screen",
    significant=("collapse 0.5 >= 0.01", "norm q99 20 >= 10"),
)  # fmt: skip


def test_format_advice_in_full():
    """Advice line with lambda = sqrt(1 - gamma^2) (0.6 -> 0.8), the criteria, the ranking rule
    with the spread target, the sampling, the binomial SEs at the thresholds (2 significant
    digits), the candidates (each verdict's wording), the [LW] and [BH] checks, the notes; no
    "more candidates" line when all are shown."""
    rows = [
        ("0.6", "0.5", "confirmed", 400, "0.0000+-0.0000", "0.0000+-0.0000", "2.5+-0.12",
         "0.091+-0.003", "pass"),
        ("0.6", "1", "confirmed", 400, "0.0075+-0.0043", "0.0000+-0.0000", "9.5+-0.8",
         "0.095+-0.004", "unresolved (passes by < 2 SE): collapse, norm q99"),
        ("0.5", "0.5", "screen", 100, "0.0000+-0.0000", "0.0100+-0.0099", "3+-0.25",
         "0.080+-0.006", "unresolved (within 2 SE): exploded 0.01 >= 0.001"),
        ("0.7", "0.5", "screen", 100, "0.5000+-0.0500", "0.0000+-0.0000", "20+-1.5",
         "0.200+-0.010", "collapse 0.5 >= 0.01; norm q99 20 >= 10"),
    ]  # fmt: skip
    text = format_advice(_advice([_PASS, _UNRESOLVED, _PLAUSIBLE_FAIL, _FAIL]))
    assert text == "\n".join(
        [
            "shapedtx advise: width 64, depth 8, tokens 4, heads 2, mlp shaped_relu, causal True: "
            "T = d/n = 0.125",
            "advice: gamma = 0.6 (lambda = 0.8000), tau0 = 0.5",
            "criteria: collapse P(max rho_T > 0.99) < 0.01; exploded < 0.001; "
            "q99(V_T^aa/V_0^aa) < 10",
            f"ranking: {_RULE}",
            "sampling: 50 Euler steps, screen 100 paths, confirm 400 paths, SDE with m = 4 "
            "tokens; 12.3 s (estimated 20 s)",
            # sqrt(0.01 * 0.99 / 400), sqrt(0.001 * 0.999 / 400), then with 100 paths
            "Monte Carlo SE at the thresholds (confirmed): collapse 0.005, exploded 0.0016 "
            "(screen: 0.0099, 0.0032); rows show each estimate's SE",
            "",
            table(_ADVICE_HEADER, rows),
            "",
            "[LW] depth threshold log_3(n) = 3.79: depth 8 is depth-inefficient; allocation for "
            "12 L d^2: too deep",
            "[BH] key size per head 32 vs m = 4: ok (>= m - 1); at most 16 heads of size "
            "n/heads >= m",
            "note: a note",
            "",
            "model advised: the shaped Transformer at this gamma and tau0 at initialisation, "
            "the preset shaped and shaped_free (the same network at initialisation, slopes, "
            "attention gains and temperature trainable; docs/guide/models.md)",
            "checked in training: only shaped ReLU MLP 4n, 4 heads, causal (this advice's "
            "model: not checked)",
        ]
    )
    # table() right-aligns the verdicts: "pass" ends the widest one's 49 characters
    assert text.splitlines()[9].endswith("0.091+-0.003  " + " " * 45 + "pass")


def test_format_advice_without_advice_and_with_small_heads():
    """No advised (gamma, tau0), or only half of one: the "NO candidate" line; a head size
    below m - 1: TOO SMALL; no notes: no note line."""
    small = DesignChecks(1.26, "depth-efficient", "too shallow", 2, 2, False, True, 0)
    for gamma, tau0 in ((None, None), (0.6, None), (None, 0.5)):
        lines = format_advice(
            _advice([_FAIL], gamma=gamma, tau0=tau0, design=small, notes=())
        ).splitlines()
        assert lines[1] == "NO candidate of the grid passes the criteria"
        assert lines[-5:-3] == [
            "[LW] depth threshold log_3(n) = 1.26: depth 8 is depth-efficient; allocation for "
            "12 L d^2: too shallow",
            "[BH] key size per head 2 vs m = 4: TOO SMALL (< m - 1); at most 0 heads of size "
            "n/heads >= m",
        ]


def _candidate(gamma: float, tau0: float, plausible: bool) -> Candidate:
    """A confirmed pass (plausible) or a screened significant failure (not plausible)."""
    m = _PASS.measurement if plausible else _FAIL.measurement
    violations = () if plausible else _FAIL.violations
    stage = "confirmed" if plausible else "screen"
    return Candidate(gamma, tau0, m, violations, stage, significant=violations)


def _shown(text: str) -> list[tuple[str, str]]:
    """(gamma, tau0) of the table's rows in a format_advice report."""
    lines = text.splitlines()
    start = lines.index("") + 3  # blank line, header, rule
    rows = []
    for line in lines[start:]:
        if not line or line.startswith("("):
            break
        rows.append(tuple(line.split()[:2]))
    return rows


def test_format_advice_short_table_and_every():
    """Without ``every``: the first six candidates, then each further gamma's first candidate
    that is not plausibly safe, unless a not-plausible candidate of that gamma is among the
    first six; a line counts the rest. ``every``: all rows, no count."""
    spec = [
        (0.6, 0.5, True), (0.6, 1.0, True), (0.5, 0.5, True), (0.7, 0.5, False),
        (0.4, 0.5, True), (0.3, 0.5, True),
        (0.8, 0.5, False),  # first failure of gamma 0.8: shown
        (0.8, 1.0, False),  # gamma 0.8 already shown
        (0.7, 1.0, False),  # gamma 0.7 failed among the first six
        (0.2, 0.5, True),  # plausible: not a failure
        (0.9, 0.5, False),  # first failure of gamma 0.9: shown
    ]  # fmt: skip
    advice = _advice([_candidate(*c) for c in spec])
    text = format_advice(advice)
    assert _shown(text) == [
        ("0.6", "0.5"), ("0.6", "1"), ("0.5", "0.5"), ("0.7", "0.5"), ("0.4", "0.5"),
        ("0.3", "0.5"), ("0.8", "0.5"), ("0.9", "0.5"),
    ]  # fmt: skip
    assert "(3 more candidates: --all or --json)" in text.splitlines()
    full = format_advice(advice, every=True)
    assert _shown(full) == [(f"{g:g}", f"{t:g}") for g, t, _ in spec]
    assert "more candidates" not in full
    # a seventh candidate that is plausible is not shown
    seven = format_advice(_advice([_candidate(0.1 * k, 0.5, True) for k in range(1, 8)]))
    assert _shown(seven) == [(f"{0.1 * k:g}", "0.5") for k in range(1, 7)]
    assert "(1 more candidates: --all or --json)" in seven.splitlines()


# -- design -----------------------------------------------------------------------------------

_FIT = (
    "fit: ln d*(L) = 5.039 + 0.0555 L, size N = 12 L d^2 (BigScience restatement of Levine et "
    "al. 2020; docs/theory.md#depth-width)"
)
_SHAPE_HEADER = ("", "depth L", "width d", "12 L d^2")


def test_format_shape_above_the_threshold():
    """12 x 10 x 256^2 = 7864320 = 65.5% of 1.2e7; log_3(256) = 5.05 < depth 10."""
    shape = Shape(params=1.2e7, depth=10.5, width=300.3, depth_rounded=10, width_rounded=256,
                  multiple=128)  # fmt: skip
    rows = [("optimal (real)", "10.50", "300.3", "1.2e+07"),
            ("rounded (width multiple of 128)", 10, 256, "7.864e+06")]  # fmt: skip
    assert format_shape(1.2e7, shape) == "\n".join(
        [
            "Recommended shape for N = 1.2e+07 non-embedding parameters",
            _FIT,
            "",
            table(_SHAPE_HEADER, rows),
            "rounded shape spends 65.5% of the budget",
            "",
            "depth threshold log_3(d) = 5.05: depth 10 is above it, where depth and width "
            "contribute similarly (true of every practical model; the fitted optimum above is "
            "the recommendation)",
        ]
    )


def test_format_shape_below_the_threshold_with_the_extrapolation_warning():
    """log_3(128) = 4.42 > depth 1; N = 10 is far below the budgets the fit was checked on."""
    shape = Shape(params=10.0, depth=1.5, width=0.8, depth_rounded=1, width_rounded=128,
                  multiple=128)  # fmt: skip
    rows = [("optimal (real)", "1.50", "0.8", "10"),
            ("rounded (width multiple of 128)", 1, 128, "1.966e+05")]  # fmt: skip
    assert format_shape(10.0, shape).splitlines() == [
        "Recommended shape for N = 10 non-embedding parameters",
        _FIT,
        "warning: N = 10 is far outside the budgets the fit was checked on (1e+06 to 1e+12 "
        "parameters): the shape is an extrapolation",
        "",
        *table(_SHAPE_HEADER, rows).splitlines(),
        "rounded shape spends 1966080.0% of the budget",
        "",
        "depth threshold log_3(d) = 4.42: depth 1 is below it, where depth is far more "
        "efficient than width",
    ]


def test_format_head_sizes():
    """One row per layout; the closing line from the first (standard) report."""
    standard = HeadSizeReport(512, 8, 64, 64, 128, True, 64, 4, 1048576, 1048576, 2097152)
    fixed = HeadSizeReport(512, 8, 128, 128, 128, False, 128, 4, 2097152, 1048576, 2097152)
    text = format_head_sizes(128, {"standard": (8, 64, standard), "d_p = m": (8, 128, fixed)})
    rows = [("standard", 8, 64, 64, "yes", "1.049e+06"), ("d_p = m", 8, 128, 128, "no",
                                                          "2.097e+06")]  # fmt: skip
    header = ("layout", "heads", "d_p", "logit rank <=", "d_p < m", "attn params/layer")
    assert text == "\n".join(
        [
            "Head size at sequence length m = 128 (Bhojanapalli et al. 2020; "
            "docs/theory.md#head-size)",
            table(header, rows),
            "standard layout (4 d^2 = 1.049e+06 per layer): at most 4 heads of size d / heads >= m",
        ]
    )


def test_format_gpt3():
    """12 x 12 x 768^2 = 8.49e7, log_3(768) = 6.0 < 12: above; a toy row below its threshold
    whose head size 4096 is not below the context 2048."""
    small = DesignRow("GPT-3 Small (125M)", 12, 768, 12, 64, 2048, 6.0474, "depth-inefficient",
                      "too deep", Shape(84934656, 9.87, 848.4, 10, 768, 128))  # fmt: skip
    toy = DesignRow("toy", 2, 4096, 1, 4096, 2048, 7.57, "depth-efficient", "too shallow",
                    Shape(4.0e8, 40.2, 900.6, 40, 896, 128))  # fmt: skip
    header = ("model", "L", "d", "heads", "d_p", "12 L d^2", "log3 d", "L vs log3 d", "verdict",
              "L*", "d*", "rounded L x d (mult. 128)", "d_p < 2048")  # fmt: skip
    cells = [
        ("GPT-3 Small (125M)", 12, 768, 12, 64, "8.49e+07", "6.0", "above", "too deep", "9.9",
         "848", "10 x 768", "yes"),
        ("toy", 2, 4096, 1, 4096, "4.03e+08", "7.6", "below", "too shallow", "40.2", "901",
         "40 x 896", "no"),
    ]  # fmt: skip
    assert format_gpt3([small, toy], 128) == "\n".join(
        [
            "GPT-3 family (Brown et al. 2020, Table 2.1) against the fitted optimum for its size",
            _FIT,
            "verdict: depth vs L* for the same 12 L d^2, +-10%",
            "",
            table(header, cells),
        ]
    )


# -- sweep, probe, stability --------------------------------------------------------------------


def test_format_sweep_lists_the_first_failures():
    """Counts, then one line per failure (the error's first line) up to ``listed``, then how
    many more."""
    failed = {"a=1": "ValueError: bad\nTraceback (most recent call last)", "a=2": "", "a=3": "x"}
    summary = SweepSummary(store=Path("out/s.zarr"), total=10, computed=5, skipped=2,
                           failed=failed)  # fmt: skip
    head = "sweep[simulate] 10 points: 5 computed, 2 already done, 3 failed; store out/s.zarr"
    lines = ["  failed: a=1: ValueError: bad", "  failed: a=2: ", "  failed: a=3: x"]
    assert format_sweep(summary, "simulate").splitlines() == [head, *lines]
    assert format_sweep(summary, "simulate", listed=3).splitlines() == [head, *lines]
    assert format_sweep(summary, "simulate", listed=2).splitlines() == [
        head, *lines[:2], "  ... and 1 more (simulations.open_sweep)"
    ]  # fmt: skip
    many = SweepSummary(store=Path("s"), total=21, failed={f"p{i}": "e" for i in range(21)})
    text = format_sweep(many, "sde").splitlines()  # default: 20 listed
    assert len(text) == 22 and text[20] == "  failed: p19: e"
    assert text[21] == "  ... and 1 more (simulations.open_sweep)"


def test_format_probe():
    """Windows by layer; collapsed where the mean correlation first exceeds 0.9 (layers 2, 1,
    3: median 2; one never); the mean correlation after the last block, (0.96 + 0.98 + 0.94 +
    0.42) / 4 = 0.825."""
    rho = np.array(
        [
            [0.1, 0.5, 0.95, 0.96],
            [0.1, 0.92, 0.99, 0.98],
            [0.1, 0.2, 0.3, 0.94],
            [0.1, 0.2, 0.3, 0.42],
        ]
    )
    ds = xr.Dataset({"V": (("window", "layer", "a", "b"), _correlations(rho))},
                    attrs={"step": 100})  # fmt: skip
    assert format_probe(ds, 0.9) == (
        "step 100: 3/4 windows collapsed (mean rho > 0.9), first at layer 2 (median); "
        "mean rho after the last block 0.8250"
    )
    calm = ds.isel(window=[3]).assign_attrs(step=7)
    assert format_probe(calm, 0.9) == (
        "step 7: 0/1 windows collapsed (mean rho > 0.9); mean rho after the last block 0.4200"
    )


def _stability(agreement: bool) -> xr.Dataset:
    nan = math.nan
    attrs = {"low": 1e-4, "high": 1e4, "T_max": 4.0}
    if agreement:
        attrs |= {"fraction_within_10pct": 0.75, "cells_censored_both": 1, "worst_gamma": 0.1,
                  "worst_tau0": 1.0, "worst_network": 0.123, "worst_sde": 0.2}  # fmt: skip
    dims = ("source", "gamma", "tau0")
    return xr.Dataset(
        {
            "median_exit": (dims, [[[0.123, nan], [2.0, 0.5]], [[0.125, 1.5], [1.9, 0.55]]]),
            "censored": (dims, [[[0.0, 0.0], [0.5, 0.2]], [[0.0, 0.6], [0.49, 0.0]]]),
        },
        coords={"source": ["network", "sde"], "gamma": [0.1, 0.2], "tau0": [0.5, 1.0]},
        attrs=attrs,
    )


def test_format_stability_map():
    """Cells ``network / SDE`` right-aligned in 16 characters, ``c`` where half the paths or
    more are censored (0.5 is, 0.49 is not), ``-`` for NaN; the agreement line only when the
    Dataset has its numbers."""
    lines = [
        "median first t out of [0.0001, 10000] (cap T_max = 4; network / SDE; c: half the paths "
        "or more never leave):",
        "gamma \\ tau0              0.5               1",
        "0.1            0.123 / 0.125        - / 1.5c",
        "0.2                 2c / 1.9      0.5 / 0.55",
    ]
    assert format_stability_map(_stability(False)).splitlines() == lines
    assert format_stability_map(_stability(True)).splitlines() == [
        *lines,
        "agreement: 75% of cells within 10% (1 censored on both sides); worst cell gamma = 0.1, "
        "tau0 = 1: network 0.123, SDE 0.2",
    ]
