"""Signal propagation of the long-horizon study's models at initialisation and after training.

For every run folder ``runs/<model>/d<depth>/<lr>_s<seed>/h<H>/`` of its depth's longest
horizon (5000 steps at depth 16, 2000 at depth 64; or ``--horizon``; read only: nothing under
``runs/`` is written), this rebuilds the run's model at initialisation (same configs and seed
as the trainer) and loads every checkpoint the folder still holds (``checkpoint-<step>.pt``
snapshots and ``checkpoint.pt``; a finished run's checkpoints are removed by the study, so
only its initialisation is measured), and measures ``shapedtx.Monitor`` on the trainer's own
metrics batch (the first ``metrics_batch`` validation windows of the run's corpus, whose
fingerprint is checked). Each measurement's covariance metrics are compared with the run's
``log.nc`` at the same step (the same model and batch: they must agree), so the table cannot
silently describe another model. Runs trained since the trainer logs the monitor's metrics
(``attention_entropy`` in ``log.nc``) also get the row of their last logged step from the log
itself: for a finished run, the metrics after training (the same Monitor on the same batch,
computed by the trainer), and their whole logged trajectory in the figure.

Rows measured by an earlier call are kept (read back from ``monitor.json``): the checkpoints
of a run measured while in progress are removed when it finishes. Writes ``monitor.json``
(every measurement), ``monitor.md`` (a table) and, per depth,
``figures/monitor_d<depth>.png`` (``shapedtx.plot_monitor``: that depth's runs side by side).
Usage::

    python examples/long_horizon/monitor.py                 # every run that has a log
    python examples/long_horizon/monitor.py --models "shaped advise" "pre-LN (GPT-2)"
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from study import slug

from shapedtx import Monitor, plot_monitor
from shapedtx.files import write_json
from shapedtx.results import load_dataset
from shapedtx.training import ByteCorpus, LanguageModel, configs_of, load_corpus
from shapedtx.training.data import fixed_windows

HERE = Path(__file__).parent
MAX_BYTES = (8_000_000, 32_000_000, 200_000)
"""The study's corpus sizes (CPU, GPU, quick setups): the one whose fingerprint matches."""

_corpora: dict[int, ByteCorpus] = {}


def _corpus(log: xr.Dataset) -> ByteCorpus:
    for size in MAX_BYTES:
        if size not in _corpora:
            _corpora[size] = load_corpus(max_bytes=size)
        if _corpora[size].fingerprint() == log.attrs["corpus_fingerprint"]:
            return _corpora[size]
    raise SystemExit(f"no corpus of {MAX_BYTES} bytes matches the run's fingerprint")


def _label(folder: Path) -> str:
    """``<model>/d<depth>/<lr>_s<seed>`` of a horizon folder."""
    return "/".join(folder.parts[-4:-1])


