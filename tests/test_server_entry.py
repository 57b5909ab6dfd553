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


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """main() takes the stop signals for its process: give them back to pytest."""
    saved = {signum: signal.getsignal(signum) for signum in server.STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _with_address(address, job="ps"):
    return _tf_config(cluster={**CLUSTER, job: [address]}, task=(job, 0))


def _nested(depth, opener="[", closer="]", inner="1"):
    return opener * depth + inner + closer * depth


def malformed_tf_configs():
    """{name: TF_CONFIG text (None: unset)}: every way a TF_CONFIG can be wrong that
    tfgc-server must refuse with exit code 2 and one line."""
    cases = {
        "unset": None, "empty": "", "blank": "   ", "newline": "\n",
        "not_json": "not json", "unclosed_object": '{"cluster": {ps: []}',
        "single_quotes": "{'cluster': {}, 'task': {}}", "trailing_comma": '{"cluster": {},}',
        "only_bracket": "[", "bom_and_garbage": "\ufeff{", "number_then_garbage": "1 2",
        "array": "[1, 2]", "number": "1", "string": '"ps"', "null": "null", "true": "true",
        "nan": "NaN",
        "nested_arrays_1000": _nested(1000), "nested_arrays_10000": _nested(10000),
        "nested_objects_10000": _nested(10000, '{"a": ', "}"),
        "nested_inside_cluster_5000": json.dumps({"task": {"type": "ps", "index": 0}})[:-1]
        + ', "cluster": {"ps": ' + _nested(5000) + "}}",
        "index_of_5000_digits": '{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", '
                                '"index": 1' + "0" * 5000 + "}}",
        "no_cluster": json.dumps({"task": {"type": "ps", "index": 0}}),
        "no_task": json.dumps({"cluster": CLUSTER}),
        "task_empty": json.dumps({"cluster": CLUSTER, "task": {}}),
        "task_without_type": json.dumps({"cluster": CLUSTER, "task": {"index": 0}}),
        "task_without_index": json.dumps({"cluster": CLUSTER, "task": {"type": "ps"}}),
        "task_is_a_list": json.dumps({"cluster": CLUSTER, "task": ["ps", 0]}),
        "task_is_a_string": json.dumps({"cluster": CLUSTER, "task": "ps:0"}),
        "cluster_is_a_list": _tf_config(cluster=[["a:1"]]),
        "cluster_is_a_string": _tf_config(cluster="a:1"),
        "cluster_is_null": json.dumps({"cluster": None, "task": {"type": "ps", "index": 0}}),
        "cluster_is_empty": _tf_config(cluster={}),
        "job_is_a_string": _tf_config(cluster={**CLUSTER, "ps": "10.0.0.2:2222"}),
        "job_is_empty": _tf_config(cluster={**CLUSTER, "ps": []}),
        "job_is_an_object": _tf_config(cluster={**CLUSTER, "ps": {"0": "10.0.0.2:2222"}}),
        "address_is_a_number": _with_address(2222),
        "address_is_null": _with_address(None),
        "address_is_a_list": _with_address(["10.0.0.2", 2222]),
        "type_is_a_number": _tf_config(task=(0, 0)),
        "type_is_null": _tf_config(task=(None, 0)),
        "type_is_empty": _tf_config(task=("", 0)),
        "type_is_a_list": _tf_config(task=(["ps"], 0)),
        "type_not_in_cluster": _tf_config(task=("server", 0)),
        "type_in_capitals": _tf_config(task=("PS", 0)),
        "type_with_a_space": _tf_config(task=("ps ", 0)),
        "type_with_a_newline": _tf_config(task=("ps\n", 0)),
        "chief": _tf_config(task=("chief", 0)),
        "evaluator": _tf_config(task=("evaluator", 0)),
        "index_is_a_string": _tf_config(task=("worker", "1")),
        "index_is_a_float": _tf_config(task=("ps", 0.0)),
        "index_is_a_bool": _tf_config(task=("ps", True)),
        "index_is_null": _tf_config(task=("ps", None)),
        "index_is_a_list": _tf_config(task=("ps", [0])),
        "index_is_negative": _tf_config(task=("ps", -1)),
        "index_out_of_range": _tf_config(task=("worker", 2)),
        "index_huge": _tf_config(task=("ps", 10 ** 20)),
        "index_infinite": '{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1e400}}',
        "port_zero": _with_address("10.0.0.2:0"),
        "port_negative": _with_address("10.0.0.2:-1"),
        "port_65536": _with_address("10.0.0.2:65536"),
        "port_70000": _with_address("10.0.0.2:70000"),
        "port_huge": _with_address("10.0.0.2:99999999999999999999"),
        "port_of_5000_digits": _with_address("10.0.0.2:" + "9" * 5000),
        "port_empty": _with_address("10.0.0.2:"),
        "port_superscript_digits": _with_address("10.0.0.2:\u00b2\u00b222"),
        "port_full_width_digits": _with_address("10.0.0.2:\uff12\uff12\uff12\uff12"),
        "port_arabic_indic_digits": _with_address("10.0.0.2:\u0662\u0662\u0662\u0662"),
        "port_with_a_space_inside": _with_address("10.0.0.2:22 22"),
        "port_with_a_leading_space": _with_address("10.0.0.2: 2222"),
        "port_with_a_trailing_newline": _with_address("10.0.0.2:2222\n"),
        "port_with_a_sign": _with_address("10.0.0.2:+2222"),
        "port_in_hex": _with_address("10.0.0.2:0x8ae"),
        "port_with_a_fraction": _with_address("10.0.0.2:22.5"),
        "host_with_a_trailing_newline": _with_address("localhost\n:2222"),
        "host_with_a_space": _with_address("local host:2222"),
        "host_with_a_tab": _with_address("\tlocalhost:2222"),
        "host_with_a_nul": _with_address("local\x00host:2222"),
        "host_with_an_escape": _with_address("local\x1bhost:2222"),
        "host_not_ascii": _with_address("w\u00f6rker.local:2222"),
        "host_leading_hyphen": _with_address("-ps:2222"),
        "host_trailing_hyphen": _with_address("ps-:2222"),
        "host_empty_label": _with_address("a..b:2222"),
        "host_too_long": _with_address("a" * 300 + ":2222"),
        "host_with_a_slash": _with_address("ps/0:2222"),
        "no_host": _with_address(":2222"),
        "no_port": _with_address("10.0.0.2"),
        "wildcard_address": _with_address("0.0.0.0:2222"),
        "ipv6_wildcard_address": _with_address("[::]:2222"),
        "ipv6_without_brackets": _with_address("::1:2222"),
        "ipv6_unclosed_bracket": _with_address("[::1:2222"),
        "ipv6_zone_with_a_space": _with_address("[fe80::1%eth 0]:2222"),
        "address_with_scheme": _with_address("grpc://10.0.0.2:2222"),
        "shared_address": _with_address("10.0.0.3:2222"),
        "job_name_with_a_space_and_bang": _tf_config(cluster={**CLUSTER, "bad job!": ["h:1"]}),
        "job_name_not_ascii": _tf_config(cluster={**CLUSTER, "w\u00f6rker": ["h:1"]}),
        "job_name_starting_with_a_digit": _tf_config(cluster={**CLUSTER, "1ps": ["h:1"]}),
        "job_name_starting_with_underscore": _tf_config(cluster={**CLUSTER, "_ps": ["h:1"]}),
        "job_name_with_a_hyphen": _tf_config(cluster={**CLUSTER, "work-er": ["h:1"]}),
        "job_name_empty": _tf_config(cluster={**CLUSTER, "": ["h:1"]}),
        "job_name_with_a_newline": _tf_config(cluster={**CLUSTER, "ps\nx": ["h:1"]}),
        "all_reduce_cluster": _tf_config(cluster={"worker": ["a:1", "b:1"]}, task=("worker", 0)),
        "other_rpc_layer": _tf_config(rpc_layer="grpc+verbs"),
        "rpc_layer_null": _tf_config(rpc_layer=None),
        "rpc_layer_a_number": _tf_config(rpc_layer=5),
    }
    return cases


MALFORMED_TF_CONFIGS = malformed_tf_configs()


def test_there_are_many_ways_a_tf_config_is_malformed():
    assert len(MALFORMED_TF_CONFIGS) >= 75, len(MALFORMED_TF_CONFIGS)
    # Every case is a valid configuration but for the one thing it breaks.
    assert server.parse_tf_config(_tf_config()) == (CLUSTER, "ps", 0)


@pytest.mark.parametrize("name", sorted(MALFORMED_TF_CONFIGS))
def test_every_malformed_tf_config_is_refused_in_one_line(name, capsys, monkeypatch):
    text = MALFORMED_TF_CONFIGS[name]
    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("serve() was reached"))
    with pytest.raises(server.ConfigError):
        server.read_task([], {} if text is None else {"TF_CONFIG": text})
    assert server.main([], environ={} if text is None else {"TF_CONFIG": text}) \
        == server.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("tfgc-server: refusing to start: "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err[:-1].isprintable(), err
    assert len(err) < 1000, err


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


# The malformed configurations the real command is started with (each before TensorFlow).
COMMAND_CASES = ["unset", "unclosed_object", "chief", "nested_arrays_10000",
                 "nested_objects_10000", "port_superscript_digits", "port_full_width_digits",
                 "port_arabic_indic_digits", "host_with_a_trailing_newline",
                 "job_name_with_a_space_and_bang", "job_name_not_ascii"]


def _commands():
    """The ways in: the console script (where installed) and `python -m tfgc.server`."""
    console = os.path.join(os.path.dirname(sys.executable), "tfgc-server")
    return ([[console]] if os.access(console, os.X_OK) else []) + \
        [[sys.executable, "-m", "tfgc.server"]]


@pytest.mark.slow
def test_the_command_refuses_before_tensorflow_loads_in_one_line(tmp_path):
    # A tensorflow package that says so when imported: a case that got that far fails.
    fake = tmp_path / "fake"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text(
        "import sys\nsys.stderr.write('TensorFlow was imported\\n')\nsys.exit(99)\n")
    path = os.pathsep.join([str(fake), REPO])
    started = time.monotonic()
    for command in _commands():
        for name in COMMAND_CASES:
            env = _env(PYTHONPATH=path)
            env.pop("TF_CPP_MIN_LOG_LEVEL")
            if MALFORMED_TF_CONFIGS[name] is not None:
                env["TF_CONFIG"] = MALFORMED_TF_CONFIGS[name]
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 2, (command, name, done.stderr)
            assert done.stderr.startswith("tfgc-server: refusing to start: "), (name, done)
            assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done
        # The fake is in the way of a valid configuration: it does reach TensorFlow.
        done = subprocess.run(command, env=_env(PYTHONPATH=path, TF_CONFIG=_tf_config()),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 99 and "TensorFlow was imported" in done.stderr, done
    assert time.monotonic() - started < 60


def _caught(pid, signum):
    """Whether process `pid` has a handler for `signum` (SigCgt of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def _tensorflow_loaded(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtensorflow" in f.read()
    except OSError:
        return False


def _in_own_network(command):
    """`command` in a network namespace this test makes (loopback up), where its
    server's wildcard listening socket reaches nothing; it keeps the pid."""
    if isolation.unavailable() is not None:
        pytest.skip(f"needs a network namespace of its own: {isolation.unavailable()}")
    return [*isolation.unshare_command(), "sh", "-c",
            'ip link set lo up 2>/dev/null; exec "$@"', "sh", *command]


def _one_task_config():
    return json.dumps({"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
                       "task": {"type": "ps", "index": 0}})


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_each_stop_signal_ends_it_with_its_line_and_exit_code(tmp_path):
    command = _commands()[0]
    env = _env(TF_CONFIG=_one_task_config())
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # quiet by default

    # Early: as soon as its handlers are in place, while TensorFlow loads.
    for sig in server.STOP_SIGNALS:
        log = tmp_path / f"early-{sig.name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(_in_own_network(command), env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not _caught(proc.pid, signal.SIGTERM) and proc.poll() is None:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.005)
            assert not _tensorflow_loaded(proc.pid)
            proc.send_signal(sig)
            code = proc.wait(timeout=30)
        finally:
            _stop(proc)
        text = log.read_text()
        assert code == server.exit_code(sig), (sig, code, text)
        assert text.count("\n") == 1, text
        assert f"{sig.name} received while starting; exiting with code {code}" in text, text

    # Serving: one server per signal, and one that shows TensorFlow's log (level 0).
    procs, logs = {}, {}
    runs = [(sig, env) for sig in server.STOP_SIGNALS]
    runs.append((signal.SIGTERM, {**env, "TF_CPP_MIN_LOG_LEVEL": "0"}))
    try:
        for k, (sig, run_env) in enumerate(runs):
            logs[k] = tmp_path / f"serving-{k}.log"
            with open(logs[k], "w") as out:
                procs[k] = subprocess.Popen(_in_own_network(command), env=run_env,
                                            stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        for k, (sig, _) in enumerate(runs):
            _wait_for_line(procs[k], logs[k], "serving /job:ps/task:0", timeout_s=120)
            procs[k].send_signal(sig)
        for k, (sig, run_env) in enumerate(runs):
            code = procs[k].wait(timeout=30)
            text = logs[k].read_text()
            assert code == server.exit_code(sig), (sig, code, text)
            assert f"{sig.name} received; stopping /job:ps/task:0 (exit code {code})" \
                in text, text
            assert "Traceback" not in text, text
            lines = text.splitlines()
            if run_env.get("TF_CPP_MIN_LOG_LEVEL") == "0":
                assert any(line.startswith("I0000") for line in lines), text
            else:  # nothing of TensorFlow's: its start-up lines are quiet by default
                assert len(lines) == 2 and "serving /job:ps/task:0" in lines[0], text
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
