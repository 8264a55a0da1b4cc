"""The shared study runner and run store (simulations.studies): atomic, keyed, resumable."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from shapedtx import ModelConfig, TrainConfig
from simulations.studies import RunStore, Study, lr_tag, run_study, study_main, study_parser
from simulations.training_runs import TrainingRun

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


def _write_result(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result, indent=1))


def test_lr_tag_is_the_one_encoding_of_run_keys():
    assert lr_tag(1e-2 / 3) == "lr0.00333"
    assert lr_tag(2**-8) == "lr0.00391"
    assert lr_tag(0.01) == "lr0.01"
    assert lr_tag(3e-5) == "lr3e-05"


def test_store_appends_once_per_key_in_key_order_and_reads_back(tmp_path):
    store = RunStore(tmp_path / "runs.jsonl")
    assert store.records() == [] and store.keys() == set()
    assert store.append("b/d16/lr0.01_s0", {"loss": 1.5, "curve": [1.0, None]})
    assert store.append("a/d16/lr0.01_s0", {"loss": 2.5})
    assert not store.append("b/d16/lr0.01_s0", {"loss": 9.0})  # the first result is kept
    assert store.records() == [
        ("a/d16/lr0.01_s0", {"loss": 2.5}),
        ("b/d16/lr0.01_s0", {"loss": 1.5, "curve": [1.0, None]}),
    ]
    lines = store.path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == {"key": "a/d16/lr0.01_s0",
                                                       "result": {"loss": 2.5}}  # fmt: skip
    # key order is path order: "pre-LN__GPT-2" sorts before "pre_ln" part by part
    store.add({"pre_ln/d1/x": {}, "pre-LN__GPT-2/d1/x": {}, "pre/d1/x": {}})
    assert [k for k, _ in store.records()][2:] == ["pre/d1/x", "pre-LN__GPT-2/d1/x", "pre_ln/d1/x"]
    with pytest.raises(ValueError, match="not JSON compliant"):  # NaN: nothing is written
        store.append("c", {"loss": float("nan")})
    assert "c" not in store and len(store) == 5 and not list(tmp_path.glob(".runs.jsonl.*"))


def test_store_rejects_a_line_that_is_not_a_run(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"key": "a", "result": {}}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"runs.jsonl:2: not a stored run"):
        RunStore(path).records()


def test_concurrent_appends_lose_no_run(tmp_path):
    store = RunStore(tmp_path / "runs.jsonl")

    def add(i: int) -> None:
        RunStore(store.path).append(f"run{i:02d}", {"i": i})

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["i"] for r in store.results()] == list(range(16))


def test_ingest_takes_every_result_json_not_stored_and_leaves_the_files(tmp_path):
    store = RunStore(tmp_path / "study" / "runs.jsonl")
    runs = store.runs_folder
    _write_result(runs / "m" / "d16" / "lr0.01_s0", {"loss": 1.0})
    _write_result(runs / "m" / "d16" / "lr0.003_s0", {"loss": 2.0})
    (runs / "m" / "d16" / "lr0.1_s0" / "h250").mkdir(parents=True)  # running: no result
    assert store.ingest() == ["m/d16/lr0.003_s0", "m/d16/lr0.01_s0"]
    assert store.ingest() == []  # nothing new
    assert (runs / "m" / "d16" / "lr0.01_s0" / "result.json").exists()
    # a result.json rewritten after it was stored does not replace the stored run
    (runs / "m" / "d16" / "lr0.01_s0" / "result.json").write_text('{"loss": 5.0}')
    _write_result(runs / "n" / "d64" / "lr0.01_s1", {"loss": 3.0})
    assert store.ingest() == ["n/d64/lr0.01_s1"]
    assert store.results() == [{"loss": 2.0}, {"loss": 1.0}, {"loss": 3.0}]
    assert store.key_of(runs / "n" / "d64" / "lr0.01_s1") == "n/d64/lr0.01_s1"
    with pytest.raises(ValueError, match="not inside"):
        store.key_of(tmp_path / "elsewhere")
    # results from another folder go in with keys relative to it
    other = RunStore(tmp_path / "other" / "runs.jsonl")
    assert other.ingest(runs / "n") == ["d64/lr0.01_s1"]


def _study(folder: Path, lrs: list[float], reported: list) -> Study:
    def plan(results: list[dict]) -> list[TrainingRun]:
        done = {r["lr"] for r in results}
        return [
            TrainingRun(MODEL, TRAIN.replace(lr=lr), (8, 12), str(folder / "runs" / "m" /
                        f"{lr_tag(lr)}_s0"), max_bytes=20_000, labels={"lr": lr})
            for lr in lrs
            if lr not in done
        ]  # fmt: skip

    return Study(folder, plan, reported.append, describe=lambda key, r: f"lr {r['lr']}")


@pytest.mark.filterwarnings("ignore")
def test_a_study_runs_stores_and_resumes_from_the_store_alone(tmp_path, capsys):
    pytest.importorskip("distributed")
    reported: list = []
    study = _study(tmp_path, [1e-2, 3e-3], reported)
    summary = run_study(study, workers=1, max_runs=1, progress=False)
    assert len(summary.results) == 1 and study.store.keys() == {"m/lr0.01_s0"}
    # --plan lists what is left, by key
    args = study_parser("x").parse_args(["--plan"])
    assert study_main(study, args) == 0
    assert capsys.readouterr().out.splitlines()[0] == "m/lr0.003_s0"
    args = study_parser("x").parse_args(["--workers", "1"])
    assert study_main(study, args) == 0
    stored = dict(study.store.records())
    assert set(stored) == {"m/lr0.01_s0", "m/lr0.003_s0"}
    assert reported[-1] == study.store.results()
    for key, result in stored.items():  # the store holds what run_training wrote
        assert json.loads((tmp_path / "runs" / key / "result.json").read_text()) == result
    # the scratch folders gone (a fresh clone): the store alone says nothing is left to run
    for key in stored:
        (tmp_path / "runs" / key / "result.json").unlink()
    assert study.pending() == []
    assert study_main(study, study_parser("x").parse_args(["--report"])) == 0
    assert len(reported) == 2 and not list(tmp_path.glob("runs/*/*/result.json"))
