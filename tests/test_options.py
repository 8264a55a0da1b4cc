"""Options that carry their algorithm (issue 36, item 2): one table of names per kind
(``sde.SOLVERS``, ``simulations.SAMPLERS``) built from the classes, solver and sampler objects
that run their own algorithm, and run settings passed one way (keywords)."""

import re
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest
import torch

import sde
from sde.options import as_solver
from sde.solvers import EulerMaruyamaStep, FactoredEulerStep
from shapedtx import ModelConfig, ParameterError, equicorrelated
from simulations import (
    SAMPLERS,
    Auto,
    Exact,
    ExactSampler,
    Gram,
    GramSampler,
    SamplerChoice,
    Weights,
    WeightsSampler,
    resolve_method,
    simulate,
)
from simulations.options import as_sampler

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs/guide/simulate-and-solve.md").read_text()
ATT = ModelConfig(width=20, depth=4, tau0=0.8, gamma=0.5)  # T = 0.2
V0 = equicorrelated(3, 0.2)


def _documented(table: str) -> list[str]:
    """The names the guide lists after ``table`` (e.g. "sde.SOLVERS": (`"euler"`, ...))."""
    found = re.search(re.escape(f"`{table}`") + r" \(([^)]*)\)", GUIDE)
    assert found, f"the guide lists no names for {table}"
    return re.findall(r'`"(\w+)"`', found.group(1))


def _docstring_names(doc: str, after: str) -> list[str]:
    """The quoted names in the ``method:`` argument of a docstring."""
    part = doc.split(after, 1)[1]
    part = part[: re.search(r"\n        \w+:", part).start()]
    return re.findall(r'``"(\w+)"``', part)


# The tables ------------------------------------------------------------------------------
def test_the_tables_are_the_documented_lists_and_built_from_the_classes():
    assert _documented("sde.SOLVERS") == list(sde.SOLVERS) == ["euler", "em", "torchsde"]
    assert _documented("simulations.SAMPLERS") == list(SAMPLERS)
    assert list(SAMPLERS) == ["auto", "exact", "weights", "gram"]
    assert set(_docstring_names(sde.solve.__doc__, "method:")) == set(sde.SOLVERS)
    assert set(_docstring_names(simulate.__doc__, "method:")) == set(SAMPLERS)
    for table in (sde.SOLVERS, SAMPLERS):
        for name, cls in table.items():
            assert cls.name == name


@pytest.mark.parametrize("name", sorted(set(sde.SOLVERS) | set(_documented("sde.SOLVERS"))))
def test_every_solver_name_resolves_to_its_class(name):
    solver = as_solver(name)
    assert type(solver) is sde.SOLVERS[name] and solver.name == name and solver.dt == 0.01
    assert as_solver(name, 0.05) == sde.SOLVERS[name](0.05)
    assert sde.solve(ATT, V0, 2, method=name, dt=0.1, seed=0).attrs["solver"] == name


@pytest.mark.parametrize("name", sorted(set(SAMPLERS) | set(_documented("simulations.SAMPLERS"))))
def test_every_sampler_name_resolves_to_its_class(name):
    choice = as_sampler(name)
    assert type(choice) is SAMPLERS[name] and choice.name == name
    config = ModelConfig(width=8, depth=2)  # every sampler simulates it
    ds = simulate(config, V0, 2, method=name, seed=0)
    assert ds.attrs["method_requested"] == name
    assert ds.attrs["method"] == (choice.resolve(config).name)


@pytest.mark.parametrize("bad", ["rk4", "Euler", "", "exact", 3, None, sde.FactoredEuler])
def test_unknown_solver_names_are_refused_listing_the_choices(bad):
    with pytest.raises(ParameterError) as err:
        as_solver(bad)
    assert err.value.parameter == "method"
    assert all(repr(name) in str(err.value) for name in sde.SOLVERS)
    with pytest.raises(ParameterError) as err:
        sde.solve(ATT, V0, 2, method=bad)
    assert err.value.parameter == "method"


