"""Choose the branch weight gamma and the temperature tau0 of a shaped Transformer from its SDE.

For a network of width n, depth d and m tokens, :func:`advise` solves the covariance SDE
(docs/theory.md#sde) up to ``T = d / n`` for every (gamma, tau0) of a grid, measures the predicted
law of ``V_T`` against safety criteria (:class:`Criteria`), ranks the safe candidates with
:func:`rank_key` and returns the best with the whole table (:class:`Advice`).

Safety criteria (each a threshold of :class:`Criteria`; a candidate passes when every point
estimate is below its threshold, and its verdict is "pass" only when every one is below by at
least 2 standard errors, else "unresolved", :meth:`Measurement.unresolved`; the Monte Carlo
standard error is reported with each):

- ``collapse``: fraction of paths with some off-diagonal correlation ``rho^{ab}_T > rho_max``
  (rank collapse, docs/theory.md#rank-collapse; exploded paths count as collapsed), below 1%;
- ``exploded``: fraction of paths that blow up before T (the attention drift is cubic in V, so
  the SDE can explode in finite time; docs/theory.md#sde), below 0.1%;
- ``norm``: the 99th percentile of ``V^{aa}_T / V^{aa}_0`` over paths and tokens (token norms
  act as an inverse temperature of the attention), below 10.

Ranking: :func:`rank_key` states the rule, once (score ``rho_spread``, the sd of the
off-diagonal ``rho_T``, against ``spread_target``, :data:`DEFAULT_SPREAD_TARGET`). The evidence
for this score (a pilot training study, then ``examples/advise/predict.py``: the rank
correlation of each init-time score with the trained loss, and how far the advice was from the
best trained configuration) is reported in ``examples/advise/results.md`` and summarised in the
advise guide (``docs/guide/advise.md``), with its scope (widths, depths, training horizons, seeds).

Sampling: every candidate is first screened with ``screen_samples`` paths (rejected there only
for a violation beyond 2 standard errors; others stay unresolved); candidates are then
confirmed with ``samples`` fresh paths in ranking order until one passes (the confirmed numbers
replace the screening ones). All candidates are integrated together as one batch
(:func:`sde.solve_batch`: float32 factored Euler, ``dt = min(T / 50, 0.02)``, causal by default
as ``shapedtx train`` trains), so the cost is independent of the width; with more than
:data:`DEFAULT_MAX_TOKENS` tokens the SDE is integrated with that many (the scores converge in
m; the measurement is in the constant's docstring). The cost is estimated up front (``log``)
from two short timed runs. An advice at the edge of the gamma or tau0 grid says so
(``Advice.grid_edges`` and a note).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sde import solve_batch
from sde.solve import DEFAULT_BOUND
from sde.time_grid import MAX_STEPS
from shapedtx import ModelConfig
from shapedtx._validation import (
    ParameterError,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_positive,
    check_tokens,
)
from shapedtx.config import TAU0_RANGE
from shapedtx.covariance import check_correlation, equicorrelated
from shapedtx.design import allocation, depth_threshold, head_size_report, regime
from shapedtx.files import json_safe

from .ranking import rank_key, ranking_rule, ranking_score

DEFAULT_GAMMAS: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
DEFAULT_TAU0S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
DEFAULT_SPREAD_TARGET = 0.145
"""The sd of the off-diagonal rho_T of the pilot's best configuration after 300 steps of training
(gamma 0.15, T = 16/64, shaped ReLU MLP, 1 head, m = 8, rho0 = 0.2), 0.1415 +- 0.0002 with this
module (16000 paths, 100 steps; the same at tau0 0.5 and 1), rounded up to 0.145 so that the
pilot's configuration itself is accepted despite Monte Carlo error."""

SPREAD_BATCHES = 8

DEFAULT_MAX_TOKENS = 16
"""The number of tokens advise integrates the SDE with when more are asked for. Chosen from
the measurement of the scores against m in benchmarks/RESULTS.md ("advise's scores against
m": causal block, m = 8 ... 128; the figures are there): from m = 16 on rho_spread changes
little and the fractions and norm quantile agree within their SEs or are stricter at m = 16,
while at large m advise's 50-step solution is itself biased (the factored scheme's error grows like
(dt m)^2); the cost grows as m^3."""


