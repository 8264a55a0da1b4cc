"""``simulations.advise`` and ``shapedtx advise``: criteria, ranking, CLI, finite networks."""

import importlib
import itertools
import json
import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
import xarray as xr

import sde
from shapedtx import ModelConfig
from shapedtx.covariance import equicorrelated
from simulations import Criteria, advise, measure, measure_dataset, simulate
from simulations.advise import Candidate, rank_key
from simulations.cli import main


def _known_law():
    """1000 paths, m = 3, V0 = I: 30 collapsed (rho 0.995), 2 exploded, 20 with V^aa = 20."""
    N, m = 1000, 3
    VT = torch.eye(m, dtype=torch.float64).repeat(N, 1, 1)
    VT[:30, 0, 1] = VT[:30, 1, 0] = 0.995
    VT[30:50] *= 20.0
    exploded = torch.zeros(N, dtype=torch.bool)
    exploded[50:52] = True
    VT[50:52] = math.nan
    return torch.eye(m, dtype=torch.float64), VT, exploded


def test_criteria_on_a_known_law():
    V0, VT, exploded = _known_law()
    meas = measure(V0, VT, exploded)
    assert meas.samples == 1000
    assert meas.collapse == pytest.approx(0.032)  # 30 collapsed + 2 exploded
    assert meas.collapse_se == pytest.approx(math.sqrt(0.032 * 0.968 / 1000))
    assert meas.exploded == pytest.approx(0.002)
    # pooled ratios: 6 inf (0.2%), 60 at 20 (2%), the rest 1: the 99th percentile is 20
    assert meas.norm == 20.0
    off = np.zeros((998, 3))
    off[:30, 0] = 0.995
    assert meas.rho_spread == pytest.approx(off.std())
    assert meas.rho_spread_se > 0
    violations = meas.violations(Criteria())
    assert len(violations) == 3
    lenient = Criteria(collapse=0.05, exploded=0.01, norm_ratio=21)
    assert not measure(V0, VT, exploded, lenient).violations(lenient)
    # the same law as a covariance Dataset with an 'exploded' variable
    V = torch.stack([V0.expand(1000, 3, 3), VT], dim=1)
    ds = xr.Dataset(
        {"V": (("sample", "t", "a", "b"), V.numpy()), "exploded": (("sample",), exploded.numpy())}
    )
    assert measure_dataset(ds) == meas


def test_ranking_prefers_the_largest_gamma_within_the_spread_target():
    V0, VT, exploded = _known_law()
    base = measure(V0, VT[:30], exploded[:30])

    def cand(g, t, spread, violations=()):
        return Candidate(g, t, replace(base, rho_spread=spread), violations, "screen", violations)

    cands = [
        cand(0.1, 1, 0.05),
        cand(0.2, 1, 0.1),
        cand(0.2, 0.5, 0.11),
        cand(0.3, 1, 0.2),
        cand(0.5, 1, 0.01, ("collapse",)),
    ]
    best = sorted(cands, key=lambda c: rank_key(c, 0.15))
    assert (best[0].gamma, best[0].tau0) == (0.2, 0.5)
    assert best[-1].gamma == 0.5
    best = sorted(cands, key=lambda c: rank_key(c, 0.01))  # nothing meets it: smallest spread
    assert best[0].gamma == 0.1


SMALL = dict(tau0s=(0.5, 1.0, 2.0), samples=512, screen_samples=64)


def test_deeper_networks_get_smaller_or_equal_gamma():
    gammas = [advise(64, depth, 4, **SMALL).gamma for depth in (2, 8, 32, 128)]
    assert all(g is not None for g in gammas)
    assert all(a >= b for a, b in itertools.pairwise(gammas)), gammas
    assert gammas[0] > gammas[-1]


def test_advice_fields_and_design_checks():
    a = advise(64, 16, 8, heads=16, **SMALL)
    assert a.T == 0.25 and a.gamma is not None and a.tau0 is not None
    assert a.candidates[0].passed and a.candidates[0].stage == "confirmed"
    assert a.candidates[0].measurement.samples == 512
    assert a.config.gamma == a.gamma and a.config.out_proj
    assert not a.design.head_size_ok  # key size 4 < m - 1 = 7
    assert any("[BH]" in n for n in a.notes)
    assert json.loads(json.dumps(a.to_dict()))["gamma"] == a.gamma


