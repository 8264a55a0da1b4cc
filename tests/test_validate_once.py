"""Validate once, then trust: each public verb (``simulate``, ``sde.solve``,
``run_comparison``) checks its arguments once and hands resolved objects to its core; the SDE
constants of a comparison are computed once (by its ``Experiment``) and passed down."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import sde
from sde.coefficients import sde_constants
from shapedtx import ModelConfig, equicorrelated
from simulations import Experiment, run_comparison, simulate

CONFIG = ModelConfig(width=8, depth=6, mlp="shaped_relu")


@contextmanager
def _calls(function: Callable[..., Any]) -> Iterator[list[int]]:
    """Counts the calls of ``function`` through every loaded module that binds it (its own
    module included, so its callers inside it count too)."""
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return function(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        for module in list(sys.modules.values()):
            for name, value in list(getattr(module, "__dict__", {}).items()):
                if value is function:
                    patch.setattr(module, name, counted)
        yield count


def _experiment(**changes: Any) -> Experiment:
    settings = {"tokens": 3, "samples": 8, "baseline_samples": 2, "convergence_widths": (4,)}
    return Experiment(CONFIG, **{**settings, "dt": 0.05, **changes})


def test_run_comparison_computes_the_sde_constants_once_with_the_verbs_numbers():
    """Once per comparison, on the Experiment's construction (was 3 times: the Experiment's
    check, sde.solve's check and the stepper); the cores run_comparison calls on resolved
    objects give the public verbs' numbers bitwise (network: seed, SDE: seed + 1)."""
    with _calls(sde_constants) as count:
        e = _experiment(seed=3)
        assert count[0] == 1
        with warnings.catch_warnings():  # the tiny run's step error, for one
            warnings.simplefilter("ignore")
            result = run_comparison(e, figures=False)
        assert count[0] == 1
    network = simulate(CONFIG, e.V0(), e.samples, method=e.method, seed=3, progress=False)
    limit = sde.solve(CONFIG, e.V0(), e.samples, dt=e.dt, seed=4, warn=False, step_error=True)
    assert np.array_equal(result.network["V"].values, network["V"].values)
    for name in ("V", "V_half", "exploded", "exploded_half"):
        assert np.array_equal(result.limit[name].values, limit[name].values)
    assert result.network.attrs["method"] == network.attrs["method"] == e.sampler(CONFIG).name
    assert result.limit.attrs["dt"] == limit.attrs["dt"]
    assert result.convergence is not None  # its widths reused the model's sampler object


def test_run_comparison_with_em_computes_the_sde_constants_once():
    """Was once more per step: the EM step's drift recomputed them."""
    with _calls(sde_constants) as count:
        e = _experiment(sde_method="em", step_error=False, convergence_widths=())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_comparison(e, figures=False)
    assert count[0] == 1


@pytest.mark.parametrize("method", ["euler", "em", "torchsde"])
def test_solve_computes_the_sde_constants_once(method):
    with _calls(sde_constants) as count:
        sde.solve(CONFIG, equicorrelated(3, 0.2), 4, dt=0.05, method=method, progress=False)
    assert count[0] == 1
