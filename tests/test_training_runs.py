"""Training runs as Dask tasks (simulations.training_runs) and the long-horizon study's quick
mode (examples/long_horizon) on the Dask path: resumable, a killed worker's run redone."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from run_history import load_script

from shapedtx import ModelConfig, TrainConfig
from simulations.sweep.tasks import run_replanned, run_tasks
from simulations.training_runs import (
    TrainingRun,
    _losses_text,
    check_run_options,
    horizon_loss,
    one_corpus,
    run_planned,
    run_training,
    run_trainings,
)

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

STUDY = Path(__file__).parents[1] / "examples" / "long_horizon"
MODEL = ModelConfig(
    width=16, depth=2, attention="shaped", mlp="shaped_relu", heads=2, out_proj=True, causal=True
)
TRAIN = TrainConfig(
    batch_size=4,
    seq_len=16,
    lr=1e-2,
    warmup_steps=2,
    schedule="wsd",
    cooldown_fraction=0.25,
    log_interval=2,
    eval_interval=4,
    eval_batches=1,
    metrics_batch=2,
    checkpoint_interval=4,
)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as c:
        yield c


def _run(tmp_path: Path, name: str, steps: int = 16, **train) -> TrainingRun:
    return TrainingRun(
        MODEL,
        TRAIN.replace(**train),
        (8, steps),
        str(tmp_path / name),
        max_bytes=20_000,
        labels={"name": name},
    )


def test_run_training_writes_every_horizon_and_is_read_back(tmp_path):
    run = _run(tmp_path, "a")
    import torch

    result = run_training(run)
    assert json.loads(run.result_path.read_text()) == result
    assert set(result["horizons"]) == {"8", "16"} and result["name"] == "a"
    assert result["host"]["torch"] == torch.__version__  # what sets the last bits
    assert result["host"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert result["batch_generator"] == "cpu"  # a GPU run draws the CPU's batches
    assert result["resumed"] is False and result["wall_seconds"] > 0
    h8, h16 = result["horizons"]["8"], result["horizons"]["16"]
    assert h8["branch_step"] == 6 and h16["branch_step"] is None
    assert h8["val_curve"]["step"][-1] == 8 and h16["val_curve"]["step"][-1] == 16
    # the branch shares the longest run's curve up to the branch point
    assert h8["val_curve"]["loss"][:2] == h16["val_curve"]["loss"][:2]
    assert not any((tmp_path / "a").rglob("*.pt"))  # weights removed, logs kept
    assert len(h16["mean_rho"]["final"]) == MODEL.depth + 1
    before = run.result_path.stat().st_mtime_ns
    assert run_training(run) == result and run.result_path.stat().st_mtime_ns == before
    assert horizon_loss(result, 8) == h8["val_loss"] and horizon_loss(result, 16) == h16["val_loss"]
    assert horizon_loss(result, 32) == float("inf")  # a horizon the run does not have
    h16["diverged"] = True
    assert horizon_loss(result, 16) == float("inf")


def test_training_run_validates_its_fields(tmp_path):
    with pytest.raises(ValueError, match="horizons"):
        TrainingRun(MODEL, TRAIN.replace(schedule="cosine"), (8, 16), str(tmp_path))
    with pytest.raises(ValueError, match="dtype"):
        TrainingRun(MODEL, TRAIN, (16,), str(tmp_path), dtype="float16")
    with pytest.raises(ValueError, match="model"):
        TrainingRun("shaped", TRAIN, (16,), str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data must be an existing corpus"):
        TrainingRun(MODEL, TRAIN, (16,), str(tmp_path), data=str(tmp_path / "absent"))


def test_a_studys_run_options_are_checked_before_it_starts(tmp_path, monkeypatch):
    """check_run_options: the device must be available here and the data must exist; the
    error names the one that is not (the studies turn it into a usage error, exit 2)."""
    import torch

    from shapedtx import ParameterError

    check_run_options("cpu", None)
    check_run_options("cpu", str(tmp_path))
    with pytest.raises(ParameterError) as err:
        check_run_options("cpu", str(tmp_path / "absent"))
    assert err.value.parameter == "data"
    with pytest.raises(ParameterError) as err:
        check_run_options("tpu", None)
    assert err.value.parameter == "device"
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="CUDA is not available") as err:
            check_run_options("cuda", None)
        assert err.value.parameter == "device"
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    with pytest.raises(SystemExit) as exit_:
        study.parse(["--data", str(tmp_path / "absent")])
    assert exit_.value.code == 2


def test_a_run_on_an_exported_corpus_trains_on_the_default_corpus_bytes(tmp_path):
    """A run given ``data`` (the default corpus exported, as a machine with another Python
    gets it) records the same corpus fingerprint and the same losses as one on the default
    corpus; a study's results on two corpora are refused by ``one_corpus``, naming both."""
    from shapedtx.training import export_corpus

    corpus = export_corpus(tmp_path / "corpus", max_bytes=20_000)
    here = run_training(_run(tmp_path, "here"))
    there = run_training(replace(_run(tmp_path, "there"), data=str(corpus)))
    assert there["corpus"] == str(corpus) and here["corpus"] != there["corpus"]
    assert there["corpus_fingerprint"] == here["corpus_fingerprint"]
    assert there["horizons"]["16"]["val_loss"] == here["horizons"]["16"]["val_loss"]
    assert one_corpus([here, there, {"old": "no fingerprint"}]) == here["corpus_fingerprint"]
    other = {"corpus_fingerprint": "0123456789abcdef"}
    with pytest.raises(ValueError, match=r"2 different corpora .*0123456789abcdef \(1 runs\)"):
        one_corpus([here, there, other])


