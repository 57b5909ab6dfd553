"""tfgc.cluster: real ps/worker server processes on 127.0.0.1, exact socket bytes, cleanup.

Each test starts real `tf.distribute.Server` processes, so they are marked `cluster`.
"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import cluster_scripts

from tfgc import cluster
from tfgc.cluster import local, netem, processes, sockets

pytestmark = pytest.mark.cluster

N = 1 << 20  # floats in the test variable: 4 MiB per fp32 push
STEPS = 3


def gone(pid):
    """True once `pid` no longer runs (a zombie that nobody reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not gone(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# The coordinator runs in a process of its own: ParameterServerStrategy turns the
# eager context of the process that creates it into /job:chief for good, so in the
# pytest process later tests would fail ("Client for target /job:localhost/replica:0/
# task:0 not found") on resources created before it. This script is that process:
# it starts the cluster, trains through PSS, and reports what it saw as JSON.
COORDINATOR = cluster_scripts.script("""
N, STEPS = int(sys.argv[1]), int(sys.argv[2])
report = {"chief_pid": os.getpid()}
with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=300) as c:
    report.update(pids=c.pids, addresses=c.addresses, spec=c.cluster_spec.as_dict(),
                  tf_config=c.tf_config("worker", 1))
    strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        var = tf.Variable(tf.zeros([N]), name="pushed")
    report["var_device"] = var.device

    @tf.function
    def push():
        var.assign_add(tf.ones([N]))  # scheduled on a worker; the add runs on the PS
        return tf.constant(0)

    report["before"] = c.socket_bytes()
    for _ in range(STEPS):
        coordinator.schedule(push)
    coordinator.join()
    # The last push has arrived when join returns; its last acknowledgements may not
    # have reached the worker yet (bytes_acked then falls short by a few segments).
    report["after"] = c.settled_socket_bytes()
    report["value_ok"] = bool(np.all(var.numpy() == STEPS))
    report["worker_to_ps"] = c.traffic_between("worker", "ps")

    # The PS process loaded tfgc's op library: run a decode op there.
    @tf.function
    def decode_on_ps():
        encoded = tf.constant([7, 243, 121, 255, 0], tf.uint8)
        with tf.device("/job:ps/task:0"):
            return tfgc_ops.zero_run_decode(encoded)

    report["decoded"] = coordinator.schedule(decode_on_ps).fetch().tolist()
    c.check_alive()

# Right after the `with` block every server is gone (checked here, before this
# process exits, so the servers' own parent watchdog cannot be what ended them).
servers = report["pids"]["ps"] + report["pids"]["worker"]
start = time.monotonic()
while time.monotonic() - start < 5 and any(os.path.exists(f"/proc/{p}") for p in servers):
    time.sleep(0.05)
report["alive_after_exit"] = [p for p in servers if os.path.exists(f"/proc/{p}")]
send_report(report)
""")


def sent(rows, src, dst):
    return sum(r["bytes_acked"] for r in rows if (r["local_job"], r["peer_job"]) == (src, dst))


def received(rows, at, src):
    return sum(r["bytes_received"] for r in rows if (r["local_job"], r["peer_job"]) == (at, src))


def test_parameter_server_training_and_socket_bytes(run_report):
    report = run_report(COORDINATOR, timeout=240, args=[N, STEPS])

    pids, addresses = report["pids"], report["addresses"]
    assert len(pids["ps"]) == 1 and len(pids["worker"]) == 2
    assert set(addresses) == {"chief", "ps", "worker"} and len(addresses["chief"]) == 1
    assert all(a.startswith("127.0.0.1:") for addrs in addresses.values() for a in addrs)
    assert report["spec"] == addresses
    assert report["tf_config"] == {"cluster": addresses, "task": {"type": "worker", "index": 1}}
    assert "/job:ps/" in report["var_device"]
    assert report["value_ok"]

    before, after = report["before"], report["after"]
    # Every counted socket joins two of our processes, and each end names its job.
    ours = {report["chief_pid"], *pids["ps"], *pids["worker"]}
    assert after and all(r["local_pid"] in ours for r in after)
    job_of = {pid: job for job in ("ps", "worker") for pid in pids[job]}
    job_of[report["chief_pid"]] = "chief"
    assert all(job_of[r["local_pid"]] == r["local_job"] for r in after)
    assert {(r["local_job"], r["peer_job"]) for r in after} >= {("worker", "ps"), ("ps", "worker")}

    # The workers pushed STEPS fp32 copies of the variable to the PS, a little more.
    fp32 = STEPS * N * 4
    pushed = sent(after, "worker", "ps") - sent(before, "worker", "ps")
    assert fp32 <= pushed < 1.05 * fp32, (pushed, fp32)
    # traffic_between sums the same counters (read again a moment later).
    assert 0 <= report["worker_to_ps"] - sent(after, "worker", "ps") <= 4096
    # The same bytes seen from the PS end of the sockets (up to a few in flight).
    at_ps = received(after, "ps", "worker") - received(before, "ps", "worker")
    assert abs(at_ps - pushed) <= 4096, (at_ps, pushed)
    # The pushes did not go through the chief.
    assert sent(after, "chief", "ps") - sent(before, "chief", "ps") < 0.1 * fp32

    assert report["decoded"] == [7, 121, 121, 121] + [121] * 14 + [0]
    assert report["alive_after_exit"] == []
    assert wait_gone(pids["ps"] + pids["worker"], timeout_s=5) == []


def test_failing_task_raises_with_log_tail_and_leaves_nothing(tmp_path):
    spawned = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        if "tfgc._server" in args[0]:
            spawned.append(proc.pid)
        return proc

    # A PYTHONHOME without a standard library makes the interpreter die at startup
    # with a "Fatal Python error" on stderr: a real crash, written to the task's log.
    env = {"PYTHONHOME": str(tmp_path / "no-python-here")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local.subprocess, "Popen", recording_popen)
        with pytest.raises(cluster.ClusterError) as info:
            with cluster.LocalCluster(num_ps=1, num_workers=1, env=env, log_dir=tmp_path):
                pytest.fail("the cluster should not have started")
    message = str(info.value)
    assert "/job:" in message and "exited with code" in message
    assert "Fatal Python error" in message or "encodings" in message, message
    assert str(tmp_path) in message  # says where the full log is
    assert len(spawned) == 2
    assert wait_gone(spawned, timeout_s=5) == []


def test_server_watchdog_exits_when_parent_is_wrong_or_time_is_up():
    def server(port, parent_pid, timeout):
        spec = json.dumps({"ps": [f"127.0.0.1:{port}"]})
        return subprocess.Popen(
            [sys.executable, "-m", "tfgc._server", "--cluster-spec", spec, "--job", "ps",
             "--index", "0", "--parent-pid", str(parent_pid), "--timeout", str(timeout)],
            stderr=subprocess.PIPE, text=True,
        )

    # `python -m tfgc._server` imports tfgc (and TensorFlow) before main() starts, so
    # both run at once to keep the test short. Each gets a port it can serve on, so
    # only its watchdog can end it.
    ports = processes.reserve_ports(2)
    runs = {
        # Not our parent (pid 1 is never the parent of a process started here).
        "orphan": server(ports[0], parent_pid=1, timeout=60),
        # Serves, then stops when its time is up.
        "late": server(ports[1], parent_pid=os.getpid(), timeout=1),
    }
    try:
        for name, proc in runs.items():
            _, stderr = proc.communicate(timeout=60)
            expected = {"orphan": (4, "parent 1 is gone"), "late": (3, "timeout reached")}[name]
            assert (proc.returncode, expected[1] in stderr) == (expected[0], True), stderr
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_servers_exit_when_the_launcher_is_killed(tmp_path):
    # A launcher that dies without cleanup (SIGKILL): the servers' watchdogs end them.
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent("""
        import json, sys, time
        from tfgc import cluster
        c = cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=120).start()
        print(json.dumps(c.pids), flush=True)
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, "launcher printed no pids"
        pids = json.loads(line)
        servers = pids["ps"] + pids["worker"]
        assert all(not gone(pid) for pid in servers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert wait_gone(servers, timeout_s=10) == []


def test_port_taken_before_bind_is_retried_on_fresh_ports(monkeypatch):
    # Hold the first port picked for the PS so that its server cannot bind it.
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    real_reserve = processes.reserve_ports
    calls = []

    def reserve(count):
        ports = real_reserve(count)
        if not calls:
            ports[1] = taken  # ports[0] is the chief's, ports[1] the first PS's
        calls.append(ports)
        return ports

    monkeypatch.setattr(local, "reserve_ports", reserve)
    try:
        with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=120) as c:
            assert len(calls) == 2
            assert c.addresses["ps"] != [f"127.0.0.1:{taken}"]
            pids = c.pids["ps"] + c.pids["worker"]
    finally:
        blocker.close()
    assert wait_gone(pids, timeout_s=5) == []


def test_cli_runs_script_as_coordinator(tmp_path):
    script = tmp_path / "add.py"
    script.write_text(textwrap.dedent("""
        import sys
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.task_type == "chief", resolver.task_type
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        @tf.function
        def add(a, b):
            return a + b

        a, b = float(sys.argv[1]), float(sys.argv[2])
        result = coordinator.schedule(add, args=(tf.constant(a), tf.constant(b))).fetch()
        print(f"sum={result}")
        sys.exit(7)
    """))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "tfgc.cluster", "--ps", "1", "--workers", "1", "--timeout", "120",
         "--", str(script), "2", "40"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 7, done.stderr[-3000:]
    assert "sum=42.0" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "/job:ps/task:0" in done.stderr and "/job:worker/task:0" in done.stderr
    assert "traffic" in done.stderr and "chief -> worker" in done.stderr, done.stderr[-3000:]
    # The servers were stopped: no pid printed by the CLI survives.
    pids = [int(p) for p in re.findall(r"pid (\d+)", done.stderr)]
    assert len(pids) == 3
    assert wait_gone(pids, timeout_s=5) == []


def test_ss_output_parsing(monkeypatch):
    # Real `ss -H -t -n -p -i state established` lines (the counters on a continuation
    # line), with a dual-stack server end written as [::ffff:127.0.0.1].
    output = (
        "0 0 127.0.0.1:53592 127.0.0.1:40325 users:((\"python\",pid=11,fd=4))\n"
        "\t cubic wscale:7,7 bytes_sent:1000 bytes_acked:1001 segs_out:3 lastsnd:8\n"
        "0 0 [::ffff:127.0.0.1]:40325 [::ffff:127.0.0.1]:53592 users:((\"python\",pid=22,fd=5))\n"
        "\t cubic wscale:7,7 bytes_received:1000 segs_in:3\n"
        "0 0 10.0.0.2:22 10.0.0.9:5000 users:((\"sshd\",pid=33,fd=3))\n"
        "\t cubic bytes_acked:5 bytes_received:7\n"
    )
    monkeypatch.setattr(sockets, "run_ss", lambda args: output)
    listed = sockets.ss_sockets(["-i", "state", "established"])
    assert listed[0] == {"local": ("127.0.0.1", 53592), "peer": ("127.0.0.1", 40325), "pid": 11,
                          "bytes_sent": 1000, "bytes_acked": 1001, "bytes_received": 0}
    assert listed[1]["local"] == ("127.0.0.1", 40325) and listed[1]["pid"] == 22
    assert listed[1]["bytes_received"] == 1000
    assert listed[2]["local"] == ("10.0.0.2", 22)

    listening = "LISTEN 0 4096 *:40325 *:* users:((\"python\",pid=22,fd=7))\n"
    monkeypatch.setattr(sockets, "run_ss", lambda args: listening)
    assert sockets.ss_sockets(["-l"]) == [{"local": ("*", 40325), "peer": ("*", None), "pid": 22,
                                            "bytes_sent": 0, "bytes_acked": 0, "bytes_received": 0}]

    # socket_bytes pairs the two ends of a connection by their ports and names the jobs.
    c = cluster.LocalCluster(num_ps=1, num_workers=1)
    c._addresses = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:40325"], "worker": ["127.0.0.1:2"]}
    c._pids = {"ps": [22], "worker": [44]}
    monkeypatch.setattr(sockets, "run_ss", lambda args: output)
    rows = c.socket_bytes(chief_pid=11)
    assert [(r["local_job"], r["peer_job"], r["bytes_acked"]) for r in rows] == [
        ("chief", "ps", 1001), ("ps", "chief", 0)]
    assert c.traffic_between("chief", "ps", chief_pid=11) == 1001
    assert c.traffic_summary(chief_pid=11) == {("chief", "ps"): 1001, ("ps", "chief"): 0}


def test_socket_bytes_reads_again_when_ss_misses_an_owner(monkeypatch):
    # The ps end of the chief's connection first comes without its owner: leaving the
    # connection out would take its whole history out of a difference of two readings.
    chief = ("0 0 127.0.0.1:53592 127.0.0.1:40325 users:((\"python\",pid=11,fd=4))\n"
             "\t bytes_acked:1001\n")
    ps_end = "0 0 127.0.0.1:40325 127.0.0.1:53592{users}\n\t bytes_received:1000\n"
    readings = iter([chief + ps_end.format(users="")] * 6
                    + [chief + ps_end.format(users=' users:(("python",pid=22,fd=5))')] * 20)
    monkeypatch.setattr(sockets, "run_ss", lambda args: next(readings))
    monkeypatch.setattr(sockets.time, "sleep", lambda s: None)
    c = cluster.LocalCluster(num_ps=1, num_workers=1)
    c._addresses = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:40325"], "worker": ["127.0.0.1:2"]}
    c._pids = {"ps": [22], "worker": [44]}
    assert c.traffic_between("chief", "ps", chief_pid=11) == 1001

    readings = iter([chief + ps_end.format(users="")] * 100)
    with pytest.raises(cluster.ClusterError, match="could not tell which processes"):
        c.socket_bytes(chief_pid=11)


def test_run_workers_gives_each_worker_its_tf_config(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        config = json.loads(os.environ["TF_CONFIG"])
        print(json.dumps(config))
        print("argv", sys.argv[1:], file=sys.stderr)
        sys.exit(config["task"]["index"])  # worker i exits with i
    """))
    c = cluster.LocalCluster(num_ps=0, num_workers=3, log_dir=tmp_path / "logs")
    results = c.run_workers([str(script), "a", "b"], timeout_s=60)
    c.stop()
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.returncode for r in results] == [0, 1, 2]
    configs = [json.loads(r.stdout) for r in results]
    workers = configs[0]["cluster"]["worker"]
    assert list(configs[0]["cluster"]) == ["worker"] and len(set(workers)) == 3
    assert all(a.startswith("127.0.0.1:") for a in workers)
    assert [c_["task"] for c_ in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert all(c_["cluster"] == configs[0]["cluster"] for c_ in configs)
    assert all("argv ['a', 'b']" in r.stderr for r in results)
    with pytest.raises(cluster.ClusterError, match="worker 2"):
        cluster.LocalCluster(num_ps=0, num_workers=3).run_workers([str(script)], check=True)


def test_run_workers_kills_all_on_timeout_and_after_a_failure(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import json, os, subprocess, sys, time
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        if index == 0 and sys.argv[1] == "fail":
            sys.exit(5)
        time.sleep(600)
    """))
    c = cluster.LocalCluster(num_ps=0, num_workers=2)
    start = time.monotonic()
    with pytest.raises(cluster.ClusterTimeout) as info:
        c.run_workers([str(script), "hang"], timeout_s=3)
    assert time.monotonic() - start < 20
    results = info.value.results
    assert [r.timed_out for r in results] == [True, True]
    assert [r.returncode for r in results] == [-signal.SIGKILL] * 2
    # The scripts and the processes they started are gone.
    children = [int(r.stdout.split()[0]) for r in results]
    assert wait_gone([r.pid for r in results] + children, timeout_s=10) == []
    c.stop()

    # One worker fails: the other (stuck, as in a collective) is killed after the grace.
    c = cluster.LocalCluster(num_ps=0, num_workers=2)
    c.start_workers([str(script), "fail"])
    results = c.wait_workers(timeout_s=60, failure_grace_s=1)
    c.stop()
    assert [r.returncode for r in results] == [5, -signal.SIGKILL]
    assert not any(r.timed_out for r in results)


needs_emulation = pytest.mark.skipif(
    cluster.emulation_unavailable() is not None,
    reason=str(cluster.emulation_unavailable()),
)


def netns_of(pid):
    return os.readlink(f"/proc/{pid}/ns/net")


# Worker 0 receives on its TF_CONFIG address for a few seconds, worker 1 sends as fast
# as it can; each reports what it saw. No TensorFlow: it measures the links alone.
THROUGHPUT = """
import json, os, socket, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
host, port = config["cluster"]["worker"][0].rsplit(":", 1)
info = {"netns": os.readlink("/proc/self/ns/net"),
        "routes": subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout,
        "links": subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout}
if index == 0:
    server = socket.create_server((host, int(port)))
    conn, _ = server.accept()
    total, start = 0, None
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        start = start or time.monotonic()
        total += len(chunk)
    info.update(received=total, seconds=time.monotonic() - start)
else:
    for _ in range(100):
        try:
            conn = socket.create_connection((host, int(port)))
            break
        except OSError:
            time.sleep(0.1)
    deadline = time.monotonic() + float(sys.argv[1])
    block = b"x" * (1 << 16)
    while time.monotonic() < deadline:
        conn.sendall(block)
    conn.close()
print(json.dumps(info))
"""


@needs_emulation
def test_bandwidth_emulation_shapes_links_in_private_namespaces(tmp_path):
    script = tmp_path / "throughput.py"
    script.write_text(THROUGHPUT)
    with cluster.LocalCluster(num_ps=0, num_workers=2, bandwidth="20mbit") as c:
        addresses = c.addresses["worker"]
        results = c.run_workers([str(script), "3"], timeout_s=60, check=True)
    hosts = [a.rsplit(":", 1)[0] for a in addresses]
    assert all(h.startswith("10.") for h in hosts) and len(set(hosts)) == 2
    info = [json.loads(r.stdout) for r in results]
    # Each task in a namespace of its own, with one link and one on-link route.
    assert len({i["netns"] for i in info} | {netns_of(os.getpid())}) == 3
    for i in info:
        assert "default" not in i["routes"] and len(i["routes"].strip().splitlines()) == 1
        assert [l.split(":")[1].strip().split("@")[0] for l in i["links"].splitlines()] == [
            "lo", "eth0"]
    # 20 Mbit/s, measured at the receiver over ~3 s (TCP ramp-up costs a little).
    rate = info[0]["received"] * 8 / info[0]["seconds"]
    assert 0.7 * 20e6 < rate < 1.1 * 20e6, rate
    # Everything this process made is gone again (its namespaces and its link are named
    # after its pid; another process's network may come and go meanwhile).
    assert not [n for n in netem.netns_list() if n.startswith(f"tfgc-{os.getpid()}-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"tfgc{os.getpid():06x}" not in links


@needs_emulation
def test_bandwidth_emulation_parameter_servers_and_socket_bytes(tmp_path):
    with cluster.LocalCluster(num_ps=1, num_workers=1, bandwidth="100mbit",
                              timeout_s=120) as c:
        ps_host, ps_port = c.addresses["ps"][0].rsplit(":", 1)
        chief_host = c.addresses["chief"][0].rsplit(":", 1)[0]
        assert ps_host != chief_host and ps_host.startswith("10.")
        pids = c.pids["ps"] + c.pids["worker"]
        assert all(netns_of(p) != netns_of(os.getpid()) for p in pids)
        assert netns_of(pids[0]) != netns_of(pids[1])
        # An HTTP/2 client preface to the ps's gRPC server: the connection stays open,
        # and its bytes are found from both ends across the namespaces.
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        with socket.create_connection((ps_host, int(ps_port)), timeout=5) as conn:
            conn.sendall(preface)
            conn.recv(64)  # the server's SETTINGS
            rows = c.socket_bytes()
            assert c.traffic_between("chief", "ps", rows=rows) == len(preface) + 1  # +SYN
            at_ps = [r for r in rows if (r["local_job"], r["peer_job"]) == ("ps", "chief")]
            assert at_ps and at_ps[0]["bytes_received"] == len(preface)
        namespaces = [n for n in netem.netns_list() if n.startswith(f"tfgc-{os.getpid()}-")]
        assert len(namespaces) == 3  # hub, ps0, worker0
    assert wait_gone(pids, timeout_s=5) == []
    assert not [n for n in netem.netns_list() if n.startswith(f"tfgc-{os.getpid()}-")]


def test_bandwidth_emulation_errors():
    with pytest.raises(ValueError, match="10mbit"):
        cluster.LocalCluster(bandwidth="10 megabits")
    assert cluster.parse_rate("10mbit") == 10e6 and cluster.parse_rate("1gbit") == 1e9
    assert cluster.parse_rate("125kbps") == 1e6
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netem.os, "geteuid", lambda: 1000)
        with pytest.raises(cluster.ClusterError, match="needs root"):
            cluster.LocalCluster(num_ps=0, num_workers=1, bandwidth="10mbit").start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(netem.os, "geteuid", lambda: 0)
        mp.setattr(netem.shutil, "which", lambda tool: None if tool == "tc" else "/x")
        with pytest.raises(cluster.ClusterError, match="tc from iproute2"):
            cluster.LocalCluster(num_ps=0, num_workers=1, bandwidth="10mbit").start()


@needs_emulation
def test_emulated_networks_name_their_links_apart_whatever_the_seed():
    # Training seeds Python's `random`: names drawn from it collided between two test
    # processes seeded alike. Making a network object creates nothing yet.
    names = []
    for _ in range(2):
        random.seed(0)
        names.append(netem.EmulatedNetwork("10mbit", []).root_link)
    assert names[0] != names[1] and all(len(name) <= 15 for name in names)


def test_cli_mwms_runs_the_script_as_every_worker(tmp_path, capfd):
    script = tmp_path / "hello.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        print(f"worker {task['index']} says {sys.argv[1]}")
        sys.exit(3 if task["index"] == 1 else 0)
    """))
    saved = signal.getsignal(signal.SIGTERM)
    try:
        code = cluster.main(["--workers", "2", "--mwms", "--timeout", "60", str(script), "hi"])
    finally:
        signal.signal(signal.SIGTERM, saved)
    out, err = capfd.readouterr()
    assert code == 3
    assert "worker 0 says hi" in out and "worker 1 says hi" in out
    assert "/job:worker/task:1" in err and "worker exit codes [0, 3]" in err
    pids = [int(p) for p in re.findall(r"pid (\d+)", err)]
    assert len(pids) == 2 and wait_gone(pids, timeout_s=5) == []
    with pytest.raises(SystemExit):
        cluster.main(["--workers", "2", "--mwms", "--ps", "1", str(script)])


