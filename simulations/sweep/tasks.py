"""Independent resumable jobs as Dask tasks: the engine of the training studies.

:func:`run_tasks` submits ``fn(item)`` for every item to a Dask cluster (the embedded
``LocalCluster`` of :func:`simulations.sweep.sweep` by default, or any ``distributed.Client``
or scheduler address) and collects the results as they finish. The contract on ``fn``: it is
a module-level function (workers import it), it writes its own result atomically, and it
returns that result at once when the result already exists. Then an interrupted study loses
no finished job and a second call skips them; a worker killed in the middle of a job has the
job run again by the scheduler on another (or the restarted) worker, which resumes from
whatever the job saved (a training run from its last checkpoint). :func:`run_replanned` runs
a study whose next jobs depend on the finished ones, asking its plan again whenever a worker
thread is free.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shapedtx._validation import ParameterError, check_int, check_positive, check_progress

from .run import _check_workers, _connect, _disable, _print_dashboard

T = TypeVar("T")


@dataclass
class TaskSummary(Generic[T]):
    """What a :func:`run_tasks` or :func:`run_replanned` call did: ``results[key]`` for
    every job that returned, ``failed[key]`` (the error, as text) for every job that raised."""

    results: dict[str, T] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether no job failed."""
        return not self.failed


def _call(fn: Callable[[Any], T], item: Any, threads: int | None) -> T:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return fn(item)


def run_tasks(
    fn: Callable[[Any], T],
    items: Sequence[Any],
    keys: Sequence[str],
    *,
    client: Any = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    threads: int | None = None,
    progress: bool | None = None,
    desc: str = "tasks",
    describe: Callable[[str, T], str] | None = None,
) -> TaskSummary[T]:
    """Run ``fn(item)`` for every item as a Dask task (see module doc); never raises for a
    failing job (it is in ``failed``).

    Args:
        fn: a module-level function (see module doc).
        items: the jobs' arguments (picklable); submitted in this order, which is also their
            priority (the first item first).
        keys: a unique name per item (the summary's key).
        client: a ``distributed.Client`` or a scheduler address; default: an embedded
            ``LocalCluster`` of ``workers`` processes (default ``min(2, cores, jobs)``).
        workers: the embedded cluster's worker processes (not with ``client``).
        threads_per_worker: threads per embedded worker; torch uses as many per job.
        threads: torch threads per job on a given ``client`` (default: the worker's own
            setting; Dask's nannies start workers with ``OMP_NUM_THREADS=1``).
        progress: tqdm bar over jobs (None: when interactive).
        desc: the bar's label.
        describe: ``describe(key, result) -> str`` shown beside the bar as jobs end.
    """
    from distributed import as_completed
    from tqdm.auto import tqdm

    if len(items) != len(keys):
        raise ParameterError(
            "keys", f"keys must have one entry per item, got {len(keys)} for {len(items)}"
        )
    if len(set(keys)) != len(keys):
        raise ParameterError("keys", "keys must be unique")
    workers = _check_workers(client, workers, threads_per_worker)
    check_progress(progress)
    summary: TaskSummary[T] = TaskSummary()
    if not items:
        return summary
    run_id = uuid.uuid4().hex[:8]  # a given client may still hold keys of an earlier call
    with (
        _connect(client, min(workers, len(items)), threads_per_worker, True) as (dask, own),
        tqdm(total=len(items), desc=desc, unit="job", disable=_disable(progress)) as bar,
    ):
        if progress is not False:
            _print_dashboard(dask)
        futures = {
            dask.submit(
                _call,
                fn,
                item,
                own if client is None else threads,
                key=f"{desc}-{i}-{run_id}",
                pure=False,
                priority=len(items) - i,
            ): key
            for i, (item, key) in enumerate(zip(items, keys, strict=True))
        }
        with dask.as_current():
            for future in as_completed(futures):
                _collect(future, futures[future], summary, bar, describe)
    return summary


def _collect(
    future: Any,
    key: str,
    summary: TaskSummary[T],
    bar: Any,
    describe: Callable[[str, T], str] | None,
) -> str:
    """Put a finished future's result (or its error, as text) into ``summary``; return what
    the bar shows of it (its ``describe``, its error, or "")."""
    shown = ""
    try:
        result = future.result()
    except Exception as err:  # e.g. KilledWorker after repeated deaths
        summary.failed[key] = shown = f"{type(err).__name__}: {err}"
        bar.set_postfix(failed=len(summary.failed))
    else:
        summary.results[key] = result
        if describe is not None:
            shown = describe(key, result)
            bar.set_postfix_str(shown)
    future.release()
    bar.update()
    return shown


