"""Probe models you already have: transformers' GPT-2, a nanoGPT written here, and the SDE.

    pip install -e ".[hf]"
    python examples/probe_gpt2/probe_gpt2.py [--draws 200] [--out examples/probe_gpt2]

1. A ``transformers`` GPT-2 built from a ``GPT2Config`` (no download: exact GELU, dropout off,
   LayerNorm epsilon 1e-6 as the library's, position embeddings zeroed) and the library's
   ``preset("pre_ln")`` of the same width and depth, both probed with ``shapedtx.probe`` on the
   same initial tokens (fed to GPT-2 through ``inputs_embeds``; token variance 0.02^2, GPT-2's
   embedding variance). Each sample is a fresh weight draw (GPT-2's own ``_init_weights``).
   Per layer: two-sample KS p-values of the per-sample mean correlation and mean log V^{aa},
   ``simulations.compare`` on the two Datasets, and ``simulations.collapse_report``.
2. The same for GPT-2 *without* the 1/sqrt(2 n_layer) scaling of its ``c_proj`` weights (the
   negative control: the KS tests must reject it).
3. A nanoGPT-style model written below (``transformer.h`` found automatically) and GPT-2,
   both probed on random token ids through their own embeddings (``input_ids``).
4. The library's shaped Transformer (``preset("shaped")``, T = depth / width = 1) next to its
   covariance SDE (``sde.solve``), compared with ``simulations.compare``, and the probe of
   ``shapedtx.Transformer`` against the library's own simulator (``simulations.simulate``).

Writes ``probe_gpt2.png`` and ``results.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers
import xarray as xr
from scipy.stats import ks_2samp
from torch import nn
from torch.nn import functional as F

import sde
import shapedtx
from shapedtx import metrics
from simulations import simulate
from simulations.compare import collapse_report, compare
from simulations.plots import plot_mean_correlation

WIDTH, DEPTH, HEADS, TOKENS, RHO0 = 32, 6, 4, 8, 0.2
EMBED_VAR = 0.02**2


# --------------------------------------------------------------------------------------------
# nanoGPT (Karpathy's model.py, trimmed: no dropout, no weight tying, exact GELU)
# --------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-6)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-6)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, n_embd),
                "wpe": nn.Embedding(block_size, n_embd),
                "h": nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(n_embd, eps=1e-6),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --------------------------------------------------------------------------------------------
def stack(datasets: list[xr.Dataset]) -> xr.Dataset:
    """One covariance Dataset from single-sample probes (independent weight draws)."""
    ds = xr.concat(datasets, "sample", data_vars="all", coords="minimal", compat="override")
    return ds.assign_coords(sample=np.arange(len(datasets)))


def gpt2_draws(
    draws: int, seed: int, *, scale_c_proj: float = 1.0, ids: bool = False
) -> xr.Dataset:
    """GPT-2 probes, one weight draw per sample: on equicorrelated ``inputs_embeds`` (position
    embeddings zeroed), or with ``ids`` on random token ids (its own embeddings)."""
    config = transformers.GPT2Config(
        n_embd=WIDTH, n_layer=DEPTH, n_head=HEADS, n_positions=TOKENS, vocab_size=256,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        initializer_range=0.02, layer_norm_epsilon=1e-6,
    )  # fmt: skip
    model = transformers.GPT2Model(config).double()
    V0 = shapedtx.equicorrelated(TOKENS, RHO0, EMBED_VAR)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for draw in range(draws):
        torch.manual_seed(seed * 100_003 + draw)
        model.apply(model._init_weights)  # GPT-2's own initialisation, fresh per sample
        if ids:
            idx = torch.randint(0, 256, (1, TOKENS), generator=gen)
            out.append(shapedtx.probe(model, {"input_ids": idx}))
            continue
        with torch.no_grad():
            model.wpe.weight.zero_()
            for block in model.h:
                block.attn.c_proj.weight.mul_(scale_c_proj)
                block.mlp.c_proj.weight.mul_(scale_c_proj)
        X0 = shapedtx.initial_tokens(V0, WIDTH, 1, gen)
        out.append(shapedtx.probe(model, {"inputs_embeds": X0}))
    return stack(out)


def preset_draws(name: str, width: int, depth: int, draws: int, seed: int, **fields):
    config = shapedtx.preset(name, width=width, depth=depth, **fields)
    scale = EMBED_VAR if name == "pre_ln" else 1.0
    V0 = shapedtx.equicorrelated(TOKENS, RHO0, scale)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for draw in range(draws):
        torch.manual_seed(seed * 100_003 + draw)
        model = shapedtx.Transformer(config).double()
        out.append(shapedtx.probe(model, shapedtx.initial_tokens(V0, width, 1, gen)))
    return stack(out)


def nanogpt_draws(draws: int, seed: int) -> xr.Dataset:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for draw in range(draws):
        torch.manual_seed(seed * 100_003 + draw)
        model = GPT(256, TOKENS, WIDTH, DEPTH, HEADS).double()
        idx = torch.randint(0, 256, (1, TOKENS), generator=gen)
        out.append(shapedtx.probe(model, idx))
    return stack(out)


def summaries(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample mean correlation and mean log V^{aa}: (sample, layer) each."""
    V = ds["V"].values
    rho = metrics.mean_correlation(torch.from_numpy(V)).numpy()
    return rho, np.log(np.diagonal(V, axis1=-2, axis2=-1)).mean(-1)


