"""One task of a local TensorFlow cluster: `python -m tfgc._server ...`.

Started by `tfgc.cluster.LocalCluster`, one process per ps/worker task. It serves as
`python -m tfgc.server` does (`tfgc.server.serve`: tfgc's ops are registered and
checked in the server process, e.g. for the decode ops that run on a parameter
server, then it serves until SIGTERM or SIGINT, exiting 0, or SIGHUP, SIGQUIT or
SIGUSR1, exiting 128 + the signal's number, each with one line), plus a watchdog.

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
    _log(f"starting /job:{args.job}/task:{args.index} on {cluster[args.job][args.index]}")
    # The same start as `python -m tfgc.server` (tfgc's ops checked, then the server;
    # `server.exit_code` on a stop signal), without its security warning: LocalCluster
    # already checked where its servers listen (`isolation.check_network`).
    from tfgc import server

    try:
        server.validate(cluster, args.job, args.index)
    except server.ConfigError as error:
        _log(f"refusing to start: {error}")
        return server.EXIT_BAD_CONFIG
    server.serve(cluster, args.job, args.index, log=_log, warn_if_exposed=False)


if __name__ == "__main__":
    sys.exit(main())
