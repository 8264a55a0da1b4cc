"""Forward hooks on a model's residual blocks: the one hook machinery of the instruments.

:func:`find_blocks` finds the residual blocks of any PyTorch model (:data:`BLOCK_PATHS`);
:class:`BlockHooks` hooks them for the forward passes run inside it (the block's input stream
at its first pre-hook call, its output at its first hook call, a count of its calls);
:func:`run_once` calls the model once without gradients inside :class:`BlockHooks` (in eval
mode, every module's training flag restored, every hook removed, also on error) and checks
that each block ran exactly once; :func:`record_streams` runs it to keep the residual stream
entering the first block and leaving every block. ``shapedtx.probe``, ``shapedtx.Monitor``
(and ``CovarianceProbe``) and ``shapedtx.coord_check`` all measure through them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._validation import ParameterError

BLOCK_PATHS: tuple[str, ...] = (
    "blocks",
    "body.blocks",
    "transformer.h",
    "h",
    "model.layers",
    "layers",
)
"""Where :func:`find_blocks` looks for the residual blocks (a non-empty ``nn.ModuleList`` or
``nn.Sequential``), in this order: the library's ``Transformer`` and timm ViTs (``blocks``),
its ``LanguageModel`` (``body.blocks``), GPT-2 ``LMHeadModel``s and nanoGPT
(``transformer.h``), ``GPT2Model`` (``h``), Llama-style models (``model.layers``, ``layers``).
Failing those, the ``layers`` of the one ``torch.nn.TransformerEncoder`` (or
``TransformerDecoder``) anywhere in the model."""

Blocks = str | nn.Module | Sequence[str | nn.Module] | None
"""What ``blocks=`` takes: None (found), a module name, a ModuleList / Sequential, or a list of
modules or names."""

NamedBlocks = list[tuple[str, nn.Module]]
"""The blocks as :func:`find_blocks` returns them: ``(name, module)`` pairs, in order."""

Handle = torch.utils.hooks.RemovableHandle


def _attribute(model: nn.Module, path: str) -> Any:
    obj: Any = model
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def named_submodule(
    modules: dict[str, nn.Module],
    names: dict[nn.Module, str],
    entry: Any,
    parameter: str,
    index: int,
) -> tuple[str, nn.Module]:
    """``(name, module)`` of ``entry``, a module of ``modules`` (``model.named_modules()``, with
    ``names`` its inverse) or its name; ParameterError naming ``parameter[index]`` otherwise."""
    if isinstance(entry, str):
        if entry not in modules:
            raise ParameterError(
                parameter, f"{parameter}[{index}]: model has no submodule named {entry!r}"
            )
        return entry, modules[entry]
    if not isinstance(entry, nn.Module) or entry not in names:
        raise ParameterError(parameter, f"{parameter}[{index}] is not a submodule of model")
    return names[entry], entry


def find_blocks(model: nn.Module, blocks: Blocks = None) -> NamedBlocks:
    """The residual blocks of ``model`` as ``(name, module)`` pairs, in order.

    ``blocks``: ``None`` (look in :data:`BLOCK_PATHS`), a list of modules or of names in
    ``model.named_modules()``, or one ``nn.ModuleList`` / ``nn.Sequential`` (or its name).
    """
    if not isinstance(model, nn.Module):
        raise ParameterError(
            "model", f"model must be a torch.nn.Module, got {type(model).__name__}"
        )
    names = {module: name for name, module in model.named_modules()}
    modules = dict(model.named_modules())
    if blocks is None:
        for path in BLOCK_PATHS:
            found = _attribute(model, path)
            if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found) > 0:
                return [(names[b], b) for b in found]
        stacks = [
            (name, m)
            for name, m in model.named_modules()
            if isinstance(m, (nn.TransformerEncoder, nn.TransformerDecoder)) and len(m.layers)
        ]
        if len(stacks) == 1:  # torch's own stack, wherever it sits in the model
            return [(names[b], b) for b in stacks[0][1].layers]
        if stacks:
            raise ParameterError(
                "blocks",
                f"{type(model).__name__} holds several torch Transformer stacks ("
                f"{', '.join(name or '(the model)' for name, _ in stacks)}); pass blocks= one "
                f"stack's layers, e.g. blocks={(stacks[0][0] + '.layers').lstrip('.')!r}",
            )
        raise ParameterError(
            "blocks",
            f"no residual blocks found in {type(model).__name__} (looked for "
            f"{', '.join(BLOCK_PATHS)}); pass blocks=[...]: the block modules, or their "
            f"names in model.named_modules(), in order",
        )
    if isinstance(blocks, str):
        if blocks not in modules:
            raise ParameterError("blocks", f"blocks: model has no submodule named {blocks!r}")
        blocks = modules[blocks]
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        blocks = list(blocks)
    if isinstance(blocks, nn.Module) or not isinstance(blocks, Sequence):
        raise ParameterError(
            "blocks",
            "blocks must be a list of modules or module names, or a ModuleList/Sequential, "
            f"got {type(blocks).__name__}",
        )
    if len(blocks) == 0:
        raise ParameterError("blocks", "blocks must name at least one block")
    out = [named_submodule(modules, names, block, "blocks", i) for i, block in enumerate(blocks)]
    if len({id(b) for _, b in out}) != len(out):
        raise ParameterError("blocks", "blocks must not repeat a module")
    return out


def residual_stream(value: Any) -> Tensor | None:
    """The residual stream in a block's input or output: a tensor, the first element of a
    tuple/list (as ``transformers`` blocks return), or the first tensor of a mapping."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    if isinstance(value, Mapping):
        for item in value.values():
            if isinstance(item, Tensor):
                return item
    return None


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(inputs)``; a tuple/list is passed as positional, a dict as keyword arguments."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


