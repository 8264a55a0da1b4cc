"""Test modules that need an optional extra skip without it (issue 39): they must not error
at collection."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("module", "test_file"), [("griffe", "tests/test_api_docs.py")])
def test_module_skips_without_its_extra(module, test_file):
    """Run the file in a fresh interpreter where ``module`` cannot be imported."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; import pytest; "
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {test_file!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    # 5: nothing left to run once the module is skipped; a collection error would give 2
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped" in done.stdout and "error" not in done.stdout.lower()
