"""The shaped-vs-vanilla study's committed reports are generated from its committed runs
(examples/shaped_vs_vanilla/runs.jsonl): regenerated, they equal the committed files; and every
run converted from a per-run result.json kept all of its data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_history import load_script, result_jsons_at

from simulations.studies import RunStore, lr_tag

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "examples" / "shaped_vs_vanilla"
CONVERTED_FROM = "550197ff3fbdbd124f85f35ca52c3e68fcd3d317"
"""The last commit that tracked the per-run ``result.json`` files runs.jsonl was made from
(folders ``lr<lr:.0e>_s<seed>``; keys now ``lr_tag(lr)``)."""


def _load(name: str, monkeypatch, path: Path | None = None):
    return load_script(path or STUDY / f"{name}.py", name, monkeypatch)


@pytest.fixture
def modules(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    return _load("study", monkeypatch), _load("report", monkeypatch)


def test_committed_report_is_regenerated_from_the_committed_runs(modules, tmp_path):
    study, report = modules
    results = [study.flat_result(r) for r in RunStore(STUDY / "runs.jsonl").results()]
    committed = json.loads((STUDY / "results.json").read_text())
    if report.unigram_baseline(study.DEFAULT.max_bytes) != committed["unigram_baseline"]:
        pytest.skip("this Python's standard library is another corpus than the study's")
    assert study.plan(study.DEFAULT, results) == []  # the study is complete
    report.report(study.DEFAULT, tmp_path, results)
    for name in ("results.md", "results.json", "tables.md"):
        assert (tmp_path / name).read_text() == (STUDY / name).read_text(), name
    for name in ("loss_vs_depth", "loss_vs_lr", "loss_curves", "mean_rho_by_layer"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 0
        assert (STUDY / "figures" / f"{name}.png").exists()


def test_the_default_setup_is_recognised_from_the_script_run_as_main(modules, monkeypatch):
    """``python study.py --report`` runs study.py as ``__main__`` and report.py imports a
    second copy: the report must still see the default setup (it writes the horizon caveat
    only for the default; ``==`` between the copies' classes was always False)."""
    study, report = modules
    script = _load("study_as_script", monkeypatch, STUDY / "study.py")  # the second copy
    assert type(script.DEFAULT) is not type(study.DEFAULT)
    assert report.is_default(script.DEFAULT) and report.is_default(study.DEFAULT)
    assert not report.is_default(script.QUICK)


def test_every_converted_run_equals_its_original_result_json():
    originals = result_jsons_at(CONVERTED_FROM, "examples/shaped_vs_vanilla/runs/")
    records = dict(RunStore(STUDY / "runs.jsonl").records())
    assert len(originals) == len(records) == 134
    for path, original in originals.items():
        slug, depth, folder = path.split("/")[-4:-1]
        seed = folder.rsplit("_s", 1)[1]
        assert f"lr{original['lr']:.0e}_s{seed}" == folder, path
        assert records[f"{slug}/{depth}/{lr_tag(original['lr'])}_s{seed}"] == original, path
