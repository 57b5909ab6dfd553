"""What crossed each connection of a cluster, from the kernel's TCP counters (`ss`).

`ss -tinp` (iproute2) lists every established socket with its owning pid and its
counters (bytes acknowledged by the peer, received, sent). A connection between two
tasks appears once from each end; the other end's owner names the peer task. The
counters are cumulative over a socket's life and TensorFlow keeps its gRPC connections
open, so the difference of two readings is exactly what a phase sent.
"""
import ipaddress
import json
import os
import re
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from tfgc.cluster.processes import JOBS, ClusterError

if TYPE_CHECKING:
    from tfgc.cluster.netem import EmulatedNetwork

_PID = re.compile(r"pid=(\d+)")
_COUNTER = re.compile(r"\b(bytes_sent|bytes_acked|bytes_received):(\d+)")


def parse_address(text: str) -> Optional[tuple[str, Optional[int]]]:
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


def numeric_host(host: str) -> str:
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


def run_ss(args: Sequence[str], netns: Optional[str] = None) -> str:
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


def ss_sockets(extra_args: Sequence[str], netns: Optional[str] = None) -> list[dict[str, Any]]:
    """Every socket `ss -H -tnp [extra]` lists, read until two listings agree.

    The kernel dumps its socket table in several batches while sockets keep opening and
    closing, so one listing may miss a socket or list one twice; a socket missing from
    one reading and present in the next would add its whole history to a difference
    of two readings. So the table is read until two consecutive listings hold the same
    sockets (at most `_SS_READS` times), and each socket keeps its largest counters.

    Args and return value: as `ss_listing`.
    """
    merged: dict[tuple[Any, Any], dict[str, Any]]
    merged, previous = {}, None
    for _ in range(_SS_READS):
        listing = {(s["local"], s["peer"]): s for s in ss_listing(extra_args, netns)}
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


def ss_listing(extra_args: Sequence[str], netns: Optional[str] = None) -> list[dict[str, Any]]:
    """Parses `ss -H -tnp [extra] ...` into dicts {local, peer, pid, bytes_acked, ...}.

    With -i, ss prints each socket's counters on a continuation line that starts
    with whitespace; they are folded into the socket line before parsing.

    Args:
      extra_args: more arguments for ss (e.g. a state filter).
      netns: read the sockets of this named network namespace (default: this one).
    """
    if netns is None:
        output = run_ss(["-t", "-n", "-p", *extra_args])
    else:
        output = run_ss(["-t", "-n", "-p", *extra_args], netns=netns)
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
        local = parse_address(fields[offset + 2])
        peer = parse_address(fields[offset + 3])
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


def label_sockets(
    sockets: Sequence[Mapping[str, Any]],
    task_of_pid: Mapping[Optional[int], tuple[str, int]],
    task_addresses: set[tuple[str, int]],
) -> tuple[list[dict[str, Any]],
           list[tuple[tuple[str, Optional[int]], tuple[str, Optional[int]]]]]:
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
                "local": s["local"],
                "peer": s["peer"],
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