def test_ss_reads_until_two_listings_agree(monkeypatch):
    # The kernel's socket dump is not atomic: one listing may miss a socket or show one
    # twice. A socket missing from a "before" reading would add its whole history to a
    # difference of two readings, so listings are repeated until two agree.
    first = "0 0 127.0.0.1:5 127.0.0.1:6 users:((\"python\",pid=11,fd=4))\n\t bytes_acked:10\n"
    second = first + "0 0 127.0.0.1:7 127.0.0.1:8 users:((\"python\",pid=11,fd=5))\n\t bytes_acked:99\n"
    duplicated = second + second
    outputs = iter([first, second, duplicated])
    calls = []

    def run_ss(args):
        calls.append(args)
        return next(outputs)

    monkeypatch.setattr(sockets, "run_ss", run_ss)
    listed = sockets.ss_sockets(["-i", "state", "established"])
    assert len(calls) == 3  # first != second; second and the duplicated one agree
    assert sorted((s["local"][1], s["bytes_acked"]) for s in listed) == [(5, 10), (7, 99)]


def test_task_traffic_resolves_host_names(monkeypatch):
    # A TF_CONFIG may name tasks "localhost"; ss prints numeric addresses.
    me = os.getpid()
    output = (
        f"0 0 127.0.0.1:50000 127.0.0.1:40325 users:((\"python\",pid={me},fd=4))\n"
        "\t bytes_acked:1234 bytes_received:99\n"
        "0 0 127.0.0.1:40325 127.0.0.1:50000 users:((\"python\",pid=22,fd=5))\n"
        "\t bytes_acked:99 bytes_received:1234\n"
    )
    listening = "LISTEN 0 4096 *:40325 *:* users:((\"python\",pid=22,fd=7))\n"
    monkeypatch.setattr(sockets, "run_ss", lambda args: listening if "-l" in args else output)
    config = {"cluster": {"worker": ["localhost:40324", "localhost:40325"]},
              "task": {"type": "worker", "index": 0}}
    assert cluster.task_traffic(config) == {("worker", 1): {"sent": 1234, "received": 99}}


