"""The clusters tfgc starts are unreachable from other hosts (private network namespaces).

Nothing here sends traffic anywhere but loopback: the checks read socket tables and
interface lists, of this namespace, of the namespaces the launchers made, and (as
root) of the machine's own namespace, that of pid 1.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from tfgc.cluster import isolation

pytestmark = pytest.mark.skipif(
    isolation.unavailable() is not None, reason=str(isolation.unavailable()))

# Brings the cluster up through the command line, reports it, and keeps it up until
# the test has looked at the sockets (it deletes the file named by argv[1]).
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import tensorflow as tf
    from tfgc.cluster import isolation

    config = json.loads(os.environ["TF_CONFIG"])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        v = tf.Variable(1.0)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    result = coordinator.schedule(tf.function(lambda: v.assign_add(1.0)))
    coordinator.join()
    print("UP " + json.dumps({
        "cluster": config["cluster"], "pid": os.getpid(), "value": float(v.numpy()),
        "netns": os.readlink("/proc/self/ns/net"), "interfaces": isolation.interfaces(),
    }), flush=True)
    deadline = time.monotonic() + 120
    while os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.1)
    """
)


def _interfaces_of(pid):
    """Interfaces of the network namespace of process `pid` (from /proc/<pid>/net/dev)."""
    with open(f"/proc/{pid}/net/dev") as f:
        return sorted(line.split(":")[0].strip() for line in f.readlines()[2:])


