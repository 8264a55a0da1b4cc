"""``simulations.advise``: what each function promises, checked at its edges (issue #41).

Each test pins a documented rule that a mutant of ``simulations/advise.py`` could break
unnoticed by ``tests/test_advise.py`` (tests/MUTATION.md, 2026-11-26): the 2-SE "significant"
and "unresolved" rules and their binomial SE at the threshold, the grid-edge notes, the
confirmation loop (order, bounds, ``max_confirm`` and the seeds ``seed + 1 + i``), the default
steps ``max(50, ceil(50 T))`` and its bound, ``max_tokens``, the cost estimate and the flags
passed to the SDE. Most use a fake solver (a law chosen per gamma), so they take milliseconds;
one runs the real solver on two tokens and compares it with ``sde.solve_batch`` by hand.
"""

import importlib
import math
from dataclasses import replace

import pytest
import torch

import sde
from shapedtx import ModelConfig
from shapedtx.covariance import equicorrelated
from simulations import Criteria, advise, measure
from simulations.advise import Candidate, Measurement, design_checks

advise_module = importlib.import_module("simulations.advise")  # the function shadows it
CRIT = Criteria()


def _meas(n=4096, collapse=0.0, exploded=0.0, norm=1.0, norm_low=0.9, norm_high=1.5, **kw):
    """A Measurement with the given numbers (binomial SEs of the estimates)."""
    return Measurement(
        samples=n,
        collapse=collapse,
        collapse_se=math.sqrt(collapse * (1 - collapse) / n),
        exploded=exploded,
        exploded_se=math.sqrt(exploded * (1 - exploded) / n),
        norm=norm,
        norm_se=0.1,
        rho_spread=kw.pop("rho_spread", 0.05),
        rho_spread_se=kw.pop("rho_spread_se", 0.001),
        rho_mean=0.0,
        norm_low=norm_low,
        norm_high=norm_high,
        **kw,
    )


def _law(n, spread=0.05, collapsed=0, exploded=0):
    """(V_T, exploded) of ``n`` paths, m = 2, unit diagonal, correlations +-spread; the first
    ``collapsed`` paths have correlation 0.995, the next ``exploded`` paths blew up."""
    r = torch.full((n,), spread, dtype=torch.float64)
    r[1::2] = -spread
    r[:collapsed] = 0.995
    VT = torch.eye(2, dtype=torch.float64).repeat(n, 1, 1)
    VT[:, 0, 1] = VT[:, 1, 0] = r
    ex = torch.zeros(n, dtype=torch.bool)
    ex[collapsed : collapsed + exploded] = True
    VT[ex] = math.nan
    return VT, ex


class FakeSolver:
    """``solve_batch`` returning ``screen[gamma]`` / ``confirm[gamma]`` laws (keyword arguments
    of :func:`_law`) and recording every call (gammas, samples, T, steps, seed, configs, V0)."""

    def __init__(self, screen, confirm=None):
        self.screen, self.confirm, self.calls = screen, confirm or screen, []

    def __call__(self, configs, V0, n, *, T, steps, seed, progress=False):
        stage = "screen" if not self.calls else "confirm"
        law = self.screen if stage == "screen" else self.confirm
        self.calls.append(
            dict(stage=stage, gammas=[c.gamma for c in configs], samples=n, T=T, steps=steps,
                 seed=seed, configs=list(configs), V0=V0.clone())
        )  # fmt: skip
        return [_law(n, **law[c.gamma]) for c in configs]

    def confirmed(self):
        return [(c["gammas"], c["seed"]) for c in self.calls if c["stage"] == "confirm"]


def _run(monkeypatch, screen, confirm=None, cost=(0.0, 1e-6), **kw):
    solver = FakeSolver(screen, confirm)
    monkeypatch.setattr(advise_module, "solve_batch", solver)
    monkeypatch.setattr(advise_module, "_step_cost", lambda *a: cost)
    args = dict(width=16, depth=4, tokens=2, tau0s=(1.0,), samples=4096, screen_samples=32)
    args |= dict(gammas=tuple(sorted(screen))) | kw
    return advise(**args), solver


# -- Measurement: the 2-SE rules ------------------------------------------------------------