def test_grids_that_are_not_sequences_are_refused_by_name():
    for grid in ({"gammas": 0.3}, {"tau0s": "1"}):
        with pytest.raises(ValueError, match=f"{next(iter(grid))} must be a sequence"):
            advise(8, 4, 4, **grid)


def test_advised_config_passes_on_the_finite_network_and_a_rejected_one_fails():
    width, depth, m = 32, 32, 4
    a = advise(width, depth, m, **SMALL)
    V0 = equicorrelated(m, 0.2)
    ds = simulate(a.config, V0, 256, seed=3, progress=False)
    assert not measure_dataset(ds).violations(a.criteria)
    bad = a.config.replace(gamma=1.0, tau0=0.5)
    assert not next(c for c in a.candidates if (c.gamma, c.tau0) == (1.0, 0.5)).plausible
    with warnings.catch_warnings():  # blown-up networks warn about non-finite samples
        warnings.simplefilter("ignore", RuntimeWarning)
        ds = simulate(bad, V0, 256, seed=3, progress=False)
    assert measure_dataset(ds).violations(a.criteria)


def test_causal_advice():
    a = advise(
        64, 16, 4, causal=True, gammas=(0.1, 0.3), tau0s=(1.0,), samples=256, screen_samples=64
    )
    assert a.causal and a.gamma is not None


def test_cli_json(capsys):
    argv = [
        "advise",
        "--width",
        "64",
        "--depth",
        "16",
        "--tokens",
        "4",
        "--json",
        "--tau0s",
        "0.5,1",
        "--gammas",
        "0.1,0.2,0.9",
        "--samples",
        "256",
        "--screen-samples",
        "64",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"gamma", "tau0", "T", "criteria", "candidates"} <= set(out)
    assert len(out["candidates"]) == 6 and out["T"] == 0.25