def _listening(ns_prefix=()):
    """[(address, port, pid)] of listening TCP sockets, via `ss -H -ltnp`."""
    out = subprocess.run([*ns_prefix, "ss", "-H", "-ltnp"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    rows = []
    for line in out.splitlines():
        fields = line.split()
        address, port = fields[3].rsplit(":", 1)
        pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        rows += [(address, int(port), pid) for pid in pids or [None]]
    return rows


def _from_a_public_network(command):
    """`command`, started where it has a network interface besides loopback to leave.

    Where this test runs in a private namespace already (`make test`), in a new one
    with a veth pair; elsewhere, here.
    """
    if not isolation.in_private_network():
        return command
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2) to give the command a namespace with an interface")
    return [*isolation.unshare_command(), "sh", "-c",
            'ip link add nic0 type veth peer name nic1 && ip link set nic0 up && exec "$@"',
            "sh", *command]


def _readable_netns(pid):
    try:
        os.readlink(f"/proc/{pid}/ns/net")
        return True
    except OSError:
        return False


def _task_pids(cluster_pid):
    """The launcher's child processes (the ps and worker servers)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(cluster_pid)], capture_output=True,
                         text=True, timeout=30).stdout
    return [int(p) for p in out.split()]


@pytest.mark.cluster
@pytest.mark.slow
def test_the_command_line_runs_its_cluster_in_a_private_network(tmp_path):
    script = tmp_path / "coordinator.py"
    script.write_text(SCRIPT)
    hold = tmp_path / "hold"
    hold.write_text("")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TFGC_PRIVATE_NETWORK", None)
    command = [sys.executable, "-m", "tfgc.cluster", "--ps", "1", "--workers", "1",
               "--timeout", "150", str(script), str(hold)]
    proc = subprocess.Popen(_from_a_public_network(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        up = None
        deadline = time.monotonic() + 150
        for line in proc.stdout:
            if line.startswith("UP "):
                up = json.loads(line[3:])
                break
            assert time.monotonic() < deadline
        assert up is not None, proc.stderr.read()[-4000:]
        assert up["value"] == 2.0  # the coordinator reached its parameter server
        ports = {int(a.rsplit(":", 1)[1]) for addrs in up["cluster"].values() for a in addrs}
        pids = [up["pid"], *_task_pids(up["pid"])]
        assert len(pids) == 3, pids  # the coordinator (same pid after re-exec), ps, worker

        # Every process of the cluster sits in a namespace with loopback only, not ours.
        assert up["interfaces"] == ["lo"]
        assert up["netns"] != os.readlink("/proc/self/ns/net")
        for pid in pids:
            assert _interfaces_of(pid) == ["lo"], pid
            assert os.readlink(f"/proc/{pid}/ns/net") == up["netns"], pid
        # None of them listens where this test's namespace can see it...
        assert not [row for row in _listening() if row[2] in pids]
        # ...nor in the machine's own namespace (that of pid 1), where one may look.
        if _readable_netns(1) and os.geteuid() == 0 and not isolation.in_user_namespace():
            host = _listening(["nsenter", "--target", "1", "--net"])
            assert not [row for row in host if row[2] in pids], host
        if os.geteuid() == 0 and not isolation.in_user_namespace():
            # Inside, the servers do listen (on the wildcard address, as TensorFlow does).
            inside = _listening(["nsenter", "--target", str(up["pid"]), "--net"])
            assert ports <= {row[1] for row in inside if row[2] in pids}, (ports, inside)
    finally:
        hold.unlink(missing_ok=True)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr.read()[-4000:]


def test_isolate_moves_a_single_threaded_process_in_place(tmp_path):
    # Before TensorFlow is imported a process moves itself, without starting again.
    code = textwrap.dedent(
        """
        import importlib.util, json, os, sys
        before = os.readlink("/proc/self/ns/net")
        spec = importlib.util.spec_from_file_location("isolation", sys.argv[1])
        isolation = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(isolation)
        assert len(os.listdir("/proc/self/task")) == 1
        ok = isolation.isolate()
        import socket
        with socket.socket() as s:  # loopback is up: a server and a client meet
            s.bind(("127.0.0.1", 0)); s.listen()
            socket.create_connection(s.getsockname(), timeout=5).close()
        print(json.dumps({"ok": ok, "moved": os.readlink("/proc/self/ns/net") != before,
                          "interfaces": isolation.interfaces(), "uid": os.getuid()}))
        """
    )
    env = dict(os.environ)
    env.pop("TFGC_PRIVATE_NETWORK", None)
    done = subprocess.run(_from_a_public_network([sys.executable, "-c", code, isolation.__file__]),
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"ok": True, "moved": True, "interfaces": ["lo"], "uid": os.getuid()}


# What `ways_out` says of a host's namespace.
HOST_WAY_OUT = "eth0: a link of kind device (ether), not a veth into another namespace"


def test_a_cluster_outside_a_private_network_warns_loudly(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "ways_out", lambda: [HOST_WAY_OUT])
    monkeypatch.setattr(isolation, "_warned", False)
    assert not isolation.in_private_network()
    monkeypatch.setenv(isolation.SWITCH, "0")
    with pytest.warns(isolation.ExposedClusterWarning, match="without authentication"):
        assert isolation.isolate() is False
    assert "listen on every network interface" in capsys.readouterr().err
    monkeypatch.setattr(isolation, "ways_out", lambda: [])
    assert isolation.in_private_network() == sys.platform.startswith("linux")


# --- clusters are private by default -----------------------------------------------------


def _in_a_namespace_with_an_interface(command):
    """`command` in a new network namespace with an interface besides loopback.

    Always a throwaway namespace, also where the test runs in the machine's own: an
    exposed cluster started there listens where nothing else can reach it.
    """
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2) to give the command a namespace with an interface")
    return [*isolation.unshare_command(), "sh", "-c",
            "{ ip link add nic0 type dummy 2>/dev/null || "
            "ip link add nic0 type veth peer name nic1; } && ip link set nic0 up && exec \"$@\"",
            "sh", *command]


@pytest.fixture
def exposed_namespace(monkeypatch):
    """This process's namespace looks like a host's (eth0), and nothing opted out."""
    monkeypatch.setattr(isolation, "ways_out", lambda: [HOST_WAY_OUT])
    monkeypatch.setattr(isolation, "unavailable", lambda: None)
    monkeypatch.setattr(isolation, "_isolate_failed", None)
    monkeypatch.setattr(isolation, "_warned", False)
    monkeypatch.delenv(isolation.SWITCH, raising=False)

    def no_process(*args, **kwargs):
        raise AssertionError(f"started a process: {args}")

    from tfgc.cluster import local, workers

    monkeypatch.setattr(local.subprocess, "Popen", no_process)
    monkeypatch.setattr(workers.subprocess, "Popen", no_process)


def _assert_says_what_to_do(message):
    assert "refuses to start" in message and f"reach beyond itself ({HOST_WAY_OUT})" in message
    assert "without authentication" in message
    assert "`tfgc.cluster.isolate()` first thing in main()" in message
    assert "python -m tfgc.cluster.private" in message
    assert 'LocalCluster(..., network="exposed")' in message
    assert "TFGC_NETWORK_ISOLATION=0" in message


def test_a_cluster_refuses_to_start_outside_a_private_network(exposed_namespace, tmp_path):
    from tfgc import cluster

    c = cluster.LocalCluster(num_ps=1, num_workers=1, log_dir=tmp_path / "logs")
    with pytest.raises(cluster.ExposedClusterError) as refused:
        c.start()
    assert isinstance(refused.value, cluster.ClusterError)
    _assert_says_what_to_do(str(refused.value))
    assert not (tmp_path / "logs").exists()  # nothing was started, not even a log
    with pytest.raises(RuntimeError, match="not started"):
        c.addresses
    with pytest.raises(cluster.ExposedClusterError):
        with cluster.LocalCluster(num_ps=1, num_workers=1):
            pass
    # All-reduce clusters too: their worker scripts host the servers.
    with pytest.raises(cluster.ExposedClusterError):
        cluster.LocalCluster(num_ps=0, num_workers=2).run_workers(["-c", "pass"])


def test_a_refusal_where_isolate_failed_says_only_opting_out_is_left(exposed_namespace):
    from tfgc import cluster

    # isolate() tried and could not: it warns, and the cluster refuses afterwards.
    with pytest.warns(cluster.ExposedClusterWarning, match="will refuse to start"):
        isolation._cannot_isolate("unshare: Operation not permitted")
    with pytest.raises(cluster.ExposedClusterError) as refused:
        cluster.LocalCluster(num_ps=1, num_workers=1).start()
    message = str(refused.value)
    assert "No private network namespace can be made here (unshare: Operation not permitted)" \
        in message
    assert "isolate()" not in message  # it was tried
    assert 'network="exposed"' in message and "TFGC_NETWORK_ISOLATION=0" in message


def test_the_command_line_refuses_with_the_message_instead_of_a_traceback(
        exposed_namespace, tmp_path, capsys):
    from tfgc import cluster

    script = tmp_path / "chief.py"
    script.write_text("raise SystemExit('the script ran')\n")
    assert cluster.main(["--ps", "1", "--workers", "1", str(script)]) == 2
    err = capsys.readouterr().err
    _assert_says_what_to_do(err)
    assert "Traceback" not in err


def test_opting_out_starts_the_cluster_and_warns(exposed_namespace, monkeypatch, capsys):
    from tfgc import cluster

    with pytest.raises(ValueError, match="'private', 'exposed'"):
        cluster.LocalCluster(network="public")
    # num_ps=0: start() starts no process (its worker scripts would), so none is needed here.
    with pytest.warns(cluster.ExposedClusterWarning, match="network=\"exposed\""):
        c = cluster.LocalCluster(num_ps=0, num_workers=2, network="exposed").start()
    try:
        assert len(c.addresses["worker"]) == 2
        assert "listen on every network interface" in capsys.readouterr().err
        # A worker script that calls isolate() stays where its peers listen.
        assert c._child_env("worker", 0)[isolation.SWITCH] == "0"
    finally:
        c.stop(remove_logs=True)

    monkeypatch.setattr(isolation, "_warned", False)
    monkeypatch.setenv(isolation.SWITCH, "0")
    with pytest.warns(cluster.ExposedClusterWarning, match="TFGC_NETWORK_ISOLATION=0"):
        c = cluster.LocalCluster(num_ps=0, num_workers=1).start()
    c.stop(remove_logs=True)


def test_a_private_cluster_starts_in_a_private_network(monkeypatch, recwarn):
    from tfgc import cluster

    monkeypatch.setattr(isolation, "ways_out", lambda: [])
    monkeypatch.setattr(isolation.sys, "platform", "linux")
    monkeypatch.delenv(isolation.SWITCH, raising=False)
    c = cluster.LocalCluster(num_ps=0, num_workers=1).start()
    c.stop(remove_logs=True)
    assert not [w for w in recwarn if issubclass(w.category, cluster.ExposedClusterWarning)]
    assert isolation.SWITCH not in c._child_env("worker", 0)


# In a namespace with an interface besides loopback: a private cluster (the default)
# refuses and starts nothing; one that opts out starts its servers, and warns.
EXPOSED_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    from tfgc import cluster

    def children():
        return [int(pid) for task in os.listdir("/proc/self/task")
                for pid in open(f"/proc/self/task/{task}/children").read().split()]

    report = {"interfaces": cluster.isolation.interfaces()}
    logs = os.path.join(sys.argv[1], "refused")
    try:
        cluster.LocalCluster(num_ps=1, num_workers=1, log_dir=logs).start()
        report["refused"] = None
    except cluster.ExposedClusterError as error:
        report["refused"] = str(error)
    report["children_after_refusal"] = children()
    report["logs_after_refusal"] = os.path.exists(logs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=120,
                                  network="exposed") as c:
            report["servers"] = sorted(pid for pids in c.pids.values() for pid in pids)
            report["children"] = sorted(children())
    report["warnings"] = [str(w.message) for w in caught
                          if issubclass(w.category, cluster.ExposedClusterWarning)]
    print("REPORT " + json.dumps(report), flush=True)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_outside_a_private_network_only_an_explicit_opt_out_starts_a_cluster(tmp_path):
    script = tmp_path / "exposed.py"
    script.write_text(EXPOSED_SCRIPT)
    # This very tfgc, whatever the script's directory and the installed one are.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        filter(None, [repo, os.environ.get("PYTHONPATH")])))
    for key in (isolation.SWITCH, "TFGC_PRIVATE_NETWORK"):
        env.pop(key, None)
    done = subprocess.run(
        _in_a_namespace_with_an_interface([sys.executable, str(script), str(tmp_path)]),
        capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.split("REPORT ", 1)[1])
    assert "nic0" in report["interfaces"]
    refused = report["refused"]
    assert refused is not None, "a private cluster started outside a private network"
    assert "can reach beyond itself (nic" in refused and "without authentication" in refused
    assert "nic0: a link of kind" in refused or "nic0: a veth pair" in refused
    for advice in ("`tfgc.cluster.isolate()` first thing in main()",
                   "python -m tfgc.cluster.private", 'network="exposed"',
                   "TFGC_NETWORK_ISOLATION=0"):
        assert advice in refused
    assert report["children_after_refusal"] == [] and not report["logs_after_refusal"]
    assert len(report["servers"]) == 2 and report["servers"] == report["children"]
    assert len(report["warnings"]) == 1
    assert "without authentication" in report["warnings"][0]
    assert 'network="exposed"' in report["warnings"][0]


# --- private is judged by what a namespace reaches, not by interface names -------------

# Prints what this very isolation module (loaded without tfgc) says of its namespace.
REACH_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("isolation", sys.argv[1])
    isolation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(isolation)
    print(json.dumps({"private": isolation.in_private_network(),
                      "ways_out": isolation.ways_out()}))
    """
)

