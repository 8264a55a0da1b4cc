"""``train``: causal byte-level LM training of ``Transformer(config)`` with exact resume.

Per step: sample windows (a CPU generator: the same batches on every device), forward,
backward, clip the global gradient norm, AdamW step, scheduler step. Nothing in a step
synchronises with the host; the loss and gradient-norm finiteness is accumulated on the
device and checked at every log row (and so before every checkpoint, since checkpoints fall
on log rows). A checkpoint holds the model, optimizer, scheduler, data-generator state, step
and log rows, so a resumed run reproduces the uninterrupted one exactly (bitwise on CPU).
"""

from __future__ import annotations

import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor
from tqdm.auto import tqdm

from .._validation import ParameterError, check_bool, check_device, check_number
from ..config import ModelConfig, check_config
from ..design import param_count
from ..diagnostics import Monitor
from ..files import atomic_path
from ..results import save_dataset
from .config import TrainConfig
from .data import VOCAB, ByteCorpus, WindowSampler, fixed_windows
from .log import log_dataset
from .model import LanguageModel
from .step import CompiledStep, autocast_context
from .transfer import GROUPS, eps_multiplier, lr_multipliers, proxy_config

CHECKPOINT = "checkpoint.pt"
LOG = "log.nc"

LossHook = Callable[[int, Tensor], Tensor]


class ResumeMismatch(ValueError):
    """``out_dir`` holds a checkpoint written with other settings; carries ``key``, ``saved``,
    ``current`` and ``path``."""

    def __init__(self, key: str, saved: Any, current: Any, path: Path) -> None:
        super().__init__(
            f"resume: checkpoint {path} was written with {key}={saved!r}, now {current!r}; "
            "use another out_dir or resume=False"
        )
        self.key, self.saved, self.current, self.path = key, saved, current, path


class TrainingDiverged(FloatingPointError):
    """The loss or the gradient norm became NaN/inf; carries ``step``, ``checkpoint``, ``log``."""

    def __init__(
        self, message: str, *, step: int, checkpoint: Path | None, log: xr.Dataset | None
    ) -> None:
        super().__init__(message)
        self.step, self.checkpoint, self.log = step, checkpoint, log


@dataclass
class TrainResult:
    """The trained model, its log Dataset, the last checkpoint (None without ``out_dir``)
    and whether the run reached its last step."""

    model: LanguageModel
    log: xr.Dataset
    checkpoint: Path | None
    finished: bool = True
    """False when ``time_limit`` stopped the run before ``steps`` (resume it by calling again)."""