def test_a_point_estimate_at_its_threshold_is_a_violation_not_an_unresolved_pass():
    at = _meas(collapse=0.01, norm=10.0, norm_high=12.0)
    assert [v.split()[0] for v in at.violations(CRIT)] == ["collapse", "norm"]
    assert at.unresolved(CRIT) == ()  # violated criteria are not listed as unresolved
    above = _meas(norm=12.0, norm_low=11.0, norm_high=15.0)
    assert above.unresolved(CRIT) == () and above.violations(CRIT)


def test_violations_use_the_point_estimate_and_z_se_only_when_z_is_given():
    """z = 0: the point estimate (the norm's lower bound plays no part); z = 2: significant
    only when ``estimate - 2 SE >= threshold`` (for the norm, ``norm_low >= threshold``)."""
    m = _meas(norm=5.0, norm_low=20.0)
    assert m.violations(CRIT) == ()
    assert m.violations(CRIT, 2)[0].startswith("norm q99 5 >= 10")
    near = replace(_meas(), collapse=0.025, collapse_se=0.01)  # 1.5 SE above 0.01
    far = replace(_meas(), collapse=0.035, collapse_se=0.01)  # 2.5 SE above
    assert near.violations(CRIT) and near.violations(CRIT, 2) == ()
    assert far.violations(CRIT, 2) == ("collapse 0.035 >= 0.01",)


def test_unresolved_uses_two_binomial_ses_at_the_threshold():
    """N = 4096: SE at 0.01 is sqrt(0.01 * 0.99 / 4096) = 0.001555; a collapse of 0.0067 passes
    by 2.12 SE (resolved at the default z = 2, not at z = 2.2), 0.0072 by 1.8 SE (unresolved);
    the number of paths to resolve 0.005 against 0.01 is 4 * 0.01 * 0.99 / 0.005^2 = 1584."""
    assert _meas(collapse=0.0067).unresolved(CRIT) == ()
    assert _meas(collapse=0.0067).unresolved(CRIT, 2.2)[0].startswith("collapse")
    (text,) = _meas(collapse=0.0072).unresolved(CRIT)
    assert "(0.0016)" in text and "about 5052 paths" in text  # 4 * 0.0099 / 0.0028^2 = 5051.02
    text = _meas(n=1000, collapse=0.005).unresolved(CRIT)[0]
    assert "about 1584 paths" in text
    (text,) = _meas(n=32, collapse=0.0).unresolved(CRIT, 3.0)[1:]  # exploded, at z = 3
    assert "by less than 3 SE (0.0056)" in text and "about 8991 paths" in text


def test_the_paths_said_to_resolve_a_fraction_do_resolve_it():
    """0 exploded of N passes 0.001 by 2 SE exactly at N = 4 x 0.999 / 0.001 = 3996, the
    number the message gives: "unresolved" is a pass by *less than* 2 SE, so 3996 paths are
    resolved (before issue #41's mutation pass they were not, contradicting the message)."""
    (text,) = _meas(n=3995, collapse=0.0).unresolved(CRIT)
    assert text.startswith("exploded 0 < 0.001") and "about 3996 paths" in text
    assert _meas(n=3996).unresolved(CRIT) == ()
    c = Candidate(0.1, 1.0, _meas(n=3996), (), "confirmed", (), _meas(n=3996).unresolved(CRIT))
    assert c.verdict == "pass"


def test_the_norm_is_unresolved_when_its_upper_bound_reaches_the_threshold():
    assert _meas(norm=9.0, norm_high=10.0).unresolved(CRIT)[0].startswith("norm q99 9 < 10")
    assert _meas(norm=9.0, norm_high=9.99).unresolved(CRIT) == ()


def test_advice_mc_se_is_the_binomial_se_at_each_threshold(monkeypatch):
    a, _ = _run(monkeypatch, {0.1: {}}, samples=1000, screen_samples=100)
    assert a.mc_se == pytest.approx(
        {
            "collapse_confirm": math.sqrt(0.01 * 0.99 / 1000),
            "exploded_confirm": math.sqrt(0.001 * 0.999 / 1000),
            "collapse_screen": math.sqrt(0.01 * 0.99 / 100),
            "exploded_screen": math.sqrt(0.001 * 0.999 / 100),
        },
        rel=1e-12,
    )


# -- screening and the confirmation loop ----------------------------------------------------


