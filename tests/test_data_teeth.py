"""``shapedtx.training.data``: the corpus split, reading order, cap, fallback byte split,
refusals, export and fingerprint, against an independent restatement of the module
docstring on hand-built folders (issue 66)."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

import shapedtx.training.data as data_module
from shapedtx import ParameterError
from shapedtx.training import export_corpus, load_corpus, unigram_baseline
from shapedtx.training.data import ByteCorpus


def _fraction(name: str, salt: str = "") -> float:
    """docs: sha1 of the relative path (first 12 hex digits) read as a number in [0, 1)."""
    return int(hashlib.sha1((salt + name).encode()).hexdigest()[:12], 16) / 16**12


def _folder(tmp_path, n=12, size=lambda i: 20 + 7 * i):
    files = {}
    for i in range(n):
        name = f"d{i // 4}/f{i}.txt"
        text = (f"<{name}>".encode() + bytes([97 + (i * 5 + j) % 26 for j in range(size(i))]))[
            : size(i)
        ]
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text)
        files[name] = text
    return files


def _expected(files, val_fraction, max_bytes=None):
    """The documented corpus: documents in the order of the salted hash, capped at
    max_bytes (the last one cut), split by the unsalted hash."""
    order = sorted(files, key=lambda n: _fraction(n, "order:"))
    docs, total = [], 0
    for name in order:
        text = files[name] if max_bytes is None else files[name][: max_bytes - total]
        docs.append((name, text))
        total += len(text)
        if max_bytes is not None and total >= max_bytes:
            break
    train = b"".join(t for n, t in docs if _fraction(n) >= val_fraction)
    val = b"".join(t for n, t in docs if _fraction(n) < val_fraction)
    if not train or not val:  # one side empty: the last bytes held out
        joined = b"".join(t for _, t in docs)
        cut = len(joined) - max(1, round(val_fraction * len(joined)))
        train, val = joined[:cut], joined[cut:]
    return train, val, len(docs)


@pytest.mark.parametrize("max_bytes", [None, 16, 100, 101, 155])
def test_split_order_and_cap_are_the_documented_ones(tmp_path, max_bytes):
    files = _folder(tmp_path)
    vf = sorted(_fraction(n) for n in files)[5] + 1e-9  # six documents below, held out
    train, val, docs = _expected(files, vf, max_bytes)
    corpus = load_corpus(tmp_path, val_fraction=vf, max_bytes=max_bytes)
    assert bytes(corpus.train.numpy()) == train and bytes(corpus.val.numpy()) == val
    assert corpus.documents == docs and corpus.source == str(tmp_path)
    assert corpus.train.dtype == torch.uint8 and corpus.val.dtype == torch.uint8
    if max_bytes is not None:
        assert corpus.train.numel() + corpus.val.numel() == max_bytes


def test_a_document_whose_hash_equals_val_fraction_is_trained_on(tmp_path):
    """``below val_fraction`` goes to validation: a hash equal to it does not."""
    files = _folder(tmp_path)
    name = sorted(files, key=_fraction)[3]
    corpus = load_corpus(tmp_path, val_fraction=_fraction(name), max_bytes=None)
    train, val, _ = _expected(files, _fraction(name))
    assert bytes(corpus.train.numpy()) == train and bytes(corpus.val.numpy()) == val
    assert files[name] in train and files[name] not in val


@pytest.mark.parametrize(
    ("size", "vf", "held"), [(100, 0.1, 10), (100, 0.004, 1), (100, 0.5, 50), (41, 0.1, 4)]
)
def test_a_single_file_keeps_its_last_bytes_for_validation(tmp_path, size, vf, held):
    """A single file: its last ``round(val_fraction * size)`` bytes, at least one."""
    text = bytes(range(65, 65 + 26)) * 4
    (tmp_path / "one.txt").write_bytes(text[:size])
    corpus = load_corpus(tmp_path / "one.txt", val_fraction=vf, max_bytes=None)
    assert bytes(corpus.val.numpy()) == text[size - held : size]
    assert bytes(corpus.train.numpy()) == text[: size - held]
    assert corpus.documents == 1


def test_a_folder_whose_split_leaves_one_side_empty_is_split_by_bytes(tmp_path):
    files = _folder(tmp_path, n=3)
    order = sorted(files, key=lambda n: _fraction(n, "order:"))
    joined = b"".join(files[n] for n in order)
    low = min(_fraction(n) for n in files)  # every hash >= low: nothing held out
    corpus = load_corpus(tmp_path, val_fraction=low * 0.5, max_bytes=None)
    held = max(1, round(low * 0.5 * len(joined)))
    assert bytes(corpus.val.numpy()) == joined[len(joined) - held :]
    assert bytes(corpus.train.numpy()) == joined[: len(joined) - held]
    high = max(_fraction(n) for n in files) + 1e-9  # every document held out
    corpus = load_corpus(tmp_path, val_fraction=high, max_bytes=None)
    held = round(high * len(joined))
    assert bytes(corpus.val.numpy()) == joined[len(joined) - held :]


def test_binary_and_empty_files_are_skipped_and_sixteen_bytes_are_enough(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 16)
    (tmp_path / "b.bin").write_bytes(b"ab\0cd" * 10)
    (tmp_path / "c.txt").write_bytes(b"")
    corpus = load_corpus(tmp_path, max_bytes=16)
    assert corpus.documents == 1 and corpus.train.numel() + corpus.val.numel() == 16
    (tmp_path / "a.txt").write_bytes(b"x" * 15)
    with pytest.raises(ParameterError, match=r"fewer than 16 bytes of text \(1 binary") as err:
        load_corpus(tmp_path)
    assert err.value.parameter == "path"
    (tmp_path / "b.bin").unlink()
    with pytest.raises(ParameterError) as err:
        load_corpus(tmp_path)
    assert "skipped" not in str(err.value)


def test_max_bytes_and_val_fraction_bounds(tmp_path):
    _folder(tmp_path)
    assert load_corpus(tmp_path, max_bytes=16).train.numel() > 0
    for bad in (15, 0, -1):
        with pytest.raises(ParameterError) as err:
            load_corpus(tmp_path, max_bytes=bad)
        assert err.value.parameter == "max_bytes"
    for vf in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ParameterError) as err:
            load_corpus(tmp_path, val_fraction=vf)
        assert err.value.parameter == "val_fraction"
    whole = load_corpus(tmp_path, max_bytes=None)
    assert whole.train.numel() + whole.val.numel() == sum(20 + 7 * i for i in range(12))


def test_suffix_selects_files_in_a_folder_only(tmp_path):
    files = _folder(tmp_path, n=6)
    (tmp_path / "d0" / "extra.md").write_bytes(b"markdown text here, long enough")
    only = load_corpus(tmp_path, suffix=".txt", max_bytes=None)
    assert only.documents == 6
    assert load_corpus(tmp_path, max_bytes=None).documents == 7
    with pytest.raises(ParameterError) as err:
        load_corpus(tmp_path / next(iter(files)), suffix=".txt")
    assert err.value.parameter == "suffix"
    with pytest.raises(ParameterError) as err:
        load_corpus(tmp_path, suffix=3)  # type: ignore[arg-type]
    assert err.value.parameter == "suffix"
    for path in ("", "  ", str(tmp_path / "absent")):
        with pytest.raises(ParameterError) as err:
            load_corpus(path)
        assert err.value.parameter == "path"


def test_default_corpus_reads_py_files_and_names_its_root(tmp_path, monkeypatch):
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "pkg").mkdir()
    for where in ("site-packages", "__pycache__", "pkg", "."):
        (tmp_path / where / "m.py").write_bytes(f"# {where} module text\n".encode() * 3)
        (tmp_path / where / "n.txt").write_bytes(b"not python source text at all")
    monkeypatch.setattr(data_module, "default_corpus_root", lambda: tmp_path)
    corpus = load_corpus(max_bytes=None)
    assert corpus.source == f"python-stdlib:{tmp_path}" and corpus.documents == 2
    assert load_corpus(max_bytes=None, suffix=".txt").documents == 2


def test_fingerprint_is_the_sha1_of_train_then_val_then_the_split():
    """Hand-built (no val_fraction) or loaded at another fraction than the default: the sha1
    of train, val and the number of training bytes; at the default fraction of 0.1, of the
    bytes alone (the value recorded before the split was hashed)."""
    train, val = torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([4, 5], dtype=torch.uint8)
    by_hand = ByteCorpus(train, val, "s", 1)
    assert by_hand.val_fraction is None
    split = b"\0train_bytes=3"
    assert by_hand.fingerprint() == hashlib.sha1(bytes([1, 2, 3, 4, 5]) + split).hexdigest()[:16]
    swapped = ByteCorpus(val, train, "s", 1)
    assert swapped.fingerprint() == hashlib.sha1(bytes([4, 5, 1, 2, 3]) + b"\0train_bytes=2"
                                                 ).hexdigest()[:16]  # fmt: skip
    moved = ByteCorpus(train[:2], torch.cat([train[2:], val]), "s", 1)
    assert moved.fingerprint() != by_hand.fingerprint()
    default = ByteCorpus(train, val, "s", 1, 0.1)
    assert default.fingerprint() == hashlib.sha1(bytes([1, 2, 3, 4, 5])).hexdigest()[:16]
    other = ByteCorpus(train, val, "s", 1, 0.2)
    assert other.fingerprint() == by_hand.fingerprint()
    assert len(by_hand.fingerprint()) == len(default.fingerprint()) == 16


def test_fingerprint_tells_two_splits_of_the_same_bytes_apart(tmp_path):
    """A single file at two fractions (the same bytes, the byte split moved) and a folder at
    two fractions whose document split moves: other fingerprints; the same load twice, and
    a file at the default fraction: the same (the default keeps the bytes-only hash)."""
    (tmp_path / "one.txt").write_bytes(bytes(range(65, 91)) * 4)
    a = load_corpus(tmp_path / "one.txt", val_fraction=0.1)
    b = load_corpus(tmp_path / "one.txt", val_fraction=0.2)
    c = load_corpus(tmp_path / "one.txt", val_fraction=0.3)
    assert not torch.equal(a.train, b.train) and (a.val_fraction, b.val_fraction) == (0.1, 0.2)
    assert len({a.fingerprint(), b.fingerprint(), c.fingerprint()}) == 3
    assert b.fingerprint() == load_corpus(tmp_path / "one.txt", val_fraction=0.2).fingerprint()
    whole = bytes(range(65, 91)) * 4
    assert a.fingerprint() == hashlib.sha1(whole).hexdigest()[:16]
    files = _folder(tmp_path / "f")
    fractions = sorted(_fraction(n) for n in files)
    low, high = (fractions[1] + fractions[2]) / 2, (fractions[2] + fractions[3]) / 2
    x, y = (
        load_corpus(tmp_path / "f", val_fraction=low),
        load_corpus(tmp_path / "f", val_fraction=high),
    )
    assert x.val.numel() < y.val.numel() and x.fingerprint() != y.fingerprint()


@pytest.mark.parametrize("max_bytes", [None, 101])
def test_export_writes_each_read_document_at_its_path_cut_as_read(tmp_path, max_bytes):
    files = _folder(tmp_path / "src")
    (tmp_path / "src" / "bin.dat").write_bytes(b"a\0b" * 10)
    dest = tmp_path / "out"
    assert export_corpus(dest, tmp_path / "src", max_bytes=max_bytes) == dest
    order = sorted(files, key=lambda n: _fraction(n, "order:"))
    total, written = 0, {}
    for name in order:
        text = files[name] if max_bytes is None else files[name][: max_bytes - total]
        written[name] = text
        total += len(text)
        if max_bytes is not None and total >= max_bytes:
            break
    found = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert found == written
    a = load_corpus(tmp_path / "src", max_bytes=max_bytes)
    b = load_corpus(dest, max_bytes=None)
    assert a.fingerprint() == b.fingerprint() and a.documents == b.documents
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_export_takes_a_new_or_empty_folder_only(tmp_path):
    _folder(tmp_path / "src", n=4)
    (tmp_path / "empty").mkdir()
    export_corpus(tmp_path / "empty", tmp_path / "src")
    assert len(list((tmp_path / "empty").rglob("*.txt"))) == 4
    for dest in (tmp_path / "empty", tmp_path / "src" / "d0" / "f0.txt"):
        with pytest.raises(ParameterError) as err:
            export_corpus(dest, tmp_path / "src")
        assert err.value.parameter == "dest"
    with pytest.raises(ParameterError):
        export_corpus(tmp_path / "new", tmp_path / "absent")
    assert not (tmp_path / "new").exists()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_export_interrupted_leaves_nothing(tmp_path, monkeypatch):
    _folder(tmp_path / "src", n=4)
    calls = []
    real = type(tmp_path).write_bytes

    def failing(self, content):
        calls.append(self)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, content)

    monkeypatch.setattr(type(tmp_path), "write_bytes", failing)
    with pytest.raises(KeyboardInterrupt):
        export_corpus(tmp_path / "out", tmp_path / "src")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_unigram_baseline_by_hand():
    train = torch.tensor([0, 0, 1], dtype=torch.uint8)
    val = torch.tensor([0, 1, 1, 2], dtype=torch.uint8)
    out = unigram_baseline(ByteCorpus(train, val, "s", 1))
    total = 3 + 256  # add-one smoothing
    p = {0: 3 / total, 1: 2 / total, 2: 1 / total}
    q = {0: 0.25, 1: 0.5, 2: 0.25}
    cross = -sum(q[b] * math.log(p[b]) for b in q)
    own = -sum(q[b] * math.log(q[b]) for b in q)
    assert out == pytest.approx({"cross_entropy": cross, "val_entropy": own}, rel=1e-12)


def test_defaults_hold_out_a_tenth_of_eight_million_bytes(tmp_path):
    """The documented defaults: ``max_bytes=8_000_000`` (load and export) and
    ``val_fraction=0.1`` (a single file: its last 800,000 bytes)."""
    text = bytes(range(97, 123)) * (8_000_010 // 26 + 1)
    (tmp_path / "big.txt").write_bytes(text[:8_000_010])
    corpus = load_corpus(tmp_path / "big.txt")
    assert corpus.val.numel() == 800_000 and corpus.train.numel() == 7_200_000
    assert bytes(corpus.val[-3:].numpy()) == text[7_999_997:8_000_000]
    export_corpus(tmp_path / "out", tmp_path / "big.txt")
    assert (tmp_path / "out" / "big.txt").stat().st_size == 8_000_000