def lr_factor(step: int, config: TrainConfig) -> float:
    """Learning-rate multiplier of 0-based step ``step``: linear warm-up, then the decay of
    ``config.schedule`` from 1 to ``min_lr_ratio`` (reached at ``step = steps``): a cosine over
    the steps after the warm-up, or (``"wsd"``) 1 until ``config.cooldown_start`` and a linear
    cooldown after it."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    start = config.warmup_steps if config.schedule == "cosine" else config.cooldown_start
    progress = min(max(step - start, 0) / (config.steps - start), 1.0)
    if config.schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0 - progress
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * decay


def _atomic_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _block_grad_norms(model: LanguageModel) -> Tensor:
    """Gradient norm of every block's parameters: (depth,) on the model's device."""
    norms = []
    for block in model.body.blocks:
        grads = [p.grad.norm() for p in block.parameters() if p.grad is not None]
        norms.append(torch.stack(grads).norm() if grads else model.position.new_zeros(()))
    return torch.stack(norms).float()


@torch.no_grad()
def evaluate(model: LanguageModel, batches: list[Tensor]) -> Tensor:
    """Mean held-out loss over fixed batches (each (B, m + 1)) -> scalar tensor (no sync)."""
    was_training = model.training
    model.eval()
    loss = torch.stack([model.loss(b) for b in batches]).mean()
    model.train(was_training)
    return loss


def _make_optimizer(model: LanguageModel, config: TrainConfig) -> torch.optim.AdamW:
    # weight matrices only: the linear maps and the token embedding; not the biases, gains
    # or the position embeddings (a (max_len, n) table, but not a map between features)
    decayed = {name for name, p in model.named_parameters() if p.dim() >= 2} - {"position"}
    factors = _lr_factors(model.config, config)
    group_of = model.parameter_groups()
    groups = []
    for decay in (True, False):
        # the token embedding (factor 1) first: the log's lr is group 0's, the base lr
        for group, factor in sorted(factors.items(), key=lambda kv: kv[0] != "embedding"):
            params = [
                p
                for name, p in model.named_parameters()
                if (name in decayed) == decay and (factor is None or group_of[name] == group)
            ]
            if params:
                lr = config.lr * (factor or 1.0)
                wd = config.weight_decay if decay else 0.0
                groups.append({"params": params, "weight_decay": wd, "lr": lr})
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=_eps(model.config, config)
    )


def _eps(model_config: ModelConfig, config: TrainConfig) -> float:
    """AdamW's epsilon: ``config.eps``, times :func:`shapedtx.eps_multiplier` from the proxy
    under ``eps_scaling="completep"``."""
    if config.eps_scaling == "constant":
        return config.eps
    proxy = proxy_config(model_config, config.lr_proxy_width, config.lr_proxy_depth)
    return config.eps * eps_multiplier(model_config, proxy)


def _lr_factors(model_config: ModelConfig, config: TrainConfig) -> dict[str, float | None]:
    """Parameter group -> lr factor (:func:`shapedtx.lr_multipliers` from the proxy of
    ``config.lr_proxy_width``/``lr_proxy_depth``, the block vectors' times
    ``config.vector_lr_factor``); ``{"all": None}`` without a proxy or a vector factor."""
    if not config.lr_proxy_width and config.vector_lr_factor == 1.0:
        return {"all": None}
    factors = dict.fromkeys(GROUPS, 1.0)
    if config.lr_proxy_width:
        proxy = proxy_config(model_config, config.lr_proxy_width, config.lr_proxy_depth)
        factors.update(lr_multipliers(model_config, proxy))
    factors["block_vector"] *= config.vector_lr_factor
    out: dict[str, float | None] = dict(factors)
    return out


def _device_memory(device: torch.device) -> int | None:
    """Bytes of memory of ``device`` (physical memory for the CPU), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def _check_fits(
    model_config: ModelConfig, config: TrainConfig, dtype: torch.dtype, device: torch.device
) -> None:
    """ValueError, before anything is built, if the weights, their gradients and the two
    AdamW moments alone (a lower bound of the memory a step needs) exceed the device's
    memory: a model of 1e9 blocks would otherwise take hours to build and then fail."""
    n = model_config.width
    params = param_count(model_config).total + (2 * VOCAB + config.seq_len) * n
    need = 4 * params * torch.empty((), dtype=dtype).element_size()
    have = _device_memory(device)
    if have is not None and need > have:
        raise ParameterError(
            "model_config",
            f"model_config: about {params:.3g} parameters need at least {need / 2**30:.3g} GiB "
            f"(weights, gradients and AdamW moments in {dtype}), more than the "
            f"{have / 2**30:.3g} GiB of {device}: lower depth, width or mlp_ratio",
        )


def _check_data(data: ByteCorpus, config: TrainConfig) -> None:
    for split in ("train", "val"):
        size = getattr(data, split).numel()
        if size <= config.seq_len + 1:
            raise ParameterError(
                "seq_len",
                f"seq_len must be < the {split} split size minus 1 ({size} bytes), "
                f"got seq_len={config.seq_len}",
            )


def _rows_to_plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in r.items()} for r in rows]


def _rows_from_plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: np.asarray(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows]


