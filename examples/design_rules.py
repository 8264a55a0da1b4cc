"""Depth/width design rules (docs/theory.md#depth-width) and the head-size check (section 8).

Run: python examples/design_rules.py
Prints the recommended shape for a few budgets, the GPT-3 table, and the parameter count of a
shapedtx model next to the 12 L d^2 convention. The fit constants are the BigScience
restatement of Levine et al. (2020), not the paper's own table.
"""

from shapedtx import ModelConfig, Transformer
from shapedtx.design import (
    depth_threshold,
    gpt3_table,
    head_size_report,
    optimal_shape,
    optimal_width,
    param_count,
    regime,
)


def main() -> None:
    print("budget N = 12 L d^2 -> optimal depth L*, width d* (raw; rounded, width x128)")
    for params in (1e8, 1e9, 1e10, 1.739e11, 1e12, 1e13):
        s = optimal_shape(params, multiple=128)
        print(
            f"  N = {params:8.3g}: L* = {s.depth:6.2f}, d* = {s.width:8.1f}  ->  "
            f"{s.depth_rounded} x {s.width_rounded} (12 L d^2 = {s.params_rounded:.3g}); "
            f"log3 d* = {depth_threshold(s.width):.2f}, {regime(s.depth, s.width)}; "
            f"round trip d*(L*) = {optimal_width(s.depth):.1f}"
        )

    print("\nGPT-3 family (Brown et al. 2020, Table 2.1) against the fit")
    for r in gpt3_table():
        rec = r.recommended
        print(
            f"  {r.name:20s} {r.depth:3d} x {r.width:5d}: {r.allocation:12s} "
            f"(L* = {rec.depth:5.1f}, d* = {rec.width:7.1f}); {r.regime}; "
            f"head size {r.head_dim} < context {r.seq_len}: {r.bottleneck}"
        )

    config = ModelConfig(width=256, depth=8, attention="softmax", mlp="relu", heads=8)
    counted = param_count(config)
    actual = sum(p.numel() for p in Transformer(config).parameters())
    print(
        f"\nTransformer(width=256, depth=8, heads=8): {counted.total} parameters "
        f"(module: {actual}; attention {counted.attention}, MLP {counted.mlp}); "
        f"12 L d^2 convention: {counted.convention} (assumes d_ff = 4 d and W^O)"
    )
    report = head_size_report(config, seq_len=128)
    print(
        f"head size {report.key_dim} at m = {report.seq_len}: bottleneck = {report.bottleneck}; "
        f"attention params/layer now {report.params_actual}, standard 4 d^2 = "
        f"{report.params_standard}, fixed head size d_p = m: {report.params_fixed}"
    )


if __name__ == "__main__":
    main()
