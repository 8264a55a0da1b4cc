"""The transfer study (examples/transfer, issue 37 item 3): its optimum fit, its quick mode end to
end on the Dask path, and ``simulations.transfer_lr`` (item 5) reading what it measured."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
from run_history import load_script, result_jsons_at

from shapedtx import ParameterError
from simulations import transfer_lr
from simulations.studies import RunStore, lr_tag
from simulations.transfer import DRIFTS, NOT_MEASURED

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "examples" / "transfer"


def _load(name: str, monkeypatch):
    return load_script(STUDY / f"{name}.py", name, monkeypatch)


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


@pytest.mark.slow  # a quick study on Dask: about a minute on a busy CPU
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
    assert sorted(p.parent.name for p in stamps)[0] == f"{lr_tag(2.0 ** js[0])}_s0"
    assert len(stamps) == 8  # 2 shapes x 3 lrs + seed 1 at 2 depths
    assert study.main(args) == 0  # resumes: nothing is trained again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    assert len(RunStore(out / "runs.jsonl")) == 8  # every finished run stored
    assert (out / "results.md").read_text().startswith("# Results: learning-rate transfer")
    drifts = modules[1].drifts(summary)
    advice = transfer_lr(1e-2, 16, 2, 16, 8, "shaped_t", drifts=drifts)
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
    a = transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_depth_mup", drifts={})
    assert a.lrs["hidden"] == pytest.approx(4e-3 / 4 / math.sqrt(8), rel=1e-10)
    assert a.lrs["readout"] == pytest.approx(1e-3, rel=1e-10)
    assert a.lrs["block_vector"] == pytest.approx(4e-3 / math.sqrt(8), rel=1e-10)
    assert a.lrs["embedding"] == a.lrs["final"] == 4e-3
    assert a.rule == "depth" and "Tensor Programs VI" in a.source
    assert a.evidence == NOT_MEASURED and a.measured is None
    s = transfer_lr(1e-2, 64, 8, 128, 32, "shaped_t", drifts={})
    assert s.lrs["hidden"] == pytest.approx(5e-3) and s.lrs["block_vector"] == 1e-2
    assert transfer_lr(1e-2, 64, 8, 256, 64, "pre_ln").lrs == dict.fromkeys(a.lrs, 1e-2)
    assert "evidence: " in str(s)


def test_transfer_lr_says_which_axis_was_not_measured():
    """A parametrisation measured across depth only (CompleteP: its width axis is
    depth-muP's) quotes its depth drift and says that no width drift was measured, only when
    the target's width is not the proxy's."""
    drift = {
        "sizes": [4, 64], "last_minus_first": -1.2, "last_minus_first_interval": None,
        "range": 1.2, "edges": [],
    }  # fmt: skip
    summary = {
        "proxy": {"width": 64, "depth": 8}, "horizon": 1000, "runs": 9,
        "parametrisations": {"pre_ln_completep": {"depth_drift": drift, "width_drift": None}},
    }  # fmt: skip
    wide = transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_completep", drifts=summary).evidence
    assert "moves -1.20 from depth 4 to 64" in wide
    assert "no drift measured across width (target width 256)" in wide
    narrow = transfer_lr(4e-3, 64, 8, 64, 64, "pre_ln_completep", drifts=summary).evidence
    assert "moves -1.20" in narrow and "across width" not in narrow
    none = {**summary, "parametrisations": {"pre_ln_completep": {}}}
    assert transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_completep", drifts=none).evidence == (
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
    for name, per_h in summary["parametrisations"].items():
        for shape, cell in per_h["1000"]["shapes"].items():
            assert len(cell["lr_curve"]["log2_lr"]) >= 7, (name, shape)
        for depth in (4, 64):
            assert per_h["1000"]["shapes"][f"w64_d{depth}"]["seeds"]["n"] >= 3, (name, depth)


def test_committed_report_is_regenerated_from_the_committed_runs(modules, tmp_path):
    """results.md, results.json and tables.md are report.py's output from runs.jsonl (and
    device_check/), never edited by hand; so is the package data transfer_lr reads."""
    study, report = modules
    shutil.copytree(STUDY / "device_check", tmp_path / "device_check")
    drifts = tmp_path / "transfer_drifts.json"
    report.report(study.DEFAULT, tmp_path, RunStore(STUDY / "runs.jsonl").results(), drifts)
    for name in ("results.md", "results.json", "tables.md"):
        assert (tmp_path / name).read_text() == (STUDY / name).read_text(), name
    assert drifts.read_text() == files("simulations").joinpath("data", DRIFTS).read_text()
    names = [f"loss_vs_lr_{n}.png" for n in study.PARAMETRISATIONS] + ["optimum_drift.png"]
    if json.loads((STUDY / "results.json").read_text())["completep_reference"]:
        names.append(Path(report.REFERENCE_FIGURE).name)
    for name in names:
        assert (tmp_path / "figures" / name).stat().st_size > 0
        assert (STUDY / "figures" / name).exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--parametrisations", "completep_beta2", "completep_eps", "--depths", "32"],
        ["--parametrisations", "pre_ln_completep", "--widths", "64", "128"],
    ],
)
def test_a_restricted_study_writes_its_report_from_the_committed_runs(modules, tmp_path, argv):
    """A study run on part of the plan (no seeded depth, no device-checked parametrisation,
    one of a pair that is the same model at the proxy) reports on that part, beside the
    device check it cannot summarise, instead of failing after its runs are stored."""
    study, report = modules
    shutil.copytree(STUDY / "device_check", tmp_path / "device_check")
    setup = study.setup_of(study.parse(argv))
    report.report(setup, tmp_path, RunStore(STUDY / "runs.jsonl").results(), None)
    text = (tmp_path / "results.md").read_text()
    assert ("no seeds planned" in text) == (not setup.seed_depths)
    assert "GPU, CPU's batches" not in text
    assert "reproduce" not in text


CONVERTED_FROM = "550197ff3fbdbd124f85f35ca52c3e68fcd3d317"
"""The last commit that tracked the per-run ``result.json`` files runs.jsonl was made from
(folders ``lr<j>_s<seed>`` with j the log2 of the lr; keys now ``lr_tag(2**j)``)."""


def test_every_converted_run_equals_its_original_result_json():
    originals = result_jsons_at(CONVERTED_FROM, "examples/transfer/runs/")
    records = dict(RunStore(STUDY / "runs.jsonl").records())
    assert len(originals) == 286 <= len(records)  # the runs since are stored after them
    for path, original in originals.items():
        name, shape, folder = path.split("/")[-4:-1]
        j, seed = folder.removeprefix("lr").split("_s")
        assert records[f"{name}/{shape}/{lr_tag(2.0 ** int(j))}_s{seed}"] == original, path


def test_transfer_lr_reads_package_data_not_the_repository(monkeypatch, tmp_path):
    """From an installed wheel (no examples/ folder) transfer_lr quotes the drifts the study
    measured: they are package data, read through importlib.resources."""
    import importlib

    import simulations
    import simulations.transfer as transfer

    data = tmp_path / "simulations" / "data"
    data.mkdir(parents=True)
    shipped = files("simulations").joinpath("data", DRIFTS).read_text()
    (data / DRIFTS).write_text(shipped)
    # a package simulations whose files are only the package data: no repository around it
    monkeypatch.setattr(transfer, "files", lambda package: tmp_path / package)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Path, "read_text", _refuse_examples(Path.read_text))
    advice = transfer.transfer_lr(4e-3, 64, 8, 256, 64, "pre_ln_depth_mup")
    measured = json.loads(shipped)["parametrisations"]["pre_ln_depth_mup"]
    assert advice.measured["depth_drift"] == measured["depth_drift"]
    assert f"{measured['depth_drift']['last_minus_first']:+.2f}" in advice.evidence
    runs = json.loads(shipped)["runs"]
    assert advice.evidence.startswith(f"examples/transfer, {runs} runs, horizon 1000 steps")
    assert importlib.import_module("simulations").transfer_lr is simulations.transfer_lr


def _refuse_examples(read_text):
    def guarded(self, *args, **kwargs):
        if "examples" in Path(self).parts:
            raise AssertionError(f"transfer_lr read a repository file: {self}")
        return read_text(self, *args, **kwargs)

    return guarded


@pytest.mark.parametrize(
    ("name", "proxy", "target"),
    [("pre_ln_depth_mup", (64, 8), (128, 32)), ("shaped_t", (64, 8), (32, 4)),
     ("pre_ln_completep", (32, 4), (64, 16)), ("pre_ln", (64, 8), (128, 4))],
)  # fmt: skip
def test_transfer_advice_trains_with_its_multipliers(name, proxy, target):
    """advice.train_config() is the TrainConfig from which the trainer gives each parameter
    group of advice.model the advised learning rate."""
    from shapedtx.training.model import LanguageModel
    from shapedtx.training.trainer import _make_optimizer

    advice = transfer_lr(3e-3, *proxy, *target, name, drifts={})
    config = advice.train_config(steps=10, batch_size=2, seq_len=8)
    assert (config.lr, config.lr_proxy_width, config.lr_proxy_depth) == (3e-3, *proxy)
    assert (config.steps, config.batch_size) == (10, 2)
    assert (advice.model.width, advice.model.depth) == target
    assert advice.model.causal
    model = LanguageModel(advice.model, max_len=8)
    optimizer = _make_optimizer(model, config)
    names = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            kind = model.parameter_group(names[id(param)])
            assert group["lr"] == pytest.approx(advice.lrs[kind], rel=1e-12), names[id(param)]
            seen.add(kind)
    assert seen >= {"hidden", "embedding"}
    with pytest.raises(ParameterError) as err:
        advice.train_config(lr=1e-3)
    assert err.value.parameter == "lr"


def test_report_writes_a_seed_cell_with_one_finished_seed(modules):
    """A seeded cell whose other seeds diverged has no sd (nor a pooled one): results.md
    says so instead of failing (the quick study can end that way)."""
    study, report = modules
    one = {"log2_lr": -3, "n": 1, "diverged": 1, "mean": 2.5, "sd": None}
    cell = {"shapes": {"w16_d2": {"seeds": one}}, "seed_sd": None}
    text = report._seed_bullet(study.QUICK, "shaped_t", cell, [])
    assert "2.500 ± - (n=1) at depth 2 (2^-3)" in text and "pooled sd -" in text
    none = {**one, "n": 0, "diverged": 2, "mean": None}
    assert (
        report._seed_bullet(
            study.QUICK, "shaped_t", {**cell, "shapes": {"w16_d2": {"seeds": none}}}, []
        )
        == ""
    )


def test_reference_section_compares_each_variant_with_completep_on_its_points(modules, tmp_path):
    """The CompleteP reference variants that have run are compared with ``pre_ln_completep``
    over only their depths and base lrs (seed 0 at the study's width): exact parabolas give
    the drifts, a run's largest logit is the largest of its record (None without one), and
    results.md's section has the table row and the drift bullet; no section before a variant
    has run. A variant run at fewer depths than another is compared over its own depths."""
    study, report = modules
    setup = replace(study.QUICK, depths=(2, 4, 8), horizons=(40,), seed_depths=())
    vertex = {("pre_ln_completep", 2): -5.0, ("pre_ln_completep", 4): -5.5}
    vertex |= {("pre_ln_completep", 8): -6.0}
    vertex |= {("pre_ln_completep_ref", 2): -5.0, ("pre_ln_completep_ref", 4): -5.0}
    vertex |= {("completep_init", 2): -5.0, ("completep_init", 4): -5.0}
    vertex |= {("completep_init", 8): -5.25}
    grid = {"pre_ln_completep": range(-9, -1)} | {
        name: range(-7, -2) for name in ("pre_ln_completep_ref", "completep_init")
    }

    def run(name, depth, j, seed=0, width=16):
        h = {"diverged": False, "val_loss": 2 + 0.1 * (j - vertex[name, depth]) ** 2}
        if name != "pre_ln_completep":
            h["max_logit"] = {"peak": [None, float(j + 20), float(depth)]}
        return {"parametrisation": name, "width": width, "depth": depth, "log2_lr": j,
                "seed": seed, "horizons": {"40": h}}  # fmt: skip

    fake = [run(n, d, j) for (n, d) in vertex for j in grid[n]]
    others = [run("pre_ln_completep", 2, -5, seed=1), run("pre_ln_completep", 2, -5, width=8)]
    ref = report.reference_summary(setup, fake + others)
    assert ref["depths"] == [2, 4, 8] and ref["log2_lrs"] == list(range(-7, -2))
    assert ref["runs"] == 25 and ref["planned"] == len(study.plan(
        replace(setup, parametrisations=tuple(study.VARIANTS)), fake + others))  # fmt: skip
    base = ref["parametrisations"]["pre_ln_completep"]["40"]
    assert base["shapes"]["w16_d2"]["lr_curve"]["log2_lr"] == [-7.0, -6.0, -5.0, -4.0, -3.0]
    assert base["shapes"]["w16_d2"]["seeds"] is None  # seed 0 only
    assert base["depth_drift"]["last_minus_first"] == pytest.approx(-1.0, abs=1e-9)
    mine = ref["parametrisations"]["pre_ln_completep_ref"]["40"]
    assert mine["depth_drift"]["last_minus_first"] == pytest.approx(0.0, abs=1e-9)
    assert ref["max_logit"]["pre_ln_completep_ref"]["d4"]["-3"] == 17.0
    assert ref["max_logit"]["pre_ln_completep"]["d4"]["-3"] is None
    two = ref["seeds"]["pre_ln_completep"]["d2"]  # seeds 0 and 1 at 2^-5; not width 8's run
    assert (two["n"], two["log2_lr"], two["mean"], two["sd"]) == (2, -5, 2.0, 0.0)
    assert ref["seeds"]["completep_init"]["d2"] is None
    summary = {**report.summarise(setup, fake + others), "completep_reference": ref}
    text = "\n".join(report._reference_section(setup, summary))
    assert "| `pre_ln_completep_ref` | 4 | 2.400 (13) | 2.100 (14) |" in text
    assert "| `pre_ln_completep` | 4 | 2.225 | 2.025 | 2.025 | 2.225 | 2.625 |" in text
    assert (
        "`pre_ln_completep_ref`: the optimum moves +0.00 from depth 2 to 4 (3-point fits +0.00), "
        "`pre_ln_completep`'s on the same depths and lrs -0.50 (3-point -0.50); best measured "
        "loss at depths 2 and 4: 2.000 / 2.000, against 2.000 / 2.025."
    ) in text
    assert (
        "`completep_init`: the optimum moves -0.25 from depth 2 to 8 (3-point fits -0.25), "
        "`pre_ln_completep`'s on the same depths and lrs -1.00 (3-point -1.00); best measured "
        "loss at depths 2, 4 and 8: 2.000 / 2.000 / 2.006, against 2.000 / 2.025 / 2.000."
    ) in text
    assert (
        "**Was the drift the recipe?** From depth 2 to 4 (seed 0, 3-point fits) "
        "`pre_ln_completep`'s optimum moves -0.50 octaves and with its reference's whole recipe "
        "+0.00: most of it was the recipe (0% of the drift is left). Each change alone, nearest "
        "zero first: `completep_init` +0.00. The whole recipe's best losses are 2.000 / 2.000 "
        "against 2.000 / 2.025; no change is lower than the baseline's at the two deepest "
        "depths each ran. Depth 4 is the deepest with a located optimum: whether this holds "
        "to depth 8, the depth axis's end, is open."
    ) in text
    assert (
        "Seeds at one lr (mean ± sd): `pre_ln_completep` depth 2 2.000 ± 0.000 (2^-5, n=2). The "
        "seed-to-seed sd runs from 0.000 to 0.000"
    ) in text
    assert "(figures/completep_reference.png)" in text
    report._reference_figure(setup, ref, tmp_path / "reference.png")
    assert (tmp_path / "reference.png").stat().st_size > 0
    assert report.reference_summary(setup, others) is None
    assert report._reference_section(setup, {**summary, "completep_reference": None}) == []


def _drift_cell(vertices: dict[int, float], best: dict[int, float], edge=None) -> dict:
    """A reference-section cell: each depth's 3-point optimum and lowest loss (and a wider
    fit elsewhere, which the verdict must not read)."""
    shapes = {
        f"w64_d{d}": {
            "fit_3pt": {"log2_lr": v, "edge": edge},
            "fit": {"log2_lr": v - d / 16, "edge": None},
            "best": {"val_loss": best[d]},
        }
        for d, v in vertices.items()
    }
    return {"depth_drift": {"sizes": sorted(vertices)}, "shapes": shapes}


@pytest.mark.parametrize(
    ("whole_at_32", "said"),
    [
        (-7.5, "most of it was the recipe (25% of the drift is left)"),
        (-8.0, "part of it was the recipe (50% of the drift is left)"),
        (-9.0, "it holds with the recipe (100% of the drift is left)"),
    ],
)
def test_reference_verdict_says_how_much_of_the_drift_the_recipe_leaves(modules, whole_at_32, said):
    """The verdict compares the whole recipe's drift with the baseline's (the share left
    decides the words), ranks each change alone by how near zero it leaves the drift, leaves
    out a change whose optimum is at the grid's edge, and names the changes lower than the
    baseline at the two deepest depths."""
    study, report = modules
    setup = replace(study.DEFAULT, width=64, depths=(4, 16, 32, 64))
    base = _drift_cell({4: -7.0, 16: -8.0, 32: -9.0}, {4: 1.5, 16: 1.4, 32: 1.4})
    per = {
        "pre_ln_completep": base,
        "pre_ln_completep_ref": _drift_cell({4: -7.0, 32: whole_at_32}, {4: 1.6, 32: 1.6}),
        "completep_init": _drift_cell({4: -7.0, 32: -6.0}, {4: 1.6, 32: 1.3}),
        "completep_beta2": _drift_cell({4: -7.0, 32: -7.5}, {4: 1.4, 32: 1.5}),
        "completep_eps": _drift_cell({4: -7.0, 32: -7.0}, {4: 1.4, 32: 1.3}, edge="grid"),
    }
    (text,) = report._reference_verdict(per, setup)
    assert "`pre_ln_completep`'s optimum moves -2.00 octaves and with its reference's " in text
    assert f"recipe {whole_at_32 + 7:+.2f}: {said}." in text
    assert "nearest zero first: `completep_beta2` -0.50, `completep_init` +1.00 (an optimum " \
        "not inside the grid: `completep_eps`)." in text  # fmt: skip
    assert "best losses are 1.600 / 1.600 against 1.500 / 1.400" in text
    assert "lower than the baseline's at the two deepest depths each ran: `completep_eps`." in text
    assert "whether this holds to depth 64, the depth axis's end, is open." in text
    deep = replace(setup, depths=(4, 16, 32))
    assert "is open" not in report._reference_verdict(per, deep)[0]
    # the recipe's optimum at a grid edge at depth 64: the verdict stops at depth 32
    whole = _drift_cell({4: -7.0, 32: whole_at_32, 64: -8.0}, {4: 1.6, 32: 1.6, 64: 1.7})
    whole["shapes"]["w64_d64"]["fit_3pt"]["edge"] = "grid"
    whole["shapes"]["w64_d64"]["best"]["log2_lr"] = -8.0
    (edged,) = report._reference_verdict({**per, "pre_ln_completep_ref": whole}, setup)
    # located at depth 64: compared to 64, each change over the depths it ran
    whole["shapes"]["w64_d64"]["fit_3pt"]["edge"] = None
    deep_base = _drift_cell(
        {4: -7.0, 16: -8.0, 32: -9.0, 64: -9.0}, {4: 1.5, 16: 1.4, 32: 1.4, 64: 1.3}
    )
    deep_per = {**per, "pre_ln_completep": deep_base, "pre_ln_completep_ref": whole}
    (deeper,) = report._reference_verdict(deep_per, setup)
    assert "From depth 4 to 64" in deeper and "`completep_beta2` -0.50 (to depth 32)" in deeper
    # a change whose optimum at depth 64 is at its grid's edge: its drift to depth 32
    edge64 = _drift_cell({4: -7.0, 32: -7.5, 64: -9.0}, {4: 1.4, 32: 1.5, 64: 1.5}, edge=None)
    edge64["shapes"]["w64_d64"]["fit_3pt"]["edge"] = "grid"
    (partial,) = report._reference_verdict({**deep_per, "completep_beta2": edge64}, setup)
    assert "`completep_beta2` -0.50 (to depth 32)" in partial
    # the per-change bullets take the same depths: up to the deepest located optimum
    assert report._up_to_located(edge64, [4, 32, 64], 64) == [4, 32]
    assert report._up_to_located(deep_base, [4, 16, 32, 64], 64) == [4, 16, 32, 64]
    one = _drift_cell({4: -7.0, 64: -9.0}, {4: 1.4, 64: 1.5})
    one["shapes"]["w64_d64"]["fit_3pt"]["edge"] = "grid"  # one located depth: no drift to cut
    assert report._up_to_located(one, [4, 64], 64) is None
    assert edged.startswith(text.split(" Depth 32 is")[0])
    assert "At depth 64 the recipe's optimum is not inside its grid yet (best measured 2^-8: "  \
        "1.700). Depth 32 is the deepest with a located optimum" in edged  # fmt: skip
    no_whole = {k: v for k, v in per.items() if k != "pre_ln_completep_ref"}
    assert report._reference_verdict(no_whole, setup) == []


def test_a_variants_grid_starts_at_the_bracketed_optimum_of_the_model_it_changes(modules):
    """A CompleteP variant at a depth where pre_ln_completep's optimum is bracketed starts at
    that optimum and its two neighbours (then extends at an edge as any grid); without a
    bracketed optimum, or for a model that is not a variant, the grid is the centred one."""
    study, _ = modules
    variant = "completep_beta2"
    setup = replace(
        study.QUICK, parametrisations=(variant,), half_grid=3, depths=(2,), widths=(16,),
        width=16, seed_depths=(),
    )  # fmt: skip
    centre = study.LOG2_LR_CENTRE[variant] + setup.log2_lr_offset
    wide = [(variant, 16, 2, j, 0) for j in range(centre - 3, centre + 4)]
    assert study.plan(setup, []) == wide

    def run(name: str, j: int, loss: float) -> dict:
        return {
            "parametrisation": name, "width": 16, "depth": 2, "log2_lr": j, "seed": 0,
            "horizons": {"40": {"diverged": False, "val_loss": loss}},
        }  # fmt: skip

    anchor = centre - 2
    around = (anchor - 1, anchor, anchor + 1)
    library = [run(study.REFERENCE_BASELINE, j, abs(j - anchor) + 1.0) for j in around]
    narrow = [(variant, 16, 2, j, 0) for j in around]
    assert study.plan(setup, library) == narrow
    # the library's optimum at its grid's edge is not bracketed: the centred grid
    assert study.plan(setup, library[1:]) == wide
    # the variant's own optimum at the narrow grid's lower edge: one lr below it
    mine = [run(variant, j, 2.0 + j - anchor) for j in around]
    assert study.plan(setup, library + mine) == [(variant, 16, 2, anchor - 2, 0)]
    # another model at the same shape keeps the centred grid
    other = replace(setup, parametrisations=(study.REFERENCE_BASELINE,))
    assert len(study.plan(other, [])) == 7
