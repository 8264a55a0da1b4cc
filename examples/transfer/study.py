"""Learning-rate transfer across depth and width: validation loss against peak learning rate.

Causal byte-level LMs on the default corpus (Python standard library sources, no download), in
five parametrisations (docs/guide/transfer.md): the shaped Transformer with a fixed gamma
(``shaped``, gamma 2^-1.5) and with the SDE's gamma rule (``shaped_t``: gamma^2 d / n held
fixed), the GPT-2 pre-LN block (``pre_ln``, standard parametrisation), and pre-LN with the
branch multipliers of depth-muP (``pre_ln_depth_mup``, (d/8)^(-1/2)) and CompleteP
(``pre_ln_completep``, (d/8)^(-1)), relative to the proxy's depth 8. 4 heads with W^O, MLP
hidden 4n, context 64, batch 32.

The learning rate swept is the *base* lr, tuned at the proxy width 64, depth 8: every run
trains each parameter group at base lr times the factor of its parametrisation's rule
(``TrainConfig(lr_proxy_width=64, lr_proxy_depth=8)``, ``shapedtx.lr_multipliers``). A
parametrisation transfers when the optimal base lr does not move with depth and width.

Grid: depths {4, 8, 16, 32, 64} at width 64 and widths {32, 64, 128, 256} at depth 8; per
parametrisation and shape the base lr 2^j for 7 values of j (2x apart) around the
parametrisation's centre, extended by up to 2 values per side while the lowest loss at the
longest horizon is at an edge; seed 0 everywhere, then seeds 1 and 2 at the best lr of depths
4 and 64 (width 64). Every run uses the warmup-stable-decay schedule and trains horizons 250,
500 and 1000 steps in one run (``shapedtx.training.train_horizons``).

Runs are tasks of the project's Dask machinery through the shared study runner
(``simulations.studies``: embedded local cluster, or ``--scheduler ADDRESS``); each trains in
its scratch folder ``runs/<parametrisation>/w<width>_d<depth>/lr<lr>_s<seed>/`` (git-ignored;
``lr`` as ``simulations.studies.lr_tag`` writes it), resumes from its checkpoints if
interrupted, and once all its horizons have ended is appended to ``runs.jsonl``, the study's
record of its finished runs. ``--report`` writes ``results.md``, ``results.json``,
``tables.md``, ``figures/`` and the package data ``simulations/data/transfer_drifts.json``
from ``runs.jsonl`` (``report.py``); none of them is edited by hand.

Usage::

    python examples/transfer/study.py --plan                  # the planned runs, nothing run
    python examples/transfer/study.py --workers 1             # the CPU study (resumable)
    python examples/transfer/study.py --max-runs 2            # stop after 2 new runs
    python examples/transfer/study.py --quick --out /tmp/tr   # a few minutes
    python examples/transfer/study.py --report                # only the report
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shapedtx import ModelConfig, TrainConfig, preset
from shapedtx.training import COMPLETEP_REFERENCE
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

PARAMETRISATIONS: tuple[str, ...] = (
    "shaped_t",
    "shaped",
    "pre_ln",
    "pre_ln_depth_mup",
    "pre_ln_completep",
)
"""The presets compared, in the order their runs are planned."""

LOG2_LR_CENTRE: dict[str, int] = {
    "shaped": -7,
    "shaped_t": -7,
    "pre_ln": -8,
    "pre_ln_depth_mup": -8,
    "pre_ln_completep": -8,
}
"""Centre j of each parametrisation's grid of base lrs 2^j: near the best lr at width 64 of the
long-horizon study (shaped 1e-2, pre-LN 3.3e-3, examples/long_horizon/results.md)."""

SAME_AT_PROXY_DEPTH: dict[str, str] = {"pre_ln_completep": "pre_ln_depth_mup"}
"""At the proxy's depth a branch multiplier (depth / base_depth)^(-a) and the depth factor of
the lr rule are 1, so CompleteP's runs there are depth-muP's (bit for bit on one machine,
tested): its width axis (at the proxy's depth) is depth-muP's and is not planned twice."""


@dataclass(frozen=True)
class Variant:
    """CompleteP (``pre_ln_completep``) with some of its reference's settings
    (EleutherAI/nanoGPT-mup, branch ``completep``; docs/guide/transfer.md): ``smallest_base``
    takes the base depth (branch multiplier ``(d / d0)^-1``, the lr and epsilon rules) at the
    depth axis's smallest depth instead of the proxy's; ``model`` and ``train`` are the
    ModelConfig and TrainConfig fields it changes. Depth axis only (its width is the base
    width, where ``m_N = 1``)."""

    preset: str = "pre_ln_completep"
    smallest_base: bool = False
    model: tuple[tuple[str, Any], ...] = ()
    train: tuple[tuple[str, Any], ...] = ()


_REF_MODEL = (("attention_scale", "inverse"), ("init", "mup"), ("output_multiplier", True))
VARIANTS: dict[str, Variant] = {
    # the whole recipe: the preset carries the model's changes, COMPLETEP_REFERENCE AdamW's
    "pre_ln_completep_ref": Variant(
        preset="pre_ln_completep_ref", smallest_base=True, train=tuple(COMPLETEP_REFERENCE.items())
    ),
    # one change at a time from pre_ln_completep
    "completep_base_depth": Variant(smallest_base=True),
    "completep_attention_scale": Variant(model=_REF_MODEL[:1]),
    # muP's init; the output multiplier 1 / m_N is 1 at the base width (the depth axis)
    "completep_init": Variant(model=_REF_MODEL[1:]),
    "completep_eps": Variant(train=(("eps", 1e-12), ("eps_scaling", "completep"))),
    "completep_beta2": Variant(train=(("beta2", 0.95),)),
}
"""CompleteP as its reference runs it (``pre_ln_completep_ref``) and its reference's changes
one at a time from ``pre_ln_completep``: which of them moves CompleteP's depth drift. Not in
the default study; ``--completep-ref`` plans them all (depth axis only)."""

REFERENCE_BASELINE = "pre_ln_completep"
"""The model each :data:`VARIANTS` entry is compared with (the library's CompleteP)."""

for _name in VARIANTS:
    LOG2_LR_CENTRE[_name] = -7  # CompleteP's measured best at depths 4-16 (results.md)


@dataclass(frozen=True)
class Setup:
    """Sizes, grids and horizons of one study (the CPU default or ``--quick``)."""

    width: int  # of the depth axis
    depth: int  # of the width axis
    depths: tuple[int, ...]
    widths: tuple[int, ...]
    proxy: tuple[int, int]  # (width, depth) at which the base lr is tuned
    horizons: tuple[int, ...]
    half_grid: int  # the grid is centre + (-half_grid .. half_grid)
    max_extensions: int  # per side
    seeds: tuple[int, ...]
    seed_depths: tuple[int, ...]  # depths (at ``width``) whose best lr gets every seed
    batch_size: int
    seq_len: int
    warmup_steps: int
    cooldown_fraction: float
    log_interval: int
    eval_interval: int
    eval_batches: int
    max_bytes: int
    parametrisations: tuple[str, ...] = PARAMETRISATIONS
    log2_lr_offset: int = 0  # added to every LOG2_LR_CENTRE

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(width, depth) of every model: the depth axis, then the width axis (no repeats)."""
        out = [(self.width, d) for d in self.depths]
        out += [(w, self.depth) for w in self.widths if (w, self.depth) not in out]
        return out


DEFAULT = Setup(
    width=64,
    depth=8,
    depths=(4, 8, 16, 32, 64),
    widths=(32, 64, 128, 256),
    proxy=(64, 8),
    horizons=(250, 500, 1000),
    half_grid=3,
    max_extensions=2,
    seeds=(0, 1, 2),
    seed_depths=(4, 64),
    batch_size=32,
    seq_len=64,
    warmup_steps=50,
    cooldown_fraction=0.2,
    log_interval=50,
    eval_interval=250,
    eval_batches=16,
    max_bytes=8_000_000,
)
QUICK = Setup(
    width=16,
    depth=2,
    depths=(2, 4),
    widths=(8, 16),
    proxy=(16, 2),
    horizons=(20, 40),
    half_grid=1,
    max_extensions=2,
    seeds=(0, 1),
    seed_depths=(2, 4),
    batch_size=4,
    seq_len=16,
    warmup_steps=4,
    cooldown_fraction=0.25,
    log_interval=5,
    eval_interval=10,
    eval_batches=2,
    max_bytes=200_000,
    parametrisations=("shaped_t", "pre_ln_completep"),
    log2_lr_offset=4,  # 40 steps of a tiny model: the best lr is ~16x larger
)

Job = tuple[str, int, int, int, int]
"""(parametrisation, width, depth, j, seed): one run at base lr 2^j."""


def model_config(
    name: str, width: int, depth: int, proxy_depth: int, proxy_width: int = 64
) -> ModelConfig:
    """The preset at (width, depth). A branch multiplier ``(depth / base_depth)^(-a)``
    (depth-muP, CompleteP) is taken relative to the proxy's depth (``base_depth``), as
    CompleteP's ``(L / L_base)^(-a)``: the proxy is then the plain model, whose best lr the
    grid's centre is set near, and the multiplier is 1 where the base lr is tuned. A
    :data:`VARIANTS` entry is its preset with its model changes and ``base_width`` the
    proxy's width (pass the variant's :func:`proxy_of` as the proxy)."""
    variant = VARIANTS.get(name)
    config = preset(
        variant.preset if variant else name,
        width=width,
        depth=depth,
        heads=4,
        mlp_ratio=4,
        causal=True,
        **(dict(variant.model) if variant else {}),
    )
    if variant and "base_width" not in config.unused_fields():
        config = config.replace(base_width=proxy_width)
    return config.replace(base_depth=proxy_depth) if config.depth_alpha else config


def proxy_of(setup: Setup, name: str) -> tuple[int, int]:
    """(width, depth) of the base shape of ``name``'s lr (and epsilon) rules and branch
    multiplier: the setup's proxy, or its width and the depth axis's smallest depth for a
    :data:`VARIANTS` entry with ``smallest_base`` (CompleteP's reference's base depth)."""
    variant = VARIANTS.get(name)
    if variant and variant.smallest_base:
        return setup.proxy[0], min(setup.depths)
    return setup.proxy


def train_config(setup: Setup, j: int, seed: int, name: str | None = None) -> TrainConfig:
    """The run's TrainConfig at base lr 2^j; ``name``: the parametrisation (a
    :data:`VARIANTS` entry takes its own proxy and AdamW settings)."""
    proxy = setup.proxy if name is None else proxy_of(setup, name)
    variant = VARIANTS.get(name or "")
    config = TrainConfig(
        steps=max(setup.horizons),
        batch_size=setup.batch_size,
        seq_len=setup.seq_len,
        lr=2.0**j,
        min_lr_ratio=0.0,
        warmup_steps=setup.warmup_steps,
        schedule="wsd",
        cooldown_fraction=setup.cooldown_fraction,
        log_interval=setup.log_interval,
        eval_interval=setup.eval_interval,
        eval_batches=setup.eval_batches,
        metrics_batch=8,
        checkpoint_interval=setup.eval_interval,
        seed=seed,
        lr_proxy_width=proxy[0],
        lr_proxy_depth=proxy[1],
    )
    return config.replace(**dict(variant.train)) if variant else config


def make_run(
    setup: Setup,
    out: Path,
    job: Job,
    device: str = "cpu",
    data: str | None = None,
    compile: bool = False,
) -> TrainingRun:
    name, width, depth, j, seed = job
    proxy = proxy_of(setup, name)
    return TrainingRun(
        model=model_config(name, width, depth, proxy[1], proxy[0]),
        train=train_config(setup, j, seed, name),
        horizons=setup.horizons,
        folder=str(out / "runs" / name / f"w{width}_d{depth}" / f"{lr_tag(2.0**j)}_s{seed}"),
        max_bytes=setup.max_bytes,
        data=data,
        device=device,
        compile=compile,
        labels={
            "parametrisation": name,
            "width": width,
            "depth": depth,
            "log2_lr": j,
            "lr": 2.0**j,
            "seed": seed,
        },
    )


def load_results(out: Path) -> list[dict[str, Any]]:
    """The study's finished runs: its ``runs.jsonl`` (``simulations.studies.RunStore``), with
    any finished run left in its scratch folder taken in first."""
    return RunStore(out / STORE).finished()


def best_j(runs: list[dict[str, Any]], horizon: int) -> int | None:
    """The grid's log2 lr with the lowest seed-0 loss at ``horizon`` (None: all diverged)."""
    ok = [r for r in runs if r["seed"] == 0 and math.isfinite(horizon_loss(r, horizon))]
    return min(ok, key=lambda r: horizon_loss(r, horizon))["log2_lr"] if ok else None


