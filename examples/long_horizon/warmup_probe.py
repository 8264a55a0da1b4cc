"""Does a study run survive its first steps? Train one run of the long-horizon study (its model,
data, peak lr and schedule) for ``--steps`` steps, optionally with another MLP branch gain or
warm-up, and print the first step whose loss is not finite (or the loss at ``--steps``).

It checks the loss at every step (a host sync per step, unlike the trainer), so it sees a
divergence before the trainer's next log row. The step is the first non-finite *loss*; the
trainer's ``diverged_step`` also counts a non-finite gradient norm, which can come a step or
two earlier (SAS-P without normalisation, depth 64, seeds 1 and 2 at 3.3e-3: step 10 in the
study's runs, 12 here). Used for SAS-P without normalisation at depth 64 (results.md, "Two of
He & Hofmann's settings, tried on the diverging seeds, do not fix it").

Usage::

    python examples/long_horizon/warmup_probe.py --model "SAS-P no norm" --depth 64 --k 1 --seed 2
    python examples/long_horizon/warmup_probe.py ... --mlp-gain 0.053 --warmup 500 --steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from shapedtx.training import load_corpus, train

sys.path.insert(0, str(Path(__file__).parent))
import study  # type: ignore[import-not-found]  # beside this script


class _Stop(Exception):
    """Raised by the loss hook to end the probe (not an error)."""


def probe(
    setup: study.Setup,
    model: str,
    depth: int,
    k: int,
    seed: int,
    *,
    steps: int,
    mlp_gain: float | None = None,
    warmup: int | None = None,
    device: str = "cpu",
    out: Path = study.HERE,
) -> dict[str, Any]:
    """Train the study's run ``(model, depth, k, seed)`` for at most ``steps`` steps (the MLP
    branch gain and warm-up replaced where given) and return the first 1-based step with a
    non-finite loss (``diverged_step``, None if none) and the loss at the last step trained.
    ``out``: the study folder whose ``advice.json`` gives the shaped models' advised gamma."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    run = study.make_run(setup, out, model, depth, k, seed, device=device)
    model_config = run.model if mlp_gain is None else replace(run.model, mlp_gain=mlp_gain)
    train_config = run.train if warmup is None else replace(run.train, warmup_steps=warmup)
    seen: dict[str, Any] = {"diverged_step": None, "loss": math.nan}

    def hook(step: int, loss: Tensor) -> Tensor:
        value = float(loss.detach())
        seen["loss"] = value
        if not math.isfinite(value):
            seen["diverged_step"] = step
            raise _Stop
        if step >= steps:
            raise _Stop
        return loss

    data = load_corpus(max_bytes=run.max_bytes)
    with contextlib.suppress(_Stop):
        train(model_config, data, train_config, device=device, progress=False, loss_hook=hook)
    return {
        "model": model,
        "depth": depth,
        "lr": train_config.lr,
        "seed": seed,
        "mlp_gain": model_config.mlp_gain,
        "warmup_steps": train_config.warmup_steps,
        "steps": steps,
        **seen,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=tuple(study.MODELS), required=True)
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--k", type=int, default=0, help="lr grid index (peak lr = centre x 3^k)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=100, help="stop after this step")
    p.add_argument("--mlp-gain", type=float, default=None)
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: the study's)")
    p.add_argument("--quick", action="store_true", help="the study's tiny sizes")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=study.HERE, help="study folder (advice.json)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    setup = study.setup_of(study.parse(["--depths", str(args.depth)] + ["--quick"] * args.quick))
    try:
        result = probe(
            setup,
            args.model,
            args.depth,
            args.k,
            args.seed,
            steps=args.steps,
            mlp_gain=args.mlp_gain,
            warmup=args.warmup,
            device=args.device,
            out=args.out,
        )
    except ValueError as e:
        sys.stderr.write(f"warmup_probe.py: {e}\n")
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