def train(
    model_config: ModelConfig,
    data: ByteCorpus,
    config: TrainConfig | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    resume: bool = True,
    progress: bool = True,
    loss_hook: LossHook | None = None,
    snapshots: Sequence[int] = (),
    branch_from: str | os.PathLike | None = None,
    compile: bool | str = False,
    time_limit: float | None = None,
) -> TrainResult:
    """Train ``LanguageModel(model_config)`` on ``data`` with the settings ``config``.

    Args:
        model_config: the architecture; ``causal`` must be True.
        data: a :class:`ByteCorpus` (see :func:`load_corpus`).
        config: optimisation settings (default ``TrainConfig()``).
        out_dir: folder for ``checkpoint.pt`` and ``log.nc`` (written atomically at every
            checkpoint and at the end); ``None``: nothing is written and no resume.
        device, dtype: where and in which precision the model runs (default CPU, float32).
        resume: continue from ``out_dir/checkpoint.pt`` if present (it must have been written
            with the same configs and data); a finished run is returned as is.
        progress: show a tqdm progress bar.
        loss_hook: ``hook(step, loss) -> loss`` applied before the backward pass (1-based step;
            for tests: inject a non-finite loss or simulate an interruption).
        snapshots: steps (multiples of ``log_interval``, at most ``steps``) at which a copy of
            the checkpoint is kept as ``out_dir/checkpoint-<step>.pt`` (needs ``out_dir``):
            the branch points of shorter WSD horizons.
        branch_from: a checkpoint (e.g. a snapshot of a longer run) to start from when
            ``out_dir`` holds none: its run must have the same model, data and settings except
            ``steps``, and both schedules must give the same learning rate at every step up to
            the checkpoint's (true for two WSD runs when the checkpoint is at or before this
            run's ``cooldown_start``), so the branch continues as if this run had been trained
            from the start (bitwise on CPU).
        compile: ``False`` (default): eager. ``True`` or ``"loss"``: the training loss (forward
            and backward) through ``torch.compile`` (fused kernels: far fewer kernel
            launches, the bottleneck of small models on a GPU). ``"step"``: the whole step
            (forward, backward, clipping, a foreach AdamW, the log's sums) compiled, with no
            host sync, and on CUDA recorded once as CUDA graphs and replayed
            (:class:`shapedtx.training.step.CompiledStep`); not with ``loss_hook``. The first
            steps pay the compilation. Same run as eager up to floating-point rounding (each
            resumes the others' checkpoints); evaluation and metrics run uncompiled.
        time_limit: seconds of wall time for this call (needs ``out_dir``): at the last log
            row that leaves time for another log interval at the pace so far, a checkpoint is
            written and the run returns unfinished (``TrainResult.finished`` False); calling
            again resumes it. ``None``: no limit.

    Raises:
        TrainingDiverged: the loss or gradient norm became NaN/inf (message gives the step and
            the last good checkpoint, which is kept; the log is saved with status "diverged").
    """
    deadline = _deadline(time_limit, out_dir)
    run = _prepare(
        model_config, data, config, out_dir=out_dir, device=device, dtype=dtype, resume=resume,
        progress=progress, loss_hook=loss_hook, snapshots=snapshots, branch_from=branch_from,
        compile=compile, deadline=deadline,
    )  # fmt: skip
    return _drive(run)


def _prepare(
    model_config: ModelConfig,
    data: ByteCorpus,
    config: TrainConfig | None,
    *,
    out_dir: str | os.PathLike | None,
    device: str | torch.device | None,
    dtype: torch.dtype,
    resume: bool,
    progress: bool,
    loss_hook: LossHook | None,
    snapshots: Sequence[int],
    branch_from: str | os.PathLike | None,
    compile: bool | str,
    deadline: float | None,
    desc: str = "train",
) -> Generator[None, None, TrainResult]:
    """:func:`train`'s arguments checked (ParameterError before anything is computed), and
    its run as a generator (:func:`_run`)."""
    check_config(model_config, "model_config")
    config = config or TrainConfig()
    if not isinstance(config, TrainConfig):
        raise ParameterError(
            "config", f"config must be a TrainConfig or None, got {type(config).__name__}"
        )
    if not isinstance(data, ByteCorpus):
        raise ParameterError(
            "data", f"data must be a ByteCorpus (load_corpus), got {type(data).__name__}"
        )
    _check_data(data, config)
    device = check_device(device)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ParameterError("dtype", f"dtype must be a floating-point torch dtype, got {dtype!r}")
    check_bool("resume", resume)
    check_bool("progress", progress)
    mode = _compile_mode(compile)
    if mode == "step" and loss_hook is not None:
        raise ParameterError("loss_hook", "loss_hook must be None with compile='step'")
    snapshot_steps = _check_snapshots(snapshots, config, out_dir)
    branch = Path(branch_from) if branch_from is not None else None
    if branch is not None and not branch.is_file():
        raise ParameterError(
            "branch_from", f"branch_from must be an existing checkpoint file, got {str(branch)!r}"
        )
    _check_fits(model_config, config, dtype, device)
    return _run(model_config, data, config, out_dir, device, dtype, resume, progress, loss_hook,
                snapshot_steps, branch, mode, deadline, desc)  # fmt: skip


