"""Depth/width/head-size design rules (docs/theory.md#depth-width and #head-size)."""

import math

import pytest

from shapedtx import ModelConfig, Transformer
from shapedtx.design import (
    GPT3_MODELS,
    LW_FIT,
    DepthWidthFit,
    allocation,
    depth_threshold,
    design_row,
    gpt3_table,
    head_size_report,
    optimal_shape,
    optimal_width,
    param_count,
    regime,
)


# Anchors of docs/theory.md#depth-width
# ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "depth", "width"), [(1.739e11, 80.5, 13.4e3), (1e12, 94.7, 29.6e3)]
)
def test_fit_reproduces_its_anchor_points(params, depth, width):
    shape = optimal_shape(params)
    assert shape.depth == pytest.approx(depth, abs=0.05)
    # docs/theory.md quotes 13.4K and 29.6K; the fit gives 13.42K and 29.66K (the text truncates)
    assert shape.width == pytest.approx(width, rel=0.005)
    assert 12 * shape.depth * shape.width**2 == pytest.approx(params, rel=1e-12)


def test_small_gpt3_comes_out_shallow_as_stated():
    # docs/theory.md#depth-width: "125M: L* ~ 23 at d* ~ 555" (size 12 L d^2 of GPT-3 Small)
    shape = optimal_shape(12 * 12 * 768**2)
    assert shape.depth == pytest.approx(23.0, abs=0.1)
    assert shape.width == pytest.approx(555, abs=2)


def test_wrong_constants_miss_the_anchor():
    # power: a 2% change of either constant moves the 175B anchor out of tolerance
    for fit in (DepthWidthFit(5.039 * 1.02, 0.0555), DepthWidthFit(5.039, 0.0555 * 1.02)):
        assert abs(optimal_shape(1.739e11, fit=fit).depth - 80.5) > 0.5


@pytest.mark.parametrize("params", [1e5, 3.3e7, 1.2e9, 1.739e11, 1e12, 1e15])
def test_round_trip(params):
    shape = optimal_shape(params)
    assert optimal_width(shape.depth) == pytest.approx(shape.width, rel=1e-10)
    # and the other way: the budget of (L, d*(L)) gives back L
    L = 37.25
    assert optimal_shape(12 * L * optimal_width(L) ** 2).depth == pytest.approx(L, rel=1e-10)


def test_rounded_shape_spends_the_budget():
    shape = optimal_shape(1e12, multiple=128)
    assert shape.depth_rounded == 95 and shape.width_rounded % 128 == 0
    assert shape.params_rounded == pytest.approx(1e12, rel=0.01)
    assert optimal_shape(10.0).depth_rounded == 1  # tiny budgets still give depth >= 1
    # a coarse multiple moves the depth rather than leave the budget unspent (1e6: 5 x 128)
    small = optimal_shape(1e6, multiple=128)
    assert (small.depth_rounded, small.width_rounded) == (5, 128)
    assert small.params_rounded == 12 * 5 * 128**2


def test_threshold_and_regime():
    assert depth_threshold(3**7) == pytest.approx(7.0)
    assert regime(6, 3**7) == "depth-efficient"
    assert regime(7, 3**7) == "depth-inefficient"
    assert regime(96, 12288) == "depth-inefficient"


def test_allocation_matches_fixed_size_comparison():
    L = 40.0
    d = optimal_width(L)
    assert allocation(L, d) == "near optimal"
    assert allocation(L, 0.5 * d) == "too deep"  # at fixed size: width below d*(L)
    assert allocation(L, 2.0 * d) == "too shallow"


# Parameter counts -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(width=16, depth=3, attention="shaped", mlp="shaped_relu", heads=4),
        ModelConfig(width=16, depth=2, attention="softmax", mlp="relu", heads=2, out_proj=True),
        ModelConfig(width=12, depth=2, heads=3, head_dim=8, key_dim=5, out_proj=True),
        ModelConfig(width=10, depth=4, attention="none", mlp="relu"),
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_param_count_matches_module(config, bias):
    model = Transformer(config, bias=bias)
    counted = param_count(config, bias=bias)
    with pytest.raises(ValueError, match="bias must be True or False"):
        param_count(config, bias="yes")
    with pytest.raises(ValueError, match="bias must be True or False"):
        Transformer(config, bias="y")
    with pytest.raises(ValueError, match="fused must be True or False"):
        Transformer(config, fused=2)
    assert counted.total == sum(p.numel() for p in model.parameters())
    assert counted.convention == 12 * config.depth * config.width**2


def test_convention_equals_actual_for_gpt_like_blocks():
    # 4 n^2 attention (heads of size n/h with W^O) + 2 n^2 shapedtx MLP: actual is half of 12 L n^2
    config = ModelConfig(width=32, depth=5, mlp="relu", heads=4, out_proj=True)
    counted = param_count(config)
    assert counted.attention == 5 * 4 * 32**2 and counted.mlp == 5 * 2 * 32**2
    assert counted.convention == 2 * counted.total


