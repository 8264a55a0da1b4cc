"""Every ```python block of the documentation (docs/**/*.md) runs as written.

Each block is self-contained and runs in a fresh interpreter (in a temporary directory, so it
writes nothing into the tree), within a minute of CPU time (``child_cpu``: not wall time, so
the bound holds on a busy machine).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from child_cpu import run_code

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
CPU_LIMIT_S = 60


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
    result, cpu = run_code(code, tmp_path, env)
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
    assert cpu < CPU_LIMIT_S, f"{where} took {cpu:.0f} s of CPU (limit {CPU_LIMIT_S} s)"
