"""Learning-rate transfer: per-parameter-group Adam learning rates from a tuned proxy.

A user tunes the peak learning rate ``lr`` of a small proxy (width n0, depth d0) and trains a
target (width n, depth d) of the same parametrisation with ``lr * lr_multipliers(target,
proxy)[group]`` for every parameter group. The rules, each from its paper (Adam;
docs/guide/transfer.md, docs/theory.md#transfer), with ``m_N = n / n0`` and ``m_L = d / d0``:

| rule (:func:`lr_rule`) | hidden matrices | readout | block vectors | embeddings, final LN |
|---|---|---|---|---|
| ``standard`` | 1 | 1 | 1 | 1 |
| ``mup`` | 1/m_N | 1/m_N | 1 | 1 |
| ``depth`` (a = ``depth_alpha``) | m_L^(a-1) / m_N | 1/m_N | m_L^(a-1) | 1 |

``standard`` applies to every model not named below (e.g. ``pre_ln``, GPT-2's init); ``mup``
to ``residual="scaled"`` (``shaped``, ``shaped_t``); ``depth`` to ``depth_alpha`` = a > 0
(``pre_ln_depth_mup``: a = 1/2, ``pre_ln_completep``: a = 1).

``standard`` is standard parametrisation: the same lr everywhere, the practice whose optimum
drifts with width (Yang et al. 2022, Tensor Programs V). ``mup`` is muP's Adam rule for width
(Tensor Programs V, Table 3: hidden and output weights ~ 1/fan_in, vectors and input weights
constant) and no depth rule: for the shaped models the hypothesis under test is that the SDE's
gamma rule alone (``gamma_t``) makes the optimum independent of depth. ``depth`` is CompleteP's
Table 1 (Dey et al. 2025, and its reference implementation EleutherAI/nanoGPT-mup, branch
``completep``): branch multiplier m_L^(-a), hidden-weight Adam lr m_L^(a-1) / m_N, LayerNorm
gains and biases inside the blocks m_L^(a-1); a = 1/2 is depth-muP's Adam rule (Yang et al.
2023, Tensor Programs VI: multiplier 1/sqrt(L), Adam lr ~ 1/sqrt(L)).

With ``ModelConfig.output_multiplier`` (the unembedding reads ``x / m_N``, muP's output
multiplier) the readout's factor is 1 under ``mup`` and ``depth``: the multiplier carries the
width dependence that the lr ``1/m_N`` carries without it (Tensor Programs V, Table 3's
alternative form; CompleteP's reference ties the unembedding to the embedding, lr factor 1).
:func:`eps_multiplier` is CompleteP's AdamW epsilon rule as its reference applies it (one
epsilon for every group, ``m_N^-1 m_L^-a``), used by the trainer under
``TrainConfig.eps_scaling="completep"``; muP's ``1/d_head`` attention scale
(``ModelConfig.attention_scale``) and init (``ModelConfig.init="mup"``) are model fields.
Not applied here: the weight-decay scaling (the trainer's weight decay is 0 by default).
"""

from __future__ import annotations

from typing import Literal

from .._validation import ParameterError
from ..config import ModelConfig, check_config

Rule = Literal["standard", "mup", "depth"]
GROUPS: tuple[str, ...] = ("hidden", "readout", "block_vector", "embedding", "final")
"""Parameter groups of a :class:`shapedtx.training.LanguageModel`: the weight matrices of the
blocks, the unembedding matrix, the blocks' vectors (biases, norm gains, trainable gains), the
token and position embeddings, and the final LayerNorm with the unembedding bias
(:meth:`shapedtx.training.LanguageModel.parameter_groups` sorts a model's parameters)."""

SOURCES: dict[str, str] = {
    "standard": "standard parametrisation: one lr for every parameter (no transfer rule; "
    "Yang et al. 2022, Tensor Programs V, show its optimum drifts with width)",
    "mup": "muP for Adam (Yang et al. 2022, Tensor Programs V, Table 3): hidden and readout "
    "matrices lr ~ 1/width; no depth rule (the shaped model's hypothesis: gamma^2 d / n held "
    "fixed, docs/theory.md#transfer, keeps the optimum in depth; measured in "
    "examples/transfer)",
    "depth": "CompleteP for Adam (Dey et al. 2025, Table 1; EleutherAI/nanoGPT-mup, branch "
    "completep): branch multiplier (d/d0)^-a, hidden matrices lr (d/d0)^(a-1) / (n/n0), "
    "block vectors (d/d0)^(a-1); a = 1/2 is depth-muP (Yang et al. 2023, Tensor Programs VI: "
    "Adam lr ~ 1/sqrt(depth))",
}
"""Each rule's statement and source."""


