import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import subprocess
import sys

import numpy as np
import pytest

import cluster_scripts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session", autouse=True)
def scratch_temp_dir(tmp_path_factory):
    """Temporary files of the session (cluster log directories, TensorFlow's autograph
    sources), this process's and its children's, go under pytest's base temp directory,
    which pytest prunes (it keeps the last three runs), instead of piling up in /tmp."""
    import tempfile

    scratch = str(tmp_path_factory.mktemp("scratch"))
    previous_env, previous_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = scratch, scratch
    yield scratch
    tempfile.tempdir = previous_dir
    if previous_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous_env


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def run_python(tmp_path):
    """Runs a Python script in a fresh process (for code that changes TF's global
    context, such as logical devices or a cluster connection); returns its stdout."""

    def run(source, timeout, args=(), env=None):
        script = tmp_path / "script.py"
        script.write_text(source)
        # The repository root too: scripts may use the reference models (`models`).
        path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path, **(env or {}))
        done = subprocess.run([sys.executable, str(script), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env=env)
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout

    return run


@pytest.fixture
def run_report(run_python):
    """Runs a script in a fresh process and returns the JSON object of its last
    `REPORT {...}` line (see cluster_scripts)."""

    def run(source, timeout, args=(), env=None):
        return cluster_scripts.read_report(run_python(source, timeout, args, env))

    return run


def pytest_report_header(config):
    from tfgc.cluster import isolation

    if not isolation.in_private_network():
        return ("tfgc: the cluster tests' servers will listen in this machine's network "
                "namespace; `make test` runs the suite in a private one "
                "(python -m tfgc.cluster.private python -m pytest)")
    return None


# Their cluster tests make network namespaces and shaped links, and some time what runs
# on them: one at a time (on one pytest-xdist worker), beside the others.
_NAMESPACE_TEST_MODULES = {"test_cluster", "test_isolation", "test_link_delay", "test_mqgrad",
                           "test_mqgrad_experiment", "test_tf_config_end_to_end"}


# First: pytest-xdist's own hook of a worker reads the groups to name each test's
# work unit (`--dist loadgroup`), and would otherwise run before this one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs two workers), the cluster tests of
    `_NAMESPACE_TEST_MODULES` run one at a time, on one worker."""
    del config
    for item in items:
        if item.get_closest_marker("cluster") and item.module.__name__.split(".")[-1] \
                in _NAMESPACE_TEST_MODULES:
            item.add_marker(pytest.mark.xdist_group("network-namespaces"))


def pytest_runtest_setup(item):
    """Fails a test of an xdist_group that pytest-xdist did not name after its group
    under `--dist loadgroup` (pytest-xdist 3.8 cannot under pytest 9, which keeps node
    ids elsewhere): the scheduler would have spread the group over the workers."""
    if getattr(item.config.option, "loadgroup", False) and \
            item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(f"{item.nodeid} is in an xdist_group, but pytest-xdist did not group "
                    f"it: this pytest ({pytest.__version__}) and pytest-xdist do not work "
                    f"together; install the versions pyproject.toml's test extra names",
                    pytrace=False)