# Head size ------------------------------------------------------------------------------------
def test_head_size_report():
    config = ModelConfig(width=512, depth=2, heads=8, out_proj=True)  # head size 64
    report = head_size_report(config, seq_len=128)
    assert report.bottleneck and report.max_logit_rank == 64
    assert report.max_unbottlenecked_heads == 4
    assert report.params_standard == 4 * 512**2 == report.params_actual
    assert report.params_fixed == 4 * 8 * 128 * 512
    fixed = config.replace(head_dim=128, key_dim=128)
    fixed_report = head_size_report(fixed, seq_len=128)
    assert not fixed_report.bottleneck
    assert fixed_report.params_actual == report.params_fixed
    assert fixed_report.params_actual == param_count(fixed).attention // fixed.depth


# GPT-3 table ----------------------------------------------------------------------------------
def test_gpt3_table():
    rows = gpt3_table()
    assert [(r.depth, r.width) for r in rows] == [(m[1], m[2]) for m in GPT3_MODELS]
    assert len(rows) == 8
    big = rows[-1]
    assert big.params == 12 * 96 * 12288**2
    assert big.recommended.depth == pytest.approx(80.5, abs=0.05)
    assert big.allocation == "too deep"
    # [LW]: GPT-3 up to ~10B is too shallow for its size
    assert all(r.allocation == "too shallow" for r in rows[:-1])
    assert all(r.regime == "depth-inefficient" and r.bottleneck for r in rows)
    assert rows[0].threshold == pytest.approx(math.log(768, 3))


# Bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: optimal_shape(0), "params"),
        (lambda: optimal_shape(-5.0), "params"),
        (lambda: optimal_shape(float("nan")), "params"),
        (lambda: optimal_shape(float("inf")), "params"),
        (lambda: optimal_shape("1e9"), "params"),
        (lambda: optimal_shape(10**400), "params"),
        (lambda: optimal_shape(1e9, multiple=0), "multiple"),
        (lambda: optimal_width(0), "depth"),
        (lambda: optimal_width(float("nan")), "depth"),
        (lambda: depth_threshold(0.5), "width"),
        (lambda: regime(-1, 100), "depth"),
        (lambda: regime(3, 0), "width"),
        (lambda: allocation(3, 100, tolerance=-0.1), "tolerance"),
        (lambda: DepthWidthFit(5.0, 0.0), "b"),
        (lambda: param_count("config"), "config"),
        (lambda: head_size_report(ModelConfig(), 0), "seq_len"),
        (lambda: head_size_report(ModelConfig(attention="none", mlp="relu"), 8), "attention"),
        (lambda: design_row("x", 0, 10, 1, 10, 8), "depth"),
    ],
)
def test_invalid_inputs_raise_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_lw_fit_constants():
    assert (LW_FIT.a, LW_FIT.b) == (5.039, 0.0555)


@pytest.mark.parametrize(
    ("head_dim", "key_dim", "seq_len", "bottleneck", "rank"),
    [(128, 64, 128, True, 64), (64, 128, 128, False, 128), (16, 128, 128, False, 128),
     (128, 127, 128, True, 127), (128, 128, 128, False, 128), (64, 200, 128, False, 128)],
)  # fmt: skip
def test_head_size_bottleneck_is_set_by_the_query_key_size(
    head_dim, key_dim, seq_len, bottleneck, rank
):
    """The logits q k^T of a head have rank <= min(key_dim, m, n): the bottleneck is
    key_dim < seq_len whatever the value size head_dim."""
    config = ModelConfig(width=256, depth=1, heads=4, head_dim=head_dim, key_dim=key_dim,
                         out_proj=True)  # fmt: skip
    report = head_size_report(config, seq_len=seq_len)
    assert (report.bottleneck, report.max_logit_rank) == (bottleneck, rank)
    assert (report.head_dim, report.key_dim) == (head_dim, key_dim)
    # per layer: W^Q, W^K (n x 4 key_dim), W^V (n x 4 head_dim), W^O (4 head_dim x n)
    assert report.params_actual == 256 * 4 * (2 * key_dim + 2 * head_dim)
    assert head_size_report(config.replace(width=512), seq_len).max_logit_rank == rank


# Rounding rules (hand-computed) -----------------------------------------------------------------
FIT = DepthWidthFit(a=1.0, b=0.5)  # ln d*(L) = 1 + L / 2: small numbers, exact inverses


