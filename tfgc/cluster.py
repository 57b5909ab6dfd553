"""A real local TensorFlow cluster on 127.0.0.1, for tests, demos and users.

`LocalCluster` starts every ps and worker task as its own `tf.distribute.Server`
process (`python -m tfgc._server`, which imports tfgc first so that tfgc's ops run on
a parameter server), waits until each one listens, and stops them all on exit. The
process that uses the cluster is the "chief" (the ParameterServerStrategy coordinator):

    from tfgc import cluster
    with cluster.LocalCluster(num_ps=1, num_workers=2) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        ...
        print(c.traffic_between("worker", "ps"))   # exact TCP bytes, from `ss -tinp`

Or from a shell, running a script as the coordinator (it reads `TF_CONFIG`):

    python -m tfgc.cluster --ps 1 --workers 2 -- train.py --epochs 1

Bytes are read from the kernel's per-socket TCP counters (`ss -tinp`, iproute2), which
count exactly what crossed each connection between two of the cluster's processes and
nothing else. TensorFlow 2.21's gRPC server listens on the wildcard address (it
hard-codes "[::]:port" / "0.0.0.0:port"), but every address in the cluster spec, and
so every connection, is 127.0.0.1.

Creating a ParameterServerStrategy changes the eager context of its process for good
(its local device becomes /job:chief/task:0 and resources made before, under
/job:localhost, can no longer be used). Run the coordinator in a process of its own
(e.g. through the command line above), not inside a test runner shared with other
tests.
"""
import argparse
import atexit
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

__all__ = ["LocalCluster", "ClusterError", "main"]

HOST = "127.0.0.1"
JOBS = ("ps", "worker")
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOG_TAIL_LINES = 40
# Failures that mean "the port we picked was taken meanwhile": worth a retry on new ports.
_PORT_CONFLICT = re.compile(
    r"Address already in use|Could not start gRPC server|Failed to add .* listener", re.I
)


class ClusterError(RuntimeError):
    """A task of a LocalCluster failed to start or died."""


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


def _run_ss(args):
    try:
        result = subprocess.run(
            ["ss", "-H", *args], capture_output=True, text=True, timeout=10, check=True
        )
    except FileNotFoundError as error:
        raise ClusterError("`ss` (iproute2) is needed to read socket counters") from error
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise ClusterError(f"`ss {' '.join(args)}` failed: {error}") from error
    return result.stdout


def _ss_sockets(extra_args):
    """Parses `ss -H -tnp [extra] ...` into dicts {local, peer, pid, bytes_acked, ...}.

    With -i, ss prints each socket's counters on a continuation line that starts
    with whitespace; they are folded into the socket line before parsing.
    """
    records, current = [], None
    for line in _run_ss(["-t", "-n", "-p", *extra_args]).splitlines():
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


