"""Byte corpora: deterministic document split, single-file split, default stdlib corpus."""

from __future__ import annotations

import hashlib

import pytest
import torch

from shapedtx.training import export_corpus
from shapedtx.training.data import (
    WindowSampler,
    default_corpus_root,
    fixed_windows,
    load_corpus,
)


def _write(folder, names):
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"# document {name}\n" + "x = 1\n" * 20)


def _val_share(name: str) -> float:
    return int(hashlib.sha1(name.encode()).hexdigest()[:12], 16) / 16**12


def test_split_is_by_name_hash_and_independent_of_creation_order(tmp_path):
    names = [f"doc{i:02d}.txt" for i in range(40)]
    _write(tmp_path / "a", names)
    _write(tmp_path / "b", names[::-1])
    (tmp_path / "a" / "blob.bin").write_bytes(b"\0\1\2" * 50)  # binary: skipped
    first = load_corpus(tmp_path / "a", val_fraction=0.25, max_bytes=None)
    second = load_corpus(tmp_path / "b", val_fraction=0.25, max_bytes=None)
    assert torch.equal(first.train, second.train) and torch.equal(first.val, second.val)
    assert first.documents == 40
    val_text = bytes(first.val.numpy()).decode()
    expected = {n for n in names if _val_share(n) < 0.25}
    assert 0 < len(expected) < 40
    assert {n for n in names if f"# document {n}\n" in val_text} == expected
    train_text = bytes(first.train.numpy()).decode()
    assert not any(f"# document {n}\n" in train_text for n in expected)
    size = len("# document doc00.txt\n" + "x = 1\n" * 20)
    assert first.train.numel() + first.val.numel() == 40 * size


def test_single_file_keeps_its_tail_for_validation(tmp_path):
    path = tmp_path / "one.txt"
    path.write_bytes(bytes(range(32, 127)) * 10)
    corpus = load_corpus(path, val_fraction=0.1)
    assert corpus.val.numel() == 95
    assert bytes(corpus.train.numpy()) + bytes(corpus.val.numpy()) == path.read_bytes()


def test_default_corpus_is_the_python_stdlib_and_respects_max_bytes():
    corpus = load_corpus(max_bytes=100_000)
    assert corpus.source == f"python-stdlib:{default_corpus_root()}"
    assert corpus.train.numel() + corpus.val.numel() == 100_000
    assert corpus.val.numel() > 0 and corpus.train.numel() > corpus.val.numel()
    again = load_corpus(max_bytes=100_000)
    assert corpus.fingerprint() == again.fingerprint()
    assert b"def " in bytes(corpus.train.numpy())


def test_an_exported_corpus_loads_to_the_same_bytes_and_split(tmp_path):
    """export_corpus writes the documents the default corpus reads (the last one cut), so
    that another machine, whose Python has another standard library, trains on the same
    data: same fingerprint, same split, also at another val_fraction and at a smaller
    max_bytes; nothing is left beside the folder, and a folder that is not empty is
    refused."""
    dest = export_corpus(tmp_path / "corpus", max_bytes=100_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) == 100_000
    for fraction in (0.1, 0.3):
        here = load_corpus(max_bytes=100_000, val_fraction=fraction)
        there = load_corpus(dest, val_fraction=fraction)
        assert there.fingerprint() == here.fingerprint()
        assert there.val.numel() == here.val.numel() and there.documents == here.documents
    with pytest.raises(ValueError, match="dest must be a new or empty folder"):
        export_corpus(dest, max_bytes=100)
    # a larger export serves every smaller max_bytes: the same leading documents, cut alike
    smaller = load_corpus(dest, max_bytes=60_000)
    assert smaller.fingerprint() == load_corpus(max_bytes=60_000).fingerprint()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "/nonexistent/folder"}, "data path"),
        ({"path": ""}, "data path must be an existing file or folder, got ''"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"max_bytes": 3}, "max_bytes"),
        ({"suffix": 3}, "suffix must be a string"),
        ({"path": __file__, "suffix": ".py"}, "suffix selects files in a folder; the data path"),
    ],
)
def test_bad_corpus_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_corpus(**kwargs)


def test_a_folder_of_binary_files_is_refused_saying_so(tmp_path):
    (tmp_path / "random.dat").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"fewer than 16 bytes of text \(1 binary file"):
        load_corpus(tmp_path)


def test_batches_are_windows_of_the_data_and_reproducible():
    data = torch.arange(200, dtype=torch.int64).to(torch.uint8)
    batch = WindowSampler(data, 6, 10, seed=5)()
    assert batch.shape == (6, 11) and batch.dtype == torch.int64
    assert torch.equal(batch[:, 1:] - batch[:, :-1], torch.ones(6, 10, dtype=torch.int64))
    again = WindowSampler(data, 6, 10, seed=5)()
    assert torch.equal(batch, again)
    fixed = fixed_windows(data, 3, 10)
    assert fixed[0, 0] == 0 and fixed[-1, -1] == 199
    with pytest.raises(ValueError, match="seq_len"):
        fixed_windows(data, 3, 500)


def test_max_bytes_keeps_the_split_proportion(tmp_path):
    # the read order must not favour one side of the split (it uses an independent hash)
    names = [f"doc{i:03d}.txt" for i in range(200)]
    _write(tmp_path / "many", names)
    size = len("# document doc000.txt\n" + "x = 1\n" * 20)
    corpus = load_corpus(tmp_path / "many", val_fraction=0.1, max_bytes=50 * size)
    assert corpus.documents == 50
    share = corpus.val.numel() / (50 * size)
    assert 0.02 <= share <= 0.25, share  # binomial(50, 0.1) / 50: 0.1 +- 0.04