@pytest.mark.parametrize(
    ("L", "multiple", "depth_rounded", "width_rounded"),
    [(2.4, 1, 2, 10), (2.6, 4, 4, 8), (0.3, 1, 1, 2), (7.49, 8, 8, 112), (7.51, 3, 7, 120)],
)
def test_optimal_shape_rounding_by_hand(L, multiple, depth_rounded, width_rounded):
    """Budget N = 12 L exp(2a + 2bL) has optimum exactly L. The rounded shape is the integer
    (depth, width multiple) that spends N most closely, |log(12 L_r d_r^2 / N)| in 1% steps,
    ties to the depth nearest L (hand-computed: e.g. L = 2.6, multiple 4, N = 3104: 4 x 8
    spends 99.0% of N, 2 x 12 111%, 3 x 8 74%; a budget of one block (L = 0.3) cannot be met
    closely)."""
    N = 12 * L * math.exp(2 * (FIT.a + FIT.b * L))
    shape = optimal_shape(N, multiple=multiple, fit=FIT)
    assert shape.depth == pytest.approx(L, rel=1e-12)
    assert shape.width == pytest.approx(math.exp(FIT.a + FIT.b * L), rel=1e-12)
    assert (shape.depth_rounded, shape.width_rounded) == (depth_rounded, width_rounded)
    assert shape.width_rounded % multiple == 0
    assert shape.params_rounded == 12 * depth_rounded * width_rounded**2
    if L >= 1:
        assert abs(math.log(shape.params_rounded / N)) < 0.05
    assert shape.multiple == multiple


def test_rounded_width_is_never_below_one_multiple():
    shape = optimal_shape(12 * 0.3 * math.exp(2 * (1 + 0.15)), multiple=64, fit=FIT)
    assert (shape.depth_rounded, shape.width_rounded) == (1, 64)  # budget width ~ 1.7


def test_allocation_tolerance_bounds_are_relative_to_the_optimal_depth():
    """Too deep iff L > L*(1 + tol), too shallow iff L < L*(1 - tol), with L* the optimum at
    the shape's own size 12 L d^2."""
    L = 10.0
    d = optimal_width(L, fit=FIT)  # (L, d) is optimal for its size
    assert allocation(L, d, tolerance=0.0, fit=FIT) == "near optimal"
    for width_factor in (0.9, 1.1):
        best = optimal_shape(12 * L * (width_factor * d) ** 2, fit=FIT).depth
        rel = L / best - 1  # the relative depth excess of this shape
        verdict = "too deep" if rel > 0 else "too shallow"
        assert allocation(L, width_factor * d, tolerance=abs(rel) * 0.99, fit=FIT) == verdict
        assert allocation(L, width_factor * d, tolerance=abs(rel) * 1.01, fit=FIT) == (
            "near optimal"
        )


def test_head_size_report_counts_by_hand():
    """width 96, 3 heads of 32, seq_len 40: bottleneck (32 < 40), logit rank 32, 96 // 40 = 2
    unbottlenecked standard heads; W^Q, W^K, W^V, W^O = 4 * 96 * 96 actual, 4 * 3 * 40 * 96
    with head size 40."""
    report = head_size_report(ModelConfig(width=96, depth=1, heads=3, out_proj=True), 40)
    assert (report.width, report.heads, report.seq_len) == (96, 3, 40)
    assert report.bottleneck and report.max_logit_rank == 32
    assert report.max_unbottlenecked_heads == 2 and report.recommended_head_dim == 40
    assert (report.params_actual, report.params_standard) == (4 * 96 * 96, 4 * 96 * 96)
    assert report.params_fixed == 4 * 3 * 40 * 96
    no_out = head_size_report(ModelConfig(width=96, depth=1, heads=3), 40)
    assert no_out.params_actual == 3 * 96 * 96
    long = head_size_report(ModelConfig(width=96, depth=1, heads=3), 97)
    assert long.max_unbottlenecked_heads == 0


def test_param_count_by_hand_with_biases():
    """width 12, 3 heads of key size 5 and value size 8, W^O, shaped MLP, biases, depth 2:
    per block Q, K: 12 * 15 + 15 each; V: 12 * 24 + 24; O: 24 * 12 + 12; MLP 2 (144 + 12)."""
    config = ModelConfig(width=12, depth=2, heads=3, head_dim=8, key_dim=5, out_proj=True,
                         mlp="shaped_relu")  # fmt: skip
    counted = param_count(config, bias=True)
    assert counted.attention == 2 * (2 * (180 + 15) + (288 + 24) + (288 + 12))
    assert counted.mlp == 2 * 2 * (144 + 12)
    assert counted.convention == 12 * 2 * 144
    assert param_count(config).attention == 2 * (2 * 180 + 288 + 288)


