"""`python -m tfgc.cluster`: run a script on a local cluster, print what crossed the wire."""
import argparse
import gc
import json
import os
import signal
import sys
import time
from typing import Any, Optional, Sequence

from tfgc.cluster import isolation
from tfgc.cluster.local import LocalCluster
from tfgc.cluster.netem import emulation_unavailable, parse_link
from tfgc.cluster.processes import (
    ClusterError, ClusterTimeout, ExposedClusterError, log_tail, progress,
)


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
    progress(f"traffic (TCP bytes sent, from `ss -tinp`{note}):")
    for src, dst in [(a, b) for a in jobs for b in jobs]:
        nbytes = summary.get((src, dst), 0)
        if nbytes or src != dst:
            progress(f"  {src:>6} -> {dst:<6} {nbytes:>14,d} B  ({_format_bytes(nbytes)})")


def _main_mwms(c, args):
    """Runs the script as every worker; samples socket counters while they run."""
    c.start_workers([args.script, *args.script_args])
    for index, (addr, pid) in enumerate(zip(c.addresses["worker"], c.pids["worker"])):
        progress(f"  /job:worker/task:{index}  {addr}  pid {pid}")
    # Sockets vanish with their process: keep, per pair of processes, the largest
    # total seen. The result misses at most the last second before each exit.
    best = {}
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        running = c.workers_running()
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
        progress(str(timeout))
        results = timeout.results
    for r in results:
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(f"--- worker {r.index} stderr (exit {r.returncode}) ---\n")
            sys.stderr.write(log_tail(r.stderr_path) + "\n")
    sys.stdout.flush()
    if best:
        summary = {}
        for (_, src, dst, _), value in best.items():
            summary[(src, dst)] = summary.get((src, dst), 0) + value
        _print_summary(summary, ("worker",), ", sampled each second")
    codes = [r.returncode for r in results]
    progress(f"worker exit codes {codes}; logs in {c.log_dir}")
    return next((code for code in codes if code != 0), 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m tfgc.cluster [--ps N] --workers M [--mwms] [--link R/D] -- script.py [args]`.

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
    parser.add_argument("--link", default=None, metavar="RATE[/DELAY[/LOSS]]",
                        help="emulate links: a rate, a one-way delay and a loss rate, e.g. "
                             "10mbit/25ms (a 50 ms round trip; root, iproute2)")
    parser.add_argument("--bandwidth", default=None, metavar="RATE",
                        help="emulate links of this rate, e.g. 10mbit: --link RATE")
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
    if args.link is not None and args.bandwidth is not None:
        parser.error("--bandwidth R is --link R: give one of them")
    link: dict[str, Any] = {}  # bandwidth, delay and loss: LocalCluster keywords
    if args.link is not None or args.bandwidth is not None:
        try:
            link = {key: value for key, value in parse_link(args.link or args.bandwidth).items()
                    if value is not None}
        except ValueError as error:
            parser.error(str(error))
        reason = emulation_unavailable()
        if reason:
            parser.error(reason)

    try:
        # The same check as LocalCluster.start(), before anything runs: a refusal is
        # a message to act on, not a traceback.
        isolation.check_network(isolation.PRIVATE)
    except ExposedClusterError as error:
        print(error, file=sys.stderr, flush=True)
        return 2

    # SIGTERM would otherwise kill us without cleanup (the servers' watchdogs would
    # still end them, half a second later); make it a normal exit instead.
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:  # not the main thread: leave signals alone
        pass

    started = time.monotonic()
    with LocalCluster(
        num_ps=num_ps, num_workers=args.workers, timeout_s=args.timeout, env=env,
        log_dir=args.log_dir, **link,
    ) as c:
        shaped = f", emulated links {c.link}" if link else ""
        progress(f"cluster up in {time.monotonic() - started:.1f} s{shaped}; logs in {c.log_dir}")
        if args.mwms:
            return _main_mwms(c, args)
        for job in ("chief", "ps", "worker"):
            pids = [os.getpid()] if job == "chief" else c.pids[job]
            for index, (addr, pid) in enumerate(zip(c.addresses[job], pids)):
                progress(f"  /job:{job}/task:{index}  {addr}  pid {pid}")
        os.environ["TF_CONFIG"] = json.dumps(c.tf_config("chief", 0))
        progress(f"running {args.script} as /job:chief/task:0")
        code = _run_script(args.script, args.script_args)
        # Free the script's tf.functions while the servers still run: TensorFlow
        # unregisters each one on every task, and logs an error per function and
        # task if that happens at interpreter exit, after the servers are gone.
        gc.collect()
        try:
            _print_summary(c.traffic_summary(), ("chief", "ps", "worker"))
        except ClusterError as error:
            progress(f"no traffic summary: {error}")
        progress(f"script exited with code {code}; stopping the cluster")
    return code


if __name__ == "__main__":
    sys.exit(main())
