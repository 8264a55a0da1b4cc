"""The README says what the code and the committed studies say: its Python example runs, its
set-up commands are CI's, its links resolve, its tables are the library's (presets, commands,
the main job's printed table) and every number of its findings table is the linked study's
data (results.json, monitor.json), not prose."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from child_cpu import run_code

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
LIMIT_S = 60.0  # the README promises every snippet runs in under a minute on 2 cores
MAX_LINES = 150


def test_readme_is_short():
    assert len(TEXT.splitlines()) <= MAX_LINES


def test_readme_has_one_python_example():
    assert len(SNIPPETS) == 1


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path):
    code = SNIPPETS[index]
    done, cpu = run_code(code, tmp_path)
    assert done.returncode == 0, f"snippet {index} failed:\n{code}\n{done.stderr[-2000:]}"
    # CPU time over both cores bounds the wall time of an idle machine from above
    assert cpu < 2 * LIMIT_S, f"snippet {index} took {cpu:.0f} s of CPU"


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", TEXT, flags=re.S)


def test_setup_commands_are_what_ci_runs():
    """The two set-up commands: a fresh virtualenv, the pinned CPU torch first, the project,
    then the main job or the test command. CI (.ci/run) installs the same torch and runs the
    same test command."""
    ci = (ROOT / ".ci" / "run").read_text()
    run_job, run_tests = (block.strip() for block in _bash_blocks()[:2])
    for command in (run_job, run_tests):
        steps = [s.strip() for s in command.split("&&")]
        assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
        torch = re.fullmatch(r"pip install (torch==[\d.]+)", steps[2])
        assert torch and f"pip install --quiet {torch.group(1)}\n" in ci
        assert steps[3].startswith("pip install -e ")
    assert run_job.endswith("shapedtx compare --out runs/compare")
    test_command = run_tests.split("&&")[-1].strip()
    assert test_command == "pytest -n auto -q"
    assert test_command in ci.splitlines()
    extras = re.search(r'pip install -e "\.\[(.*)\]"', run_tests).group(1).split(",")
    assert "test" in extras


def _links() -> list[str]:
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)\)", TEXT)
        if not target.startswith(("http://", "https://"))
    ]


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page: explicit ``{#id}`` and the slugs of its headings."""
    anchors = set()
    for line in page.read_text().splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if not heading:
            continue
        title = heading.group(1)
        explicit = re.search(r"\{#([\w-]+)\}", title)
        if explicit:
            anchors.add(explicit.group(1))
            continue
        slug = re.sub(r"[^\w\s-]", "", title.lower()).strip()
        anchors.add(re.sub(r"\s+", "-", slug))
    return anchors


def test_every_link_resolves():
    links = _links()
    assert len(links) > 20
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in _anchors(target), link


def test_figure_is_the_one_shown():
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", TEXT)
    assert len(figures) == 1 and (ROOT / figures[0]).is_file()


def test_readme_states_the_default_weight_decay():
    """Issue 39: the README said "AdamW with weight decay" while the default decay is 0."""
    from shapedtx.training import TrainConfig

    text = " ".join(TEXT.split())
    assert f"weight decay {TrainConfig().weight_decay:g} by default" in text


