"""A run of part of a study (``--depths``, ``--models``, ``--parametrisations`` ...) in the
study's committed folder rewrites that folder's report for the whole study (the report
describes every stored run), and elsewhere the report of the part that ran."""

from __future__ import annotations

import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from run_history import load_script

EXAMPLES = Path(__file__).parents[1] / "examples"


def _study(folder: str, monkeypatch: pytest.MonkeyPatch, home: Path) -> tuple[Any, list]:
    """The study script of ``examples/folder`` with its committed folder moved to ``home`` and
    its report replaced by one that records the setup and drifts path it was given."""
    monkeypatch.syspath_prepend(str(EXAMPLES / folder))
    module = load_script(EXAMPLES / folder / "study.py", "study", monkeypatch)
    written: list = []
    real = load_script(EXAMPLES / folder / "report.py", "report", monkeypatch)
    fake = types.SimpleNamespace(
        report=lambda setup, out, results, *drifts: written.append((setup, out, *drifts)),
        DRIFTS=home / "drifts.json",
        REPORTS=getattr(real, "REPORTS", {}),
    )
    monkeypatch.setattr(module, "HERE", home)
    monkeypatch.setattr(module, "import_beside", lambda folder, name: fake)
    if hasattr(module, "rebuild_quoting_reports"):  # the reports quoting the committed store
        monkeypatch.setattr(module, "rebuild_quoting_reports", lambda: written.append("quoting"))
    return module, written


@pytest.mark.parametrize(
    ("folder", "restrict"),
    [
        ("transfer", {"depths": (4, 8), "parametrisations": ("completep_init",)}),
        ("long_horizon", {"depths": (16,), "models": ("pre-LN (GPT-2)",)}),
        ("shaped_vs_vanilla", {"depths": (4,), "models": ("shaped",)}),
    ],
)
def test_a_restricted_run_rewrites_the_committed_report_for_the_whole_study(
    folder, restrict, monkeypatch, tmp_path
):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    module, written = _study(folder, monkeypatch, home)
    part = replace(module.DEFAULT, **restrict)
    assert part != module.DEFAULT
    module.study(part, home, device="cpu").report([])
    module.study(part, elsewhere, device="cpu").report([])
    if folder == "long_horizon":  # rebuilt after the committed report only
        assert written.pop(1) == "quoting" and "quoting" not in written
    (full, out_home, *drifts_home), (setup, out_else, *drifts_else) = written
    assert full == module.DEFAULT and out_home == home
    assert setup == part and out_else == elsewhere
    if folder == "transfer":  # the package data: from the committed study only
        assert drifts_home == [home / "drifts.json"] and drifts_else == [None]


def test_a_long_horizon_report_rebuilds_the_committed_reports_quoting_its_store(
    monkeypatch, tmp_path
):
    """The ablation's and the transfer study's reports quote the long-horizon store: the
    long-horizon study rebuilds both (the transfer study's for its whole committed setup, from
    its committed store) whenever it writes its committed report."""
    module = load_script(EXAMPLES / "long_horizon" / "study.py", "study", monkeypatch)
    calls: list = []
    transfer_home = tmp_path / "transfer"
    ablation = types.SimpleNamespace(report=lambda: calls.append("ablation"))

    def transfer_study(setup, out):
        calls.append(("transfer", setup, out))
        return types.SimpleNamespace(report=lambda results: calls.append(("results", results)))

    transfer = types.SimpleNamespace(HERE=transfer_home, DEFAULT="whole", study=transfer_study)
    scripts = {("ablation", "report"): ablation, ("transfer", "study"): transfer}
    monkeypatch.setattr(module, "import_beside", lambda folder, name: scripts[folder.name, name])
    module.rebuild_quoting_reports()
    assert calls == ["ablation", ("transfer", "whole", transfer_home), ("results", [])]
