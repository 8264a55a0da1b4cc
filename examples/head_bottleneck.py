"""The low-rank bottleneck of attention heads (Bhojanapalli et al. 2020; docs/theory.md#head-size).

Run: python examples/head_bottleneck.py
1. Head size >= m: the pseudo-inverse construction reaches a random target P exactly.
2. The counterexample of docs/theory.md#head-size, d_p = 1, m = 3, X = I, P = 0.7 I + 0.1 11^T: the
   best attention found by optimisation stays above the provable bound 0.7 / sqrt(2) (every
   row is softmax(s_i b): at most two rows peak on their own token); d_p = 2 = m - 1 reaches P.
3. Full-rank X, m = 6: best distance found by optimisation for each head size, next to the
   provable rank lower bound (p_min / 2) min(1, tail singular values of log(P) C).
4. Head size m - 1 already suffices for full-rank X (the softmax discards per-row constants):
   exact construction from the SVD of the row-centred log P.
"""

import torch

from shapedtx.bottleneck import (
    attention_of,
    counterexample_p,
    counterexample_x,
    fit_attention,
    logit_rank,
    rank_lower_bound,
    rank_one_lower_bound,
    realise_attention,
    realise_attention_low_rank,
)


def main() -> None:
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend
    f64 = torch.float64
    gen = torch.Generator().manual_seed(0)
    m, n = 6, 10
    X = torch.randn(m, n, generator=gen, dtype=f64)
    P = torch.softmax(2.0 * torch.randn(m, m, generator=gen, dtype=f64), dim=-1)

    W_Q, W_K = realise_attention(X, P, head_size=m)
    err = (attention_of(X, W_Q, W_K) - P).abs().max()
    print(f"1. construction, m = {m}, n = {n}, d_p = {m}: max |A - P| = {err:.2e}")

    X3, P3 = counterexample_x(), counterexample_p()
    fit = fit_attention(X3, P3, 1, restarts=16, steps=1000, lr=0.1)
    fit2 = fit_attention(X3, P3, 2, restarts=16, steps=1000, lr=0.1)
    print(
        f"2. counterexample X = I, target rows {P3.tolist()}: d_p = 1 best ||A - P||_F = "
        f"{fit.distance:.4f} >= lower bound {float(rank_one_lower_bound(P3)):.4f}; "
        f"d_p = 2: {fit2.distance:.2e}"
    )

    print(f"3. full-rank X ({m} x {n}), same P; optimisation: 16 restarts x 1500 Adam steps")
    for d_p in range(1, m + 1):
        fit = fit_attention(X, P, d_p, restarts=16, steps=1500, lr=0.05)
        bound = float(rank_lower_bound(P, min(d_p, m)))
        print(f"   d_p = {d_p}: best ||A - P||_F = {fit.distance:.2e}   lower bound {bound:.2e}")

    r = int(logit_rank(P))
    W_Q, W_K = realise_attention_low_rank(X, P, head_size=r)
    err = (attention_of(X, W_Q, W_K) - P).abs().max()
    print(f"4. logit_rank(P) = {r}; construction with d_p = {r}: max |A - P| = {err:.2e}")


if __name__ == "__main__":
    main()