def _compile_mode(compile: Any) -> str:
    """``"none"``, ``"loss"`` or ``"step"`` from ``train``'s ``compile`` argument."""
    if isinstance(compile, bool):
        return "loss" if compile else "none"
    if compile not in ("loss", "step"):
        raise ParameterError(
            "compile", f"compile must be False, True (= 'loss') or 'step', got {compile!r}"
        )
    return str(compile)


def _deadline(time_limit: Any, out_dir: str | os.PathLike | None) -> float | None:
    """``time.monotonic()`` at which a call of ``time_limit`` seconds ends (None: no limit)."""
    if time_limit is None:
        return None
    check_number("time_limit", time_limit, 0.0, 1e9, low_open=True)
    if out_dir is None:
        raise ParameterError("time_limit", "time_limit needs out_dir (a checkpoint to resume)")
    return time.monotonic() + float(time_limit)


def _drive(run: Generator[None, None, TrainResult]) -> TrainResult:
    """Run the steps of ``run`` (see :func:`_run`) to the end; its result."""
    while True:
        try:
            next(run)
        except StopIteration as stop:
            return stop.value


def _run(
    model_config: ModelConfig,
    data: ByteCorpus,
    config: TrainConfig,
    out_dir: str | os.PathLike | None,
    device: torch.device,
    dtype: torch.dtype,
    resume: bool,
    progress: bool,
    loss_hook: LossHook | None,
    snapshot_steps: frozenset[int],
    branch: Path | None,
    mode: str,
    deadline: float | None,
    desc: str = "train",
) -> Generator[None, None, TrainResult]:
    """The run of the checked arguments of :func:`train` as a generator: it yields after every
    step and returns the TrainResult (the model is built at the first ``next``)."""
    out = Path(out_dir) if out_dir is not None else None
    ckpt_path = out / CHECKPOINT if out is not None else None

    def run() -> Generator[None, None, TrainResult]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = LanguageModel(model_config, config.seq_len)
        model.to(device=device, dtype=dtype)
        optimizer = _make_optimizer(model, config)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config))
        train_data, val_data = data.train.to(device), data.val.to(device)
        sampler = WindowSampler(train_data, config.batch_size, config.seq_len, config.seed + 1)
        val_batches = list(
            fixed_windows(val_data, config.eval_batches * config.batch_size, config.seq_len).split(
                config.batch_size
            )
        )
        metric_tokens = fixed_windows(val_data, config.metrics_batch, config.seq_len)[:, :-1]
        with warnings.catch_warnings():  # a model without attention: the note goes into the log
            warnings.simplefilter("ignore", RuntimeWarning)
            monitor = Monitor(model, metric_tokens)
        attrs = {
            "corpus": data.source,
            "corpus_fingerprint": data.fingerprint(),
            "train_bytes": int(data.train.numel()),
            "val_bytes": int(data.val.numel()),
            "seed": config.seed,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "version": _version(),
            "compiled": int(mode != "none"),
            "compile": mode,
        }
        identity = {
            **model_config.to_attrs(),
            **config.to_attrs(),
            "data": attrs["corpus_fingerprint"],
        }

        rows: list[dict[str, Any]] = []
        step = 0
        saved_step: list[int | None] = [None]  # step of the last checkpoint written or loaded
        origin: dict[str, Any] = {}  # where a branched run came from (kept in its checkpoints)
        resuming = resume and ckpt_path is not None and ckpt_path.exists()
        if resuming or branch is not None:
            source = ckpt_path if resuming else branch
            assert source is not None
            # CPU first: the generator state must stay a CPU tensor; the model and optimizer
            # state are copied to the parameters' device by load_state_dict
            state = torch.load(source, map_location="cpu", weights_only=True)
            if resuming:
                _check_identity(state["identity"], identity, source)
                origin = dict(state.get("origin", {}))
            else:
                _check_branch(state["identity"], identity, int(state["step"]), config, source)
                origin = {"branched_from": str(source), "branch_step": int(state["step"])}
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            _set_sampler_state(sampler, state["generator"], source)
            rows, step = _rows_from_plain(state["rows"]), int(state["step"])
            # a checkpoint's step is a logged step: update_size continues
            monitor.remember_weights()
            saved_step[0] = step if resuming else None
        attrs.update(origin)

        def build_log(status: str, **extra: Any) -> xr.Dataset:
            notes = {"monitor_missing": monitor.note} if monitor.note else {}
            all_attrs = {**attrs, **notes, "status": status, **extra}
            return log_dataset(
                rows,
                model_config,
                config,
                all_attrs,
                weights=monitor.weight_names,
                gains=monitor.gain_names,
            )

        def checkpoint() -> None:
            if out is None or ckpt_path is None:
                return
            state = {
                "identity": identity,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "generator": sampler.state(),
                "rows": _rows_to_plain(rows),
                "step": step,
                "origin": origin,
            }
            _atomic_save(state, ckpt_path)
            saved_step[0] = step
            if step in snapshot_steps:
                with atomic_path(out / f"checkpoint-{step}.pt") as tmp:
                    shutil.copyfile(ckpt_path, tmp)
            save_dataset(build_log("finished" if step == config.steps else "running"), out / LOG)

        def diverged(bad_step: int, what: str) -> TrainingDiverged:
            good = rows[-1]["step"] if rows else 0
            saved = ckpt_path if saved_step[0] is not None else None
            where = (
                f"last good checkpoint kept: {ckpt_path} (step {saved_step[0]})"
                if saved
                else "no checkpoint was written (out_dir not given or none due yet)"
            )
            log = build_log("diverged", diverged_step=bad_step) if rows else None
            if log is not None and out is not None:
                save_dataset(log, out / LOG)
            return TrainingDiverged(
                f"non-finite {what} at step {bad_step} (lr {scheduler.get_last_lr()[0]:.3g}, "
                f"last finite log row at step {good}); training stopped, {where}",
                step=bad_step,
                checkpoint=saved,
                log=log,
            )

        def log_row(train_loss: float, lr: float, grad_norm: float, blocks: np.ndarray) -> None:
            row: dict[str, Any] = {
                "step": step,
                "train_loss": train_loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "grad_norm_block": blocks,
                "val_loss": math.nan,
            }
            if step % config.eval_interval == 0 or step == config.steps:
                row["val_loss"] = evaluate(model, val_batches).item()
                if not math.isfinite(row["val_loss"]):
                    raise diverged(step, "validation loss")
            row.update(monitor.measure())  # covariance, activation, attention, update metrics
            rows.append(row)

        if step == 0 and not rows:  # not again when resuming from the step-0 checkpoint
            log_row(math.nan, math.nan, math.nan, np.full(model_config.depth, np.nan))
            if config.checkpoint_interval:
                checkpoint()

        model.train()
        loss_sum = torch.zeros((), device=device, dtype=torch.float32)
        first_bad = torch.full((), -1, device=device, dtype=torch.int64)
        since_log = 0
        max_norm = config.grad_clip if config.grad_clip > 0 else math.inf
        params = list(model.parameters())
        compiled = CompiledStep(model, optimizer, config) if mode == "step" else None
        if compiled is not None:
            compiled.start_at(step)
        loss_of = torch.compile(model.loss) if mode == "loss" else model.loss
        last_log = time.monotonic()
        bar = tqdm(total=config.steps, initial=step, disable=not progress, desc=desc)
        with bar:
            while step < config.steps:
                batch = sampler()
                lr = float(scheduler.get_last_lr()[0])
                log_now = (step + 1) % config.log_interval == 0 or step + 1 == config.steps
                if compiled is not None:
                    compiled(batch, lr_factor(step, config))
                else:
                    with autocast_context(config, device):
                        loss = loss_of(batch)
                    if loss_hook is not None:
                        loss = loss_hook(step + 1, loss)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if log_now:
                        blocks = _block_grad_norms(model)
                    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
                    loss = loss.detach().float()
                    finite = torch.isfinite(loss) & torch.isfinite(total)
                    first_bad = torch.where(~finite & (first_bad < 0), step + 1, first_bad)
                    optimizer.step()
                    loss_sum += loss
                scheduler.step()
                step += 1
                since_log += 1
                bar.update(1)
                if log_now:
                    if compiled is not None:
                        train_loss, grad_norm, block_norms, bad = compiled.read(since_log)
                    else:
                        bad = int(first_bad.item())
                        train_loss = (loss_sum / since_log).item()
                        grad_norm, block_norms = total.item(), blocks.cpu().numpy()
                        loss_sum.zero_()
                    if bad >= 0:
                        raise diverged(bad, "loss or gradient norm")
                    log_row(train_loss, lr, grad_norm, block_norms)
                    since_log = 0
                    bar.set_postfix(loss=f"{rows[-1]['train_loss']:.3f}")
                    now = time.monotonic()
                    stop = deadline is not None and step < config.steps
                    stop = stop and now + (now - last_log) > deadline  # type: ignore[operator]
                    last_log = now
                    due = config.checkpoint_interval and step % config.checkpoint_interval == 0
                    if due or step == config.steps or step in snapshot_steps or stop:
                        checkpoint()
                    if stop:
                        return TrainResult(model, build_log("running"), ckpt_path, finished=False)
                yield
        return TrainResult(model, build_log("finished"), ckpt_path)

    return run()