def ks_pvalues(a: xr.Dataset, b: xr.Dataset) -> dict[str, list[float]]:
    out = {}
    for name, x, y in zip(("mean_rho", "mean_logVaa"), summaries(a), summaries(b), strict=True):
        out[name] = [float(ks_2samp(x[:, i], y[:, i]).pvalue) for i in range(x.shape[1])]
    return out


def collapse_layers(ds: xr.Dataset, threshold: float) -> dict[str, float]:
    r = collapse_report({"m": ds}, threshold)
    return {
        "fraction_collapsed": float(r["fraction_collapsed"][0]),
        "median_collapse_layer": float(r["median_collapse_layer"][0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    out = Path(args.out)
    start = time.time()

    hf = gpt2_draws(args.draws, 1)
    ours = preset_draws("pre_ln", WIDTH, DEPTH, args.draws, 2, causal=True)
    unscaled = gpt2_draws(args.draws, 3, scale_c_proj=math.sqrt(2 * DEPTH))
    nano = nanogpt_draws(args.draws, 4)
    hf_ids = gpt2_draws(args.draws, 7, ids=True)
    shaped = preset_draws("shaped", 32, 32, args.draws, 5)
    V0 = shapedtx.equicorrelated(TOKENS, RHO0)
    limit = sde.solve(shapedtx.config_of(shaped), V0, 2000, seed=6, progress=False)
    vs_sde = compare(shaped, limit)
    simulated = simulate(shapedtx.config_of(shaped), V0, 400, seed=8, progress=False)
    vs_sim = compare(shaped, simulated)
    sim_vs_sde = compare(simulated, limit)
    vs_ours = compare(hf, ours)

    results = {
        "draws": args.draws,
        "width": WIDTH,
        "depth": DEPTH,
        "ks_gpt2_vs_pre_ln": ks_pvalues(hf, ours),
        "ks_gpt2_unscaled_c_proj_vs_pre_ln": ks_pvalues(unscaled, ours),
        "ks_nanogpt_vs_gpt2_on_token_ids": ks_pvalues(nano, hf_ids),
        "compare_gpt2_vs_pre_ln": {
            "ks_rho_pvalue": vs_ours["ks_rho_pvalue"].values.tolist(),
            "ks_logVaa_pvalue": vs_ours["ks_logVaa_pvalue"].values.tolist(),
        },
        "collapse": {
            str(th): {
                label: collapse_layers(ds, th)
                for label, ds in (
                    ("gpt2", hf),
                    ("pre_ln", ours),
                    ("gpt2_unscaled", unscaled),
                    ("nanogpt", nano),
                )
            }
            for th in (0.99, 0.22)
        },
        "mean_rho_last_layer": {
            label: float(summaries(ds)[0][:, -1].mean())
            for label, ds in (
                ("gpt2", hf),
                ("pre_ln", ours),
                ("gpt2_unscaled", unscaled),
                ("nanogpt", nano),
            )
        },
        "shaped_vs_sde": {
            "t": vs_sde["t"].values.tolist(),
            "ks_rho_pvalue_min": float(vs_sde["ks_rho_pvalue"].min()),
            "ks_logVaa_pvalue_min": float(vs_sde["ks_logVaa_pvalue"].min()),
            "mean_rho_network_T": float(vs_sde["mean_rho"].sel(source="network")[-1]),
            "mean_rho_sde_T": float(vs_sde["mean_rho"].sel(source="sde")[-1]),
            "median_Vaa_network_T": float(vs_sde["Vaa_quantile"][0, -1].sel(quantile=0.5)),
            "median_Vaa_sde_T": float(vs_sde["Vaa_quantile"][1, -1].sel(quantile=0.5)),
        },
        "shaped_probe_vs_simulate": {
            "ks_rho_pvalue_min": float(vs_sim["ks_rho_pvalue"].min()),
            "ks_logVaa_pvalue_min": float(vs_sim["ks_logVaa_pvalue"].min()),
        },
        "shaped_simulate_vs_sde": {
            "ks_rho_pvalue_min": float(sim_vs_sde["ks_rho_pvalue"].min()),
            "ks_logVaa_pvalue_min": float(sim_vs_sde["ks_logVaa_pvalue"].min()),
        },
        "seconds": round(time.time() - start, 1),
    }
    del results["shaped_vs_sde"]["t"]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    plot_mean_correlation(
        {
            "transformers GPT-2": hf,
            "shapedtx pre_ln preset": ours,
            "nanoGPT (this file), on token ids": nano,
            "GPT-2 without c_proj 1/sqrt(2L)": unscaled,
        },
        threshold=None,
        ax=axes[0],
    )
    axes[0].set_ylim(-0.1, 0.75)
    axes[0].legend(loc="upper left", fontsize="small")
    axes[0].set_title(f"GPT-2-style models at init (n={WIDTH}, {args.draws} draws)")
    plot_mean_correlation({"shaped Transformer (probe)": shaped, "covariance SDE": limit},
                          ax=axes[1])  # fmt: skip
    axes[1].set_title("shaped Transformer n=d=32 vs its SDE")
    fig.tight_layout()
    fig.savefig(out / "probe_gpt2.png", dpi=110)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
