"""Byte-level text corpora that need no download, and batches drawn from them.

A corpus is a sequence of documents (files) read as raw bytes (vocabulary 256, no tokenizer).
The split into training and validation is by document: a document goes to validation when
``sha1(relative path)``, read as a number in [0, 1), is below ``val_fraction``. So the split
depends only on the file names, never on the file-system order or on a random seed. A single
file (or a folder whose hash split leaves one side empty) is split by bytes instead: its last
``val_fraction`` of bytes are the validation set.

Default corpus: the ``.py`` sources of Python's own standard library
(``sysconfig.get_paths()["stdlib"]``, ``site-packages`` excluded), present on every machine
with Python. Files are read in the order of a second, independent hash of their relative path until
``max_bytes`` is reached: a deterministic, diverse subset whose split keeps the
``val_fraction`` proportion (in expectation over documents).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .._validation import ParameterError, check_int, check_number

VOCAB = 256


_DEFAULT_VAL_FRACTION = 0.1
""":func:`load_corpus`'s default share of documents (or bytes) held out for validation."""


@dataclass(frozen=True)
class ByteCorpus:
    """Training and validation bytes, ``train, val: (N,) uint8`` (CPU); ``val_fraction``:
    the fraction :func:`load_corpus` split them at (None: split otherwise, e.g. by hand)."""

    train: Tensor
    val: Tensor
    source: str
    documents: int
    val_fraction: float | None = None

    def fingerprint(self) -> str:
        """Short hash of the contents and of where the split falls (a checkpoint only resumes,
        and a study's runs only compare, on the same training and validation data).

        The sha1 of the training bytes, then the validation bytes, then (unless the corpus
        was loaded at the default ``val_fraction``, 0.1) the number of training bytes: two
        splits of the same bytes differ. At the default fraction the split is
        :func:`load_corpus`'s of these documents, and the hash is the bytes' alone, the
        value every run recorded before the split was hashed."""
        digest = hashlib.sha1()
        for part in (self.train, self.val):
            digest.update(part.numpy().tobytes())
        if self.val_fraction != _DEFAULT_VAL_FRACTION:
            digest.update(f"\0train_bytes={self.train.numel()}".encode())
        return digest.hexdigest()[:16]


def _hash_fraction(name: str, salt: str = "") -> float:
    return int(hashlib.sha1((salt + name).encode()).hexdigest()[:12], 16) / 16**12


def _read_order(name: str) -> float:
    # independent of the split hash, so that a max_bytes cap keeps the split proportions
    return _hash_fraction(name, salt="order:")


def default_corpus_root() -> Path:
    """Folder of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _documents(root: Path, suffix: str | None, exclude: tuple[str, ...]) -> list[Path]:
    files: list[Path] = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in exclude]
        files.extend(
            Path(folder, name) for name in names if suffix is None or name.endswith(suffix)
        )
    return [f for f in files if f.is_file()]


def load_corpus(
    path: str | os.PathLike | None = None,
    *,
    val_fraction: float = _DEFAULT_VAL_FRACTION,
    max_bytes: int | None = 8_000_000,
    suffix: str | None = None,
) -> ByteCorpus:
    """Read a text file, a folder of text files, or (``path=None``) the default corpus.

    Args:
        path: a file or a folder (searched recursively; files containing a NUL byte are
            skipped as binary). ``None``: the ``.py`` files of the standard library.
        val_fraction: share of documents (or of bytes, for a single file) held out, in (0, 1).
        max_bytes: read documents (in the order of a second hash of their relative path) until
            this many bytes, truncating the last one; ``None``: all.
        suffix: only files with this suffix (e.g. ``".py"``); default all (``.py`` for the
            default corpus). Not with a file ``path``.
    """
    check_number("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    texts, source = _read_documents(path, max_bytes, suffix)
    train = b"".join(d for name, d in texts if _hash_fraction(name) >= val_fraction)
    val = b"".join(d for name, d in texts if _hash_fraction(name) < val_fraction)
    if not train or not val:
        joined = b"".join(d for _, d in texts)
        cut = len(joined) - max(1, round(val_fraction * len(joined)))
        train, val = joined[:cut], joined[cut:]
    return ByteCorpus(_as_tensor(train), _as_tensor(val), source, len(texts), float(val_fraction))


def export_corpus(
    dest: str | os.PathLike,
    path: str | os.PathLike | None = None,
    *,
    max_bytes: int | None = 8_000_000,
    suffix: str | None = None,
) -> Path:
    """Write the documents :func:`load_corpus` reads (the last one cut as it cuts it) under
    ``dest``, each at its relative path, so that ``load_corpus(dest)`` gives the same bytes
    and split (the same ``fingerprint()``) on any machine: the default corpus is this
    Python's standard library, which differs from one Python version to the next. The files
    are written in a hidden sibling folder renamed to ``dest`` at the end, so an interrupted
    export leaves nothing.

    Args:
        dest: a folder that does not exist yet or is empty.
        path, max_bytes, suffix: as for :func:`load_corpus`.
    """
    out = Path(dest)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParameterError("dest", f"dest must be a new or empty folder, got {str(dest)!r}")
    texts, _ = _read_documents(path, max_bytes, suffix)
    # written beside dest and renamed at the end: an interrupted export leaves no half corpus
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        for name, data in texts:
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if out.exists():
            out.rmdir()
        partial.rename(out)
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return out


def _read_documents(
    path: str | os.PathLike | None, max_bytes: int | None, suffix: str | None
) -> tuple[list[tuple[str, bytes]], str]:
    """The (relative name, bytes) documents of a corpus in reading order, and its source."""
    if max_bytes is not None:
        check_int("max_bytes", max_bytes, 16)
    if suffix is not None and not isinstance(suffix, str):
        raise ParameterError(
            "suffix", f"suffix must be a string such as '.txt' or None, got {suffix!r}"
        )
    if path is None:
        root = default_corpus_root()
        files = _documents(root, suffix or ".py", ("site-packages", "__pycache__"))
        source = f"python-stdlib:{root}"
    else:
        if not str(path).strip():  # Path("") is the current folder
            raise ParameterError(
                "path", f"data path must be an existing file or folder, got {str(path)!r}"
            )
        root = Path(path)
        if root.is_file():
            if suffix is not None:
                raise ParameterError(
                    "suffix",
                    f"suffix selects files in a folder; the data path {str(path)!r} is a file "
                    "(leave suffix out)",
                )
            files, root = [root], root.parent
        elif root.is_dir():
            files = _documents(root, suffix, ("__pycache__", ".git"))
        else:
            raise ParameterError(
                "path", f"data path must be an existing file or folder, got {str(path)!r}"
            )
        source = str(Path(path))
    names = sorted((f.relative_to(root).as_posix() for f in files), key=_read_order)
    texts: list[tuple[str, bytes]] = []
    total = binary = 0
    for name in names:
        data = (root / name).read_bytes()
        if not data or b"\0" in data:
            binary += bool(data)
            continue
        if max_bytes is not None:
            data = data[: max_bytes - total]
        texts.append((name, data))
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    if total < 16:
        skipped = f" ({binary} binary file(s), with a NUL byte, skipped)" if binary else ""
        raise ParameterError(
            "path", f"data at {source!r} holds fewer than 16 bytes of text{skipped}"
        )
    return texts, source


def unigram_baseline(corpus: ByteCorpus) -> dict[str, float]:
    """The loss of a model that knows only byte frequencies, in nats per byte: the validation
    split's cross-entropy under the training split's frequencies (add-one smoothing), and the
    validation split's own entropy (the best any unigram model can do)."""
    train_counts = torch.bincount(corpus.train.long(), minlength=VOCAB).double() + 1.0
    val_counts = torch.bincount(corpus.val.long(), minlength=VOCAB).double()
    p_train = train_counts / train_counts.sum()
    p_val = val_counts / val_counts.sum()
    nz = p_val > 0
    return {
        "cross_entropy": float(-(p_val[nz] * p_train[nz].log()).sum()),
        "val_entropy": float(-(p_val[nz] * p_val[nz].log()).sum()),
    }


