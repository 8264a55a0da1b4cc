"""The training step captured as a compiled graph (``train(..., compile="step")``).

Forward, backward, gradient clipping, AdamW and the log's accumulators (train-loss sum,
first non-finite step, gradient norms) run as tensor operations only, with the learning
rate read from a device tensor: nothing in a step waits for the host, and under
``torch.compile(mode="reduce-overhead")`` on CUDA the compiled graphs are recorded once as
CUDA graphs and replayed each step. With a torch whose Dynamo traces ``torch.autograd.grad``
(``torch._dynamo.config.trace_autograd_ops``) the whole step is one graph; otherwise two:
the loss with its backward (AOTAutograd) and the update. AdamW is torch's own foreach
implementation (``torch.optim.adam.adam``, capturable), on the state tensors of the trainer's
``torch.optim.AdamW``, so checkpoints are the eager trainer's and either resumes the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.optim.adam import adam

from .config import TrainConfig
from .model import LanguageModel

WHOLE_GRAPH = hasattr(torch._dynamo.config, "trace_autograd_ops")
"""Whether this torch's Dynamo can trace the backward pass into the step's one graph."""

RECOMPILE_LIMIT = 256
"""Compiled versions of the step kept per process (one per run of ``train_many``, at most)."""

COMPILE_BACKEND = "inductor"
"""The ``torch.compile`` backend of :class:`CompiledStep` (``"aot_eager"`` traces the same
graphs without generating kernels: the tests' fast check of the tracing)."""


def autocast_context(
    config: TrainConfig, device: torch.device
) -> contextlib.AbstractContextManager[Any]:
    """The forward pass's precision context of ``config.autocast`` on ``device``."""
    if config.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _clip_coefficient(total: Tensor, max_norm: float) -> Tensor:
    """``min(1, max_norm / (total + 1e-6))``, as ``torch.nn.utils.clip_grad_norm_``."""
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


class CompiledStep:
    """One training step of ``model`` (forward, backward, clipping, AdamW) compiled once.

    Call it with a batch (B, m + 1) and the step's learning-rate factor
    (:func:`shapedtx.training.lr_factor`) after ``factor.fill_``: see :meth:`__call__`. The
    loss is summed on the device and :meth:`read` returns the log's values (one host sync).

    Args:
        model: the language model (its parameters are updated in place).
        optimizer: the trainer's ``torch.optim.AdamW`` (its groups' lr, weight decay, betas
            and eps; its state tensors are created here if absent and moved to the device).
        config: the run's settings (``grad_clip``, ``autocast``).
        backend, mode: ``torch.compile``'s (``backend=None``: :data:`COMPILE_BACKEND`);
            ``mode=None``: ``"reduce-overhead"`` (CUDA graphs) with inductor on CUDA, the
            default elsewhere.
        whole: one graph for the whole step (default where this torch can trace the backward,
            :data:`WHOLE_GRAPH`); ``False``: the loss with its backward, and the update.
    """

    def __init__(
        self,
        model: LanguageModel,
        optimizer: torch.optim.AdamW,
        config: TrainConfig,
        *,
        backend: str | None = None,
        mode: str | None = None,
        whole: bool | None = None,
    ) -> None:
        device = model.position.device
        self.model, self.device = model, device
        self.whole = WHOLE_GRAPH if whole is None else whole and WHOLE_GRAPH
        self.max_norm = config.grad_clip if config.grad_clip > 0 else None
        self._autocast = lambda: autocast_context(config, device)
        self.groups: list[dict[str, Any]] = []
        self.params: list[Tensor] = []
        base_lrs = []
        for group in optimizer.param_groups:
            base_lrs.append(float(group.get("initial_lr", group["lr"])))
            params = [p for p in group["params"] if p.requires_grad]
            state = [self._state(optimizer, p) for p in params]
            beta1, beta2 = group["betas"]
            self.groups.append(
                {
                    "slice": slice(len(self.params), len(self.params) + len(params)),
                    "params": params,
                    "exp_avgs": [s["exp_avg"] for s in state],
                    "exp_avg_sqs": [s["exp_avg_sq"] for s in state],
                    "steps": [s["step"] for s in state],
                    "weight_decay": float(group["weight_decay"]),
                    "beta1": float(beta1),
                    "beta2": float(beta2),
                    "eps": float(group["eps"]),
                }
            )
            self.params.extend(params)
        # the optimizer's arithmetic runs here: no "scheduler.step() before optimizer.step()"
        optimizer._opt_called = True  # type: ignore[attr-defined]  # torch's private flag
        index = {id(p): i for i, p in enumerate(self.params)}
        self.blocks = [
            [index[id(p)] for p in block.parameters() if id(p) in index]
            for block in model.body.blocks
        ]
        f32 = torch.zeros((), device=device, dtype=torch.float32)
        self.factor = f32.clone()  # the step's lr factor, set before each call
        self.loss_sum = f32.clone()
        self.grad_norm = f32.clone()
        self.block_norms = f32.new_zeros(len(self.blocks))
        # tensors, not constants of the graph: runs that differ only in lr share compiled code
        self.lrs = torch.tensor(base_lrs, device=device, dtype=torch.float32)
        self.first_bad = torch.full((), -1, device=device, dtype=torch.int64)
        self.step = torch.zeros((), device=device, dtype=torch.int64)
        state = [t for g in self.groups for k in ("exp_avgs", "exp_avg_sqs", "steps") for t in g[k]]
        buffers = [self.factor, self.lrs, self.loss_sum, self.grad_norm, self.block_norms]
        for t in (*buffers, self.first_bad, self.step, *state):
            torch._dynamo.mark_static_address(t, guard=False)  # no recompile per run
        backend = backend if backend is not None else COMPILE_BACKEND
        if mode is None and device.type == "cuda" and backend == "inductor":
            mode = "reduce-overhead"
        options: dict[str, Any] = {"fullgraph": True, "backend": backend, "mode": mode}
        # each run's step is compiled for its own tensors: many runs in one process
        # (train_many) must not hit Dynamo's default limit of 8 versions of one function
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else None
        settings: dict[str, Any] = {limit or "cache_size_limit": RECOMPILE_LIMIT}
        if self.whole:
            patch = torch._dynamo.config.patch(trace_autograd_ops=True, **settings)
            self._whole_step: Callable[[Tensor], None] = patch(torch.compile(self._step, **options))
        else:
            patch = torch._dynamo.config.patch(**settings)
            self._loss = patch(torch.compile(self._forward, **options))
            self._update_step = patch(torch.compile(self._update, **options))

    @staticmethod
    def _state(optimizer: torch.optim.AdamW, p: Tensor) -> dict[str, Tensor]:
        """AdamW's state of ``p`` as its capturable form keeps it (the step count a float32
        tensor on the parameter's device), created as ``torch.optim.AdamW`` creates it."""
        state = optimizer.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
        return state

    def start_at(self, step: int) -> None:
        """Number the next step ``step + 1`` (a resumed run): for :meth:`read`'s first bad step."""
        self.step.fill_(step)

    def __call__(self, batch: Tensor, lr_factor: float) -> None:
        """One step on ``batch`` (B, m + 1) at learning rate ``lr_factor`` times each group's.

        ``fill_`` of a number launches one small kernel and does not wait for the device."""
        self.factor.fill_(lr_factor)
        if self.whole:
            self._whole_step(batch)
            return
        loss = self._loss(batch)
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self._update_step(grads, loss.detach())
        for p in self.params:
            p.grad = None

    def _forward(self, batch: Tensor) -> Tensor:
        with self._autocast():
            return self.model.loss(batch)

    def _step(self, batch: Tensor) -> None:
        loss = self._forward(batch)
        grads = torch.autograd.grad(loss, self.params, materialize_grads=True)
        self._update(list(grads), loss.detach())

    @torch.no_grad()
    def _update(self, grads: list[Tensor], loss: Tensor) -> None:
        """Clip, AdamW and the accumulators, from the gradients and the loss (tensor ops only)."""
        norms = torch.stack(torch._foreach_norm(grads)).float()
        total = torch.linalg.vector_norm(norms)
        for i, members in enumerate(self.blocks):
            if members:
                self.block_norms[i] = torch.linalg.vector_norm(norms[members])
        if self.max_norm is not None:
            torch._foreach_mul_(grads, _clip_coefficient(total, self.max_norm).to(grads[0].dtype))
        for j, g in enumerate(self.groups):
            adam(
                g["params"],
                grads[g["slice"]],
                g["exp_avgs"],
                g["exp_avg_sqs"],
                [],
                g["steps"],
                foreach=True,
                capturable=True,
                decoupled_weight_decay=True,
                amsgrad=False,
                beta1=g["beta1"],
                beta2=g["beta2"],
                lr=self.factor * self.lrs[j],
                weight_decay=g["weight_decay"],
                eps=g["eps"],
                maximize=False,
            )
        loss = loss.float()
        self.step.add_(1)
        bad = ~(torch.isfinite(loss) & torch.isfinite(total)) & (self.first_bad < 0)
        self.first_bad.copy_(torch.where(bad, self.step, self.first_bad))
        self.loss_sum.add_(loss)
        self.grad_norm.copy_(total)

    def read(self, steps: int) -> tuple[float, float, np.ndarray, int]:
        """(mean train loss over the last ``steps`` steps, the last step's gradient norm, its
        per-block norms, the first non-finite step or -1); one host sync. Resets the sum."""
        values = torch.cat(
            [
                (self.loss_sum / steps).double()[None],
                self.grad_norm.double()[None],
                self.first_bad.double()[None],
                self.block_norms.double(),
            ]
        ).cpu()
        self.loss_sum.zero_()
        mean, total, bad = (float(v) for v in values[:3])
        return mean, total, values[3:].numpy(), int(bad)


__all__ = ["COMPILE_BACKEND", "WHOLE_GRAPH", "CompiledStep", "autocast_context"]