def test_cli_table(capsys):
    argv = [
        "advise",
        "--width",
        "64",
        "--depth",
        "16",
        "--tokens",
        "4",
        "--tau0s",
        "1",
        "--gammas",
        "0.1,0.9",
        "--samples",
        "256",
        "--screen-samples",
        "64",
        "--all",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "advice: gamma = 0.1" in out and "[LW]" in out and "[BH]" in out


@pytest.mark.parametrize(
    "extra",
    [
        ["--width", "0", "--depth", "4", "--tokens", "4"],
        ["--width", "8", "--depth", "0", "--tokens", "4"],
        ["--width", "8", "--depth", "4", "--tokens", "1"],
        ["--width", "4", "--depth", "4", "--tokens", "8"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--gammas", "0,0.5"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--gammas", "1.5"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--gammas", "abc"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--gammas", ""],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--tau0s", "-1"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--tau0s", "nan"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--tau0s", "1e-308"],  # k_att overflow
        ["--width", "8", "--depth", "4", "--tokens", "4", "--tau0s", "1e308"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--steps", "1000000000000"],
        ["--width", "8", "--depth", "1000000000000", "--tokens", "4"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--max-collapse", "2"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--max-norm", "0.5"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--samples", "0"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--spread-target", "-1"],
        ["--width", "8", "--depth", "4", "--tokens", "4", "--heads", "3"],
        ["--width", "8", "--depth", "4"],
    ],
)
def test_cli_bad_input_is_one_line_exit_2(extra, capsys):
    try:
        code = main(["advise", *extra])
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err and "Traceback" not in err


def test_batched_solver_matches_sde_solve_in_law():
    """Two configurations in one batch: each row block has the law of its own sde.solve."""
    V0 = equicorrelated(4, 0.2)
    configs = [
        ModelConfig(width=64, depth=32, mlp="shaped_relu", gamma=0.3, tau0=1.0),
        ModelConfig(width=64, depth=32, mlp="shaped_relu", gamma=0.6, tau0=2.0),
    ]
    from simulations.advise import solve_batch

    batched = solve_batch(configs, V0, 1500, T=0.5, steps=50, seed=1)
    for config, (VT, ex) in zip(configs, batched, strict=True):
        ds = sde.solve(config, V0, 1500, T=0.5, dt=0.01, seed=2, progress=False)
        a = measure(V0, VT, ex)
        b = measure_dataset(ds)
        se = math.hypot(a.rho_spread_se, b.rho_spread_se)
        assert abs(a.rho_spread - b.rho_spread) < 4 * se + 0.005, (a, b)
        assert abs(a.rho_mean - b.rho_mean) < 0.02


def test_nothing_passes_gives_no_advice_and_exit_1(capsys):
    a = advise(64, 64, 4, gammas=(0.9, 1.0), tau0s=(0.25,), samples=64, screen_samples=64)
    assert a.gamma is None and a.config is None and a.best is None and a.notes
    argv = ["advise", "--width", "64", "--depth", "64", "--tokens", "4", "--gammas", "0.9,1"]
    assert main([*argv, "--tau0s", "0.25", "--samples", "64", "--screen-samples", "64"]) == 1
    assert "NO candidate" in capsys.readouterr().out


def test_measure_norm_quantile_and_its_order_statistic_se_by_hand():
    """100 paths, m = 2, V0 = I, V_T = diag(k, k) for k = 1..100: 200 pooled ratios. q = 0.99,
    half = sqrt(q (1 - q) / N) (N paths): the ceil(p n)-th smallest at p = q, q +- half and
    q - 2 half are 99, 100 / 99 and 98, so norm = 99, norm_se = (100 - 99) / 2, norm_low = 98."""
    k = torch.arange(1, 101, dtype=torch.float64)
    VT = torch.diag_embed(torch.stack([k, k], -1))
    meas = measure(torch.eye(2, dtype=torch.float64), VT, torch.zeros(100, dtype=torch.bool))
    assert (meas.norm, meas.norm_se, meas.norm_low) == (99.0, 0.5, 98.0)
    assert meas.collapse == meas.exploded == 0.0 and meas.rho_spread == 0.0


def test_measure_two_paths_and_a_zero_token():
    """Two usable paths give a spread (the sd of their two correlations); a path with a
    zero-norm token has no correlation and is excluded like a blown-up one."""
    V = torch.tensor([[1.0, 0.3], [0.3, 1.0]], dtype=torch.float64)
    VT = torch.stack([V, V.clone(), torch.diag(torch.tensor([0.0, 1.0], dtype=torch.float64))])
    VT[1, 0, 1] = VT[1, 1, 0] = -0.1
    meas = measure(torch.eye(2, dtype=torch.float64), VT, torch.zeros(3, dtype=torch.bool))
    assert meas.rho_spread == pytest.approx(np.std([0.3, -0.1]))
    assert meas.rho_mean == pytest.approx(0.1)
    assert meas.exploded == pytest.approx(1 / 3) and meas.collapse == pytest.approx(1 / 3)


def test_criteria_thresholds_are_open_intervals():
    for name in ("rho_max", "collapse", "exploded", "norm_quantile"):
        for bad in (0.0, 1.0):
            with pytest.raises(ValueError, match=name):
                Criteria(**{name: bad})
    with pytest.raises(ValueError, match="norm_ratio"):
        Criteria(norm_ratio=1.0)
    Criteria(rho_max=0.999, collapse=1e-6, norm_ratio=1.001)


def test_batched_euler_step_is_the_factored_euler_step_per_row():
    """``FactoredEulerStep(configs, m, paths=...)``: the same step as
    :class:`sde.solvers.FactoredEulerStep` with each row's own constants (same factor, same
    normals), causal and not."""
    from sde.solvers import FactoredEulerStep

    gen = torch.Generator().manual_seed(0)
    V0 = equicorrelated(3, 0.3).double()
    for mlp, causal in itertools.product(("shaped_relu", "none"), (False, True)):
        configs = [
            ModelConfig(width=32, depth=8, mlp=mlp, gamma=0.3, tau0=1.0, causal=causal),
            ModelConfig(width=32, depth=8, mlp=mlp, gamma=0.7, tau0=0.5, causal=causal),
        ]
        batched = FactoredEulerStep(configs, 3, paths=[2, 2])
        L, V = batched.init(V0.expand(4, 3, 3))
        normals = torch.randn((4, 2, 3, 3), generator=gen, dtype=torch.float64)
        (F, _), Vn, _ = batched.step((L, V), normals, 0.05)
        for j, cfg in enumerate(configs):
            rows = slice(2 * j, 2 * j + 2)
            (Fr, _), Vr, _ = FactoredEulerStep(cfg, 3).step((L[rows], V[rows]), normals[rows], 0.05)
            torch.testing.assert_close(F[rows], Fr, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(Vn[rows], Vr, rtol=1e-12, atol=1e-12)


def _fake_law(spread: float, samples: int) -> torch.Tensor:
    """V_T with unit diagonals and correlations +-spread (sd exactly ``spread``)."""
    r = torch.full((samples,), spread, dtype=torch.float64)
    r[1::2] = -spread
    VT = torch.eye(2, dtype=torch.float64).repeat(samples, 1, 1)
    VT[:, 0, 1] = VT[:, 1, 0] = r
    return VT


def test_confirmation_keeps_a_candidate_only_if_it_stays_within_the_target(monkeypatch):
    """gamma 0.2 screens within the spread target but its confirmed spread exceeds it: the
    advisor confirms the next candidate (gamma 0.1, within the target) and picks it, with no
    'smallest spread' note; a generous target keeps gamma 0.2."""
    advise_module = importlib.import_module("simulations.advise")  # the function shadows it
    screen = {0.1: 0.05, 0.2: 0.09}
    confirm = {0.1: 0.05, 0.2: 0.2}

    def fake_solve_batch(configs, V0, samples, *, T, steps, seed, progress=False):
        law = screen if len(configs) > 1 else confirm
        return [(_fake_law(law[c.gamma], samples), torch.zeros(samples, dtype=torch.bool))
                for c in configs]  # fmt: skip

    monkeypatch.setattr(advise_module, "solve_batch", fake_solve_batch)
    kw = dict(gammas=(0.1, 0.2), tau0s=(1.0,), samples=32, screen_samples=32)
    a = advise(16, 4, 2, spread_target=0.1, **kw)
    assert a.gamma == 0.1 and a.best is a.candidates[0] and a.best.gamma == 0.1
    assert [c.stage for c in a.candidates] == ["confirmed", "confirmed"]
    assert not any("smallest spread" in n for n in a.notes)
    a = advise(16, 4, 2, spread_target=0.5, **kw)
    assert a.gamma == 0.2 and not any("smallest spread" in n for n in a.notes)
    a = advise(16, 4, 2, spread_target=0.01, **kw)  # nothing within: the smallest spread
    assert a.gamma == 0.1 and any("smallest spread" in n for n in a.notes)


def test_depth_one_is_a_valid_network():
    a = advise(8, 1, 2, gammas=(0.1,), tau0s=(1.0,), samples=16, screen_samples=16, steps=5)
    assert a.T == 1 / 8 and a.gamma == 0.1
    with pytest.raises(ValueError, match="depth"):
        advise(8, 0, 2)


def test_cost_estimate_is_logged_before_the_work_and_progress_is_shown(monkeypatch, capsys):
    """The up-front estimate reaches ``log`` before the screening batch starts, is stored in the
    Advice, and the screening shows a tqdm bar on stderr with ``progress=True``."""
    advise_module = importlib.import_module("simulations.advise")
    events = []
    real = advise_module.solve_batch

    def spy(configs, V0, samples, **kw):
        events.append(("solve", len(configs), samples))
        return real(configs, V0, samples, **kw)

    monkeypatch.setattr(advise_module, "solve_batch", spy)
    kw = dict(gammas=(0.1, 0.2), tau0s=(1.0,), samples=64, screen_samples=32, steps=5)
    a = advise(16, 4, 4, progress=True, log=lambda line: events.append(("log", line)), **kw)
    logs = [i for i, e in enumerate(events) if e[0] == "log"]
    screen = events.index(("solve", 2, 32))
    assert len(logs) == 1 and logs[0] < screen
    assert events[logs[0]][1].startswith("estimated cost: about ")
    assert "screen 2 candidates x 32 paths" in events[logs[0]][1]
    assert 0 < a.estimated_seconds < math.inf
    assert "it/s]" in capsys.readouterr().err or "s/it]" in capsys.readouterr().err


def test_a_pass_by_less_than_two_standard_errors_is_unresolved():
    """0 exploded of 32 paths passes the 0.1% criterion on the point estimate, but the
    binomial SE at the threshold is 0.0056: unresolved; 0 of 4096 is resolved (2 SE =
    0.00099 < 0.001), 1 of 4096 is not; collapse 0.005 of 4096 passes 0.01 by 3.2 SE."""
    V0, VT, exploded = _known_law()
    base = measure(V0, VT[:30], exploded[:30])
    crit = Criteria()

    def meas(n, exploded=0.0, collapse=0.0):
        return replace(base, samples=n, exploded=exploded, collapse=collapse, norm=1.0,
                       norm_high=1.5)  # fmt: skip

    assert [u.split()[0] for u in meas(32).unresolved(crit)] == ["collapse", "exploded"]
    assert "about 3996 paths" in meas(32).unresolved(crit)[1]
    assert meas(4096).unresolved(crit) == ()
    assert [u.split()[0] for u in meas(4096, exploded=1 / 4096).unresolved(crit)] == ["exploded"]
    assert meas(4096, collapse=0.005).unresolved(crit) == ()
    assert meas(4096, collapse=0.008).unresolved(crit)[0].startswith("collapse")
    high = replace(meas(4096), norm=9.0, norm_high=11.0)
    assert high.unresolved(crit)[0].startswith("norm q99") and not high.violations(crit)
    c = Candidate(0.1, 1.0, meas(32), (), "confirmed", (), meas(32).unresolved(crit))
    assert c.passed and c.verdict == "unresolved"
    assert Candidate(0.1, 1.0, meas(4096), (), "confirmed").verdict == "pass"
    assert Candidate(0.1, 1.0, meas(32), ("x",), "confirmed").verdict == "fail"


def _fake_advise(monkeypatch, spreads, samples=4096, **kw):
    """advise with a fake solver: gamma -> the spread of its law (nothing collapses)."""
    advise_module = importlib.import_module("simulations.advise")

    def fake_solve_batch(configs, V0, n, **_):
        return [(_fake_law(spreads[c.gamma], n), torch.zeros(n, dtype=torch.bool))
                for c in configs]  # fmt: skip

    monkeypatch.setattr(advise_module, "solve_batch", fake_solve_batch)
    monkeypatch.setattr(advise_module, "_step_cost", lambda *a: (0.0, 1e-6))
    grid = dict(gammas=tuple(spreads), tau0s=(0.5, 1.0), samples=samples, screen_samples=32)
    return advise(16, 4, 2, **(grid | kw))


def test_unresolved_advice_is_reported(monkeypatch):
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, samples=32, spread_target=0.1)
    assert a.gamma == 0.2 and a.best.verdict == "unresolved" and not a.resolved
    assert any("UNRESOLVED" in n for n in a.notes)
    from simulations.formatting import format_advice

    assert "unresolved (passes by < 2 SE)" in format_advice(a)
    assert json.loads(json.dumps(a.to_dict()))["resolved"] is False
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, spread_target=0.1)
    assert a.resolved and a.best.verdict == "pass"
    assert not any("UNRESOLVED" in n for n in a.notes)


def test_advice_at_the_edge_of_the_grid_says_so(monkeypatch):
    """The largest gamma within the target is the grid's largest: a note (and grid_edges);
    tau0 0.5 is the smallest tau0 (the ranking's tie-break) and is noted too; an interior
    gamma gets no gamma note."""
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, spread_target=0.1)
    assert (a.gamma, a.tau0) == (0.2, 0.5)
    assert any("gamma = 0.2 is the largest of the grid" in e for e in a.grid_edges)
    assert any("tau0 = 0.5 is the smallest of the grid" in e for e in a.grid_edges)
    assert all(f"at the edge of the grid: {e}" in a.notes for e in a.grid_edges)
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09, 0.3: 0.2}, spread_target=0.1)
    assert a.gamma == 0.2 and not any(e.startswith("gamma") for e in a.grid_edges)
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, spread_target=0.1, tau0s=(1.0,))
    assert a.grid_edges == ("gamma = 0.2 is the largest of the grid; a larger one may be "
                            "better (extend --gammas)",)  # fmt: skip