@dataclass(frozen=True)
class Criteria:
    """Safety thresholds on the predicted law at T (see the module docstring)."""

    rho_max: float = 0.99
    collapse: float = 0.01
    exploded: float = 0.001
    norm_quantile: float = 0.99
    norm_ratio: float = 10.0

    def __post_init__(self) -> None:
        for name in ("rho_max", "collapse", "exploded", "norm_quantile"):
            check_number(name, getattr(self, name), 0.0, 1.0, low_open=True, high_open=True)
        check_number("norm_ratio", self.norm_ratio, 1.0, low_open=True)


@dataclass(frozen=True)
class Measurement:
    """The criteria measured on one sample of the law at T, with Monte Carlo SEs."""

    samples: int
    collapse: float
    collapse_se: float
    exploded: float
    exploded_se: float
    norm: float
    norm_se: float
    rho_spread: float
    rho_spread_se: float
    rho_mean: float
    norm_low: float = math.nan  # lower 2-SE order-statistic bound of the norm quantile
    norm_high: float = math.nan  # upper 2-SE order-statistic bound of the norm quantile

    def violations(self, criteria: Criteria, z: float = 0.0) -> tuple[str, ...]:
        """The criteria this measurement violates, with the numbers. ``z > 0``: only those
        violated significantly, ``estimate - z SE >= threshold`` (used to screen)."""
        out = []
        checks = (
            ("collapse", self.collapse, self.collapse_se, criteria.collapse),
            ("exploded", self.exploded, self.exploded_se, criteria.exploded),
            (f"norm q{100 * criteria.norm_quantile:g}", self.norm, self.norm_se,
             criteria.norm_ratio),
        )  # fmt: skip
        for name, value, se, threshold in checks:
            low = value - z * se if z else value
            if z and name.startswith("norm"):  # the order-statistic bound, not value - z SE
                low = self.norm_low
            if not low < threshold:
                out.append(f"{name} {value:.3g} >= {threshold:g}")
        return tuple(out)

    def unresolved(self, criteria: Criteria, z: float = 2.0) -> tuple[str, ...]:
        """The criteria this measurement passes by less than ``z`` standard errors: a point
        estimate below its threshold that the sample cannot tell from one above it.

        For the fractions the SE is the binomial SE *at the threshold*,
        ``sqrt(t (1 - t) / N)`` (at an estimate of 0 the SE of the estimate is 0, yet 0 of 32
        paths cannot show a rate below 0.001: its SE at 0.001 is 0.0056); for the quantile,
        the order statistic at ``q + z sqrt(q (1 - q) / N)`` (``norm_high``) must be below the
        threshold. Violated criteria are not listed (see :meth:`violations`).
        """
        out = []
        fractions = (
            ("collapse", self.collapse, criteria.collapse),
            ("exploded", self.exploded, criteria.exploded),
        )
        for name, value, threshold in fractions:
            se = _binomial_se(threshold, self.samples)
            if value < threshold < value + z * se:  # passes by less than z SE
                out.append(
                    f"{name} {value:.3g} < {threshold:g} by less than {z:g} SE ({se:.2g}); "
                    f"resolving it needs about {_samples_to_resolve(value, threshold, z)} paths"
                )
        name = f"norm q{100 * criteria.norm_quantile:g}"
        if self.norm < criteria.norm_ratio and not self.norm_high < criteria.norm_ratio:
            out.append(
                f"{name} {self.norm:.3g} < {criteria.norm_ratio:g} but its {z:g}-SE upper "
                f"bound is {self.norm_high:.3g}"
            )
        return tuple(out)


