"""Atomic file output: the one helper every writer in the library uses; and the library's one
JSON convention for numbers that JSON cannot hold (:func:`json_number`).

A file is written to a temporary name in its own folder and renamed onto the target only when
complete, so an interrupted or failing write (Ctrl-C included) never leaves a half-written
file and never leaves the temporary behind. The file gets the mode that the process umask
gives a new file (0644 under umask 022), not the 0600 of ``tempfile.mkstemp``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on normal exit it replaces ``path``.

    The folder is created if needed. On any exception the temporary file is removed and
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(data: Any, path: str | os.PathLike, **dump_options: Any) -> Path:
    """Write ``data`` as JSON (``json.dump`` options, default ``indent=2``) atomically."""
    options = {"indent": 2, **dump_options}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, **options)
        f.write("\n")
    return Path(path)


def json_number(x: Any) -> Any:
    """The library's JSON convention: a non-finite float (NaN, +-inf) is written as ``None``
    (JSON ``null``; JSON has no infinities, and ``json.dump`` would write the non-standard
    ``Infinity``); anything else is returned unchanged. Readers take ``null`` as "no finite
    value" (:func:`read_json_number`)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def json_safe(data: Any) -> Any:
    """``data`` (dicts, lists and tuples of numbers, strings, ...) with every float passed
    through :func:`json_number`: ``json.dumps(json_safe(data), allow_nan=False)`` works."""
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return json_number(data)


def read_json_number(x: Any, missing: float = math.nan) -> float:
    """A number written by :func:`json_number`: ``null`` -> ``missing`` (default NaN); the
    strings ``"inf"``, ``"-inf"`` and ``"nan"`` that older ``shapedtx advise --json`` output
    held are read as those floats."""
    if x is None:
        return missing
    return float(x)