def lr_rule(config: ModelConfig) -> Rule:
    """The learning-rate rule of ``config``'s parametrisation (see the module docstring):
    ``"depth"`` when ``depth_alpha > 0``, ``"mup"`` for ``residual="scaled"``, else
    ``"standard"``."""
    check_config(config)
    if config.depth_alpha > 0:
        return "depth"
    if config.residual == "scaled":
        return "mup"
    return "standard"


def _same_parametrisation(target: ModelConfig, proxy: ModelConfig) -> None:
    """ParameterError unless ``target`` and ``proxy`` differ only in width and depth (and the
    sizes derived from them: gamma under ``gamma_t``, head sizes)."""
    derived = {"width", "depth", "gamma", "head_dim", "key_dim"}
    for name in ModelConfig.__dataclass_fields__:
        if name in derived:
            continue
        if getattr(target, name) != getattr(proxy, name):
            raise ParameterError(
                "proxy",
                f"proxy must differ from the target only in width and depth, got "
                f"{name}={getattr(proxy, name)!r} (target {getattr(target, name)!r})",
            )
    if target.residual == "scaled" and target.gamma_t == 0 and target.gamma != proxy.gamma:
        raise ParameterError(
            "proxy",
            f"proxy must have the target's fixed gamma, got {proxy.gamma!r} (target "
            f"{target.gamma!r}); set gamma_t to derive gamma from depth and width",
        )


def lr_multipliers(target: ModelConfig, proxy: ModelConfig) -> dict[str, float]:
    """Group (:data:`GROUPS`) -> the factor on the lr tuned at ``proxy`` that its rule
    (:func:`lr_rule`) prescribes at ``target``; every factor is 1 when the two are equal.

    ``target`` and ``proxy`` must be the same parametrisation at two sizes (they may differ
    only in width and depth). Example: CompleteP from width 64, depth 8 to width 256, depth 64
    keeps the hidden-matrix lr at 1/4 (1/m_N = 1/4, m_L^0 = 1); depth-muP makes it 1/4 *
    8^(-1/2)."""
    check_config(target, "target")
    check_config(proxy, "proxy")
    _same_parametrisation(target, proxy)
    m_n = target.width / proxy.width
    m_l = target.depth / proxy.depth
    rule = lr_rule(target)
    out = dict.fromkeys(GROUPS, 1.0)
    if rule == "standard":
        return out
    out["hidden"] = 1.0 / m_n
    out["readout"] = 1.0 if target.output_multiplier else 1.0 / m_n
    if rule == "depth":
        depth_factor = m_l ** (target.depth_alpha - 1.0)
        out["hidden"] *= depth_factor
        out["block_vector"] = depth_factor
    return {k: float(v) for k, v in out.items()}


def eps_multiplier(target: ModelConfig, proxy: ModelConfig) -> float:
    """The factor on AdamW's epsilon tuned at ``proxy`` that CompleteP prescribes at
    ``target``: ``m_N^-1 m_L^-a`` with ``m_N = n / n0``, ``m_L = d / d0`` and ``a`` the
    ``depth_alpha`` (1 for CompleteP, 0: muP's ``1 / m_N``), applied to every parameter
    group as the reference (EleutherAI/nanoGPT-mup, branch ``completep``) applies it
    (docs/theory.md#transfer). Example: CompleteP from depth 4 to depth 64 at the proxy's
    width divides epsilon by 16. ``target`` and ``proxy`` as in :func:`lr_multipliers`."""
    check_config(target, "target")
    check_config(proxy, "proxy")
    _same_parametrisation(target, proxy)
    m_n = target.width / proxy.width
    m_l = target.depth / proxy.depth
    return float(m_n**-1.0 * m_l ** (-target.depth_alpha))


def proxy_config(target: ModelConfig, width: int, depth: int) -> ModelConfig:
    """``target`` at the proxy's ``width`` and ``depth`` (head sizes derived from the width
    follow it, as do gamma under ``gamma_t`` and the ``depth_alpha`` multiplier)."""
    check_config(target, "target")
    derived = target.head_dim == target.width // target.heads and target.key_dim == target.head_dim
    sizes = {"head_dim": None, "key_dim": None} if derived else {}
    return target.replace(width=width, depth=depth, **sizes)


__all__ = ["GROUPS", "SOURCES", "eps_multiplier", "lr_multipliers", "lr_rule", "proxy_config"]
