"""`LocalCluster`: a real TensorFlow cluster of local processes, stopped by pid."""
import atexit
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from tfgc.cluster import isolation
from tfgc.cluster.netem import EmulatedNetwork, parse_delay, parse_loss, parse_rate
from tfgc.cluster.processes import (
    HOST, JOBS, PACKAGE_PARENT, PORT_CONFLICT, ClusterError, PortConflict,
    accepts_connections, log_tail, progress, reserve_ports,
)
from tfgc.cluster.sockets import SocketCounters, ss_listing, ss_sockets
from tfgc.cluster.workers import WorkerScripts

if TYPE_CHECKING:
    import tensorflow as tf


class LocalCluster(WorkerScripts, SocketCounters):
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
      delay: each link's one-way delay ("25ms"): every frame a task sends waits this
        long, so a round trip between two tasks takes 2 x delay (netem where the
        kernel has it, else a delay line process). With or without `bandwidth`; the
        same needs.
      loss: the probability that a link drops a frame it carries ("0.1%" or 0.001).
      network: "private" (default): `start()` refuses, with an `ExposedClusterError`,
        unless this process is in a private network namespace (loopback only: see
        `tfgc.cluster.isolate()`) or `TFGC_NETWORK_ISOLATION=0`, since the servers
        listen on every interface without authentication. "exposed": start anyway,
        accepting that any host that reaches a port can run ops in the tasks (with a
        loud warning where the namespace is not private); the processes started get
        `TFGC_NETWORK_ISOLATION=0`, so that a worker script calling `isolate()` stays
        in the cluster's namespace.

    Raises:
      ValueError: bad counts, rate, delay, loss or network.
      ClusterError: (at start) bandwidth emulation asked for but not possible here.
      ExposedClusterError: (at start) a private cluster outside a private namespace.

    Use it as a context manager (or call `start()` and `stop()`). It is not reusable
    after `stop()`.
    """

    def __init__(
        self,
        num_ps: int = 1,
        num_workers: int = 2,
        timeout_s: float = 600,
        env: Optional[Mapping[str, Optional[str]]] = None,
        log_dir: Optional[str] = None,
        start_timeout_s: float = 60,
        start_attempts: int = 3,
        bandwidth: Optional[str] = None,
        network: str = isolation.PRIVATE,
        delay: Optional[str] = None,
        loss: Union[str, float, None] = None,
    ) -> None:
        if num_ps < 0 or num_workers < 1:
            raise ValueError(
                f"a cluster needs at least one worker and no negative ps count, got "
                f"num_ps={num_ps}, num_workers={num_workers}"
            )
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be positive")
        if bandwidth is not None:
            parse_rate(bandwidth)  # fail early on a typo
        if delay is not None:
            parse_delay(delay)
        if loss is not None:
            parse_loss(loss)
        if network not in isolation.NETWORKS:
            raise ValueError(f"network must be one of {', '.join(map(repr, isolation.NETWORKS))}"
                             f", got {network!r}")
        self.num_ps = int(num_ps)
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.start_attempts = max(1, int(start_attempts))
        self.env = dict(env or {})
        self.bandwidth = bandwidth
        self.delay = delay
        self.loss = loss
        self.network = network
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir
        self._procs: dict = {}  # (job, index) -> Popen, while running
        self._pids: dict = {}  # job -> [pid, ...] of the last start, kept after stop()
        self._logs: dict = {}  # (job, index) -> open file
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
    def server_jobs(self) -> tuple[str, ...]:
        """Jobs whose tasks this cluster runs as `tf.distribute.Server` processes."""
        return JOBS if self.num_ps else ()

    def start(self) -> "LocalCluster":
        """Starts all servers and waits until each listens on its port.

        With `num_ps=0` it only picks the workers' addresses (and builds the emulated
        network): the worker scripts start with `run_workers`.

        Raises:
          ExposedClusterError: `network="private"` and this process's network namespace
            is not private (see `tfgc.cluster.isolate()`); nothing was started.
          ClusterError: a task exited or did not listen in time (the message holds the
            tail of its log), or the emulated network could not be built. No process
            or namespace is left behind.
        """
        if self._started:
            raise RuntimeError("this LocalCluster was already started")
        # Refuse before anything listens. Never isolate here: moving this process would
        # also cut the rest of the program off the network, behind its back.
        isolation.check_network(self.network)
        self._started = True
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="tfgc-cluster-")
        os.makedirs(self.log_dir, exist_ok=True)
        atexit.register(self._atexit)
        try:
            if self.emulates_links:
                tasks = [(job, i) for job, n in self._task_counts() for i in range(n)]
                self._net = EmulatedNetwork(self.bandwidth, tasks, self.delay, self.loss)
                self._net.setup()
            for attempt in range(1, self.start_attempts + 1):
                try:
                    self._start_once()
                    return self
                except PortConflict as conflict:
                    self._kill_all()
                    if attempt == self.start_attempts:
                        raise ClusterError(str(conflict)) from None
                    progress(f"a port was taken before {conflict.task} could bind it; retrying")
        except BaseException:
            self.stop(remove_logs=False)
            raise
        return self

    @property
    def emulates_links(self) -> bool:
        """Whether the tasks run on emulated links (a rate, a delay or a loss rate)."""
        return any(x is not None for x in (self.bandwidth, self.delay, self.loss))

    @property
    def link(self) -> Optional[str]:
        """The emulated link as `netem.parse_link` reads it ("10mbit/25ms"), or None."""
        if not self.emulates_links:
            return None
        parts = [self.bandwidth or "", self.delay or "0ms"]
        if self.loss is not None:
            parts.append(str(self.loss))
        return "/".join(parts)

    def _task_counts(self):
        return (("ps", self.num_ps), ("worker", self.num_workers))

    def _host(self, job, index):
        return HOST if self._net is None else self._net.hosts[(job, index)]

    def _start_once(self):
        with_chief = self.num_ps > 0
        ports = reserve_ports(int(with_chief) + self.num_ps + self.num_workers)
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
        if self.network == isolation.EXPOSED:
            # A worker script that calls isolate() must stay where its peers listen.
            env[isolation.SWITCH] = "0"
        # The servers must import this very tfgc, also from an uninstalled source tree.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p
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
                    if accepts_connections(host, port):
                        del waiting[key]
                else:
                    owners = listeners.get(port, ())
                    # None: ss could not tell the owner (other user namespace, say).
                    if proc.pid in owners or (None in owners and accepts_connections(host, port)):
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
            sockets = ss_sockets(["-l"], netns=self._netns(key))
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
        tail = log_tail(log_path)
        message = (
            f"tfgc LocalCluster: task /job:{job}/task:{index} ({self._address(job, index)}) "
            f"{what}.\nLast lines of {log_path}:\n{tail}"
        )
        proc = self._procs[key]
        if proc.poll() is not None and PORT_CONFLICT.search(tail):
            raise PortConflict(message, task=f"/job:{job}/task:{index}")
        raise ClusterError(message)

    def stop(self, remove_logs: bool = False, grace_s: float = 5.0) -> None:
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
        # A resource collected after this is destroyed on a server that is gone. That
        # fails at once where the connection knows it closed; a connection whose close
        # was lost waits for TCP to give up (minutes). So what is garbage already goes
        # first, and the links outlive the servers until the closes have crossed them.
        gc.collect()
        try:
            self._kill_workers()
            self._kill_all(grace_s)
        finally:
            if self._net is not None:
                self._await_closed_connections()
                self._net.teardown()
            atexit.unregister(self._atexit)
        if remove_logs and self._own_log_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _await_closed_connections(self, timeout_s: float = 10.0) -> None:
        """Waits (at most `timeout_s`) until this process has no established connection
        to a task's server: the closes of the stopped servers have crossed the emulated
        links (a delay line or a slow rate holds them back), which a teardown would drop."""
        if self._addresses is None:
            return  # it never started
        servers = self._task_addresses(JOBS)  # not this process's own (the chief's)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            open_ = [s for s in ss_listing(["state", "established"])
                     if s["peer"] in servers and s["pid"] in (None, os.getpid())]
            if not open_:
                return
            time.sleep(0.05)

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

    def kill(self, job: str, index: int, sig: int = signal.SIGKILL) -> int:
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

    def restart(self, job: str, index: int) -> int:
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

    # --- what the cluster looks like ------------------------------------------------

    def _require_started(self):
        if self._addresses is None:
            raise RuntimeError("the cluster is not started; use `with LocalCluster(...) as c:`")

    @property
    def addresses(self) -> dict[str, list[str]]:
        """{"chief": [...], "ps": ["host:port", ...], "worker": [...]} (no chief or ps
        entry when num_ps=0)."""
        self._require_started()
        return {job: list(addrs)  # start() set _addresses: _require_started() checked it
                for job, addrs in self._addresses.items()}  # type: ignore[union-attr]

    def _address(self, job, index):
        return self._addresses[job][index]

    def _port(self, job, index):
        return int(self._address(job, index).rsplit(":", 1)[1])

    @property
    def cluster_spec(self) -> "tf.train.ClusterSpec":
        """A `tf.train.ClusterSpec` of `addresses`."""
        import tensorflow as tf

        self._require_started()
        return tf.train.ClusterSpec(self.addresses)

    @property
    def resolver(self) -> "tf.distribute.cluster_resolver.SimpleClusterResolver":
        """A cluster resolver for ParameterServerStrategy in this (the chief) process."""
        import tensorflow as tf

        self._require_started()
        # start() set _addresses: _require_started() checked it.
        if "chief" not in self._addresses:  # type: ignore[operator]
            raise RuntimeError("a cluster without parameter servers has no chief; use run_workers")
        if self._resolver is None:
            self._resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                self.cluster_spec, task_type="chief", task_id=0, rpc_layer="grpc"
            )
        return self._resolver

    def tf_config(self, task_type: str, index: int = 0) -> dict[str, Any]:
        """The `TF_CONFIG` dict for one task (json.dumps it into the environment)."""
        self._require_started()
        # start() set _addresses: _require_started() checked it.
        if (task_type not in self._addresses  # type: ignore[operator]
                or not 0 <= index < len(self._addresses[task_type])):  # type: ignore[index]
            raise ValueError(
                f"no task {task_type}:{index} in this cluster "
                f"({', '.join(f'{j}: {len(a)}' for j, a in self._addresses.items())})"  # type: ignore[union-attr]
            )
        return {"cluster": self.addresses, "task": {"type": task_type, "index": int(index)}}

    @property
    def pids(self) -> dict[str, list[Optional[int]]]:
        """{"ps": [pid, ...], "worker": [pid, ...]} of the processes of each task.

        The current (or last) process of each task: a restarted task's new pid, a worker
        script's pid once started (None before). Still available after `stop()`.
        """
        self._require_started()
        return {job: list(pids) for job, pids in self._pids.items()}

    def log_path(self, job: str, index: int) -> str:
        """Path of the log file of server task `job:index`.

        Known before `start()` where `log_dir` was given; otherwise `start()` makes the
        directory.

        Raises:
          RuntimeError: no `log_dir` was given and the cluster has not started.
        """
        if self.log_dir is None:
            raise RuntimeError(
                "the cluster is not started, so it has no log directory yet: call "
                "log_path after start() (or `with LocalCluster(...) as c:`), or pass log_dir")
        return os.path.join(self.log_dir, f"{job}-{index}.log")

    def exited_servers(self) -> dict[tuple[str, int], int]:
        """{(job, index): exit code} of the server tasks that have exited (a negative
        code: killed by that signal)."""
        return {key: proc.returncode for key, proc in sorted(self._procs.items())
                if proc.poll() is not None}

    def check_alive(self) -> None:
        """Raises ClusterError (with its log tail) if any server has exited."""
        for key, proc in sorted(self._procs.items()):
            if proc.poll() is not None:
                self._raise_failed(key, f"exited with code {proc.returncode}")
