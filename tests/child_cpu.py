"""Run a snippet in a fresh interpreter and measure its CPU time, not its wall time: a bound
on CPU time holds on a machine busy with other work (a study beside CI), where wall time
does not. Wall time only stops a hung child."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

HUNG_S = 900


def run_code(
    code: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """``python -c code`` in ``cwd``: its completed process and the CPU seconds (user +
    system, every thread) it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=HUNG_S,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, cpu
