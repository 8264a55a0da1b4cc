"""Every ```python block of the documentation (docs/**/*.md) runs as written.

Each block is self-contained and runs in a fresh interpreter (in a temporary directory, so it
writes nothing into the tree), within a minute.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
TIMEOUT_S = 60


def snippets() -> list[tuple[str, str]]:
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        for number, match in enumerate(BLOCK.finditer(path.read_text()), start=1):
            found.append((f"{path.relative_to(ROOT)}#{number}", match.group(1)))
    return found


SNIPPETS = snippets()


def test_docs_have_snippets():
    assert len(SNIPPETS) >= 8


@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_snippet_runs(where: str, code: str, tmp_path: Path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "Agg"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
