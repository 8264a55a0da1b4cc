"""Parameter sweeps on Dask: one task per grid point, one resumable zarr store.

Every (grid point, source) runs :func:`simulations.simulate` (``source="network"``) or
:func:`sde.solve` (``source="sde"``) as a ``dask.distributed`` task; the worker writes its
result straight into the store, so only small records travel back to the client.

Where it runs: by default an embedded ``LocalCluster`` (``workers`` processes of
``threads_per_worker`` threads, torch limited to as many threads). Pass ``client=`` (a
``distributed.Client``) or a scheduler address to run the same sweep on any Dask cluster, e.g.
``dask_jobqueue.SLURMCluster`` / ``PBSCluster`` (``cluster.scale(jobs=10)``,
``Client(cluster)``) or ``dask_kubernetes.operator.KubeCluster``; those packages are not
dependencies of shapedtx. Workers must see the store path (a shared file system) and have
shapedtx installed.

Store layout (a zarr v2 directory store that ``xr.open_zarr(store)`` reads as one Dataset):

* dimensions: the grid dimensions in grid order (coordinates = their values), ``source``
  (``network`` / ``sde``), then ``sample``, ``step``, ``token_a``, ``token_b``. Points differ
  in samples, saved times and tokens, so these are padded to the largest point with NaN;
* ``V (*grid, source, sample, step, token_a, token_b)``; coordinate ``t (*grid, source,
  step)``, the point's depth times (NaN padding); ``exploded`` / ``t_explode (*grid, source,
  sample)`` from the SDE (False / NaN for networks); ``seed (*grid, source)``, the derived
  per-point seed; ``status (*grid, source)``: 0 pending, 1 done, 2 failed;
* ``_sweep/<point>.json``: the point's record: status, error and traceback, parameters,
  timings, the id of the run that computed it, and the full attrs of its Dataset (config,
  method, seed, dtype, ...). Root attrs ``sweep.*`` identify the grid, kind and dtype.

Training studies use the same engine through :func:`run_tasks` (one task per independent,
resumable job; see :mod:`simulations.training_runs`) and :func:`run_replanned` (a study
whose next jobs depend on finished ones).

Data count only where ``status == 1``: :func:`open_sweep` masks the rest and
:func:`open_point` returns one point as the usual covariance Dataset (``shapedtx.results``).

Safety: each array is chunked one point per chunk along the grid and source dimensions, so
workers never share a chunk, and zarr writes every chunk file atomically (temporary file,
then rename). A task first sets its status to pending, overwrites its whole padded region,
writes its record (temporary file, then rename) and sets ``status = 1`` last: a worker killed
at any moment leaves a point that reads as pending and is recomputed on restart, and a
finished point is never recomputed. A point that raises is recorded as failed (status 2, the
error in its record) and the other points go on; failed points are retried by the next run.
The store itself is created in a temporary directory and renamed into place. Run one sweep
process per store at a time.

Seeds: the point's seed is :func:`simulations.grid.point_seed` of its parameters (SHA-256 of
the base ``seed`` and the other parameters except ``samples``), stored in ``seed``. A direct
call ``simulate(config, equicorrelated(tokens, rho0, scale), samples, method=method,
seed=seed)`` (or ``sde.solve(..., T=T, dt=dt, method=sde_method, save_every=save_every,
seed=seed)``) on the same device reproduces the point's numbers exactly.
"""

from .point import run_point
from .read import open_point, open_sweep
from .run import SweepSummary, sweep
from .store import STATUS, read_records
from .tasks import TaskSummary, run_replanned, run_tasks

__all__ = [
    "STATUS",
    "SweepSummary",
    "TaskSummary",
    "open_point",
    "open_sweep",
    "read_records",
    "run_point",
    "run_replanned",
    "run_tasks",
    "sweep",
]
