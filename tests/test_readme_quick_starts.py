"""The README's quick starts run as they stand, each in a fresh process, and the
parameter-server one exits without a traceback."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _quick_starts():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _run(tmp_path, source):
    script = tmp_path / "quick_start.py"
    script.write_text(source)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_the_readme_has_two_quick_starts():
    blocks = _quick_starts()
    assert len(blocks) == 2
    assert "ParameterServerStrategy" in blocks[0] and "MirroredStrategy" in blocks[1]


def test_the_mirrored_quick_start_runs_as_it_stands(tmp_path):
    done = _run(tmp_path, _quick_starts()[1])
    assert "Epoch 2/2" in done.stdout and "push_bytes" in done.stdout, done.stdout[-2000:]


@pytest.mark.cluster
@pytest.mark.slow
def test_the_parameter_server_quick_start_exits_cleanly(tmp_path):
    done = _run(tmp_path, _quick_starts()[0])
    assert "Epoch 2/2" in done.stdout and "pull_bytes" in done.stdout, done.stdout[-2000:]
    # TensorFlow logs (C++) that functions could not be removed from the stopped
    # servers; tfgc adds no Python traceback to that.
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, (
        done.stderr[-4000:])