def test_sampled_windows_reach_every_start_and_stay_inside_the_data():
    """Starts are uniform on 0..N - m - 1: with N = m + 3 the four starts all occur, and no
    window runs past the last byte."""
    data = torch.arange(13, dtype=torch.uint8)
    batch = WindowSampler(data, 400, 10, seed=0)()
    starts = batch[:, 0]
    assert sorted(set(starts.tolist())) == [0, 1, 2]
    assert int(batch.max()) == 12
    counts = torch.bincount(starts, minlength=3).double()
    assert (counts - 400 / 3).abs().max() < 5 * (400 * (1 / 3) * (2 / 3)) ** 0.5


def _per_step_starts(high: int, batch: int, seed: int, steps: int) -> list[torch.Tensor]:
    """One ``torch.randint`` per step from a CPU generator: the order the sampler keeps."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, high, (batch,), generator=generator) for _ in range(steps)]


@pytest.mark.parametrize("chunk", [1, 3, 256])
def test_sampler_draws_in_chunks_the_order_of_one_draw_per_step(chunk):
    """Chunks change nothing: step k's starts are the k-th per-step draw (so runs trained
    before the sampler drew in chunks keep their batches)."""
    data = torch.arange(500, dtype=torch.int64).to(torch.uint8)
    sampler = WindowSampler(data, 4, 10, seed=9, chunk=chunk)
    expected = _per_step_starts(490, 4, 9, 8)
    for k in range(8):
        batch = sampler()
        starts = expected[k]
        assert torch.equal(batch, data[starts[:, None] + torch.arange(11)].long()), k


@pytest.mark.parametrize("steps", [0, 2, 3, 7])
def test_sampler_state_is_the_per_step_state_and_resumes_the_order(steps):
    """``state()`` after k batches is a per-step generator's state after k draws, wherever k
    falls in a chunk (of 3), and a sampler set to it continues with batch k + 1."""
    data = torch.arange(300, dtype=torch.int64).to(torch.uint8)
    sampler = WindowSampler(data, 5, 8, seed=2, chunk=3)
    for _ in range(steps):
        sampler()
    generator = torch.Generator().manual_seed(2)
    for _ in range(steps):
        torch.randint(0, 292, (5,), generator=generator)
    assert torch.equal(sampler.state(), generator.get_state())
    resumed = WindowSampler(data, 5, 8, seed=123, chunk=3)
    resumed.set_state(sampler.state())
    for k in range(5):
        assert torch.equal(resumed(), sampler()), k


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch"),
        ({"seq_len": 50}, r"seq_len must be an integer in \[1, 49\]"),
        ({"chunk": 0}, "chunk"),
    ],
)
def test_sampler_checks_its_arguments(kwargs, message):
    data = torch.zeros(50, dtype=torch.uint8)
    with pytest.raises(ValueError, match=message):
        WindowSampler(data, **{"batch": 2, "seq_len": 8, "seed": 0, **kwargs})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA sampler")
def test_cuda_sampler_draws_the_cpu_batches_without_host_sync():
    """Across chunk boundaries, under ``set_sync_debug_mode("error")``: the batches on CUDA
    are the CPU's, bit for bit."""
    data = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    cpu = WindowSampler(data, 4, 16, seed=1, chunk=3)
    cuda = WindowSampler(data.cuda(), 4, 16, seed=1, chunk=3)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = [cuda() for _ in range(7)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for k, batch in enumerate(batches):
        assert batch.is_cuda and torch.equal(batch.cpu(), cpu()), k


def test_fixed_windows_are_evenly_spaced():
    data = torch.arange(101, dtype=torch.uint8)  # windows of 11 bytes: starts 0 .. 90
    fixed = fixed_windows(data, 4, 10)
    assert fixed[:, 0].tolist() == [0, 30, 60, 90]
    assert fixed.dtype == torch.int64 and fixed.shape == (4, 11)
    assert fixed_windows(data, 1, 100)[0].tolist() == list(range(101))


def test_folder_corpus_skips_cache_and_git_folders(tmp_path):
    """``__pycache__`` and ``.git`` folders are not documents of a folder corpus."""
    _write(tmp_path / "src", ["keep.py"])
    (tmp_path / "src" / "pkg").mkdir()
    (tmp_path / "src" / "pkg" / "inner.py").write_text("# nested document\n" * 4)
    for hidden in ("__pycache__", ".git"):
        (tmp_path / "src" / hidden).mkdir()
        (tmp_path / "src" / hidden / "junk.py").write_text(f"# from {hidden}\n" * 4)
    corpus = load_corpus(tmp_path / "src", val_fraction=0.5, max_bytes=None)
    text = bytes(corpus.train.numpy()) + bytes(corpus.val.numpy())
    assert corpus.documents == 2
    assert b"# document keep.py\n" in text and b"# nested document\n" in text
    assert b"# from" not in text


def test_default_corpus_reads_only_py_files_outside_site_packages(tmp_path, monkeypatch):
    """``path=None``: the ``.py`` files under the stdlib root, ``site-packages`` excluded."""
    root = tmp_path / "stdlib"
    _write(root, ["a.py", "b.py", "notes.txt"])
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third.py").write_text("# third party\n" * 4)
    monkeypatch.setattr("shapedtx.training.data.default_corpus_root", lambda: root)
    corpus = load_corpus(val_fraction=0.5, max_bytes=None)
    text = bytes(corpus.train.numpy()) + bytes(corpus.val.numpy())
    assert corpus.documents == 2
    assert b"# document a.py\n" in text and b"# document b.py\n" in text
    assert b"notes.txt" not in text and b"third party" not in text
    txt = load_corpus(val_fraction=0.5, max_bytes=None, suffix=".txt")
    assert txt.documents == 1