def _bracketed(runs: list[dict[str, Any]], best: int | None) -> bool:
    """Whether seed-0 runs at both neighbours of ``best`` (2^(best -+ 1)) have finished."""
    js = {r["log2_lr"] for r in runs if r["seed"] == 0}
    return best is not None and {best - 1, best + 1} <= js


def _base_grid(
    setup: Setup, results: list[dict[str, Any]], name: str, width: int, depth: int, centre: int
) -> set[int]:
    """The log2 lrs first planned for ``name`` at (width, depth): the centred grid, except for
    a :data:`VARIANTS` entry at a shape where :data:`REFERENCE_BASELINE` has its optimum of the
    longest horizon bracketed (seed 0): that optimum and its two neighbours, the grid then
    extended at an edge as any other (a single change is expected near the model it
    changes; a 3-lr start instead of 7 halves a new depth's runs)."""
    wide = set(range(centre - setup.half_grid, centre + setup.half_grid + 1))
    if name not in VARIANTS:
        return wide
    shape = (REFERENCE_BASELINE, width, depth)
    changed = [r for r in results if (r["parametrisation"], r["width"], r["depth"]) == shape]
    anchor = best_j(changed, max(setup.horizons))
    if anchor is None or not _bracketed(changed, anchor):
        return wide
    return {anchor - 1, anchor, anchor + 1}