def test_run_planned_replans_until_nothing_is_left(cluster, tmp_path, capsys):
    """A study whose next runs depend on finished ones: ``b`` is planned only once ``a`` has
    finished (read from disk), ``max_runs`` caps the new runs, a failed run ends the study (it
    would be planned again), and an empty plan starts nothing. One worker thread: one run at a
    time, the plan asked again as each ends."""
    calls = []

    def plan(extra: TrainingRun | None = None) -> list[TrainingRun]:
        a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
        todo = [b] if a.result_path.exists() else [a]
        if extra is not None:
            todo.append(extra)
        todo = [r for r in todo if not r.result_path.exists()]
        calls.append([Path(r.folder).name for r in todo])
        return todo

    capsys.readouterr()
    first = run_planned(plan, client=cluster.scheduler_address, max_runs=1)
    assert list(first.results) == [str(tmp_path / "a")] and first.ok
    # the log's end line: the run's validation loss at each horizon
    h = first.results[str(tmp_path / "a")]["horizons"]
    expected = f"val loss {h['8']['val_loss']:.3f} (8), {h['16']['val_loss']:.3f} (16)"
    ends = [line for line in capsys.readouterr().err.splitlines() if "] end " in line]
    assert len(ends) == 1 and ends[0].endswith(expected)
    assert _losses_text({"horizons": {
        "1000": {"val_loss": None, "diverged": True}, "250": {"val_loss": 2.1824, "diverged": False}
    }}) == "val loss 2.182 (250), diverged (1000)"  # fmt: skip
    assert calls == [["a"], ["a"]]  # the check, then the start; the cap asks no more
    calls.clear()
    broken = TrainingRun(MODEL, TRAIN, (8,), str(tmp_path / "broken"), max_bytes=20_000,
                         device="no-such-device")  # fmt: skip
    rest = run_planned(lambda: plan(broken), client=cluster.scheduler_address, progress=False)
    assert set(rest.results) == {str(tmp_path / "b")}
    assert set(rest.failed) == {broken.folder}
    # check, start b (the one thread), start broken when b ends; nothing after the failure
    assert calls == [["b", "broken"], ["b", "broken"], ["broken"]]
    calls.clear()
    none = run_planned(plan, client="tcp://127.0.0.1:1")  # would fail to connect: not used
    assert not none.results and not none.failed and calls == [[]]
    with pytest.raises(ValueError, match="max_runs must be an integer >= 0, got -1"):
        run_planned(plan, max_runs=-1)
    twice = [_run(tmp_path, "c"), _run(tmp_path, "c")]
    with pytest.raises(ValueError, match="distinct folders"):
        run_planned(lambda: twice, client="tcp://127.0.0.1:1")


def _signal(job: tuple[str, str, str | None]) -> bool:
    """Write ``<name>.done`` in ``folder``; first wait (up to 60 s) for ``wait_for`` there, if
    given. Returns whether ``wait_for`` was there."""
    folder, name, wait_for = job
    deadline = time.monotonic() + 60
    while wait_for and not Path(folder, wait_for).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(folder, f"{name}.done").write_text("")
    return wait_for is None or Path(folder, wait_for).exists()


def test_run_replanned_gives_a_free_thread_the_next_job_while_another_runs(tmp_path):
    """Two threads: "long" ends only once "after" has run (or after 60 s), and "after" is
    planned only once "short" has ended. Asked again when short's thread frees, the plan
    starts "after" beside "long"; a loop planning in rounds (asking again only when long and
    short had both ended) leaves long waiting its 60 s and after running alone."""
    folder = str(tmp_path)

    def plan() -> list[tuple[str, tuple[str, str, str | None]]]:
        jobs = [("long", (folder, "long", "after.done")), ("short", (folder, "short", None))]
        if (tmp_path / "short.done").exists():
            jobs.append(("after", (folder, "after", None)))
        return [(key, job) for key, job in jobs if not (tmp_path / f"{key}.done").exists()]

    def simple(names: str) -> list[tuple[str, tuple[str, str, None]]]:
        return [(n, (folder, n, None)) for n in names if not (tmp_path / f"{n}.done").exists()]

    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0"
    ) as client:
        summary = run_replanned(_signal, plan, client=client, progress=False, poll=0.5)
        assert summary.ok and summary.results == {"long": True, "short": True, "after": True}
        capped = run_replanned(_signal, lambda: simple("abc"), client=client, max_jobs=2)
        assert set(capped.results) == {"a", "b"} and not (tmp_path / "c.done").exists()
        with pytest.raises(ValueError, match="plan\\(\\) must give unique keys"):
            run_replanned(_signal, lambda: simple("dd"), client=client)
        with pytest.raises(ValueError, match="poll"):
            run_replanned(_signal, lambda: simple("e"), client=client, poll=0)


