"""Training studies: one run store per study and one runner that plans, resumes and stores.

A study keeps its finished runs in one file, ``runs.jsonl`` in its folder (:class:`RunStore`):
one line per run, ``{"key": ..., "result": ...}``, the result being what
:func:`simulations.training_runs.run_training` wrote to the run's ``result.json`` (its
labels, configuration, curves and metrics). The per-run folders under ``runs/`` (logs,
checkpoints, the ``result.json``) are scratch: a run's key is its folder relative to
``runs/``, so a finished run found there is taken into the store (:meth:`RunStore.ingest`)
and the store alone answers which runs are finished.

:func:`run_study` runs a :class:`Study` on the project's Dask machinery
(:func:`simulations.training_runs.run_planned`): the plan is asked again whenever a worker is
free, with the stored runs, interrupted runs go first, and each finished run is appended to
the store as it ends. :func:`study_parser` and :func:`study_main` are the command line the
study scripts share.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shapedtx._validation import ParameterError
from shapedtx.files import atomic_path

from .sweep.tasks import TaskSummary
from .training_runs import RESULT, TrainingRun, check_run_options, run_planned

STORE = "runs.jsonl"
RUNS = "runs"


def import_beside(folder: Path, name: str) -> Any:
    """The study script ``folder/name.py`` (e.g. a study's ``report.py``), imported with the
    scripts of ``folder`` first on the path. Study scripts share file names (``study.py``,
    ``report.py``) and import each other by them, so in a process that ran another study (a
    test session) those names may hold another folder's scripts: they are dropped first."""
    import importlib

    for stale in ("study", "report", name):
        module = sys.modules.get(stale)
        if module is not None and Path(getattr(module, "__file__", None) or "").parent != folder:
            del sys.modules[stale]
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def report_setup(out: Path, committed: dict[Path, Any], setup: Any) -> Any:
    """The setup whose report a study writes in ``out``: in one of its ``committed`` folders
    (folder -> the whole study's setup) the whole study's, whatever part of it a run was
    restricted to (``--depths``, ``--models``, ...: the committed report describes every
    stored run); elsewhere ``setup``, the part that ran."""
    whole = {Path(folder).resolve(): full for folder, full in committed.items()}
    return whole.get(Path(out).resolve(), setup)


def lr_tag(lr: float) -> str:
    """The one learning-rate encoding of run keys: ``lr`` with 3 significant digits
    (``lr_tag(1 / 300) == "lr0.00333"``, ``lr_tag(2**-8) == "lr0.00391"``)."""
    return f"lr{lr:.3g}"


def _sort_key(key: str) -> tuple[str, ...]:
    return tuple(key.split("/"))


class RunStore:
    """The finished runs of one study, one JSON line each in ``path`` (``runs.jsonl``).

    Every write replaces the file atomically (a temporary file, then ``os.replace``) under an
    exclusive lock on ``path + ".lock"``, so a reader never sees half a line and two writers
    do not lose each other's runs. Lines are kept in key order (the file does not depend on
    the order in which runs ended). A key appears at most once: the first result stored for
    it is kept.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def runs_folder(self) -> Path:
        """The scratch folder of the per-run folders, ``runs/`` beside the store."""
        return self.path.parent / RUNS

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        """Every stored ``(key, result)``, in key order."""
        if not self.path.exists():
            return []
        out = []
        for n, line in enumerate(self.path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                    out.append((str(record["key"]), record["result"]))
                except (ValueError, KeyError, TypeError) as err:
                    raise ValueError(f"{self.path}:{n}: not a stored run ({err})") from err
        return out

    def results(self) -> list[dict[str, Any]]:
        """Every stored result, in key order."""
        return [result for _, result in self.records()]

    def keys(self) -> set[str]:
        """The keys of the stored runs."""
        return {key for key, _ in self.records()}

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __len__(self) -> int:
        return len(self.records())

    def key_of(self, folder: str | os.PathLike[str]) -> str:
        """The key of the run whose folder is ``folder``: its path relative to
        :attr:`runs_folder`, with ``/`` separators. A ValueError if it is not inside it."""
        path = Path(os.path.abspath(folder))
        try:
            rel = path.relative_to(os.path.abspath(self.runs_folder))
        except ValueError:
            raise ValueError(f"run folder {folder} is not inside {self.runs_folder}") from None
        if not rel.parts:
            raise ValueError(f"run folder {folder} is the runs folder itself")
        return rel.as_posix()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def add(self, runs: dict[str, dict[str, Any]]) -> list[str]:
        """Store the ``{key: result}`` not stored yet, in one atomic write; return their keys
        (sorted)."""
        if not runs:
            return []
        with self._locked():
            records = dict(self.records())
            new = sorted((k for k in runs if k not in records), key=_sort_key)
            if new:
                records.update({k: runs[k] for k in new})
                with atomic_path(self.path) as tmp, open(tmp, "w") as f:
                    for key in sorted(records, key=_sort_key):
                        record = {"key": key, "result": records[key]}
                        f.write(json.dumps(record, separators=(",", ":"), allow_nan=False))
                        f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
        return new

    def append(self, key: str, result: dict[str, Any]) -> bool:
        """Store one finished run; False if ``key`` is stored already (nothing written)."""
        return bool(self.add({key: result}))

    def ingest(self, folder: str | os.PathLike[str] | None = None) -> list[str]:
        """Store every ``result.json`` under ``folder`` (default :attr:`runs_folder`) whose
        key (its folder relative to ``folder``) is not stored yet; return the new keys. The
        files are left where they are."""
        root = Path(folder) if folder is not None else self.runs_folder
        found = {}
        stored = self.keys()
        for path in sorted(root.glob(f"**/{RESULT}")):
            key = path.parent.relative_to(root).as_posix()
            if key not in stored:
                found[key] = json.loads(path.read_text())
        return self.add(found)

    def finished(self) -> list[dict[str, Any]]:
        """The stored results after :meth:`ingest` (what a study plans and reports from)."""
        self.ingest()
        return self.results()


@dataclass(frozen=True)
class Study:
    """What a study gives the shared runner.

    Attributes:
        folder: the study's folder (the store ``runs.jsonl`` and scratch ``runs/`` in it).
        plan: ``plan(results) -> runs`` still needed in priority order, from the finished
            results; each run's folder lies under ``folder/runs``.
        report: ``report(results)`` writes the study's report files from the results.
        describe: a one-line label of a finished run's result (progress output).
    """

    folder: Path
    plan: Callable[[list[dict[str, Any]]], Sequence[TrainingRun]]
    report: Callable[[list[dict[str, Any]]], Any]
    describe: Callable[[str, dict[str, Any]], str] | None = None

    @property
    def store(self) -> RunStore:
        return RunStore(Path(self.folder) / STORE)

    def pending(self) -> list[TrainingRun]:
        """The planned runs not stored, interrupted ones (with a checkpoint) first, then in
        plan order."""
        store = self.store
        results = store.finished()
        done = store.keys()
        runs = [r for r in self.plan(results) if store.key_of(r.folder) not in done]
        return sorted(runs, key=lambda r: not any(Path(r.folder).glob("h*/checkpoint.pt")))


def run_study(
    study: Study,
    *,
    workers: int | None = 1,
    scheduler: str | None = None,
    max_runs: int | None = None,
    progress: bool | None = None,
) -> TaskSummary[dict[str, Any]]:
    """Run ``study`` until its plan gives nothing new (or ``max_runs`` new runs): the plan is
    asked again each time a run ends (:func:`simulations.training_runs.run_planned`, on an
    embedded cluster of ``workers`` or the scheduler at ``scheduler``), and every finished run
    is stored as it ends, so an interrupted study keeps it. Failures are printed to stderr and
    returned with the new results."""
    store = study.store
    summary = run_planned(
        study.pending,
        client=scheduler,
        workers=workers,
        max_runs=max_runs,
        progress=progress,
        describe=study.describe,
    )
    store.add({store.key_of(key): result for key, result in summary.results.items()})
    store.ingest()
    for key, error in summary.failed.items():
        print(f"run {key} failed: {error}", file=sys.stderr)
    return summary


def study_parser(description: str, *, out_help: str = "study folder") -> argparse.ArgumentParser:
    """The options every study script takes: ``--out --device --compile --workers
    --scheduler --max-runs --plan --report --data``; a study adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=None, help=out_help)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help="train through torch.compile")
    p.add_argument("--workers", type=int, default=1, help="embedded Dask workers (1 thread)")
    p.add_argument("--scheduler", default=None, help="address of a running Dask scheduler")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    p.add_argument("--plan", action="store_true", help="print the planned runs and exit")
    p.add_argument("--report", action="store_true", help="only rebuild the report")
    p.add_argument(
        "--data", default=None, metavar="PATH",
        help="corpus file or folder (default: this Python's standard library; on a machine "
        "with another Python use the folder shapedtx.training.export_corpus wrote here)",
    )  # fmt: skip
    return p