def task_traffic(tf_config: Optional[Mapping[str, Any]] = None, pid: Optional[int] = None,
                 netns: Optional[str] = None) -> dict[tuple[str, int], dict[str, int]]:
    """Bytes a task's process exchanged with each other task of its cluster, from `ss`.

    Call it inside a task (e.g. a MultiWorkerMirroredStrategy worker started by
    `LocalCluster.run_workers`) before and after a phase; the difference is exactly
    what that phase sent and received over TCP (TensorFlow keeps its connections open).
    With `pid` and `netns` it reads another process's connections from outside, e.g.
    a task that runs in a namespace of `netem.EmulatedNetwork` (root only).

    Args:
      tf_config: the cluster as a `TF_CONFIG` dict; default: `$TF_CONFIG`.
      pid: the task's process; default: this process.
      netns: the named network namespace that process runs in; default: this one.

    Returns:
      {(job, index): {"sent": bytes acknowledged by that task, "received": bytes
      received from it}} over the open sockets of the process.

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
            tasks[(numeric_host(host.strip("[]")), int(port))] = (job, index)
    # `ss` now and then lists a socket without its owner's pid; read again rather than
    # leave a connection out (which would add its whole history to a difference).
    for attempt in range(_ATTRIBUTION_ATTEMPTS):
        traffic, unknown = _traffic_of(os.getpid() if pid is None else pid, tasks, netns)
        if not unknown:
            return traffic
        time.sleep(0.05 * (attempt + 1))
    raise ClusterError(
        f"could not tell which task is at the other end of {len(unknown)} connection(s) "
        f"to this task ({unknown[:3]}): `ss -p` did not name their processes")


_ATTRIBUTION_ATTEMPTS = 5


def _traffic_of(me, tasks, netns=None):
    """({task: {"sent", "received"}}, [connections of a task address whose peer task is
    unknown]) for process `me` (in namespace `netns`), from one reading of `ss`.

    A connection whose peer end is a task's address (this process dialled it) belongs to
    that task. One whose local end is a task's address (it dialled this process) belongs
    to the task whose process owns the other end; tasks on hosts of their own
    (bandwidth emulation) are known by the peer's host alone.
    """
    hosts = {host for host, _ in tasks}
    unique = {h for h in hosts if sum(1 for t in tasks if t[0] == h) == 1}
    task_of_pid = {}
    if hosts - unique:
        for s in ss_sockets(["-l"], netns):
            for (host, port), task in tasks.items():
                if port == s["local"][1] and s["pid"] is not None:
                    task_of_pid[s["pid"]] = task
    sockets = ss_sockets(["-i", "state", "established"], netns)
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


class SocketCounters:
    """`LocalCluster`'s view of its own connections (a mixin: it reads the cluster's
    addresses, pids and emulated network)."""

    if TYPE_CHECKING:  # what the cluster that mixes it in provides
        _addresses: Optional[dict[str, list[str]]]
        _net: Optional[EmulatedNetwork]

        @property
        def pids(self) -> dict[str, list[Optional[int]]]: ...

        def _require_started(self) -> None: ...

    def _tasks_by_pid(self, chief_pid=None):
        tasks = {}
        if "chief" in self._addresses:
            tasks[os.getpid() if chief_pid is None else chief_pid] = ("chief", 0)
        for job, pids in self.pids.items():
            for index, pid in enumerate(pids):
                if pid is not None:
                    tasks[pid] = (job, index)
        return tasks

    def _task_addresses(self, jobs=None):
        """{(numeric host, port)} of every task's server (of `jobs`' tasks: default all)."""
        addresses = set()
        for job, addrs in self._addresses.items():
            if jobs is not None and job not in jobs:
                continue
            for address in addrs:
                host, port = address.rsplit(":", 1)
                addresses.add((numeric_host(host.strip("[]")), int(port)))
        return addresses

    def socket_bytes(self, chief_pid: Optional[int] = None) -> list[dict[str, Any]]:
        """Exact TCP byte counters of every connection between two cluster processes.

        Reads `ss -tinp` (in each task's namespace under bandwidth emulation): each
        established socket with its owning pid and the kernel's counters. A connection
        appears twice, once from each end. Sockets whose other end is not a process of
        this cluster are left out. Works for ps/worker servers, the chief, and worker
        scripts while they run.

        Args:
          chief_pid: pid of the coordinator process (default: this process).

        Returns:
          A list of dicts {local, peer (the (host, port) of each end), local_pid,
          local_job, local_index, peer_job, peer_index, bytes_acked, bytes_received,
          bytes_sent}: bytes_acked are the bytes sent by
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
            sockets = ss_sockets(args)
            if self._net is not None:
                for ns in self._net.namespaces.values():
                    sockets += ss_sockets(args, netns=ns)
            rows, unknown = label_sockets(sockets, task_of_pid, addresses)
            if not unknown:
                return rows
            time.sleep(0.05 * (attempt + 1))  # `ss -p` missed an owner: read again
        raise ClusterError(
            f"could not tell which processes own {len(unknown)} connection(s) between "
            f"cluster tasks ({unknown[:3]}): `ss -p` did not name them")

    def settled_socket_bytes(self, chief_pid: Optional[int] = None, quiet_s: float = 1.0,
                             tolerance_bytes: int = 1024,
                             timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """`socket_bytes()` once the cluster's traffic has stopped moving.

        Under ParameterServerStrategy a step's closure can return, and `model.fit` with
        it, while the parameter server's part of the step is still receiving its
        tensors: a reading right after `fit` may miss the last step's bytes, which
        then count in the next phase. This reads every `quiet_s / 2` until the bytes
        between tasks grew by at most `tolerance_bytes` (health checks and keepalive
        pings, ~100 B/s) over `quiet_s`.

        Raises:
          ClusterError: the traffic did not settle within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        history = []  # (time, total bytes, rows)
        while True:
            rows = self.socket_bytes(chief_pid)
            now = time.monotonic()
            history.append((now, sum(r["bytes_received"] for r in rows), rows))
            early = [h for h in history if h[0] <= now - quiet_s]
            if early and history[-1][1] - early[-1][1] <= tolerance_bytes:
                return rows
            if now > deadline:
                raise ClusterError(f"the cluster's traffic did not settle within {timeout_s:.0f} s")
            time.sleep(quiet_s / 2)

    def traffic_between(self, src_job: str, dst_job: str, chief_pid: Optional[int] = None,
                        rows: Optional[Sequence[Mapping[str, Any]]] = None) -> int:
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

    def traffic_summary(self, chief_pid: Optional[int] = None,
                        rows: Optional[Sequence[Mapping[str, Any]]] = None
                        ) -> dict[tuple[str, str], int]:
        """{(src_job, dst_job): bytes sent} for every pair of jobs that exchanged bytes."""
        if rows is None:
            rows = self.socket_bytes(chief_pid)
        summary: dict[tuple[str, str], int] = {}
        for r in rows:
            key = (r["local_job"], r["peer_job"])
            summary[key] = summary.get(key, 0) + r["bytes_acked"]
        return summary
