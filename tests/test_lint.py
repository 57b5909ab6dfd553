"""The code passes ruff with the configuration in pyproject.toml ([tool.ruff])."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ["tfgc", "models", "benchmarks", "tests", "examples"]


def _ruff():
    """The ruff command: the one next to this Python, else on PATH, else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "ruff")
    if os.path.exists(beside):
        return [beside]
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    try:
        import ruff  # noqa: F401  (installed as a module only)
    except ImportError:
        return None
    return [sys.executable, "-m", "ruff"]


def test_ruff_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install 'tfgc[test]')")
    result = subprocess.run(ruff + ["check", "--no-cache", *CHECKED], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
