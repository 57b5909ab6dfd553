"""A real local TensorFlow cluster on 127.0.0.1, for tests, demos and users.

Parameter-server clusters: `LocalCluster` starts every ps and worker task as its own
`tf.distribute.Server` process (`python -m tfgc._server`, which imports tfgc first so
that tfgc's ops run on a parameter server), waits until each one listens, and stops
them all on exit. The process that uses the cluster is the "chief" (the
ParameterServerStrategy coordinator):

    from tfgc import cluster
    with cluster.LocalCluster(num_ps=1, num_workers=2) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        ...
        print(c.traffic_between("worker", "ps"))   # exact TCP bytes, from `ss -tinp`

All-reduce clusters (MultiWorkerMirroredStrategy): every worker runs the training
script itself and hosts its own server, so `num_ps=0` starts no servers and
`run_workers` runs one process per worker, each with its `TF_CONFIG`:

    results = cluster.LocalCluster(num_ps=0, num_workers=2).run_workers(["train.py"])
    assert all(r.returncode == 0 for r in results)

From a shell:

    python -m tfgc.cluster --ps 1 --workers 2 -- train.py --epochs 1   # script = chief
    python -m tfgc.cluster --workers 2 --mwms -- train.py --epochs 1   # script = workers

Bytes are read from the kernel's per-socket TCP counters (`ss -tinp`, iproute2), which
count exactly what crossed each connection between two of the cluster's processes and
nothing else (`LocalCluster.socket_bytes`, or `task_traffic()` inside a task). TensorFlow
2.21's gRPC server listens on the wildcard address (it hard-codes "[::]:port" /
"0.0.0.0:port"), but every address in the cluster spec, and so every connection, is
127.0.0.1.

Bandwidth emulation (`bandwidth="10mbit"`, root only, needs `ip` and `tc` from
iproute2): each task runs in a network namespace of its own, joined to the others by
veth pairs on a bridge in one more namespace, and every link is shaped with a tc token
bucket (tbf) on what each task sends, as tc on each machine's NIC would.
The chief (this process) reaches them through one veth pair whose address is on a
private /24 that no existing route uses; namespaces have no other interface and no
default route, so nothing leaves them. Everything is deleted on stop.

Creating a ParameterServerStrategy changes the eager context of its process for good
(its local device becomes /job:chief/task:0 and resources made before, under
/job:localhost, can no longer be used). Run the coordinator in a process of its own
(e.g. through the command line above), not inside a test runner shared with other
tests.
"""
import argparse
import atexit
import ctypes
import dataclasses
import gc
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = [
    "LocalCluster", "ClusterError", "ClusterTimeout", "WorkerResult", "task_traffic", "main",
]

HOST = "127.0.0.1"
JOBS = ("ps", "worker")
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOG_TAIL_LINES = 40
# Failures that mean "the port we picked was taken meanwhile": worth a retry on new ports.
_PORT_CONFLICT = re.compile(
    r"Address already in use|Could not start gRPC server|Failed to add .* listener", re.I
)


class ClusterError(RuntimeError):
    """A task of a LocalCluster failed to start or died, or the cluster cannot be built."""


class ClusterTimeout(ClusterError):
    """Worker scripts ran past their time limit; `results` holds what each one did."""

    def __init__(self, message, results):
        super().__init__(message)
        self.results = results


@dataclasses.dataclass
class WorkerResult:
    """What one worker process of `LocalCluster.run_workers` did.

    Attributes:
      index: the worker's task index.
      pid: its process id.
      returncode: its exit status (negative: killed by that signal, e.g. -9 when the
        launcher killed it after a timeout or after another worker failed).
      stdout, stderr: its output (read when it ended, so still here after the
        cluster removed its log directory).
      stdout_path, stderr_path: the files that held it.
      duration_s: seconds from start to exit.
      timed_out: it was still running at the time limit and was killed.
    """

    index: int
    pid: int
    returncode: int
    stdout: str
    stderr: str
    stdout_path: str
    stderr_path: str
    duration_s: float
    timed_out: bool = False


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _reserve_ports(count):
    """Returns `count` distinct free TCP ports on 127.0.0.1.

    The sockets stay open until all ports are read so the kernel cannot hand out the
    same port twice; they are closed before the servers bind (a small race remains,
    handled by retrying the start on fresh ports).
    """
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tail(path, lines=_LOG_TAIL_LINES):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip() or "(log is empty)"
    except OSError as error:
        return f"(could not read {path}: {error})"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (a reused pid)
        return True
    return True


def _resolve_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once here: a child of a multi-threaded process must not load libraries
# between fork and exec.
_PRCTL = _resolve_prctl() if sys.platform.startswith("linux") else None


def _die_with_parent():
    """preexec_fn: the child gets SIGKILL when the thread that started it dies.

    So worker scripts (which have no watchdog of their own) cannot outlive a launcher
    that was itself killed with SIGKILL. Linux only; elsewhere a no-op.
    """
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# --- reading sockets with `ss` ----------------------------------------------------------

_PID = re.compile(r"pid=(\d+)")
_COUNTER = re.compile(r"\b(bytes_sent|bytes_acked|bytes_received):(\d+)")


def _parse_addr(text):
    """'127.0.0.1:5' / '[::ffff:127.0.0.1]:5' -> ('127.0.0.1', 5); '*:5' -> ('*', 5).

    The port is None for '*' (a listener's peer); None if unparsable.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        return None
    host = host.strip("[]")
    if host.lower().startswith("::ffff:"):  # an IPv4 peer of a dual-stack socket
        host = host[len("::ffff:"):]
    host = host.split("%", 1)[0]  # drop an interface suffix ("0.0.0.0%lo")
    if port == "*":
        return host, None
    try:
        return host, int(port)
    except ValueError:
        return None


def _numeric_host(host):
    """`host` as the numeric address `ss -n` prints ("localhost" -> "127.0.0.1")."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host  # unresolvable: matches nothing, as before


def _run_ss(args, netns=None):
    prefix = ["ip", "netns", "exec", netns] if netns else []
    try:
        result = subprocess.run(
            [*prefix, "ss", "-H", *args], capture_output=True, text=True, timeout=10, check=True
        )
    except FileNotFoundError as error:
        raise ClusterError("`ss` (iproute2) is needed to read socket counters") from error
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise ClusterError(f"`ss {' '.join(args)}` failed: {error}") from error
    return result.stdout


