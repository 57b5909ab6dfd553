"""`python -m tfgc.server` / `tfgc-server`: the entry point of a real cluster's tasks.

Malformed configurations are refused (exit 2, one line, no traceback) before any
server starts; a real ps and worker serve on 127.0.0.1, run a tfgc op for a remote
session, and exit 0 on SIGTERM and SIGINT. The deployment guide's manifests parse.
"""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib

import pytest

from tfgc import server
from tfgc.cluster import isolation, processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = {"chief": ["10.0.0.1:2222"], "ps": ["10.0.0.2:2222"],
           "worker": ["10.0.0.3:2222", "worker-1.tfgc.default.svc:2222"]}


def _tf_config(cluster=None, task=("ps", 0), **extra):
    config = {"cluster": CLUSTER if cluster is None else cluster, **extra}
    if task is not None:
        config["task"] = {"type": task[0], "index": task[1]}
    return json.dumps(config)


# name -> (TF_CONFIG, a piece of the message that names what is wrong).
MALFORMED = {
    "unset": (None, "TF_CONFIG is not set"),
    "not_json": ('{"cluster": {ps: []}', "TF_CONFIG is not valid JSON"),
    "not_an_object": ("[1, 2]", "must be a JSON object"),
    "no_cluster": (json.dumps({"task": {"type": "ps", "index": 0}}), 'has no "cluster"'),
    "no_task": (json.dumps({"cluster": CLUSTER}), 'has no "task"'),
    "task_without_index": (json.dumps({"cluster": CLUSTER, "task": {"type": "ps"}}),
                           '"task" must be {"type": ..., "index": ...}'),
    "type_not_in_cluster": (_tf_config(task=("server", 0)),
                            "task type 'server' is not a job of the cluster"),
    "index_out_of_range": (_tf_config(task=("worker", 2)),
                           "task index 2 is out of range: job 'worker' has 2 task(s)"),
    "index_not_integer": (_tf_config(task=("worker", "1")), "index must be an integer"),
    "address_without_port": (_tf_config(cluster={**CLUSTER, "ps": ["10.0.0.2"]}),
                             "/job:ps/task:0 has address '10.0.0.2', which is not host:port"),
    "port_out_of_range": (_tf_config(cluster={**CLUSTER, "ps": ["10.0.0.2:70000"]}),
                          "port '70000' is not a number in 1..65535"),
    "address_with_scheme": (_tf_config(cluster={**CLUSTER, "ps": ["grpc://10.0.0.2:2222"]}),
                            "drop the scheme"),
    "wildcard_address": (_tf_config(cluster={**CLUSTER, "ps": ["0.0.0.0:2222"]}),
                         "not an address peers can dial"),
    "shared_address": (_tf_config(cluster={**CLUSTER, "ps": ["10.0.0.3:2222"]}),
                       "have the same address 10.0.0.3:2222"),
    "chief": (_tf_config(task=("chief", 0)), "the chief is the coordinator"),
    "evaluator": (_tf_config(task=("evaluator", 0)), "an evaluator runs an evaluation script"),
    "all_reduce_cluster": (_tf_config(cluster={"worker": ["a:1", "b:1"]}, task=("worker", 0)),
                           "the cluster has no ps job"),
    "other_rpc_layer": (_tf_config(rpc_layer="grpc+verbs"), "only \"grpc\" is supported"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_tf_config_is_refused_with_one_line(name, capsys, monkeypatch):
    text, expected = MALFORMED[name]
    # The server would start only past the checks: make sure no case gets there.
    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("serve() was reached"))
    environ = {} if text is None else {"TF_CONFIG": text}
    assert server.main([], environ=environ) == server.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("tfgc-server: refusing to start: "), err
    assert expected in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, expected", [
    (["--job", "ps", "--index", "0"], "--cluster-spec, --job and --index go together"),
    (["--cluster-spec", "{", "--job", "ps", "--index", "0"], "--cluster-spec is not valid JSON"),
    (["--cluster-spec", json.dumps(CLUSTER), "--job", "chief", "--index", "0"],
     "the chief is the coordinator"),
    (["--traffic-every", "0"], "--traffic-every must be a number of seconds > 0"),
])
def test_malformed_flags_are_refused(argv, expected, capsys):
    # Flags override TF_CONFIG: a valid one does not rescue bad flags.
    assert server.main(argv, environ={"TF_CONFIG": _tf_config()}) == server.EXIT_BAD_CONFIG
    assert expected in capsys.readouterr().err


