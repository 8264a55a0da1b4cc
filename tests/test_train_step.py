"""``train(..., compile="step")``: the whole step compiled (shapedtx.training.step), bfloat16
autocast, and ``time_limit``."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch

import shapedtx.training.step as step_module
from shapedtx import ModelConfig, TrainConfig, load_corpus, preset, train
from shapedtx._validation import ParameterError
from shapedtx.training.model import LanguageModel
from shapedtx.training.step import WHOLE_GRAPH, CompiledStep
from shapedtx.training.trainer import _make_optimizer

TEXT = "def f(x):\n    return [i * x for i in range(9)]  # one step, one graph\n" * 40
# the shaped model with its trainable shape (slopes per channel, per-head gains, temperature,
# residual weights)
SHAPED = preset("shaped", width=8, depth=2, heads=2, causal=True).replace(
    mlp_slopes="channel",
    attention_gains="trainable",
    temperature="trainable",
    residual_gains="trainable",
)
CONFIG = TrainConfig(
    steps=6, batch_size=2, seq_len=8, lr=1e-2, warmup_steps=1, log_interval=2, eval_interval=2,
    eval_batches=1, metrics_batch=2, seed=3, weight_decay=0.1,
)  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(TEXT)
    return load_corpus(path, val_fraction=0.2)


def _model(config: ModelConfig = SHAPED, seed: int = 3) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(config, CONFIG.seq_len)


def _batches(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, 256, (2, CONFIG.seq_len + 1), generator=generator) for _ in range(count)
    ]


@pytest.mark.skipif(not WHOLE_GRAPH, reason="this torch's Dynamo does not trace the backward")
@pytest.mark.slow  # Dynamo traces the step: about a minute on a busy CPU
def test_the_whole_step_is_one_graph_without_breaks():
    model = _model()
    step = CompiledStep(model, _make_optimizer(model, CONFIG), CONFIG, backend="eager")
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        explained = torch._dynamo.explain(step._step)(_batches(1)[0])
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.slow  # Dynamo traces the step: about a minute on a busy CPU
def test_the_update_is_one_graph_without_breaks():
    """The second graph of a torch that cannot trace the backward: clipping and AdamW."""
    model = _model()
    step = CompiledStep(model, _make_optimizer(model, CONFIG), CONFIG, backend="eager")
    loss = model.loss(_batches(1)[0])
    loss.backward()
    grads = [p.grad for p in step.params]
    explained = torch._dynamo.explain(step._update)(grads, loss.detach())
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_the_step_reads_nothing_back_to_the_host():
    """No ``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()`` or ``float(tensor)`` in the step's
    code (fullgraph compilation would also refuse them); ``read`` is the one sync."""
    source = "".join(
        inspect.getsource(f)
        for f in (
            CompiledStep.__call__,
            CompiledStep._step,
            CompiledStep._forward,
            CompiledStep._update,
            step_module._clip_coefficient,
        )
    )
    assert not re.search(r"\.(item|cpu|tolist|numpy)\(|(?<![.\w])(float|int|bool)\(", source)
    assert ".cpu()" in inspect.getsource(CompiledStep.read)


@pytest.mark.slow  # Dynamo traces the step: about a minute on a busy CPU
def test_the_compiled_step_is_torch_adamw_with_clipping():
    """Same seed, same batches: the compiled step's weights and losses are the eager
    ``torch.optim.AdamW`` + ``clip_grad_norm_`` ones to float32 rounding (two lr groups:
    weight decay on matrices only; the lr factor changes every step)."""
    config = CONFIG.replace(grad_clip=0.5)
    compiled_model, eager_model = _model(), _model()
    step = CompiledStep(
        compiled_model, _make_optimizer(compiled_model, config), config, backend="eager"
    )
    optimizer = _make_optimizer(eager_model, config)
    params = list(eager_model.parameters())
    eager_losses = []
    for k, batch in enumerate(_batches(4)):
        factor = (k + 1) / 4
        step(batch, factor)
        for group in optimizer.param_groups:
            group["lr"] = group.setdefault("base", group["lr"]) * factor
        loss = eager_model.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        total = torch.nn.utils.clip_grad_norm_(params, 0.5)
        optimizer.step()
        eager_losses.append(loss.item())
    mean, grad_norm, blocks, bad = step.read(4)
    assert bad == -1
    assert mean == pytest.approx(np.mean(eager_losses), rel=1e-5)
    assert grad_norm == pytest.approx(total.item(), rel=1e-5)
    assert blocks.shape == (SHAPED.depth,) and np.all(blocks > 0)
    for (name, a), b in zip(compiled_model.named_parameters(), params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


@pytest.mark.slow  # Dynamo traces the step: about a minute on a busy CPU
def test_a_non_finite_loss_is_reported_at_its_step():
    model = _model()
    step = CompiledStep(model, _make_optimizer(model, CONFIG), CONFIG, backend="eager")
    step.start_at(10)
    batch = _batches(1)[0]
    step(batch, 1.0)
    with torch.no_grad():
        model.unembed.bias.fill_(float("nan"))
    step(batch, 1.0)
    step(batch, 1.0)
    assert step.read(3)[3] == 12


@pytest.mark.slow
def test_compiled_step_training_is_the_eager_run_and_resumes_it(data, tmp_path, monkeypatch):
    """``compile="step"`` gives the eager run's log to float tolerance, and continues an
    eager run's checkpoint (the state of ``torch.optim.AdamW`` is shared)."""
    monkeypatch.setattr(step_module, "COMPILE_BACKEND", "aot_eager")  # no kernel generation
    eager = train(SHAPED, data, CONFIG, progress=False).log
    # the eager run's snapshot at step 4 of the same schedule, continued by the compiled step
    train(SHAPED, data, CONFIG, out_dir=tmp_path / "a", progress=False, snapshots=(4,))
    compiled = train(
        SHAPED, data, CONFIG, progress=False, compile="step",
        branch_from=tmp_path / "a" / "checkpoint-4.pt", out_dir=tmp_path / "b",
    ).log  # fmt: skip
    fresh = train(SHAPED, data, CONFIG, progress=False, compile="step").log
    assert fresh.attrs["compile"] == "step" and fresh.attrs["compiled"] == 1
    for log in (fresh, compiled):
        for name in ("train_loss", "val_loss", "grad_norm", "grad_norm_block"):
            a, b = eager[name].values, log[name].values
            assert np.allclose(a, b, rtol=1e-5, equal_nan=True), (name, a, b)


