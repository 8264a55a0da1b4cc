"""Sweep grids: validation, grid points, per-point seeds and padded shapes (no Dask here).

A grid maps parameter names to a value (fixed for every point) or a non-empty list of values
(a grid dimension, in the mapping's order). Names are the :class:`shapedtx.ModelConfig` fields
plus the run parameters in :data:`RUN_PARAMS`; ``T`` (depth time) may replace ``depth``, in
which case a network gets ``depth = round(T * width)`` blocks and the SDE runs to exactly ``T``
(docs/theory.md#notation: one block is one step of 1/n in depth time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sde import SOLVERS
from shapedtx._validation import ParameterError, check_choice
from shapedtx.config import FIELD_TYPES, ModelConfig
from shapedtx.covariance import equicorrelated

from .options import SAMPLERS

RUN_PARAMS: dict[str, type] = {
    "T": float,  # SDE horizon / network depth time (replaces depth)
    "tokens": int,  # m; V0 = equicorrelated(tokens, rho0, scale)
    "rho0": float,
    "scale": float,
    "samples": int,
    "seed": int,  # base seed; the point's seed is derived from it (point_seed)
    "method": str,  # simulations.simulate method (network points)
    "sde_method": str,  # sde.solve method (SDE points)
    "dt": float,  # sde.solve step
    "save_every": int,  # sde.solve saving stride
}
"""Run parameters a grid may set besides the ModelConfig fields, with their types."""

DEFAULTS: dict[str, Any] = {
    "tokens": 4,
    "rho0": 0.2,
    "scale": 1.0,
    "samples": 256,
    "seed": 0,
    "method": "auto",
    "sde_method": "euler",
    "dt": 0.01,
}
"""Values of run parameters the grid does not set."""

KINDS: dict[str, tuple[str, ...]] = {
    "network": ("network",),
    "sde": ("sde",),
    "both": ("network", "sde"),
}
"""``kind`` -> the sources computed at every grid point."""

_ONLY = {"network": ("method",), "sde": ("sde_method", "dt", "save_every")}
_CHOICES = {"method": tuple(SAMPLERS), "sde_method": tuple(SOLVERS)}
"""The accepted values of run parameters that name a method."""
_TYPES = {**FIELD_TYPES, **RUN_PARAMS}
_SEED_EXCLUDED = ("seed", "samples", *_ONLY["network"], *_ONLY["sde"])


def _coerce(name: str, value: Any) -> Any:
    """``value`` converted to the type of parameter ``name`` (integers accepted for floats)."""
    kind = _TYPES[name]
    is_bool = isinstance(value, (bool, np.bool_))
    if kind is bool:
        ok = is_bool
    elif kind is int:
        ok = isinstance(value, numbers.Integral) and not is_bool
    elif kind is float:
        ok = isinstance(value, numbers.Real) and not is_bool and math.isfinite(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        what = {bool: "true/false", int: "integers", float: "finite numbers", str: "strings"}
        raise ParameterError("grid", f"grid[{name!r}] values must be {what[kind]}, got {value!r}")
    if name in _CHOICES:
        check_choice(f"grid[{name!r}]", value, _CHOICES[name])
    return kind(value)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ParameterError(
            "kind", f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
        )


@dataclass(frozen=True)
class Point:
    """One task of a sweep: a grid point and a source (``network`` or ``sde``).

    ``index`` locates it in the store (grid indices, then the source index); ``params`` are
    all parameters (defaults filled in); ``config`` is None and ``error`` set when the point
    is invalid (it is then recorded as failed without running).
    """

    index: tuple[int, ...]
    source: str
    coords: dict[str, Any]
    params: dict[str, Any]
    seed: int
    config: ModelConfig | None = None
    error: str | None = None
    n_t: int = 0
    label: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        """File-name-safe identifier of the point in the store."""
        return "p" + "_".join(map(str, self.index))

    @property
    def T(self) -> float | None:
        """SDE horizon passed to ``sde.solve`` (None: ``config.T``)."""
        return self.params.get("T")


@dataclass(frozen=True)
class Grid:
    """A validated grid: ``dims`` (name -> values, in order), ``fixed`` values, ``kind``."""

    dims: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any]
    kind: str

    @property
    def sources(self) -> tuple[str, ...]:
        return KINDS[self.kind]

    @property
    def shape(self) -> tuple[int, ...]:
        """Grid shape followed by the number of sources."""
        return (*(len(v) for v in self.dims.values()), len(self.sources))

    @property
    def defaults(self) -> dict[str, Any]:
        """The :data:`DEFAULTS` of the parameters this kind uses."""
        unused = {name for s, names in _ONLY.items() if s not in self.sources for name in names}
        return {k: v for k, v in DEFAULTS.items() if k not in unused}

    def to_json(self) -> str:
        """Canonical JSON identifying the sweep (stored in the store's attrs)."""
        return json.dumps(
            {
                "dims": {k: list(v) for k, v in self.dims.items()},
                "fixed": self.fixed,
                "defaults": self.defaults,
            },
            separators=(",", ":"),
        )

    def points(self) -> Iterator[Point]:
        """Every (grid point, source), in C order of :attr:`shape`."""
        names = list(self.dims)
        ranges = [range(len(v)) for v in self.dims.values()]
        for idx in itertools.product(*ranges):
            coords = {name: self.dims[name][i] for name, i in zip(names, idx, strict=True)}
            params = {**self.defaults, **self.fixed, **coords}
            seed = point_seed(params)
            for s, source in enumerate(self.sources):
                yield _plan(
                    Point((*idx, s), source, coords, params, seed, label=_label(coords, source))
                )


def _label(coords: Mapping[str, Any], source: str) -> str:
    return ", ".join([*(f"{k}={v}" for k, v in coords.items()), f"source={source}"])


def make_grid(grid: Mapping[str, Any], kind: str = "network") -> Grid:
    """Validate a grid mapping (see the module docstring) into a :class:`Grid`.

    Raises ValueError naming the offending key for unknown names, empty or repeated value
    lists, wrong types, ``depth`` together with ``T``, or parameters that ``kind`` never uses.
    """
    _check_kind(kind)
    if not isinstance(grid, Mapping) or not grid:
        raise ParameterError(
            "grid", "grid must be a non-empty mapping of parameter names to values"
        )
    dims: dict[str, tuple[Any, ...]] = {}
    fixed: dict[str, Any] = {}
    for name, value in grid.items():
        if name not in _TYPES:
            raise ParameterError(
                "grid",
                f"grid has unknown parameter {name!r}; accepted: {', '.join(sorted(_TYPES))}",
            )
        if isinstance(value, (list, tuple)):
            if not value:
                raise ParameterError("grid", f"grid[{name!r}] must be a non-empty list")
            values = tuple(_coerce(name, v) for v in value)
            if len(set(values)) != len(values):
                raise ParameterError("grid", f"grid[{name!r}] has repeated values: {list(values)}")
            dims[name] = values
        else:
            fixed[name] = _coerce(name, value)
    if "T" in grid and "depth" in grid:
        raise ParameterError(
            "grid", "grid may set depth or T, not both (T gives depth = round(T * width))"
        )
    for source, names in _ONLY.items():
        if source not in KINDS[kind]:
            for name in names:
                if name in grid:
                    raise ParameterError(
                        "grid", f"grid[{name!r}] is only used with kind={source!r}"
                    )
    return Grid(dims, fixed, kind)


def point_seed(params: Mapping[str, Any]) -> int:
    """The seed of a grid point: the first 63 bits of SHA-256 over the base ``seed`` and the
    canonical JSON of the parameters defining the model and its input (the config fields,
    ``T``, ``tokens``, ``rho0``, ``scale``; not ``samples`` nor the solver parameters
    ``method``, ``sde_method``, ``dt``, ``save_every``).

    Deterministic across machines, runs and ``kind``; different points get unrelated
    streams; the network and SDE runs of one point share it.
    """
    rest = {k: v for k, v in sorted(params.items()) if k not in _SEED_EXCLUDED}
    text = f"{params['seed']}|{json.dumps(rest, sort_keys=True, separators=(',', ':'))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _plan(point: Point) -> Point:
    """Fill in the config and the number of saved times, or the error making it invalid."""
    p = point.params
    try:
        kwargs = {k: v for k, v in p.items() if k in FIELD_TYPES}
        if "T" in p:
            kwargs["depth"] = round(p["T"] * p.get("width", ModelConfig.width))
            if kwargs["depth"] < 1:
                raise ParameterError(
                    "grid", f"T * width must be >= 0.5 (depth >= 1), got T={p['T']}"
                )
        config = ModelConfig(**kwargs)
        equicorrelated(p["tokens"], p["rho0"], p["scale"])
        if p["samples"] < 1:
            raise ParameterError("grid", f"samples must be an integer >= 1, got {p['samples']}")
        n_t = config.depth + 1 if point.source == "network" else _sde_times(config, p)
    except ValueError as err:
        return dataclasses.replace(point, error=f"ValueError: {err}")
    return dataclasses.replace(point, config=config, n_t=n_t)


def _sde_times(config: ModelConfig, p: Mapping[str, Any]) -> int:
    """Number of times ``sde.solve`` saves (:func:`sde.time_grid`, its one rule)."""
    from sde import time_grid

    return len(time_grid(config, p["dt"], T=p.get("T"), save_every=p.get("save_every")).saved)