OnInput = Callable[[int, Tensor | None, Any], None]
"""``on_input(index, stream, raw)``: block ``index``'s input stream (:func:`residual_stream` of
its arguments, None if none) and what it was taken from."""

OnOutput = Callable[[int, Any], None]
"""``on_output(index, output)``: what block ``index`` returned."""


class BlockHooks:
    """Forward hooks on ``blocks`` for the forward passes run inside ``with BlockHooks(...)``.

    In each pass, ``on_input(i, stream, raw)`` runs at the first call of block ``i``'s forward
    pre-hook (every block's with ``all_inputs``, else the first block's only) and
    ``on_output(i, output)`` at the first call of its forward hook; ``attach()`` registers
    further hooks (returning their handles), removed with the rest on leaving. :meth:`check`
    after a pass: ParameterError unless every block ran exactly once; it starts the next pass.
    """

    def __init__(
        self,
        blocks: NamedBlocks,
        *,
        on_input: OnInput | None = None,
        on_output: OnOutput | None = None,
        all_inputs: bool = False,
        attach: Callable[[], list[Handle]] = list,
    ) -> None:
        self.blocks = blocks
        self.on_input, self.on_output, self.attach = on_input, on_output, attach
        self.inputs = range(len(blocks) if all_inputs else 1) if on_input is not None else ()
        self.calls = [0] * len(blocks)
        self.seen = [False] * len(blocks)
        self.handles: list[Handle] = []

    def _pre(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self.seen[index] and self.on_input is not None:
                self.seen[index] = True
                raw = args[0] if args else kwargs
                x = (
                    residual_stream(args)
                    if args
                    else residual_stream(kwargs.get("hidden_states", kwargs))
                )
                self.on_input(index, x, raw)

        return hook

    def _post(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.calls[index] += 1
            if self.calls[index] == 1 and self.on_output is not None:
                self.on_output(index, output)

        return hook

    def __enter__(self) -> BlockHooks:
        try:
            for i in self.inputs:
                pre = self.blocks[i][1].register_forward_pre_hook(self._pre(i), with_kwargs=True)
                self.handles.append(pre)
            for i, (_, block) in enumerate(self.blocks):
                self.handles.append(block.register_forward_hook(self._post(i)))
            self.handles += self.attach()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def check(self, who: str, during: str = "during model(inputs)") -> None:
        """ParameterError (``blocks``) unless every block ran exactly once in the pass (``who``
        names the caller); then the next pass starts."""
        calls = self.calls
        self.calls, self.seen = [0] * len(self.blocks), [False] * len(self.blocks)
        for (name, _), count in zip(self.blocks, calls, strict=True):
            if count != 1:
                raise ParameterError(
                    "blocks",
                    f"block {name!r} ran {count} times {during}; the {who} needs every block "
                    f"to run exactly once",
                )


def run_once(
    model: nn.Module,
    inputs: Any,
    blocks: NamedBlocks,
    *,
    on_input: OnInput | None = None,
    on_output: OnOutput | None = None,
    eval_mode: bool = True,
    who: str = "probe",
    attach: Callable[[], list[Handle]] = list,
) -> None:
    """Call ``model(inputs)`` (:func:`call_model`) once without gradients inside
    :class:`BlockHooks` (``on_input`` for the first block only), in eval mode if ``eval_mode``.
    Every hook is removed and every module's training flag restored, also on error; then
    ParameterError unless every block ran exactly once (``who`` names the caller)."""
    training = {module: module.training for module in model.modules()}
    hooks = BlockHooks(blocks, on_input=on_input, on_output=on_output, attach=attach)
    try:
        with hooks:
            if eval_mode:
                model.eval()
            with torch.no_grad():
                try:
                    call_model(model, inputs)
                except (RuntimeError, TypeError) as err:
                    raise ParameterError(
                        "inputs",
                        f"model(inputs) failed ({type(err).__name__}: {err}); check that inputs "
                        f"has the type and shape the model expects",
                    ) from err
    finally:
        for module, mode in training.items():
            module.training = mode
    hooks.check(who)


class Streams(NamedTuple):
    """What :func:`record_streams` returns."""

    kept: list[Any]
    """``keep(X_l)`` for layers 0..L (layer 0 the input of the first block)."""
    shape: torch.Size
    """The stream's shape ``(B, m, n)``."""
    dtype: torch.dtype
    """The stream's dtype."""


def record_streams(
    model: nn.Module,
    inputs: Any,
    blocks: NamedBlocks,
    *,
    keep: Callable[[Tensor], Any] = Tensor.detach,
    on_output: OnOutput | None = None,
    eval_mode: bool = True,
    who: str = "probe",
    attach: Callable[[], list[Handle]] = list,
) -> Streams:
    """Run the model once (:func:`run_once`) and keep ``keep(X_l)`` of the residual stream
    ``X_l: (B, m, n)`` entering the first block (l = 0) and leaving every block; ``on_output``
    and ``attach`` as :func:`run_once`. ParameterError where a block's input or output holds no
    tensor, the stream is not ``(batch, tokens, width)`` with at least 2 tokens, or a block
    changes its shape."""
    kept: list[Any] = [None] * (len(blocks) + 1)
    info: dict[str, Any] = {}

    def store(index: int, where: str, x: Tensor | None, what: Any) -> None:
        if x is None:
            raise ParameterError(
                "blocks",
                f"{where} is {type(what).__name__}, not a tensor (or a tuple starting with "
                f"one): the {who} records the residual stream, pass blocks= that return it",
            )
        if x.dim() != 3 or x.shape[-2] < 2:
            raise ParameterError(
                "inputs",
                f"{where} has shape {tuple(x.shape)}; the {who} needs (batch, tokens, width) "
                f"with at least 2 tokens: check the shape of inputs (a batch dimension?)",
            )
        if "shape" in info and x.shape != info["shape"]:
            raise ParameterError(
                "blocks",
                f"{where} has shape {tuple(x.shape)}, the block input "
                f"{tuple(info['shape'])}: blocks must keep the residual stream's shape",
            )
        info.setdefault("shape", x.shape)
        info.setdefault("dtype", x.dtype)
        kept[index] = keep(x)

    def on_input(index: int, x: Tensor | None, raw: Any) -> None:
        store(0, f"the input of block {blocks[0][0]!r}", x, raw)

    def output(index: int, out: Any) -> None:
        store(index + 1, f"the output of block {blocks[index][0]!r}", residual_stream(out), out)
        if on_output is not None:
            on_output(index, out)

    run_once(
        model, inputs, blocks, on_input=on_input, on_output=output, eval_mode=eval_mode,
        who=who, attach=attach,
    )  # fmt: skip
    # every block ran once (checked by run_once): each input and output was kept
    return Streams(kept, info["shape"], info["dtype"])


__all__ = [
    "BLOCK_PATHS",
    "BlockHooks",
    "Blocks",
    "NamedBlocks",
    "Streams",
    "call_model",
    "find_blocks",
    "named_submodule",
    "record_streams",
    "residual_stream",
    "run_once",
]
