"""The per-run ``result.json`` files a study tracked before its runs moved into ``runs.jsonl``
(read from git history, for the conversion tests), and the study scripts loaded by path."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]


def result_jsons_at(commit: str, folder: str, suffix: str = "/result.json") -> dict[str, Any]:
    """Path -> parsed ``result.json`` (any file whose path ends with ``suffix``) of every such
    file under ``folder`` (relative to the repository) at ``commit``; skips the test where the
    history is not here."""
    try:
        subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"],
                       cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the repository's history is not here (a shallow or exported copy)")
    tracked = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", commit, folder],
        capture_output=True, cwd=ROOT, check=True, text=True,
    ).stdout.split()  # fmt: skip
    tracked = [p for p in tracked if p.endswith(suffix)]
    query = "".join(f"{commit}:{p}\n" for p in tracked).encode()
    out = subprocess.run(["git", "cat-file", "--batch"], input=query, capture_output=True,
                         cwd=ROOT, check=True).stdout  # fmt: skip
    found, at = {}, 0
    for path in tracked:
        end = out.index(b"\n", at)
        size = int(out[at:end].split()[2])
        found[path] = json.loads(out[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
    return found


def load_script(path: Path, name: str, monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    """The study script at ``path`` as module ``name``, registered in ``sys.modules`` (its
    dataclasses look it up by name) until the test ends (studies share script names: study.py,
    report.py), or, with no ``monkeypatch`` (module-scoped fixtures), for the session."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is None:
        sys.modules[name] = module
    else:
        monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
