"""The long-horizon study's committed reports are generated from its committed runs
(examples/long_horizon/runs.jsonl): regenerated, they equal the committed files; and every
run converted from a per-run result.json kept all of its data."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from run_history import load_script

from simulations.studies import RunStore

ROOT = Path(__file__).parents[1]
STUDY = ROOT / "examples" / "long_horizon"
CONVERTED_FROM = "4d90a5dec2d46feb8b649728edfd90a6dd0f5ac3"
"""The last commit that tracked the per-run ``result.json`` files runs.jsonl was made from."""
CONVERTED = {".": 71, "gpu_h2000": 6}
"""Report folder -> runs converted from result.json files."""


def _load(name: str):
    return load_script(STUDY / f"{name}.py", name)


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(STUDY))  # report.py imports study.py beside it
    try:
        _load("study")
        yield _load("report")
    finally:
        sys.path.remove(str(STUDY))


@pytest.mark.parametrize("folder", list(CONVERTED))
def test_committed_report_is_regenerated_from_the_committed_runs(report, folder, tmp_path):
    src = STUDY / folder
    results = RunStore(src / "runs.jsonl").results()
    assert len(results) >= CONVERTED[folder]
    report.report(report.REPORTS[folder], tmp_path, results)
    for name in ("results.md", "results.json", "tables.md"):
        assert (tmp_path / name).read_text() == (src / name).read_text(), name
    for name in ("loss_vs_horizon.png", "covariance_by_layer.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 0
        assert (src / "figures" / name).exists()


def test_the_report_main_writes_a_committed_report(report, tmp_path, monkeypatch):
    (tmp_path / "gpu_h2000").mkdir()
    shutil.copy(STUDY / "gpu_h2000" / "runs.jsonl", tmp_path / "gpu_h2000" / "runs.jsonl")
    monkeypatch.setattr(report, "HERE", tmp_path)
    assert report.main(["gpu_h2000"]) == 0
    written = (tmp_path / "gpu_h2000" / "results.md").read_text()
    assert written == (STUDY / "gpu_h2000" / "results.md").read_text()
    with pytest.raises(SystemExit):
        report.main(["gpu"])  # not a committed report


def _git_files(paths: list[str]) -> list[bytes | None]:
    """The files at ``CONVERTED_FROM`` (None: not there), read in one ``git cat-file``."""
    query = "".join(f"{CONVERTED_FROM}:{p}\n" for p in paths).encode()
    out = subprocess.run(
        ["git", "cat-file", "--batch"], input=query, capture_output=True, cwd=ROOT, check=True
    ).stdout
    files: list[bytes | None] = []
    at = 0
    for _ in paths:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        if header[-1] == b"missing":
            files.append(None)
            at = end + 1
            continue
        size = int(header[2])
        files.append(out[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
    return files


def test_every_converted_run_equals_its_original_result_json():
    try:
        subprocess.run(["git", "cat-file", "-e", f"{CONVERTED_FROM}^{{commit}}"], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history is not here (a shallow or exported copy)")
    for folder, count in CONVERTED.items():
        records = RunStore(STUDY / folder / "runs.jsonl").records()
        prefix = (STUDY / folder).relative_to(ROOT).as_posix()
        paths = [f"{prefix}/runs/{key}/result.json" for key, _ in records]
        originals = _git_files(paths)
        found = [(k, r, o) for (k, r), o in zip(records, originals, strict=True) if o]
        tracked = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", CONVERTED_FROM, f"{prefix}/runs/"],
            capture_output=True, cwd=ROOT, check=True, text=True,
        ).stdout.split()  # fmt: skip
        tracked = [p for p in tracked if p.endswith("/result.json")]
        assert len(found) == len(tracked) == count, folder  # every original has its line
        for key, result, original in found:
            assert result == json.loads(original), key


def test_the_best_baseline_is_the_lowest_mean_of_the_three_and_ratios_divide_by_it(report):
    def cells(mean: float | None, sd: float | None = None, n: int = 1) -> dict:
        return {"1000": {"mean": mean, "sd": sd, "n": n}}

    per_model = {
        "pre-LN (GPT-2)": cells(1.5, 0.01, 3),
        "pre-LN depth-muP": cells(1.4),
        "SAS-P": cells(None),  # every lr diverged
        "no-norm gpt2": cells(1.2),  # lower, but not a baseline
        "shaped advise": cells(1.54),
    }
    best = report.best_baselines(per_model, [1000, 2000])
    assert best == {"1000": {"model": "pre-LN depth-muP", "mean": 1.4, "sd": None, "n": 1}}
    ratios = report.ratios_to_best(per_model, best)
    assert ratios["shaped advise"] == {"1000": pytest.approx(1.1)}
    assert ratios["SAS-P"] == {} and ratios["pre-LN depth-muP"] == {"1000": 1.0}
    per_model["SAS-P"] = cells(1.3, 0.02, 3)
    assert report.best_baselines(per_model, [1000])["1000"]["model"] == "SAS-P"
