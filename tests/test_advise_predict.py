"""examples/advise: do the advisor's init-time scores predict the trained loss? Its committed
reports are generated from its committed stores (regenerated, they equal the committed files),
every run and score converted from its per-run JSON file kept all of its data, and its quick
mode runs end to end on the Dask path with WSD horizons."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from run_history import load_script, result_jsons_at

from simulations.studies import RunStore, lr_tag

STUDY = Path(__file__).parents[1] / "examples" / "advise"
CONVERTED_FROM = "155f6636ea9eed3153367e7935ce7d3ff19f054e"
"""The last commit that tracked the per-run ``result.json`` files (folders ``lr<lr:g>`` and,
per horizon, ``lr<lr:g>_wsd``; keys now ``lr_tag(lr)``) and the ``advice/`` and ``scores/``
files of each study folder."""


def _load(name: str, monkeypatch):
    return load_script(STUDY / f"{name}.py", name, monkeypatch)


@pytest.fixture
def predict(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    return _load("predict", monkeypatch)


@pytest.fixture
def report(predict, monkeypatch):
    return _load("report", monkeypatch)


def test_per_horizon_study_keeps_the_fixed_horizon_results(predict):
    """The per-horizon study writes beside, not over, the committed fixed-horizon study, and
    a measured folder's setup is the default there."""
    assert predict.default_out(predict.Setup()) == STUDY
    assert predict.default_out(predict.Setup(horizons=(250, 5000))) == STUDY / "long_horizon"
    assert predict.setup_of(predict.parse(["--report"])) == (predict.MEASURED["."], STUDY)
    setup, out = predict.setup_of(predict.parse(["--horizons", "250", "5000"]))
    assert out == STUDY / "long_horizon"
    assert setup == predict.Setup(**{**vars(predict.MEASURED["long_horizon"]),
                                     "horizons": (250, 5000)})  # fmt: skip


def test_committed_reports_are_regenerated_from_the_committed_stores(predict, report):
    for name, setup in predict.MEASURED.items():
        folder = STUDY / name
        scores = dict(RunStore(folder / predict.SCORE_STORE).records())
        results = RunStore(folder / "runs.jsonl").results()
        rows = predict.configurations(setup, predict.stored_advice(scores))
        assert len(results) == len(setup.lrs) * len(rows)  # every study is complete
        summary = report.summarise(setup, results, scores)
        text = json.dumps(summary, indent=1) + "\n"
        assert text == (folder / "results.json").read_text(), name
        assert (folder / "score_vs_loss.png").stat().st_size > 0
    assert report.results_md(STUDY) == (STUDY / "results.md").read_text()