# A link that may hold an address: a dummy where the kernel has the module, else a bridge.
_ADDRESSABLE = "{{ ip link add {0} type dummy 2>/dev/null || ip link add {0} type bridge; }}"

# name -> (commands that shape the new namespace, a way out `ways_out` must name or None).
REACH_CASES = {
    "loopback_only": ("true", None),
    "empty_bridge_named_tfgc": (
        "ip link add tfgcleak0 type bridge && ip link set tfgcleak0 up",
        "tfgcleak0: a link of kind bridge"),
    "link_named_tfgc_with_a_public_address": (
        _ADDRESSABLE.format("tfgc0") + " && ip addr add 198.51.100.7/24 dev tfgc0 && "
        "ip link set tfgc0 up", "address 198.51.100.7/24 on tfgc0"),
    "link_named_tfgc_with_a_route_out": (
        _ADDRESSABLE.format("tfgc0") + " && ip addr add 10.201.0.1/24 dev tfgc0 && "
        "ip link set tfgc0 up && ip route add default via 10.201.0.254",
        "a default route via 10.201.0.254 dev tfgc0"),
    "veth_pair_named_tfgc_both_ends_here": (
        "ip link add tfgca type veth peer name tfgcb && ip link set tfgca up",
        "tfgca: a veth pair whose other end (tfgcb) is here too"),
}