def test_screening_rejects_only_violations_beyond_two_standard_errors(monkeypatch):
    """32 paths: 6 collapsed (0.1875, SE 0.069) is 2.57 SE above 1%: rejected at screening,
    never confirmed; 2 collapsed (0.0625, 0.76 SE above) stays plausible and is confirmed."""
    a, solver = _run(
        monkeypatch,
        screen={0.1: {"collapsed": 2}, 0.2: {"collapsed": 6}},
        confirm={0.1: {}, 0.2: {}},
    )
    assert solver.confirmed() == [([0.1], 1)]
    assert a.gamma == 0.1 and a.best.stage == "confirmed" and a.resolved
    rejected = next(c for c in a.candidates if c.gamma == 0.2)
    assert rejected.stage == "screen" and not rejected.plausible
    assert rejected.significant == ("collapse 0.188 >= 0.01",)
    assert rejected.to_dict()["significant_violations"] == ["collapse 0.188 >= 0.01"]


def test_max_confirm_one_confirms_the_first_candidate_with_seed_plus_one(monkeypatch):
    a, solver = _run(monkeypatch, {0.1: {}, 0.2: {}}, max_confirm=1, seed=5)
    assert solver.confirmed() == [([0.2], 6)]  # the largest gamma within the target
    assert (a.gamma, a.tau0) == (0.2, 1.0) and a.best is a.candidates[0]
    assert a.best.stage == "confirmed" and a.best.measurement.samples == 4096
    assert not any("no candidate passed" in n for n in a.notes)


def test_confirmation_i_uses_seed_plus_one_plus_i_in_ranking_order(monkeypatch):
    """Three candidates within the target whose confirmations fail: they are confirmed in
    ranking order (largest gamma first) with seeds seed + 1, + 2, + 3; with max_confirm = 2
    only two are, and the note counts them."""
    screen = {g: {} for g in (0.1, 0.2, 0.3)}
    bad = {g: {"collapsed": 400} for g in screen}  # 9.8% of 4096 collapse
    a, solver = _run(monkeypatch, screen, bad, seed=3)
    assert solver.confirmed() == [([0.3], 4), ([0.2], 5), ([0.1], 6)]
    assert a.gamma is None and a.best is None
    assert a.notes[0] == "no candidate passed: 3 confirmed with 4096 paths failed"
    a, solver = _run(monkeypatch, screen, bad, seed=3, max_confirm=2)
    assert solver.confirmed() == [([0.3], 4), ([0.2], 5)]
    assert a.notes[0] == "no candidate passed: 2 confirmed with 4096 paths failed (max_confirm=2)"
    assert [c.stage for c in a.candidates].count("confirmed") == 2


def test_a_failed_confirmation_never_confirms_a_rejected_candidate(monkeypatch):
    a, solver = _run(
        monkeypatch,
        screen={0.1: {}, 0.2: {"collapsed": 20}},
        confirm={0.1: {"collapsed": 400}, 0.2: {}},
    )
    assert solver.confirmed() == [([0.1], 1)]
    assert a.gamma is None
    assert a.notes[0] == "no candidate passed: 1 confirmed with 4096 paths failed"


def test_nothing_plausible_at_screening_is_said_so(monkeypatch):
    a, solver = _run(monkeypatch, {0.1: {"collapsed": 20}, 0.2: {"exploded": 20}})
    assert solver.confirmed() == [] and a.gamma is None
    assert a.notes == ("no candidate passed: every one violates a criterion significantly at "
                       "screening",)  # fmt: skip


def test_the_confirmed_measurement_is_solve_batch_by_hand_with_seed_plus_one():
    """The real solver: with max_confirm = 1 the one candidate is confirmed, and its numbers
    are ``measure`` of ``sde.solve_batch`` run by hand with seed + 1 (causal and not)."""
    for causal in (True, False):
        kw = dict(
            gammas=(0.2,), tau0s=(1.0,), samples=64, screen_samples=16, steps=5, spread_target=1
        )
        a = advise(16, 4, 2, causal=causal, max_confirm=1, seed=7, **kw)
        assert a.gamma == 0.2 and a.best.stage == "confirmed"
        config = ModelConfig(width=16, depth=4, mlp="shaped_relu", causal=causal, gamma=0.2,
                             tau0=1.0)  # fmt: skip
        V0 = equicorrelated(2, 0.2, 1.0)
        ((VT, ex),) = sde.solve_batch([config], V0, 64, T=0.25, steps=5, seed=8)
        assert a.best.measurement == measure(V0, VT, ex)
        ((VT, ex),) = sde.solve_batch([config], V0, 64, T=0.25, steps=5, seed=7)
        assert a.best.measurement != measure(V0, VT, ex)


