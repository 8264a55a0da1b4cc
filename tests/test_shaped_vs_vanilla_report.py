"""The shaped-vs-vanilla study's committed reports are generated from its committed runs
(examples/shaped_vs_vanilla/runs.jsonl): regenerated, they equal the committed files; and every
run converted from a per-run result.json kept all of its data."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulations.studies import RunStore, lr_tag

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "examples" / "shaped_vs_vanilla"
CONVERTED_FROM = "550197ff3fbdbd124f85f35ca52c3e68fcd3d317"
"""The last commit that tracked the per-run ``result.json`` files runs.jsonl was made from
(folders ``lr<lr:.0e>_s<seed>``; keys now ``lr_tag(lr)``)."""


def _load(name: str, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, STUDY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # restored after the test: other studies have modules of the same names
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


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


def test_every_converted_run_equals_its_original_result_json():
    try:
        subprocess.run(["git", "cat-file", "-e", f"{CONVERTED_FROM}^{{commit}}"],
                       cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history is not here (a shallow or exported copy)")
    tracked = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", CONVERTED_FROM, "examples/shaped_vs_vanilla/runs/"],
        capture_output=True, cwd=ROOT, check=True, text=True,
    ).stdout.split()  # fmt: skip
    tracked = [p for p in tracked if p.endswith("/result.json")]
    records = dict(RunStore(STUDY / "runs.jsonl").records())
    assert len(tracked) == len(records) == 134
    query = "".join(f"{CONVERTED_FROM}:{p}\n" for p in tracked).encode()
    out = subprocess.run(["git", "cat-file", "--batch"], input=query, capture_output=True,
                         cwd=ROOT, check=True).stdout  # fmt: skip
    at = 0
    for path in tracked:
        end = out.index(b"\n", at)
        size = int(out[at:end].split()[2])
        original = json.loads(out[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
        slug, depth, folder = path.split("/")[-4:-1]
        seed = folder.rsplit("_s", 1)[1]
        assert f"lr{original['lr']:.0e}_s{seed}" == folder, path
        assert records[f"{slug}/{depth}/{lr_tag(original['lr'])}_s{seed}"] == original, path
