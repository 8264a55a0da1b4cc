"""``shapedtx train``: causal byte-level LM training of a (shaped or vanilla) Transformer."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shapedtx.config import ModelConfig
from shapedtx.files import write_json
from shapedtx.training.probing import DATA_SETTINGS

from . import add_command
from ._common import (
    DTYPE_NAMES,
    RunArgs,
    UsageError,
    add_config_arguments,
    add_run_options,
    check_output_folder,
    config_from_args,
    option_error,
)

if TYPE_CHECKING:  # torch loads when the command runs, not for --help or a usage error
    import torch

DTYPES: tuple[str, ...] = (*DTYPE_NAMES, "bfloat16")  # training also runs in bfloat16
MODEL_DEFAULTS = ModelConfig(
    width=64, depth=4, attention="shaped", mlp="shaped_relu", heads=4, out_proj=True, causal=True
)


def register(subparsers: argparse._SubParsersAction) -> None:
    from shapedtx.training import TrainConfig

    parser = add_command(
        subparsers, "train", run,
        "Train Transformer(config) as a causal byte-level LM (AdamW, warm-up + cosine, "
        "clipping); writes checkpoint.pt, log.nc, data.json (the data options, which `shapedtx "
        "probe` reuses), loss.png and collapse.png to --out and resumes from --out/checkpoint.pt "
        "if present.",
    )  # fmt: skip
    add_config_arguments(parser, MODEL_DEFAULTS, exclude=("causal",))  # an LM is causal
    g = parser.add_argument_group("training (TrainConfig)")
    for f in _train_fields():
        flag = "--" + f.name.replace("_", "-")
        if f.name == "warmup_steps":
            g.add_argument(flag, type=int, default=None, help="(default min(50, steps // 10))")
        else:
            g.add_argument(flag, type=type(f.default), default=f.default,
                           help="(default %(default)s)")  # fmt: skip
    g = parser.add_argument_group("data and run")
    g.add_argument("--data", default=None, help="text file or folder (default: Python stdlib)")
    g.add_argument("--suffix", default=None, help="only files with this suffix, e.g. .txt")
    g.add_argument("--max-bytes", type=int, default=8_000_000, help="(default %(default)s)")
    g.add_argument("--val-fraction", type=float, default=0.1, help="(default %(default)s)")
    g.add_argument("--out", default="runs/train", help="output folder (default %(default)s)")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="with --no-resume: start afresh over a run already in --out",
    )
    seed = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "seed")
    add_run_options(
        parser,
        defaults={"seed": seed, "dtype": "float32", "progress": True},
        choices={"dtype": DTYPES},
    )


def _train_fields() -> list[dataclasses.Field]:
    """The TrainConfig fields that are training options (its seed is the run option --seed)."""
    from shapedtx.training import TrainConfig

    return [f for f in dataclasses.fields(TrainConfig) if f.name != "seed"]


def data_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``load_corpus`` arguments of the data options (``path`` absolute, so that a probe
    from another folder reads the same files)."""
    path = None if args.data is None else str(Path(args.data).absolute())
    return {
        "path": path,
        "suffix": args.suffix,
        "max_bytes": args.max_bytes,
        "val_fraction": args.val_fraction,
    }


WARM_UP_NOTE = (
    "the first steps compile the causal shaped-attention kernels (numba) and take a few "
    "seconds each; the bar speeds up after them (compiled code is cached for later runs)"
)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``--dtype`` name (:data:`DTYPES`); imports torch."""
    import torch

    return getattr(torch, name)


def _compiles(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether training runs the numba-compiled causal centring (shaped attention on CPU in
    float32/float64: ``shapedtx._compiled_centring.applies``), whose first calls compile."""
    import torch

    return (
        config.attention == "shaped"
        and device.type == "cpu"
        and dtype in (torch.float32, torch.float64)
    )


def run(args: argparse.Namespace) -> int:
    from shapedtx.training import TrainConfig

    # the configs first (torch-free): a usage error is reported before torch loads
    model_config = config_from_args(args)
    settings = RunArgs.from_args(args)
    train_config = TrainConfig(
        **{f.name: getattr(args, f.name) for f in _train_fields()}, seed=settings.seed
    )
    from shapedtx.training import (
        ResumeMismatch,
        TrainingDiverged,
        load_corpus,
        plot_collapse,
        plot_losses,
    )
    from shapedtx.training import train as train_model
    from shapedtx.training.trainer import CHECKPOINT, LOG

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    held = any((out / name).exists() for name in (CHECKPOINT, LOG))
    if held and not args.resume and not args.overwrite:
        raise UsageError(
            f"--out {out} holds a run; pass --overwrite with --no-resume to start afresh "
            "over it, or resume it (drop --no-resume)"
        )
    check_output_folder(out, overwrite=True)  # writable; its content is the run's to manage
    device = settings.torch_device()
    settings.apply_threads()
    corpus = data_settings(args)
    try:
        data = load_corpus(**corpus)
    except ValueError as err:  # its path is --data
        raise option_error(err, corpus, renamed={"path": "--data"}) from None
    out.mkdir(parents=True, exist_ok=True)
    write_json(corpus, out / DATA_SETTINGS)  # `shapedtx probe RUN` reads the same data
    dtype = torch_dtype(settings.dtype)
    if settings.progress and _compiles(model_config, device, dtype):
        sys.stderr.write(f"shapedtx train: {WARM_UP_NOTE}\n")
    try:
        result = train_model(
            model_config,
            data,
            train_config,
            out_dir=out,
            device=device,
            dtype=dtype,
            resume=args.resume,
            progress=bool(settings.progress),  # on by default here
        )
    except ResumeMismatch as err:
        flag = "--" + err.key.split(".")[-1].replace("_", "-")
        raise UsageError(
            f"--out {out} holds a checkpoint written with {flag} {err.saved!r} (now "
            f"{err.current!r}); use another --out, or --no-resume --overwrite to start afresh "
            "there"
        ) from None
    except TrainingDiverged as err:
        sys.stderr.write(f"shapedtx train: diverged: {err}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(
            f"shapedtx train: interrupted; the same command resumes from {out / 'checkpoint.pt'}\n"
        )
        return 130
    plot_losses({f"{model_config.attention}, norm={model_config.norm}": result.log}).savefig(
        out / "loss.png", dpi=120
    )
    plot_collapse(result.log).savefig(out / "collapse.png", dpi=120)
    val = result.log["val_loss"].dropna("step")
    print(f"final validation loss {float(val[-1]):.4f} nats/byte at step {int(val.step[-1])}")
    print(f"wrote {out / 'log.nc'}, {out / 'checkpoint.pt'}, data.json, loss.png, collapse.png")
    return 0