def run_replanned(
    fn: Callable[[Any], T],
    plan: Callable[[], Sequence[tuple[str, Any]]],
    *,
    client: Any = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    threads: int | None = None,
    max_jobs: int | None = None,
    progress: bool | None = None,
    desc: str = "tasks",
    describe: Callable[[str, T], str] | None = None,
    poll: float = 30.0,
) -> TaskSummary[T]:
    """Run the jobs ``plan()`` gives as Dask tasks, asking ``plan()`` again whenever a worker
    thread is free (each time a job ends, and every ``poll`` seconds while a thread is free:
    a restarted or added worker): the free threads take the first planned jobs not started by
    this call. So a study whose next jobs depend on finished ones (a grid extended while its
    best value is at an edge) does not leave a worker idle until every job planned with the
    running ones has ended. Never raises for a failing job (it is in ``failed``).

    Args:
        fn: a module-level function (see module doc).
        plan: ``plan() -> [(key, item), ...]``, the jobs still needed in priority order. It
            is called while jobs run and must read the finished ones from wherever ``fn``
            writes them; a running job it lists again is not started twice.
        client, workers, threads_per_worker, threads, progress, desc, describe: as for
            :func:`run_tasks`; unless ``progress`` is False, a line on stderr as each job
            starts and ends (its wall time, its ``describe`` or error), also where the bar is
            off (a study's log: a slow job is told from a stuck one by its start time).
        max_jobs: start at most this many jobs (None: no limit).
        poll: seconds between looks for free threads while jobs run.

    Ends when ``plan()`` gives no job that was not started and none is running, after
    ``max_jobs`` jobs, or once a job has failed: the running jobs finish and nothing new starts
    (a failed job would only be planned again). If the caller is interrupted, the jobs not yet
    running are cancelled; one already running on a cluster the call did not start runs on
    (Dask cannot stop a running task), so wait for it before running the study again.
    """
    from distributed import wait
    from tqdm.auto import tqdm

    workers = _check_workers(client, workers, threads_per_worker)
    if max_jobs is not None:
        check_int("max_jobs", max_jobs, minimum=0)
    check_positive("poll", poll)
    check_progress(progress)
    summary: TaskSummary[T] = TaskSummary()
    running: dict[Any, str] = {}
    started: set[str] = set()
    run_id = uuid.uuid4().hex[:8]  # a given client may still hold keys of an earlier call
    with (
        _connect(client, workers, threads_per_worker, True) as (dask, own),
        tqdm(total=0, desc=desc, unit="job", disable=_disable(progress)) as bar,
    ):
        per_job = own if client is None else threads
        began: dict[str, float] = {}

        def note(text: str) -> None:
            if progress is not False:
                bar.write(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr)

        def start() -> None:
            # with no worker yet (or one restarting), one job waits in the scheduler's queue
            free = max(1, sum(dask.nthreads().values())) - len(running)
            if max_jobs is not None:
                free = min(free, max_jobs - len(started))
            if free <= 0 or summary.failed:
                return
            jobs = list(plan())
            keys = [key for key, _ in jobs]
            if len(set(keys)) != len(keys):
                raise ParameterError("plan", "plan() must give unique keys")
            new = [(key, item) for key, item in jobs if key not in started]
            take = new[:free]
            for key, item in take:
                future = dask.submit(
                    _call, fn, item, per_job, key=f"{desc}-{len(started)}-{run_id}", pure=False
                )
                running[future] = key
                started.add(key)
                began[key] = time.monotonic()
                note(f"start {key}")
            bar.total = len(started) + len(new) - len(take)
            bar.refresh()

        if progress is not False:
            _print_dashboard(dask)
        try:
            with dask.as_current():
                start()
                while running:
                    with contextlib.suppress(TimeoutError):  # no job ended: look for threads
                        wait(list(running), timeout=poll, return_when="FIRST_COMPLETED")
                    for future in [f for f in running if f.done()]:
                        key = running.pop(future)
                        shown = _collect(future, key, summary, bar, describe)
                        minutes = (time.monotonic() - began[key]) / 60
                        ended = "failed" if key in summary.failed else "end"
                        note(f"{ended} {key} after {minutes:.1f} min{': ' * bool(shown)}{shown}")
                    start()
        finally:
            if running:  # interrupted: release what has not started
                dask.cancel(list(running))
            bar.total = bar.n
            bar.refresh()
    return summary


__all__ = ["TaskSummary", "run_replanned", "run_tasks"]