@pytest.mark.parametrize("bad", ["foo", "Exact", "", "euler", 3, Exact])
def test_unknown_sampler_names_are_refused_listing_the_choices(bad):
    with pytest.raises(ParameterError) as err:
        as_sampler(bad)
    assert err.value.parameter == "method"
    assert all(repr(name) in str(err.value) for name in SAMPLERS)
    with pytest.raises(ParameterError) as err:
        simulate(ATT, V0, 2, method=bad)
    assert err.value.parameter == "method"


# Solver objects carry their algorithm ---------------------------------------------------------
@pytest.mark.parametrize("name", list(sde.SOLVERS))
def test_solver_objects_with_their_dt_are_the_names_with_that_dt(name):
    """``method=Cls(dt)`` gives the numbers of ``method=name, dt=dt`` (and not the default
    step's): the object's dt is the one used."""
    cls = sde.SOLVERS[name]
    a = sde.solve(ATT, V0, 6, method=cls(0.05), seed=3)
    b = sde.solve(ATT, V0, 6, method=name, dt=0.05, seed=3)
    c = sde.solve(ATT, V0, 6, method=name, seed=3)  # dt 0.01
    assert np.array_equal(a["V"].values, b["V"].values)
    assert a.attrs["dt"] == b.attrs["dt"] == sde.time_grid(ATT, 0.05).dt
    assert a.attrs["steps"] == 4 and c.attrs["steps"] == 20 and c.attrs["dt"] == 0.01
    assert not np.array_equal(a["V"].values[:, -1], c["V"].values[:, -1])
    # the dt given beside an object must be its own
    assert sde.solve(ATT, V0, 6, method=cls(0.05), dt=0.05, seed=3).attrs["dt"] == a.attrs["dt"]
    with pytest.raises(ParameterError) as err:
        sde.solve(ATT, V0, 6, method=cls(0.05), dt=0.04)
    assert err.value.parameter == "dt"


def test_solver_objects_build_their_steppers():
    m = 3
    assert isinstance(sde.FactoredEuler().stepper(ATT, m), FactoredEulerStep)
    batch = sde.FactoredEuler().stepper([ATT, ATT.replace(gamma=0.3)], m, paths=[2, 1])
    assert isinstance(batch, FactoredEulerStep) and batch.config == (ATT, ATT.replace(gamma=0.3))
    assert isinstance(sde.EulerMaruyama().stepper(ATT, m), EulerMaruyamaStep)
    for call in (
        lambda: sde.EulerMaruyama().stepper([ATT], m, paths=[2]),
        lambda: sde.EulerMaruyama().stepper([ATT], m),
        lambda: sde.EulerMaruyama().stepper(ATT, m, paths=[2]),
        lambda: sde.TorchSDE().stepper(ATT, m),
    ):
        with pytest.raises(ParameterError) as err:
            call()
        assert err.value.parameter == "method"


def test_solve_runs_any_solver_object_through_its_own_methods():
    """No table of steppers in solve: an object of one's own is run by its ``stepper``."""

    class MyEM(sde.Solver):
        name = "my-em"

        def stepper(self, config, m, *, paths=None):
            return EulerMaruyamaStep(config, m)

    mine = sde.solve(ATT, V0, 5, method=MyEM(0.05), seed=2)
    em = sde.solve(ATT, V0, 5, method="em", dt=0.05, seed=2)
    assert np.array_equal(mine["V"].values, em["V"].values) and mine.attrs["solver"] == "my-em"
    with pytest.raises(ParameterError, match="no stepper"):
        sde.solve(ATT, V0, 5, method=sde.Solver(0.05))


# Sampler objects carry their algorithm -------------------------------------------------------
def test_sampler_objects_name_their_sampler_classes():
    assert Exact.sampler_class is ExactSampler and Weights.sampler_class is WeightsSampler
    assert Gram.sampler_class is GramSampler and not hasattr(Auto, "sampler_class")
    assert all(issubclass(c, SamplerChoice) for c in SAMPLERS.values())
    gram_ok, pre_ln = ModelConfig(width=8, depth=2), ModelConfig(width=8, depth=2, norm="pre")
    assert Auto().resolve(gram_ok) == Gram() and Auto().resolve(pre_ln) == Exact()
    assert as_sampler(None) == Auto() and as_sampler("weights") == Weights()
    for choice in (Exact(), Weights(), Gram()):
        assert as_sampler(choice) is choice and choice.resolve(pre_ln) is choice
        assert resolve_method(pre_ln, choice) == choice.name
    assert resolve_method(pre_ln, Auto()) == resolve_method(pre_ln) == "exact"
    assert resolve_method(gram_ok, "auto") == "gram"
    with pytest.raises(ValueError, match="gram"):  # an explicit choice is not replaced
        simulate(pre_ln, V0, 2, method=Gram())