def test_run_replanned_logs_each_jobs_start_and_end_unless_progress_is_off(tmp_path, capsys):
    """A study's log (stderr, no terminal: the bar is off) gets a line per job as it starts
    and as it ends, with its wall time and its description or error; none with
    ``progress=False``."""
    folder = str(tmp_path)
    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"
    ) as client:
        capsys.readouterr()
        run_replanned(_signal, lambda: [("a", (folder, "a", None))], client=client,
                      progress=False)  # fmt: skip
        assert capsys.readouterr().err == ""
        summary = run_replanned(
            _fail, lambda: [(k, x) for k, x in (("one", 1), ("two", 2))], client=client,
            describe=lambda key, result: f"{key} gave {result}", poll=0.5,
        )  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert summary.results == {"one": 10} and "two" in summary.failed
    lines = [line.split("] ", 1)[1] for line in err if line.startswith("[")]
    assert [line for line in lines if line.startswith("start")] == ["start one", "start two"]
    assert [line for line in lines if re.fullmatch(r"end one after \d+\.\d min: one gave 10", line)]
    assert [line for line in lines if re.fullmatch(r"failed two after .* RuntimeError: two", line)]


def _fail(x: int) -> int:
    if x == 2:
        raise RuntimeError("two")
    return 10 * x


def test_run_tasks_collects_results_and_failures(cluster):
    with distributed.Client(cluster) as client:
        summary = run_tasks(_fail, [1, 2, 3], ["a", "b", "c"], client=client, progress=False)
    assert summary.results == {"a": 10, "c": 30}
    assert summary.failed == {"b": "RuntimeError: two"} and not summary.ok
    with pytest.raises(ValueError, match="unique"):
        run_tasks(_fail, [1, 2], ["a", "a"], client=cluster.scheduler_address)
    with pytest.raises(ValueError, match="one entry per item"):
        run_tasks(_fail, [1, 2], ["a"], client=cluster.scheduler_address)


def _malloc_trim(_: int) -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_embedded_cluster_leaves_glibc_malloc_adaptive(monkeypatch):
    # Dask's nannies set MALLOC_TRIM_THRESHOLD_=65536 by default (and leave it in this process's
    # environment, hence the delenv), which pins glibc's mmap threshold and made each training
    # step 1.4-1.5x slower; the embedded cluster's workers start without it.
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    summary = run_tasks(_malloc_trim, [0], ["env"], workers=1, progress=False)
    assert summary.results == {"env": None}


