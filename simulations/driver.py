"""The simulation driver: one loop over blocks shared by every method (docs/theory.md#layers and
#samplers).

Samples are processed in chunks sized to a memory budget; each chunk is a whole number of
fixed-size groups with their own generators (:mod:`simulations.rng`), so results do not depend
on the chunking. Inside the block loop there is no host synchronisation on accelerators, except
the gram sampler's check for singular hidden Gram matrices (once per MLP block).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import warnings
from collections.abc import Iterator, Sequence

import torch
import xarray as xr
from torch import Tensor
from tqdm.auto import tqdm

from shapedtx import ModelConfig, check_covariance, covariance_dataset
from shapedtx._memory import empty
from shapedtx._validation import (
    ParameterError,
    check_device,
    check_dtype,
    check_int,
    check_progress,
    check_tokens,
)
from shapedtx.config import check_config

from .options import SamplerChoice, as_sampler
from .rng import GroupedNormal, run_parallel
from .samplers import Sampler, TokenSampler

DEFAULT_MEMORY_BUDGET = 2**30
"""Default working-memory budget of one chunk, in bytes (1 GiB)."""


def _check_arguments(config, samples, seed, dtype, chunk_size, memory_budget) -> None:
    check_config(config)
    check_int("samples", samples)
    check_int("seed", seed, 0)
    check_dtype(dtype)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size)
    if (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, (int, float))
        or not memory_budget > 0
    ):
        raise ParameterError(
            "memory_budget", f"memory_budget must be a number of bytes > 0, got {memory_budget!r}"
        )


def resolve_method(config: ModelConfig, method: str | SamplerChoice | None = None) -> str:
    """The sampler name for ``method`` (a name of :data:`simulations.SAMPLERS` or a choice
    object): itself, or for ``None``/``"auto"`` the fastest exact-in-law method whose sampler
    accepts ``config`` (:class:`simulations.Auto`: "gram" where it applies, else "exact",
    which simulates every configuration)."""
    return as_sampler(method).resolve(config).name


def _resolve(config: ModelConfig, method: str | SamplerChoice | None) -> SamplerChoice:
    """The choice that simulates ``config``: ``method``'s (:func:`resolve_method`), whose
    sampler accepts ``config`` (an explicit choice is checked here, :class:`Auto`'s pick by
    Auto); ParameterError (``method``) otherwise."""
    choice = as_sampler(method)
    sampler = choice.resolve(config)
    if sampler is choice:
        sampler.sampler_class.check(config)
    return sampler


def _chunk_groups(
    sampler, config: ModelConfig, m: int, dtype: torch.dtype, chunk_size, memory_budget
) -> int:
    """Number of groups per chunk: ``chunk_size`` rounded up to whole groups, or the budget."""
    G = sampler.group_size
    if chunk_size is not None:
        return math.ceil(chunk_size / G)
    per_sample, fixed = sampler.memory(config, m, dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_sample += (config.depth + 1) * m * m * itemsize  # the recorded covariances
    groups = int((memory_budget - fixed) // (G * per_sample))
    if sampler.chunk_bytes is not None and groups >= 1:
        tensor = m * TokenSampler._widest(config) * itemsize * G  # one (m, widest) tensor per group
        groups = min(groups, max(1, sampler.chunk_bytes // tensor))
    if groups < 1:
        warnings.warn(
            f"memory_budget={memory_budget:.3g} bytes is below one group of {G} samples "
            f"(about {fixed + G * per_sample:.3g} bytes); using one group per chunk",
            RuntimeWarning,
            stacklevel=4,  # the caller of simulate (via _simulate)
        )
    return max(groups, 1)


_THREADS_LOCK = threading.Lock()
_THREADS_SAVED = {"active": 0, "threads": 1}
"""simulate calls running on CPU and torch's thread count before the first of them."""


@contextlib.contextmanager
def _fill_threads(device: torch.device) -> Iterator[int]:
    """On CPU, the ``torch.get_num_threads()`` threads share the work of each block (the
    random numbers one generator group per thread, :class:`simulations.rng.GroupedNormal`, or
    one sampler per thread, ``Sampler.parallel_parts``), while torch's own operations run on
    one thread: the batched products are of small matrices that gain little from intra-op
    threads, whose spinning OpenMP workers would take the cores from the fill (measured in
    benchmarks/RESULTS.md). The thread count is restored when the last of
    the simulate calls running at once (e.g. in Dask threads) returns."""
    if device.type != "cpu":
        yield 1
        return
    with _THREADS_LOCK:
        if _THREADS_SAVED["active"] == 0:
            _THREADS_SAVED["threads"] = torch.get_num_threads()
        _THREADS_SAVED["active"] += 1
        threads = _THREADS_SAVED["threads"]
        torch.set_num_threads(1)
    try:
        yield threads
    finally:
        with _THREADS_LOCK:
            _THREADS_SAVED["active"] -= 1
            if _THREADS_SAVED["active"] == 0:
                torch.set_num_threads(_THREADS_SAVED["threads"])