# -- steps, tokens, flags, cost ---------------------------------------------------------------


@pytest.mark.parametrize(("width", "depth", "steps"), [(16, 4, 50), (16, 40, 125), (100, 101, 51)])
def test_default_steps_are_max_50_ceil_50_t(monkeypatch, width, depth, steps):
    a, solver = _run(monkeypatch, {0.1: {}}, width=width, depth=depth)
    assert a.steps == steps and {c["steps"] for c in solver.calls} == {steps}
    assert {c["T"] for c in solver.calls} == {depth / width}


def test_the_step_bound_is_on_fifty_steps_per_unit_time(monkeypatch):
    """50 T = MAX_STEPS exactly is allowed (T = 200000); one more depth is refused by depth."""
    a, _ = _run(monkeypatch, {0.1: {}}, width=2, depth=400_000)
    assert a.steps == 10**7
    with pytest.raises(ValueError, match=r"50 per unit time.*lower depth"):
        _run(monkeypatch, {0.1: {}}, width=2, depth=400_001)
    a, _ = _run(monkeypatch, {0.1: {}}, width=2, depth=400_001, steps=7)
    assert a.steps == 7


def test_flags_grid_and_initial_covariance_reach_the_solver(monkeypatch):
    grid = dict(gammas=(0.3, 0.1), tau0s=(2.0, 0.5))
    for heads, mlp, causal in [(1, "none", False), (2, "shaped_relu", True)]:
        a, solver = _run(monkeypatch, {0.1: {}, 0.3: {}}, width=16, tokens=6, heads=heads,
                         mlp=mlp, causal=causal, rho0=0.3, max_tokens=2, **grid)  # fmt: skip
        screen = solver.calls[0]
        assert [(c.gamma, c.tau0) for c in screen["configs"]] == [
            (0.1, 0.5), (0.1, 2.0), (0.3, 0.5), (0.3, 2.0)
        ]  # fmt: skip
        for c in screen["configs"] + solver.calls[1]["configs"]:
            assert (c.width, c.depth, c.heads, c.mlp, c.causal) == (16, 4, heads, mlp, causal)
            assert c.attention == "shaped" and c.out_proj == (heads > 1)
        torch.testing.assert_close(screen["V0"], equicorrelated(2, 0.3, 1.0))
        assert a.sim_tokens == 2 and a.config.out_proj == (heads > 1)
        assert (a.heads, a.mlp, a.causal, a.rho0) == (heads, mlp, causal, 0.3)


def test_max_tokens_two_and_the_long_context_note(monkeypatch):
    a, solver = _run(monkeypatch, {0.1: {}}, tokens=4, max_tokens=2)
    assert a.sim_tokens == 2 and solver.calls[0]["V0"].shape == (2, 2)
    assert any("m = 2 of the 4 tokens" in n for n in a.notes)
    a, solver = _run(monkeypatch, {0.1: {}}, tokens=2, max_tokens=2)
    assert a.sim_tokens == 2 and not any("max_tokens" in n for n in a.notes)


def test_cost_estimate_is_steps_times_the_per_step_model(monkeypatch):
    """steps (2 a + b (candidates x screen_samples + samples)): 50 (2 + 1e-3 (4 x 32 + 4096))
    = 311.2 s, logged as 5.2 min."""
    lines = []
    a, _ = _run(monkeypatch, {0.1: {}, 0.2: {}}, cost=(1.0, 1e-3), tau0s=(0.5, 1.0),
                log=lines.append)  # fmt: skip
    assert a.estimated_seconds == pytest.approx(50 * (2 + 1e-3 * (4 * 32 + 4096)))
    assert lines[0].startswith("estimated cost: about 5.2 min (screen 4 candidates x 32 paths, ")
    assert "at most 8; 50 steps at m = 2; 1e+03 us per path-step" in lines[0]
    a, _ = _run(monkeypatch, {0.1: {}}, cost=(0.5, 0.0), log=lines.append)
    assert a.estimated_seconds == pytest.approx(50.0) and "about 50 s" in lines[-1]


