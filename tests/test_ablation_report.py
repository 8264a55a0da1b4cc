"""The ablation's committed report is generated from the committed runs
(examples/ablation/runs.jsonl, long/runs.jsonl and the long-horizon study's store):
regenerated, it equals the committed files; its numbers are the runs' (a cell recomputed
by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from run_history import load_script

from simulations.studies import RunStore

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "examples" / "ablation"


@pytest.fixture(scope="module")
def report():
    return load_script(STUDY / "report.py", "ablation_report")


@pytest.fixture(scope="module")
def runs(report):
    ablation = [r for folder in report.STAGES for r in RunStore(folder / "runs.jsonl").results()]
    long_horizon = RunStore(ROOT / "examples" / "long_horizon" / "runs.jsonl").results()
    return ablation, long_horizon


def test_committed_report_is_regenerated_from_the_committed_runs(report, runs, tmp_path):
    summary = report.summarise(*runs)
    assert summary == json.loads((STUDY / "results.json").read_text())
    assert report.markdown(summary) == (STUDY / "results.md").read_text()
    assert report.figure(summary, tmp_path / "f.png").stat().st_size > 0
    assert (STUDY / "figures" / "loss_vs_horizon.png").exists()


def test_every_ablation_run_is_stored_and_is_a_variant_or_a_baseline(report, runs):
    ablation, _ = runs
    assert len(ablation) >= 2
    assert {r["model_name"] for r in ablation} <= {*report.VARIANTS, *report.BASELINES}
    for r in ablation:
        if r["model_name"] not in report.VARIANTS:  # a baseline trained on a variant's recipe
            continue
        gamma = {16: 0.15, 64: 0.05}[r["depth"]]  # advise's at each depth (long-horizon study)
        if r["model_name"] == "shaped g=0.1, slopes+attn+tau":  # (j): depth 64's d gamma^2
            gamma = 0.1
        assert r["model_config"]["config.gamma"] == gamma
        assert r["model_config"]["config.tau0"] == 0.25


def test_a_cell_and_its_ratios_recomputed_from_the_runs(report, runs):
    ablation, long_horizon = runs
    summary = report.summarise(ablation, long_horizon)
    relu = [r for r in ablation if r["model_name"] == "shaped advise, relu"]
    gpt2 = [
        r for r in long_horizon
        if r["model_name"] == "pre-LN (GPT-2)" and r["depth"] == 16 and r["schedule"] == "wsd"
    ]  # fmt: skip
    h = "2000"
    seed0 = [r for r in relu if r["seed"] == 0 and not r["horizons"][h]["diverged"]]
    best = min(seed0, key=lambda r: r["horizons"][h]["val_loss"])
    models = summary["depths"]["16"]["models"]
    cell = models["shaped advise, relu"][h]
    assert cell["best_lr"] == best["lr"]
    at = [r["horizons"][h]["val_loss"] for r in relu if r["lr"] == best["lr"]]
    assert cell["mean"] == pytest.approx(sum(at) / len(at))
    g0 = [r for r in gpt2 if r["seed"] == 0 and not r["horizons"][h]["diverged"]]
    g_lr = min(g0, key=lambda r: r["horizons"][h]["val_loss"])["lr"]
    g = [r["horizons"][h]["val_loss"] for r in gpt2 if r["lr"] == g_lr]
    assert cell["vs_gpt2"] == pytest.approx(cell["mean"] / (sum(g) / len(g)) - 1)
    assert math.isclose(cell["vs_best"], cell["mean"] / min(
        models[b][h]["mean"] for b in report.BASELINES if b in models
    ) - 1)  # fmt: skip


def test_each_depth_is_compared_with_the_baselines_at_that_depth(report, runs):
    """A variant run at depth 64 gets its own section, its ratios against the baselines at
    depth 64 (not 16's), and advise's checks at depth 64."""
    ablation, long_horizon = runs
    free, h = "shaped advise, slopes+attn+tau", "2000"
    deep = {**next(r for r in ablation if r["model_name"] == free and r["depth"] == 16),
            "depth": 64, "lr": 0.00333, "seed": 0,
            "horizons": {h: {"val_loss": 1.3, "diverged": False}}}  # fmt: skip
    summary = report.summarise([r for r in ablation if r["depth"] == 16] + [deep], long_horizon)
    assert list(summary["depths"]) == ["16", "64"]
    at = summary["depths"]["64"]
    gpt2 = [
        r
        for r in long_horizon
        if r["model_name"] == report.GPT2 and r["depth"] == 64 and r["schedule"] == "wsd"
    ]
    seed0 = [r for r in gpt2 if r["seed"] == 0]
    g_lr = min(seed0, key=lambda r: r["horizons"][h]["val_loss"])["lr"]
    g = [r["horizons"][h]["val_loss"] for r in gpt2 if r["lr"] == g_lr]
    cell = at["models"][free][h]
    assert cell["mean"] == 1.3 and not cell["bracketed"]
    assert cell["vs_gpt2"] == pytest.approx(1.3 / (sum(g) / len(g)) - 1)
    assert cell["minus_shaped"] == pytest.approx(1.3 - at["models"][report.SHAPED][h]["mean"])
    assert at["horizons"] == [2000] and summary["depths"]["16"]["horizons"][-1] == 5000
    text = report.markdown(summary)
    assert "## Depth 16" in text and "## Depth 64" in text and "Depths 16, 64" in text
    checks = [c for c in report.trained_checks(summary) if c["depth"] == 64]
    assert {c["preset"] for c in checks} == {"shaped", "shaped_free"}
    assert next(c for c in checks if c["preset"] == "shaped_free")["loss"] == 1.3


def test_a_diverged_horizon_is_reported_as_diverged(report):
    run = {
        "model_name": "shaped advise, gelu", "depth": 16, "lr": 0.01, "k": 0, "seed": 0,
        "schedule": "wsd",
        "model_config": {"config.width": 64, "config.gamma": 0.15, "config.tau0": 0.25},
        "train_config": {"train.cooldown_fraction": 0.2},
        "horizons": {"1000": {"val_loss": 1.5, "diverged": False},
                     "2000": {"val_loss": None, "diverged": True, "diverged_step": 1234,
                              "max_logit": {"curve": {"step": [0, 1200],
                                                      "value": [3.5, 7.0e4]}}}},
    }  # fmt: skip
    alone = report.summarise([run], [])
    assert alone["depths"]["16"]["models"]["shaped advise, gelu"]["2000"]["mean"] is None
    assert "| diverged |" in report.markdown(alone)
    finished = {**run, "lr": 0.003, "horizons": {"2000": {"val_loss": 1.4, "diverged": False}}}
    summary = report.summarise([run, finished], [])
    cells = summary["depths"]["16"]["models"]["shaped advise, gelu"]
    assert cells["2000"]["mean"] == 1.4 and cells["2000"]["diverged"] == 1
    assert cells["1000"]["mean"] == 1.5 and not cells["1000"]["bracketed"]
    assert "0.01: diverged" in report.markdown(summary)
    # the diverged run, and only it, is listed with its step and logits
    assert summary["depths"]["16"]["diverged"] == [
        {"model": "shaped advise, gelu", "lr": 0.01, "step": 1234, "logit_init": 3.5,
         "logit_last": 7.0e4, "logit_last_step": 1200}
    ]  # fmt: skip
    assert "| (c) GELU MLP | 0.01 | 1234 | 3.5 -> 7e+04 (1200) |" in report.markdown(summary)
    assert "Every run's WSD cooldown is the last 20% of its horizon." in report.markdown(summary)


def test_the_report_names_each_model_whose_cooldown_is_not_the_recipes(report):
    """The cooldown's share is read from each run's train config: the models that ran another
    share than most are named with it."""
    fractions = {"shaped advise, gelu": 0.2, "shaped advise, relu": 0.2, report.COOLDOWN_40: 0.4}
    (line,) = report._cooldown_fractions(fractions)
    assert line == (
        f"Every run's WSD cooldown is the last 20% of its horizon, but the last 40% for "
        f"{report.COOLDOWN_40}."
    )
    summary = json.loads((STUDY / "results.json").read_text())
    assert summary["cooldown_fractions"]["shaped advise, relu"] == 0.2


def test_each_checked_model_is_its_preset_as_trained(report, runs):
    """``advise`` quotes a study model's training under a preset's name (``CHECKED``): every
    stored run of that model is the preset at the run's sizes, gamma and tau0, field by field
    (a preset changed without its check, or the reverse, fails)."""
    from shapedtx import ModelConfig, preset

    ablation, long_horizon = runs
    for model, name in report.CHECKED.items():
        stored = [r for r in ablation + long_horizon if r["model_name"] == model]
        assert stored, model
        for r in stored:
            trained = ModelConfig.from_attrs(r["model_config"])
            sizes = ("width", "depth", "heads", "mlp_ratio", "causal", "gamma", "tau0")
            built = preset(name, **{f: getattr(trained, f) for f in sizes})
            assert built == trained, (model, r["depth"], r["lr"], r["seed"])


def test_advise_quotes_the_packaged_checks_the_report_generates(report, runs):
    """``shapedtx advise``'s training checks are package data the report writes from the
    runs: regenerated, they equal the packaged file; the advice names its model and, at a
    size not checked, says so."""
    from dataclasses import replace

    from simulations import advise, format_advice, trained_checks

    ablation, long_horizon = runs
    summary = report.summarise(ablation, long_horizon)
    assert trained_checks() == report.trained_checks(summary)
    assert {c["preset"] for c in trained_checks(64, 16)} == {"shaped", "shaped_free"}
    assert trained_checks(128, 16) == []
    grid = {"gammas": (0.15,), "tau0s": (0.25,), "samples": 16, "screen_samples": 16, "steps": 5}
    a = advise(64, 16, 8, heads=4, mlp_ratio=4, **grid)
    text = format_advice(a)
    assert "model advised: the shaped Transformer" in text
    free = next(c for c in trained_checks(64, 16) if c["preset"] == "shaped_free")
    assert f"shaped_free at gamma 0.15, tau0 0.25: lr {free['lr']:g}" in text
    at = summary["depths"]["16"]["models"]
    best = at[free["best_baseline"]][str(free["horizon"])]["mean"]
    assert free["best_baseline_loss"] == best and free["best_baseline"] == "pre-LN depth-muP"
    assert (  # which baseline each ratio is against
        f"vs GPT-2 pre-LN {free['gpt2_pre_ln_loss']:.3f} ({100 * free['vs_gpt2_pre_ln']:+.1f}%), "
        f"vs the strongest baseline measured, pre-LN depth-muP, {best:.3f} "
        f"({100 * (free['loss'] / best - 1):+.1f}%)"
    ) in text
    assert a.to_dict()["trained_checks"] == trained_checks(64, 16)
    other = format_advice(replace(a, width=128))
    where = "width 64 depth 16, width 64 depth 64"
    assert f"checked in training: not at this size (checked: {where})" in other
    assert "not checked" in format_advice(replace(a, mlp_ratio=1))


def test_a_repeated_run_keeps_its_longest_record_and_states_the_difference(report):
    def run(horizons: dict[str, float]) -> dict:
        return {
            "model_name": "shaped advise, slopes+attn", "depth": 16, "lr": 0.01, "seed": 0,
            "schedule": "wsd",
            "horizons": {h: {"val_loss": v, "diverged": False} for h, v in horizons.items()},
        }  # fmt: skip

    screen, longer = run({"250": 2.0, "2000": 1.25}), run({"250": 2.0, "2000": 1.5, "5000": 1.1})
    other = {**run({"250": 3.0}), "lr": 0.03}
    kept, diff = report.merge([screen, other, longer])
    assert kept == [longer, other] and diff == 0.25
    assert report.merge([screen, other]) == ([screen, other], None)
    assert report.merge([screen, run({"250": 2.0, "2000": 1.25, "5000": 1.0})])[1] == 0.0
    assert "the same losses" in "".join(report._repeated(0.0))
    assert "within 0.25" in "".join(report._repeated(0.25)) and report._repeated(None) == []


def test_the_cooldown_table_reads_each_best_run_at_the_cooldowns_first_step(report):
    """Per model its seed-0 run at the best lr of the longest horizon: the validation loss at
    the cooldown's first step (steps * (1 - cooldown_fraction)) and after it, each against
    the best baseline's; another lr's or seed's curve is not read."""
    config = {"config.width": 64, "config.gamma": 0.15, "config.tau0": 0.25}

    def run(model: str, lr: float, seed: int, before: float, after: float) -> dict:
        curve = {"step": [0, 2000, 4000, 5000], "loss": [5.0, 2.0, before, after]}
        return {
            "model_name": model, "depth": 16, "lr": lr, "k": 0, "seed": seed, "schedule": "wsd",
            "model_config": config,
            "train_config": {"train.schedule": "wsd", "train.cooldown_fraction": 0.2},
            "horizons": {"5000": {"val_loss": after, "diverged": False, "val_curve": curve}},
        }  # fmt: skip

    variant, baseline = "shaped advise, slopes+attn+tau", "pre-LN depth-muP"
    runs = [
        run(variant, 0.01, 0, 1.30, 1.15),
        run(variant, 0.01, 1, 9.0, 1.16),  # another seed: in the mean, not in the table
        run(variant, 0.03, 0, 1.20, 1.25),  # a worse lr at 5,000 steps
        run(baseline, 0.01, 0, 1.25, 1.10),
    ]
    at = report.summarise(runs[:3], runs[3:])["depths"]["16"]
    entry = at["cooldown"][variant]
    assert (entry["lr"], entry["step"], entry["before"], entry["after"]) == (0.01, 4000, 1.30, 1.15)
    assert entry["vs_best_before"] == pytest.approx(1.30 / 1.25 - 1)
    assert entry["vs_best_after"] == pytest.approx(1.15 / 1.10 - 1)
    assert at["cooldown"][baseline]["vs_best_after"] == 0.0
    line = "| (f) (e) + trainable temperature | 0.01 | 1.300 (4000) | 1.150 | -0.150 | +4.0%, +4.5%"
    assert line in report.markdown(report.summarise(runs[:3], runs[3:]))
    # a model with a longer cooldown is set against the baseline with the same one, even
    # where that baseline is not the best at the horizon
    longer = {"train.schedule": "wsd", "train.cooldown_fraction": 0.4}
    late = {"step": [0, 2000, 3000, 5000], "loss": [5.0, 2.0, 1.35, 1.13]}
    q = "shaped advise, slopes+attn+tau, biases, vectors lr/3, cooldown 40%"
    runs += [
        {**run(q, 0.01, 0, 0, 0), "train_config": longer, "horizons": {"5000": {
            "val_loss": 1.13, "diverged": False, "val_curve": late}}},
        {**run(report.COOLDOWN_40, 0.01, 0, 0, 0), "train_config": longer, "horizons": {"5000": {
            "val_loss": 1.125, "diverged": False,
            "val_curve": {**late, "loss": [5, 2, 1.3, 1.125]}}}},
    ]  # fmt: skip
    at = report.summarise(runs[:3] + runs[4:], runs[3:4])["depths"]["16"]
    assert at["cooldown"][q]["step"] == 3000 and at["cooldown"][q]["baseline"] == report.COOLDOWN_40
    assert at["cooldown"][q]["vs_best_before"] == pytest.approx(1.35 / 1.3 - 1)
    assert at["cooldown"][variant]["baseline"] == baseline


def test_the_goal_table_judges_three_seeds_each_against_the_best_baseline(report):
    """At the longest horizon: the ratio of the means (its standard error from both seed
    spreads), the seed-paired ratio over the seeds both ran, whether the SDE describes the
    model at initialisation, and the verdict (met: 3 seeds each within 1%; open: fewer)."""
    shaped = {"config.width": 64, "config.depth": 16, "config.gamma": 0.15, "config.tau0": 0.25}

    def run(model: str, seed: int, loss: float, config: dict | None = None) -> dict:
        return {
            "model_name": model, "depth": 16, "lr": 0.01, "k": 0, "seed": seed,
            "schedule": "wsd",
            "model_config": config or shaped,
            "train_config": {"train.cooldown_fraction": 0.2},
            "horizons": {"5000": {"val_loss": loss, "diverged": False}},
        }  # fmt: skip

    base = [run("pre-LN depth-muP", s, v) for s, v in enumerate((1.10, 1.12, 1.14))]
    near = [run("shaped advise, slopes+attn+tau", s, v) for s, v in enumerate((1.11, 1.13, 1.15))]
    far = [run("shaped advise, slopes+attn", s, v) for s, v in enumerate((1.14, 1.15, 1.20))]
    normed = {**shaped, "config.norm": "pre", "config.norm_kind": "rms"}
    one = [run("shaped advise, slopes+attn+tau, pre-RMSNorm", 0, 1.125, normed)]
    goal = report.summarise(near + far + one, base)["depths"]["16"]["goal"]
    g = goal["shaped advise, slopes+attn+tau"]
    assert g["ratio"] == pytest.approx(1.13 / 1.12 - 1) and g["verdict"] == "met"
    se = 1.13 / 1.12 * math.sqrt((0.02 / 1.13) ** 2 / 3 + (0.02 / 1.12) ** 2 / 3)  # both sd 0.02
    assert g["ratio_se"] == pytest.approx(se)
    paired = [1.11 / 1.10 - 1, 1.13 / 1.12 - 1, 1.15 / 1.14 - 1]
    assert g["paired"] == pytest.approx(sum(paired) / 3) and g["pairs"] == 3
    sd = math.sqrt(sum((p - sum(paired) / 3) ** 2 for p in paired) / 2)
    assert g["paired_se"] == pytest.approx(sd / math.sqrt(3))
    assert g["sde_at_init"] and g["baseline"] == "pre-LN depth-muP" and g["baseline_seeds"] == 3
    assert goal["shaped advise, slopes+attn"]["verdict"] == "not met"  # +2.7%
    o = goal["shaped advise, slopes+attn+tau, pre-RMSNorm"]
    assert o["verdict"] == "not shaped at initialisation" and not o["sde_at_init"]
    assert o["ratio_se"] is None  # one seed
    assert o["pairs"] == 1 and o["paired"] == pytest.approx(1.125 / 1.10 - 1)  # seed 0's
    text = report.markdown(report.summarise(near + far + one, base))
    assert "### The goal: within 1% of the best baseline at 5000 steps, 3 seeds each" in text
    assert "| (f) (e) + trainable temperature | yes | 3 | +0.9% ± " in text
    assert (
        "| no | 1 | +0.4% (pre-LN depth-muP, 3) | +2.3% (1) | not shaped at initialisation |"
        in text
    )


def test_a_grid_with_half_steps_is_named_in_the_reports_first_paragraph(report, runs):
    """A run half a grid step away (``study.py --refine``) joins its model's grid (its lr
    sorted among the others) and the first paragraph names the refined grids."""
    ablation, long_horizon = ([r for r in stage if not r["k"] % 1] for stage in runs)
    assert report.summarise(ablation, long_horizon)["refined"] == []
    free = "shaped advise, slopes+attn+tau, biases"
    base = next(r for r in ablation if r["model_name"] == free and r["k"] == 0 and not r["seed"])
    half = {**base, "k": 1.5, "lr": 0.052,
            "horizons": {"5000": {"val_loss": 0.5, "diverged": False}}}  # fmt: skip
    summary = report.summarise([*ablation, half], long_horizon)
    assert summary["refined"] == [[free, 16]]
    cell = summary["depths"]["16"]["models"][free]["5000"]
    assert cell["best_lr"] == 0.052 and cell["mean"] == 0.5
    text = report.markdown(summary)
    assert "half steps, x 3^(1/2), on each side of the best lr" in text
    assert f"{report._label(free)} at depth 16" in text.replace("\n", " ")
    assert report._refined([]) == ""