def plan(setup: Setup, results: list[dict[str, Any]]) -> list[Job]:
    """Runs still needed, in priority order: per parametrisation and shape the grid
    (:func:`_base_grid`; then its extensions while the best lr at the longest horizon is at an
    edge, or downwards while every lr diverged; no width axis for ``SAME_AT_PROXY_DEPTH`` and
    :data:`VARIANTS`), then the
    seeds at the best lr of ``seed_depths`` once it is bracketed: its grid complete and not
    extended, or both its neighbours run (so the seeds need not wait for the grid's outer
    lrs)."""
    done = {
        (r["parametrisation"], r["width"], r["depth"], r["log2_lr"], r["seed"]) for r in results
    }
    longest = max(setup.horizons)
    todo: list[Job] = []
    seeds: list[Job] = []
    for name in setup.parametrisations:
        centre = LOG2_LR_CENTRE[name] + setup.log2_lr_offset
        for width, depth in setup.shapes:
            on_width_axis = depth == setup.proxy[1] and width != setup.proxy[0]
            if name in SAME_AT_PROXY_DEPTH and on_width_axis:
                continue  # its width axis is SAME_AT_PROXY_DEPTH[name]'s
            if name in VARIANTS and (width != setup.width or depth not in setup.depths):
                continue  # the CompleteP variants: depth axis only
            runs = [
                r
                for r in results
                if (r["parametrisation"], r["width"], r["depth"]) == (name, width, depth)
            ]
            js = _base_grid(setup, results, name, width, depth, centre)
            js |= {r["log2_lr"] for r in runs if r["seed"] == 0}
            missing = [(name, width, depth, j, 0) for j in sorted(js)]
            missing = [job for job in missing if job not in done]
            best = best_j(runs, longest)
            if missing:
                todo += missing
                ready = _bracketed(runs, best)
            else:
                lo, hi = min(js), max(js)
                reach = setup.half_grid + setup.max_extensions
                # every lr diverged (best None): the optimum lies below the grid
                extend = [lo - 1] if best in (lo, None) and lo > centre - reach else []
                extend += [hi + 1] if best == hi and hi < centre + reach else []
                todo += [(name, width, depth, j, 0) for j in extend]
                ready = not extend
            seeded = width == setup.width and depth in setup.seed_depths
            if seeded and ready and best is not None:
                seeds += [
                    (name, width, depth, best, s)
                    for s in setup.seeds
                    if (name, width, depth, best, s) not in done
                ]
    return todo + seeds


