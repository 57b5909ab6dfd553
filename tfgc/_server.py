"""One task of a local TensorFlow cluster: `python -m tfgc._server ...`.

Started by `tfgc.cluster.LocalCluster`, one process per ps/worker task. It imports
tfgc before creating its `tf.distribute.Server`, so tfgc's ops (e.g. the decode ops
that run on a parameter server) are registered in the server process, and then
serves until it is terminated.

A watchdog thread ends the process by itself after `--timeout` seconds or as soon as
the process that started it is gone, so no server outlives a crashed test or demo.
"""
import argparse
import json
import os
import sys
import threading
import time

# Exit codes the launcher can tell apart in its error messages.
EXIT_TIMEOUT = 3
EXIT_ORPHANED = 4


def _log(message):
    print(f"[tfgc._server pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


def _check(parent_pid, deadline):
    """Exits this process if `parent_pid` is no longer its parent or `deadline` passed.

    os._exit, not sys.exit: the main thread is blocked in Server.join() (C++), so
    only a hard exit stops it; there is nothing to flush but the log.
    """
    # When the parent dies the child is re-parented (to init or a subreaper), so
    # getppid() changes; comparing with the pid we were given also covers a parent
    # that died while this process was still importing TensorFlow.
    if os.getppid() != parent_pid:
        _log(f"parent {parent_pid} is gone; exiting")
        os._exit(EXIT_ORPHANED)
    if time.monotonic() >= deadline:
        _log("timeout reached; exiting")
        os._exit(EXIT_TIMEOUT)


def _watchdog(parent_pid, deadline, poll_s=0.5):
    while True:
        time.sleep(poll_s)
        _check(parent_pid, deadline)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-spec", required=True, help="cluster as JSON {job: [addr]}")
    parser.add_argument("--job", required=True, choices=["ps", "worker"])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds before exiting")
    args = parser.parse_args(argv)

    deadline = time.monotonic() + args.timeout
    _check(args.parent_pid, deadline)
    threading.Thread(
        target=_watchdog, args=(args.parent_pid, deadline), name="tfgc-watchdog", daemon=True
    ).start()

    cluster = json.loads(args.cluster_spec)
    address = cluster[args.job][args.index]
    _log(f"starting /job:{args.job}/task:{args.index} on {address}")

    # Import order matters: the op library must be loaded before the server runs
    # any function that uses tfgc ops (TF resolves op kernels in this process).
    import tensorflow as tf

    import tfgc  # noqa: F401  (registers tfgc's ops in this server)

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=args.job,
        task_index=args.index,
        protocol="grpc",
        start=True,
    )
    _log(f"serving {server.target} (tfgc {tfgc.__version__}, TensorFlow {tf.__version__})")
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
