"""The weight-update meter: how far the blocks' parameters moved, per block and group.

:class:`UpdateMeter` keeps a reference copy of the blocks' parameters on their device and
measures the change ``W_t - W_s`` by a few multi-tensor (``torch._foreach_*``) operations over
all of them, without a host synchronisation: :meth:`UpdateMeter.relative` gives the monitor's
``update_size`` (``||W_t - W_s||_F / ||W_s||_F`` per weight matrix) and
:meth:`UpdateMeter.mean_square` the coordinate check's ``update_rms`` squared (the mean
square of the update over a group's entries).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import ParameterError
from .hooks import NamedBlocks

GroupRule = Callable[[str, Tensor], "str | None"]
"""``(name in the block, parameter) -> group name``, or None for a parameter not measured."""


def matrix_name(name: str, parameter: Tensor) -> str | None:
    """The group of each weight matrix its own (its name in the block, e.g.
    ``"attention.layers.query.weight"``); None for vectors and scalars."""
    return name if parameter.dim() >= 2 else None


def relative_update(new: Tensor, old: Tensor) -> Tensor:
    """``||W_t - W_s||_F / ||W_s||_F`` (float64, 0-d), ``new = W_t``, ``old = W_s`` of one shape."""
    old64 = old.detach().double()
    diff = torch.linalg.vector_norm(new.detach().double() - old64)
    return diff / torch.linalg.vector_norm(old64)


class UpdateMeter:
    """The change of the blocks' parameters since a reference, per (block, group).

    ``rule(name, parameter)`` sorts each block's parameters (names relative to the block) into
    groups, named in order of first appearance (:attr:`groups`); None leaves one out. There is
    no reference until :meth:`remember`; :meth:`relative` and :meth:`mean_square` measure
    against it and then make the current parameters the reference.
    """

    def __init__(self, blocks: NamedBlocks, rule: GroupRule) -> None:
        self.params: list[Tensor] = []
        cells: list[tuple[int, int]] = []  # (block, group) of every parameter
        names: list[str] = []
        for layer, (_, block) in enumerate(blocks):
            for name, p in block.named_parameters():
                group = rule(name, p)
                if group is None:
                    continue
                if not isinstance(group, str):
                    raise ParameterError(
                        "groups",
                        f"groups(name, parameter) must return a group name (str) or None, got "
                        f"{type(group).__name__} for {name!r}",
                    )
                if group not in names:
                    names.append(group)
                self.params.append(p)
                cells.append((layer, names.index(group)))
        self.groups, self.depth = names, len(blocks)
        count = len(names)
        self._flat = [layer * count + group for layer, group in cells]  # index in (L * G,)
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.dtype = torch.float64 if any(p.dtype == torch.float64 for p in self.params) else (
            torch.float32
        )  # fmt: skip
        self.cells = torch.tensor(self._flat, dtype=torch.long, device=self.device)
        sizes = torch.zeros(self.depth * count, dtype=self.dtype)
        for cell, param in zip(self._flat, self.params, strict=True):
            sizes[cell] += param.numel()
        self.sizes = sizes.to(self.device)
        self.previous: list[Tensor] | None = None

    @torch.no_grad()
    def remember(self) -> None:
        """Make the current parameters the reference (copied in place after the first)."""
        if self.previous is None:
            self.previous = [p.detach().clone() for p in self.params]
        elif hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(self.previous, self.params)
        else:  # pragma: no cover - torch < 2.1
            for q, p in zip(self.previous, self.params, strict=True):
                q.copy_(p)

    @torch.no_grad()
    def relative(self) -> Tensor:
        """``(L, G)`` float64 ``||W_t - W_s||_F / ||W_s||_F`` (:func:`relative_update`) with
        one parameter per cell (as :func:`matrix_name` sorts them), on the parameters'
        device; NaN without a reference and where a block lacks the group. Then
        :meth:`remember`."""
        if len(set(self._flat)) != len(self._flat):
            raise ValueError("relative() needs one parameter per (block, group)")
        out = torch.full(
            (self.depth * len(self.groups),), math.nan, dtype=torch.float64, device=self.device
        )
        if self.previous is not None and self.params:
            norms = torch._foreach_norm(self.previous)
            current = [p.detach() for p in self.params]
            change = torch._foreach_norm(torch._foreach_sub(current, self.previous))
            out[self.cells] = torch.stack(change).double() / torch.stack(norms).double()
        self.remember()
        return out.view(self.depth, len(self.groups))

    @torch.no_grad()
    def mean_square(self) -> Tensor:
        """``(L, G)`` mean square of the update over each cell's entries,
        ``sum ||W_t - W_s||^2 / entries`` (NaN where a block lacks the group), on the
        parameters' device in float32 (float64 if a parameter is). Then :meth:`remember`."""
        if not self.params:
            return torch.empty(self.depth, 0)
        if self.previous is None:
            raise ValueError("mean_square() needs a reference: call remember() first")
        diffs = torch._foreach_sub(self.params, self.previous)
        norms = [n.to(self.dtype) for n in torch._foreach_norm(diffs)]
        sums = torch.zeros_like(self.sizes).index_add_(0, self.cells, torch.stack(norms).square())
        self.remember()
        return (sums / self.sizes).view(self.depth, len(self.groups))  # 0 / 0: NaN


__all__ = ["GroupRule", "UpdateMeter", "matrix_name", "relative_update"]
