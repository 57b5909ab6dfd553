"""mypy is clean on tfgc at the strictness pyproject.toml's [tool.mypy] states (and says
why): tfgc's annotations, the calls between its modules and the bodies of the functions
it annotates agree."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_nothing_in_tfgc(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "tfgc", "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