def _samples_to_resolve(value: float, threshold: float, z: float = 2.0) -> int:
    """Paths for which ``threshold - value`` is ``z`` binomial SEs at the threshold."""
    return math.ceil(z**2 * threshold * (1 - threshold) / (threshold - value) ** 2 - 1e-9)


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def measure(
    V0: Tensor, VT: Tensor, exploded: Tensor, criteria: Criteria = Criteria()
) -> Measurement:
    """The criteria of :class:`Criteria` and the ranking score on a sample of ``V_T``.

    Args:
        V0: (m, m) or (N, m, m) initial covariance(s).
        VT: (N, m, m) covariances at T (exploded paths may hold anything).
        exploded: (N,) bool, paths that blew up before T.

    SEs: binomial ``sqrt(p (1 - p) / N)`` for the fractions; for the quantile, half the width
    of the distribution-free 68% order-statistic interval with N (paths, not path-tokens);
    for the spread, the batch-means SE over :data:`SPREAD_BATCHES` batches of paths.
    ``norm_low`` is the order statistic at ``q - 2 sqrt(q (1 - q) / N)``: a significant norm
    violation (:meth:`Measurement.violations` with ``z = 2``) needs ``norm_low >= threshold``.
    """
    VT = torch.as_tensor(VT).double()
    N, m = VT.shape[0], VT.shape[-1]
    exploded = torch.as_tensor(exploded, dtype=torch.bool).reshape(N)
    finite = torch.isfinite(VT).flatten(1).all(1)
    bad = exploded | ~finite
    d = torch.diagonal(VT, dim1=-2, dim2=-1)
    bad = bad | ~(d > 0).all(-1)
    Vs = torch.where(bad[:, None, None], torch.eye(m, dtype=VT.dtype), VT)
    ds = torch.diagonal(Vs, dim1=-2, dim2=-1).sqrt()
    rho = Vs / (ds[:, :, None] * ds[:, None, :])
    iu = torch.triu_indices(m, m, 1)
    off = rho[:, iu[0], iu[1]]  # (N, pairs)
    collapsed = bad | (off > criteria.rho_max).any(-1)
    p_col = float(collapsed.double().mean())
    p_exp = float(bad.double().mean())
    d0 = torch.diagonal(torch.as_tensor(V0).double(), dim1=-2, dim2=-1).expand(N, m)
    ratio = torch.where(bad[:, None], torch.full_like(d0, math.inf), d / d0).flatten().numpy()
    ratio = np.sort(ratio)
    q = criteria.norm_quantile
    norm = _order_stat(ratio, q)
    half = math.sqrt(q * (1 - q) / N)
    norm_se = (_order_stat(ratio, min(q + half, 1.0)) - _order_stat(ratio, max(q - half, 0))) / 2
    norm_low = _order_stat(ratio, max(q - 2 * half, 0))
    norm_high = _order_stat(ratio, min(q + 2 * half, 1.0))
    good = off[~bad].numpy()
    spread = float(good.std()) if good.size > 1 else math.nan
    batches = np.array_split(good, SPREAD_BATCHES) if good.shape[0] >= 2 * SPREAD_BATCHES else []
    spread_se = (
        float(np.std([b.std() for b in batches], ddof=1) / math.sqrt(len(batches)))
        if batches
        else math.nan
    )
    return Measurement(
        samples=N,
        collapse=p_col,
        collapse_se=_binomial_se(p_col, N),
        exploded=p_exp,
        exploded_se=_binomial_se(p_exp, N),
        norm=norm,
        norm_se=norm_se if math.isfinite(norm_se) else math.inf,
        rho_spread=spread,
        rho_spread_se=spread_se,
        rho_mean=float(good.mean()) if good.size else math.nan,
        norm_low=norm_low,
        norm_high=norm_high,
    )


def _order_stat(sorted_values: np.ndarray, q: float) -> float:
    """The ceil(q n)-th smallest value (inverse empirical CDF)."""
    n = sorted_values.size
    k = min(max(math.ceil(q * n) - 1, 0), n - 1)
    return float(sorted_values[k])


