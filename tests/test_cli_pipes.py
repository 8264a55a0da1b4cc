"""The command line in pipelines and its start-up cost (issue 39)."""

from __future__ import annotations

import subprocess
import sys

from simulations.cli import BROKEN_PIPE

ENTRY = "import sys; from simulations.cli import main; sys.exit(main(sys.argv[1:]))"


def test_a_closed_pipe_exits_quietly():
    """`shapedtx design --table gpt3 | head -0`: no "Broken pipe" error, exit 128 + SIGPIPE
    (not 1, which advise uses for "no candidate passes")."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "design", "--table", "gpt3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE == 141
    assert err == ""
