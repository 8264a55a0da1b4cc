"""The README's long-horizon claims are the committed study's numbers
(examples/long_horizon/results.json, rebuilt by ``study.py --report`` from finished runs)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "examples" / "long_horizon" / "results.json"


def _bullet() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("- **Long horizons**")
    return " ".join(readme[start : readme.index("\n\n", start)].split())


@pytest.mark.parametrize(
    ("model", "horizon"),
    [
        ("pre-LN (GPT-2)", 250),
        ("shaped advise", 250),
        ("pre-LN (GPT-2)", 5000),
        ("shaped advise", 5000),
        ("shaped g=0.1", 5000),
        ("no-norm gpt2", 5000),
        ("SAS-P no norm", 5000),
        ("shaped advise", 2000),
    ],
)
def test_readme_quotes_the_studys_loss(model, horizon):
    cell = json.loads(RESULTS.read_text())["depths"]["16"]["models"][model][str(horizon)]
    assert f"{cell['mean']:.3f}" in _bullet(), (model, horizon, cell["mean"])


def test_readme_quotes_the_studys_depth_64_loss():
    cell = json.loads(RESULTS.read_text())["depths"]["64"]["models"]["shaped advise"]["2000"]
    assert (
        f"At depth 64 the shaped model at `advise`'s gamma (0.05) reaches {cell['mean']:.3f}"
        in (_bullet())
    )


def test_readme_quotes_the_studys_ratio_and_best_lrs():
    depth = json.loads(RESULTS.read_text())["depths"]["16"]
    shaped = depth["models"]["shaped advise"]
    ratio = shaped["5000"]["mean"] / depth["models"]["pre-LN (GPT-2)"]["5000"]["mean"]
    assert f"by {round(100 * (ratio - 1))}% at 5,000" in _bullet()
    assert [shaped[h]["best_lr"] for h in ("250", "500", "1000", "2000", "5000")] == [
        0.01,
        0.01,
        0.00333,
        0.00333,
        0.00333,
    ]  # fmt: skip  (the README: 1e-2 at 250-500 steps, 3.3e-3 from 1,000 on)