def test_user_cluster_with_dasks_malloc_setting_gets_a_warning(cluster, monkeypatch):
    # the module's cluster runs with Dask's default environment
    with pytest.warns(UserWarning, match="MALLOC_TRIM_THRESHOLD_=65536"):
        run_tasks(_malloc_trim, [0], ["env"], client=cluster.scheduler_address, progress=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # the nannies leave it here
    unset = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
    with (
        dask.config.set(unset),
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as c,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # no warning for a cluster started as the docs say
        summary = run_tasks(_malloc_trim, [0], ["env"], client=c.scheduler_address, progress=False)
    assert summary.results == {"env": None}


@pytest.mark.slow  # a worker killed and restarted: about a minute on a busy CPU
@pytest.mark.parametrize("path", ["run_planned", "run_trainings"])
def test_killed_worker_run_is_redone_and_no_finished_run_is_lost(cluster, tmp_path, path):
    """A worker killed in the middle of a run: the scheduler runs it again on the restarted
    worker, which resumes from the run's checkpoint; the finished run is not run again, and
    the interrupted run ends with the numbers of an uninterrupted one (CPU, bitwise). On both
    paths: a planned study's and a fixed list's."""
    first = _run(tmp_path, "first")
    run_training(first)  # finished before the study starts
    stamp = first.result_path.stat().st_mtime_ns
    long = _run(tmp_path, "long", steps=200, checkpoint_interval=20)
    other = _run(tmp_path, "other")
    outcome = {}

    def study():
        runs = [first, long, other]
        with distributed.Client(cluster) as client:
            if path == "run_trainings":
                outcome["summary"] = run_trainings(runs, client=client, progress=False)
            else:
                outcome["summary"] = run_planned(lambda: runs, client=client, progress=False)

    thread = threading.Thread(target=study)
    thread.start()
    checkpoint = Path(long.folder) / "h200" / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists() and not long.result_path.exists()
    with distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    thread.join(900)
    summary = outcome["summary"]
    new = {long.folder, other.folder}  # run_trainings also reads back the finished one
    assert summary.ok and set(summary.results) == new | (
        {first.folder} if path == "run_trainings" else set()
    )
    assert first.result_path.stat().st_mtime_ns == stamp
    assert len(list(tmp_path.rglob("result.json"))) == 3
    resumed = summary.results[long.folder]["horizons"]["200"]
    with distributed.Client(cluster) as client:  # the same threads as the interrupted run
        again = _run(tmp_path / "again", "long", steps=200, checkpoint_interval=20)
        fresh = client.submit(run_training, again, pure=False).result()
    np.testing.assert_array_equal(
        resumed["val_curve"]["loss"], fresh["horizons"]["200"]["val_curve"]["loss"]
    )
    # its wall time is the second call's alone, and its result says so
    assert summary.results[long.folder]["resumed"] and not fresh["resumed"]


def _load(name: str):
    return load_script(STUDY / f"{name}.py", name)


def test_long_horizon_report_counts_diverged_and_stuck_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    report = _load("report")

    def run(name, loss, diverged=False, step=None, schedule="wsd"):
        h = {"val_loss": loss, "diverged": diverged, "diverged_step": step}
        return {"model_name": name, "lr": 0.01, "seed": 0, "schedule": schedule,
                "horizons": {"100": h}}  # fmt: skip

    runs = [
        run("b", 3.4),
        run("a", None, diverged=True, step=65),
        run("c", 2.0),
        run("d", 3.4, schedule="cosine"),
        run("e", None, diverged=True),
        run("f", 3.30),  # 0.9% below the baseline: noise around it, no learning
        run("g", 3.25),  # 2.4% below: it learned something
    ]
    found = report.failures(runs, 100, 3.33)
    assert [(f["model"], f["what"]) for f in found] == [
        ("a", "diverged at step 65"),
        ("b", "stuck at the unigram baseline (3.400)"),
        ("e", "diverged"),
        ("f", "stuck at the unigram baseline (3.300)"),
    ]
    assert [f["model"] for f in report.failures(runs, 100, None)] == ["a", "e"]
    assert report.failures(runs, 200, 3.33) == []


def _cells(*columns, edge=()):
    """A model's report cells: horizon h (1, 2, ...) -> losses of seeds 0, 1, ... (a float:
    seed 0 alone); ``edge``: the horizons whose best lr is at a grid edge."""
    out = {}
    for h, column in enumerate(columns, start=1):
        values = list(column) if isinstance(column, tuple) else [column]
        out[str(h)] = {"mean": float(np.mean(values)), "seeds": list(range(len(values))),
                       "values": values, "at_edge": h in edge}  # fmt: skip
    return out


def test_long_horizon_order_changes_skip_level_horizons(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    report = _load("report")
    per_model = {
        "a": _cells(2.00, 1.60, 1.40, 1.20),
        "b": _cells(1.90, 1.59, 1.405, 1.23),  # ahead, level (0.6%, 0.4%), behind (2.5%)
        "c": _cells(2.10, 1.70, 1.50, 1.195),  # behind a up to 3, level at 4 (0.4%): no change
    }
    found = report.crossings(per_model, [1, 2, 3, 4])
    assert found == [
        {"models": ["a", "b"], "between": [1, 4], "level": [2, 3], "ahead_after": "a",
         "provisional": False},
        {"models": ["b", "c"], "between": [3, 4], "level": [], "ahead_after": "c",
         "provisional": False},
    ]  # fmt: skip
    assert report.level_pairs(per_model, 4) == [["a", "c"]]
    # an end whose best lr is at a grid edge makes the crossing provisional
    per_model["b"] = _cells(1.90, 1.59, 1.405, 1.23, edge=(4,))
    assert [c["provisional"] for c in report.crossings(per_model, [1, 2, 3, 4])] == [True, True]


def test_long_horizon_models_are_compared_on_the_seeds_both_ran(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    report = _load("report")
    # seeds both ran: the paired difference decides, widened to 2 SE of it
    steady = {"a": _cells((2.0, 2.1, 1.9), (1.0, 1.1, 0.9)),
              "b": _cells((1.9, 2.0, 1.8), (1.1, 1.2, 1.0))}  # fmt: skip
    assert report.crossings(steady, [1, 2]) == [
        {"models": ["a", "b"], "between": [1, 2], "level": [], "ahead_after": "a",
         "provisional": False}
    ]  # fmt: skip
    # the same means with a noisy paired difference (mean 0.05, 2 SE 0.115) are level at 1
    noisy = {"a": _cells((2.0, 2.15, 1.85), (1.0, 1.1, 0.9)),
             "b": _cells((1.85, 2.2, 1.8), (1.1, 1.2, 1.0))}  # fmt: skip
    assert report.crossings(noisy, [1, 2]) == []
    assert report.level_pairs(noisy, 1) == [["a", "b"]]
    # three seeds against one: seed 0 against seed 0 (a's mean, 2.2, would put b ahead at 1)
    one = {"a": _cells((2.0, 2.3, 2.3), (1.0, 1.0, 1.0)), "b": _cells(2.1, 1.2)}
    assert report.crossings(one, [1, 2]) == []
    assert report._lead(one["a"]["1"], one["b"]["1"]) == -1
    # the ratio table pairs the same seeds: seed 0's ratio, one pair, no sd
    one["pre-LN (GPT-2)"] = one.pop("b")
    ratio = report.ratios(one, [1, 2])["a"]
    assert ratio["1"] == {"ratio": pytest.approx(2.0 / 2.1), "sd": None, "pairs": 1}
    # diverged seeds drop out of the pairs; a horizon the runs lack is no cell, not an error
    steady["pre-LN (GPT-2)"] = _cells((1.9, 2.0, 1.8), (1.1, 1.2, 1.0))
    steady["a"]["1"]["values"][2] = None
    assert report.ratios(steady, [1, 2])["a"]["1"]["pairs"] == 2
    run = {"schedule": "wsd", "seed": 0, "k": 0, "lr": 0.01,
           "horizons": {"1": {"val_loss": 2.0, "diverged": False}}}  # fmt: skip
    assert report.cell([run], 2) == {"lr_curve": {"lr": [0.01], "val_loss": [None]},
                                     "diverged": 0, "runs": 0, "best_lr": None,
                                     "at_edge": None}  # fmt: skip


def test_long_horizon_report_checks_wsd_at_the_lr_the_plan_checks(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    report = _load("report")
    study = _load("study")
    setup = study.QUICK  # check horizon 20, seeds (0, 1)

    def run(k, seed, schedule, loss):
        return {"model_name": "shaped advise", "depth": 2, "k": k, "lr": 0.01 * 3.0**k,
                "seed": seed, "schedule": schedule,
                "horizons": {"20": {"val_loss": loss, "diverged": False}}}  # fmt: skip

    grid = [run(-1, 0, "wsd", 2.5), run(0, 0, "wsd", 2.4), run(1, 0, "wsd", 2.0)]
    started = [run(0, 0, kind, 2.4) for kind in ("wsd-check", "cosine")]  # seed 0 of (0, 1)
    # the best lr moved to k = 1 after a check began at k = 0: the report keeps k = 0 ...
    assert report.wsd_vs_cosine(setup, grid + started)["lr"] == pytest.approx(0.01)
    assert study.check_point(setup, grid + started) == ("shaped advise", 2, 1)  # plan: k = 1
    # ... until a check run at k = 1, the lr the plan now checks, has finished
    new = [run(1, 0, "cosine", 2.1)]
    found = report.wsd_vs_cosine(setup, grid + new + started)
    assert found["lr"] == pytest.approx(0.03) and found["cosine"]["n"] == 1
    # a complete check (every seed, both schedules) stays where it is: nothing is run again
    complete = started + [run(0, 1, kind, 2.4) for kind in ("wsd-check", "cosine")]
    assert study.check_point(setup, grid + complete) == ("shaped advise", 2, 0)
    assert study.check_plan(setup, grid + complete) == []
    assert report.wsd_vs_cosine(setup, grid + new + complete)["lr"] == pytest.approx(0.01)
    cell = {"mean": 1.51, "sd": 0.014, "n": 2, "values": [1.5, 1.52, None],
            "best_lr": 0.0033, "at_edge": False}  # fmt: skip
    assert report._fmt_cell(cell) == "1.510 ± 0.014 (n=2 of 3, lr 0.0033)"


def test_long_horizon_plan_gives_every_depth_its_centres_before_refining_any(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    setup = study.QUICK  # depths (2, 4), horizons 20 and 40, seeds (0, 1)
    pair = ("shaped advise", "pre-LN (GPT-2)")

    def run(model, depth, k, seed=0):
        loss = {"val_loss": 2.0 + abs(k), "diverged": False}  # k = 0 best at every horizon
        return {"model_name": model, "depth": depth, "k": k, "seed": seed, "schedule": "wsd",
                "horizons": {"20": loss, "40": loss}}  # fmt: skip

    tuned = [run(m, 2, k) for m in pair for k in (-1, 0, 1)]
    assert study.plan(setup, tuned) == [
        *[(m, 4, 0, 0, "wsd") for m in pair],  # depth 4's centres first
        *[(m, 2, 0, 1, "wsd") for m in pair],  # then the tuned pair's seeds at depth 2
        *[(m, 4, k, 0, "wsd") for m in pair for k in (-1, 1)],  # then depth 4's grid edges
        *[(pair[0], 2, 0, s, kind) for kind in ("wsd-check", "cosine") for s in (0, 1)],
    ]
    # an optimum at the grid's edge extends the grid (max_extensions 0 in the quick setup: no)
    edge = [run(m, 2, k) for m in pair for k in (-1, 0)] + [run(m, 2, 1) | {"horizons": {
        "20": {"val_loss": 1.0, "diverged": False}, "40": {"val_loss": 1.0, "diverged": False}}}
        for m in pair]  # fmt: skip
    assert study.plan(setup, edge)[2:4] == [(m, 2, 1, 1, "wsd") for m in pair]


def test_long_horizon_plan_skips_the_edge_beyond_a_centre_worse_at_every_horizon(monkeypatch):
    """The base grid's lower edge is not run when the upper edge beats the centre at every
    horizon (the centre brackets every optimum from below); the grid extends upwards instead."""
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    model = study.QUICK.models[0]
    setup = replace(study.QUICK, depths=(2,), models=(model,), max_extensions=1, check=False)

    def run(k, short, long):
        horizons = {str(h): {"val_loss": v, "diverged": v is None}
                    for h, v in zip((20, 40), (short, long), strict=True)}  # fmt: skip
        return {"model_name": model, "depth": 2, "k": k, "seed": 0, "schedule": "wsd",
                "horizons": horizons}  # fmt: skip

    def todo(results):
        return [j[2:4] for j in study.plan(setup, results)]

    upward = [run(0, 2.2, 2.0), run(1, 2.1, 1.9)]
    assert todo(upward) == [(2, 0)]  # not k = -1: the grid extends past the best edge
    assert study._beyond_a_worse_centre(upward, (20, 40)) == {-1}
    # the centre still wins one horizon: both its neighbours are needed
    assert todo([run(0, 2.2, 2.0), run(1, 2.3, 1.9)]) == [(-1, 0)]
    # a diverged upper edge is worse, never a reason to skip
    assert todo([run(0, 2.2, 2.0), run(1, None, None)]) == [(-1, 0)]
    # mirrored: the lower edge beats the centre everywhere, the upper one is not run
    downward = [run(0, 2.2, 2.0), run(-1, 2.1, 1.9)]
    assert todo(downward) == [(-2, 0)]
    # once bracketed, the best lr's seeds follow, still without the skipped edge
    done = [*upward, run(2, 2.3, 2.1)]
    assert todo(done) == [(1, 1)]


def test_long_horizon_refine_plans_half_steps_around_the_best_lr_before_its_seeds(monkeypatch):
    """``--refine``: once the 3x grid brackets the best lr of the longest horizon, the lrs
    3^(1/2) away on both sides come next; the seeds follow whichever is best; a half step is
    never planned beyond the grid's ends, and the grid's own points stop the refinement."""
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    model = study.QUICK.models[0]
    setup = replace(study.QUICK, depths=(2,), models=(model,), check=False, refine=True)

    def run(k, long, seed=0):
        horizons = {"20": {"val_loss": 2.0 + abs(k), "diverged": False},
                    "40": {"val_loss": long, "diverged": long is None}}  # fmt: skip
        return {"model_name": model, "depth": 2, "k": k, "seed": seed, "schedule": "wsd",
                "horizons": horizons}  # fmt: skip

    def todo(results):
        return [j[2:4] for j in study.plan(setup, results)]

    grid = [run(-1, 2.3), run(0, 2.0), run(1, None)]  # a diverged edge still brackets
    assert todo(grid) == [(-0.5, 0), (0.5, 0)]
    assert todo(grid[:2]) == [(1, 0)]  # the grid's edge first: no half step without it
    assert study.lr_grid(setup, model, 2, -0.5) == pytest.approx(
        study.lr_grid(setup, model, 2, 0) / 3**0.5, rel=2e-3
    )
    assert todo([*grid, run(-0.5, 1.9), run(0.5, 2.1)]) == [(-0.5, 1)]  # seeds at the winner
    # a half step that wins before the other ran: bracketed by the grid, the other is not needed
    assert todo([*grid, run(-0.5, 1.9)]) == [(-0.5, 1)]
    assert todo([*grid, run(-0.5, 2.1), run(0.5, 2.2)]) == [(0, 1)]
    # the best lr at the grid's end (no extension left): only the half step inside the grid
    assert todo([run(-1, 2.3), run(0, 2.0), run(1, 1.8)]) == [(0.5, 0)]
    assert study.plan(replace(setup, refine=False), grid) == [(model, 2, 0, 1, "wsd")]
    # --models keeps the WSD-vs-cosine check only for the study's own first model
    assert study.setup_of(study.parse(["--models", "pre-LN depth-muP", "--refine"])).check is False
    kept = study.setup_of(study.parse(["--models", *study.DEFAULT.models[:2]]))
    assert kept.check and not kept.refine and study.setup_of(study.parse([])).check


def test_long_horizon_lrs_option_keeps_the_planned_runs_at_those_lrs(monkeypatch):
    """``--lrs``: the plan's runs at those peak lrs only, in the plan's order (a best lr's
    seeds before a grid edge the plan puts first); a bad value is a usage error."""
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    setup = replace(study.QUICK, depths=(2,))
    shaped, pre_ln = setup.models

    def run(model, k, seed=0):
        loss = {"val_loss": 2.0 + abs(k), "diverged": False}
        return {"model_name": model, "depth": 2, "k": k, "seed": seed, "schedule": "wsd",
                "horizons": {"20": loss, "40": loss}}  # fmt: skip

    results = [run(m, 0) for m in (shaped, pre_ln)]
    whole = study.planned(setup, results)
    assert whole == study.plan(setup, results) and {j[2] for j in whole} == {-1, 1}
    up = study.lr_grid(setup, shaped, 2, 1)
    at_up = [j for j in whole if study.lr_grid(setup, *j[:3]) == up]  # each model's own grid
    assert (shaped, 2, 1, 0, "wsd") in at_up and len(at_up) < len(whole)
    assert study.planned(setup, results, (up,)) == at_up
    assert study.planned(setup, results, (up * (1 + 1e-4),)) == study.planned(
        setup, results, (up,)
    )  # the grid's 3 significant digits
    assert study.planned(setup, results, (up * 1.1,)) == []
    for bad in ("0", "-0.01", "inf"):
        with pytest.raises(SystemExit) as exit_:
            study.parse(["--lrs", bad])
        assert exit_.value.code == 2
    assert study.parse(["--lrs", "0.01", "0.03"]).lrs == [0.01, 0.03]


def test_long_horizon_add_lrs_runs_seed_0_at_a_grid_point_or_half_step_first(monkeypatch):
    """``--add-lrs``: seed 0 of every model at that lr goes before the plan, planned or not
    (a half step of a grid whose edges are not all run), once; its grid index is the half
    step's, so the plan reads it as a point of the grid; an lr off the grid and its half
    steps is a usage error naming it."""
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    setup = replace(study.QUICK, depths=(2,), check=False)
    shaped, pre_ln = setup.models

    def run(model, k, seed=0):
        loss = {"val_loss": 2.0 + abs(k), "diverged": False}
        return {"model_name": model, "depth": 2, "k": k, "seed": seed, "schedule": "wsd",
                "horizons": {"20": loss, "40": loss}}  # fmt: skip

    results = [run(m, 0) for m in (shaped, pre_ln)]  # the edges are not run: no half step yet
    assert all(j[2] in (-1, 1) for j in study.plan(setup, results))
    half = study.lr_grid(setup, shaped, 2, -0.5)
    assert study.grid_index(setup, shaped, 2, half) == -0.5
    assert study.grid_index(setup, shaped, 2, study.lr_grid(setup, shaped, 2, 1)) == 1
    # the same lr on each model's own grid (pre-LN's centre is another)
    first = [(m, 2, study.grid_index(setup, m, 2, half), 0, "wsd") for m in (shaped, pre_ln)]
    assert first[0][2] == -0.5 and first[1][2] % 0.5 == 0
    added = study.planned(setup, results, add=(half,))
    assert added == first + study.plan(setup, results)
    assert study.planned(setup, [*results, run(shaped, -0.5)], add=(half,))[0] == first[1]
    # with --lrs, the added runs still go first; the plan's are filtered
    up = study.lr_grid(setup, shaped, 2, 1)
    assert study.planned(setup, results, (up,), add=(half,)) == first + study.planned(
        setup, results, (up,)
    )
    with pytest.raises(ValueError, match=r"lr must be on .* got 0\.005"):
        study.grid_index(setup, shaped, 2, 0.005)
    for bad in (["0.005"], ["-1"], ["inf"]):
        with pytest.raises(SystemExit) as exit_:
            study.parse(["--quick", "--depths", "2", "--add-lrs", *bad])
        assert exit_.value.code == 2
    args = study.parse(["--quick", "--depths", "2", "--add-lrs", f"{half:.3g}"])
    assert args.add_lrs == [float(f"{half:.3g}")]


def test_long_horizon_plan_seeds_the_next_model_when_the_best_ones_seed_diverges(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    setup = replace(study.QUICK, depths=(2,), compared=())  # seeds only for the best model
    shaped, pre_ln = study.QUICK.models

    def run(model, k, seed=0, loss=None):
        h = {"val_loss": loss, "diverged": loss is None}
        return {"model_name": model, "depth": 2, "k": k, "seed": seed, "schedule": "wsd",
                "horizons": {"20": h, "40": h}}  # fmt: skip

    grid = [run(m, k, loss=2.0 + abs(k) + (m == pre_ln) * 0.1) for m in (shaped, pre_ln)
            for k in (-1, 0, 1)]  # fmt: skip
    assert [j for j in study.plan(setup, grid) if j[4] == "wsd"] == [(shaped, 2, 0, 1, "wsd")]
    # seed 1 of the best model diverged: it is not among the best, the next model is seeded
    diverged = [*grid, run(shaped, 0, seed=1)]
    assert [j for j in study.plan(setup, diverged) if j[4] == "wsd"] == [(pre_ln, 2, 0, 1, "wsd")]


def test_long_horizon_monitor_takes_each_depths_longest_logged_horizon(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    monitor = _load("monitor")
    for folder in ("a/d16/lr1_s0/h250", "a/d16/lr1_s0/h5000", "a/d64/lr1_s0/h250",
                   "a/d64/lr1_s0/h2000", "b/d64/lr1_s0/h500"):  # fmt: skip
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "log.nc").touch()
    (tmp_path / "b/d64/lr1_s0/h2000").mkdir()  # no log yet: not a run to measure
    found = [str(f.relative_to(tmp_path)) for f in monitor.run_folders(tmp_path)]
    assert found == ["a/d16/lr1_s0/h5000", "a/d64/lr1_s0/h2000"]  # not b's shorter run
    assert [str(f.relative_to(tmp_path)) for f in monitor.run_folders(tmp_path, 250)] == [
        "a/d16/lr1_s0/h250",
        "a/d64/lr1_s0/h250",
    ]


def test_long_horizon_monitor_updates_a_kept_rows_status_from_the_runs_result(
    tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(STUDY))
    monitor = _load("monitor")
    result = tmp_path / "result.json"
    assert monitor._status_now(result, "running") == "running"  # not finished (or not here)
    horizons = {"250": {"status": "finished", "diverged": False},
                "5000": {"status": "finished", "diverged": False}}  # fmt: skip
    result.write_text(json.dumps({"horizons": horizons}))
    assert monitor._status_now(result, "running") == "finished"
    horizons["5000"] = {"status": "diverged", "diverged": True}
    result.write_text(json.dumps({"horizons": horizons}))
    assert monitor._status_now(result, "running") == "diverged"  # the longest horizon decides


@pytest.mark.slow  # a quick study on Dask: about a minute on a busy CPU
def test_quick_long_horizon_study_end_to_end_on_dask(cluster, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    study = _load("study")
    args = [
        "--quick",
        "--out",
        str(tmp_path),
        "--depths",
        "2",
        "--models",
        "shaped advise",
        "pre-LN (GPT-2)",
        "--scheduler",
        cluster.scheduler_address,
    ]
    assert study.main(args) == 0
    summary = json.loads((tmp_path / "results.json").read_text())
    setup = study.QUICK
    cells = summary["depths"]["2"]["models"]
    for model in ("shaped advise", "pre-LN (GPT-2)"):
        for h in setup.horizons[2]:
            c = cells[model][str(h)]
            assert len(c["lr_curve"]["lr"]) == 3 and c["best_lr"] in c["lr_curve"]["lr"]
    check = summary["wsd_vs_cosine"]
    assert check["cosine"]["n"] == check["wsd"]["n"] == len(setup.seeds)
    assert check["difference"] == pytest.approx(check["wsd"]["mean"] - check["cosine"]["mean"])
    # a WSD run of the check horizon alone is bitwise the branch of the long run (CPU)
    assert check["branch_equals_alone"] is True
    assert (tmp_path / "figures" / "loss_vs_horizon.png").stat().st_size > 0
    assert "Unigram baseline" in (tmp_path / "tables.md").read_text()
    assert "Failed runs at 40 steps: " in (tmp_path / "tables.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/*/*/result.json")}
    assert study.main(args) == 0  # resumes: nothing is trained again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    # signal propagation after training: the finished runs' last logged monitor row
    longest = max(setup.horizons[2])
    monitor = _load("monitor")
    monitor.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path)])  # longest: 40
    assert (tmp_path / "figures" / "monitor_d2.png").stat().st_size > 0
    measured = json.loads((tmp_path / "monitor.json").read_text())
    finished = [r for r in measured.values() if r["status"] == "finished"]
    assert len(finished) >= 4
    for r in finished:
        assert r["sources"] == {"0": "measured", str(longest): "log.nc"}
        assert r["max_rel_diff_from_log"] < 1e-5
        assert 0 < r["measured"][str(longest)]["entropy / uniform"] <= 1
    table = (tmp_path / "monitor.md").read_text()
    assert f"| finished | {longest} | log.nc |" in table


def test_warmup_probe_reports_the_first_non_finite_step_and_applies_its_overrides(monkeypatch):
    monkeypatch.syspath_prepend(str(STUDY))
    probe = _load("warmup_probe")
    real, seen = probe.train, []

    def poisoned(model_config, data, config, *, loss_hook, **kw):  # NaN from step 4 on
        seen.append((model_config.mlp_gain, config.warmup_steps))
        hook = lambda s, loss: loss_hook(s, loss * math.nan if s >= 4 else loss)  # noqa: E731
        return real(model_config, data, config, loss_hook=hook, **kw)

    monkeypatch.setattr(probe, "train", poisoned)
    args = (probe.study.QUICK, "SAS-P no norm", 2, 0, 1)
    out = probe.probe(*args, steps=10, mlp_gain=0.05, warmup=7)
    assert seen == [(0.05, 7)] and (out["mlp_gain"], out["warmup_steps"]) == (0.05, 7)
    assert out["diverged_step"] == 4 and math.isnan(out["loss"])
    out = probe.probe(*args, steps=3)  # stops before the poison: alive, the study's settings
    assert out["diverged_step"] is None and math.isfinite(out["loss"])
    assert seen[1] == (0.1, probe.study.QUICK.warmup_steps)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        probe.probe(*args, steps=0)
