"""Do the advisor's init-time scores predict training?

Over a grid of shaped configurations (gamma x tau0 at several depths, plus at every depth the
configuration ``simulations.advise`` recommends and a rejected one, gamma 1 / tau0 0.2), this
computes every init-time score from the covariance SDE before training (the three safety
criteria and the ranking score ``rho_spread``, plus the naive ``gamma^2 T``), then trains a
causal byte-level LM (``shapedtx.train``) for each configuration on a learning-rate grid and
keeps the best final validation loss per configuration. ``report.py`` gives the Spearman rank
correlation between each score and the loss with a bootstrap interval over configurations,
and checks the advice: does the advised configuration (its lr tuned) train to within 2% of
the best configuration of the same depth, and does the rejected one train worse?

A study folder (``--out``) keeps the advice and the scores in ``scores.jsonl`` and its
finished runs in ``runs.jsonl`` (``simulations.studies.RunStore``). Each run is a task of the
shared study runner (``simulations.studies``: an embedded local Dask cluster of ``--workers``
processes, or ``--scheduler ADDRESS``) and trains in its scratch folder
``runs/d<depth>/g<gamma>_t<tau0>/lr<lr>/`` (git-ignored; ``lr`` as
``simulations.studies.lr_tag`` writes it; checkpoints, so an interrupted run resumes); a
second invocation skips finished work. ``--report`` rebuilds ``results.json`` and
``score_vs_loss.png`` from the stores without training (and, for the measured studies,
``results.md``).

The three measured studies (:data:`MEASURED`) live in this folder, ``width64_depth64/`` and
``long_horizon/``; in one of them the options change that study's setup, whose measured
values are the defaults there.

Usage::

    python examples/advise/predict.py --quick --out /tmp/predict     # < 1 min, tiny sizes
    python examples/advise/predict.py --report                        # the measured reports
    python examples/advise/predict.py --out /tmp/full --device cuda   # the full default study
    python examples/advise/predict.py --depths 16 --horizons 250 1000 5000   # long_horizon/
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shapedtx import ModelConfig, TrainConfig
from shapedtx.covariance import equicorrelated
from simulations.advise import Criteria, advise, measure, solve_batch
from simulations.studies import (
    RunStore,
    Study,
    import_beside,
    lr_tag,
    parse_study_args,
    study_main,
    study_parser,
)
from simulations.training_runs import TrainingRun

HERE = Path(__file__).parent
SCORES = ("rho_spread", "collapse", "exploded", "norm", "gamma2T")
RANKING_SCORE = "rho_spread"
REJECTED = (1.0, 0.2)
SCORE_STORE = "scores.jsonl"
"""The init-time work of a study folder: ``advice/d<depth>`` (the advisor's gamma, tau0, T)
and ``scores/d<depth>/g<gamma>_t<tau0>`` (one configuration's SDE scores)."""


@dataclass(frozen=True)
class Setup:
    """Sizes and grids of one prediction study."""

    width: int = 64
    depths: tuple[int, ...] = (16, 32, 64)
    gammas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.35, 0.6, 0.9)
    tau0s: tuple[float, ...] = (0.25, 1.0)
    lrs: tuple[float, ...] = (3e-3, 1e-2, 3e-2)
    heads: int = 4
    steps: int = 1000
    horizons: tuple[int, ...] = ()  # WSD runs with these horizons (steps = the longest)
    batch_size: int = 16
    seq_len: int = 64
    max_bytes: int = 8_000_000
    sde_tokens: int = 8
    sde_samples: int = 2048
    advise_samples: int = 4096
    seed: int = 0


QUICK = Setup(
    width=16,
    depths=(2, 4),
    gammas=(0.1, 0.5, 0.9),
    tau0s=(0.5, 1.0),
    lrs=(3e-3, 1e-2),
    heads=2,
    steps=20,
    batch_size=4,
    seq_len=16,
    max_bytes=200_000,
    sde_tokens=4,
    sde_samples=128,
    advise_samples=256,
)

MEASURED: dict[str, Setup] = {
    ".": Setup(width=32, depths=(16, 32), lrs=(3e-3, 1e-2), steps=150),
    "long_horizon": Setup(
        width=32, depths=(16,), lrs=(3e-3, 1e-2, 3e-2), horizons=(250, 500, 1000, 2000, 5000)
    ),
    "width64_depth64": Setup(
        width=64, depths=(64,), gammas=(0.025, 0.05, 0.1, 0.2, 0.35, 0.6), steps=300
    ),
}
"""The studies run and committed: their folder (relative to this one) and setup."""


def measured(out: Path) -> str | None:
    """The name in :data:`MEASURED` of the study folder ``out``, or None."""
    for name in MEASURED:
        if (HERE / name).resolve() == Path(out).resolve():
            return name
    return None


def model_config(s: Setup, depth: int, gamma: float, tau0: float) -> ModelConfig:
    return ModelConfig(
        width=s.width,
        depth=depth,
        attention="shaped",
        mlp="shaped_relu",
        heads=s.heads,
        out_proj=s.heads > 1,
        causal=True,
        gamma=gamma,
        tau0=tau0,
    )


def config_key(depth: int, gamma: float, tau0: float) -> str:
    """A configuration's key: ``d<depth>/g<gamma>_t<tau0>``."""
    return f"d{depth}/g{gamma:g}_t{tau0:g}"


def stored_advice(scores: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Depth -> the advice stored in ``scores`` (the records of ``scores.jsonl``)."""
    return {
        int(key.removeprefix("advice/d")): value
        for key, value in scores.items()
        if key.startswith("advice/")
    }


def advise_depths(s: Setup, store: RunStore) -> dict[int, dict[str, Any]]:
    """The advice at every depth of ``s``, computed and stored where missing."""
    have = stored_advice(dict(store.records()))
    for d in s.depths:
        if d not in have:
            a = advise(s.width, d, s.sde_tokens, heads=s.heads, samples=s.advise_samples,
                       seed=s.seed)  # fmt: skip
            have[d] = {"gamma": a.gamma, "tau0": a.tau0, "T": a.T, "seconds": a.seconds}
            store.append(f"advice/d{d}", have[d])
    return have


def configurations(
    s: Setup, advice: dict[int, dict[str, Any]]
) -> list[tuple[int, float, float, str]]:
    """(depth, gamma, tau0, role) for the hand grid, the advice and the rejected config, in
    report order (the grid, then each depth's advised and rejected configuration)."""
    rows = [(d, g, t, "grid") for d in s.depths for g in s.gammas for t in s.tau0s]
    for d in s.depths:
        adv = advice.get(d)
        if adv is not None and adv["gamma"] is not None:
            key = (d, adv["gamma"], adv["tau0"])
            rows = [r for r in rows if r[:3] != key] + [(*key, "advised")]
        rows = [r for r in rows if r[:3] != (d, *REJECTED)] + [(d, *REJECTED, "rejected")]
    return rows


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def sde_scores(s: Setup, store: RunStore, depth: int, gamma: float, tau0: float) -> None:
    """Compute and store the init-time scores of one configuration from the causal SDE, at
    T = depth / width (``scores/<config_key>`` in ``store``), unless stored."""
    key = f"scores/{config_key(depth, gamma, tau0)}"
    if key in store:
        return
    V0 = equicorrelated(s.sde_tokens, 0.2)
    T = depth / s.width
    config = model_config(s, depth, gamma, tau0)  # causal, as the trained models
    ((VT, ex),) = solve_batch([config], V0, s.sde_samples, T=T, steps=max(50, math.ceil(50 * T)),
                              seed=s.seed)  # fmt: skip
    m = measure(V0, VT, ex, Criteria())
    store.append(
        key,
        {
            "depth": depth,
            "gamma": gamma,
            "tau0": tau0,
            "T": T,
            "sde_causal": config.causal,
            "samples": s.sde_samples,
            "violations": list(m.violations(Criteria())),
            "rho_spread": m.rho_spread,
            "rho_spread_se": m.rho_spread_se,
            "collapse": m.collapse,
            "exploded": m.exploded,
            "norm": _finite(m.norm),
            "gamma2T": gamma**2 * T,
        },
    )


def training_run(s: Setup, out: Path, row: tuple[int, float, float, str], lr: float,
                 device: str = "cpu", data: str | None = None,
                 compile: bool = False) -> TrainingRun:  # fmt: skip
    """One configuration at one lr, in its scratch folder ``runs/<config_key>/lr<lr>/``."""
    depth, gamma, tau0, _ = row
    horizons = s.horizons or (s.steps,)
    steps = max(horizons)
    if s.horizons:  # every shorter horizon's cooldown start must fall on a log row
        starts = [h - max(1, round(0.2 * h)) for h in horizons if h != steps]
        log_every = eval_every = math.gcd(*starts) if starts else max(1, steps // 20)
    else:
        log_every = max(1, steps // 20)
        eval_every = log_every * 5 if steps >= 100 else log_every
    tc = TrainConfig(
        steps=steps,
        batch_size=s.batch_size,
        seq_len=s.seq_len,
        lr=lr,
        warmup_steps=max(1, min(50, min(horizons) // 10) if s.horizons else steps // 20),
        schedule="wsd" if s.horizons else "cosine",
        log_interval=log_every,
        eval_interval=eval_every,
        checkpoint_interval=eval_every,  # an interrupted run resumes from here
        seed=s.seed,
    )
    return TrainingRun(
        model=model_config(s, depth, gamma, tau0),
        train=tc,
        horizons=horizons,
        folder=str(out / "runs" / config_key(depth, gamma, tau0) / lr_tag(lr)),
        max_bytes=s.max_bytes,
        data=data,
        device=device,
        compile=compile,
        labels={"depth": depth, "gamma": gamma, "tau0": tau0, "lr": lr},
    )


def is_wsd(result: dict[str, Any]) -> bool:
    """Whether a stored run trained the warmup-stable-decay schedule (a per-horizon study's
    run); the flat results of the first runs are cosine runs."""
    return result.get("train_config", {}).get("train.schedule") == "wsd"


def check_kind(s: Setup, out: Path, results: list[dict[str, Any]]) -> None:
    """A ValueError if ``out`` holds runs of the other kind (per-horizon WSD runs in a
    fixed-horizon study or the reverse): their keys would be taken for this study's runs."""
    other = [r for r in results if is_wsd(r) != bool(s.horizons)]
    if other:
        kind = "fixed-horizon" if s.horizons else "per-horizon (--horizons)"
        raise ValueError(f"--out {out} holds {len(other)} runs of a {kind} study; use another")


def default_out(s: Setup) -> Path:
    """Where a study's files go by default: this folder for the fixed-horizon study, its
    ``long_horizon/`` subfolder for the per-horizon (WSD) one."""
    return HERE / "long_horizon" if s.horizons else HERE


def study(s: Setup, out: Path, device: str = "cpu", data: str | None = None,
          compile: bool = False) -> Study:  # fmt: skip
    """The study for the shared runner (``simulations.studies``): every configuration of
    :func:`configurations` at every lr, the report of ``report.py``."""
    scores = RunStore(out / SCORE_STORE)

    def runs(results: list[dict[str, Any]]) -> list[TrainingRun]:
        check_kind(s, out, results)
        rows = configurations(s, stored_advice(dict(scores.records())))
        return [training_run(s, out, row, lr, device, data, compile) for row in rows
                for lr in s.lrs]  # fmt: skip

    def write_report(results: list[dict[str, Any]]) -> Any:
        check_kind(s, out, results)
        res = import_beside(HERE, "report").report(s, out, results, dict(scores.records()))
        print(json.dumps({k: res.get(k) for k in ("spearman", "best_predictor", "advice_check")},
                         indent=1))  # fmt: skip
        return res

    return Study(
        out,
        runs,
        write_report,
        describe=lambda key, r: f"d{r['depth']} g{r['gamma']:g} t{r['tau0']:g} lr {r['lr']:g}",
    )


SETUP_OPTIONS = ("width", "depths", "gammas", "tau0s", "lrs", "steps", "horizons")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = study_parser(
        __doc__.splitlines()[0],
        out_help="study folder (default: beside this script; long_horizon/ there with "
        "--horizons, so the fixed-horizon study is kept)",
    )
    p.set_defaults(workers=2)
    p.add_argument("--quick", action="store_true", help="tiny sizes (< 1 min)")
    p.add_argument("--width", type=int)
    p.add_argument("--depths", type=int, nargs="+")
    p.add_argument("--gammas", type=float, nargs="+")
    p.add_argument("--tau0s", type=float, nargs="+")
    p.add_argument("--lrs", type=float, nargs="+")
    p.add_argument("--steps", type=int)
    p.add_argument(
        "--horizons", type=int, nargs="+", help="WSD runs reporting every horizon (steps)"
    )
    return parse_study_args(p, argv)


def setup_of(args: argparse.Namespace) -> tuple[Setup, Path]:
    """The setup and folder of the command line: ``--out`` (default :func:`default_out`);
    its measured setup (:data:`MEASURED`) or the default (``--quick``: :data:`QUICK`) changed
    by the options given."""
    changes = {
        k: (tuple(v) if isinstance(v, list) else v)
        for k in SETUP_OPTIONS
        if (v := getattr(args, k)) is not None
    }
    base = QUICK if args.quick else Setup()
    out = args.out if args.out is not None else default_out(replace(base, **changes))
    name = None if args.quick else measured(out)
    if name is not None:
        base = MEASURED[name]
    return replace(base, **changes), out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    s, out = setup_of(args)
    scores = RunStore(out / SCORE_STORE)
    advice = advise_depths(s, scores)
    if not (args.report or args.plan):
        for depth, gamma, tau0, _ in configurations(s, advice):
            sde_scores(s, scores, depth, gamma, tau0)
    return study_main(study(s, out, args.device, args.data, args.compile), args,
                      name="predict.py")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
