"""The shaped-vs-vanilla training study (examples/shaped_vs_vanilla): --quick end to end."""

import itertools
import json
import sys
from pathlib import Path

import pytest
from run_history import load_script

STUDY = Path(__file__).parents[1] / "examples" / "shaped_vs_vanilla" / "study.py"


def _load_study(monkeypatch):
    # report.py (beside study.py) imports it as ``study``: restored after the test, other
    # studies have modules of the same names
    monkeypatch.syspath_prepend(str(STUDY.parent))
    monkeypatch.delitem(sys.modules, "report", raising=False)
    return load_script(STUDY, "study", monkeypatch)


@pytest.mark.slow  # a quick study, run twice: about a minute on a busy CPU
def test_quick_study_runs_end_to_end_and_resumes(tmp_path, monkeypatch):
    study = _load_study(monkeypatch)
    assert study.main(["--quick", "--out", str(tmp_path), "--workers", "1",
                       "--models", "shaped g=0.2", "pre-LN (GPT-2)"]) == 0  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    setup = study.QUICK
    for model in ("shaped g=0.2", "pre-LN (GPT-2)"):
        for depth in setup.depths:
            cell = results["models"][model]["depth"][str(depth)]
            assert cell["lr"] in cell["lr_curve"]["lr"]
            assert len(cell["val_loss"]) == len(setup.seeds)
            assert isinstance(cell["diverged"], int) and cell["runs"] >= len(setup.lrs)
            # the lr grid is spaced by 3x and the best lr is not at an edge unless capped
            lrs = cell["lr_curve"]["lr"]
            assert all(abs(b / a - 3) < 0.05 for a, b in itertools.pairwise(lrs))
    assert results["unigram_baseline"]["cross_entropy"] > results["unigram_baseline"][
        "val_entropy"
    ]  # fmt: skip
    for name in ("loss_vs_depth", "loss_vs_lr", "loss_curves", "mean_rho_by_layer"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 0
    assert (tmp_path / "results.md").read_text().startswith("# Results: shaped vs vanilla")
    assert "| shaped g=0.2 |" in (tmp_path / "tables.md").read_text()
    # a second invocation trains nothing: every finished run is kept as it is
    finished = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/*/*/result.json")}
    stored = study.RunStore(tmp_path / "runs.jsonl")
    assert len(stored) == len(finished) > 0 and len(study.load_results(tmp_path)) == len(stored)
    assert study.plan(setup.__class__(**{**vars(setup), "models": ("shaped g=0.2",
                      "pre-LN (GPT-2)")}), study.load_results(tmp_path)) == []  # fmt: skip
    assert study.main(["--quick", "--out", str(tmp_path), "--workers", "1",
                       "--models", "shaped g=0.2", "pre-LN (GPT-2)"]) == 0  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