def _table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of the README table whose header row starts with ``header``."""
    start = TEXT.index(header)
    rows = TEXT[start:].split("\n\n")[0].strip().splitlines()
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]


def test_commands_table_lists_every_subcommand():
    from simulations.cli import SUBCOMMANDS

    rows = _table("| command | what it does |")[2:]
    names = [re.fullmatch(r"`shapedtx ([\w-]+)`", row[0]).group(1) for row in rows]
    assert sorted(names) == sorted(SUBCOMMANDS)


# The README's preset table, cell by cell: what each documented value means in ModelConfig
# fields (docs/guide/models.md).
PRESET_CELLS = {
    "attention": {
        "shaped (tau0 = 1)": {"attention": "shaped", "tau0": 1.0},
        "shaped (tau0 = 0.25)": {"attention": "shaped", "tau0": 0.25},
        "softmax": {"attention": "softmax", "attention_scale": "inverse_sqrt"},
        "softmax, `q k^T / d_head`": {"attention": "softmax", "attention_scale": "inverse"},
        "simplified": {"attention": "simplified"},
        "shaped (tau0 = 1), trainable per-head gains and temperature": {
            "attention": "shaped",
            "tau0": 1.0,
            "attention_gains": "trainable",
            "temperature": "trainable",
        },
    },
    "MLP": {
        "shaped ReLU, n": {"mlp": "shaped_relu", "mlp_ratio": 1},
        "GELU, 4n": {"mlp": "gelu", "mlp_ratio": 4},
        "ReLU, 4n": {"mlp": "relu", "mlp_ratio": 4},
        "shaped ReLU, 4n, trainable slopes per unit": {
            "mlp": "shaped_relu",
            "mlp_ratio": 4,
            "mlp_slopes": "channel",
        },
    },
    "norm": {
        "none": {"norm": "none"},
        "pre": {"norm": "pre", "norm_kind": "layer"},
        "post": {"norm": "post", "norm_kind": "layer"},
        "pre (RMSNorm)": {"norm": "pre", "norm_kind": "rms"},
        "none (LN on the first block's input)": {"norm": "none"},
    },
    "residual": {
        "`lambda X + gamma f`": {"residual": "scaled"},
        "`X + f`": {"residual": "unit", "depth_alpha": 0.0},
        "`lambda X + gamma f`, gamma^2 d/n = 0.005625": {"residual": "scaled", "gamma_t": 0.005625},
        "`X + f / sqrt(d)`": {"residual": "unit", "depth_alpha": 0.5},
        "`X + f / d`": {"residual": "unit", "depth_alpha": 1.0},
        "`X + f / (d / 4)`": {"residual": "unit", "depth_alpha": 1.0, "base_depth": 4},
        "skipless, sequential": {"residual": "skipless", "layout": "sequential"},
        "skipless, parallel": {"residual": "skipless", "layout": "parallel"},
    },
    "init": {
        "fan_in": {"init": "fan_in"},
        "gpt2": {"init": "gpt2"},
        "mup (0.02), output x 64/n": {"init": "mup", "output_multiplier": True, "base_width": 64},
        "gpt2, no 1/sqrt(2d)": {"init": "gpt2"},  # skipless: the gains replace 1/sqrt(2d)
    },
    "biases": {"yes": {"bias": True}, "no": {"bias": False}},
    "final LN": {"yes": {"final_norm": True}, "no": {"final_norm": False}},
}


def _preset_table() -> dict[str, dict[str, str]]:
    header, _, *rows = _table("| preset | attention |")
    table = {}
    for cells in rows:
        name = re.match(r"`(\w+)`", cells[0]).group(1)
        table[name] = dict(zip(header[1:], cells[1:], strict=True))
    return table


def test_readme_preset_table_is_what_preset_builds():
    """Every row of the README's preset table (pre_ln, post_ln, no_norm, ...) against
    shapedtx.preset(name), in the order of shapedtx.PRESETS (a new preset without a row
    fails): each documented cell, plus the 4 heads all presets have (W^O for the first four,
    presets.py)."""
    from shapedtx import PRESETS, preset

    table = _preset_table()
    assert list(table) == list(PRESETS)
    assert list(table)[:4] == ["shaped", "pre_ln", "post_ln", "no_norm"]
    for name, row in table.items():
        config = preset(name, width=64, depth=6)
        expected = {"heads": 4, "out_proj": not name.startswith("sas")}
        for column, cell in row.items():
            expected.update(PRESET_CELLS[column][cell])
        for field, value in expected.items():
            assert getattr(config, field) == value, (name, field)


# ---- the main job's table --------------------------------------------------------------------


def _main_job_table() -> str:
    return re.search(r"The table it prints[^\n]*\n\n```\n(.*?)```", TEXT, flags=re.S).group(1)


def test_main_job_table_is_the_default_presets():
    """The table's sizes are the default preset's (`block`: 4096 samples, widths 4-64 and the
    model's 200)."""
    from simulations.presets import PRESETS

    block = PRESETS["block"]
    table = _main_job_table()
    assert f"SDE paths exploded: 5 of {block.samples} (excluded)" in table
    widths = re.search(r"by width \{(.*?)\}", table).group(1)
    listed = [int(item.split(":")[0]) for item in widths.split(", ")]
    assert listed == [*block.convergence_widths, block.config.width]
    assert f"width {block.config.width}, depth {block.config.depth}" in " ".join(TEXT.split())


MAIN = "import sys; from simulations.cli import main; sys.exit(main())"


@pytest.mark.slow
def test_main_job_table_is_what_the_default_run_prints(tmp_path):
    """`shapedtx compare` with its defaults prints the README's table, line for line (about
    30 s on 2 cores)."""
    done = subprocess.run(
        [sys.executable, "-c", MAIN, "compare", "--out", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    table = [line.rstrip() for line in _main_job_table().strip().splitlines()]
    start = printed.index(table[0])
    assert printed[start : start + len(table)] == table


# ---- the findings table ----------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.^-])[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
"""A number as the findings table writes it: 5,000, 0.97, +0.62, -1.83 (not the 2 of log2 or
tau0, nor the 2 of GPT-2)."""


def _numbers(cell: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(cell)]


def _json(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _pct(ratio: float) -> str:
    return f"{round(100 * (ratio - 1)):d}"


def _finite_width() -> tuple[list, list]:
    d = _json("examples/finite_width/attention/results.json")
    widths = sorted(int(w) for w in d["network"])
    stats = d["fits"]
    resolved = sum(len(f["resolved_widths"]) for f in stats.values())
    (threshold,) = {re.search(r"> (\d+) SE", f["fit"]).group(1) for f in stats.values()}
    cells = len(widths) * len(stats)
    claim = [widths[0], widths[-1], resolved, cells, threshold]
    return claim, [d["T"], d["tokens"], d["samples"]]


def _stability_map() -> tuple[list, list]:
    d = _json("examples/stability_map/results.json")
    network, sde = d["median_exit_network"], d["median_exit_sde"]
    disagree = [
        (n, s)
        for rn, rs in zip(network, sde, strict=True)
        for n, s in zip(rn, rs, strict=True)
        if abs(s - n) > 0.1 * abs(n)
    ]
    assert disagree and all(s < n for n, s in disagree)  # "where they disagree the SDE ... first"
    claim = [10, round(100 * d["attrs"]["fraction_within_10pct"])]
    cells = len(d["gamma"]) * len(d["tau0"])
    return claim, [d["width"], cells, d["attrs"]["samples"]]


def _shaped_vs_vanilla() -> tuple[list, list]:
    d = _json("examples/shaped_vs_vanilla/results.json")
    shaped, pre_ln = d["models"]["shaped g=0.1"]["depth"], d["models"]["pre-LN (GPT-2)"]["depth"]
    claim = [0.1]
    for depth in ("16", "64"):
        assert shaped[depth]["val_loss_mean"] < pre_ln[depth]["val_loss_mean"]
        claim += [f"{shaped[depth]['val_loss_mean']:.2f}", f"{pre_ln[depth]['val_loss_mean']:.2f}"]
        claim.append(depth)
    seeds = {len(c["seeds"]) for m in (shaped, pre_ln) for c in m.values()}
    return claim, [d["setup"]["steps"], d["setup"]["width"], *seeds]


LONG = "examples/long_horizon/results.json"
LONGEST = {"16": "5000", "64": "2000"}


def _long_setup(d: dict) -> list:
    return [*[int(h) for h in LONGEST.values()], *LONGEST, d["setup"]["width"]]


def _long_horizon_pair() -> tuple[list, list]:
    d = _json(LONG)
    claim = []
    for depth, h in LONGEST.items():
        models = d["depths"][depth]["models"]
        shaped, pre_ln = models["shaped advise"][h], models["pre-LN (GPT-2)"][h]
        assert shaped["n"] == pre_ln["n"] == 3
        ratio = d["depths"][depth]["ratio_to_reference"]["shaped advise"][h]["ratio"]
        claim += [_pct(ratio), depth, f"{pre_ln['mean']:.3f}", f"{shaped['mean']:.3f}"]
    return claim, [*_long_setup(d), 3]


def _long_horizon_level() -> tuple[list, list]:
    d = _json(LONG)
    claim = []
    for depth, model in (("16", "no-norm gpt2"), ("64", "SAS-P")):
        at = d["depths"][depth]
        assert ["pre-LN (GPT-2)", model] in at["level_at_longest"]
        cells = at["models"][model][LONGEST[depth]], at["models"]["pre-LN (GPT-2)"][LONGEST[depth]]
        assert all(c["n"] == 3 for c in cells)
        claim += [depth, *(f"{c['mean']:.3f}" for c in cells)]
    return claim, [*_long_setup(d), 3]


def _long_horizon_outliers() -> tuple[list, list]:
    monitor = _json("examples/long_horizon/monitor.json")
    d = _json(LONG)
    shaped, pre_ln = d["depths"]["16"]["models"]["shaped advise"], "pre-LN (GPT-2)"
    lr = shaped["5000"]["best_lr"]
    assert d["depths"]["16"]["models"][pre_ln]["5000"]["best_lr"] == lr  # "the pair's best lr"

    def after(model: str, seed: int, column: str) -> str:
        run = monitor[f"{model}/d16/lr{lr}_s{seed}"]
        assert run["status"] == "finished" and run["steps"] == 5000
        return f"{run['measured']['5000'][column]:.1f}"

    peak, last = "kurtosis (max over layers)", "kurtosis (last layer)"
    seeds = (1, 2)
    claim = [after("shaped_advise", s, peak) for s in seeds]
    claim += [after("pre-LN__GPT-2", s, peak) for s in seeds]
    claim += [after("pre-LN__GPT-2", s, last) for s in seeds]
    assert all(abs(float(after("shaped_advise", s, last))) < 0.2 for s in seeds)
    return claim, [5000, d["setup"]["width"], 16, *seeds]


def _long_horizon_gpu() -> tuple[list, list]:
    d = _json("examples/long_horizon/gpu_h2000/results.json")
    at = d["depths"]["16"]
    ratios = at["ratio_to_reference"]["shaped advise"]
    horizons = [str(h) for h in d["setup"]["horizons"]["16"]]
    claim = [d["setup"]["width"]]
    for h in horizons:
        claim += [_pct(ratios[h]["ratio"]), h]
        shaped = at["models"]["shaped advise"][h]
        assert shaped["best_lr"] == min(shaped["lr_curve"]["lr"])  # "the lowest of its grid"
    lrs = {len(c["lr_curve"]["lr"]) for m in at["models"].values() for c in m.values()}
    return claim, [*horizons, d["setup"]["width"], 16, *lrs]


def _advise_short() -> tuple[list, list]:
    runs = [
        _json("examples/advise/results.json"),
        _json("examples/advise/width64_depth64/results.json"),
    ]
    claim, scale = [], []
    for d in runs:
        claim += [f"{d['spearman']['value']:.2f}", d["spearman"]["runs"]]
        assert all(c["within_2_percent"] for c in d["advice_check"])
        scale += [d["setup"]["steps"], d["setup"]["width"], *d["setup"]["depths"]]
    return [*claim, 2], scale


def _advise_long() -> tuple[list, list]:
    d = _json("examples/advise/long_horizon/results.json")
    at = d["by_horizon"][str(d["horizon"])]
    losses = sorted(c["loss"] for c in at["configs"] if c["loss"] is not None)
    advised = next(c["loss"] for c in at["configs"] if c["role"] == "advised")
    assert losses.index(advised) == 1  # "second"
    winner = min((c for c in at["configs"] if c["loss"]), key=lambda c: c["loss"])
    assert winner["gamma"] == min(c["gamma"] for c in at["configs"])  # "the smallest gamma"
    behind = f"{100 * (advised / losses[0] - 1):.1f}"
    claim = [d["horizon"], f"{at['spearman']['value']:.2f}", len(at["configs"]), behind]
    horizons = [int(h) for h in d["by_horizon"]]
    return claim, [horizons[0], horizons[-1], d["setup"]["width"], *d["setup"]["depths"]]


def _transfer(rows: list[tuple[str, str, str]]) -> tuple[list, list]:
    """(parametrisation, drift key, the axis) per quoted drift."""
    d = _json("examples/transfer/results.json")
    claim = []
    for name, key, _ in rows:
        drift = d["parametrisations"][name]["1000"][key]
        claim += [f"{drift['last_minus_first']:+.2f}", drift["sizes"][0], drift["sizes"][-1]]
        if key.endswith("_3pt"):
            claim.append(3)
    proxy = d["proxy"]
    return claim, [max(d["horizons"]), proxy["width"], proxy["depth"], 0]


def _completep() -> tuple[list, list]:
    """CompleteP's drift across depth and GPT-2 pre-LN's across width; CompleteP run with its
    reference's recipe over the same depths (the share of the drift it leaves, the best losses
    at the last depth), and with its attention scale alone beside the library's from the first
    depth to the deepest where both optima lie inside their grids (3-point fits)."""
    claim, scale = _transfer(
        [("pre_ln_completep", "depth_drift_3pt", "depth"), ("pre_ln", "width_drift", "width")]
    )
    d = _json("examples/transfer/results.json")
    ref = d["completep_reference"]
    per = {name: p["1000"] for name, p in ref["parametrisations"].items()}
    library = per["pre_ln_completep"]

    def located(c: dict, depth: int) -> dict | None:
        fit = (c["shapes"].get(f"w64_d{depth}") or {}).get("fit_3pt") or {}
        return fit if fit.get("log2_lr") is not None and fit["edge"] is None else None

    def moved(c: dict, last: int) -> float:
        return located(c, last)["log2_lr"] - located(c, ref["depths"][0])["log2_lr"]

    def best(c: dict, last: int) -> str:
        return f"{c['shapes'][f'w64_d{last}']['best']['val_loss']:.3f}"

    def deepest(c: dict) -> int:
        return max(d for d in ref["depths"] if located(c, d) and located(library, d))

    # the whole recipe over the headline's depths: its drift against the headline's
    whole = per["pre_ln_completep_ref"]
    headline = d["parametrisations"]["pre_ln_completep"]["1000"]["depth_drift_3pt"]
    last = deepest(whole)
    assert [ref["depths"][0], last] == [headline["sizes"][0], headline["sizes"][-1]]
    assert moved(library, last) == pytest.approx(headline["last_minus_first"])
    claim += [
        f"{moved(whole, last):+.2f}",
        f"{100 * moved(whole, last) / moved(library, last):.0f}",
    ]
    claim += [best(whole, last), best(library, last), last]
    # the attention scale alone, beside the library's on its own depths
    alone = per["completep_attention_scale"]
    last = deepest(alone)
    claim += [ref["depths"][0], last, last, f"{moved(alone, last):+.2f}"]
    claim += [f"{moved(library, last):+.2f}", best(alone, last), best(library, last)]
    # "its init alone (weights N(0, 0.02^2)) reverses it, +0.57, and trains worse (1.572)":
    # over the same depths as the library's, at the deepest
    init = per["completep_init"]
    assert deepest(init) == last and moved(init, last) > 0 > moved(library, last)
    assert best(init, last) > best(library, last)
    claim += [0, 0.02, f"{moved(init, last):+.2f}", best(init, last)]
    return claim, scale


SHAPED_FREE = "shaped advise, slopes+attn+tau"
"""The ablation's model that is the preset ``shaped_free`` (its (f); examples/ablation/report.py
``CHECKED``, whose test holds the preset to the runs)."""


def _ablation() -> tuple[list, list]:
    d = _json("examples/ablation/results.json")
    depth, h = 16, "2000"
    models = d["depths"][str(depth)]["models"]
    free, relu = models[SHAPED_FREE][h], models["shaped advise, relu"][h]
    shaped, gpt2 = models["shaped advise"][h], models["pre-LN (GPT-2)"][h]
    assert free["vs_gpt2"] < 0 < shaped["vs_gpt2"] and relu["vs_gpt2"] < 0  # leads / trails
    assert free["bracketed"] and shaped["seeds"] == 3 and shaped["bracketed"]  # "bracketed by"

    def pct(x: float) -> str:
        return f"{abs(100 * x):.1f}"

    claim = [pct(free["vs_gpt2"]), f"{free['mean']:.3f}", f"{gpt2['mean']:.3f}"]
    claim += [pct(shaped["vs_gpt2"]), f"{shaped['mean']:.3f}", pct(relu["vs_gpt2"])]
    scale = [int(h), *d["widths"], depth, free["seeds"], *free["lr"], shaped["seeds"]]
    return claim, scale


def _ablation_long() -> tuple[list, list]:
    d = _json("examples/ablation/results.json")
    depth, h = 16, "5000"
    at = d["depths"][str(depth)]
    models = at["models"]
    free, shaped = models[SHAPED_FREE][h], models["shaped advise"][h]
    gpt2, mup = models["pre-LN (GPT-2)"][h], models["pre-LN depth-muP"]
    shape = at["shape"][SHAPED_FREE][h]
    assert free["vs_gpt2"] < 0 < shaped["vs_gpt2"] and free["bracketed"]
    assert free["best_baseline"] == "pre-LN depth-muP" and free["vs_best"] > 0  # "ahead of it"
    assert gpt2["seeds"] == 3 and mup[h]["bracketed"]
    halves = [lr for lr in mup[h]["lr"] if lr not in free["lr"]]  # "refined by half steps"
    assert sorted(free["lr"] + halves) == mup[h]["lr"] and len(halves) == 2  # "the same grid"
    assert mup[h]["best_lr"] == free["best_lr"]  # the half steps did not move its best lr
    at_2000 = models[SHAPED_FREE]["2000"]["vs_best"]
    claim = [int(h), f"{abs(100 * free['vs_gpt2']):.1f}", f"{free['mean']:.3f}"]
    claim += [f"{gpt2['mean']:.3f}", f"{100 * shaped['vs_gpt2']:.1f}", f"{shape['kappa_init']:.3f}"]
    claim += [f"{100 * free['vs_best']:.1f}", f"{mup[h]['mean']:.3f}", f"{100 * at_2000:.1f}", 2000]
    claim += [f"{shape['kappa_final']:.3f}", 0.5]  # a plain ReLU's kappa (docs/theory.md)
    # depth 64, 2,000 steps: both models tuned on one grid
    deep = d["depths"]["64"]["models"]
    free64, mup64 = deep[SHAPED_FREE]["2000"], deep["pre-LN depth-muP"]["2000"]
    assert free64["best_baseline"] == "pre-LN depth-muP" and free64["vs_best"] > 0  # "behind"
    assert free64["vs_gpt2"] < 0 and free64["bracketed"] and mup64["bracketed"]
    assert free64["lr"] == mup64["lr"] and free64["best_lr"] == mup64["best_lr"]  # "both at"
    assert free64["loss"][-1] is None and mup64["loss"][-1] is not None  # "diverges for"
    claim += [64, 2000, f"{100 * free64['vs_best']:.1f}", f"{free64['mean']:.3f}"]
    claim += [f"{mup64['mean']:.3f}", f"{abs(100 * free64['vs_gpt2']):.1f}"]
    # and (e), with a fixed temperature: 3 seeds on the same grid, further behind
    fixed64 = deep["shaped advise, slopes+attn"]["2000"]
    assert fixed64["best_baseline"] == "pre-LN depth-muP" and fixed64["vs_best"] > 0  # "behind"
    assert fixed64["bracketed"] and fixed64["lr"] == free64["lr"] and fixed64["seeds"] == 3
    assert fixed64["best_lr"] == free64["best_lr"]  # "all at"
    assert fixed64["mean"] > free64["mean"]
    claim += [f"{100 * fixed64['vs_best']:.1f}", f"{fixed64['mean']:.3f}"]
    scale = [
        int(h),
        *d["widths"],
        depth,
        free["seeds"],
        *free["lr"],
        gpt2["seeds"],
        mup[h]["seeds"],
        *halves,
        64,
        free64["seeds"],
        mup64["seeds"],
        *free64["lr"],
    ]
    return claim, scale


def _ablation_goal() -> tuple[list, list]:
    """Depth 16, 5,000 steps: no shaped-at-initialisation model within 1% of the best
    baseline; the two closest with 3 seeds ((l) with its vectors at a third of the lr, and at
    the full lr), the other follow-ups after (f) at seed 0."""
    d = _json("examples/ablation/results.json")
    depth, h = 16, "5000"
    at = d["depths"][str(depth)]
    goal, models = at["goal"], at["models"]
    mup = models["pre-LN depth-muP"][h]
    shaped = {m: g for m, g in goal.items() if g["sde_at_init"]}
    assert all(g["verdict"] != "met" for g in shaped.values())  # "no ... comes within 1%"
    seeded = sorted((m for m in shaped if shaped[m]["seeds"] == 3), key=lambda m: goal[m]["ratio"])
    full = f"{SHAPED_FREE}, biases"  # "`shaped_free` with biases"
    assert seeded[:2] == [f"{full}, vectors lr/3", full]  # "at a third of the lr", "the full lr"
    claim: list = [depth, 1, f"{mup['mean']:.3f}", 3]
    scale: list = [int(h), *d["widths"], depth, 3, mup["best_lr"]]
    brackets = []
    for m in seeded[:2]:
        c, g = models[m][h], goal[m]
        assert g["baseline"] == "pre-LN depth-muP" and g["seeds"] == g["baseline_seeds"] == 3
        assert c["bracketed"] and c["best_lr"] == mup["best_lr"]
        claim += [f"{100 * g['ratio']:.1f}", f"{100 * g['ratio_se']:.1f}", f"{c['mean']:.3f}"]
        # "bracketed by A and B": the nearest lrs run on each side of the best, both worse
        lrs = dict(zip(c["lr"], c["loss"], strict=True))
        below = max(lr for lr in lrs if lr < c["best_lr"])
        above = min(lr for lr in lrs if lr > c["best_lr"])
        assert all(lrs[lr] is not None and lrs[lr] > c["mean"] for lr in (below, above))
        brackets.append((below, above))
    # "bracketed by 0.00333 and the half step 0.0173 at a third, by the half steps 0.00577
    # and 0.0173 at the full lr": half a step is x 3^(+-1/2) from the best
    (lo3, hi3), (lo1, hi1) = brackets
    half = [abs(abs(math.log(lr / mup["best_lr"], 3)) - 0.5) < 1e-2 for lr in (lo3, hi3, lo1, hi1)]
    assert half == [False, True, True, True]
    scale += [lo3, hi3, lo1, hi1]
    # "the N other variants the 5,000-step stage added (seed 0, M of them no longer shaped at
    # initialisation) end between A and B": the goal table's rows after (f), all one seed,
    # on the recipe's 20% cooldown (a longer cooldown is another recipe, not another model)
    order = list(goal)
    after = order[order.index(SHAPED_FREE) + 1 :]
    after = [m for m in after if m not in seeded[:2] and d["cooldown_fractions"][m] == 0.2]
    assert all(goal[m]["seeds"] == 1 and goal[m]["ratio"] > 0.01 for m in after)
    ends = [models[m][h]["mean"] for m in after]
    leave = sum(not goal[m]["sde_at_init"] for m in after)
    claim += [len(after), int(h), 0, leave, f"{min(ends):.3f}", f"{max(ends):.3f}"]
    # "the others seed 0, each at the best of the 1 to 4 lrs it ran" (their lr not tuned)
    ran = [len(models[m][h]["lr"]) for m in after]
    # "at depth 64 the two closest end A% (a third) and B% behind": seed 0, 2,000 steps, at
    # one lr, depth-muP's best there ("not tuned"), against it
    deep = d["depths"]["64"]["models"]
    mup64 = deep["pre-LN depth-muP"]["2000"]
    cells = [deep[m]["2000"] for m in seeded[:2]]
    assert all(cell["seeds"] == 1 and cell["lr"] == [mup64["best_lr"]] for cell in cells)
    assert all(cell["best_baseline"] == "pre-LN depth-muP" for cell in cells)
    assert all(cell["vs_best"] > 0 for cell in cells)  # "behind"
    claim += [64, *(f"{100 * cell['vs_best']:.1f}" for cell in cells)]
    return claim, [*scale, 0, min(ran), max(ran), 64, 2000, mup64["best_lr"]]


FINDINGS = {
    "examples/finite_width/attention/results.md": [_finite_width],
    "examples/stability_map/results.md": [_stability_map],
    "examples/shaped_vs_vanilla/results.md": [_shaped_vs_vanilla],
    "examples/long_horizon/results.md": [
        _long_horizon_pair,
        _long_horizon_level,
        _long_horizon_outliers,
        _long_horizon_gpu,
    ],
    "examples/advise/results.md": [_advise_short, _advise_long],
    "examples/transfer/results.md": [
        lambda: _transfer(
            [
                ("pre_ln_depth_mup", "depth_drift", "depth"),
                ("pre_ln_depth_mup", "width_drift", "width"),
            ]
        ),
        lambda: _transfer(
            [("shaped_t", "depth_drift", "depth"), ("shaped_t", "width_drift", "width")]
        ),
        _completep,
    ],
    "examples/ablation/results.md": [_ablation, _ablation_long, _ablation_goal],
}
"""The findings table's rows by report, in order: each gives (the numbers of the finding's
claim, the numbers its horizon-and-scale cell may quote), computed from the study's data."""


def _findings() -> dict[str, list[tuple[str, str]]]:
    rows: dict[str, list[tuple[str, str]]] = {}
    for claim, scale, report in _table("| finding | horizon and scale | report |")[2:]:
        link = re.fullmatch(r"\[[^\]]+\]\(([^)]+)\)", report).group(1)
        rows.setdefault(link, []).append((claim, scale))
    return rows


def _as_str(value) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def test_findings_table_has_one_checked_row_per_finding():
    rows = _findings()
    assert list(rows) == list(FINDINGS)
    assert {k: len(v) for k, v in rows.items()} == {k: len(v) for k, v in FINDINGS.items()}


@pytest.mark.parametrize(
    ("report", "index"),
    [(report, i) for report, checks in FINDINGS.items() for i in range(len(checks))],
)
def test_findings_numbers_are_the_studys_data(report, index):
    """Every number of the finding is computed from the study's data and every number of its
    horizon-and-scale cell is one of the study's settings: the README cannot drift from the
    committed results, nor quote a number that is in no data file."""
    claim_cell, scale_cell = _findings()[report][index]
    claim, scale = FINDINGS[report][index]()
    assert sorted(_numbers(claim_cell)) == sorted(_as_str(v) for v in claim), claim_cell
    allowed = {_as_str(v) for v in scale}
    assert set(_numbers(scale_cell)) <= allowed, (scale_cell, allowed)


# ---- the documentation indexes -----------------------------------------------------------------


def _nav_pages() -> list[str]:
    """The pages of the site's navigation (mkdocs.yml), in order, Home excepted."""
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    pages: list[str] = []

    def walk(items) -> None:
        for item in items:
            for value in item.values():
                if isinstance(value, list):
                    walk(value)
                else:
                    pages.append(value)

    walk(nav)
    return [page for page in pages if page != "index.md"]


def _linked(text: str, prefix: str) -> list[str]:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    return [link.removeprefix(prefix) for link in links if link.startswith(prefix)]


def test_readme_and_site_home_index_every_page_of_the_site():
    """The README's documentation index and docs/index.md link every page of mkdocs.yml's
    navigation (a new guide page without an index entry fails)."""
    pages = _nav_pages()
    section = TEXT[TEXT.index("## Documentation") :]
    for text, prefix in ((section, "docs/"), ((ROOT / "docs" / "index.md").read_text(), "")):
        assert set(pages) <= set(_linked(text, prefix)), set(pages) - set(_linked(text, prefix))