def measure_dataset(ds: Any, criteria: Criteria = Criteria()) -> Measurement:
    """:func:`measure` on a covariance Dataset (``shapedtx.results``): V at its first and last
    time; the ``exploded`` variable if present (SDE), else paths that are non-finite or exceed
    ``DEFAULT_BOUND * max V0^{aa}`` at some time (finite networks)."""
    V = torch.as_tensor(ds["V"].values)
    if "exploded" in ds:
        exploded = torch.as_tensor(ds["exploded"].values)
    else:  # the SDE solver's rule: non-finite or above DEFAULT_BOUND * max V0^{aa} at any time
        limit = DEFAULT_BOUND * torch.diagonal(V[:, 0], dim1=-2, dim2=-1).amax(-1)
        big = V.abs().flatten(1).amax(1) > limit
        exploded = big | ~torch.isfinite(V).flatten(1).all(1)
    return measure(V[:, 0], V[:, -1], exploded, criteria)


@dataclass(frozen=True)
class Candidate:
    """One (gamma, tau0) with its measurement at T, verdict and ranking score."""

    gamma: float
    tau0: float
    measurement: Measurement
    violations: tuple[str, ...]
    stage: str  # "screen" or "confirmed"
    significant: tuple[str, ...] = ()  # violations beyond 2 SE (decide the screen)
    unresolved: tuple[str, ...] = ()  # passes by less than 2 SE (Measurement.unresolved)

    @property
    def passed(self) -> bool:
        """Every criterion's point estimate is below its threshold (see :attr:`verdict`: such a
        pass within 2 SE of a threshold is reported "unresolved")."""
        return not self.violations

    @property
    def verdict(self) -> str:
        """``"fail"`` (a point estimate at or above its threshold), ``"unresolved"`` (passes,
        but by less than 2 standard errors on some criterion) or ``"pass"``."""
        if self.violations:
            return "fail"
        return "unresolved" if self.unresolved else "pass"

    @property
    def plausible(self) -> bool:
        """May be safe: confirmed and passed, or screened without a significant violation
        (a screened candidate with only non-significant violations is unresolved until it
        is confirmed)."""
        return self.passed if self.stage == "confirmed" else not self.significant

    @property
    def score(self) -> float:
        """The ranking score (lower is better): :func:`ranking_score`."""
        return ranking_score(self.measurement)

    def to_dict(self) -> dict[str, Any]:
        """The candidate as JSON-ready data (non-finite numbers as None: ``json_safe``)."""
        return json_safe(
            {
                "gamma": self.gamma,
                "tau0": self.tau0,
                "passed": self.passed,
                "verdict": self.verdict,
                "unresolved": list(self.unresolved),
                "plausible": self.plausible,
                "violations": list(self.violations),
                "significant_violations": list(self.significant),
                "score": self.score,
                "stage": self.stage,
                **asdict(self.measurement),
            }
        )


@dataclass(frozen=True)
class DesignChecks:
    """The [LW] depth/width check and the [BH] head-size check (docs/theory.md#depth-width and
    #head-size)."""

    depth_threshold: float
    regime: str
    allocation: str
    key_dim: int
    head_dim: int
    head_size_ok: bool  # key_dim >= m - 1 (docs/theory.md#head-size)
    bh_bottleneck: bool  # key_dim < m ([BH]'s recommendation d_p >= m)
    max_unbottlenecked_heads: int