def test_causal_is_the_default_as_in_training(capsys):
    """advise and ``shapedtx advise`` default to causal attention, which ``shapedtx train``
    requires (shapedtx.training.train: ``causal`` must be True); --no-causal switches."""
    import inspect

    assert inspect.signature(advise).parameters["causal"].default is True
    argv = ["advise", "--width", "16", "--depth", "4", "--tokens", "3", "--json", "--gammas",
            "0.1", "--tau0s", "1", "--samples", "32", "--screen-samples", "32"]  # fmt: skip
    main(argv)
    assert json.loads(capsys.readouterr().out)["causal"] is True
    main([*argv, "--no-causal"])
    assert json.loads(capsys.readouterr().out)["causal"] is False


def test_long_contexts_integrate_max_tokens_and_say_so():
    a = advise(32, 4, 20, heads=2, max_tokens=4, gammas=(0.1,), tau0s=(1.0,), samples=32,
               screen_samples=32, steps=5)  # fmt: skip
    assert a.tokens == 20 and a.sim_tokens == 4
    assert a.candidates[0].measurement.samples == 32
    assert any("m = 4 of the 20 tokens" in n for n in a.notes)
    assert not a.design.head_size_ok  # the design checks use all 20 tokens (key size 16 < 19)
    b = advise(32, 4, 5, max_tokens=None, gammas=(0.1,), tau0s=(1.0,), samples=32,
               screen_samples=32, steps=5)  # fmt: skip
    assert b.sim_tokens == 5 and not any("of the 5 tokens" in n for n in b.notes)
    with pytest.raises(ValueError, match="max_tokens"):
        advise(32, 4, 5, max_tokens=1)


