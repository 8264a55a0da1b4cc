"""Every ```python block of the documentation (docs/**/*.md) runs as written.

Each block is self-contained and runs in a fresh interpreter (in a temporary directory, so it
writes nothing into the tree), within a minute of CPU time: measured as the child's CPU time,
not wall time, so the bound holds on a machine busy with other work (a study beside CI).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
CPU_LIMIT_S = 60
WALL_LIMIT_S = 900
"""Only a hung block is stopped by wall time; the minute is asserted on CPU time."""


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
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WALL_LIMIT_S,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < CPU_LIMIT_S, f"{where} took {cpu:.0f} s of CPU (limit {CPU_LIMIT_S} s)"
