"""The SDE's step error in the main job (docs/theory.md#step-error): run_comparison,
summary.json, the printed table, the convergence study and the command line."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import sde
from shapedtx import ModelConfig, equicorrelated
from shapedtx._validation import ParameterError
from simulations import Experiment, convergence, format_summary, run_comparison
from simulations.compare import StepErrorWarning

SMALL = ModelConfig(width=32, depth=24, mlp="shaped_relu")


def _experiment(**kw) -> Experiment:
    args = {"samples": 128, "baseline_samples": 8, "convergence_widths": (8, 16)} | kw
    return Experiment(SMALL, **args)


def test_run_comparison_reports_the_step_error(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StepErrorWarning)  # 128 samples: either way
        result = run_comparison(_experiment(), tmp_path, figures=False)
    assert "V_half" in result.limit and result.limit.attrs["dt_half"] == pytest.approx(0.0025)
    st = result.summary["sde"]["step_error"]
    assert st["dt_half"] == pytest.approx(0.0025)
    last = result.comparison.isel(t=-1)
    np.testing.assert_allclose(st["rho_T"]["step_error"], last["rho_quantile_step_error"])
    np.testing.assert_allclose(st["Vaa_T"]["step_error_se"], last["Vaa_quantile_step_error_se"])
    assert st["ratio"] == pytest.approx(result.comparison.attrs["step_error_ratio"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["sde"]["step_error"]["rho_T"] == st["rho_T"]
    text = format_summary(result.summary)
    line = next(x for x in text.splitlines() if x.startswith("SDE step error at T"))
    worst = max(st["Vaa_T"]["step_error"], key=abs)
    assert f"V^aa {worst:+.4f}" in line and "dt = 0.005 vs 0.0025" in line
    conv = result.convergence
    assert conv is not None and conv.attrs["median_rho_gap_reference"] == "sde, dt -> 0"
    assert result.summary["convergence"]["w1_rho_step_error"] == pytest.approx(
        float(last["w1_rho_step_error"])
    )


def test_without_step_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepErrorWarning)
        result = run_comparison(_experiment(step_error=False, convergence_widths=()))
    assert "V_half" not in result.limit and result.summary["sde"]["step_error"] is None
    assert "SDE step error at dt = 0.005: not estimated" in format_summary(result.summary)
    with pytest.raises(ParameterError, match="step_error") as err:
        _experiment(sde_method="torchsde")
    assert err.value.parameter == "step_error"
    _experiment(sde_method="torchsde", step_error=False)  # fine


def test_warning_names_both_numbers_when_dt_is_too_large():
    e = _experiment(dt=0.25, samples=512, convergence_widths=())
    with pytest.warns(StepErrorWarning) as record:
        result = run_comparison(e)
    message = str(record[0].message)
    a = result.comparison.attrs
    assert a["step_error_resolved_ratio"] > 1 and a["step_error_worst"] in message
    assert "against Monte Carlo SE" in message and "dt = 0.25" in message


def test_convergence_fits_only_widths_above_the_step_error_bar():
    """The fit's threshold is floor + 2 sd + step error: with a step error larger than every
    distance nothing is fitted, and the same limit without V_half fits as before."""
    config = ModelConfig(width=64, depth=32, attention="none", mlp="shaped_relu", gamma=0.9)
    V0 = equicorrelated(2, 0.2)
    limit = sde.solve(config, V0, 400, dt=0.25, seed=1, progress=False, step_error=True)
    out = convergence(config, [4, 64], V0, 400, limit=limit, progress=False)
    plain = convergence(
        config, [4, 64], V0, 400, progress=False,
        limit=limit.drop_vars(["V_half", "exploded_half", "t_explode_half"]),
    )  # fmt: skip
    step = out.attrs["w1_rho_step_error"]
    assert step > 0 and "w1_rho_step_error" not in plain.attrs
    floor = out.attrs["w1_rho_noise_floor"] + 2 * out.attrs["w1_rho_noise_sd"]
    d = out["w1_rho"].values
    assert out.attrs["w1_rho_fit_widths"] == [w for w, x in zip([4, 64], d, strict=True)
                                              if x > floor + step]  # fmt: skip
    # the median gap is taken against the extrapolated SDE median, its SE widened
    assert np.all(out["median_rho_gap_se"].values >= plain["median_rho_gap_se"].values)
    assert not np.allclose(out["median_rho_gap"].values, plain["median_rho_gap"].values)
    assert math.isfinite(float(out["median_rho_gap"].values[0]))


def test_cli_no_step_error(tmp_path):
    from simulations.cli import main

    out = tmp_path / "run"
    code = main(["compare", "--quick", "--no-figures", "--no-progress", "--no-step-error",
                 "--convergence-widths", "none", "--out", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sde"]["step_error"] is None
