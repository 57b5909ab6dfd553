import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def run_python(tmp_path):
    """Runs a Python script in a fresh process (for code that changes TF's global
    context, such as logical devices or a cluster connection); returns its stdout."""

    def run(source, timeout, args=()):
        script = tmp_path / "script.py"
        script.write_text(source)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                              timeout=timeout, env=env)
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout

    return run


REPORT_PREFIX = "REPORT "


@pytest.fixture
def run_report(run_python):
    """Runs a script in a fresh process and returns the JSON object of its last
    `REPORT {...}` line (the protocol of the cluster tests' coordinator scripts)."""

    def run(source, timeout, args=()):
        stdout = run_python(source, timeout, args)
        lines = [line for line in stdout.splitlines() if line.startswith(REPORT_PREFIX)]
        assert lines, f"the script printed no {REPORT_PREFIX!r} line:\n{stdout[-4000:]}"
        return json.loads(lines[-1][len(REPORT_PREFIX):])

    return run


def pytest_report_header(config):
    from tfgc.cluster import isolation

    if not isolation.in_private_network():
        return ("tfgc: the cluster tests' servers will listen in this machine's network "
                "namespace; `make test` runs the suite in a private one "
                "(python -m tfgc.cluster.private python -m pytest)")
    return None