# Run settings: keywords, each honoured ------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "attr"),
    [("seed", 5, 5), ("device", "cpu", "cpu"), ("dtype", torch.float32, "float32")],
)
def test_simulate_and_solve_honour_every_run_setting(field, value, attr):
    """Each run keyword is used: seen in the result of simulate and of sde.solve."""
    assert simulate(ATT, V0, 4, **{field: value}).attrs[field] == attr
    assert sde.solve(ATT, V0, 4, **{field: value}).attrs[field] == attr


def test_choice_objects_are_frozen_values():
    for cls in [*sde.SOLVERS.values(), *SAMPLERS.values()]:
        obj = cls()
        assert obj == cls() and hash(obj) == hash(cls())
        with pytest.raises(FrozenInstanceError):
            obj.dt = 1.0  # type: ignore[misc]
    assert sde.FactoredEuler(0.05) != sde.FactoredEuler() and sde.FactoredEuler() != sde.TorchSDE()


def test_solver_paths_are_the_stepper_over_the_grid_with_seeded_normals():
    """What ``solve`` runs, written out: the stepper over the time grid with normals
    ``(B, 2, m, m)`` from a generator seeded with ``seed`` (euler, em); torchsde on every step
    of the grid, the saved ones kept."""
    from sde.solvers import gaussian_noise, integrate

    B, m, seed = 5, 3, 11
    V0s = V0.expand(B, m, m).contiguous()
    for name in ("euler", "em"):
        grid = sde.time_grid(ATT, 0.03, save_every=2)
        noise = gaussian_noise(
            (B, 2, m, m), torch.Generator().manual_seed(seed), V0.dtype, V0.device
        )
        ref = integrate(sde.SOLVERS[name]().stepper(ATT, m), V0s, steps=grid.steps, dt=grid.dt,
                        save_every=2, noise=noise, bound=1e8, progress=False)  # fmt: skip
        ds = sde.solve(ATT, V0, B, method=name, dt=0.03, seed=seed, save_every=2)
        assert np.array_equal(ds["V"].values, ref.V.numpy())
        assert np.allclose(ds["t"].values, grid.times)
    grid = sde.time_grid(ATT, 0.05, save_every=2)  # 4 steps, saved 0, 2, 4
    ts = torch.arange(grid.steps + 1, dtype=V0.dtype) * grid.dt
    V, _, _ = sde.solve_torchsde(ATT, V0s, ts, dt=grid.dt, bound=1e8, seed=seed)
    ds = sde.solve(ATT, V0, B, method="torchsde", dt=0.05, seed=seed, save_every=2)
    assert np.array_equal(ds["V"].values, V[:, [0, 2, 4]].numpy())


def test_convergence_passes_its_run_settings_to_both_runs(monkeypatch):
    """convergence takes the run settings as keywords: each reaches simulate and sde.solve
    (the progress setting reached simulate only)."""
    import simulations.driver
    from simulations.convergence import convergence

    calls = []

    def recorder(fn):
        def wrapped(*args, **kwargs):
            calls.append((fn.__name__, kwargs))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(sde, "solve", recorder(sde.solve))
    monkeypatch.setattr(simulations.driver, "simulate", recorder(simulations.driver.simulate))
    config = ModelConfig(width=4, depth=2)
    settings = {"seed": 3, "device": "cpu", "dtype": torch.float32, "progress": False}
    convergence(config, [4, 8], equicorrelated(2, 0.3), 4, dt=0.1, **settings)
    assert sorted(name for name, _ in calls) == ["simulate", "simulate", "solve"]
    for name, kwargs in calls:
        assert kwargs["device"] == "cpu" and kwargs["dtype"] == torch.float32
        assert kwargs["progress"] is False and kwargs["seed"] == (4 if name == "solve" else 3)