def _nonfinite_samples(V: Tensor) -> int:
    """Number of samples of ``V: (samples, ...)`` with a non-finite entry (a sum per sample
    first: exact, and several times cheaper than testing every entry when all are finite)."""
    flat = V.flatten(1)
    suspect = ~torch.isfinite(flat.sum(dim=1))  # non-finite entries, or an overflowing sum
    if not bool(suspect.any()):
        return 0
    return int((~torch.isfinite(flat[suspect]).all(dim=1)).sum())


def _simulate_chunk(
    parts: Sequence[tuple[Sampler, slice]],
    V0: Tensor,
    out: Tensor,
    depth: int,
    threads: int,
    bar,
) -> None:
    """The shared block loop: fills ``out: (samples, depth + 1, m, m)``; each part is a sampler
    and its rows of ``out``. The parts run on up to ``threads`` threads (one task per part,
    every block of it; numpy and torch kernels release the GIL), not in lockstep: parts
    whose memory-bound phases do not coincide share the memory better (measured in
    benchmarks/RESULTS.md). An exception in one part (e.g. KeyboardInterrupt in the calling
    thread) stops the others before their next block."""
    stop = threading.Event()
    lock = threading.Lock()

    def run(i: int) -> None:
        sampler, rows = parts[i]
        try:
            state = sampler.init(V0, rows.stop - rows.start)
            out[rows, 0] = sampler.covariance(state)
            for layer in range(1, depth + 1):
                if stop.is_set():
                    return
                state = sampler.step(state)
                out[rows, layer] = sampler.covariance(state)
                with lock:
                    bar.update(rows.stop - rows.start)
        except BaseException:
            stop.set()
            raise

    run_parallel(run, len(parts), threads)


def _parts(
    sampler_cls: type[Sampler],
    config: ModelConfig,
    seed: int,
    groups: range,
    sizes: list[int],
    device: torch.device,
    threads: int,
) -> list[tuple[Sampler, slice]]:
    """The samplers of one chunk and their rows: one per thread for samplers whose groups run
    in parallel (``parallel_parts``, CPU), else one sampler whose random numbers use the
    threads (:class:`simulations.rng.GroupedNormal`)."""
    count = 1
    if sampler_cls.parallel_parts and device.type == "cpu":
        count = min(threads, len(groups))
    workers = threads if count == 1 else 1
    bounds = [round(i * len(groups) / count) for i in range(count + 1)]
    parts, row = [], 0
    for a, b in itertools.pairwise(bounds):
        rng = GroupedNormal(seed, groups[a:b], sizes[a:b], device, workers)
        sampler = sampler_cls(config, rng, huge_pages=threads == 1)
        parts.append((sampler, slice(row, row + rng.samples)))
        row += rng.samples
    return parts


