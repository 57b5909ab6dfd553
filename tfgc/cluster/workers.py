"""Worker scripts of an all-reduce cluster (MultiWorkerMirroredStrategy), run and reaped."""
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from tfgc.cluster.processes import (
    ClusterError, ClusterTimeout, WorkerResult, describe_results, die_with_parent, kill_group,
    read_text,
)

if TYPE_CHECKING:
    from tfgc.cluster.local import LocalCluster
    from tfgc.cluster.netem import EmulatedNetwork


class WorkerScripts:
    """`LocalCluster`'s worker scripts: one process per worker task, each with its
    `TF_CONFIG` (a mixin: it uses the cluster's start, environment and network)."""

    if TYPE_CHECKING:  # what the cluster that mixes it in provides
        num_ps: int
        num_workers: int
        log_dir: Optional[str]
        _started: bool
        _net: Optional[EmulatedNetwork]
        _pids: dict
        # index -> (Popen, started, stdout path, stderr path) of the running scripts
        _worker_procs: dict[int, tuple[subprocess.Popen, float, str, str]]

        def start(self) -> LocalCluster: ...

        def _require_started(self) -> None: ...

        def _child_env(self, job: str, index: int) -> dict[str, str]: ...

        def tf_config(self, task_type: str, index: int = 0) -> dict[str, Any]: ...

    def start_workers(self, argv: Union[str, Sequence[str]],
                      env: Optional[Mapping[str, Optional[str]]] = None) -> list[int]:
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
            # start() set log_dir: _require_started() checked it.
            out_path = os.path.join(self.log_dir, f"worker-{index}.out")  # type: ignore[arg-type]
            err_path = os.path.join(self.log_dir, f"worker-{index}.err")  # type: ignore[arg-type]
            prefix = self._net.exec_prefix(("worker", index)) if self._net else []
            with open(out_path, "w") as out, open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [*prefix, sys.executable, *map(str, argv)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env,
                    start_new_session=True, preexec_fn=die_with_parent,
                )
            self._worker_procs[index] = (proc, time.monotonic(), out_path, err_path)
            self._pids["worker"][index] = proc.pid
        return [self._worker_procs[i][0].pid for i in range(self.num_workers)]

    def wait_workers(self, timeout_s: float = 600, check: bool = False,
                     failure_grace_s: float = 30.0) -> list[WorkerResult]:
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
        ended: dict[int, float]
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
                            kill_group(proc)
                            ended[index] = time.monotonic() - started
                    break
                time.sleep(0.05)
        finally:
            self._kill_workers()
        results = [
            WorkerResult(index=i, pid=proc.pid, returncode=proc.returncode,
                         stdout=read_text(out), stderr=read_text(err),
                         stdout_path=out, stderr_path=err, duration_s=ended.get(i, 0.0),
                         timed_out=i in timed_out)
            for i, (proc, _, out, err) in sorted(self._worker_procs.items())
        ]
        self._worker_procs = {}
        if timed_out:
            raise ClusterTimeout(
                f"worker(s) {sorted(timed_out)} still ran after {timeout_s:.0f} s and were "
                f"killed.\n" + describe_results(results), results,
            )
        if check and any(r.returncode != 0 for r in results):
            raise ClusterError("worker script(s) failed.\n" + describe_results(results))
        return results

    def run_workers(self, argv: Union[str, Sequence[str]], timeout_s: float = 600,
                    env: Optional[Mapping[str, Optional[str]]] = None,
                    check: bool = False) -> list[WorkerResult]:
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

    def workers_running(self) -> bool:
        """True while a worker script started by `start_workers` still runs."""
        return any(proc.poll() is None for proc, _, _, _ in self._worker_procs.values())

    def _kill_workers(self):
        for proc, _, _, _ in self._worker_procs.values():
            if proc.poll() is None:
                kill_group(proc)
