"""Training claims at long horizons: validation loss against training horizon, per model/depth.

Causal byte-level LMs on the default corpus (Python standard library sources, no download):
shaped Transformers (no LayerNorm) at the gamma that ``advise`` gives for the depth, at the
short study's best gamma and at a larger one; the GPT-2 pre-LN block; the no-norm unit-residual
block with GPT-2 init; and He & Hofmann's simplified blocks where the presets exist. Width 64,
4 heads with W^O, MLP hidden 4n, context 64, batch 32.

Every run uses the warmup-stable-decay schedule (``TrainConfig(schedule="wsd")``): one run per
(model, depth, peak lr, seed) trains to the longest horizon and each shorter horizon is a
cooldown branched from a snapshot of it (``shapedtx.training.train_horizons``), so every
horizon's loss comes from a schedule that ends at that horizon. The check that WSD loses
nothing against the usual schedule (``--check``, also planned once the first depth's grid is
complete): for the first model at its best lr of ``check_horizon`` steps, 3 seeds of a full
cosine run of that horizon against 3 seeds of a WSD run of that horizon alone (``wsd-check``;
bitwise the branch of the same horizon in the long run, which the report verifies on seed 0).

Runs are tasks of the project's Dask machinery through the shared study runner
(``simulations.studies``: embedded local cluster, or ``--scheduler ADDRESS``); each trains in
its scratch folder ``runs/<model>/d<depth>/lr<lr>_s<seed>/`` (git-ignored), resumes from its
checkpoints if interrupted (interrupted runs go first), and once all its horizons have ended
is appended to ``runs.jsonl``, the study's record of its finished runs. The plan is rebuilt
from the finished runs: the grid centres; 3 seeds for shaped (advise) and pre-LN, whose loss
ratio the report states with its spread, once each is tuned; the rest of the lr grid (3 values
spaced by 3x, extended one point at a time, up to two per side, while the best lr of any
horizon is at an edge); then 3 seeds at the best lr of the longest horizon for the two best
models per depth; then the check. Each phase covers every depth before the next (see
``plan``). ``--refine`` adds the lrs half a step (3^(1/2)) on each side of a tuned model's best
lr at the longest horizon before its seeds (where a goal margin is finer than the 3x grid).
``--report`` writes ``results.md``, ``results.json``, ``tables.md`` and ``figures/`` from
``runs.jsonl`` (``report.py``); none of them is edited by hand. Writing the
committed report also rebuilds the two committed reports that quote its store (the ablation's
and the transfer study's: ``rebuild_quoting_reports``).

Usage::

    python examples/long_horizon/study.py --workers 1          # the CPU study (resumable)
    python examples/long_horizon/study.py --max-runs 2         # stop after 2 new runs
    python examples/long_horizon/study.py --ablation-long --depths 64 --lrs 0.00333 0.01
                                              # only the planned runs at these peak lrs
    python examples/long_horizon/study.py --models "pre-LN depth-muP" --depths 16 --refine
                                              # half steps around its best lr, then seeds
    python examples/long_horizon/study.py --ablation-long --models "..." --depths 16 \\
        --add-lrs 0.00577                     # seed 0 at this half step first, planned or not
    python examples/long_horizon/study.py --quick --out /tmp/lh   # a few minutes
    python examples/long_horizon/study.py --report             # only the report
    python examples/long_horizon/study.py --gpu --device cuda --compile --workers 6
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shapedtx import PRESETS, ModelConfig, TrainConfig, preset
from shapedtx.files import write_json
from simulations.studies import (
    STORE,
    RunStore,
    Study,
    import_beside,
    lr_tag,
    parse_study_args,
    report_setup,
    study_main,
    study_parser,
)
from simulations.training_runs import TrainingRun, horizon_loss

HERE = Path(__file__).parent

_BIASES: dict[str, Any] = {
    "name": "shaped",
    "gamma": "advise",
    "mlp_slopes": "channel",
    "attention_gains": "trainable",
    "temperature": "trainable",
    "bias": True,
}
"""The ablation's (l), and the base of the variants (m), (n) that change how it trains."""