def planned(
    setup: Setup, results: list[dict[str, Any]], log2_lrs: tuple[int, ...] | None
) -> list[Job]:
    """``plan``'s runs, only those at base lrs ``2^j`` for j in ``log2_lrs`` (None: all): to
    spend a session's compute on the lrs around an expected optimum first."""
    todo = plan(setup, results)
    return todo if log2_lrs is None else [job for job in todo if job[3] in log2_lrs]


def study(
    setup: Setup,
    out: Path,
    *,
    device: str = "cpu",
    log2_lrs: tuple[int, ...] | None = None,
    data: str | None = None,
    compile: bool = False,
) -> Study:
    """The study for the shared runner (``simulations.studies``): the runs of :func:`planned`
    in ``out/runs/``, the report of ``report.py``. ``log2_lrs``: only the planned runs at
    these base lrs; ``data``: the corpus (``TrainingRun.data``; default: this Python's
    standard library); ``compile``: train through ``torch.compile``."""

    def runs(results: list[dict[str, Any]]) -> list[TrainingRun]:
        return [
            make_run(setup, out, job, device=device, data=data, compile=compile)
            for job in planned(setup, results, log2_lrs)
        ]

    def write_report(results: list[dict[str, Any]]) -> Any:
        module = import_beside(HERE, "report")
        DRIFTS, report = module.DRIFTS, module.report

        # the package data simulations.transfer_lr quotes: from the committed study only
        drifts = DRIFTS if Path(out).resolve() == HERE.resolve() else None
        return report(report_setup(out, {HERE: DEFAULT}, setup), out, results, drifts)

    return Study(
        out,
        runs,
        write_report,
        describe=lambda key, r: (
            f"{r['parametrisation']} w{r['width']} d{r['depth']} lr 2^{r['log2_lr']} s{r['seed']}"
        ),
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = study_parser(__doc__.splitlines()[0], out_help="study folder (default: beside me)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a few minutes")
    p.add_argument("--depths", type=int, nargs="+", default=None, help="the depth axis")
    p.add_argument("--widths", type=int, nargs="+", default=None, help="the width axis")
    p.add_argument(
        "--parametrisations", nargs="+", choices=(*PARAMETRISATIONS, *VARIANTS), default=None,
        metavar="NAME",
        help=f"default: {' '.join(PARAMETRISATIONS)}; or any of {' '.join(VARIANTS)}",
    )  # fmt: skip
    p.add_argument(
        "--completep-ref", action="store_true",
        help="plan CompleteP as its reference runs it and its changes one at a time "
        f"({' '.join(VARIANTS)}) on the depth axis, instead of --parametrisations",
    )  # fmt: skip
    p.add_argument(
        "--log2-lrs", type=int, nargs="+", default=None, metavar="J",
        help="run only the planned runs at base lr 2^J (default: all of them)",
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=int, default=None, metavar="N",
        help="seeds 0..N-1 at the best lr of the seeded depths (default 3)",
    )  # fmt: skip
    args = parse_study_args(p, argv)
    if args.seeds is not None and args.seeds < 1:
        p.error(f"--seeds: must be an integer >= 1, got {args.seeds}")
    return args


def setup_of(args: argparse.Namespace) -> Setup:
    setup = QUICK if args.quick else DEFAULT
    if args.depths:
        seed_depths = tuple(d for d in setup.seed_depths if d in args.depths)
        setup = replace(setup, depths=tuple(args.depths), seed_depths=seed_depths)
    if args.widths:
        setup = replace(setup, widths=tuple(args.widths))
    if args.parametrisations:
        setup = replace(setup, parametrisations=tuple(args.parametrisations))
    if args.completep_ref:
        setup = replace(setup, parametrisations=tuple(VARIANTS))
    if args.seeds:
        setup = replace(setup, seeds=tuple(range(args.seeds)))
    return setup


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    the_study = study(
        setup_of(args),
        args.out if args.out is not None else HERE,
        device=args.device,
        log2_lrs=None if args.log2_lrs is None else tuple(args.log2_lrs),
        data=args.data,
        compile=args.compile,
    )
    return study_main(the_study, args)


if __name__ == "__main__":
    sys.exit(main())