@pytest.mark.parametrize("name", sorted(REACH_CASES))
def test_a_namespace_is_private_by_what_it_reaches_not_by_link_names(name):
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2) to shape a namespace")
    shape, way_out = REACH_CASES[name]
    done = subprocess.run(
        [*isolation.unshare_command(), "sh", "-c",
         f'ip link set lo up && {shape} && exec "$@"', "sh",
         sys.executable, "-c", REACH_SCRIPT, isolation.__file__],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    if way_out is None:
        assert result == {"private": True, "ways_out": []}
    else:
        assert result["private"] is False, result
        assert any(way_out in reason for reason in result["ways_out"]), result


def test_addresses_and_routes_outside_tfgcs_ranges_are_ways_out():
    addresses = [{"ifname": "lo", "addr_info": [{"local": "127.0.0.1", "prefixlen": 8},
                                                {"local": "::1", "prefixlen": 128}]},
                 {"ifname": "tfgc0", "addr_info": [
                     {"local": "10.201.3.1", "prefixlen": 24},
                     {"local": "fe80::4c76:81ff:fe0d:c060", "prefixlen": 64},
                     {"local": "10.199.3.1", "prefixlen": 24},
                     {"local": "fd00::2", "prefixlen": 64}]}]
    assert isolation._address_ways_out(addresses, "") == [
        "address 10.199.3.1/24 on tfgc0", "address fd00::2/64 on tfgc0"]
    routes = [
        {"dst": "10.201.3.0/24", "dev": "tfgc0"},
        {"type": "broadcast", "dst": "10.201.3.255", "dev": "tfgc0"},
        {"type": "local", "dst": "127.0.0.0/8", "dev": "lo"},
        {"dst": "fe80::/64", "dev": "tfgc0"},
        {"type": "multicast", "dst": "ff00::/8", "dev": "tfgc0"},
        {"type": "unreachable", "dst": "default"},
        {"dst": "default", "gateway": "10.201.3.254", "dev": "tfgc0"},
        {"dst": "10.200.0.0/8", "dev": "tfgc0"},
        {"dst": "10.202.0.0/16", "gateway": "192.0.2.1", "dev": "tfgc0"},
        {"dst": "10.203.0.0/16", "nexthops": [{"gateway": "10.203.0.1"},
                                              {"gateway": "192.0.2.1"}]},
    ]
    assert isolation._route_ways_out(routes, " (in namespace x, linked to this one)") == [
        "a default route via 10.201.3.254 dev tfgc0 (in namespace x, linked to this one)",
        "a route to 10.200.0.0/8 dev tfgc0 (in namespace x, linked to this one)",
        "a route to 10.202.0.0/16 via 192.0.2.1 dev tfgc0 (in namespace x, linked to this one)",
        "a route to 10.203.0.0/16 via 10.203.0.1 via 192.0.2.1 (in namespace x, linked to "
        "this one)",
    ]


def test_bandwidth_emulation_draws_its_subnets_from_the_private_range():
    from tfgc.cluster import netem

    first, last = isolation.EMULATION_RANGE
    for _ in range(20):
        subnet = netem._free_subnet()
        assert first <= subnet.network_address and subnet.broadcast_address <= last, subnet


# In a namespace of its own (and a mount namespace whose /run/netns is its own, so the
# namespaces it names are seen by nothing else), the chief of an emulated network:
# tfgc's links keep it private; a way out added anywhere in what it reaches does not.
EMULATED_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from tfgc.cluster import isolation, netem

    def run(*cmd):
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)

    def in_task(net, task):
        out = subprocess.run(
            [*net.exec_prefix(task), sys.executable, "-c", sys.argv[1]],
            capture_output=True, text=True, timeout=60, check=True).stdout
        return json.loads(out)

    report = {"alone": isolation.ways_out()}
    net = netem.EmulatedNetwork("10gbit", [("ps", 0), ("worker", 0)])
    try:
        net.setup()
        report["links"] = isolation.interfaces()
        report["chief"] = isolation.ways_out()
        # This namespace has no name: a task cannot read what lies behind the hub's
        # link to it, so to a task it is a way out...
        report["task"] = in_task(net, ("ps", 0))
        # ...until it has one.
        run("ip", "netns", "attach", "chief-of-test", str(os.getpid()))
        report["task_named_chief"] = in_task(net, ("ps", 0))
        run("ip", "netns", "delete", "chief-of-test")

        run("ip", "route", "add", "default", "dev", net.root_link)
        report["default_route"] = isolation.ways_out()
        run("ip", "route", "del", "default", "dev", net.root_link)

        run("ip", "-n", net.namespaces[("worker", 0)], "addr", "add", "198.51.100.9/24",
            "dev", "eth0")
        report["public_address_in_a_task"] = isolation.ways_out()
        run("ip", "-n", net.namespaces[("worker", 0)], "addr", "del", "198.51.100.9/24",
            "dev", "eth0")

        # A tap device in the hub: whatever program holds it forwards frames anywhere.
        run("sh", "-c", f"ip -n {net.hub} tuntap add dev uplink0 mode tap || "
                        f"ip -n {net.hub} link add uplink0 type vxlan id 42 dstport 4789")
        report["uplink_in_the_hub"] = isolation.ways_out()
        report["hub"] = net.hub
        report["root_link"] = net.root_link
        report["task_namespace"] = net.namespaces[("worker", 0)]
    finally:
        net.teardown()
    print("REPORT " + json.dumps(report), flush=True)
    """
)


@pytest.mark.slow
def test_the_namespaces_tfgc_makes_are_private_until_something_leads_out(tmp_path):
    from tfgc.cluster import netem

    reason = netem.emulation_unavailable()
    if reason is not None:
        pytest.skip(reason)
    script = tmp_path / "emulated.py"
    script.write_text(EMULATED_SCRIPT)
    task_check = "import json; from tfgc.cluster import isolation; " \
                 "print(json.dumps(isolation.ways_out()))"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
        filter(None, [repo, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs tfgc-test /run && ip link set lo up && exec "$@"', "sh",
         sys.executable, str(script), task_check],
        capture_output=True, text=True, timeout=180, env=env, cwd=repo)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.split("REPORT ", 1)[1])
    hub, task_ns = report["hub"], report["task_namespace"]
    assert report["alone"] == []
    assert report["links"] == sorted(["lo", report["root_link"]])
    assert report["chief"] == []  # lo, a veth into the hub, and what lies behind it
    assert report["task"] == [f"chief (in namespace {hub}, linked to this one): a veth "
                              "into a namespace with no name in /run/netns, which `ip -n` "
                              "cannot read"]
    assert report["task_named_chief"] == []
    assert report["default_route"] == [f"a default route dev {report['root_link']}"]
    assert report["public_address_in_a_task"] == [
        f"address 198.51.100.9/24 on eth0 (in namespace {task_ns}, linked to this one)",
        f"a route to 198.51.100.0/24 dev eth0 (in namespace {task_ns}, linked to this one)",
        f"a route to 198.51.100.9 dev eth0 (in namespace {task_ns}, linked to this one)",
        f"a route to 198.51.100.255 dev eth0 (in namespace {task_ns}, linked to this one)",
    ]
    assert len(report["uplink_in_the_hub"]) == 1
    assert report["uplink_in_the_hub"][0].startswith(
        f"uplink0 (in namespace {hub}, linked to this one): a ")
