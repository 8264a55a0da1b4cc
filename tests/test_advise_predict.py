"""examples/advise/predict.py (issue 42 item 4): do the advisor's init-time scores predict the
trained loss at every horizon? Its quick mode end to end on the Dask path, with WSD horizons."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "examples" / "advise" / "predict.py"


@pytest.fixture
def predict(monkeypatch):
    spec = importlib.util.spec_from_file_location("predict", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "predict", module)
    spec.loader.exec_module(module)
    return module


def test_per_horizon_study_keeps_the_fixed_horizon_results(predict):
    """The per-horizon study writes beside, not over, the committed fixed-horizon study."""
    fixed = predict.Setup()
    assert predict.default_out(fixed) == SCRIPT.parent
    per_horizon = predict.Setup(horizons=(250, 5000))
    assert predict.default_out(per_horizon) == SCRIPT.parent / "long_horizon"


def test_quick_per_horizon_prediction_end_to_end_on_dask(predict, tmp_path):
    """Two grid configurations plus the advised and the rejected one at depth 2, two lrs, WSD
    horizons 10 and 20 from one run each, on an embedded one-worker Dask cluster: a Spearman
    with its bootstrap interval per horizon, each from the best lr at that horizon; a second
    call trains nothing again."""
    args = ["--quick", "--out", str(tmp_path), "--depths", "2", "--gammas", "0.1", "0.9"]
    args += ["--tau0s", "1.0", "--horizons", "10", "20", "--workers", "1"]
    predict.main(args)
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
    runs = sorted(tmp_path.glob("runs/*/*/lr*_wsd/result.json"))
    assert len(runs) == 8  # 4 configurations x 2 lrs, one run per pair for both horizons
    assert all(set(json.loads(p.read_text())["horizons"]) == {"10", "20"} for p in runs)
    stamps = {p: p.stat().st_mtime_ns for p in runs}
    predict.main(args)  # resumes: nothing is trained again
    assert {p: p.stat().st_mtime_ns for p in runs} == stamps