def test_valid_configurations_are_accepted():
    assert server.parse_tf_config(_tf_config()) == (CLUSTER, "ps", 0)
    ipv6 = {**CLUSTER, "ps": ["[fd00::2]:2222"]}
    assert server.parse_tf_config(_tf_config(cluster=ipv6, rpc_layer="grpc"))[0] == ipv6
    # A task type is served only under the jobs it belongs to; the evaluator may be
    # absent from the cluster and still gets its own message (above).
    assert server.parse_flags(json.dumps(CLUSTER), "worker", 1) == (CLUSTER, "worker", 1)


@pytest.mark.slow
def test_command_refuses_with_exit_code_2_and_no_traceback():
    # The real entry point, as a process: a few cases at once (each pays for importing
    # TensorFlow, which `python -m tfgc.server` does before main() runs).
    cases = ["not_json", "chief"]
    procs = {}
    for name in cases:
        env = _env(TF_CONFIG=MALFORMED[name][0])
        procs[name] = subprocess.Popen([sys.executable, "-m", "tfgc.server"], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    try:
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 2, err
            assert "Traceback" not in err, err
            assert "refusing to start: " in err and MALFORMED[name][1] in err, err
    finally:
        for proc in procs.values():
            _stop(proc)


def test_exposure_warning_names_port_peers_and_fix(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "in_private_network", lambda: False)
    assert server._warn_if_exposed(CLUSTER, "ps", 0)
    err = capsys.readouterr().err
    assert "EVERY network interface" in err and "no authentication" in err
    assert "tcp dport 2222" in err and "10.0.0.1, 10.0.0.3" in err
    assert "private network" in err and "docs/deployment.md" in err
    monkeypatch.setattr(isolation, "in_private_network", lambda: True)
    assert not server._warn_if_exposed(CLUSTER, "ps", 0)


def test_console_script_is_declared():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    module, _, function = scripts["tfgc-server"].partition(":")
    assert (module, function) == ("tfgc.server", "main")


@pytest.mark.cluster
@pytest.mark.skipif(not isolation.in_private_network(),
                    reason="serves on 127.0.0.1 only inside a private network namespace: "
                           "run under `python -m tfgc.cluster.private` (as `make test` does)")
def test_real_servers_serve_a_session_and_exit_0_on_sigterm_and_sigint(tmp_path):
    import tensorflow as tf

    import tfgc_ops

    chief, ps, worker = processes.reserve_ports(3)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps}"],
               "worker": [f"127.0.0.1:{worker}"]}
    # The ps from TF_CONFIG, the worker from flags: both ways in, started together.
    logs = {"ps": tmp_path / "ps.log", "worker": tmp_path / "worker.log"}
    procs = {
        "ps": _start([], logs["ps"], TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "ps", "index": 0}})),
        "worker": _start(["--cluster-spec", json.dumps(cluster), "--job", "worker",
                          "--index", "0", "--traffic-every", "1"], logs["worker"]),
    }
    try:
        for job, port in (("ps", ps), ("worker", worker)):
            line = _wait_for_line(procs[job], logs[job], "serving", timeout_s=120)
            assert f"serving /job:{job}/task:0 at 127.0.0.1:{port}" in line, line
            assert "tfgc 0.1.0" in line and f"TensorFlow {tf.__version__}" in line, line
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
            # Inside a private namespace: no security banner.
            assert "SECURITY" not in logs[job].read_text()

        # A session whose master is the ps: the tfgc op runs on the ps (so its server
        # loaded tfgc's kernels), its result is used on the worker.
        with tf.Graph().as_default():
            with tf.device("/job:ps/task:0"):
                encoded = tfgc_ops.zero_run_encode(tf.constant([121] * 3, tf.uint8))
            with tf.device("/job:worker/task:0"):
                total = tf.reduce_sum(tf.cast(encoded, tf.int32)) + 1
            config = tf.compat.v1.ConfigProto(
                device_filters=["/job:ps/task:0", "/job:worker/task:0"],  # no chief
                operation_timeout_in_ms=30_000)
            with tf.compat.v1.Session(f"grpc://127.0.0.1:{ps}", config=config) as session:
                assert session.run(total) == 245
        # The worker logs what it exchanged with the ps (the master that called it).
        line = _wait_for_line(procs["worker"], logs["worker"], "ps:0 sent", timeout_s=30)
        assert "received" in line and "chief" not in line, line

        for job, sig in (("ps", signal.SIGTERM), ("worker", signal.SIGINT)):
            start = time.monotonic()
            procs[job].send_signal(sig)
            assert procs[job].wait(timeout=10) == 0, logs[job].read_text()[-3000:]
            assert time.monotonic() - start < 10
            log = logs[job].read_text()
            assert f"{sig.name} received; stopping /job:{job}/task:0" in log, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
    finally:
        for proc in procs.values():
            _stop(proc)