def _ss_sockets(extra_args, netns=None):
    """Every socket `ss -H -tnp [extra]` lists, read until two listings agree.

    The kernel dumps its socket table in several batches while sockets keep opening and
    closing, so one listing may miss a socket or list one twice; a socket missing from
    one reading and present in the next would add its whole history to a difference
    of two readings. So the table is read until two consecutive listings hold the same
    sockets (at most `_SS_READS` times), and each socket keeps its largest counters.

    Args and return value: as `_ss_listing`.
    """
    merged, previous = {}, None
    for _ in range(_SS_READS):
        listing = {(s["local"], s["peer"]): s for s in _ss_listing(extra_args, netns)}
        for key, s in listing.items():
            known = merged.get(key)
            if known is None or s["bytes_acked"] >= known["bytes_acked"]:
                if known is not None and s["pid"] is None:
                    s = dict(s, pid=known["pid"])  # ss may miss an owner too
                merged[key] = s
        if previous is not None and listing.keys() == previous:
            break
        previous = listing.keys()
    return list(merged.values())


_SS_READS = 5


def _ss_listing(extra_args, netns=None):
    """Parses `ss -H -tnp [extra] ...` into dicts {local, peer, pid, bytes_acked, ...}.

    With -i, ss prints each socket's counters on a continuation line that starts
    with whitespace; they are folded into the socket line before parsing.

    Args:
      extra_args: more arguments for ss (e.g. a state filter).
      netns: read the sockets of this named network namespace (default: this one).
    """
    if netns is None:
        output = _run_ss(["-t", "-n", "-p", *extra_args])
    else:
        output = _run_ss(["-t", "-n", "-p", *extra_args], netns=netns)
    records, current = [], None
    for line in output.splitlines():
        if not line.strip():
            continue
        if line[0].isspace() and current is not None:
            current += " " + line.strip()
            continue
        if current is not None:
            records.append(current)
        current = line
    if current is not None:
        records.append(current)

    sockets = []
    for record in records:
        fields = record.split()
        # With a state filter ss omits the State column: Recv-Q Send-Q Local Peer ...
        if len(fields) < 4:
            continue
        offset = 0 if fields[0].isdigit() else 1
        local = _parse_addr(fields[offset + 2])
        peer = _parse_addr(fields[offset + 3])
        pid = _PID.search(record)
        if local is None or peer is None:
            continue
        counters = dict((k, int(v)) for k, v in _COUNTER.findall(record))
        sockets.append(
            {
                "local": local,
                "peer": peer,
                "pid": int(pid.group(1)) if pid else None,
                "bytes_sent": counters.get("bytes_sent", 0),
                "bytes_acked": counters.get("bytes_acked", 0),
                "bytes_received": counters.get("bytes_received", 0),
            }
        )
    return sockets


def _label_sockets(sockets, task_of_pid, task_addresses):
    """(rows {local_pid, local_job, local_index, peer_job, peer_index, bytes_*}, [unknown]).

    A connection between two tasks appears once from each end. The peer of a socket is
    found by the reverse endpoint pair ((peer, local) is the other end's (local, peer)),
    which names its owning pid; sockets with an end outside the cluster are left out.
    `unknown` lists the connections to a task's server address (`task_addresses`, a set
    of (host, port)) whose owner at either end `ss` did not name: leaving one out would
    take its whole history out of a difference of two readings.
    """
    hosts = {host for host, _ in task_addresses}
    sockets = [s for s in sockets if s["local"][0] in hosts and s["peer"][0] in hosts]
    owner = {(s["local"], s["peer"]): s["pid"] for s in sockets}
    rows, unknown = [], []
    for s in sockets:
        peer_pid = owner.get((s["peer"], s["local"]))
        local = task_of_pid.get(s["pid"])
        peer = task_of_pid.get(peer_pid)
        if local is None or peer is None:
            if None in (s["pid"], peer_pid) and (
                    s["local"] in task_addresses or s["peer"] in task_addresses):
                unknown.append((s["local"], s["peer"]))
            continue
        rows.append(
            {
                "local_pid": s["pid"],
                "local_job": local[0],
                "local_index": local[1],
                "peer_job": peer[0],
                "peer_index": peer[1],
                "bytes_acked": s["bytes_acked"],
                "bytes_received": s["bytes_received"],
                "bytes_sent": s["bytes_sent"],
            }
        )
    return rows, unknown


def task_traffic(tf_config=None):
    """Bytes this process exchanged with each other task of its cluster, from `ss`.

    Call it inside a task (e.g. a MultiWorkerMirroredStrategy worker started by
    `LocalCluster.run_workers`) before and after a phase; the difference is exactly
    what that phase sent and received over TCP (TensorFlow keeps its connections open).

    Args:
      tf_config: the cluster as a `TF_CONFIG` dict; default: `$TF_CONFIG`.

    Returns:
      {(job, index): {"sent": bytes acknowledged by that task, "received": bytes
      received from it}} over the open sockets of this process.

    Raises:
      ClusterError: no TF_CONFIG, or `ss` is missing.
    """
    if tf_config is None:
        if "TF_CONFIG" not in os.environ:
            raise ClusterError("task_traffic() needs TF_CONFIG (or a tf_config argument)")
        tf_config = json.loads(os.environ["TF_CONFIG"])
    tasks = {}  # (host, port) -> (job, index)
    for job, addresses in tf_config["cluster"].items():
        for index, address in enumerate(addresses):
            host, port = address.rsplit(":", 1)
            tasks[(_numeric_host(host.strip("[]")), int(port))] = (job, index)
    # `ss` now and then lists a socket without its owner's pid; read again rather than
    # leave a connection out (which would add its whole history to a difference).
    for attempt in range(_ATTRIBUTION_ATTEMPTS):
        traffic, unknown = _traffic_of(os.getpid(), tasks)
        if not unknown:
            return traffic
        time.sleep(0.05 * (attempt + 1))
    raise ClusterError(
        f"could not tell which task is at the other end of {len(unknown)} connection(s) "
        f"to this task ({unknown[:3]}): `ss -p` did not name their processes")


