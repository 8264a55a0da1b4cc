"""``simulations.studies`` without training: run keys, the store's reading, a study's pending
runs and their order, what ``run_study`` stores and prints, the study scripts' command line
(``run_planned`` and ``run_study`` replaced by recorders)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import simulations.studies as studies
from simulations.studies import (
    STORE,
    RunStore,
    Study,
    parse_study_args,
    run_study,
    study_main,
    study_parser,
)
from simulations.sweep.tasks import TaskSummary


def _result(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "result.json").write_text(json.dumps(result))


def test_keys_are_folders_under_runs_beside_the_store(tmp_path, monkeypatch):
    store = RunStore(tmp_path / "s" / STORE)
    assert STORE == "runs.jsonl" and store.runs_folder == tmp_path / "s" / "runs"
    assert store.key_of(tmp_path / "s" / "runs" / "a" / "b") == "a/b"
    monkeypatch.chdir(tmp_path / "..")
    relative = Path(tmp_path.name) / "s" / "runs" / "c"
    assert store.key_of(relative) == "c"  # a relative folder is taken from the cwd
    with pytest.raises(ValueError, match="is not inside"):
        store.key_of(tmp_path / "s")
    with pytest.raises(ValueError, match="the runs folder itself"):
        store.key_of(tmp_path / "s" / "runs")


def test_records_skip_blank_lines_and_count_runs(tmp_path):
    path = tmp_path / STORE
    path.write_text('{"key": "b", "result": {"x": 2}}\n\n  \n{"key": "a", "result": {"x": 1}}\n')
    store = RunStore(path)
    assert store.records() == [("b", {"x": 2}), ("a", {"x": 1})]  # as stored
    assert len(store) == 2 and "a" in store and "c" not in store
    assert store.keys() == {"a", "b"} and store.results() == [{"x": 2}, {"x": 1}]
    assert store.add({}) == [] and store.add({"a": {"x": 9}}) == []
    assert path.read_text().count("\n") == 4  # nothing new: not rewritten
    assert store.add({"c/2": {}, "c/10": {}, "a": {}}) == ["c/10", "c/2"]
    path.write_text('{"key": "a", "result": {}}\n["key", "result"]\n')
    with pytest.raises(ValueError, match=r":2: not a stored run"):
        store.records()


def _study(tmp_path: Path, names: list[str], seen: list) -> Study:
    def plan(results):
        seen.append(results)
        return [SimpleNamespace(folder=str(tmp_path / "runs" / n)) for n in names]

    return Study(tmp_path, plan, lambda results: None)


def test_pending_are_the_unstored_runs_interrupted_first_then_in_plan_order(tmp_path):
    """Stored (or finished with a result.json under runs/) runs are not pending; a run with a
    checkpoint under h<H>/ goes first; otherwise plan order; plan sees the stored results."""
    runs = tmp_path / "runs"
    _result(runs / "done", {"lr": 1})
    RunStore(tmp_path / STORE).append("stored", {"lr": 2})
    for name in ("late", "later"):
        (runs / name / "h100").mkdir(parents=True)
        (runs / name / "h100" / "checkpoint.pt").write_bytes(b"")
    (runs / "not_h" / "x").mkdir(parents=True)
    (runs / "not_h" / "x" / "checkpoint.pt").write_bytes(b"")
    (runs / "log_only" / "h100").mkdir(parents=True)
    (runs / "log_only" / "h100" / "log.nc").write_bytes(b"")
    seen: list = []
    names = ["a", "done", "not_h", "late", "stored", "log_only", "later", "b"]
    study = _study(tmp_path, names, seen)
    assert study.store.path == tmp_path / STORE
    pending = [Path(r.folder).name for r in study.pending()]
    assert pending == ["late", "later", "a", "not_h", "log_only", "b"]
    assert seen == [[{"lr": 1}, {"lr": 2}]]  # ingested, in key order ("done" < "stored")


def test_run_study_stores_each_result_and_prints_failures(tmp_path, monkeypatch, capsys):
    calls = []
    folder = tmp_path / "runs" / "m" / "x"

    def run_planned(plan, **kwargs):
        calls.append((plan, kwargs))
        _result(tmp_path / "runs" / "late", {"late": True})  # written beside, ingested
        return TaskSummary(results={str(folder): {"loss": 1.0}}, failed={"m/y": "boom"})

    monkeypatch.setattr(studies, "run_planned", run_planned)
    describe = lambda key, result: key  # noqa: E731
    study = Study(tmp_path, lambda results: [], lambda results: None, describe=describe)
    summary = run_study(study, workers=3, scheduler="tcp://x:1", max_runs=2, progress=True)
    assert summary.failed == {"m/y": "boom"}
    (plan, kwargs), = calls  # fmt: skip
    assert plan == study.pending
    assert kwargs == {"client": "tcp://x:1", "workers": 3, "max_runs": 2, "progress": True,
                      "describe": describe}  # fmt: skip
    assert study.store.records() == [("late", {"late": True}), ("m/x", {"loss": 1.0})]
    assert capsys.readouterr().err == "run m/y failed: boom\n"
    run_study(study)
    assert calls[1][1] == {"client": None, "workers": 1, "max_runs": None, "progress": None,
                           "describe": describe}  # fmt: skip


def test_study_parser_defaults_and_options(tmp_path):
    p = study_parser("d", out_help="where")
    args = p.parse_args([])
    assert vars(args) == {"out": None, "device": "cpu", "compile": False, "workers": 1,
                          "scheduler": None, "max_runs": None, "plan": False, "report": False,
                          "data": None}  # fmt: skip
    args = p.parse_args(["--out", "o", "--workers", "2", "--max-runs", "3", "--compile",
                         "--plan", "--report", "--data", "c", "--scheduler", "s"])  # fmt: skip
    assert (args.out, args.workers, args.max_runs, args.compile) == (Path("o"), 2, 3, True)
    assert (args.plan, args.report, args.data, args.scheduler) == (True, True, "c", "s")
    assert parse_study_args(p, ["--device", "cpu"]).device == "cpu"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["--device", "nonsense"], "--device: "), (["--data", "/nonexistent/c"], "--data: ")],
)
def test_parse_study_args_names_the_option_that_is_not_available(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_study_args(study_parser("d"), argv)
    assert exit_.value.code == 2 and needle in capsys.readouterr().err


def _args(**kw) -> argparse.Namespace:
    base = {"plan": False, "report": False, "workers": 2, "scheduler": None, "max_runs": 5}
    return argparse.Namespace(**{**base, **kw})


def test_study_main_plans_runs_reports_and_keeps_runs_on_interrupt(tmp_path, monkeypatch, capsys):
    ran, reported = [], []
    monkeypatch.setattr(studies, "run_study", lambda study, **kw: ran.append(kw))
    study = Study(
        tmp_path,
        lambda results: [SimpleNamespace(folder=str(tmp_path / "runs" / n)) for n in "ab"],
        reported.append,
    )
    _result(tmp_path / "runs" / "b", {"r": 1})
    assert study_main(study, _args(plan=True)) == 0
    assert (
        capsys.readouterr().out
        == "a\n1 runs planned now (more may follow from the runs' results)\n"
    )
    assert ran == [] and reported == []
    assert study_main(study, _args(report=True)) == 0
    assert ran == [] and reported == [[{"r": 1}]]
    assert study_main(study, _args()) == 0
    assert ran == [{"workers": 2, "scheduler": None, "max_runs": 5}] and len(reported) == 2

    def interrupted(study, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(studies, "run_study", interrupted)
    assert study_main(study, _args(), name="x.py") == 130
    assert capsys.readouterr().err == (
        "x.py: interrupted; finished runs are kept, run again to resume\n"
    )
    assert len(reported) == 2