def test_deployment_manifests_parse_and_name_every_role():
    yaml = pytest.importorskip("yaml")
    manifests = sorted(glob.glob(os.path.join(REPO, "docs", "k8s", "*.yaml")))
    assert manifests, "no manifests under docs/k8s"
    kinds, roles = set(), set()
    for path in manifests:
        with open(path) as f:
            documents = [d for d in yaml.safe_load_all(f) if d is not None]
        assert documents, path
        for doc in documents:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), (path, doc)
            kinds.add(doc["kind"])
            labels = doc["metadata"].get("labels", {})
            if "tfgc/role" in labels:
                roles.add(labels["tfgc/role"])
    assert {"ps", "worker", "chief"} <= roles, roles
    assert {"Service", "StatefulSet", "Job", "NetworkPolicy"} <= kinds, kinds


@pytest.mark.parametrize("hostname, task", [("tfgc-worker-1", ("worker", 1)),
                                             ("tfgc-ps-0", ("ps", 0))])
def test_manifest_start_script_makes_a_tf_config_tfgc_server_accepts(hostname, task, tmp_path):
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO, "docs", "k8s", "cluster.yaml")) as f:
        config_map = next(d for d in yaml.safe_load_all(f) if d["kind"] == "ConfigMap")
    (tmp_path / "cluster.json").write_text(config_map["data"]["cluster.json"])
    script = config_map["data"]["tfgc-task.sh"].replace("/etc/tfgc", str(tmp_path))
    (tmp_path / "tfgc-task.sh").write_text(script)
    done = subprocess.run(["sh", str(tmp_path / "tfgc-task.sh"), task[0], "printenv",
                           "TF_CONFIG"], env=dict(os.environ, HOSTNAME=hostname),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    cluster, job, index = server.parse_tf_config(done.stdout)
    assert (job, index) == task and len(cluster["worker"]) == 2
    # The StatefulSets' replicas match the cluster's lists.
    for role in ("ps", "worker"):
        with open(os.path.join(REPO, "docs", "k8s", f"{role}.yaml")) as f:
            assert next(yaml.safe_load_all(f))["spec"]["replicas"] == len(cluster[role])


def _env(**extra):
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _start(args, log_path, **env):
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "tfgc.server", *args],
                                env=_env(**env), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_line(proc, log_path, needle, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if needle in line:
                return line
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {needle!r} line within {timeout_s} s:\n{log_path.read_text()[-3000:]}")


def _stop(proc):
    """Kills `proc` by pid if it still runs, and reaps it."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