def test_task_traffic_reads_again_when_ss_misses_an_owner(monkeypatch):
    # This process (port 40324) was dialled by the task at 40325 from port 50000. The
    # first readings do not name the dialling process: rather than leave the
    # connection out (its whole history would then count in a later difference),
    # task_traffic reads again.
    me = os.getpid()
    mine = (f"0 0 127.0.0.1:40324 127.0.0.1:50000 users:((\"python\",pid={me},fd=4))\n"
            "\t bytes_acked:700 bytes_received:5\n")
    theirs = "0 0 127.0.0.1:50000 127.0.0.1:40324{users}\n\t bytes_acked:5\n"
    named = theirs.format(users=' users:(("python",pid=22,fd=5))')
    listening = ("LISTEN 0 4096 *:40325 *:* users:((\"python\",pid=22,fd=7))\n"
                 f"LISTEN 0 4096 *:40324 *:* users:((\"python\",pid={me},fd=7))\n")
    established = iter([mine + theirs.format(users="")] * 3 + [mine + named] * 20)
    monkeypatch.setattr(sockets, "run_ss",
                        lambda args: listening if "-l" in args else next(established))
    monkeypatch.setattr(sockets.time, "sleep", lambda s: None)
    config = {"cluster": {"worker": ["127.0.0.1:40324", "127.0.0.1:40325"]}}
    assert cluster.task_traffic(config) == {("worker", 1): {"sent": 700, "received": 5}}

    established = iter([mine + theirs.format(users="")] * 100)
    with pytest.raises(cluster.ClusterError, match="could not tell which task"):
        cluster.task_traffic(config)


def test_settled_socket_bytes_waits_until_the_traffic_stops_moving(monkeypatch):
    # A parameter server may still be receiving the last step's tensors when `fit`
    # returns: the reading waits until the bytes grow by at most the tolerance
    # (keepalive pings) over the quiet period.
    class Clock:
        now = 0.0

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(sockets, "time", clock)
    totals = iter([1000, 60_000, 120_000, 120_050, 120_100, 120_150, 120_200])
    c = cluster.LocalCluster(num_ps=1, num_workers=1)
    c._addresses = {"ps": ["127.0.0.1:1"]}
    monkeypatch.setattr(c, "socket_bytes", lambda chief_pid=None: [{"bytes_received": next(totals)}])
    rows = c.settled_socket_bytes(quiet_s=1.0, tolerance_bytes=1024)
    assert rows == [{"bytes_received": 120_100}] and clock.now == 2.0

    monkeypatch.setattr(c, "socket_bytes",
                        lambda chief_pid=None: [{"bytes_received": clock.now * 10_000}])
    with pytest.raises(cluster.ClusterError, match="did not settle"):
        c.settled_socket_bytes(timeout_s=5)