MODELS: dict[str, dict[str, Any]] = {
    "shaped advise": {"name": "shaped", "gamma": "advise"},
    "pre-LN (GPT-2)": {"name": "pre_ln"},
    "SAS-P": {"name": "sas_p"},
    "shaped g=0.1": {"name": "shaped", "gamma": 0.1},
    "no-norm gpt2": {"name": "no_norm", "init": "gpt2"},
    "SAS-P no norm": {"name": "sas_p_no_norm"},
    "shaped g=0.35": {"name": "shaped", "gamma": 2**-1.5},
    # the transfer study's strongest pre-LN at 1,000 steps: its recipe (branch multiplier
    # (depth / 8)^(-1/2), the lr tuned at width 64 and depth 8 and transferred by its rule)
    "pre-LN depth-muP": {"name": "pre_ln_depth_mup", "base_depth": 8, "lr_proxy": (64, 8)},
    # the ablation (--ablation): the shaped model at advise's gamma and tau0, one part changed
    "shaped advise, relu": {"name": "shaped", "gamma": "advise", "mlp": "relu"},
    "shaped advise, gelu": {"name": "shaped", "gamma": "advise", "mlp": "gelu"},
    "shaped advise, slopes": {"name": "shaped", "gamma": "advise", "mlp_slopes": "channel"},
    "shaped advise, slopes+attn": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
    },
    "shaped advise, slopes+attn+tau": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "temperature": "trainable",
    },
    "shaped advise, slopes+attn+res": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "residual_gains": "trainable",
    },
    # every baseline that leads at 5,000 steps normalises the readout's input; the blocks,
    # and so the covariance the SDE describes, are unchanged at initialisation
    "shaped advise, slopes+attn+final LN": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "final_norm": True,
    },
    # (g) shrank its branch weights 6-14x and (h)'s stream blew up, suggesting matrices that
    # outgrow the fixed residual at the lr the rest wants. muP's Adam rule from a width-16
    # proxy trains the blocks' and the readout's matrices at 1/4 of the base lr (embeddings
    # and gains at the base lr)
    "shaped advise, slopes+attn, muP lr": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "lr_proxy": (16, 16),
        "lr_centre": 3e-2,
    },
    # (j)-(p): questions the second stage raised, run at depth 16 to 5,000 steps directly
    # (--ablation-long --depths 16 --models ...), not screened.
    # per block the covariance moves by O(gamma^2) (docs/theory.md#sde), so depth * gamma^2
    # is the whole network's shaping: advise's gamma gives 0.36 at depth 16 and 0.16 at depth
    # 64, where (f) is level with depth-muP pre-LN; this is (f) with depth 64's 0.16 at depth
    # 16 (gamma 0.1, for depth 16 only: at depth 64 advise gives (f) this depth * gamma^2)
    "shaped g=0.1, slopes+attn+tau": {
        "name": "shaped",
        "gamma": 0.1,
        "tau0": 0.25,
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "temperature": "trainable",
    },
    # every model that leads (f) at depth 16 and 5,000 steps normalises each branch's input
    # and the readout's, and no normalisation-free model measured comes within 2% of them;
    # (f) with the pre-norm placement (RMSNorm: no centring, so the attention's centring
    # stays the shape's) is no longer the shaped Transformer at initialisation
    "shaped advise, slopes+attn+tau, pre-RMSNorm": {
        "name": "shaped",
        "gamma": "advise",
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "temperature": "trainable",
        "norm": "pre",
        "norm_kind": "rms",
        "final_norm": True,
    },
    # depth-muP pre-LN's linear maps carry biases, the shaped model's none: zero at
    # initialisation, so (l) is the shaped Transformer at initialisation (in law)
    "shaped advise, slopes+attn+tau, biases": _BIASES,
    # (m): (l) before its cooldown is 3-6% behind depth-muP pre-LN at every seed, 0.8-2.1%
    # after it, and its trainable gains and slopes shrink to 0.14-0.2 (depth-muP's LayerNorm
    # gains stay near 1; so do (k)'s, 1.4% behind before its cooldown): Adam moves each by
    # about its lr per step, 5-7% of itself at lr 0.01, a noise only the cooldown removes.
    # (l) with its block vectors (gains, slopes, biases) at 1/3 of the base lr: the same
    # network at initialisation, trained otherwise alike (at 1/10, stopped at step 1,900, it
    # was 18% behind (l) at step 1,500: its gains had barely moved)
    "shaped advise, slopes+attn+tau, biases, vectors lr/3": {**_BIASES, "vector_lr_factor": 1 / 3},
    # (n): the lower lr slows the gains' first descent, which is where (l) gains most (its MLP
    # is a ReLU by step 1,000); log gains move by a share of themselves at every size: as fast
    # as (l)'s at first, 1% of themselves per step at lr 0.01 once shrunk
    "shaped advise, slopes+attn+tau, biases, log gains": {**_BIASES, "log_gains": True},
    # (o), (p): neither removes (l)'s gap, so which part of the shape does it come from? (l)
    # with standard softmax attention (logits q k^T / sqrt(n_k), no identity, no centring),
    # and (l) with depth-muP pre-LN's GELU MLP in place of the trainable slopes (which
    # training turns into a ReLU, kappa 0.55); neither is the shaped Transformer at
    # initialisation any more
    "shaped advise, softmax attention, slopes, biases": {
        "name": "shaped",
        "gamma": "advise",
        "attention": "softmax",
        "mlp_slopes": "channel",
        "bias": True,
    },
    "shaped advise, attn+tau, GELU, biases": {
        "name": "shaped",
        "gamma": "advise",
        "mlp": "gelu",
        "attention_gains": "trainable",
        "temperature": "trainable",
        "bias": True,
    },
    # (q), (r): the part of the gap no change to the model removed lives in the stable phase:
    # before the cooldown (l) and (m) are 3.8-4.1% behind depth-muP pre-LN, after it 0.7-0.8%
    # (seed 0), and only the normalised (k) and (p) keep pace before it (1.4%). A
    # normalisation-free network has no scale-invariant weights whose growth lowers their
    # effective lr, so its noise at the peak lr is left for the cooldown to remove: (m) and
    # the baseline each with twice the cooldown (40% of every horizon), the recipe otherwise
    # alike; both are measured, so the ratio stays against a baseline trained the same way
    "shaped advise, slopes+attn+tau, biases, vectors lr/3, cooldown 40%": {
        **_BIASES,
        "vector_lr_factor": 1 / 3,
        "cooldown_fraction": 0.4,
    },
    "pre-LN depth-muP, cooldown 40%": {
        "name": "pre_ln_depth_mup",
        "base_depth": 8,
        "lr_proxy": (64, 8),
        "cooldown_fraction": 0.4,
    },
}
"""Study model -> preset and overrides ("advise": the gamma and tau0 of ``simulations.advise``
for the depth; ``lr_proxy``: the (width, depth) at which the lr is tuned, ``TrainConfig``'s
``lr_proxy_width`` and ``lr_proxy_depth``; ``lr_centre``: the lr grid's centre at depth 16 if
not the preset's; ``vector_lr_factor``: ``TrainConfig``'s; ``cooldown_fraction``: the WSD
cooldown's share of each horizon if not the setup's), in the order their runs are planned."""

