"""Running a sweep on Dask (client side): plan, submit, collect, resume."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from shapedtx._validation import ParameterError, check_device, check_int, check_progress
from shapedtx.options import DTYPES

from ..grid import make_grid
from .point import _task
from .store import (
    DONE,
    FAILED,
    _finish,
    _open_store,
    _record,
    _remove_store,
    read_records,
)


@dataclass
class SweepSummary:
    """What a :func:`sweep` call did.

    ``total`` points (grid points x sources), ``computed`` finished in this call,
    ``skipped`` already finished before it, ``failed`` (label -> error) failed after it.
    """

    store: Path
    total: int
    computed: int = 0
    skipped: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every point is done."""
        return not self.failed and self.computed + self.skipped == self.total


def _check_workers(client: Any, workers: int | None, threads_per_worker: int) -> int:
    """The embedded cluster's worker count (default ``min(2, cores)``), validated: at most the
    core count (more CPU-bound workers than cores only cost memory, a process each), and not
    given together with a ``client``."""
    if client is not None and workers is not None:
        raise ParameterError(
            "workers", "workers sets the embedded cluster; do not pass it with client"
        )
    cores = os.cpu_count() or 1
    workers = min(2, cores) if workers is None else workers
    check_int("workers", workers, 1, cores)
    check_int("threads_per_worker", threads_per_worker, 1, cores)
    return workers


def _malloc_trim_threshold() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def _warn_malloc_trim(client: Any) -> None:
    """Warn if a user's cluster runs its workers with glibc's ``MALLOC_TRIM_THRESHOLD_`` set
    (Dask's default, 65536), which makes torch tasks 1.4-1.5x slower (see ``_connect``)."""
    found = {v for v in client.run(_malloc_trim_threshold).values() if v is not None}
    if found:
        warnings.warn(
            f"Dask workers run with MALLOC_TRIM_THRESHOLD_={', '.join(sorted(found))}, which "
            "pins glibc's mmap threshold and makes training steps 1.4-1.5x slower; start the "
            "cluster with dask.config.set({'distributed.nanny.pre-spawn-environ."
            "MALLOC_TRIM_THRESHOLD_': None}) (docs/guide/sweeps.md)",
            UserWarning,
            stacklevel=4,
        )


@contextlib.contextmanager
def _connect(client, workers, threads_per_worker, processes) -> Iterator[tuple[Any, int | None]]:
    """(client, torch threads per task) for a given client, an address or a LocalCluster."""
    import dask
    from distributed import Client, LocalCluster

    if client is not None:
        if isinstance(client, str):
            with Client(client, timeout="20s", set_as_default=False) as own:
                _warn_malloc_trim(own)
                yield own, None
        else:
            _warn_malloc_trim(client)
            yield client, None
        return
    # Set before the cluster starts (the nannies pass the config on):
    # - the workers' statistical profiler samples every thread's stack every 10 ms, taking the
    #   GIL from the task thread each time; these long numerical tasks need no profile;
    # - Dask's default MALLOC_TRIM_THRESHOLD_=65536 fixes glibc's mmap threshold at 128 KiB, so
    #   every activation tensor is a fresh mmap whose pages fault in at each use: a training
    #   step at width 64 took 1.4-1.5x as long, a third of it in the kernel (benchmarks/RESULTS.md).
    #   Unset, glibc's adaptive threshold reuses the memory.
    settings = {
        "distributed.worker.profile.enabled": False,
        "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    }
    with (
        dask.config.set(settings),
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=processes,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster, set_as_default=False) as own,
    ):
        yield own, threads_per_worker if processes else None