def test_bootstrap_is_the_loop_over_spearmanr(report):
    """The vectorised bootstrap gives the interval of the loop it replaced, bit for bit
    (ties, a diverged run as +inf and constant resamples included)."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(size=10), 0.5, 0.5, math.inf]
    y = np.r_[x[:10] + rng.normal(size=10), 2.0, math.inf, math.inf]
    n_boot = 300
    draws = np.random.default_rng(0)
    stats = []
    for _ in range(n_boot):
        idx = draws.integers(0, len(x), len(x))
        if np.unique(x[idx]).size > 1 and np.unique(y[idx]).size > 1:
            stats.append(spearmanr(x[idx], y[idx]).statistic)
    value, ci = report.bootstrap_spearman(x, y, n_boot=n_boot, seed=0)
    assert value == spearmanr(x, y).statistic
    assert ci == [float(v) for v in np.nanpercentile(stats, [2.5, 97.5])]


def test_every_converted_run_and_score_equals_its_original_file():
    for name, runs, scores in ((".", 52, 28), ("long_horizon", 39, 14),
                               ("width64_depth64", 39, 14)):  # fmt: skip
        folder = f"examples/advise/{name}/".replace("/./", "/")
        originals = result_jsons_at(CONVERTED_FROM, f"{folder}runs/")
        records = dict(RunStore(STUDY / name / "runs.jsonl").records())
        assert len(originals) == len(records) == runs, name
        for path, original in originals.items():
            depth, config, lr = path.removeprefix(f"{folder}runs/").split("/")[:3]
            assert lr.removesuffix("_wsd") == f"lr{original['lr']:g}", path
            assert records[f"{depth}/{config}/{lr_tag(original['lr'])}"] == original, path
        old = {
            **result_jsons_at(CONVERTED_FROM, f"{folder}advice/", suffix=".json"),
            **result_jsons_at(CONVERTED_FROM, f"{folder}scores/", suffix=".json"),
        }
        stored = dict(RunStore(STUDY / name / "scores.jsonl").records())
        assert len(old) == len(stored) == scores, name
        for path, original in old.items():
            kind, file = path.removeprefix(folder).split("/")
            key = file.removesuffix(".json").replace("_", "/", 1) if kind == "scores" else file[:-5]
            assert stored[f"{kind}/{key}"] == original, path


def test_a_folder_of_the_other_kind_is_refused(predict, tmp_path):
    wsd = {"train_config": {"train.schedule": "wsd"}}
    with pytest.raises(ValueError, match="per-horizon"):
        predict.check_kind(predict.QUICK, tmp_path, [wsd])
    with pytest.raises(ValueError, match="fixed-horizon"):
        predict.check_kind(predict.Setup(horizons=(10, 20)), tmp_path, [{"val_loss": 1.0}])
    predict.check_kind(predict.QUICK, tmp_path, [{"val_loss": 1.0}])  # the flat form: fixed


@pytest.mark.slow  # a quick study on Dask: about a minute on a busy CPU
def test_quick_per_horizon_prediction_end_to_end_on_dask(predict, tmp_path):
    """Two grid configurations plus the advised and the rejected one at depth 2, two lrs, WSD
    horizons 10 and 20 from one run each, on an embedded one-worker Dask cluster: a Spearman
    with its bootstrap interval per horizon, each from the best lr at that horizon; a second
    call trains nothing again."""
    args = ["--quick", "--out", str(tmp_path), "--depths", "2", "--gammas", "0.1", "0.9"]
    args += ["--tau0s", "1.0", "--horizons", "10", "20", "--workers", "1"]
    assert predict.main(args) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result["by_horizon"]) == {"10", "20"}
    for horizon, at in result["by_horizon"].items():
        assert at["horizon"] == int(horizon) and len(at["configs"]) == 4
        spearman = at["spearman"]
        assert spearman["score"] == "rho_spread" and spearman["runs"] == 4
        assert math.isfinite(spearman["value"])  # every configuration trains at these sizes
        lo, hi = spearman["ci"]
        assert -1 <= lo <= spearman["value"] <= hi <= 1
        counts = at["best_lr_counts"]
        assert set(counts) == {"0.003", "0.01", "diverged"} and sum(counts.values()) == 4
        for lr in ("0.003", "0.01"):
            assert counts[lr] == sum(f"{c['best_lr']:g}" == lr for c in at["configs"])
        for config in at["configs"]:
            losses = {k: v for k, v in config["losses"].items() if v is not None}
            assert losses  # the best lr of this horizon, not of the longest
            assert config["loss"] == min(losses.values())
            assert f"{config['best_lr']:g}" == min(losses, key=losses.get)
    assert result["horizon"] == 20 and result["configs"] == result["by_horizon"]["20"]["configs"]
    store = RunStore(tmp_path / "runs.jsonl")
    assert len(store) == 8  # 4 configurations x 2 lrs, one run per pair for both horizons
    assert all(set(r["horizons"]) == {"10", "20"} for r in store.results())
    assert {key.rsplit("/", 1)[1] for key, _ in store.records()} == {lr_tag(3e-3), lr_tag(1e-2)}
    scores = RunStore(tmp_path / "scores.jsonl").keys()
    configs = {predict.config_key(c["depth"], c["gamma"], c["tau0"]) for c in result["configs"]}
    assert scores == {f"scores/{k}" for k in configs} | {"advice/d2"}
    runs = sorted(tmp_path.glob("runs/*/*/lr*/result.json"))  # the scratch folders
    assert len(runs) == 8
    stamps = {p: p.stat().st_mtime_ns for p in runs}
    before = (tmp_path / "runs.jsonl").read_text()
    assert predict.main([*args, "--plan"]) == 0
    assert predict.main(args) == 0  # resumes: nothing is trained again
    assert {p: p.stat().st_mtime_ns for p in runs} == stamps
    assert (tmp_path / "runs.jsonl").read_text() == before
    assert not (tmp_path / "results.md").exists()  # not a measured study's folder
