"""``shapedtx probe``: token covariance of a saved ``shapedtx train`` checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import add_command
from ._common import RunArgs, UsageError, add_run_options, check_output_file


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "probe", run,
        "Rebuild the language model of a `shapedtx train` run from RUN/log.nc and "
        "RUN/checkpoint.pt, run it on fixed validation windows (the trainer's metrics batch) and "
        "record the token covariance after every block (shapedtx.probe): the covariance Dataset "
        "V(sample, t, token_a, token_b), one sample per window. Prints a one-line collapse "
        "summary.",
    )  # fmt: skip
    parser.add_argument("run", help="output folder of `shapedtx train` (log.nc, checkpoint.pt)")
    parser.add_argument("--out", default=None, help="write the Dataset to this .nc file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--windows", type=int, default=None, help="validation windows (default: metrics_batch)"
    )
    parser.add_argument("--threshold", type=float, default=0.99, help="collapse threshold")
    g = parser.add_argument_group(
        "data (default: the run's, from RUN/data.json; for runs without it the run's corpus "
        "and size with train's defaults)"
    )
    g.add_argument("--data", default=None, help="text file or folder")
    g.add_argument("--suffix", default=None)
    g.add_argument("--max-bytes", type=int, default=None)
    g.add_argument("--val-fraction", type=float, default=None)
    # deterministic, without a progress bar, in the run's dtype (RUN/log.nc)
    add_run_options(parser, exclude=("seed", "dtype", "progress"))


def run(args: argparse.Namespace) -> int:
    settings = RunArgs.from_args(args)  # the torch-free checks first
    folder = Path(args.run)
    if args.out is not None:
        if Path(args.out).suffix != ".nc":
            raise UsageError(f"--out must be a .nc file, got {args.out!r}")
        check_output_file(args.out, args.overwrite)
    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold must be in (0, 1), got {args.threshold}")
    import numpy as np
    import torch

    from shapedtx.metrics import detect_collapse, mean_correlation
    from shapedtx.probe import probe
    from shapedtx.results import load_dataset, save_dataset
    from shapedtx.training import LanguageModel, configs_of, load_corpus
    from shapedtx.training.data import fixed_windows
    from shapedtx.training.trainer import CHECKPOINT, LOG

    for name in (LOG, CHECKPOINT):
        if not (folder / name).is_file():
            raise UsageError(f"{folder / name} not found: RUN must be a `shapedtx train` --out")
    settings.apply_threads()
    device = settings.torch_device()
    try:
        log = load_dataset(folder / LOG)
        model_config, train_config = configs_of(log)
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{folder / LOG} is not a training log: {err}") from None
    windows = train_config.metrics_batch if args.windows is None else args.windows
    if windows < 1:
        raise UsageError(f"--windows must be >= 1, got {windows}")
    corpus = _run_data_settings(folder, log)
    given = {"path": args.data, "suffix": args.suffix, "max_bytes": args.max_bytes,
             "val_fraction": args.val_fraction}  # fmt: skip
    corpus.update({k: v for k, v in given.items() if v is not None})
    data = load_corpus(**corpus)
    sizes = (int(data.train.numel()), int(data.val.numel()))
    keys = ("train_bytes", "val_bytes")
    run_sizes = tuple(int(log.attrs.get(k, n)) for k, n in zip(keys, sizes, strict=True))
    # the fingerprint hashes the bytes, not where the split falls: the sizes tell that
    if data.fingerprint() != log.attrs.get("corpus_fingerprint", data.fingerprint()) or (
        sizes != run_sizes
    ):
        raise UsageError(_data_difference(data, log))
    try:
        state = torch.load(folder / CHECKPOINT, map_location="cpu", weights_only=True)
        model = LanguageModel(model_config, train_config.seq_len)
        model.load_state_dict(state["model"])
    except (OSError, KeyError, RuntimeError, ValueError) as err:
        raise UsageError(f"{folder / CHECKPOINT} does not load: {err}") from None
    dtype = getattr(torch, str(log.attrs.get("dtype", "float32")), torch.float32)
    model.to(device=device, dtype=dtype)
    tokens = fixed_windows(data.val.to(device), windows, train_config.seq_len)[:, :-1]
    ds = probe(model, tokens)
    ds.attrs.update({"run": str(folder), "step": int(state["step"])})
    V = torch.from_numpy(ds["V"].values)
    hit = detect_collapse(V, args.threshold)
    first = hit.first_index[hit.collapsed].numpy()
    rho = mean_correlation(V[:, -1]).numpy()
    where = f", first at layer {int(np.median(first))} (median)" if first.size else ""
    print(
        f"step {int(state['step'])}: {int(hit.collapsed.sum())}/{V.shape[0]} windows collapsed "
        f"(mean rho > {args.threshold:g}){where}; mean rho after the last block "
        f"{float(np.nanmean(rho)):.4f}"
    )
    if args.out is not None:
        save_dataset(ds, args.out)
        print(f"wrote {args.out}")
    return 0


def _run_data_settings(folder: Path, log: Any) -> dict[str, Any]:
    """The ``load_corpus`` arguments of the run: RUN/data.json (written by ``shapedtx
    train``), else the log's corpus with train's defaults and the run's size as ``max_bytes``
    (the bytes read are ``min(max_bytes, corpus)``, so this reads the same bytes)."""
    import json

    from .train import DATA_SETTINGS

    try:
        saved = json.loads((folder / DATA_SETTINGS).read_text())
        if isinstance(saved, dict):
            return {k: saved.get(k) for k in ("path", "suffix", "max_bytes", "val_fraction")}
    except (OSError, ValueError):
        pass
    corpus = str(log.attrs.get("corpus", ""))
    size = int(log.attrs.get("train_bytes", 0)) + int(log.attrs.get("val_bytes", 0))
    return {
        "path": None if corpus.startswith("python-stdlib:") else corpus,
        "suffix": None,
        "max_bytes": size if size >= 16 else 8_000_000,
        "val_fraction": 0.1,
    }


def _data_difference(data: Any, log: Any) -> str:
    """A one-line message naming the data option that differs from the run's."""
    corpus = str(log.attrs.get("corpus", ""))
    train, val = int(data.train.numel()), int(data.val.numel())
    run_train, run_val = (int(log.attrs.get(k, -1)) for k in ("train_bytes", "val_bytes"))
    if data.source != corpus:
        what = f"--data: the source {data.source} is not the run's ({corpus})"
    elif train + val != run_train + run_val:
        what = (
            f"--max-bytes (or --suffix): {train + val} bytes read, the run read "
            f"{run_train + run_val} from {corpus}"
        )
    elif train != run_train:
        what = f"--val-fraction: {val} validation bytes of {train + val}, the run had {run_val}"
    else:
        what = (
            f"--suffix, or the files changed since training: the same source ({corpus}) and "
            f"sizes ({run_train} + {run_val} bytes) but other contents"
        )
    return (
        f"the data differs from the run's in {what}; pass the data options as given to "
        "`shapedtx train`"
    )