def test_the_step_cost_model_from_its_timed_runs(monkeypatch):
    """P = 65536 / m^2 clamped to [16, 256]; runs of P and 4P paths, 2 steps each: with
    per-call times a + b paths (fake clock), ``_step_cost`` recovers (a, b)."""
    clock, calls = [0.0], []

    def fake(configs, V0, paths, *, T, steps, seed):
        calls.append((paths, steps, T))
        clock[0] += steps * (0.01 + 1e-4 * paths)

    monkeypatch.setattr(advise_module, "solve_batch", fake)
    monkeypatch.setattr(advise_module.time, "perf_counter", lambda: clock[0])
    cfg = [ModelConfig(width=16, depth=4, gamma=0.1)]
    a, b = advise_module._step_cost(cfg, equicorrelated(8, 0.2), 1.0, 10)
    assert calls == [(256, 1, 0.1), (256, 2, 0.2), (1024, 2, 0.2)]
    assert a == pytest.approx(0.01) and b == pytest.approx(1e-4)
    calls.clear()
    advise_module._step_cost(cfg, equicorrelated(20, 0.2), 1.0, 10)
    assert [c[0] for c in calls] == [163, 163, 652]  # 65536 // 400
    calls.clear()
    advise_module._step_cost(cfg, equicorrelated(128, 0.2), 1.0, 10)
    assert [c[0] for c in calls] == [16, 16, 64]


def test_the_step_cost_per_path_has_a_floor_of_a_sixteenth_of_the_per_path_time(monkeypatch):
    """Timings that do not grow with the paths (noise): b = t(4P) / (4P) / 4, a = t(P) - P b."""
    clock = [0.0]

    def flat(configs, V0, paths, *, T, steps, seed):
        clock[0] += steps * 0.1

    monkeypatch.setattr(advise_module, "solve_batch", flat)
    monkeypatch.setattr(advise_module.time, "perf_counter", lambda: clock[0])
    cfg = [ModelConfig(width=16, depth=4, gamma=0.1)]
    a, b = advise_module._step_cost(cfg, equicorrelated(8, 0.2), 1.0, 10)
    assert b == pytest.approx(0.1 / 1024 / 4) and a == pytest.approx(0.1 - 256 * b)


# -- grid edges, design checks, argument bounds -------------------------------------------------


def test_grid_edges_only_at_the_ends_of_grids_of_two_or_more():
    def edges(g, t, gammas, tau0s):
        return advise_module._grid_edges(Candidate(g, t, _meas(), (), "confirmed"), gammas, tau0s)

    assert edges(0.2, 1.0, (0.1, 0.2, 0.3), (0.5, 1.0, 2.0)) == ()
    assert edges(0.2, 1.0, (0.2,), (1.0,)) == ()
    low, high = edges(0.1, 2.0, (0.1, 0.3), (1.0, 2.0))
    assert low.startswith("gamma = 0.1 is the smallest") and "(extend --gammas)" in low
    assert high.startswith("tau0 = 2 is the largest") and "(extend --tau0s)" in high


def test_head_size_is_ok_from_m_minus_one():
    config = ModelConfig(width=16, depth=4, heads=4, out_proj=True, gamma=0.1)  # key size 4
    assert design_checks(config, 5).head_size_ok and not design_checks(config, 6).head_size_ok
    assert design_checks(config, 5).bh_bottleneck and not design_checks(config, 4).bh_bottleneck


def test_the_smallest_allowed_arguments_are_accepted(monkeypatch):
    a, _ = _run(monkeypatch, {0.1: {}}, width=2, depth=1, tokens=2, heads=1, samples=16,
                screen_samples=16, max_confirm=1, seed=0, max_tokens=2, steps=1)  # fmt: skip
    assert (a.width, a.depth, a.steps, a.samples, a.screen_samples) == (2, 1, 1, 16, 16)
    for bad in (dict(max_confirm=0), dict(seed=-1), dict(samples=15), dict(steps=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _run(monkeypatch, {0.1: {}}, **bad)