def test_design_row_and_gpt3_table_pass_multiple_and_fit():
    row = design_row("x", 12, 768, 12, 64, 2048, multiple=128, fit=FIT)
    assert row.recommended == optimal_shape(12 * 12 * 768**2, multiple=128, fit=FIT)
    assert row.allocation == allocation(12, 768, fit=FIT)
    assert row.params == 12 * 12 * 768**2 and row.bottleneck
    assert not design_row("y", 2, 64, 1, 64, 64).bottleneck  # head size = seq_len
    table = gpt3_table(multiple=64, fit=FIT)
    assert all(r.recommended.multiple == 64 and r.recommended.width_rounded % 64 == 0
               for r in table)  # fmt: skip
    assert table[0].recommended == optimal_shape(12 * 12 * 768**2, multiple=64, fit=FIT)


def test_gpt3_models_are_table_2_1_of_brown_et_al():
    """n_layers, d_model, n_heads, d_head of the eight GPT-3 sizes (arXiv 2005.14165, Table
    2.1), context 2048; heads x head size = width except the 13B row's printed 5140."""
    from shapedtx.design import GPT3_CONTEXT

    assert GPT3_CONTEXT == 2048
    assert [m[1:] for m in GPT3_MODELS] == [
        (12, 768, 12, 64), (24, 1024, 16, 64), (24, 1536, 16, 96), (24, 2048, 24, 128),
        (32, 2560, 32, 80), (32, 4096, 32, 128), (40, 5140, 40, 128), (96, 12288, 96, 128),
    ]  # fmt: skip
    assert GPT3_MODELS[0][0] == "GPT-3 Small (125M)"
    rows = gpt3_table()
    assert [(r.heads, r.head_dim, r.seq_len) for r in rows] == [(m[3], m[4], 2048)
                                                                for m in GPT3_MODELS]  # fmt: skip


def test_default_multiple_is_the_clis():
    """One default width multiple, DEFAULT_MULTIPLE (128), for Python and `shapedtx design`;
    multiple=1 rounds to the nearest integer width."""
    from shapedtx.design import DEFAULT_MULTIPLE, Shape

    assert Shape(1.0, 1.0, 1.0, 1, 1).multiple == 1
    N = 12 * 2.6 * math.exp(2 * (1 + 0.5 * 2.6))
    shape = optimal_shape(N, multiple=1, fit=FIT)
    assert shape.multiple == 1 and shape.width_rounded == round(math.sqrt(N / 36))
    assert optimal_shape(N, fit=FIT).multiple == DEFAULT_MULTIPLE
    assert design_row("x", 3, 10, 1, 10, 8).recommended.multiple == DEFAULT_MULTIPLE
    assert all(r.recommended.multiple == DEFAULT_MULTIPLE for r in gpt3_table())


def test_threshold_domain_includes_width_one_and_results_are_immutable():
    import dataclasses

    assert depth_threshold(1) == 0.0 and depth_threshold(3) == pytest.approx(1.0)
    config = ModelConfig(width=8, depth=1, heads=2)
    for value in (optimal_shape(1e9), param_count(config), head_size_report(config, 4),
                  design_row("x", 2, 8, 2, 4, 4), LW_FIT):  # fmt: skip
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, 0)


def test_python_and_cli_recommend_one_width(capsys):
    """Issue 39: 175e9 parameters gave 13418 in Python and 13440 on the CLI."""
    from shapedtx.design import DEFAULT_MULTIPLE
    from simulations.cli import main

    shape = optimal_shape(175e9)
    assert shape.multiple == DEFAULT_MULTIPLE == 128
    assert (shape.depth_rounded, shape.width_rounded) == (81, 13440)
    assert main(["design", "--params", "175e9"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "rounded (" in line)
    assert row.split()[-3:-1] == [str(shape.depth_rounded), str(shape.width_rounded)]


@pytest.mark.parametrize("bias", [False, True])
def test_param_count_is_the_models_own_count_for_every_preset(bias):
    """Every preset (MLP width ratio, norms, He & Hofmann's gains and first-block value map),
    counted by hand from the module's parameters, branch by branch."""
    from shapedtx import PRESETS, Transformer, preset

    for name in PRESETS:
        config = preset(name, width=16, depth=3, heads=4, causal=True)
        params = dict(Transformer(config, bias=bias).named_parameters())
        counted = param_count(config, bias=bias)
        mlp = sum(p.numel() for k, p in params.items() if ".mlp." in k)
        attention = sum(p.numel() for k, p in params.items() if ".attention." in k)
        assert (counted.mlp, counted.attention) == (mlp, attention), name
        assert counted.total == sum(p.numel() for p in params.values()), name
        hidden = config.mlp_ratio * 16
        slopes = {"fixed": 0, "layer": 2, "channel": 2 * hidden}[config.mlp_slopes]
        assert counted.mlp == 3 * (2 * 16 * hidden + (hidden + 16 if bias else 0) + slopes), name