_ATTRIBUTION_ATTEMPTS = 5


def _traffic_of(me, tasks):
    """({task: {"sent", "received"}}, [connections of a task address whose peer task is
    unknown]) for process `me`, from one reading of `ss`.

    A connection whose peer end is a task's address (this process dialled it) belongs to
    that task. One whose local end is a task's address (it dialled this process) belongs
    to the task whose process owns the other end; tasks on hosts of their own
    (bandwidth emulation) are known by the peer's host alone.
    """
    hosts = {host for host, _ in tasks}
    unique = {h for h in hosts if sum(1 for t in tasks if t[0] == h) == 1}
    task_of_pid = {}
    if hosts - unique:
        for s in _ss_sockets(["-l"]):
            for (host, port), task in tasks.items():
                if port == s["local"][1] and s["pid"] is not None:
                    task_of_pid[s["pid"]] = task
    sockets = _ss_sockets(["-i", "state", "established"])
    owner = {(s["local"], s["peer"]): s["pid"] for s in sockets}
    traffic, unknown = {}, []
    for s in sockets:
        if s["pid"] != me or s["peer"][0] not in hosts:
            continue
        if s["peer"][0] in unique:
            peer = next(t for a, t in tasks.items() if a[0] == s["peer"][0])
        elif s["peer"] in tasks:
            peer = tasks[s["peer"]]
        elif s["local"] in tasks:
            peer = task_of_pid.get(owner.get((s["peer"], s["local"])))
            if peer is None:
                unknown.append((s["local"], s["peer"]))
                continue
        else:
            continue  # neither end is a task's address: not a connection of the cluster
        entry = traffic.setdefault(peer, {"sent": 0, "received": 0})
        entry["sent"] += s["bytes_acked"]
        entry["received"] += s["bytes_received"]
    return traffic, unknown


# --- bandwidth emulation --------------------------------------------------------------

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$", re.I)
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_NETNS_PREFIX = "tfgc-"


def parse_rate(rate):
    """'10mbit' -> 1e7 bits per second (tc's units: bit/kbit/mbit/gbit, bps = bytes/s).

    Raises:
      ValueError: not a rate tc understands in these units, or not positive.
    """
    match = _RATE.match(str(rate).strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"bandwidth must look like '10mbit', '100mbit' or '1gbit' (tc units), got {rate!r}"
        )
    return float(match.group(1)) * _RATE_SCALE[match.group(2).lower()]


def _run(cmd):
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as error:
        raise ClusterError(
            f"`{' '.join(cmd)}` failed ({error.returncode}): {error.stderr.strip()}"
        ) from None


def emulation_unavailable():
    """Why bandwidth emulation cannot run here (a sentence), or None if it can."""
    if not sys.platform.startswith("linux"):
        return "bandwidth emulation needs Linux network namespaces"
    if os.geteuid() != 0:
        return "bandwidth emulation needs root (it creates network namespaces and tc qdiscs)"
    missing = [tool for tool in ("ip", "tc", "ss") if shutil.which(tool) is None]
    if missing:
        return (f"bandwidth emulation needs {', '.join(missing)} from iproute2 "
                "(e.g. `apt-get install -y iproute2`)")
    return None


def _free_subnet():
    """A 10.x.y.0/24 that no address or route of this namespace touches."""
    used = []
    for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
            try:
                used.append(ipaddress.ip_network(token, strict=False))
            except ValueError:
                pass
    rng = random.Random()
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{rng.randrange(200, 255)}.{rng.randrange(256)}.0/24")
        if not any(subnet.overlaps(u) for u in used if u.prefixlen > 0):
            return subnet
    raise ClusterError("found no free private /24 for the emulated network")


def _netns_list():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def remove_stale_namespaces():
    """Deletes namespaces left by launchers that were killed before they cleaned up.

    Names are "tfgc-<launcher pid>-..."; only those whose launcher is gone are removed.

    Returns:
      The names removed.
    """
    removed = []
    for name in _netns_list():
        match = re.match(rf"^{_NETNS_PREFIX}(\d+)-", name)
        if match and not _pid_alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