def sweep(
    grid: Mapping[str, Any],
    *,
    store: str | os.PathLike,
    kind: str = "network",
    client: Any = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    processes: bool = True,
    dtype: torch.dtype = torch.float64,
    device: str | None = None,
    retry_failed: bool = True,
    overwrite: bool = False,
    progress: bool | None = None,
) -> SweepSummary:
    """Run every point of ``grid`` as a Dask task into the zarr ``store`` (see module doc).

    Args:
        grid: parameter -> value or list of values (lists are grid dimensions, in order);
            ModelConfig fields and the run parameters of :mod:`simulations.grid` (``T``,
            ``tokens``, ``rho0``, ``scale``, ``samples``, ``seed``, ``method``,
            ``sde_method``, ``dt``, ``save_every``).
        store: directory of the zarr store; created if absent, resumed if it holds the same
            sweep (same grid, kind and dtype), ValueError otherwise (unless ``overwrite``).
        kind: ``"network"`` (simulate), ``"sde"`` (sde.solve) or ``"both"``.
        client: a ``distributed.Client`` or a scheduler address (``"tcp://host:8786"``) for
            any Dask cluster (SLURM/PBS via dask-jobqueue, Kubernetes via dask-kubernetes);
            default: an embedded LocalCluster (in scripts, call under
            ``if __name__ == "__main__":``, as worker processes re-import the main module).
        workers: worker processes of the embedded cluster, at most the machine's core count
            and never more than the points left to run (default ``min(2, cpu_count)``).
        threads_per_worker: threads per embedded worker (torch uses as many per task).
        processes: embedded workers as processes (default) or threads of this process.
        dtype, device: passed to every simulate / solve call (device as seen by workers).
        retry_failed: run points recorded as failed again (default True).
        overwrite: delete an existing sweep store at ``store`` first and start afresh (after
            the grid is validated; a directory that is not a sweep store is never deleted).
        progress: tqdm bar over points and the dashboard link (None: bar when interactive).

    Returns:
        A :class:`SweepSummary`. Failing points do not raise: they are in ``failed``.
    """
    from distributed import as_completed
    from tqdm.auto import tqdm

    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name not in DTYPES:
        raise ParameterError(
            "dtype", f"dtype must be torch.float64 or torch.float32, got {dtype!r}"
        )
    workers = _check_workers(client, workers, threads_per_worker)
    check_progress(progress)
    if device is not None and client is None:  # a given cluster's workers may differ
        check_device(device)
    g = make_grid(grid, kind)
    points = list(g.points())
    if all(p.error for p in points):
        raise ParameterError(
            "grid", f"every grid point is invalid, e.g. {points[0].label}: {points[0].error}"
        )
    # A value that is invalid at every point holding it is a typo in the grid, not a failing
    # combination: refuse it before any store exists (a corrected grid must not meet a stale
    # store). Invalid combinations (e.g. heads not dividing one width) are recorded as failed.
    for name, values in g.dims.items():
        for value in values:
            holding = [p for p in points if p.coords[name] == value]
            if all(p.error for p in holding):
                raise ParameterError(
                    "grid",
                    f"grid value {name} = {value!r} is invalid at every point: {holding[0].error}",
                )
    path = Path(store).absolute()
    if overwrite:
        _remove_store(path)
    group = _open_store(path, g, points, dtype)
    status = group["status"][...]
    run_id = uuid.uuid4().hex
    summary = SweepSummary(path, len(points))
    records = {} if retry_failed else read_records(path)
    todo = []
    for p in points:
        code = status[p.index]
        if code == DONE:
            summary.skipped += 1
        elif p.error is not None:
            _finish(path, group, p, _record(p, "failed", run_id, time.time(), error=p.error))
            summary.failed[p.label] = p.error
        elif code == FAILED and not retry_failed:
            summary.failed[p.label] = records.get(p.key, {}).get("error", "failed")
        else:
            todo.append(p)
    if not todo:
        return summary

    workers = min(workers, len(todo))
    with (
        _connect(client, workers, threads_per_worker, processes) as (dask_client, threads),
        tqdm(total=len(todo), desc="sweep", unit="point", disable=_disable(progress)) as bar,
    ):
        if progress is not False:
            _print_dashboard(dask_client)
        futures = {
            dask_client.submit(
                _task,
                p,
                str(path),
                dtype_name,
                device,
                threads,
                run_id,
                key=f"sweep-point-{p.key}-{run_id}",
                pure=False,
            ): p
            for p in todo
        }
        with dask_client.as_current():  # as_completed looks the client up; never global
            for future in as_completed(futures):
                p = futures[future]
                try:
                    record = future.result()
                except Exception as err:  # e.g. KilledWorker: record and go on
                    error = f"{type(err).__name__}: {err}"
                    record = _finish(
                        path, group, p, _record(p, "failed", run_id, time.time(), error=error)
                    )
                future.release()
                if record["status"] == "done":
                    summary.computed += 1
                else:
                    summary.failed[p.label] = record["error"]
                    bar.set_postfix(failed=len(summary.failed))
                bar.update()
    return summary


def _disable(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


def _print_dashboard(client) -> None:
    link = getattr(client, "dashboard_link", None)
    if not link:
        return
    note = "" if importlib.util.find_spec("bokeh") else " (install bokeh>=3.1 to serve it)"
    print(f"sweep: Dask dashboard at {link}{note}", file=sys.stderr)