def measure_run(folder: Path) -> tuple[xr.Dataset, dict[str, Any]]:
    """Monitor rows of one run at initialisation and at every checkpoint it holds, and the
    largest relative difference of the covariance metrics from its log."""
    log = load_dataset(folder / "log.nc")
    model_config, train_config = configs_of(log)
    data = _corpus(log)
    tokens = fixed_windows(data.val, train_config.metrics_batch, train_config.seq_len)[:, :-1]
    with torch.random.fork_rng(devices=[]):  # as shapedtx.train builds it
        torch.manual_seed(train_config.seed)
        model = LanguageModel(model_config, train_config.seq_len)
    monitor = Monitor(model, tokens)
    states = {0: None}
    for path in glob.glob(str(folder / "checkpoint*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        states.setdefault(int(state["step"]), state["model"])
    worst = 0.0
    for step in sorted(states):
        if states[step] is not None:
            model.load_state_dict(states[step])
        row = monitor(step)
        assert row is not None
        if step in log["step"].values:
            for name in ("mean_rho", "centred_stable_rank"):
                mine, logged = row[name].values[0], log[name].sel(step=step).values
                worst = max(worst, float(np.max(np.abs(mine - logged) / np.abs(logged))))
    ds = monitor.dataset()
    last = _last_monitored_step(log)
    sources = dict.fromkeys((int(x) for x in ds["step"].values), "measured")
    if last is not None and last not in sources:
        row = log[[v for v in ds.data_vars if v in log]].sel(step=[last])
        ds = xr.concat([ds, row], dim="step", data_vars="all", join="outer").sortby("step")
        sources[last] = "log.nc"
    info = {
        "model": folder.parts[-4],
        "sources": {str(k): v for k, v in sources.items()},
        "lr": train_config.lr,
        "steps": train_config.steps,
        "status": log.attrs["status"],
        "logged_to": int(log["step"].values[-1]),
        "max_rel_diff_from_log": worst,
    }
    return ds, info


def _last_monitored_step(log: xr.Dataset) -> int | None:
    """The last step whose monitor metrics the trainer logged (None: an older run's log)."""
    if "attention_entropy" not in log:
        return None
    logged = np.isfinite(log["attention_entropy"]).any(("block", "head")).values
    return int(log["step"].values[logged][-1]) if logged.any() else None


def _status_now(result: Path, status: str) -> str:
    """The status a finished run's ``result.json`` gives at its longest horizon, else
    ``status`` (the run is still in progress, or its folder is not on this machine)."""
    if not result.is_file():
        return status
    horizons = json.loads(result.read_text())["horizons"]
    last = horizons[max(horizons, key=int)]
    return "diverged" if last["diverged"] else str(last["status"])


def _summary(ds: xr.Dataset, step: int) -> dict[str, float]:
    row = ds.sel(step=step)
    out = {
        "entropy / uniform": float(
            (row["attention_entropy"].mean("head") / row["entropy_reference"]).mean()
        ),
        "max logit": float(row["max_logit"].max()),
        "kurtosis (last layer)": float(row["kurtosis"][-1]),
        "kurtosis (max over layers)": float(row["kurtosis"].max()),
        "RMS (last layer)": float(row["activation_rms"][-1]),
        "centred stable rank (last)": float(row["centred_stable_rank"][-1]),
        "mean rho (last)": float(row["mean_rho"][-1]),
    }
    update = row["update_size"].values
    out["update since previous"] = (
        float(np.nanmean(update)) if np.isfinite(update).any() else math.nan
    )
    return out


def run_folders(runs: Path, horizon: int | None = None) -> list[Path]:
    """Every run's horizon folder ``runs/<model>/d<depth>/<lr>_s<seed>/h<H>`` that holds a
    ``log.nc``, of ``horizon`` steps or (None) of its depth's longest horizon (5000 steps at
    depth 16, 2000 at depth 64; the WSD-vs-cosine check's shorter runs are left out)."""
    logged = [h for h in sorted(runs.glob("*/d*/*/h*")) if (h / "log.nc").is_file()]
    logged = [h for h in logged if h.name[1:].isdigit()]
    longest: dict[str, int] = {}
    for h in logged:
        longest[h.parts[-3]] = max(longest.get(h.parts[-3], 0), int(h.name[1:]))
    return [h for h in logged if int(h.name[1:]) == (horizon or longest[h.parts[-3]])]


def _depth(folder: Path) -> int:
    return int(folder.parts[-3][1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, default=HERE / "runs")
    p.add_argument("--horizon", type=int, help="default: each depth's longest horizon")
    p.add_argument("--models", nargs="*", help="model folder names or labels (default: all)")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    folders = run_folders(args.runs, args.horizon)
    if args.models:
        wanted = {slug(m) for m in args.models} | set(args.models)
        folders = [f for f in folders if f.parts[-4] in wanted]
    # rows measured by earlier calls (at checkpoints since removed, or of runs not selected
    # now) are kept: a finished run's weights are gone, its in-progress measurements are not
    previous = (
        json.loads((args.out / "monitor.json").read_text())
        if (args.out / "monitor.json").is_file()
        else {}
    )
    results: dict[str, Any] = dict(previous)
    for label, info in results.items():  # a run measured in progress may have ended since
        info["status"] = _status_now(args.runs / label / "result.json", info["status"])
    logs: dict[int, dict[str, xr.Dataset]] = {}  # depth -> run -> its log
    for folder in folders:
        ds, info = measure_run(folder)
        label = _label(folder)
        steps = [int(s) for s in ds["step"].values]
        rows = {s: (_summary(ds, s), info["sources"][str(s)]) for s in steps}
        old = previous.get(label, {})
        for step, summary in old.get("measured", {}).items():
            if int(step) not in rows:
                rows[int(step)] = (summary, old.get("sources", {}).get(step, "measured"))
        info["measured"] = {str(s): rows[s][0] for s in sorted(rows)}
        info["sources"] = {str(s): rows[s][1] for s in sorted(rows)}
        results[label] = info
        diff = info["max_rel_diff_from_log"]
        print(f"{label}: steps {steps}, largest relative difference from log.nc {diff:.1e}")
        to = info["logged_to"]
        state = f"{to} steps" if info["status"] == "finished" else f"{info['status']} to step {to}"
        name = f"{folder.parts[-4]} lr {info['lr']:g}\n({state})"
        log = load_dataset(folder / "log.nc")
        if _last_monitored_step(log) is not None and log.sizes["step"] > 1:
            logs.setdefault(_depth(folder), {})[name] = log  # the whole logged trajectory
        elif len(steps) > 1:
            logs.setdefault(_depth(folder), {})[name] = ds
    write_json(results, args.out / "monitor.json", indent=1)
    lines = [
        "# Signal propagation at initialisation and at the kept checkpoints",
        "",
        "Written by `examples/long_horizon/monitor.py` (shapedtx.Monitor on each run's own",
        "metrics batch; definitions in docs/guide/monitor.md). Finished runs keep no checkpoint:",
        "their initialisation is measured, and runs whose `log.nc` holds the monitor's metrics",
        "add their last logged step from it (source `log.nc`: after training for a finished",
        "run). `entropy / uniform`: attention entropy over its causal reference, mean over",
        "blocks and heads; `max logit`: over blocks and heads; `update since previous`: mean",
        "relative change of the blocks' matrices since the previous measured row (a `log.nc`",
        "row: since the previous logged step).",
        "",
    ]
    header = None
    for label, info in sorted(results.items()):
        for step, summary in info["measured"].items():
            if header is None:
                header = ["run", "status", "step", "source", *summary]
                lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            values = [f"{v:.3g}" for v in summary.values()]
            source = info.get("sources", {}).get(step, "measured")
            lines.append(
                f"| {label} | {info['status']} | {step} | {source} | " + " | ".join(values) + " |"
            )
    (args.out / "monitor.md").write_text("\n".join(lines) + "\n")
    figures = []
    for depth, runs in sorted(logs.items()):  # one figure per depth: its runs side by side
        (args.out / "figures").mkdir(exist_ok=True)
        figures.append(f"figures/monitor_d{depth}.png")
        plot_monitor(runs).savefig(args.out / figures[-1], dpi=90)
    print(f"wrote {args.out / 'monitor.md'}, monitor.json", *figures, sep=", ")


if __name__ == "__main__":
    main()