_STUDY_KEYS = ("lr_proxy", "lr_centre", "vector_lr_factor", "cooldown_fraction")
"""Keys of a :data:`MODELS` entry that set its training, not its ``ModelConfig``."""

LONG_HORIZON_MODELS = tuple(MODELS)[:8]
ABLATION_MODELS = tuple(MODELS)[8:16]  # (j)-(p) were not screened: see MODELS
BASELINES = ("pre-LN (GPT-2)", "pre-LN depth-muP", "SAS-P")
"""The baselines a model is measured against: at each horizon the lowest of these (its mean
over seeds at its best lr) is the best baseline."""

LR_CENTRE: dict[str, float] = {
    "shaped": 1e-2,
    "pre_ln": 1e-2 / 3,
    "no_norm": 1e-2 / 3,
    "sas_p": 1e-2 / 3,
    "sas_p_no_norm": 1e-2 / 3,
    "pre_ln_depth_mup": 1e-2,  # the transfer study's best base lr at depth 16: 2^-7
}
"""Centre of each preset's lr grid at depth 16 (the best lr at 300 steps of the short study
and of an independent trainer); the grid is centre * 3^k, k = -1, 0, 1, one 3x lower at depth
64 (the short study's best lr fell 3-9x from depth 16 to 64), except for a model with an
``lr_proxy``, whose base lr its transfer rule scales to the depth and width."""