def _as_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class WindowSampler:
    """Random training windows of ``seq_len + 1`` bytes, drawn by a CPU generator whatever the
    data's device, so that one seed gives the same batches on every device.

    The starts of ``chunk`` steps are drawn at a time (in the order one draw per step would
    give) and copied to ``data.device`` once per chunk without blocking, so a step never waits
    for the host. ``state()`` is the generator state after the batches handed out so far
    (the state a per-step draw would have), for a checkpoint; ``set_state`` resumes from it.
    """

    def __init__(self, data: Tensor, batch: int, seq_len: int, seed: int, chunk: int = 256) -> None:
        check_int("batch", batch)
        check_int("seq_len", seq_len, maximum=data.numel() - 1)
        check_int("chunk", chunk)
        self.data, self.batch, self.seq_len, self.chunk = data, batch, seq_len, chunk
        self._high = data.numel() - seq_len
        self._generator = torch.Generator().manual_seed(seed)
        self._chunk_state = self._generator.get_state()
        self._starts: Tensor | None = None  # (chunk, batch) int64 on data.device
        self._used = 0

    def __call__(self) -> Tensor:
        """The next batch: (batch, seq_len + 1) int64 on ``data.device``."""
        if self._starts is None or self._used == self.chunk:
            self._chunk_state = self._generator.get_state()
            starts = self._draw(self._generator, self.chunk)
            if self.data.is_cuda:
                starts = starts.pin_memory()
            self._starts = starts.to(self.data.device, non_blocking=True)
            self._used = 0
        starts = self._starts[self._used]
        self._used += 1
        return windows(self.data, starts, self.seq_len)

    def state(self) -> Tensor:
        """The CPU generator state after the batches handed out so far (a uint8 tensor)."""
        if self._starts is None:
            return self._generator.get_state()
        replay = torch.Generator()
        replay.set_state(self._chunk_state)
        self._draw(replay, self._used)
        return replay.get_state()

    def set_state(self, state: Tensor) -> None:
        """Continue after the batches whose generator state is ``state`` (from ``state()``)."""
        self._generator.set_state(state)
        self._starts, self._used = None, 0

    def _draw(self, generator: torch.Generator, steps: int) -> Tensor:
        return torch.randint(0, self._high, (steps, self.batch), generator=generator)


def windows(data: Tensor, starts: Tensor, seq_len: int) -> Tensor:
    """``data[s : s + seq_len + 1]`` for every start: starts (B,) -> (B, seq_len + 1) int64."""
    index = starts[:, None] + torch.arange(seq_len + 1, device=data.device)
    return data[index].long()


def fixed_windows(data: Tensor, count: int, seq_len: int) -> Tensor:
    """``count`` evenly spaced windows (deterministic evaluation set): (count, seq_len + 1)."""
    if data.numel() < seq_len + 1:
        raise ParameterError(
            "seq_len",
            f"seq_len must be < the size of the data split ({data.numel()} bytes), got {seq_len}",
        )
    starts = torch.linspace(0, data.numel() - seq_len - 1, count, device=data.device)
    return windows(data, starts.long(), seq_len)