def test_bfloat16_autocast_trains_close_to_float32(data):
    full = train(SHAPED, data, CONFIG, progress=False).log
    half = train(SHAPED, data, CONFIG.replace(autocast="bfloat16"), progress=False).log
    assert half.attrs["train.autocast"] == "bfloat16"
    a, b = full["train_loss"].values[1:], half["train_loss"].values[1:]
    assert np.all(np.isfinite(b)) and not np.array_equal(a, b)  # it did run in bfloat16
    assert np.allclose(a, b, rtol=0.02)


def test_a_checkpoint_resumes_only_with_the_same_autocast(data, tmp_path):
    from shapedtx.training import ResumeMismatch

    train(SHAPED, data, CONFIG.replace(steps=2), out_dir=tmp_path, progress=False)
    with pytest.raises(ResumeMismatch, match="autocast"):
        train(SHAPED, data, CONFIG.replace(steps=2, autocast="bfloat16"), out_dir=tmp_path,
              progress=False)  # fmt: skip


def test_time_limit_stops_at_a_checkpoint_and_the_next_call_finishes_the_run(data, tmp_path):
    whole = train(SHAPED, data, CONFIG, progress=False).log
    first = train(SHAPED, data, CONFIG, out_dir=tmp_path, progress=False, time_limit=1e-9)
    assert not first.finished and first.log.attrs["status"] == "running"
    assert first.log["step"].values[-1] == CONFIG.log_interval  # stopped at the first log row
    assert first.checkpoint is not None and first.checkpoint.is_file()
    second = train(SHAPED, data, CONFIG, out_dir=tmp_path, progress=False)
    assert second.finished and second.log.attrs["status"] == "finished"
    for name in ("train_loss", "val_loss", "grad_norm"):
        assert np.array_equal(whole[name].values, second.log[name].values, equal_nan=True)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"compile": "graph"}, "compile"),
        ({"compile": 1}, "compile"),
        ({"compile": "step", "loss_hook": lambda step, loss: loss}, "loss_hook"),
        ({"time_limit": 10.0}, "time_limit"),  # no out_dir
        ({"time_limit": 0.0, "out_dir": "unused"}, "time_limit"),
    ],
)
def test_bad_step_arguments_name_the_parameter(data, kwargs, parameter):
    with pytest.raises(ParameterError) as info:
        train(SHAPED, data, CONFIG, progress=False, **kwargs)
    assert info.value.parameter == parameter


def test_autocast_must_be_a_known_precision():
    with pytest.raises(ParameterError, match="'none', 'bfloat16'") as info:
        TrainConfig(autocast="float16")
    assert info.value.parameter == "autocast"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")
def test_the_compiled_step_does_not_sync_on_cuda(data):
    model = _model().cuda()
    step = CompiledStep(model, _make_optimizer(model, CONFIG), CONFIG)
    batches = [b.cuda() for b in _batches(4)]
    for batch in batches[:2]:  # compile and record the CUDA graphs
        step(batch, 1.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[2:]:
            step(batch, 0.5)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert np.isfinite(step.read(4)[0])