@dataclass(frozen=True)
class Setup:
    """Sizes, horizons and grids of one study (the CPU default or ``--quick``)."""

    width: int
    depths: tuple[int, ...]
    horizons: dict[int, tuple[int, ...]]  # depth -> horizons (steps)
    batch_size: int
    seq_len: int
    warmup_steps: int
    cooldown_fraction: float
    log_interval: int
    eval_interval: int
    eval_batches: int
    max_bytes: int
    models: tuple[str, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    best_models: int = 2
    # the pair whose loss ratio the report states with its spread: seeded as soon as each is
    # tuned (its best lr of every horizon inside its grid), before other models' grid edges
    compared: tuple[str, ...] = ("shaped advise", "pre-LN (GPT-2)")
    max_extensions: int = 2  # grid points per side beyond the 3 centred ones
    advise_tokens: int = 8
    check_horizon: int = 1000
    lr_scale: float = 1.0  # the lr grid's centre is LR_CENTRE * lr_scale
    checkpoint_interval: int | None = None  # default: eval_interval
    check: bool = True  # plan the WSD-vs-cosine check once the first depth is complete
    # once a model's 3x grid is tuned, its half steps (lr x 3^(+-1/2)) around the best lr of
    # the longest horizon: the 3x grid places an optimum only within a factor 3^(1/2)
    refine: bool = False
    ablation: bool = False  # report with ``examples/ablation/report.py``


DEFAULT = Setup(
    width=64,
    depths=(16, 64),
    horizons={16: (250, 500, 1000, 2000, 5000), 64: (250, 500, 1000, 2000)},
    batch_size=32,
    seq_len=64,
    warmup_steps=50,
    cooldown_fraction=0.2,
    log_interval=50,
    eval_interval=250,
    eval_batches=16,
    max_bytes=8_000_000,
    models=LONG_HORIZON_MODELS,
)
ABLATION = replace(
    DEFAULT,
    depths=(16,),
    horizons={16: (250, 500, 1000, 2000), 64: (250, 500, 1000, 2000)},
    models=ABLATION_MODELS,
    compared=(),
    best_models=0,
    check=False,
    ablation=True,
)
"""The ablation's screen (``--ablation``, folder ``../ablation``): every variant of the shaped
model at depth 16 to 2,000 steps on the long-horizon recipe; no seeds and no check (the best
two go on to 5,000 steps at depth 16 and 2,000 at depth 64)."""
ABLATION_LONG = replace(
    ABLATION,
    depths=DEFAULT.depths,
    horizons=DEFAULT.horizons,
    models=("shaped advise, slopes+attn", "shaped advise, slopes+attn+tau"),
    best_models=2,
)
"""The ablation's second stage (``--ablation-long``, folder ``../ablation/long``): the
screen's best two variants at the long-horizon study's horizons (5,000 steps at depth 16,
2,000 at depth 64), their lr grids, and 3 seeds at the best lr of the longest horizon."""
QUICK = Setup(
    width=16,
    depths=(2, 4),
    horizons={2: (20, 40), 4: (20, 40)},
    batch_size=4,
    seq_len=16,
    warmup_steps=4,
    cooldown_fraction=0.25,
    log_interval=5,
    eval_interval=10,
    eval_batches=2,
    max_bytes=200_000,
    models=("shaped advise", "pre-LN (GPT-2)"),
    seeds=(0, 1),
    best_models=1,
    max_extensions=0,
    check_horizon=20,
)
GPU = Setup(
    width=256,
    depths=(16,),
    horizons={16: (500, 2000, 5000, 20000)},
    batch_size=32,
    seq_len=64,
    warmup_steps=200,
    cooldown_fraction=0.2,
    log_interval=100,
    eval_interval=500,
    eval_batches=16,
    max_bytes=32_000_000,
    models=LONG_HORIZON_MODELS,
    # Adam's best lr falls with width (roughly as 1/width for the hidden matrices): one grid
    # step (3x) below the width-64 centres for 4x the width
    lr_scale=1 / 3,
    checkpoint_interval=2500,
)
"""The GPU-sized study (``--gpu``, folder ``gpu/``): width 256, 20,000 steps (1.4 epochs of a
32 MB corpus), 3 lrs per model; for a lent GPU, with ``--device cuda --compile``."""


def available_models(setup: Setup) -> tuple[str, ...]:
    """The study's models whose preset exists in this version of shapedtx."""
    return tuple(m for m in setup.models if MODELS[m]["name"] in PRESETS)


def advised(setup: Setup, depth: int, out: Path) -> dict[str, float]:
    """gamma and tau0 of ``simulations.advise`` for the depth (causal, 4 heads), cached in
    ``out/advice.json``."""
    path = out / "advice.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    key = f"w{setup.width}_d{depth}_m{setup.advise_tokens}"
    if key not in cache:
        from simulations import advise

        a = advise(setup.width, depth, setup.advise_tokens, heads=4, causal=True)
        if a.gamma is None:
            raise RuntimeError(f"advise found no safe gamma at width {setup.width}, depth {depth}")
        cache[key] = {"gamma": a.gamma, "tau0": a.tau0, "T": a.T, "tokens": setup.advise_tokens}
        write_json(cache, path)
    return cache[key]


def model_config(setup: Setup, model: str, depth: int, out: Path) -> ModelConfig:
    fields = {k: v for k, v in MODELS[model].items() if k not in _STUDY_KEYS}
    name = fields.pop("name")
    if fields.get("gamma") == "advise":
        advice = advised(setup, depth, out)
        fields.update(gamma=advice["gamma"], tau0=advice["tau0"])
    sizes = {"width": setup.width, "depth": depth, "heads": 4, "mlp_ratio": 4, "causal": True}
    return preset(name, **{**sizes, **fields})


def train_config(
    setup: Setup,
    lr: float,
    seed: int,
    schedule: str = "wsd",
    lr_proxy: tuple[int, int] = (0, 0),
    vector_lr_factor: float = 1.0,
    cooldown_fraction: float | None = None,
) -> TrainConfig:
    return TrainConfig(
        steps=max(max(h) for h in setup.horizons.values()),
        batch_size=setup.batch_size,
        seq_len=setup.seq_len,
        lr=lr,
        min_lr_ratio=0.0,
        warmup_steps=setup.warmup_steps,
        schedule=schedule,  # type: ignore[arg-type]
        cooldown_fraction=cooldown_fraction or setup.cooldown_fraction,
        log_interval=setup.log_interval,
        eval_interval=setup.eval_interval,
        eval_batches=setup.eval_batches,
        metrics_batch=8,
        checkpoint_interval=setup.checkpoint_interval or setup.eval_interval,
        seed=seed,
        lr_proxy_width=lr_proxy[0],
        lr_proxy_depth=lr_proxy[1],
        vector_lr_factor=vector_lr_factor,
    )


def lr_grid(setup: Setup, model: str, depth: int, k: int) -> float:
    centre = MODELS[model].get("lr_centre", LR_CENTRE[MODELS[model]["name"]])
    if "lr_proxy" not in MODELS[model]:  # with a proxy, its rule transfers the lr to the size
        centre *= setup.lr_scale / (3.0 if depth > 16 else 1.0)
    return float(f"{centre * 3.0**k:.3g}")


def slug(model: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in model).strip("_")


def make_run(
    setup: Setup,
    out: Path,
    model: str,
    depth: int,
    k: int,
    seed: int,
    schedule: str = "wsd",
    device: str = "cpu",
    compile: bool = False,
    data: str | None = None,
) -> TrainingRun:
    lr = lr_grid(setup, model, depth, k)
    trained = "cosine" if schedule == "cosine" else "wsd"  # "wsd-check": WSD, one horizon
    horizons = setup.horizons[depth] if schedule == "wsd" else (setup.check_horizon,)
    tag = "" if schedule == "wsd" else f"_{trained}{setup.check_horizon}"
    return TrainingRun(
        model=model_config(setup, model, depth, out),
        train=train_config(
            setup,
            lr,
            seed,
            trained,
            MODELS[model].get("lr_proxy", (0, 0)),
            MODELS[model].get("vector_lr_factor", 1.0),
            MODELS[model].get("cooldown_fraction"),
        ),
        horizons=tuple(horizons),
        folder=str(out / "runs" / slug(model) / f"d{depth}" / f"{lr_tag(lr)}_s{seed}{tag}"),
        max_bytes=setup.max_bytes,
        data=data,
        device=device,
        compile=compile,
        labels={
            "model_name": model,
            "depth": depth,
            "lr": lr,
            "k": k,
            "seed": seed,
            "schedule": schedule,
        },
    )


def load_results(out: Path) -> list[dict[str, Any]]:
    """The study's finished runs: ``out/runs.jsonl`` after taking in any finished run's
    ``result.json`` under ``out/runs/`` not stored yet (``simulations.studies.RunStore``)."""
    return RunStore(out / STORE).finished()


def best_k(runs: list[dict[str, Any]], horizon: int) -> int | None:
    """The grid index of the lowest seed-0 validation loss at ``horizon`` (None: all diverged)."""
    ok = [
        r
        for r in runs
        if r["seed"] == 0 and r["schedule"] == "wsd" and math.isfinite(horizon_loss(r, horizon))
    ]
    return min(ok, key=lambda r: horizon_loss(r, horizon))["k"] if ok else None


def _beyond_a_worse_centre(runs: list[dict[str, Any]], horizons: tuple[int, ...]) -> set[int]:
    """The base grid's edges (-1, 1) not needed: the one beyond the centre (k = 0) when the
    other edge is lower than the centre at every horizon (seed 0, WSD; a diverged horizon is
    worse), so every horizon's optimum lies on the other side with the centre as its bracket."""
    loss = {
        r["k"]: [horizon_loss(r, h) for h in horizons]
        for r in runs
        if r["seed"] == 0 and r["schedule"] == "wsd" and r["k"] in (-1, 0, 1)
    }
    if 0 not in loss:
        return set()
    return {
        -edge
        for edge in (-1, 1)
        if edge in loss and all(e < c for e, c in zip(loss[edge], loss[0], strict=True))
    }


def half_steps(runs: list[dict[str, Any]], ks: list[float], horizon: int) -> list[float]:
    """The grid indices half a step (an lr factor 3^(1/2)) on each side of the best seed-0 lr
    at ``horizon`` not run yet (``ks``: the indices run), inside the grid's ends; none once
    the best lr has a neighbour half a step away on each side."""
    k = best_k(runs, horizon)
    if k is None:
        return []
    return [k + d for d in (-0.5, 0.5) if ks[0] <= k + d <= ks[-1] and k + d not in ks]


def plan(setup: Setup, results: list[dict[str, Any]]) -> list[tuple[str, int, int, int, str]]:
    """(model, depth, k, seed, schedule) still needed, in priority order, each phase over every
    depth (in ``setup.depths`` order) before the next: the grid centres of every model; the
    seeds of each ``setup.compared`` model already tuned (at its best lr of the longest
    horizon); the grid edges and extensions (not the base grid's edge beyond a centre that
    is worse than the other edge at every horizon: :func:`_beyond_a_worse_centre`; with
    ``setup.refine``, then the :func:`half_steps` around the best lr); seeds at
    the best lr of the longest horizon for the best models of each complete depth (ranked by
    seed 0; a model with a diverged seed at that lr is not among them, so the next one gets
    the seeds); then the check. So each depth has a first answer for every model before any
    depth's grid is refined."""
    done = {(r["model_name"], r["depth"], r["k"], r["seed"], r["schedule"]) for r in results}
    models = available_models(setup)
    centres: list[tuple[str, int, int, int, str]] = []
    seeded: list[tuple[str, int, int, int, str]] = []
    grid: list[tuple[str, int, int, int, str]] = []
    complete_depths = []
    for depth in setup.depths:
        centres += [(m, depth, 0, 0, "wsd") for m in models if (m, depth, 0, 0, "wsd") not in done]
        edges_before = len(grid)
        for m in models:
            runs = [r for r in results if (r["model_name"], r["depth"]) == (m, depth)]
            base = {-1, 0, 1} - _beyond_a_worse_centre(runs, setup.horizons[depth])
            ks = sorted(base | {r["k"] for r in runs if r["seed"] == 0})
            missing = [(m, depth, k, 0, "wsd") for k in ks if (m, depth, k, 0, "wsd") not in done]
            if missing:
                grid += [j for j in missing if j not in centres]
                continue
            bests = {best_k(runs, h) for h in setup.horizons[depth]} - {None}
            lo, hi = min(ks), max(ks)
            edges = []
            if lo in bests and lo > -1 - setup.max_extensions:
                edges.append((m, depth, lo - 1, 0, "wsd"))
            if hi in bests and hi < 1 + setup.max_extensions:
                edges.append((m, depth, hi + 1, 0, "wsd"))
            if not edges and setup.refine:
                edges = [
                    (m, depth, j, 0, "wsd")
                    for j in half_steps(runs, ks, max(setup.horizons[depth]))
                ]
            grid += edges
            k = best_k(runs, max(setup.horizons[depth]))
            if not edges and m in setup.compared and k is not None:
                seeded += [
                    (m, depth, k, s, "wsd")
                    for s in setup.seeds
                    if (m, depth, k, s, "wsd") not in done
                ]
        if len(grid) == edges_before and not any(j[1] == depth for j in centres):
            complete_depths.append(depth)
    todo = centres + seeded + grid
    for depth in complete_depths:
        longest = max(setup.horizons[depth])
        ranked = []
        for m in models:
            runs = [r for r in results if (r["model_name"], r["depth"]) == (m, depth)]
            k = best_k(runs, longest)
            at_k = [r for r in runs if r["k"] == k and r["schedule"] == "wsd"]
            if k is not None and all(math.isfinite(horizon_loss(r, longest)) for r in at_k):
                loss = min(horizon_loss(r, longest) for r in at_k if r["seed"] == 0)
                ranked.append((loss, m, k))
        for _, m, k in sorted(ranked)[: setup.best_models]:
            todo += [
                (m, depth, k, s, "wsd")
                for s in setup.seeds
                if (m, depth, k, s, "wsd") not in done and (m, depth, k, s, "wsd") not in todo
            ]
    if setup.check and setup.depths[0] in complete_depths:
        todo += check_plan(setup, results)
    return todo


def check_point(setup: Setup, results: list[dict[str, Any]]) -> tuple[str, int, int] | None:
    """(model, depth, k) of the WSD-vs-cosine check: the first model at the first depth, at
    the lr of a check already complete (every seed, both schedules), else at its best seed-0
    lr of ``check_horizon`` steps so far (the grid centre if none has finished); None without
    models. A complete check is not run again when the best lr moves later."""
    models = available_models(setup)
    if not models:
        return None
    m, depth = models[0], setup.depths[0]
    runs = [r for r in results if (r["model_name"], r["depth"]) == (m, depth)]
    for k in sorted({r["k"] for r in runs if r["schedule"] in ("cosine", "wsd-check")}):
        done = {(r["seed"], r["schedule"]) for r in runs if r["k"] == k}
        if all((s, kind) in done for s in setup.seeds for kind in ("cosine", "wsd-check")):
            return m, depth, k
    k = best_k(runs, setup.check_horizon)
    return m, depth, 0 if k is None else k


def check_plan(setup: Setup, results: list[dict[str, Any]]) -> list[tuple[str, int, int, int, str]]:
    """The WSD-vs-cosine check still needed at :func:`check_point`'s (model, depth, lr):
    every seed a cosine run and a WSD run of ``check_horizon`` steps alone."""
    if (checked := check_point(setup, results)) is None:
        return []
    m, depth, k = checked
    done = {(r["model_name"], r["depth"], r["k"], r["seed"], r["schedule"]) for r in results}
    return [
        (m, depth, k, s, kind)
        for kind in ("wsd-check", "cosine")
        for s in setup.seeds
        if (m, depth, k, s, kind) not in done
    ]


def grid_index(setup: Setup, model: str, depth: int, lr: float) -> float:
    """The grid index k of the peak ``lr`` for ``model`` at ``depth`` (``lr_grid(setup, model,
    depth, k)`` is ``lr`` at 3 significant digits): a whole number on the 3x grid, a half one
    on its half steps (x 3^(1/2)); ValueError naming ``lr`` for any other lr."""
    k = round(2 * math.log(lr / lr_grid(setup, model, depth, 0), 3)) / 2
    if lr_tag(lr_grid(setup, model, depth, k)) != lr_tag(lr):
        on = ", ".join(f"{lr_grid(setup, model, depth, j / 2):.3g}" for j in (-2, -1, 0, 1, 2))
        raise ValueError(
            f"lr must be on {model!r}'s lr grid at depth {depth} or half a step off it "
            f"(..., {on}, ...), got {lr!r}"
        )
    return k


def planned(
    setup: Setup,
    results: list[dict[str, Any]],
    lrs: tuple[float, ...] | None = None,
    check: bool = False,
    add: tuple[float, ...] = (),
) -> list[tuple[str, int, int, int, str]]:
    """The runs of :func:`plan` (of :func:`check_plan` with ``check``), only those at the peak
    lrs ``lrs`` (None: all; each compared at the grid's 3 significant digits): to spend a
    session's compute on one lr of the plan, e.g. the seeds at a best lr before a grid edge
    the plan puts first. ``add``: peak lrs on the grid or its half steps (:func:`grid_index`)
    whose seed-0 run of every model and depth goes first, planned or not: a point the plan
    does not reach yet (e.g. a half step of a grid whose edges are not all run); the report
    reads it as one more point of the grid."""
    done = {(r["model_name"], r["depth"], r["k"], r["seed"], r["schedule"]) for r in results}
    first = [
        (m, depth, grid_index(setup, m, depth, lr), 0, "wsd")
        for lr in add
        for depth in setup.depths
        for m in available_models(setup)
    ]
    first = [job for job in first if job not in done]
    todo = (check_plan if check else plan)(setup, results)
    if lrs is not None:
        wanted = {lr_tag(lr) for lr in lrs}
        todo = [job for job in todo if lr_tag(lr_grid(setup, *job[:3])) in wanted]
    return first + [job for job in todo if job not in first]


def study(
    setup: Setup,
    out: Path,
    *,
    device: str = "cpu",
    compile: bool = False,
    check: bool = False,
    data: str | None = None,
    lrs: tuple[float, ...] | None = None,
    add: tuple[float, ...] = (),
) -> Study:
    """The study for the shared runner (``simulations.studies``): the runs of :func:`planned`
    in ``out/runs/``, the report of ``report.py``. ``data``: the corpus
    (``TrainingRun.data``; default: this Python's standard library)."""

    def runs(results: list[dict[str, Any]]) -> list[TrainingRun]:
        return [
            make_run(setup, out, *job, device=device, compile=compile, data=data)
            for job in planned(setup, results, lrs, check, add)
        ]

    def write_report(results: list[dict[str, Any]]) -> Any:
        if setup.ablation:  # one report of both stages, from both stores
            return import_beside(HERE.parent / "ablation", "report").report()
        module = import_beside(HERE, "report")
        committed = {HERE / folder: full for folder, full in module.REPORTS.items()}
        written = module.report(report_setup(out, committed, setup), out, results)
        if Path(out).resolve() == HERE.resolve():
            rebuild_quoting_reports()
        return written

    return Study(
        out,
        runs,
        write_report,
        describe=lambda key, r: f"{r['model_name']} d{r['depth']} lr {r['lr']:.3g} s{r['seed']}",
    )


def rebuild_quoting_reports() -> None:
    """Rebuild the committed reports that quote this study's committed store, so that a run
    stored here leaves none of them stale: the ablation's (its baselines and (a)) and the
    transfer study's (its comparison with the long horizons)."""
    import_beside(HERE.parent / "ablation", "report").report()
    transfer = import_beside(HERE.parent / "transfer", "study")
    home = transfer.HERE
    transfer.study(transfer.DEFAULT, home).report(RunStore(home / STORE).finished())


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = study_parser(
        __doc__.splitlines()[0], out_help="study folder (default: beside me; gpu/ for --gpu)"
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny sizes: a few minutes")
    size.add_argument("--gpu", action="store_true", help="width 256, 20,000 steps (gpu/)")
    size.add_argument(
        "--ablation", action="store_true", help="the shaped model's ablation screen (../ablation)"
    )
    size.add_argument(
        "--ablation-long",
        action="store_true",
        help="the ablation's best two to 5,000 steps (../ablation/long)",
    )
    p.add_argument("--depths", type=int, nargs="+", default=None)
    p.add_argument(
        "--horizons", type=int, nargs="+", default=None, help="replace every depth's horizons"
    )
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=None)
    p.add_argument(
        "--refine", action="store_true",
        help="once a model's 3x grid is tuned, add the lrs half a step (x 3^(1/2)) on each "
        "side of its best lr at the longest horizon (its seeds follow the best)",
    )  # fmt: skip
    p.add_argument(
        "--check", action="store_true", help="only the WSD-vs-cosine check (first model, now)"
    )
    p.add_argument(
        "--lrs", type=float, nargs="+", default=None, metavar="LR",
        help="run only the planned runs at these peak lrs, as --plan prints them "
        "(default: all of them)",
    )  # fmt: skip
    p.add_argument(
        "--add-lrs", type=float, nargs="+", default=(), metavar="LR",
        help="first run seed 0 of every model and depth at these peak lrs, planned or not "
        "(each on the lr grid or half a step off it)",
    )  # fmt: skip
    args = parse_study_args(p, argv)
    for name in ("lrs", "add_lrs"):
        given = getattr(args, name)
        if given is not None and not all(0 < lr < math.inf for lr in given):
            flag = name.replace("_", "-")
            p.error(f"--{flag}: must be positive finite learning rates, got {given}")
    setup = setup_of(args)
    for lr in args.add_lrs:
        for depth in setup.depths:
            for m in available_models(setup):
                try:
                    grid_index(setup, m, depth, lr)
                except ValueError as err:
                    p.error(f"--add-lrs: {err}")
    return args


def setup_of(args: argparse.Namespace) -> Setup:
    setup = (
        QUICK
        if args.quick
        else GPU
        if args.gpu
        else ABLATION
        if args.ablation
        else ABLATION_LONG
        if args.ablation_long
        else DEFAULT
    )
    if args.depths:
        longest = setup.horizons[max(setup.horizons)]
        horizons = {d: setup.horizons.get(d, longest) for d in args.depths}
        setup = replace(setup, depths=tuple(args.depths), horizons=horizons)
    if args.horizons:
        setup = replace(setup, horizons={d: tuple(sorted(args.horizons)) for d in setup.depths})
    if args.models:  # the WSD-vs-cosine check is the study's first model's
        check = setup.check and args.models[0] == setup.models[0]
        setup = replace(setup, models=tuple(args.models), check=check)
    if args.refine:
        setup = replace(setup, refine=True)
    return setup


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.out is None:
        ablation = HERE.parent / "ablation"
        args.out = (
            HERE / "gpu"
            if args.gpu
            else ablation
            if args.ablation
            else ablation / "long"
            if args.ablation_long
            else HERE
        )
    the_study = study(
        setup_of(args),
        args.out,
        device=args.device,
        compile=args.compile,
        check=args.check,
        data=args.data,
        lrs=None if args.lrs is None else tuple(args.lrs),
        add=tuple(args.add_lrs),
    )
    return study_main(the_study, args)


if __name__ == "__main__":
    sys.exit(main())