def parse_study_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` and check ``--device`` and ``--data`` (a usage error naming the one
    that is not available) before any cluster starts."""
    args = p.parse_args(argv)
    try:
        check_run_options(args.device, args.data)
    except ParameterError as err:
        p.error(f"--{err.parameter}: {err}")
    return args


def study_main(study: Study, args: argparse.Namespace, *, name: str = "study.py") -> int:
    """A study script's main: ``--plan`` prints the keys of the runs still needed; else run
    the study (unless ``--report``) and write its report from the stored runs. Returns the
    exit status (130 when interrupted: the finished runs are kept)."""
    if args.plan:
        store, runs = study.store, study.pending()
        for run in runs:
            print(store.key_of(run.folder))
        print(f"{len(runs)} runs planned now (more may follow from the runs' results)")
        return 0
    try:
        if not args.report:
            run_study(study, workers=args.workers, scheduler=args.scheduler, max_runs=args.max_runs)
        study.report(study.store.finished())
    except KeyboardInterrupt:
        sys.stderr.write(f"{name}: interrupted; finished runs are kept, run again to resume\n")
        return 130
    return 0


__all__ = [
    "STORE",
    "RunStore",
    "Study",
    "lr_tag",
    "parse_study_args",
    "report_setup",
    "run_study",
    "study_main",
    "study_parser",
]
