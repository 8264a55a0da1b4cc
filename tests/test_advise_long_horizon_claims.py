"""The advise study's report (examples/advise/README.md) quotes the committed study's numbers
(examples/advise/long_horizon/results.json, rebuilt by ``predict.py --report`` from finished
runs; issue 42 item 4)."""

import json
from pathlib import Path

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "examples" / "advise" / "long_horizon" / "results.json"
HORIZONS = ("250", "500", "1000", "2000", "5000")


def _by_horizon() -> dict:
    return json.loads(RESULTS.read_text())["by_horizon"]


def _flat(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())


def _advised_rank(at: dict) -> tuple[int, float, float]:
    """(rank of the advised configuration among those that trained, its loss, the best)."""
    losses = sorted(c["loss"] for c in at["configs"] if c["loss"] is not None)
    advised = next(c["loss"] for c in at["configs"] if c["role"] == "advised")
    return losses.index(advised) + 1, advised, losses[0]


def test_the_study_is_the_one_described():
    by = _by_horizon()
    assert tuple(by) == HORIZONS
    setup = json.loads(RESULTS.read_text())["setup"]
    assert setup["width"] == 32 and setup["depths"] == [16] and setup["lrs"] == [0.003, 0.01, 0.03]
    assert all(len(at["configs"]) == 13 for at in by.values())  # "13 configurations"


def test_study_report_quotes_the_spearman_per_horizon():
    by = _by_horizon()
    r = {h: by[h]["spearman"]["value"] for h in HORIZONS}
    every = [round(v, 2) for v in r.values()]
    assert f"{min(every):.2f}-{max(every):.2f} from 250 to 5,000" in _flat(
        "examples/advise/README.md"
    )
    # "gamma^2 T alone does as well or slightly better"
    g = [by[h]["scores"]["gamma2T"]["value"] for h in HORIZONS]
    assert all(g_h >= r[h] - 0.005 for g_h, h in zip(g, HORIZONS, strict=True))


def test_the_advice_ranks_4th_at_250_steps_and_second_from_2000_on():
    by = _by_horizon()
    ranks = [_advised_rank(by[h])[0] for h in HORIZONS]
    assert ranks == [4, 4, 3, 2, 2]  # "4th of 13 at 250 steps and second of 13 from 2,000 on"
    _, advised, best = _advised_rank(by["5000"])
    assert f"{best:.3f} against {advised:.3f}" in _flat("examples/advise/README.md")
    smallest = min(c["gamma"] for c in by["5000"]["configs"])
    winner = min((c for c in by["5000"]["configs"] if c["loss"]), key=lambda c: c["loss"])
    assert winner["gamma"] == smallest  # "the smallest gamma of the grid"


def test_no_configuration_prefers_the_top_lr_from_2000_steps_on():
    by = _by_horizon()
    counts = [by[h]["best_lr_counts"]["0.03"] for h in HORIZONS]
    assert counts[3:] == [0, 0] and counts[0] > 0  # "changes nothing from 2,000 steps on"
    assert f"best lr of {counts[0]}, {counts[1]} and {counts[2]} small-gamma" in _flat(
        "examples/advise/README.md"
    )


def test_example_readme_table_is_the_studys_results():
    lines = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in (ROOT / "examples" / "advise" / "README.md").read_text().splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().replace(",", "").isdigit()
    ]
    rows = {row[0].replace(",", ""): row for row in lines if len(row) == 6}
    assert set(rows) == set(HORIZONS)
    for h, at in _by_horizon().items():
        sp = at["spearman"]
        assert rows[h][1] == f"{sp['value']:.2f} [{sp['ci'][0]:.2f}, {sp['ci'][1]:.2f}]"
        assert rows[h][2] == f"{at['scores']['gamma2T']['value']:.2f}"
        c = at["best_lr_counts"]
        assert rows[h][3] == f"{c['0.003']} / {c['0.01']} / {c['0.03']} / {c['diverged']}"
        rank, advised, best = _advised_rank(at)
        assert rows[h][4] == f"{advised:.3f}, {rank} of {len(at['configs'])}"
        assert rows[h][5].startswith(f"{best:.3f} ")
