"""Processes of a local cluster: errors, ports, logs, and killing by pid."""
import ctypes
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
from typing import Sequence

HOST = "127.0.0.1"
JOBS = ("ps", "worker")
# The directory that holds the tfgc package: servers import this very tfgc.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOG_TAIL_LINES = 40
# Failures that mean "the port we picked was taken meanwhile": worth a retry on new ports.
PORT_CONFLICT = re.compile(
    r"Address already in use|Could not start gRPC server|Failed to add .* listener", re.I
)


class ClusterError(RuntimeError):
    """A task of a LocalCluster failed to start or died, or the cluster cannot be built."""


class ExposedClusterError(ClusterError):
    """A cluster would listen where other hosts can reach it, and nobody opted out."""


class ClusterTimeout(ClusterError):
    """Worker scripts ran past their time limit; `results` holds what each one did."""

    def __init__(self, message: str, results: "list[WorkerResult]") -> None:
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


def read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def reserve_ports(count: int) -> list[int]:
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


def log_tail(path: str, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip() or "(log is empty)"
    except OSError as error:
        return f"(could not read {path}: {error})"


def pid_alive(pid: int) -> bool:
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


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it dies.

    So worker scripts (which have no watchdog of their own) cannot outlive a launcher
    that was itself killed with SIGKILL. Linux only; elsewhere a no-op.
    """
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_group(proc: subprocess.Popen) -> None:
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


def describe_results(results: Sequence[WorkerResult]) -> str:
    lines = []
    for r in results:
        state = "timed out" if r.timed_out else f"exit {r.returncode}"
        lines.append(f"worker {r.index} (pid {r.pid}): {state}, {r.duration_s:.1f} s; "
                     f"stderr {r.stderr_path}")
        if r.returncode != 0:
            lines.append("  " + log_tail(r.stderr_path, 15).replace("\n", "\n  "))
    return "\n".join(lines)


class PortConflict(ClusterError):
    def __init__(self, message: str, task: str) -> None:
        super().__init__(message)
        self.task = task


def accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def progress(message: str) -> None:
    print(f"[tfgc.cluster] {message}", file=sys.stderr, flush=True)