def simulate(
    config: ModelConfig,
    V0: Tensor,
    samples: int,
    *,
    method: str | SamplerChoice | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    chunk_size: int | None = None,
    memory_budget: float = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
) -> xr.Dataset:
    """Token covariances ``V_l = X_l X_l^T / n`` of random networks at initialisation.

    On CPU, the ``torch.get_num_threads()`` threads share each block (the exact sampler:
    they fill the random numbers, one generator group each, and the next block's meanwhile;
    the gram sampler: one sampler per thread on its own groups) and torch's operations run
    on one thread until simulate returns; the numbers do not depend on the thread count.

    Args:
        config: the architecture (any combination ModelConfig allows).
        V0: (m, m) symmetric positive-definite input covariance, m >= 2; every sample starts
            from X_0 with ``X_0 X_0^T / n = V0`` exactly.
        samples: number of independent networks (weights and inputs drawn afresh).
        method: a sampler object (:class:`simulations.Auto`, ``Exact()``, ``Weights()``,
            ``Gram()``) or its name (:data:`simulations.SAMPLERS`). ``None`` or ``"auto"``
            (default): the fastest exact-in-law method for the config
            (:func:`resolve_method`: ``"gram"`` where it applies, else ``"exact"``);
            ``"exact"`` (docs/theory.md#samplers), ``"weights"`` (explicit matrices) or
            ``"gram"`` (width-independent chain on V, supported configs only).
        seed: integer >= 0; the same seed gives the same numbers on the same device.
        device: where to compute (default: V0's device).
        dtype: torch.float64 (default) or torch.float32.
        chunk_size: samples per chunk (rounded up to whole generator groups); default from
            ``memory_budget``. Does not change the results.
        memory_budget: approximate working memory of one chunk, in bytes.
        progress: tqdm progress bar; ``None`` shows it only when stderr is a terminal.

    Returns:
        The covariance Dataset (``shapedtx.results``): ``V(sample, t, token_a, token_b)``,
        ``t = layer / width`` for layers 0..depth, a ``layer`` coordinate, source
        ``"network"``, attrs ``method`` (the method used), ``method_requested`` (the argument,
        ``"auto"`` for None), ``group_size`` and ``nonfinite`` (number of samples whose
        covariance became non-finite; a RuntimeWarning is issued when > 0).
    """
    _check_arguments(config, samples, seed, dtype, chunk_size, memory_budget)
    choice = as_sampler(method)
    check_progress(progress)
    sampler = _resolve(config, choice)
    V0 = check_covariance(V0)
    device = check_device(device) if device is not None else V0.device
    V0 = V0.to(device=device, dtype=dtype)
    check_tokens(V0.shape[-1], config.width, "V0")
    return _simulate(
        config, V0, samples, sampler=sampler, requested=choice.name, seed=seed, device=device,
        chunk_size=chunk_size, memory_budget=memory_budget, progress=progress,
    )  # fmt: skip


def _simulate(
    config: ModelConfig,
    V0: Tensor,
    samples: int,
    *,
    sampler: SamplerChoice,
    requested: str,
    seed: int,
    device: torch.device,
    chunk_size: int | None,
    memory_budget: float,
    progress: bool | None,
) -> xr.Dataset:
    """:func:`simulate` on validated, resolved arguments: ``V0`` (m, m) checked, on
    ``device`` and in the run's dtype; ``sampler`` the choice that simulates ``config`` (its
    sampler accepts it; ``requested``: the name asked for, stored in attrs), trusted
    (:func:`simulate` and :func:`simulations.run_comparison` check them once)."""
    method, sampler_cls = sampler.name, sampler.sampler_class
    dtype, m = V0.dtype, V0.shape[-1]
    G = sampler_cls.group_size
    n_groups = math.ceil(samples / G)
    per_chunk = _chunk_groups(sampler_cls, config, m, dtype, chunk_size, memory_budget)
    with (
        _fill_threads(device) as workers,
        tqdm(
            total=samples * config.depth,
            desc=f"simulate[{method}]",
            unit="sample-block",
            unit_scale=True,
            disable=None if progress is None else not progress,
        ) as bar,
    ):
        # huge pages on one thread only: with two they made the gram sampler 20% slower
        # (benchmarks/RESULTS.md, section 3, ninth pass)
        V = empty((samples, config.depth + 1, m, m), dtype, huge_pages=workers == 1)
        for first in range(0, n_groups, per_chunk):
            groups = range(first, min(first + per_chunk, n_groups))
            sizes = [min(G, samples - g * G) for g in groups]
            parts = _parts(sampler_cls, config, seed, groups, sizes, device, workers)
            rows = slice(first * G, first * G + sum(sizes))
            # on CPU straight into the result; elsewhere on the device, then copied
            out = V[rows] if device.type == "cpu" else V.new_empty(V[rows].shape, device=device)
            _simulate_chunk(parts, V0, out, config.depth, workers, bar)
            if device.type != "cpu":
                V[rows] = out.cpu()

    nonfinite = _nonfinite_samples(V)
    if nonfinite:
        warnings.warn(
            f"simulate: {nonfinite} of {samples} samples have non-finite covariances "
            f"(method={method!r}, dtype={dtype}); see the 'nonfinite' attribute",
            RuntimeWarning,
            stacklevel=3,  # the caller of simulate
        )
    layers = torch.arange(config.depth + 1)
    return covariance_dataset(
        V,
        layers.double() / config.width,
        config,
        source="network",
        method=method,
        seed=seed,
        layer=layers,
        attrs={
            "device": str(device),
            "group_size": G,
            "nonfinite": nonfinite,
            "method_requested": requested,
        },
    )