def test_the_ranking_rule_is_stated_once_by_rank_key(monkeypatch, capsys):
    """The JSON, the report and ``--help`` take the rule from ``rank_key``'s docstring."""
    from simulations.formatting import format_advice
    from simulations.ranking import rank_key as stated
    from simulations.ranking import ranking_rule, ranking_text

    assert rank_key is stated
    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, spread_target=0.1)
    assert a.to_dict()["ranking"]["rule"] == ranking_rule(0.1)
    assert ranking_rule(0.1) == (
        "largest safe gamma with rho_spread <= 0.1, then smallest tau0; else smallest rho_spread"
    )
    assert f"ranking: {ranking_rule(0.1)}\n" in format_advice(a)
    with pytest.raises(SystemExit):
        main(["advise", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert " ".join(ranking_text().split()) in shown and ranking_rule() in shown
    # the help shows the rule's prose: not the one-line rule twice, not the parameter note
    assert ranking_text().startswith("The score is rho_spread")
    assert ranking_text().endswith("smaller tau0 helped a little.")


def test_advice_json_writes_non_finite_numbers_as_null(monkeypatch):
    """The library's JSON convention (``shapedtx.files.json_number``): an infinite norm
    quantile (paths that blow up) is null, never the string "inf" or the non-standard
    ``Infinity``; old "inf" strings still read as infinity."""
    from shapedtx.files import read_json_number

    a = _fake_advise(monkeypatch, {0.1: 0.05, 0.2: 0.09}, spread_target=0.1)
    worst = a.candidates[-1]
    blown = replace(worst, measurement=replace(worst.measurement, norm=math.inf, norm_se=math.inf))
    a = replace(a, candidates=(*a.candidates[:-1], blown))
    data = json.loads(json.dumps(a.to_dict(), allow_nan=False))
    assert data["candidates"][-1]["norm"] is None and data["candidates"][-1]["norm_se"] is None
    assert data["candidates"][0]["norm"] == a.candidates[0].measurement.norm
    assert read_json_number(None) != read_json_number(None)  # NaN
    assert read_json_number("inf") == math.inf and read_json_number(2.5) == 2.5


def test_rank_key_groups_by_hand():
    """A screened candidate 1.5 SE above the target is in group 0 (confirmation decides), the
    same numbers confirmed are in group 1, 2.5 SE above is group 1; a candidate with an
    infinite SE is judged on its score; rejected candidates are group 2, fewest violations
    first."""
    V0, VT, exploded = _known_law()
    base = replace(measure(V0, VT[:30], exploded[:30]), rho_spread_se=0.01)

    def cand(spread, stage="screen", violations=(), se=0.01, g=0.2):
        m = replace(base, rho_spread=spread, rho_spread_se=se)
        return Candidate(g, 1.0, m, violations, stage, violations if stage == "screen" else ())

    assert rank_key(cand(0.115), 0.1) == (0, -0.2, 1.0, 0.115)
    assert rank_key(cand(0.115, "confirmed"), 0.1)[0] == 1
    assert rank_key(cand(0.125), 0.1) == (1, 0.125, 0.2, 1.0)
    assert rank_key(cand(0.1), 0.1)[0] == 0 and rank_key(cand(0.1, "confirmed"), 0.1)[0] == 0
    assert rank_key(cand(0.101, se=math.inf), 0.1)[0] == 1
    assert rank_key(cand(0.099, se=math.inf), 0.1)[0] == 0
    assert rank_key(cand(0.05, violations=("a", "b")), 0.1) == (2, 2, 0.05, 0.2, 1.0)
    assert rank_key(cand(math.nan, violations=("a",)), 0.1) == (2, 1, math.inf, 0.2, 1.0)
