"""The tutorial ports in examples/ run (short) as a user runs them, and change few lines."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")


def run(args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def tfgc_lines(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return [line for line in f if "# tfgc" in line]


@pytest.mark.slow
def test_distributed_keras_mirrored():
    out = run([os.path.join(EXAMPLES, "distributed_keras.py"), "--epochs", "1"])
    assert "Number of devices: 2" in out and "Eval accuracy" in out
    assert len(tfgc_lines("distributed_keras.py")) <= 5


@pytest.mark.cluster
@pytest.mark.slow
def test_multi_worker_with_keras():
    out = run(["-m", "tfgc.cluster", "--workers", "2", "--mwms", "--timeout", "240", "--",
               os.path.join(EXAMPLES, "multi_worker_with_keras.py"), "--epochs", "1",
               "--steps-per-epoch", "5"])
    lines = [line for line in out.splitlines() if line.startswith("worker ")]
    assert len(lines) == 2 and lines[0].split(":", 1)[1] == lines[1].split(":", 1)[1]
    assert len(tfgc_lines("multi_worker_with_keras.py")) <= 5


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_training():
    out = run([os.path.join(EXAMPLES, "parameter_server_training.py"), "--epochs", "1",
               "--steps-per-epoch", "10"])
    summary = next(line for line in out.splitlines() if line.startswith("final loss"))
    pushed, dense_push, pulled, dense_pull = (
        float(word) for word in summary.replace(",", " ").split() if word.replace(".", "").isdigit())
    assert 0 < pushed < dense_push / 5 and 0 < pulled < dense_pull
    # More than the all-reduce ports: the local cluster, compressed pulls, and building
    # the model and optimizer before fit (PerWorkerVariables cannot be made in a step).
    assert len(tfgc_lines("parameter_server_training.py")) <= 12