class LocalCluster:
    """Starts ps and worker servers as local processes; this process is the chief.

    Args:
      num_ps: number of parameter-server tasks (>= 1).
      num_workers: number of worker tasks (>= 1).
      timeout_s: every server exits by itself after this many seconds, and as soon as
        this process is gone, so none outlives a crashed test.
      env: extra environment variables for the server processes, e.g.
        `{"TF_DUMP_GRAPH_PREFIX": dir, "TF_DUMP_GRAPH_NAME_FILTER": "*"}` to dump the
        graphs they run. A value of None removes the variable. By default the servers
        get `TF_CPP_MIN_LOG_LEVEL=2`.
      log_dir: where each task writes `<job>-<index>.log` (stdout and stderr). By
        default a temporary directory, removed when the cluster stops cleanly.
      start_timeout_s: how long to wait for all servers to listen.
      start_attempts: how many times to retry on fresh ports when a picked port was
        taken before its server could bind it.

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
    ):
        if num_ps < 1 or num_workers < 1:
            raise ValueError(
                f"a cluster needs at least one ps and one worker, got num_ps={num_ps}, "
                f"num_workers={num_workers}"
            )
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be positive")
        self.num_ps = int(num_ps)
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.start_attempts = max(1, int(start_attempts))
        self.env = dict(env or {})
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir
        self._procs = {}  # (job, index) -> Popen, while running
        self._pids = {}  # job -> [pid, ...] of the last start, kept after stop()
        self._logs = {}  # (job, index) -> open file
        self._addresses = None
        self._resolver = None
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

    def start(self):
        """Starts all servers and waits until each listens on its port.

        Raises:
          ClusterError: a task exited or did not listen in time; the message holds the
            tail of its log. No process is left behind.
        """
        if self._started:
            raise RuntimeError("this LocalCluster was already started")
        self._started = True
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="tfgc-cluster-")
        os.makedirs(self.log_dir, exist_ok=True)
        atexit.register(self._atexit)
        try:
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

    def _start_once(self):
        ports = _reserve_ports(1 + self.num_ps + self.num_workers)
        addresses = {"chief": [f"{HOST}:{ports[0]}"]}
        rest = iter(ports[1:])
        for job, count in (("ps", self.num_ps), ("worker", self.num_workers)):
            addresses[job] = [f"{HOST}:{next(rest)}" for _ in range(count)]
        self._addresses = addresses
        self._resolver = None

        cluster_json = json.dumps(addresses)
        child_env = self._child_env()
        for job in JOBS:
            for index in range(len(addresses[job])):
                log_path = self.log_path(job, index)
                log = open(log_path, "w")
                self._logs[(job, index)] = log
                self._procs[(job, index)] = subprocess.Popen(
                    [
                        sys.executable, "-m", "tfgc._server",
                        "--cluster-spec", cluster_json,
                        "--job", job,
                        "--index", str(index),
                        "--parent-pid", str(os.getpid()),
                        "--timeout", str(self.timeout_s),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    # Own session: a Ctrl-C in the terminal reaches only this process,
                    # which then stops the servers in order.
                    start_new_session=True,
                )
        self._pids = {
            job: [self._procs[(job, i)].pid for i in range(len(addresses[job]))] for job in JOBS
        }
        self._wait_until_listening()

    def _child_env(self):
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
                env[key] = str(value)
        return env

    def _wait_until_listening(self):
        deadline = time.monotonic() + self.start_timeout_s
        waiting = dict(self._procs)
        while waiting:
            for key, proc in list(waiting.items()):
                if proc.poll() is not None:
                    self._raise_failed(key, f"exited with code {proc.returncode} while starting")
            listeners = self._listening_pids()
            for key, proc in list(waiting.items()):
                port = self._port(*key)
                if listeners is None:
                    # No ss: fall back to "something accepts connections on the port".
                    if _accepts(port):
                        del waiting[key]
                else:
                    owners = listeners.get(port, ())
                    # None: ss could not tell the owner (other user namespace, say).
                    if proc.pid in owners or (None in owners and _accepts(port)):
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

    def _listening_pids(self):
        """{port: {pid, ...}} of listening TCP sockets, or None when ss is unavailable.

        Checking the owner pid (not just that the port accepts connections) catches a
        port that another program grabbed between our pick and the server's bind.
        """
        try:
            sockets = _ss_sockets(["-l"])
        except ClusterError:
            return None
        listeners = {}
        for s in sockets:
            listeners.setdefault(s["local"][1], set()).add(s["pid"])
        return listeners

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
        """Terminates every server, SIGKILLs any still alive after `grace_s`, reaps all.

        Args:
          remove_logs: delete the log directory if this cluster created it.
          grace_s: how long servers get to exit after SIGTERM.
        """
        if self._stopped:
            return
        self._stopped = True
        self._kill_all(grace_s)
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

    # --- what the cluster looks like ------------------------------------------------

    def _require_started(self):
        if self._addresses is None:
            raise RuntimeError("the cluster is not started; use `with LocalCluster(...) as c:`")

    @property
    def addresses(self):
        """{"ps": ["127.0.0.1:port", ...], "worker": [...], "chief": [...]}."""
        self._require_started()
        return {job: list(addrs) for job, addrs in self._addresses.items()}

    def _address(self, job, index):
        return self._addresses[job][index]

    def _port(self, job, index):
        return int(self._address(job, index).rsplit(":", 1)[1])

    @property
    def cluster_spec(self):
        """A `tf.train.ClusterSpec` with jobs "chief", "ps" and "worker"."""
        self._require_started()
        return tf.train.ClusterSpec(self.addresses)

    @property
    def resolver(self):
        """A cluster resolver for ParameterServerStrategy in this (the chief) process."""
        self._require_started()
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
        """{"ps": [pid, ...], "worker": [pid, ...]} of the server processes.

        Still available after `stop()`, e.g. to check that they are gone.
        """
        self._require_started()
        return {job: list(pids) for job, pids in self._pids.items()}

    def log_path(self, job, index):
        """Path of the log file of task `job:index`."""
        return os.path.join(self.log_dir, f"{job}-{index}.log")

    def check_alive(self):
        """Raises ClusterError (with its log tail) if any server has exited."""
        for key, proc in sorted(self._procs.items()):
            if proc.poll() is not None:
                self._raise_failed(key, f"exited with code {proc.returncode}")

    # --- bytes on the wire ----------------------------------------------------------

    def _tasks_by_pid(self, chief_pid=None):
        tasks = {os.getpid() if chief_pid is None else chief_pid: ("chief", 0)}
        for job, pids in self.pids.items():
            for index, pid in enumerate(pids):
                tasks[pid] = (job, index)
        return tasks

    def socket_bytes(self, chief_pid=None):
        """Exact TCP byte counters of every connection between two cluster processes.

        Reads `ss -tinp`: each established socket with its owning pid and the kernel's
        counters. A connection appears twice, once from each end. Sockets whose other
        end is not a process of this cluster are left out.

        Args:
          chief_pid: pid of the coordinator process (default: this process).

        Returns:
          A list of dicts {local_pid, local_job, local_index, peer_job, peer_index,
          bytes_acked, bytes_received, bytes_sent}: bytes_acked are the bytes sent by
          the local end and acknowledged by the peer (the kernel counts the connecting
          end's SYN as 1 more), bytes_received those it received, bytes_sent what it
          sent including retransmissions (none on loopback).
          Counters are cumulative over the life of a socket; TensorFlow keeps its gRPC
          connections open, so differences between two calls measure a phase.
        """
        self._require_started()
        tasks = self._tasks_by_pid(chief_pid)
        sockets = [
            s
            for s in _ss_sockets(["-i", "state", "established"])
            if s["local"][0] == HOST and s["peer"][0] == HOST
        ]
        # On loopback the two ends of a connection are (a -> b) and (b -> a): the
        # reverse lookup gives the peer's pid even when neither port is a listener.
        owner = {(s["local"][1], s["peer"][1]): s["pid"] for s in sockets}
        rows = []
        for s in sockets:
            local = tasks.get(s["pid"])
            peer = tasks.get(owner.get((s["peer"][1], s["local"][1])))
            if local is None or peer is None:
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
        return rows

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

    def traffic_summary(self, chief_pid=None):
        """{(src_job, dst_job): bytes sent} for every pair of jobs that exchanged bytes."""
        rows = self.socket_bytes(chief_pid)
        summary = {}
        for r in rows:
            key = (r["local_job"], r["peer_job"])
            summary[key] = summary.get(key, 0) + r["bytes_acked"]
        return summary


class _PortConflict(ClusterError):
    def __init__(self, message, task):
        super().__init__(message)
        self.task = task


def _accepts(port):
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
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


def main(argv=None):
    """`python -m tfgc.cluster --ps N --workers M [--timeout S] -- script.py [args...]`.

    Starts a LocalCluster, runs the script as the coordinator (task chief:0, via
    `TF_CONFIG`), prints the addresses and a per-job-pair traffic summary to stderr,
    stops the cluster and returns the script's exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfgc.cluster",
        description="Run a script as the coordinator of a local TensorFlow PS cluster.",
    )
    parser.add_argument("--ps", type=int, default=1, help="parameter servers (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=600, help="servers exit after this many seconds"
    )
    parser.add_argument("--log-dir", default=None, help="per-task logs (default: a temp dir)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment for the servers (repeatable)",
    )
    parser.add_argument("script", help="Python script to run as the coordinator")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)

    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--env expects KEY=VALUE, got {item!r}")
        env[key] = value
    if not os.path.isfile(args.script):
        parser.error(f"no such script: {args.script}")

    # SIGTERM would otherwise kill us without cleanup (the servers' watchdogs would
    # still end them, half a second later); make it a normal exit instead.
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:  # not the main thread: leave signals alone
        pass

    started = time.monotonic()
    with LocalCluster(
        num_ps=args.ps, num_workers=args.workers, timeout_s=args.timeout, env=env,
        log_dir=args.log_dir,
    ) as c:
        _progress(f"cluster up in {time.monotonic() - started:.1f} s; logs in {c.log_dir}")
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
            summary = c.traffic_summary()
        except ClusterError as error:
            summary = None
            _progress(f"no traffic summary: {error}")
        if summary is not None:
            _progress("traffic (TCP bytes sent, from `ss -tinp`):")
            pairs = [(a, b) for a in ("chief", "ps", "worker") for b in ("chief", "ps", "worker")]
            for src, dst in pairs:
                nbytes = summary.get((src, dst), 0)
                if nbytes or src != dst:
                    _progress(f"  {src:>6} -> {dst:<6} {nbytes:>14,d} B  ({_format_bytes(nbytes)})")
        _progress(f"script exited with code {code}; stopping the cluster")
    return code


if __name__ == "__main__":
    sys.exit(main())
