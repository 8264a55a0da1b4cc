"""The transfer study (examples/transfer, issue 37 item 3): its optimum fit, its quick mode end to
end on the Dask path, and ``simulations.transfer_lr`` (item 5) reading what it measured."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shapedtx import ParameterError
from simulations import transfer_lr
from simulations.transfer import NOT_MEASURED

STUDY = Path(__file__).parents[1] / "examples" / "transfer"


def _flat(path: Path) -> str:
    """A document's text with line breaks and indentation folded into single spaces."""
    return " ".join(path.read_text().split())


def _cells() -> dict[str, dict]:
    """The committed report's cells at 1000 steps, by parametrisation."""
    summary = json.loads((STUDY / "results.json").read_text())
    return {n: p["1000"] for n, p in summary["parametrisations"].items()}


def _load(name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, STUDY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # restored after the test: examples/long_horizon has modules of the same names
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def modules(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    return _load("study", monkeypatch), _load("report", monkeypatch)


def test_gpu_runs_with_their_own_batch_order_are_marked(modules):
    """A GPU run whose result.json does not record the CPU's batch generator drew its batches
    on the GPU (before 2026-11-28): the report counts it apart from the GPU runs that did."""
    _, report = modules
    runs = [{"device": "cpu", "batch_generator": "cpu"}, {"device": "cpu"},
            {"device": "cuda:0", "batch_generator": "cpu"}, {"device": "cuda"}, {}]  # fmt: skip
    assert report._devices(runs) == {"cpu": 2, "cuda": 1, "cuda (own order)": 1, "unrecorded": 1}


def test_wall_times_leave_out_resumed_and_diverged_runs(modules):
    """A resumed run's wall_seconds is its last call's, a diverged run's stops early: the
    report's wall range per device uses neither."""
    _, report = modules
    ok, bad = {"1000": {"diverged": False}}, {"1000": {"diverged": True}}
    runs = [{"device": "cpu", "wall_seconds": 600, "horizons": ok},
            {"device": "cpu", "wall_seconds": 900, "horizons": ok, "resumed": False},
            {"device": "cpu", "wall_seconds": 60, "horizons": ok, "resumed": True},
            {"device": "cpu", "wall_seconds": 30, "horizons": bad}]  # fmt: skip
    assert report._walls(runs) == {"cpu": [10.0, 15.0]}


def test_fit_finds_the_vertex_of_a_parabola(modules):
    """A quadratic in log2(lr) with its minimum at -6.3 is found there from the 5 points around
    the lowest one; a diverged point (inf) is skipped; the lowest point at an edge is reported
    as such, not fitted."""
    _, report = modules
    x = [-10.0, -9, -8, -7, -6, -5, -4]
    y = [0.1 * (v + 6.3) ** 2 + 2.0 for v in x]
    y[0] = math.inf
    fit = report.fit_optimum(x, y)
    assert fit["log2_lr"] == pytest.approx(-6.3, abs=1e-9) and fit["convex"]
    assert fit["loss"] == pytest.approx(2.0, abs=1e-9)
    edge = report.fit_optimum(x, [-v for v in x])
    assert edge["at_edge"] and edge["edge"] == "grid" and edge["log2_lr"] == -4.0
    # the next lr diverged: bounded by divergence, not a grid edge (plan() does not extend it)
    bounded = report.fit_optimum(x, [-v for v in x[:-1]] + [math.inf])
    assert bounded["edge"] == "diverged" and bounded["log2_lr"] == -5.0
    rng = np.random.default_rng(0)
    samples = report.bootstrap(x, y, 0.01, rng)
    assert abs(np.median(samples) + 6.3) < 0.1 and np.std(samples) > 0
    assert report.bootstrap(x, y, None, rng) is None


def test_fit_window_is_symmetric_about_the_lowest_point(modules):
    """Next to the last finite point the window keeps one point per side (three in all), not
    one on the near side and two on the far side: on a curve steeper above its minimum than
    below (an asymmetric loss-vs-lr curve) a lopsided window moves the vertex."""
    _, report = modules
    x = [-10.0, -9, -8, -7, -6, -5, -4]
    y = [2.0 + (0.05 if v < -5.2 else 0.4) * (v + 5.2) ** 2 for v in x]
    fit = report.fit_optimum(x, y)  # lowest at -5: one point on its right
    assert fit["points"] == [4, 5, 6]
    xs, ys = np.array(x[4:]), np.array(y[4:])
    a, b, _ = np.polyfit(xs, ys, 2)
    assert fit["log2_lr"] == pytest.approx(-b / (2 * a), abs=1e-9)


def test_plan_extends_an_edge_and_seeds_the_optimum(modules):
    study, _ = modules
    setup = replace(study.QUICK, parametrisations=("shaped_t",), widths=(16,), depths=(2,))
    first = study.plan(setup, [])
    centre = study.LOG2_LR_CENTRE["shaped_t"] + setup.log2_lr_offset
    assert first == [("shaped_t", 16, 2, j, 0) for j in (centre - 1, centre, centre + 1)]
    # --log2-lrs: only the planned runs at those base lrs, in the plan's order
    assert study.planned(setup, [], (centre + 1, centre - 1)) == [first[0], first[2]]
    assert study.planned(setup, [], None) == first
    # the lowest loss at the upper edge: one more lr above it, no seeds yet
    fake = [
        {
            "parametrisation": "shaped_t", "width": 16, "depth": 2, "log2_lr": j, "seed": 0,
            "horizons": {"40": {"diverged": False, "val_loss": 5.0 - j}},
        }
        for j in (centre - 1, centre, centre + 1)
    ]  # fmt: skip
    assert study.plan(setup, fake) == [("shaped_t", 16, 2, centre + 2, 0)]
    fake[-1]["horizons"]["40"]["val_loss"] = 10.0  # now the centre is best: its seeds follow
    assert study.plan(setup, fake) == [("shaped_t", 16, 2, centre, 1)]
    # a wider grid with its outer lrs not run yet: the best lr is bracketed by run neighbours,
    # so its seeds are planned (after the grid's missing lrs) without waiting for the outer ones
    wide = replace(setup, half_grid=2)
    outer = [("shaped_t", 16, 2, j, 0) for j in (centre - 2, centre + 2)]
    assert study.plan(wide, fake) == [*outer, ("shaped_t", 16, 2, centre, 1)]
    assert study.planned(wide, fake, (centre,)) == [("shaped_t", 16, 2, centre, 1)]
    # ... but not while the best lr is one of the run grid's edges
    assert study.plan(wide, fake[1:]) == [outer[0], ("shaped_t", 16, 2, centre - 1, 0), outer[1]]
    # every lr diverged: the optimum lies below the grid, one more lr below it, no seeds
    for r in fake:
        r["horizons"]["40"] = {"diverged": True, "val_loss": None}
    assert study.plan(setup, fake) == [("shaped_t", 16, 2, centre - 2, 0)]


def test_seeds_option_plans_more_seeds_at_the_seeded_depths_best_lr(modules):
    """--seeds N: seeds 0..N-1 at the best lr of the seeded depths among --depths; the
    default plan (3 seeds) asks for none of them; N < 1 is refused naming the option."""
    study, _ = modules
    args = study.parse(["--seeds", "9", "--depths", "64", "--parametrisations", "pre_ln"])
    setup = study.setup_of(args)
    assert setup.seeds == tuple(range(9)) and setup.seed_depths == (64,)
    results = study.load_results(STUDY)
    best = study.best_j(
        [
            r
            for r in results
            if (r["parametrisation"], r["depth"], r["width"]) == ("pre_ln", 64, 64)
        ],
        1000,
    )
    done = {r["seed"] for r in results if (r["parametrisation"], r["depth"], r["width"],
            r["log2_lr"]) == ("pre_ln", 64, 64, best)}  # fmt: skip
    expected = [("pre_ln", 64, 64, best, s) for s in range(9) if s not in done]
    assert expected and [job for job in study.plan(setup, results) if job[2] == 64] == expected
    with pytest.raises(SystemExit):
        study.parse(["--seeds", "0"])


def test_plan_runs_completep_width_axis_once(modules):
    """At the proxy's depth CompleteP is depth-muP (bit for bit on one machine, tested):
    its width axis is not planned, its depth axis (the proxy included) is; depth-muP's width
    axis is planned."""
    study, _ = modules
    setup = replace(
        study.QUICK, parametrisations=("pre_ln_depth_mup", "pre_ln_completep"), half_grid=0,
        depths=(2, 4), widths=(8, 16, 32), seed_depths=(),
    )  # fmt: skip
    shapes = {(name, w, d) for name, w, d, _, _ in study.plan(setup, [])}
    assert shapes == {
        *(("pre_ln_depth_mup", w, 2) for w in (8, 16, 32)),
        ("pre_ln_depth_mup", 16, 4),
        ("pre_ln_completep", 16, 2),
        ("pre_ln_completep", 16, 4),
    }


def test_quick_transfer_study_end_to_end_on_dask(modules, tmp_path, monkeypatch):
    """--quick on an embedded Dask cluster, one parametrisation at two depths: every run's
    result.json, the fitted optima, figures, tables; a second call trains nothing again; and
    transfer_lr cites the drift the study measured. It trains on an exported corpus
    (``--data``, as on a device with another Python): the default corpus's bytes."""
    from shapedtx.training import export_corpus, load_corpus

    study, _ = modules
    monkeypatch.setattr(study, "QUICK", replace(study.QUICK, max_extensions=0))
    corpus = export_corpus(tmp_path / "corpus", max_bytes=study.QUICK.max_bytes)
    out = tmp_path / "study"
    args = ["--quick", "--out", str(out), "--parametrisations", "shaped_t", "--data", str(corpus)]
    args += ["--depths", "2", "4", "--widths", "16", "--workers", "1"]
    assert study.main(args) == 0
    summary = json.loads((out / "results.json").read_text())
    default = load_corpus(max_bytes=study.QUICK.max_bytes).fingerprint()
    assert summary["corpus_fingerprint"] == default
    assert summary["devices"] == {"cpu": 8}  # 2 shapes x 3 lrs + seed 1 at 2 depths
    cell = summary["parametrisations"]["shaped_t"]["40"]
    assert set(cell["shapes"]) == {"w16_d2", "w16_d4"}
    assert [c["devices"] for c in cell["shapes"].values()] == [{"cpu": 4}] * 2
    for c in cell["shapes"].values():
        assert len(c["lr_curve"]["log2_lr"]) == 3
        assert c["seeds"]["n"] + c["seeds"]["diverged"] == 2  # seeds 0 and 1 at the best lr
    drift = cell["depth_drift"]
    opt = [cell["shapes"][f"w16_d{d}"]["fit"]["log2_lr"] for d in (2, 4)]
    assert drift["last_minus_first"] == pytest.approx(opt[1] - opt[0])
    assert (out / "figures" / "loss_vs_lr_shaped_t.png").stat().st_size > 0
    assert (out / "figures" / "optimum_drift.png").stat().st_size > 0
    tables = (out / "tables.md").read_text()
    # the shape's row: lrs run, the grid's best, the fit, where and how long the runs trained
    c4 = cell["shapes"]["w16_d4"]
    js, losses = c4["lr_curve"]["log2_lr"], c4["lr_curve"]["val_loss"]
    best = min((v, j) for j, v in zip(js, losses, strict=True) if v is not None)
    lo, hi = c4["wall_minutes"]["cpu"]
    assert 0 < lo <= hi
    row = f"| shaped_t | 16 | 4 | 3: 2^{js[0]:.0f} to 2^{js[2]:.0f} | 2^{best[1]:.0f}: "
    row += f"{best[0]:.3f} | {c4['fit']['log2_lr']:.2f}"
    assert row in tables and f"| cpu 4 | cpu {lo:.1f}-{hi:.1f} |" in tables
    # the summary row: the drift with its interval, sizes, and the losses at the two ends
    iv = drift["last_minus_first_interval"]
    ends = [cell["shapes"][f"w16_d{d}"] for d in (2, 4)]
    for c in ends:  # the grid's lowest loss, seed 0
        curve = c["lr_curve"]
        low = min(v for v in curve["val_loss"] if v is not None)
        assert c["best"] == {"log2_lr": curve["log2_lr"][curve["val_loss"].index(low)],
                             "val_loss": low}  # fmt: skip
    losses = " -> ".join(f"{c['best']['val_loss']:.3f}" for c in ends)
    row = f"| shaped_t | {drift['last_minus_first']:+.2f}"
    row += "".join({"grid": "*", "diverged": "+"}[e] for e in drift["edges"])
    row += (f" [{iv[0]:+.2f}, {iv[1]:+.2f}]" if iv else "") + " (2->4) | "
    assert row in tables and f"| {losses} | - |" in tables
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/*/result.json")}
    assert len(stamps) == 8  # 2 shapes x 3 lrs + seed 1 at 2 depths
    assert study.main(args) == 0  # resumes: nothing is trained again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    advice = transfer_lr(1e-2, 16, 2, 16, 8, "shaped_t", results=out / "results.json")
    assert f"{drift['last_minus_first']:+.2f}" in advice.evidence
    assert "from depth 2 to 4" in advice.evidence
    assert "target depth 8 is outside the measured 2-4" in advice.evidence
    assert advice.measured["depth_drift"] == drift


def test_three_point_drift_uses_one_window_at_every_depth(modules):
    """On an asymmetric loss curve the vertex moves with the window: a depth with 7 lrs run
    (5-point fit) and one with 3 (3-point fit) drift apart although their curves are the
    same; ``depth_drift_3pt`` fits 3 points at both and finds no drift, and tables.md has
    its row."""
    study, report = modules
    setup = replace(
        study.QUICK, parametrisations=("shaped_t",), depths=(2, 4), widths=(16,),
        horizons=(40,), seed_depths=(),
    )  # fmt: skip

    def loss(j: int) -> float:
        return 2.0 + (0.05 if j < -6.7 else 0.4) * (j + 6.7) ** 2

    grids = {2: range(-10, -3), 4: range(-8, -5)}
    fake = [
        {
            "parametrisation": "shaped_t", "width": 16, "depth": depth, "log2_lr": j,
            "seed": 0, "horizons": {"40": {"diverged": False, "val_loss": loss(j)}},
        }
        for depth, grid in grids.items()
        for j in grid
    ]  # fmt: skip
    summary = report.summarise(setup, fake)
    cell = summary["parametrisations"]["shaped_t"]["40"]
    x = [-8.0, -7.0, -6.0]
    a, b, _ = np.polyfit(x, [loss(int(j)) for j in x], 2)
    for depth in (2, 4):
        fit_3pt = cell["shapes"][f"w16_d{depth}"]["fit_3pt"]
        assert fit_3pt["log2_lr"] == pytest.approx(-b / (2 * a), abs=1e-9)
    assert abs(cell["depth_drift"]["last_minus_first"]) > 0.1  # 3 points against 5
    assert cell["depth_drift_3pt"]["last_minus_first"] == pytest.approx(0.0, abs=1e-9)
    table = report.tables(setup, summary)
    assert "| shaped_t | depth 2->4 (3-point fits) | +0.00 |" in table


def test_drifts_compare_over_the_depths_every_parametrisation_has(modules):
    """When one parametrisation has run deeper than another, the deeper one also gets its
    drift over the shared depths only (``depth_drift_shared``), from the same fits; the one
    whose depths are the shared ones gets none, and tables.md labels the shared row."""
    study, report = modules
    setup = replace(
        study.QUICK, parametrisations=("shaped_t", "pre_ln_completep"), depths=(2, 4, 8),
        widths=(16,), horizons=(40,), seed_depths=(),
    )  # fmt: skip
    vertex = {("shaped_t", 2): -5.3, ("shaped_t", 4): -6.1, ("shaped_t", 8): -7.4}
    vertex |= {("pre_ln_completep", 2): -4.8, ("pre_ln_completep", 4): -4.6}
    fake = [
        {
            "parametrisation": name, "width": 16, "depth": depth, "log2_lr": j, "seed": 0,
            "horizons": {"40": {"diverged": False, "val_loss": 2 + 0.1 * (j - v) ** 2}},
        }
        for (name, depth), v in vertex.items()
        for j in range(-9, -1)
    ]  # fmt: skip
    summary = report.summarise(setup, fake)
    shaped = summary["parametrisations"]["shaped_t"]["40"]
    other = summary["parametrisations"]["pre_ln_completep"]["40"]
    assert shaped["depth_drift"]["sizes"] == [2, 4, 8]
    assert shaped["depth_drift"]["last_minus_first"] == pytest.approx(-7.4 + 5.3, abs=1e-9)
    assert shaped["depth_drift_shared"]["sizes"] == [2, 4]
    assert shaped["depth_drift_shared"]["last_minus_first"] == pytest.approx(-0.8, abs=1e-9)
    assert "depth_drift_shared" not in other
    assert other["depth_drift"]["last_minus_first"] == pytest.approx(0.2, abs=1e-9)
    assert "width_drift_shared" not in shaped  # one width: no width drift at all
    table = report.tables(setup, summary)
    assert "| shaped_t | depth 2->4 (range all share) | -0.80 |" in table
    assert "| shaped_t | depth 2->8 | -2.10 |" in table


def test_transfer_lr_gives_each_group_its_rule():
    a = transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_depth_mup", results="/nonexistent.json")
    assert a.lrs["hidden"] == pytest.approx(4e-3 / 4 / math.sqrt(8), rel=1e-10)
    assert a.lrs["readout"] == pytest.approx(1e-3, rel=1e-10)
    assert a.lrs["block_vector"] == pytest.approx(4e-3 / math.sqrt(8), rel=1e-10)
    assert a.lrs["embedding"] == a.lrs["final"] == 4e-3
    assert a.rule == "depth" and "Tensor Programs VI" in a.source
    assert a.evidence == NOT_MEASURED and a.measured is None
    s = transfer_lr(1e-2, 64, 8, 128, 32, "shaped_t", results="/nonexistent.json")
    assert s.lrs["hidden"] == pytest.approx(5e-3) and s.lrs["block_vector"] == 1e-2
    assert transfer_lr(1e-2, 64, 8, 256, 64, "pre_ln").lrs == dict.fromkeys(a.lrs, 1e-2)
    assert "evidence: " in str(s)


def test_transfer_lr_says_which_axis_was_not_measured(tmp_path):
    """A parametrisation measured across depth only (CompleteP: its width axis is
    depth-muP's) quotes its depth drift and says that no width drift was measured, only when
    the target's width is not the proxy's."""
    drift = {
        "sizes": [4, 64], "last_minus_first": -1.2, "last_minus_first_interval": None,
        "range": 1.2, "edges": [],
    }  # fmt: skip
    summary = {
        "proxy": {"width": 64, "depth": 8}, "horizons": [1000], "runs": 9,
        "parametrisations": {"pre_ln_completep": {"1000": {"depth_drift": drift}}},
    }  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps(summary))
    wide = transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_completep", results=path).evidence
    assert "moves -1.20 from depth 4 to 64" in wide
    assert "no drift measured across width (target width 256)" in wide
    narrow = transfer_lr(4e-3, 64, 8, 64, 64, "pre_ln_completep", results=path).evidence
    assert "moves -1.20" in narrow and "across width" not in narrow
    none = {**summary, "parametrisations": {"pre_ln_completep": {"1000": {}}}}
    path.write_text(json.dumps(none))
    assert transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_completep", results=path).evidence == (
        NOT_MEASURED
    )


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        ((0.0, 64, 8, 256, 64), "lr"),
        ((1e-2, 64, 0, 256, 64), "proxy_depth"),
        ((1e-2, 64, 8, 30, 64), "target_width"),  # 4 heads do not divide 30
        ((1e-2, 64, 8, 256, 64, "gpt3"), "parametrisation"),
    ],
)
def test_transfer_lr_refuses_bad_input(args, parameter):
    with pytest.raises(ParameterError) as err:
        transfer_lr(*args)
    assert err.value.parameter == parameter


def test_branch_multipliers_are_relative_to_the_proxy_depth(modules):
    """depth-muP's and CompleteP's multiplier (d / base_depth)^(-a) is 1 at the proxy's depth
    (CompleteP's (L / L_base)^(-a)), (64 / 8)^(-a) at depth 64; the other presets keep theirs."""
    study, _ = modules
    proxy_depth = study.DEFAULT.proxy[1]
    for name, a in (("pre_ln_depth_mup", 0.5), ("pre_ln_completep", 1.0)):
        assert study.model_config(name, 64, proxy_depth, proxy_depth).branch_weight == 1.0
        deep = study.model_config(name, 64, 64, proxy_depth)
        assert deep.branch_weight == pytest.approx((64 / proxy_depth) ** -a, rel=1e-12)
    for name in ("shaped_t", "pre_ln"):
        config = study.model_config(name, 64, 64, proxy_depth)
        assert config == study.preset(name, width=64, depth=64, heads=4, mlp_ratio=4, causal=True)


def test_the_committed_study_is_complete(modules):
    """ "Complete": the plan of the full setup lists no run over the committed results, every
    shape has at least 7 lrs, and depths 4 and 64 have 3 seeds at their best lr."""
    study, _ = modules
    results = study.load_results(STUDY)
    assert study.plan(study.DEFAULT, results) == []
    summary = json.loads((STUDY / "results.json").read_text())
    assert summary["runs"] == len(results)
    gpu = sum(r["device"].startswith("cuda") for r in results)
    assert f"in all five parametrisations; {gpu} of them on a lent GPU" in _flat(
        STUDY / "results.md"
    )
    for name, per_h in summary["parametrisations"].items():
        for shape, cell in per_h["1000"]["shapes"].items():
            assert len(cell["lr_curve"]["log2_lr"]) >= 7, (name, shape)
        for depth in (4, 64):
            assert per_h["1000"]["shapes"][f"w64_d{depth}"]["seeds"]["n"] >= 3, (name, depth)


def test_results_quote_the_committed_transfer_results(modules):
    """examples/transfer/results.md's numbers are the committed study's
    (examples/transfer/results.json, rebuilt by ``study.py --report``)."""
    summary = json.loads((STUDY / "results.json").read_text())
    per_h = summary["parametrisations"]["shaped_t"]
    cell = per_h["1000"]
    shapes, depth, width = cell["shapes"], cell["depth_drift"], cell["width_drift"]
    study = _flat(STUDY / "results.md")
    # the plan's seeds are 0, 1 and 2; --seeds 7 added 4 at pre_ln's depth 64
    runs = modules[0].load_results(STUDY)
    extra = sum(r["seed"] > 2 for r in runs)
    assert len(runs) == summary["runs"] and extra == 4
    planned = summary["runs"] - extra
    assert f"complete, all {planned} runs of the plan" in study
    assert f"`pre_ln` at depth 64 ({summary['runs']} runs in all)" in study
    optima = [f"{v:.2f}" for v in depth["log2_lr_opt"]]
    assert depth["sizes"] == [4, 8, 16, 32, 64] and depth["edges"] == ["diverged"]
    assert shapes["w64_d16"]["fit"]["edge"] == "diverged"  # "-7.00 is the lowest point"
    assert round(max(depth["log2_lr_opt"][:3]) - min(depth["log2_lr_opt"][:3]), 2) == 0.34
    iv = depth["last_minus_first_interval"]
    drift = f"{depth['last_minus_first']:.2f} from depth 4 to 64 (95% bootstrap [{iv[0]:.2f}, "
    drift += f"{iv[1]:.2f}]"
    slope = f"{depth['slope_per_doubling']:.2f} per doubling"
    assert drift in study and slope in study
    assert abs(depth["last_minus_first"]) > 0.5  # "does not transfer ... within 0.5 in all"
    fall = (depth["log2_lr_opt"][4] - depth["log2_lr_opt"][2]) / 2  # depths 16 to 64
    assert f"(about {fall:.2f} per doubling from 16 to 64)" in study
    loss = {d: shapes[f"w64_d{d}"]["best"]["val_loss"] for d in (4, 8, 16, 32, 64)}
    quoted = (
        ", ".join(f"{loss[d]:.3f}" for d in (4, 8, 16, 32)) + f" and {loss[64]:.3f} at depths 4"
    )
    assert quoted in study
    assert loss[32] > loss[16] and loss[64] > loss[32]  # "grows beyond depth 16"
    assert max(loss[4], loss[8]) >= loss[16]  # "does not grow up to depth 16"
    up = round(100 * (loss[64] / loss[16] - 1))
    assert f"64 is {up}% above depth 16" in study
    # the cross-check: gamma 0.05, 0.075 and 0.1 at depth 64, 1000 steps, seed 0's best lr
    long = json.loads((STUDY.parent / "long_horizon" / "results.json").read_text())
    d64_models = long["depths"]["64"]["models"]
    best = [
        min(v for v in c["lr_curve"]["val_loss"] if v is not None)
        for c in (
            d64_models["shaped advise"]["1000"],
            shapes["w64_d64"],
            d64_models["shaped g=0.1"]["1000"],
        )
    ]
    assert best == sorted(best)  # "a smaller gamma^2 d / n than shaped_t's trains better"
    assert f"reach {best[0]:.3f}, {best[1]:.3f} and {best[2]:.3f} at their best lrs" in study
    assert width["sizes"] == [32, 64, 128, 256]
    assert abs(width["last_minus_first"]) > 0.5  # "nor does it transfer across width"
    optima = ", ".join(f"{v:.2f}" for v in width["log2_lr_opt"][:3])
    assert f"{optima} and {width['log2_lr_opt'][3]:.2f} at widths 32, 64, 128" in study
    too_large = 2 ** (width["log2_lr_opt"][1] - width["log2_lr_opt"][3])  # width 64 -> 256
    assert f"about {too_large:.1f} times too large at width 256" in study
    assert cell["width_drift_3pt"]["last_minus_first"] == width["last_minus_first"]
    best_losses = [shapes[f"w{w}_d8"]["best"]["val_loss"] for w in (32, 64, 128, 256)]
    assert best_losses == sorted(best_losses, reverse=True)  # "still falls with width"
    falls = ", ".join(f"{v:.3f}" for v in best_losses[:3]) + f" and {best_losses[3]:.3f})"
    assert falls in study
    short = [f"{per_h[h]['depth_drift']['last_minus_first']:.2f}" for h in ("250", "500")]
    assert f"by {short[0]} at 250 steps and {short[1]} at 500" in study


def _grid_best(cell: dict) -> tuple[float, float, float]:
    """(best log2 lr of the grid, its loss, the report's 3-point vertex): the fit with the
    same window at every shape."""
    curve = cell["lr_curve"]
    losses = [math.inf if v is None else v for v in curve["val_loss"]]
    i = losses.index(min(losses))
    return curve["log2_lr"][i], losses[i], cell["fit_3pt"]["log2_lr"]


def test_docs_quote_the_committed_depth_mup_transfer_results():
    """The depth-muP numbers of the study's results.md are the committed study's, and the
    claims hold on them (against the long-horizon study's runs too)."""
    summary = json.loads((STUDY / "results.json").read_text())
    cell = summary["parametrisations"]["pre_ln_depth_mup"]["1000"]
    shaped = summary["parametrisations"]["shaped_t"]["1000"]
    study = _flat(STUDY / "results.md")
    depths = (4, 8, 16, 32, 64)
    fits = {d: _grid_best(cell["shapes"][f"w64_d{d}"]) for d in depths}
    narrow = _grid_best(cell["shapes"]["w32_d8"])
    # "the best lr of the grid is 2^-7 at every depth from 4 to 64 and at every width"
    assert {f[0] for f in fits.values()} == {narrow[0]} == {-7.0}
    assert "2^-7 at every depth" in study
    drift, three = cell["depth_drift"], cell["depth_drift_3pt"]
    iv, iv3 = drift["last_minus_first_interval"], three["last_minus_first_interval"]
    assert f"moves by +{drift['last_minus_first']:.2f} from depth 4 to 64 (95% bootstrap" in study
    assert f"and the 3-point fit by +{three['last_minus_first']:.2f} ([+{iv3[0]:.2f}," in study
    assert f"+{drift['slope_per_doubling']:.2f} per doubling" in study
    # "just above issue 37's half-octave", "upward where shaped_t's is downward"
    assert 0.5 < drift["last_minus_first"] < 1.0 and 0.5 < three["last_minus_first"] < 1.0
    assert drift["last_minus_first"] < abs(shaped["depth_drift"]["last_minus_first"])
    report_fits = [cell["shapes"][f"w64_d{d}"]["fit"]["log2_lr"] for d in depths]
    assert round(max(report_fits[:4]) - min(report_fits[:4]), 2) == 0.19  # "within 0.19"
    for d in depths:  # "every depth has 7 lrs (2^-11 to 2^-5)"
        assert cell["shapes"][f"w64_d{d}"]["lr_curve"]["log2_lr"] == list(range(-11, -4)), d
    losses = [fits[d][1] for d in depths]
    assert losses == sorted(losses, reverse=True)  # "falls with depth"
    quoted = ", ".join(f"{v:.3f}" for v in losses[:4]) + f" and {losses[4]:.3f} at depths 4"
    assert quoted in study
    width, width_3pt = cell["width_drift"], cell["width_drift_3pt"]
    assert width["sizes"] == [32, 64, 128, 256]
    for d in (width, width_3pt):  # "stays put": within half an octave, shaped_t far beyond
        assert d["range"] < 0.5 and abs(d["last_minus_first"]) < 0.5
        assert abs(d["last_minus_first"]) < abs(shaped["width_drift"]["last_minus_first"]) / 3
    iv, iv3 = width["last_minus_first_interval"], width_3pt["last_minus_first_interval"]
    assert f"by {width['last_minus_first']:.2f} (95% bootstrap [{iv[0]:.2f}, {iv[1]:+.2f}]" in study
    assert f"by {width_3pt['last_minus_first']:.2f} ([{iv3[0]:.2f}, {iv3[1]:+.2f}]" in study
    best = {w: _grid_best(cell["shapes"][f"w{w}_d8"]) for w in (32, 64, 128, 256)}
    assert {b[0] for b in best.values()} == {-7.0}  # "2^-7 at every width"
    falls = ", ".join(f"{best[w][1]:.3f}" for w in (32, 64, 128)) + f" and {best[256][1]:.3f})"
    assert falls in study
    assert cell["shapes"]["w64_d4"]["seeds"]["n"] == 3
    # depth 16, 1000 steps: depth-muP, shaped_t and the long-horizon study's GPT-2 pre-LN
    long = json.loads((STUDY.parent / "long_horizon" / "results.json").read_text())["depths"]
    gpt2 = {d: min(v for v in long[d]["models"]["pre-LN (GPT-2)"]["1000"]["lr_curve"]["val_loss"]
                   if v is not None) for d in ("16", "64")}  # fmt: skip
    shaped16 = min(v for v in shaped["shapes"]["w64_d16"]["lr_curve"]["val_loss"] if v)
    assert fits[16][1] < gpt2["16"] < shaped16 and fits[64][1] < gpt2["64"]
    # the init control at depth 8: pre_ln (GPT-2 init) against pre_ln_depth_mup (1/fan_in)
    gpt2_d8 = summary["parametrisations"]["pre_ln"]["1000"]["shapes"]["w64_d8"]["lr_curve"]
    v = [gpt2_d8["val_loss"][gpt2_d8["log2_lr"].index(j)] for j in (-8, -7, -6)]
    low, best, high = (f"{x:.3f}" for x in v)
    assert v[1] < min(v[0], v[2]) and fits[8][1] < v[1]  # a closed grid; fan_in trains better
    assert f"`pre_ln` reaches {best} at its best lr, 2^-7 ({low} at 2^-8, {high} at 2^-6;" in study


def _summary_rows() -> list[str]:
    """The comparison rows that open the committed tables.md (report.summary_table)."""
    lines = (STUDY / "tables.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| parametrisation |"))
    end = lines.index("", start)
    return lines[start:end]


def test_study_results_quote_the_per_shape_table(modules):
    """The study's results.md carries tables.md's per-shape table (report.shape_table) as it is:
    its header and every row, so its per-shape numbers are the committed report's."""
    lines = (STUDY / "tables.md").read_text().splitlines()
    start = lines.index(modules[1].SHAPE_HEADER)
    rows = lines[start : lines.index("", start)]
    assert len(rows) > 2
    study = (STUDY / "results.md").read_text()
    for row in rows:
        assert row in study, row


def test_docs_quote_the_comparison_of_the_parametrisations():
    """The study's results.md carries the report's comparison table as it is, and the verdicts
    around it hold on the committed results: depth-muP's optimum moves
    least across depth and width (3-point fits); CompleteP's and GPT-2 pre-LN's fall."""
    cells = _cells()
    rows = _summary_rows()
    assert len(rows) == 2 + len(cells)
    study = (STUDY / "results.md").read_text()
    for row in rows:
        assert row in study, row
    # like for like: the 3-point fits (one window at every shape)
    deep = {
        n: c["depth_drift_3pt"] for n, c in cells.items()
        if c["depth_drift_3pt"] and c["depth_drift_3pt"]["sizes"][-1] == 64
    }  # fmt: skip
    assert set(deep) >= {"shaped_t", "pre_ln", "pre_ln_depth_mup", "pre_ln_completep"}
    least = min(deep, key=lambda n: abs(deep[n]["last_minus_first"]))
    assert least == "pre_ln_depth_mup"
    wide = {n: c["width_drift_3pt"] for n, c in cells.items() if c["width_drift_3pt"]}
    assert min(wide, key=lambda n: abs(wide[n]["last_minus_first"])) == "pre_ln_depth_mup"
    for name in ("pre_ln_completep", "pre_ln"):
        assert cells[name]["depth_drift_3pt"]["last_minus_first"] < -0.5  # "falls"
    # "seeds 1 and 2 at the best lr of depths 4 and 64 for all five" (pre_ln 7 at depth 64)
    assert all(c["shapes"][f"w64_d{d}"]["seeds"]["n"] >= 3 for c in cells.values() for d in (4, 64))
    assert "1 and 2 at the best lr of depths 4 and 64 for all five" in _flat(STUDY / "results.md")


def test_completep_is_depth_mup_at_the_proxy_up_to_the_machine():
    """At the proxy (depth 8) CompleteP's runs are depth-muP's: bit for bit where both ran on
    one machine, within float32 rounding on another, and apart next to divergence, which moves
    the 5-point fit by the quoted amount."""
    cells = _cells()
    study = _flat(STUDY / "results.md")
    proxy_cp = cells["pre_ln_completep"]["shapes"]["w64_d8"]["lr_curve"]
    proxy_mup = cells["pre_ln_depth_mup"]["shapes"]["w64_d8"]["lr_curve"]
    mup_at = dict(zip(proxy_mup["log2_lr"], proxy_mup["val_loss"], strict=True))
    cp_at = dict(zip(proxy_cp["log2_lr"], proxy_cp["val_loss"], strict=True))
    for j in (-8, -7, -6):  # run on the same machine: the same model, the same bits
        assert cp_at[j] == mup_at[j]
    for j in (-11, -10, -9):  # another machine: float32 rounding ("within 2.4e-7")
        assert cp_at[j] == pytest.approx(mup_at[j], abs=2.4e-7)
    assert "reproduce depth-muP's, to the last bit where both ran on the same machine" in study
    assert f"rounding grows into {cp_at[-5]:.3f} against {mup_at[-5]:.3f} at 1000 steps" in study
    fits = [
        cells[n]["shapes"]["w64_d8"]["fit"]["log2_lr"]
        for n in ("pre_ln_completep", "pre_ln_depth_mup")
    ]
    assert f"differ by {abs(fits[0] - fits[1]):.2f} for that reason ({fits[0]:.2f} and " in study


def test_docs_quote_the_seeds_of_gpt2_pre_ln_and_completep_at_depth_64():
    """GPT-2 pre-LN's seeds at depth 64 spread the most (7 seeds), so its 3-point depth drift
    is not resolved;
    CompleteP's best loss is within 0.011 of depth-muP's at every depth and ahead at depth 64
    by about twice its seed sd."""
    cells = _cells()
    study = _flat(STUDY / "results.md")
    gpt2 = cells["pre_ln"]
    others = max(c["seed_sd"] for n, c in cells.items() if n != "pre_ln")
    seeds = gpt2["shapes"]["w64_d64"]["seeds"]
    assert seeds["n"] == 7 and 2.9 * others < gpt2["seed_sd"] < 3.5 * others  # "three times"
    shallow = gpt2["shapes"]["w64_d4"]["seeds"]["sd"]
    assert 2.5 * shallow < seeds["sd"] < 3.5 * shallow  # "three times its 0.015 at depth 4"
    lo, hi = gpt2["depth_drift_3pt"]["last_minus_first_interval"]
    assert lo < 0 < hi  # "the interval includes no drift"
    losses = [
        json.loads((STUDY / f"runs/pre_ln/w64_d64/lr-8_s{s}/result.json").read_text())["horizons"][
            "1000"
        ]["val_loss"]
        for s in range(7)
    ]
    assert max(losses) == losses[2]  # "seed 2 ... is the outlier of the seven"
    assert f"gave sd {np.std(losses[:3], ddof=1):.3f}; seed 2" in study
    quoted = ", ".join(f"{v:.3f}" for v in losses[:6]) + f" and {losses[6]:.3f}"
    assert f"{quoted} ({seeds['mean']:.3f} ± {seeds['sd']:.3f})" in study
    assert f"bring the sd to {seeds['sd']:.3f}, still three times its {shallow:.3f}" in study
    assert f"seed-to-seed sd ({gpt2['seed_sd']:.3f}) is three times the next largest" in study
    assert f"(95% bootstrap [{lo:.2f}, +{hi:.2f}]), -0.20 per doubling" in study
    cp, mup = cells["pre_ln_completep"]["shapes"], cells["pre_ln_depth_mup"]["shapes"]
    gaps = [
        abs(cp[f"w64_d{d}"]["best"]["val_loss"] - mup[f"w64_d{d}"]["best"]["val_loss"])
        for d in (4, 8, 16, 32, 64)
    ]
    assert round(max(gaps), 3) <= 0.011  # "within 0.011 of depth-muP's at every depth"
    a, b = cp["w64_d64"]["seeds"], mup["w64_d64"]["seeds"]
    assert a["n"] == b["n"] == 3 and (a["log2_lr"], b["log2_lr"]) == (-8, -7)
    quoted = f"CompleteP reaches {a['mean']:.3f} ± {a['sd']:.3f} (2^-8) and depth-muP "
    quoted += f"{b['mean']:.3f} ± {b['sd']:.3f} (2^-7)"
    assert quoted in study
    assert f"ahead there by {b['mean'] - a['mean']:.3f}" in study
    assert 1.5 * a["sd"] < b["mean"] - a["mean"] < 3 * a["sd"]  # "about twice its seed sd"


def test_docs_quote_the_fixed_gamma_at_depth_64():
    """The fixed gamma: every lr from 2^-9 up diverged at depth 64, 2^-11 the best and
    bracketed, seeded there; the optimum falls from depth 4 to 64 by the quoted amount, more
    than 2.5 times `shaped_t`'s fall."""
    cells = _cells()
    study = _flat(STUDY / "results.md")
    fixed = cells["shaped"]["shapes"]
    d64 = fixed["w64_d64"]["lr_curve"]
    assert min(d64["log2_lr"]) == -12 and fixed["w64_d64"]["best"]["log2_lr"] == -11
    assert not fixed["w64_d64"]["fit"]["at_edge"]
    assert all(v is None for j, v in zip(d64["log2_lr"], d64["val_loss"], strict=True) if j >= -9)
    best = fixed["w64_d64"]["best"]["val_loss"]
    drift = cells["shaped"]["depth_drift"]
    fall = -drift["last_minus_first"]
    assert drift["sizes"] == [4, 8, 16, 32, 64]
    assert fall > 2.5 * -cells["shaped_t"]["depth_drift"]["last_minus_first"]  # "2.6 times"
    assert f"its best, 2^-11, reaches {best:.3f}" in study
    assert f"falls by {fall:.2f} from depth 4 to 64" in study
    seeds = fixed["w64_d64"]["seeds"]
    assert f"and {seeds['mean']:.3f} ± {seeds['sd']:.3f} (3 seeds each)" in study
    assert f"about {2**fall:.0f} times too large at depth 64" in study
    iv = drift["last_minus_first_interval"]
    slope = drift["slope_per_doubling"]
    assert f"falls by {fall:.2f} ([{iv[0]:.2f}, {iv[1]:.2f}]), {slope:.2f} per" in study


def test_results_quote_the_cpu_rerun_of_gpu_runs(modules):
    """results.md's CPU-vs-GPU numbers are the committed runs': the same initial weights (the
    step-0 loss to the last bit), different batches, a gap that grows next to divergence; and
    the 5-point fit at pre_ln's depth 16 moves by the quoted amount, the 3-point one not."""
    _, report = modules
    study = _flat(STUDY / "results.md")
    cpu, gpu = {}, {}
    for j in (-10, -6):
        cpu[j] = json.loads(
            (STUDY / "device_check" / f"pre_ln_w64_d16_lr{j}_s0_cpu.json").read_text()
        )
        gpu[j] = json.loads(
            (STUDY / "runs" / "pre_ln" / "w64_d16" / f"lr{j}_s0" / "result.json").read_text()
        )
        assert (cpu[j]["device"], gpu[j]["device"]) == ("cpu", "cuda")
        for key in ("model_config", "train_config", "corpus_fingerprint", "log2_lr", "seed"):
            assert cpu[j][key] == gpu[j][key], key
        h_cpu, h_gpu = cpu[j]["horizons"]["1000"], gpu[j]["horizons"]["1000"]
        assert h_cpu["init_val_loss"] == h_gpu["init_val_loss"]
        assert h_cpu["val_loss"] != h_gpu["val_loss"]
    loss = {j: (cpu[j]["horizons"]["1000"]["val_loss"], gpu[j]["horizons"]["1000"]["val_loss"])
            for j in (-10, -6)}  # fmt: skip
    gap = {j: abs(a - b) for j, (a, b) in loss.items()}
    assert gap[-6] > 10 * gap[-10]  # "far more next to divergence"
    assert f"they reach {loss[-10][0]:.3f} (CPU) and {loss[-10][1]:.3f} (GPU)" in study
    assert f"a gap of {gap[-10]:.3f}" in study
    assert f"{loss[-6][0]:.3f} and {loss[-6][1]:.3f}: a gap of {gap[-6]:.3f}" in study
    curve = json.loads((STUDY / "results.json").read_text())["parametrisations"]["pre_ln"]
    curve = curve["1000"]["shapes"]["w64_d16"]["lr_curve"]
    x = curve["log2_lr"]
    y = [math.inf if v is None else v for v in curve["val_loss"]]
    swapped = list(y)
    for j in (-10, -6):
        assert y[x.index(j)] == loss[j][1]
        swapped[x.index(j)] = loss[j][0]
    five = (report.fit_optimum(x, y, 2)["log2_lr"], report.fit_optimum(x, swapped, 2)["log2_lr"])
    three = (report.fit_optimum(x, y, 1)["log2_lr"], report.fit_optimum(x, swapped, 1)["log2_lr"])
    assert f"5-point fit moves from {five[0]:.2f} to {five[1]:.2f}" in study
    assert three[0] == three[1] and f"3-point fit ({three[0]:.2f}) not at all" in study


def test_results_quote_the_gpu_reruns_with_the_cpu_batches():
    """The GPU reruns drew the CPU's batches (the same initial loss, a loss within 1e-4 two lrs
    below the optimum, rounding grown large next to divergence), and results.md's table quotes
    the committed runs."""
    study = _flat(STUDY / "results.md")
    checks = STUDY / "device_check"
    for depth in (16, 8):
        for j in (-10, -6):
            gpu = json.loads((checks / f"pre_ln_w64_d{depth}_lr{j}_s0_cuda.json").read_text())
            study_run = STUDY / "runs" / "pre_ln" / f"w64_d{depth}" / f"lr{j}_s0" / "result.json"
            rerun = checks / f"pre_ln_w64_d{depth}_lr{j}_s0_cpu.json"
            cpu_path = rerun if depth == 16 else study_run
            cpu = json.loads(cpu_path.read_text())
            assert (cpu["device"], gpu["device"], gpu["batch_generator"]) == ("cpu", "cuda", "cpu")
            for key in ("model_config", "train_config", "corpus_fingerprint", "log2_lr", "seed"):
                assert cpu[key] == gpu[key], key
            h_cpu, h_gpu = cpu["horizons"]["1000"], gpu["horizons"]["1000"]
            assert h_cpu["init_val_loss"] == h_gpu["init_val_loss"]
            gap = abs(h_cpu["val_loss"] - h_gpu["val_loss"])
            assert gap < 1e-4 if j == -10 else gap > 0.1, (depth, j, gap)
            row = f"| depth {depth}, 2^{j} | {h_cpu['val_loss']:.4f} |"
            assert row in study, row
            tail = f" ({gap:.1e} apart) |" if j == -10 else " |"
            assert f"| {h_gpu['val_loss']:.4f}{tail}" in study, (depth, j)


def test_results_quote_the_five_point_depth_fits_of_pre_ln_and_completep():
    """With 7 lrs at every depth the report's fits are 5-point ones: results.md quotes their
    optima and drifts (pre_ln's resolved, its 3-point one not), as results.json has them."""
    summary = json.loads((STUDY / "results.json").read_text())
    study = _flat(STUDY / "results.md")
    cells = {n: summary["parametrisations"][n]["1000"] for n in ("pre_ln", "pre_ln_completep")}
    for name, cell in cells.items():
        for d in (4, 8, 16, 32, 64):
            assert len(cell["shapes"][f"w64_d{d}"]["lr_curve"]["log2_lr"]) == 7, (name, d)
        drift = cell["depth_drift"]
        lo, hi = drift["last_minus_first_interval"]
        quoted = f"{drift['last_minus_first']:.2f} ([{lo:.2f}, {hi:.2f}]; "
        quoted += f"{drift['slope_per_doubling']:.2f} per doubling)"
        if name == "pre_ln":
            quoted = quoted.replace(" ([", " (95% bootstrap [")
            assert hi < 0 < cell["depth_drift_3pt"]["last_minus_first_interval"][1]
        assert quoted in study, quoted
    shapes = cells["pre_ln_completep"]["shapes"]
    fits = [shapes[f"w64_d{d}"]["fit"]["log2_lr"] for d in (4, 8, 16, 32, 64)]
    below = [
        shapes[f"w64_d{d}"]["fit_3pt"]["log2_lr"] - f
        for d, f in zip((4, 8, 16, 32, 64), fits, strict=True)
    ]
    quoted = ", ".join(f"{v:.2f}" for v in fits[:4]) + f" and {fits[4]:.2f}, "
    assert quoted + f"{min(below):.2f} to {max(below):.2f} below the 3-point" in study
    pre_ln_64 = cells["pre_ln"]["shapes"]["w64_d64"]["fit"]["log2_lr"]
    assert f"fit is a 5-point one too, {pre_ln_64:.2f}" in study
