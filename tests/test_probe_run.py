"""shapedtx.training.probing.probe_run: the library call behind ``shapedtx probe RUN``; its
errors name their parameter (folder, windows, the data setting that differs)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from shapedtx import ParameterError
from shapedtx.training import DataMismatch, probe_run
from shapedtx.training.probing import run_data_settings
from simulations.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe_run")
    text = tmp / "text.txt"
    text.write_text("hello shaped world, hello collapse. " * 40)
    folder = tmp / "run"
    argv = [
        "train", "--width", "16", "--depth", "2", "--heads", "2", "--steps", "1",
        "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "0", "--log-interval", "1",
        "--eval-interval", "1", "--eval-batches", "1", "--metrics-batch", "3", "--no-progress",
        "--threads", "1", "--data", str(text), "--out", str(folder), "--max-bytes", "1200",
    ]  # fmt: skip
    assert main(argv) == 0
    return folder, text


def test_probe_run_reads_the_runs_data_and_windows(run):
    folder, text = run
    ds = probe_run(folder)
    assert ds.sizes["sample"] == 3 and ds.attrs["step"] == 1 and ds.attrs["run"] == str(folder)
    assert ds.sizes["t"] == 3  # the input and after each of the 2 blocks
    same = probe_run(folder, path=str(text), max_bytes=1200)  # the run's own data, given
    np.testing.assert_array_equal(same["V"].values, ds["V"].values)
    assert probe_run(folder, windows=2).sizes["sample"] == 2


def test_probe_run_uses_the_logs_size_without_data_json(run):
    from shapedtx.results import load_dataset

    folder, text = run
    settings = run_data_settings(folder, load_dataset(folder / "log.nc"))
    assert settings == {"path": str(text), "suffix": None, "max_bytes": 1200, "val_fraction": 0.1}
    assert run_data_settings(folder / "nowhere", load_dataset(folder / "log.nc"))["path"] == str(
        text
    )


@pytest.mark.parametrize(
    ("kwargs", "parameter", "needle"),
    [
        ({"windows": 0}, "windows", "windows must be an integer >= 1, got 0"),
        ({"max_bytes": 600}, "max_bytes", "in max_bytes (or suffix): 600 bytes read"),
        ({"val_fraction": 0.5}, "val_fraction", "in val_fraction: 600 validation bytes of 1200"),
    ],
)
def test_probe_run_errors_name_their_parameter(run, kwargs, parameter, needle):
    with pytest.raises(ParameterError) as err:
        probe_run(run[0], **kwargs)
    assert err.value.parameter == parameter and needle in str(err.value), str(err.value)


def test_data_of_another_source_is_a_mismatch_in_path(run, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("another text, another corpus. " * 40)
    with pytest.raises(DataMismatch) as err:
        probe_run(run[0], path=str(other))
    assert err.value.parameter == "path" and str(other) in str(err.value)
    assert err.value.describe({"path": "--data"}).startswith(
        "the data differs from the run's in --data"
    )
    again = pickle.loads(pickle.dumps(err.value))  # crosses process boundaries intact
    assert (type(again), again.parameter, str(again)) == (DataMismatch, "path", str(err.value))


def test_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(ParameterError, match="not found") as err:
        probe_run(tmp_path)
    assert err.value.parameter == "folder"
    with pytest.raises(TypeError, match="unexpected"):
        probe_run(tmp_path, data="x")