@dataclass(frozen=True)
class Advice:
    """Result of :func:`advise`. ``gamma``/``tau0`` are None when no candidate passes."""

    gamma: float | None
    tau0: float | None
    T: float
    width: int
    depth: int
    tokens: int
    heads: int
    mlp: str
    causal: bool
    rho0: float
    criteria: Criteria
    spread_target: float
    candidates: tuple[Candidate, ...]
    design: DesignChecks
    steps: int
    screen_samples: int
    samples: int
    seconds: float
    notes: tuple[str, ...] = field(default=())
    sim_tokens: int = 0  # the m the SDE was integrated with (min(tokens, max_tokens))
    estimated_seconds: float = math.nan  # the up-front cost estimate
    grid_edges: tuple[str, ...] = ()  # the advice is at an edge of the gamma or tau0 grid
    mlp_ratio: int = 1  # MLP hidden width / n (docs/theory.md#sde-mlp-ratio)

    @property
    def resolved(self) -> bool:
        """An advice whose every criterion passes by at least 2 standard errors."""
        return self.best is not None and self.best.verdict == "pass"

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.gamma is not None else None

    @property
    def mc_se(self) -> dict[str, float]:
        """Binomial SE of each fraction criterion at its threshold, for the confirmed and the
        screening sample sizes (how finely the verdicts resolve the thresholds)."""
        c = self.criteria
        return {
            "collapse_confirm": _binomial_se(c.collapse, self.samples),
            "exploded_confirm": _binomial_se(c.exploded, self.samples),
            "collapse_screen": _binomial_se(c.collapse, self.screen_samples),
            "exploded_screen": _binomial_se(c.exploded, self.screen_samples),
        }

    @property
    def config(self) -> ModelConfig | None:
        """The advised ModelConfig (None when nothing passes)."""
        if self.gamma is None or self.tau0 is None:
            return None
        return _config(
            self.width, self.depth, self.heads, self.mlp, self.causal, self.gamma, self.tau0,
            self.mlp_ratio,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The advice as JSON-ready data: non-finite numbers are None (null), the library's
        convention (:func:`shapedtx.files.json_number`)."""
        return json_safe(
            {
                "gamma": self.gamma,
                "tau0": self.tau0,
                "T": self.T,
                "width": self.width,
                "depth": self.depth,
                "tokens": self.tokens,
                "heads": self.heads,
                "mlp": self.mlp,
                "mlp_ratio": self.mlp_ratio,
                "causal": self.causal,
                "rho0": self.rho0,
                "criteria": asdict(self.criteria),
                "ranking": {
                    "score": "rho_spread (sd of off-diagonal rho_T)",
                    "spread_target": self.spread_target,
                    "rule": ranking_rule(self.spread_target),
                    "rule_function": "simulations.advise.rank_key",
                },
                "candidates": [c.to_dict() for c in self.candidates],
                "design": asdict(self.design),
                "steps": self.steps,
                "screen_samples": self.screen_samples,
                "samples": self.samples,
                "mc_se_at_thresholds": self.mc_se,
                "seconds": self.seconds,
                "estimated_seconds": self.estimated_seconds,
                "sim_tokens": self.sim_tokens,
                "resolved": self.resolved,
                "grid_edges": list(self.grid_edges),
                "notes": list(self.notes),
                "trained_checks": trained_checks(self.width, self.depth) if self.checked else [],
            }
        )

    @property
    def checked(self) -> bool:
        """Whether this advice is for the models whose training :func:`trained_checks`
        reports (the shaped ReLU MLP of ratio 4, causal, 4 heads: ``shaped``/``shaped_free``
        as trained)."""
        return (self.mlp, self.mlp_ratio, self.causal, self.heads) == ("shaped_relu", 4, True, 4)


def trained_checks(width: int | None = None, depth: int | None = None) -> list[dict[str, Any]]:
    """What training found for the models ``advise`` advises, at the sizes it was checked:
    per preset (``shaped``, and ``shaped_free``, the same network at initialisation with a
    trainable shape) at advise's gamma and tau0, the best lr of those run (``lr_bracketed``:
    a worse lr on both sides), the horizon, the seeds, the validation loss and its ratio to
    GPT-2's pre-LN. Package data written by the ablation study's report
    (examples/ablation/report.py); ``width``/``depth``: only the checks at that size."""
    from importlib.resources import files

    text = files("simulations").joinpath("data").joinpath("trained_checks.json").read_text()
    checks: list[dict[str, Any]] = json.loads(text)
    return [
        c
        for c in checks
        if (width is None or c["width"] == width) and (depth is None or c["depth"] == depth)
    ]


def _config(width, depth, heads, mlp, causal, gamma, tau0, mlp_ratio=1) -> ModelConfig:
    return ModelConfig(
        width=width,
        depth=depth,
        attention="shaped",
        mlp=mlp,
        mlp_ratio=mlp_ratio,
        heads=heads,
        out_proj=heads > 1,
        causal=causal,
        gamma=gamma,
        tau0=tau0,
    )


def _check_grid(
    name: str, values: Sequence[float], low: float, high: float, low_open: bool = True
) -> tuple[float, ...]:
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise ParameterError(name, f"{name} must be a sequence of numbers, got {values!r}")
    values = tuple(values)
    if not values:
        raise ParameterError(name, f"{name} must not be empty")
    for v in values:
        try:
            check_number(f"{name} values", v, low, high, low_open=low_open)
        except ParameterError as err:  # the parameter is the sequence
            raise ParameterError(name, str(err)) from None
    return tuple(sorted(set(float(v) for v in values)))


def _grid_edges(best: Candidate, gammas: Sequence[float], tau0s: Sequence[float]) -> tuple:
    """Notes for an advice at the smallest or largest gamma or tau0 of a grid of several
    values: the best value may lie outside the grid."""
    out = []
    for name, value, grid in (("gamma", best.gamma, gammas), ("tau0", best.tau0, tau0s)):
        if len(grid) < 2:
            continue
        if value == min(grid):
            out.append(f"{name} = {value:g} is the smallest of the grid; a smaller one may be "
                       f"better (extend --{name}s)")  # fmt: skip
        elif value == max(grid):
            out.append(f"{name} = {value:g} is the largest of the grid; a larger one may be "
                       f"better (extend --{name}s)")  # fmt: skip
    return tuple(out)


def _step_cost(configs: Sequence[ModelConfig], V0: Tensor, T: float, steps: int) -> tuple:
    """``(a, b)``: seconds per step of :func:`solve_batch` are about ``a + b paths`` at this m,
    from two short timed runs of the first configuration (P and 4P paths, P = 65536 / m^2
    clamped to [16, 256]; 2 steps each, after a warm-up)."""
    probe, m = [configs[0]], V0.shape[-1]
    P = min(max(65536 // m**2, 16), 256)
    solve_batch(probe, V0, P, T=T / steps, steps=1, seed=0)
    times = []
    for paths in (P, 4 * P):
        start = time.perf_counter()
        solve_batch(probe, V0, paths, T=2 * T / steps, steps=2, seed=0)
        times.append((time.perf_counter() - start) / 2)
    b = max((times[1] - times[0]) / (3 * P), times[1] / (4 * P) / 4)
    return max(times[0] - P * b, 0.0), b


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def design_checks(config: ModelConfig, tokens: int) -> DesignChecks:
    """[LW] depth threshold/regime/allocation and [BH] head size for ``config`` at m tokens."""
    report = head_size_report(config, tokens)
    return DesignChecks(
        depth_threshold=depth_threshold(config.width),
        regime=regime(config.depth, config.width),
        allocation=allocation(config.depth, config.width),
        key_dim=config.key_dim,
        head_dim=config.head_dim,
        head_size_ok=config.key_dim >= tokens - 1,
        bh_bottleneck=report.bottleneck,
        max_unbottlenecked_heads=report.max_unbottlenecked_heads,
    )


def advise(
    width: int,
    depth: int,
    tokens: int,
    *,
    heads: int = 1,
    mlp: str = "shaped_relu",
    mlp_ratio: int = 1,
    causal: bool = True,
    gammas: Sequence[float] = DEFAULT_GAMMAS,
    tau0s: Sequence[float] = DEFAULT_TAU0S,
    criteria: Criteria = Criteria(),
    spread_target: float = DEFAULT_SPREAD_TARGET,
    rho0: float = 0.2,
    samples: int = 4096,
    screen_samples: int = 128,
    steps: int | None = None,
    max_confirm: int = 8,
    seed: int = 0,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> Advice:
    """Advised (gamma, tau0) for a shaped Transformer of ``width``, ``depth`` and ``tokens``.

    Args:
        width, depth, tokens: n, d and m (T = d / n); ``tokens >= 2``.
        heads: attention heads (with W^O when > 1); mlp: ``"shaped_relu"`` or ``"none"``.
        mlp_ratio: the MLP's hidden width / n, as in the model trained (``ModelConfig.mlp_ratio``;
            it changes the SDE's diffusion, docs/theory.md#sde-mlp-ratio); 1 with ``mlp="none"``.
        causal: causal attention (default True: what ``shapedtx train`` trains, a causal
            byte-level LM; docs/theory.md#causal-sde).
        gammas, tau0s: the grid, gamma in (0, 1], tau0 in [1e-6, 1e6].
        criteria: safety thresholds; spread_target: see :func:`rank_key`.
        rho0: the input covariance is equicorrelated with correlation rho0 and V^{aa} = 1.
        samples: paths per confirmed candidate; screen_samples: paths per screened candidate.
        steps: Euler steps to T (default ``max(50, ceil(50 T))``: dt <= min(T/50, 0.02)), at
            most ``sde.time_grid.MAX_STEPS`` (1e7).
        max_confirm: at most this many candidates are confirmed.
        seed: seeds the screening (confirmation i uses ``seed + 1 + i``).
        max_tokens: the SDE is integrated with ``min(tokens, max_tokens)`` tokens (default
            :data:`DEFAULT_MAX_TOKENS`; None: all). The scores converge in m
            (:data:`DEFAULT_MAX_TOKENS` has the measurement); the design checks use ``tokens``.
        progress: tqdm bars over the SDE steps (None: when stderr is a terminal).
        log: called with the up-front cost estimate (a line of text) before the work starts.

    Returns:
        :class:`Advice`; its ``candidates`` are sorted by :func:`rank_key` (best first).
    """
    start = time.perf_counter()
    width = check_int("width", width, 1)
    depth = check_int("depth", depth, 1)
    tokens = check_int("tokens", tokens, 2)
    heads = check_int("heads", heads, 1)
    samples = check_int("samples", samples, 16)
    screen_samples = check_int("screen_samples", screen_samples, 16)
    max_confirm = check_int("max_confirm", max_confirm, 1)
    seed = check_int("seed", seed, 0)
    check_choice("mlp", mlp, ("shaped_relu", "none"))
    mlp_ratio = check_int("mlp_ratio", mlp_ratio, 1)
    if mlp == "none" and mlp_ratio != 1:
        raise ParameterError(
            "mlp_ratio", f"mlp_ratio has no effect with mlp='none': leave it at 1, got {mlp_ratio}"
        )
    check_bool("causal", causal)
    if max_tokens is not None:
        max_tokens = check_int("max_tokens", max_tokens, 2)
    sim_tokens = tokens if max_tokens is None else min(tokens, max_tokens)
    check_tokens(tokens, width)
    check_correlation(rho0, tokens)
    check_positive("spread_target", spread_target)
    gammas = _check_grid("gammas", gammas, 0.0, 1.0)
    tau0s = _check_grid("tau0s", tau0s, *TAU0_RANGE, low_open=False)
    T = depth / width
    if steps is None and 50 * T > MAX_STEPS:
        raise ParameterError(
            "depth",
            f"depth / width = {T:g} needs {50 * T:.3g} SDE steps (50 per unit time), more "
            f"than {MAX_STEPS:.0e}: lower depth",
        )
    if steps is None:
        steps = max(50, math.ceil(50 * T))
    steps = check_int("steps", steps, 1, MAX_STEPS)
    grid = [(g, t) for g in gammas for t in tau0s]
    configs = [_config(width, depth, heads, mlp, causal, g, t, mlp_ratio) for g, t in grid]
    V0 = equicorrelated(sim_tokens, rho0, 1.0)
    per_step, per_path_step = _step_cost(configs, V0, T, steps)
    estimate = steps * (2 * per_step + per_path_step * (len(configs) * screen_samples + samples))
    if log is not None:
        log(
            f"estimated cost: about {_duration(estimate)} (screen {len(configs)} candidates x "
            f"{screen_samples} paths, confirm {samples} paths per candidate, usually 1-2 of "
            f"at most {max_confirm}; {steps} steps at m = {sim_tokens}"
            + (f" of {tokens} tokens" if sim_tokens < tokens else "")
            + f"; {1e6 * per_path_step:.3g} us per path-step measured now)"
        )

    results = solve_batch(
        configs, V0, screen_samples, T=T, steps=steps, seed=seed, progress=progress
    )
    cands = []
    for (g, t), (VT, ex) in zip(grid, results, strict=True):
        meas = measure(V0, VT, ex, criteria)
        cands.append(
            Candidate(
                g, t, meas, meas.violations(criteria), "screen", meas.violations(criteria, 2),
                meas.unresolved(criteria),
            )
        )  # fmt: skip

    chosen = None
    for attempt in range(max_confirm):
        order = sorted(range(len(cands)), key=lambda i: rank_key(cands[i], spread_target))
        todo = [i for i in order if cands[i].plausible and cands[i].stage == "screen"]
        if not todo:
            break
        i = todo[0]
        old_key = rank_key(cands[i], spread_target)
        ((VT, ex),) = solve_batch(
            [configs[i]], V0, samples, T=T, steps=steps, seed=seed + 1 + attempt, progress=progress
        )
        meas = measure(V0, VT, ex, criteria)
        cands[i] = replace(
            cands[i],
            measurement=meas,
            violations=meas.violations(criteria),
            stage="confirmed",
            significant=meas.violations(criteria, 2),
            unresolved=meas.unresolved(criteria),
        )
        # accept when it still passes and keeps its tier (below/above the spread target)
        if cands[i].passed and rank_key(cands[i], spread_target)[0] == old_key[0]:
            chosen = i
            break
    order = sorted(range(len(cands)), key=lambda i: rank_key(cands[i], spread_target))
    if chosen is not None:
        order.remove(chosen)
        order.insert(0, chosen)
    ranked = tuple(cands[i] for i in order)
    notes = []
    if chosen is None:
        confirmed = sum(c.stage == "confirmed" for c in cands)
        notes.append(
            "no candidate passed: every one violates a criterion significantly at screening"
            if not confirmed
            else f"no candidate passed: {confirmed} confirmed with {samples} paths failed"
            + (f" (max_confirm={max_confirm})" if confirmed == max_confirm else "")
        )
    elif rank_key(cands[chosen], spread_target)[0] == 1:
        notes.append(f"no safe candidate has rho_spread <= {spread_target:g}: smallest spread")
    best = cands[chosen] if chosen is not None else None
    if best is not None and best.unresolved:
        notes.append(
            f"the advice is UNRESOLVED: it passes {len(best.unresolved)} criteria by less than "
            f"2 standard errors with {best.measurement.samples} paths ("
            + "; ".join(best.unresolved)
            + "); raise samples"
        )
    edges = _grid_edges(best, gammas, tau0s) if best is not None else ()
    notes += [f"at the edge of the grid: {e}" for e in edges]
    if sim_tokens < tokens:
        notes.append(
            f"the SDE was integrated with m = {sim_tokens} of the {tokens} tokens (max_tokens; "
            "the scores converge in m: benchmarks/RESULTS.md, advise at long contexts)"
        )
    design = design_checks(configs[0], tokens)
    if not design.head_size_ok:
        notes.append(
            f"head size {design.key_dim} < m - 1 = {tokens - 1}: heads cannot express "
            "every attention pattern [BH]"
        )
    return Advice(
        gamma=best.gamma if best else None,
        tau0=best.tau0 if best else None,
        T=T,
        width=width,
        depth=depth,
        tokens=tokens,
        heads=heads,
        mlp=mlp,
        causal=causal,
        rho0=float(rho0),
        criteria=criteria,
        spread_target=float(spread_target),
        candidates=ranked,
        design=design,
        steps=steps,
        screen_samples=screen_samples,
        samples=samples,
        seconds=time.perf_counter() - start,
        notes=tuple(notes),
        sim_tokens=sim_tokens,
        estimated_seconds=estimate,
        grid_edges=edges,
        mlp_ratio=mlp_ratio,
    )