class _Network:
    """Network namespaces for the tasks, on a bridge, with every link shaped by tbf.

    Topology: one namespace per task with one interface, "eth0" (and lo); a "hub"
    namespace holds a bridge with the other end of each task's veth pair, and one
    more veth pair connects this (the chief's) namespace to the bridge. A tbf qdisc
    on each task's eth0 (and on the chief's link) limits what that task sends to
    `rate`, as tc on each machine's NIC does (3LC's evaluation method): a task that
    several others send to at once may receive more than `rate`. Shaping the
    receiving side too (at the bridge) would model a switch port, but without
    pushback from the senders' sockets its queue overflows, and every drop on a
    sub-millisecond RTT costs TCP a 200 ms retransmission timeout: the links would
    look several times slower than their rate.
    """

    _count = 0

    def __init__(self, rate, tasks):
        reason = emulation_unavailable()
        if reason:
            raise ClusterError(reason)
        self.rate = str(rate)
        self.bits_per_s = parse_rate(rate)
        self.tasks = list(tasks)  # [(job, index)]
        _Network._count += 1
        self.prefix = f"{_NETNS_PREFIX}{os.getpid()}-{_Network._count}"
        self.hub = f"{self.prefix}-hub"
        self.root_link = f"tfgc{random.getrandbits(24):06x}"
        self.namespaces = {}  # (job, index) -> namespace name
        self.hosts = {}  # (job, index) -> ip; ("chief", 0) is this namespace
        self._created = []

    def _tbf(self, device, netns=None):
        # Burst: at least 64 KB (one GSO super-packet), about 4 ms at line rate above that.
        # The queue only ever holds what TCP's small-queue limit lets one host's sockets
        # put in it (the sender's own qdisc pushes back), so it never drops.
        burst = max(64 * 1024, int(self.bits_per_s / 8 / 250))
        limit = min(64 << 20, max(2 << 20, int(self.bits_per_s / 8)))
        cmd = ["tc"] + (["-n", netns] if netns else [])
        _run(cmd + ["qdisc", "add", "dev", device, "root", "tbf",
                    "rate", self.rate, "burst", str(burst), "limit", str(limit)])

    def setup(self):
        """Creates and shapes everything; returns {(job, index): ip}. Undone on error."""
        remove_stale_namespaces()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return dict(self.hosts)

    def _setup(self):
        subnet = _free_subnet()
        ips = subnet.hosts()
        hub = self.hub
        _run(["ip", "netns", "add", hub])
        self._created.append(hub)
        _run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", hub, "link", "set", "br0", "up"])

        root_ip = str(next(ips))
        _run(["ip", "link", "add", self.root_link, "type", "veth",
              "peer", "name", "chief", "netns", hub])
        _run(["ip", "-n", hub, "link", "set", "chief", "master", "br0", "up"])
        _run(["ip", "addr", "add", f"{root_ip}/{subnet.prefixlen}", "dev", self.root_link])
        _run(["ip", "link", "set", self.root_link, "up"])
        self._tbf(self.root_link)
        self.hosts[("chief", 0)] = root_ip

        for k, task in enumerate(self.tasks):
            ns = f"{self.prefix}-{task[0]}{task[1]}"
            ip = str(next(ips))
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            port = f"p{k}"
            _run(["ip", "-n", hub, "link", "add", port, "type", "veth",
                  "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", hub, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/{subnet.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._tbf("eth0", ns)  # what the task sends
            self.namespaces[task] = ns
            self.hosts[task] = ip

    def teardown(self):
        """Deletes the namespaces (with their links) and the chief's link; idempotent."""
        for ns in reversed(self._created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._created = []
        # Gone with its peer in the hub namespace already; make sure.
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True, timeout=30)

    def exec_prefix(self, task):
        """Command prefix that runs a program inside `task`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[task]]


class LocalCluster:
    """A local TensorFlow cluster: ps/worker servers, or worker scripts for all-reduce.

    With `num_ps >= 1` (ParameterServerStrategy) `start()` runs one server process per
    ps and worker task and this process is the chief. With `num_ps=0`
    (MultiWorkerMirroredStrategy) no server is started: `run_workers` runs the training
    script once per worker task, and each of those processes hosts its own server.

    Args:
      num_ps: number of parameter-server tasks (0: an all-reduce cluster of workers).
      num_workers: number of worker tasks (>= 1).
      timeout_s: every server exits by itself after this many seconds, and as soon as
        this process is gone, so none outlives a crashed test.
      env: extra environment variables for the processes started, e.g.
        `{"TF_DUMP_GRAPH_PREFIX": dir, "TF_DUMP_GRAPH_NAME_FILTER": "*"}` to dump the
        graphs they run. A value of None removes the variable; "{job}" and "{index}"
        in a value become the task's job and index (e.g. a dump directory per task).
        By default they get `TF_CPP_MIN_LOG_LEVEL=2`.
      log_dir: where each task writes `<job>-<index>.log` (stdout and stderr). By
        default a temporary directory, removed when the cluster stops cleanly.
      start_timeout_s: how long to wait for all servers to listen.
      start_attempts: how many times to retry on fresh ports when a picked port was
        taken before its server could bind it.
      bandwidth: emulate links of this rate between the tasks (tc units: "10mbit",
        "100mbit", "1gbit"): each task runs in a network namespace of its own and
        addresses become the namespaces' IPs. Needs root and iproute2 (`ip`, `tc`).

    Raises:
      ValueError: bad counts or rate.
      ClusterError: (at start) bandwidth emulation asked for but not possible here.

    Use it as a context manager (or call `start()` and `stop()`). It is not reusable
    after `stop()`.
    """

    def __init__(
        self,
        num_ps=1,
        num_workers=2,
        timeout_s=600,
        env=None,
        log_dir=None,
        start_timeout_s=60,
        start_attempts=3,
        bandwidth=None,
    ):
        if num_ps < 0 or num_workers < 1:
            raise ValueError(
                f"a cluster needs at least one worker and no negative ps count, got "
                f"num_ps={num_ps}, num_workers={num_workers}"
            )
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be positive")
        if bandwidth is not None:
            parse_rate(bandwidth)  # fail early on a typo
        self.num_ps = int(num_ps)
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.start_attempts = max(1, int(start_attempts))
        self.env = dict(env or {})
        self.bandwidth = bandwidth
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir
        self._procs = {}  # (job, index) -> Popen, while running
        self._pids = {}  # job -> [pid, ...] of the last start, kept after stop()
        self._logs = {}  # (job, index) -> open file
        self._worker_procs = {}  # index -> (Popen, started, stdout, stderr) of run_workers
        self._addresses = None
        self._resolver = None
        self._net = None
        self._started = False
        self._stopped = False

    # --- lifecycle ------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        # Keep the logs of a failed run for inspection; drop them after a clean one.
        self.stop(remove_logs=exc_type is None)
        return False

    @property
    def server_jobs(self):
        """Jobs whose tasks this cluster runs as `tf.distribute.Server` processes."""
        return JOBS if self.num_ps else ()

    def start(self):
        """Starts all servers and waits until each listens on its port.

        With `num_ps=0` it only picks the workers' addresses (and builds the emulated
        network): the worker scripts start with `run_workers`.

        Raises:
          ClusterError: a task exited or did not listen in time (the message holds the
            tail of its log), or the emulated network could not be built. No process
            or namespace is left behind.
        """
        if self._started:
            raise RuntimeError("this LocalCluster was already started")
        self._started = True
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="tfgc-cluster-")
        os.makedirs(self.log_dir, exist_ok=True)
        atexit.register(self._atexit)
        try:
            if self.bandwidth is not None:
                tasks = [(job, i) for job, n in self._task_counts() for i in range(n)]
                self._net = _Network(self.bandwidth, tasks)
                self._net.setup()
            for attempt in range(1, self.start_attempts + 1):
                try:
                    self._start_once()
                    return self
                except _PortConflict as conflict:
                    self._kill_all()
                    if attempt == self.start_attempts:
                        raise ClusterError(str(conflict)) from None
                    _progress(f"a port was taken before {conflict.task} could bind it; retrying")
        except BaseException:
            self.stop(remove_logs=False)
            raise
        return self

    def _task_counts(self):
        return (("ps", self.num_ps), ("worker", self.num_workers))

    def _host(self, job, index):
        return HOST if self._net is None else self._net.hosts[(job, index)]

    def _start_once(self):
        with_chief = self.num_ps > 0
        ports = _reserve_ports(int(with_chief) + self.num_ps + self.num_workers)
        rest = iter(ports)
        addresses = {}
        if with_chief:
            addresses["chief"] = [f"{self._host('chief', 0)}:{next(rest)}"]
        for job, count in self._task_counts():
            if count:
                addresses[job] = [f"{self._host(job, i)}:{next(rest)}" for i in range(count)]
        self._addresses = addresses
        self._resolver = None
        self._pids = {job: [None] * len(addresses.get(job, ())) for job in JOBS}
        for job in self.server_jobs:
            for index in range(len(addresses[job])):
                self._spawn_server(job, index)
        self._wait_until_listening(list(self._procs))

    def _spawn_server(self, job, index):
        log = open(self.log_path(job, index), "a" if (job, index) in self._logs else "w")
        old = self._logs.pop((job, index), None)
        if old is not None:
            old.close()
        self._logs[(job, index)] = log
        prefix = self._net.exec_prefix((job, index)) if self._net else []
        self._procs[(job, index)] = subprocess.Popen(
            [
                *prefix, sys.executable, "-m", "tfgc._server",
                "--cluster-spec", json.dumps(self._addresses),
                "--job", job,
                "--index", str(index),
                "--parent-pid", str(os.getpid()),
                "--timeout", str(self.timeout_s),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._child_env(job, index),
            # Own session: a Ctrl-C in the terminal reaches only this process,
            # which then stops the servers in order.
            start_new_session=True,
        )
        self._pids[job][index] = self._procs[(job, index)].pid

    def _child_env(self, job, index):
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)  # servers get their role from the command line
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        env["PYTHONUNBUFFERED"] = "1"  # logs are read while the servers still run
        # The servers must import this very tfgc, also from an uninstalled source tree.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p
        )
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value).replace("{job}", job).replace("{index}", str(index))
        return env

    def _wait_until_listening(self, keys):
        deadline = time.monotonic() + self.start_timeout_s
        waiting = {key: self._procs[key] for key in keys}
        while waiting:
            for key, proc in list(waiting.items()):
                if proc.poll() is not None:
                    self._raise_failed(key, f"exited with code {proc.returncode} while starting")
            for key, proc in list(waiting.items()):
                host, port = self._host(*key), self._port(*key)
                listeners = self._listening_pids(key)
                if listeners is None:
                    # No ss: fall back to "something accepts connections on the port".
                    if _accepts(host, port):
                        del waiting[key]
                else:
                    owners = listeners.get(port, ())
                    # None: ss could not tell the owner (other user namespace, say).
                    if proc.pid in owners or (None in owners and _accepts(host, port)):
                        del waiting[key]
            if not waiting:
                return
            if time.monotonic() > deadline:
                key = sorted(waiting)[0]
                self._raise_failed(
                    key,
                    f"did not listen on {self._address(*key)} within "
                    f"{self.start_timeout_s:.0f} s",
                )
            time.sleep(0.1)

    def _listening_pids(self, key):
        """{port: {pid, ...}} of listening TCP sockets where task `key` runs, or None.

        Checking the owner pid (not just that the port accepts connections) catches a
        port that another program grabbed between our pick and the server's bind.
        None when ss is unavailable.
        """
        try:
            sockets = _ss_sockets(["-l"], netns=self._netns(key))
        except ClusterError:
            return None
        listeners = {}
        for s in sockets:
            listeners.setdefault(s["local"][1], set()).add(s["pid"])
        return listeners

    def _netns(self, key):
        return None if self._net is None else self._net.namespaces.get(key)

    def _raise_failed(self, key, what):
        job, index = key
        self._logs[key].flush()
        log_path = self.log_path(job, index)
        tail = _tail(log_path)
        message = (
            f"tfgc LocalCluster: task /job:{job}/task:{index} ({self._address(job, index)}) "
            f"{what}.\nLast lines of {log_path}:\n{tail}"
        )
        proc = self._procs[key]
        if proc.poll() is not None and _PORT_CONFLICT.search(tail):
            raise _PortConflict(message, task=f"/job:{job}/task:{index}")
        raise ClusterError(message)

    def stop(self, remove_logs=False, grace_s=5.0):
        """Stops every process it started (by pid), then deletes the emulated network.

        Servers get SIGTERM, and SIGKILL if still alive after `grace_s`; worker scripts
        still running get SIGKILL. All are reaped.

        Args:
          remove_logs: delete the log directory if this cluster created it.
          grace_s: how long servers get to exit after SIGTERM.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            self._kill_workers()
            self._kill_all(grace_s)
        finally:
            if self._net is not None:
                self._net.teardown()
            atexit.unregister(self._atexit)
        if remove_logs and self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _kill_all(self, grace_s=5.0):
        procs = list(self._procs.values())
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        for proc in procs:
            try:
                proc.wait(timeout=5)  # reap; SIGKILL cannot be ignored
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs.values():
            log.close()
        self._procs.clear()
        self._logs.clear()

    def _atexit(self):
        self.stop(remove_logs=False, grace_s=2.0)

    # --- one task: kill and restart (fault injection) -------------------------------

    def kill(self, job, index, sig=signal.SIGKILL):
        """Sends `sig` (default SIGKILL) to the server of task `job:index` and reaps it.

        Raises:
          ValueError: no such server task in this cluster.
        """
        proc = self._server_proc(job, index)
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def restart(self, job, index):
        """Starts task `job:index` again on its address (killing it first if it runs).

        Its log continues in the same file. TensorFlow's ClusterCoordinator notices the
        new server and resumes scheduling on it.

        Returns:
          The new server's pid.

        Raises:
          ClusterError: the new server did not come up.
        """
        self.kill(job, index)
        self._spawn_server(job, index)
        self._wait_until_listening([(job, index)])
        return self._pids[job][index]

    def _server_proc(self, job, index):
        self._require_started()
        if (job, index) not in self._procs:
            raise ValueError(
                f"no server task {job}:{index} in this cluster (servers: "
                f"{sorted(self._procs) or 'none; worker scripts run with run_workers'})"
            )
        return self._procs[(job, index)]

    # --- worker scripts (MultiWorkerMirroredStrategy) -------------------------------

    def start_workers(self, argv, env=None):
        """Starts `python <argv>` once per worker task, each with its `TF_CONFIG`.

        For clusters with `num_ps=0`; starts the cluster if needed. Each process writes
        `worker-<i>.out` / `worker-<i>.err` in `log_dir`. Use `wait_workers` to collect
        them; `socket_bytes()` reads their sockets while they run.

        Args:
          argv: the script and its arguments (run by this Python interpreter).
          env: extra environment variables for the workers (None values remove one;
            "{index}" in a value becomes the worker's index).

        Raises:
          ValueError: the cluster has parameter servers (its workers are servers).
          RuntimeError: worker scripts are already running.
        """
        if self.num_ps:
            raise ValueError(
                "run_workers/start_workers run the worker tasks as scripts (for "
                "MultiWorkerMirroredStrategy); use LocalCluster(num_ps=0, ...). With "
                "parameter servers the workers are servers and the script is the chief."
            )
        if self._worker_procs:
            raise RuntimeError("worker scripts are already running; call wait_workers()")
        if not self._started:
            self.start()
        self._require_started()
        if isinstance(argv, str):
            argv = [argv]
        for index in range(self.num_workers):
            child_env = self._child_env("worker", index)
            for key, value in (env or {}).items():
                if value is None:
                    child_env.pop(key, None)
                else:
                    child_env[key] = str(value).replace("{index}", str(index))
            child_env["TF_CONFIG"] = json.dumps(self.tf_config("worker", index))
            out_path = os.path.join(self.log_dir, f"worker-{index}.out")
            err_path = os.path.join(self.log_dir, f"worker-{index}.err")
            prefix = self._net.exec_prefix(("worker", index)) if self._net else []
            with open(out_path, "w") as out, open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [*prefix, sys.executable, *map(str, argv)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                    start_new_session=True, preexec_fn=_die_with_parent,
                )
            self._worker_procs[index] = (proc, time.monotonic(), out_path, err_path)
            self._pids["worker"][index] = proc.pid
        return [self._worker_procs[i][0].pid for i in range(self.num_workers)]

    def wait_workers(self, timeout_s=600, check=False, failure_grace_s=30.0):
        """Waits for the worker scripts; kills (SIGKILL, by pid) any left at the deadline.

        When one worker fails, the others usually block in a collective forever, so
        they are killed `failure_grace_s` after the first failure.

        Args:
          timeout_s: seconds from now before every remaining worker is killed.
          check: raise ClusterError (with the failing workers' stderr) unless all
            workers exited with 0.
          failure_grace_s: how long the others may run after a worker fails.

        Returns:
          A list of `WorkerResult`, by task index.

        Raises:
          ClusterTimeout: the deadline passed (its `results` tell what each did).
          ClusterError: with `check`, a worker failed.
        """
        if not self._worker_procs:
            raise RuntimeError("no worker scripts are running; call start_workers() first")
        deadline = time.monotonic() + timeout_s
        ended, timed_out = {}, set()
        first_failure = None
        try:
            while len(ended) < len(self._worker_procs):
                now = time.monotonic()
                for index, (proc, started, _, _) in self._worker_procs.items():
                    if index not in ended and proc.poll() is not None:
                        ended[index] = now - started
                        if proc.returncode != 0 and first_failure is None:
                            first_failure = now
                if len(ended) == len(self._worker_procs):
                    break
                late = first_failure is not None and now - first_failure > failure_grace_s
                if now > deadline or late:
                    for index, (proc, started, _, _) in self._worker_procs.items():
                        if index not in ended:
                            if now > deadline:
                                timed_out.add(index)
                            _kill_group(proc)
                            ended[index] = time.monotonic() - started
                    break
                time.sleep(0.05)
        finally:
            self._kill_workers()
        results = [
            WorkerResult(index=i, pid=proc.pid, returncode=proc.returncode,
                         stdout=_read(out), stderr=_read(err),
                         stdout_path=out, stderr_path=err, duration_s=ended.get(i, 0.0),
                         timed_out=i in timed_out)
            for i, (proc, _, out, err) in sorted(self._worker_procs.items())
        ]
        self._worker_procs = {}
        if timed_out:
            raise ClusterTimeout(
                f"worker(s) {sorted(timed_out)} still ran after {timeout_s:.0f} s and were "
                f"killed.\n" + _describe(results), results,
            )
        if check and any(r.returncode != 0 for r in results):
            raise ClusterError("worker script(s) failed.\n" + _describe(results))
        return results

    def run_workers(self, argv, timeout_s=600, env=None, check=False):
        """Runs `python <argv>` as every worker task (each with its `TF_CONFIG`) and waits.

        For MultiWorkerMirroredStrategy clusters (`num_ps=0`): every worker runs the
        script, which builds the strategy from `TF_CONFIG` and hosts its own server.
        Starts the cluster if it is not started; every process is killed (by pid) on
        timeout or error.

        Args:
          argv: the script and its arguments, e.g. `["train.py", "--epochs", "1"]`.
          timeout_s: time limit for all workers together.
          env: extra environment variables for the workers.
          check: raise ClusterError unless every worker exits with 0.

        Returns:
          A list of `WorkerResult` (returncode, stdout, stderr, log paths) by index.

        Raises:
          ClusterTimeout: a worker ran past `timeout_s` (all were killed).
          ClusterError: with `check`, a worker failed.
        """
        self.start_workers(argv, env=env)
        return self.wait_workers(timeout_s=timeout_s, check=check)

    def _kill_workers(self):
        for proc, _, _, _ in self._worker_procs.values():
            if proc.poll() is None:
                _kill_group(proc)

    # --- what the cluster looks like ------------------------------------------------

    def _require_started(self):
        if self._addresses is None:
            raise RuntimeError("the cluster is not started; use `with LocalCluster(...) as c:`")

    @property
    def addresses(self):
        """{"chief": [...], "ps": ["host:port", ...], "worker": [...]} (no chief or ps
        entry when num_ps=0)."""
        self._require_started()
        return {job: list(addrs) for job, addrs in self._addresses.items()}

    def _address(self, job, index):
        return self._addresses[job][index]

    def _port(self, job, index):
        return int(self._address(job, index).rsplit(":", 1)[1])

    @property
    def cluster_spec(self):
        """A `tf.train.ClusterSpec` of `addresses`."""
        import tensorflow as tf

        self._require_started()
        return tf.train.ClusterSpec(self.addresses)

    @property
    def resolver(self):
        """A cluster resolver for ParameterServerStrategy in this (the chief) process."""
        import tensorflow as tf

        self._require_started()
        if "chief" not in self._addresses:
            raise RuntimeError("a cluster without parameter servers has no chief; use run_workers")
        if self._resolver is None:
            self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                self.cluster_spec, task_type="chief", task_id=0, rpc_layer="grpc"
            )
        return self._resolver

    def tf_config(self, task_type, index=0):
        """The `TF_CONFIG` dict for one task (json.dumps it into the environment)."""
        self._require_started()
        if task_type not in self._addresses or not 0 <= index < len(self._addresses[task_type]):
            raise ValueError(
                f"no task {task_type}:{index} in this cluster "
                f"({', '.join(f'{j}: {len(a)}' for j, a in self._addresses.items())})"
            )
        return {"cluster": self.addresses, "task": {"type": task_type, "index": int(index)}}

    @property
    def pids(self):
        """{"ps": [pid, ...], "worker": [pid, ...]} of the processes of each task.

        The current (or last) process of each task: a restarted task's new pid, a worker
        script's pid once started (None before). Still available after `stop()`.
        """
        self._require_started()
        return {job: list(pids) for job, pids in self._pids.items()}

    def log_path(self, job, index):
        """Path of the log file of server task `job:index`."""
        return os.path.join(self.log_dir, f"{job}-{index}.log")

    def check_alive(self):
        """Raises ClusterError (with its log tail) if any server has exited."""
        for key, proc in sorted(self._procs.items()):
            if proc.poll() is not None:
                self._raise_failed(key, f"exited with code {proc.returncode}")

    # --- bytes on the wire ----------------------------------------------------------

    def _tasks_by_pid(self, chief_pid=None):
        tasks = {}
        if "chief" in self._addresses:
            tasks[os.getpid() if chief_pid is None else chief_pid] = ("chief", 0)
        for job, pids in self.pids.items():
            for index, pid in enumerate(pids):
                if pid is not None:
                    tasks[pid] = (job, index)
        return tasks

    def _task_addresses(self):
        """{(numeric host, port)} of every task's server."""
        addresses = set()
        for addrs in self._addresses.values():
            for address in addrs:
                host, port = address.rsplit(":", 1)
                addresses.add((_numeric_host(host.strip("[]")), int(port)))
        return addresses

    def socket_bytes(self, chief_pid=None):
        """Exact TCP byte counters of every connection between two cluster processes.

        Reads `ss -tinp` (in each task's namespace under bandwidth emulation): each
        established socket with its owning pid and the kernel's counters. A connection
        appears twice, once from each end. Sockets whose other end is not a process of
        this cluster are left out. Works for ps/worker servers, the chief, and worker
        scripts while they run.

        Args:
          chief_pid: pid of the coordinator process (default: this process).

        Returns:
          A list of dicts {local_pid, local_job, local_index, peer_job, peer_index,
          bytes_acked, bytes_received, bytes_sent}: bytes_acked are the bytes sent by
          the local end and acknowledged by the peer (the kernel counts the connecting
          end's SYN as 1 more), bytes_received those it received, bytes_sent what it
          sent including retransmissions.
          Counters are cumulative over the life of a socket; TensorFlow keeps its gRPC
          connections open, so differences between two calls measure a phase.
        """
        self._require_started()
        args = ["-i", "state", "established"]
        task_of_pid = self._tasks_by_pid(chief_pid)
        addresses = self._task_addresses()
        for attempt in range(_ATTRIBUTION_ATTEMPTS):
            sockets = _ss_sockets(args)
            if self._net is not None:
                for ns in self._net.namespaces.values():
                    sockets += _ss_sockets(args, netns=ns)
            rows, unknown = _label_sockets(sockets, task_of_pid, addresses)
            if not unknown:
                return rows
            time.sleep(0.05 * (attempt + 1))  # `ss -p` missed an owner: read again
        raise ClusterError(
            f"could not tell which processes own {len(unknown)} connection(s) between "
            f"cluster tasks ({unknown[:3]}): `ss -p` did not name them")

    def traffic_between(self, src_job, dst_job, chief_pid=None, rows=None):
        """Total bytes sent from the tasks of `src_job` to the tasks of `dst_job`.

        Args:
          src_job, dst_job: "chief", "ps" or "worker".
          chief_pid: pid of the coordinator process (default: this process).
          rows: a `socket_bytes()` result to use instead of reading `ss` again.
        """
        for job in (src_job, dst_job):
            if job not in ("chief",) + JOBS:
                raise ValueError(f"unknown job {job!r}; expected 'chief', 'ps' or 'worker'")
        if rows is None:
            rows = self.socket_bytes(chief_pid)
        return sum(
            r["bytes_acked"] for r in rows if r["local_job"] == src_job and r["peer_job"] == dst_job
        )

    def traffic_summary(self, chief_pid=None, rows=None):
        """{(src_job, dst_job): bytes sent} for every pair of jobs that exchanged bytes."""
        if rows is None:
            rows = self.socket_bytes(chief_pid)
        summary = {}
        for r in rows:
            key = (r["local_job"], r["peer_job"])
            summary[key] = summary.get(key, 0) + r["bytes_acked"]
        return summary


def _kill_group(proc):
    """SIGKILLs `proc` and the process group it leads (a script's own children too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session/group id is its pid
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _describe(results):
    lines = []
    for r in results:
        state = "timed out" if r.timed_out else f"exit {r.returncode}"
        lines.append(f"worker {r.index} (pid {r.pid}): {state}, {r.duration_s:.1f} s; "
                     f"stderr {r.stderr_path}")
        if r.returncode != 0:
            lines.append("  " + _tail(r.stderr_path, 15).replace("\n", "\n  "))
    return "\n".join(lines)


class _PortConflict(ClusterError):
    def __init__(self, message, task):
        super().__init__(message)
        self.task = task


def _accepts(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _progress(message):
    print(f"[tfgc.cluster] {message}", file=sys.stderr, flush=True)


# --- command line ---------------------------------------------------------------------


def _format_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000.0


def _run_script(path, args):
    """Runs a Python script in this process as __main__; returns its exit code.

    In-process (not a subprocess) so that the coordinator's sockets belong to this
    process and are still open when the traffic summary reads them.
    """
    import runpy
    import traceback

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.stdout.flush()


def _print_summary(summary, jobs, note=""):
    _progress(f"traffic (TCP bytes sent, from `ss -tinp`{note}):")
    for src, dst in [(a, b) for a in jobs for b in jobs]:
        nbytes = summary.get((src, dst), 0)
        if nbytes or src != dst:
            _progress(f"  {src:>6} -> {dst:<6} {nbytes:>14,d} B  ({_format_bytes(nbytes)})")


def _main_mwms(c, args):
    """Runs the script as every worker; samples socket counters while they run."""
    c.start_workers([args.script, *args.script_args])
    for index, (addr, pid) in enumerate(zip(c.addresses["worker"], c.pids["worker"])):
        _progress(f"  /job:worker/task:{index}  {addr}  pid {pid}")
    # Sockets vanish with their process: keep, per pair of processes, the largest
    # total seen. The result misses at most the last second before each exit.
    best = {}
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        running = any(p.poll() is None for p, _, _, _ in c._worker_procs.values())
        try:
            totals = {}
            for r in c.socket_bytes():
                key = (r["local_pid"], r["local_job"], r["peer_job"], r["peer_index"])
                totals[key] = totals.get(key, 0) + r["bytes_acked"]
            for key, value in totals.items():
                best[key] = max(best.get(key, 0), value)
        except ClusterError:
            pass
        if not running:
            break
        time.sleep(1.0)
    try:
        results = c.wait_workers(timeout_s=max(1.0, deadline - time.monotonic()))
    except ClusterTimeout as timeout:
        _progress(str(timeout))
        results = timeout.results
    for r in results:
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(f"--- worker {r.index} stderr (exit {r.returncode}) ---\n")
            sys.stderr.write(_tail(r.stderr_path) + "\n")
    sys.stdout.flush()
    if best:
        summary = {}
        for (_, src, dst, _), value in best.items():
            summary[(src, dst)] = summary.get((src, dst), 0) + value
        _print_summary(summary, ("worker",), ", sampled each second")
    codes = [r.returncode for r in results]
    _progress(f"worker exit codes {codes}; logs in {c.log_dir}")
    return next((code for code in codes if code != 0), 0)


def main(argv=None):
    """`python -m tfgc.cluster [--ps N] --workers M [--mwms] [--bandwidth R] -- script.py [args]`.

    Parameter-server mode (default): starts a LocalCluster, runs the script as the
    coordinator (task chief:0, via `TF_CONFIG`), prints the addresses and a per-job-pair
    traffic summary to stderr, stops the cluster and returns the script's exit code.

    `--mwms`: no parameter servers; runs the script once per worker (each with its
    `TF_CONFIG`, for MultiWorkerMirroredStrategy), prints their output, and returns
    the first non-zero worker exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfgc.cluster",
        description="Run a script on a local TensorFlow cluster (parameter servers, or "
        "all-reduce workers with --mwms).",
    )
    parser.add_argument("--ps", type=int, default=None,
                        help="parameter servers (default 1; 0 with --mwms)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--mwms", action="store_true",
                        help="run the script as every worker (MultiWorkerMirroredStrategy)")
    parser.add_argument("--bandwidth", default=None, metavar="RATE",
                        help="emulate links of this rate, e.g. 10mbit (root, iproute2)")
    parser.add_argument(
        "--timeout", type=float, default=600, help="processes end after this many seconds"
    )
    parser.add_argument("--log-dir", default=None, help="per-task logs (default: a temp dir)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment for the tasks (repeatable)",
    )
    parser.add_argument("script", help="Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)

    if args.mwms and args.ps:
        parser.error("--mwms runs workers only; drop --ps")
    num_ps = 0 if args.mwms else (1 if args.ps is None else args.ps)
    if not args.mwms and num_ps < 1:
        parser.error("a parameter-server cluster needs --ps >= 1 (or use --mwms)")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    if not os.path.isfile(args.script):
        parser.error(f"no such script: {args.script}")
    if args.bandwidth is not None:
        try:
            parse_rate(args.bandwidth)
        except ValueError as error:
            parser.error(str(error))
        reason = emulation_unavailable()
        if reason:
            parser.error(reason)

    # SIGTERM would otherwise kill us without cleanup (the servers' watchdogs would
    # still end them, half a second later); make it a normal exit instead.
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:  # not the main thread: leave signals alone
        pass

    started = time.monotonic()
    with LocalCluster(
        num_ps=num_ps, num_workers=args.workers, timeout_s=args.timeout, env=env,
        log_dir=args.log_dir, bandwidth=args.bandwidth,
    ) as c:
        shaped = f", links shaped to {args.bandwidth}" if args.bandwidth else ""
        _progress(f"cluster up in {time.monotonic() - started:.1f} s{shaped}; logs in {c.log_dir}")
        if args.mwms:
            return _main_mwms(c, args)
        for job in ("chief", "ps", "worker"):
            pids = [os.getpid()] if job == "chief" else c.pids[job]
            for index, (addr, pid) in enumerate(zip(c.addresses[job], pids)):
                _progress(f"  /job:{job}/task:{index}  {addr}  pid {pid}")
        os.environ["TF_CONFIG"] = json.dumps(c.tf_config("chief", 0))
        _progress(f"running {args.script} as /job:chief/task:0")
        code = _run_script(args.script, args.script_args)
        # Free the script's tf.functions while the servers still run: TensorFlow
        # unregisters each one on every task, and logs an error per function and
        # task if that happens at interpreter exit, after the servers are gone.
        gc.collect()
        try:
            _print_summary(c.traffic_summary(), ("chief", "ps", "worker"))
        except ClusterError as error:
            _progress(f"no traffic summary: {error}")
        _progress(f"script exited with code {code}; stopping the cluster")
    return code


if __name__ == "__main__":
    sys.exit(main())