def _check_identity(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    # a field added to the configs after the checkpoint was written is the same run when the
    # current value is the field's default (the behaviour the older version had)
    defaults = {**ModelConfig().to_attrs(), **TrainConfig().to_attrs()}
    # in the fields' own order: a changed width is named, not the head_dim derived from it
    for key in [*current, *(k for k in saved if k not in current)]:
        if key not in saved and key in defaults and current[key] == defaults[key]:
            continue
        if saved.get(key) != current.get(key):
            raise ResumeMismatch(key, saved.get(key), current.get(key), path)


def _set_sampler_state(sampler: WindowSampler, state: Tensor, path: Path) -> None:
    # until 2026-11-28 (CHANGELOG) a run on CUDA drew its batches with a CUDA generator: its
    # state cannot continue the CPU generator's order
    cpu_state = torch.Generator().get_state()
    if state.dtype != cpu_state.dtype or state.shape != cpu_state.shape:
        raise ResumeMismatch("batch generator", "a device generator", "the CPU generator", path)
    sampler.set_state(state)


def _check_snapshots(
    snapshots: Sequence[int], config: TrainConfig, out_dir: str | os.PathLike | None
) -> frozenset[int]:
    steps = frozenset(snapshots)
    if steps and out_dir is None:
        raise ParameterError(
            "snapshots", "snapshots need out_dir (they are files beside the checkpoint)"
        )
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= config.steps:
            raise ParameterError(
                "snapshots", f"snapshots must be ints in [1, steps={config.steps}], got {s!r}"
            )
        if s % config.log_interval:
            raise ParameterError(
                "snapshots",
                f"snapshots must be multiples of log_interval={config.log_interval} "
                f"(checkpoints fall on log rows), got {s}",
            )
    return steps


def _check_branch(
    saved: dict[str, Any], current: dict[str, Any], step: int, config: TrainConfig, path: Path
) -> None:
    """ValueError unless a run of ``config`` can continue the checkpoint ``path`` (taken at
    ``step``): everything but ``steps`` and ``checkpoint_interval`` (bookkeeping) equal, and
    the same lr at every step up to and including ``step`` (the optimizer holds the lr of the
    step after the checkpoint)."""
    free = ("train.steps", "train.checkpoint_interval")
    try:
        _check_identity(
            {k: v for k, v in saved.items() if k not in free},
            {k: v for k, v in current.items() if k not in free},
            path,
        )
    except ResumeMismatch as err:
        raise ParameterError(
            "branch_from",
            f"branch_from: checkpoint {path} was written with {err.key}={err.saved!r}, "
            f"now {err.current!r}; a branch may differ only in steps and checkpoint_interval",
        ) from None
    if step > config.steps:
        raise ParameterError(
            "branch_from",
            f"branch_from: checkpoint {path} is at step {step}, beyond steps={config.steps}",
        )
    parent = TrainConfig.from_attrs(saved)
    for k in range(step + 1):
        if lr_factor(k, parent) != lr_factor(k, config):
            raise ParameterError(
                "branch_from",
                f"branch_from: the checkpoint's schedule (steps={parent.steps}) and this one "
                f"(steps={config.steps}) differ at step {k} < {step + 1}; branch a WSD run "
                f"at or before cooldown_start={config.cooldown_start}",
            )


def _version() -> str:
    from .. import __version__

    return __version__


def configs_of(log: xr.Dataset) -> tuple[ModelConfig, TrainConfig]:
    """The (ModelConfig, TrainConfig) stored in a training log's attrs."""
    return ModelConfig.from_attrs(log.attrs), TrainConfig.from_attrs(log.attrs)


__all__ = [
    "ResumeMismatch",
    "TrainResult",
    "TrainingDiverged",
    "configs_of",
    "evaluate",
    "lr_factor",
    "train",
]
