"""One parameter-server or worker task of a real cluster: `python -m tfgc.server`.

Also installed as the console script `tfgc-server`. Run it on every ps and worker
machine of a ParameterServerStrategy cluster; the chief runs the training script
(e.g. `python -m models.train --strategy ps --tf-config ...`). The task comes from
`TF_CONFIG`, or from flags that override it:

    TF_CONFIG='{"cluster": {"chief": ["10.0.0.1:2222"], "ps": ["10.0.0.2:2222"],
                "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]},
                "task": {"type": "ps", "index": 0}}' python -m tfgc.server
    tfgc-server --cluster-spec '{"ps": [...], "worker": [...]}' --job worker --index 1

It imports tfgc, so tfgc's ops (the decode ops a parameter server runs) are registered
in the server, and runs one of them before serving to prove the op library loads. It
then starts a `tf.distribute.Server`, logs one line (task, address, pid, tfgc and
TensorFlow versions) and serves until a signal stops it (below). With
`--traffic-every SECONDS` it also logs the TCP bytes it exchanged with every other
task (`tfgc.cluster.task_traffic`, read from `ss`), e.g. worker-to-ps bytes, which no
process but the worker and the ps can read on a real cluster.

Before TensorFlow loads (importing it takes seconds), while `import tfgc` starts, a
`tfgc-server` process takes its signals, checks its configuration and quiets
TensorFlow's start-up log (`_before_tensorflow`):

- SIGTERM, SIGINT, SIGHUP, SIGQUIT and SIGUSR1 each end it with one line that names
  the signal, at any moment after the interpreter has started (see
  docs/deployment.md): "SIGHUP received while starting; exiting with code 129",
  or once it serves "SIGTERM received; stopping /job:ps/task:0 (exit code 0)".
- A wrong configuration ends it with exit code 2 and one line, before TensorFlow loads.
- TF_CPP_MIN_LOG_LEVEL is 3 unless set. TensorFlow logs its start-up lines (oneDNN,
  CUDA, the absl preamble) while it loads, before it reads that level, so the lines of
  that stretch below the level are dropped here; the rest of its log obeys it.

Exit codes: 0 stopped by SIGTERM or SIGINT (the ways to stop a task); 128 + the
signal's number stopped by SIGHUP (129), SIGQUIT (131) or SIGUSR1 (138); 1 it could
not start (the op library does not load, the port cannot be bound); 2 the
configuration is wrong: it starts nothing and prints one line that says what is wrong
(malformed TF_CONFIG, a task that is not in the cluster, an address that is not
host:port, a job name TensorFlow cannot parse, a chief or evaluator task, ...).

Security: TensorFlow's gRPC server listens on every interface of the machine (it
binds the wildcard address whatever host the cluster spec names) and has no
authentication: whoever reaches the port can run any TensorFlow op in this process.
Unless the process is in a private network namespace (loopback only), it prints a
loud warning with the firewall rule to apply. See docs/deployment.md.
"""
import argparse
import atexit
import ipaddress
import json
import os
import re
import signal
import shutil
import sys
import threading
import time
import typing  # the module, so that its names do not join tfgc.server's public ones
import warnings

EXIT_STOPPED = 0
EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
# Signals that stop the server, each with one line that names it (`exit_code`).
STOP_SIGNALS = tuple(getattr(signal, name) for name in
                     ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1")
                     if hasattr(signal, name))
# What TF_CPP_MIN_LOG_LEVEL is unless set: TensorFlow's FATAL lines only.
DEFAULT_TF_LOG_LEVEL = "3"

# Jobs whose tasks are plain servers under ParameterServerStrategy.
SERVED_JOBS = ("ps", "worker")
# Why the other usual task types must not be served by this program.
_NOT_SERVED = {
    "chief": (
        "the chief is the coordinator and runs the training script (e.g. `python -m "
        "models.train --strategy ps --tf-config ...`), whose ParameterServerStrategy "
        "starts the chief's server in that process; run tfgc-server only for ps and "
        "worker tasks"
    ),
    "evaluator": (
        "an evaluator runs an evaluation script beside the cluster and serves nothing "
        "(it is not part of the cluster spec); run tfgc-server only for ps and worker "
        "tasks"
    ),
}
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")
# The job names TensorFlow's device names can hold (/job:NAME/...): an ASCII letter, then
# ASCII letters, digits and underscores. "bad job!" or "wörker" make a server whose
# devices no op can be placed on ("Malformed device specification").
_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# A line TensorFlow's C++ log (absl) writes: severity letter, then MMDD.
_ABSL_LINE = re.compile(rb"([IWEF])\d{4} ")
# The WARNING absl writes once before its first line while it is not set up.
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called"


class ConfigError(ValueError):
    """The task cannot be served as configured; the message says what is wrong."""


def _log(message):
    print(f"[tfgc.server pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


def _one_line(text):
    """`text` with every character that is not printable (newlines, controls) escaped."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def _refuse(error):
    message = _one_line(error)
    if len(message) > 2000:
        message = f"{message[:2000]}..."
    print(f"tfgc-server: refusing to start: {message}", file=sys.stderr, flush=True)


def exit_code(signum: int) -> int:
    """The exit code after signal `signum`: 0 for SIGTERM and SIGINT (the ways to stop a
    task), 128 + its number for the others of `STOP_SIGNALS`."""
    return EXIT_STOPPED if signum in (signal.SIGTERM, signal.SIGINT) else 128 + signum


def _stop_while_starting(signum, frame):
    """A stop signal before the server serves: one line, and exit at once."""
    del frame
    code = exit_code(signum)
    _log(f"{signal.Signals(signum).name} received while starting; exiting with code {code}")
    _exit(code)


def _take_signals(handler=_stop_while_starting):
    """Installs `handler` for every signal of `STOP_SIGNALS` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


def split_address(address: object, where: str) -> tuple[str, int]:
    """Splits a cluster address 'host:port' (IPv6 as '[::1]:port').

    Args:
      address: the address as the cluster spec gives it.
      where: the task it belongs to, for the message ("/job:ps/task:0").

    Returns:
      (host, port).

    Raises:
      ConfigError: not a string of the form host:port with a port in 1..65535 and a
        host that peers can dial (a name or an IP address, not 0.0.0.0 or ::).
    """
    def bad(why):
        return ConfigError(f"{where} has address {_short(address)}, which is not host:port "
                           f"({why})")

    if not isinstance(address, str):
        raise bad("not a string")
    if not address.isprintable() or any(c.isspace() for c in address):
        raise bad("it holds whitespace or control characters")
    if "://" in address:
        raise bad("drop the scheme: TF_CONFIG addresses are plain host:port")
    if address.startswith("["):  # [IPv6]:port
        host, sep, port = address[1:].partition("]:")
        if not sep:
            raise bad("an IPv6 host is written [addr]:port")
    else:
        host, sep, port = address.rpartition(":")
        if not sep:
            raise bad("no port")
        if ":" in host:
            raise bad("an IPv6 host is written [addr]:port")
    # ASCII digits only: str.isdigit() also takes "²", "２" and "٢", which int() reads
    # (or not) but no resolver does.
    if not (port.isascii() and port.isdigit() and len(port) <= 5
            and 1 <= int(port) <= 65535):
        raise bad(f"port {_short(port, 40)} is not a number in 1..65535")
    if not host:
        raise bad("no host")
    if not host.isascii():
        raise bad(f"{_short(host, 80)} is not ASCII (write an internationalized name as its "
                  "xn-- form)")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if len(host) > 253 or not _HOSTNAME.fullmatch(host):
            raise bad(f"{_short(host, 80)} is neither an IP address nor a host name") from None
    else:
        if ip.is_unspecified:
            raise bad(f"{host} is not an address peers can dial; give this machine's "
                      "address on the cluster's private network")
    return host, int(port)


def validate(cluster: object, job: object, index: object) -> str:
    """Checks that task `job:index` of `cluster` is one tfgc-server can serve.

    Args:
      cluster: {job name: [address, ...]} as in TF_CONFIG's "cluster".
      job: the task's type ("ps" or "worker").
      index: the task's index in its job.

    Returns:
      The task's address.

    Raises:
      ConfigError: the message says what is wrong.
    """
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f"the cluster must be a non-empty object {{job: [host:port, ...]}}, "
                          f"got {_short(cluster)}")
    for name, addresses in cluster.items():
        if not isinstance(name, str) or not _JOB_NAME.fullmatch(name):
            raise ConfigError(f"job name {_short(name, 80)} is not one TensorFlow can use: "
                              "a job name is an ASCII letter, then ASCII letters, digits "
                              "and underscores (e.g. ps, worker, chief)")
        if not isinstance(addresses, list) or not addresses:
            raise ConfigError(f"job {name!r} of the cluster must be a non-empty list of "
                              f"host:port addresses, got {_short(addresses)}")
    seen: dict[str, str] = {}  # address -> the task that has it
    for name, addresses in cluster.items():
        for i, address in enumerate(addresses):
            where = f"/job:{name}/task:{i}"
            split_address(address, where)
            if address in seen:
                raise ConfigError(f"{where} and {seen[address]} have the same address "
                                  f"{address}; every task needs its own host:port")
            seen[address] = where
    if not isinstance(job, str) or not job:
        raise ConfigError(f"the task type must be a job name such as \"ps\", got "
                          f"{_short(job)}")
    if job in _NOT_SERVED:
        raise ConfigError(f"the task type is {_short(job, 80)}; {_NOT_SERVED[job]}")
    if job not in cluster:
        raise ConfigError(f"the task type {_short(job, 80)} is not a job of the cluster "
                          f"(jobs: {_short(', '.join(sorted(cluster)))[1:-1]})")
    if job not in SERVED_JOBS:
        raise ConfigError(f"the task type is {_short(job, 80)}; tfgc-server serves the tasks of a "
                          "ParameterServerStrategy cluster, whose jobs are ps and worker "
                          "(and the chief, which runs the training script)")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"the task index must be an integer, got {_short(index)}")
    if not 0 <= index < len(cluster[job]):
        raise ConfigError(f"the task index {_short(index, 40)} is out of range: job {job!r} has "
                          f"{len(cluster[job])} task(s), so the index is 0.."
                          f"{len(cluster[job]) - 1}")
    if "ps" not in cluster:
        raise ConfigError(
            "the cluster has no ps job: that is an all-reduce cluster "
            "(MultiWorkerMirroredStrategy), where every worker runs the training script "
            "itself (e.g. `python -m models.train --strategy mwms --tf-config ...`) and "
            "hosts its own server; tfgc-server is for ParameterServerStrategy clusters")
    return cluster[job][index]


def parse_tf_config(text: typing.Optional[str]) -> tuple[dict[str, list[str]], str, int]:
    """Reads the task to serve from the text of `TF_CONFIG`.

    Returns:
      (cluster, job, index), validated.

    Raises:
      ConfigError: the message says what is wrong.
    """
    if text is None or not text.strip():
        raise ConfigError("TF_CONFIG is not set (or empty), and --cluster-spec/--job/--index "
                          "were not given: nothing says which task to serve")
    config = _load_json(text, "TF_CONFIG")
    if not isinstance(config, dict):
        raise ConfigError(f"TF_CONFIG must be a JSON object with \"cluster\" and \"task\", "
                          f"got {type(config).__name__}")
    if "cluster" not in config:
        raise ConfigError("TF_CONFIG has no \"cluster\" (the address of every task, "
                          "{\"ps\": [\"host:port\", ...], \"worker\": [...], ...})")
    if "task" not in config:
        raise ConfigError("TF_CONFIG has no \"task\" ({\"type\": \"ps\" or \"worker\", "
                          "\"index\": N}: which task of the cluster this one is)")
    task = config["task"]
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(f"TF_CONFIG's \"task\" must be {{\"type\": ..., \"index\": ...}}, "
                          f"got {_short(task)}")
    rpc_layer = config.get("rpc_layer", "grpc")
    if rpc_layer != "grpc":
        raise ConfigError(f"TF_CONFIG's rpc_layer is {_short(rpc_layer)}; only \"grpc\" is "
                          "supported")
    validate(config["cluster"], task["type"], task["index"])
    return config["cluster"], task["type"], task["index"]


def parse_flags(cluster_spec: str, job: str,
                index: int) -> tuple[dict[str, list[str]], str, int]:
    """Reads the task to serve from --cluster-spec/--job/--index; as `parse_tf_config`."""
    cluster = _load_json(cluster_spec, "--cluster-spec")
    validate(cluster, job, index)
    return cluster, job, index


def _short(value, limit=200):
    """repr(value), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _load_json(text, what):
    """`text` parsed as JSON. Raises ConfigError, never anything else, for any text."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{what} nests too deeply to be a cluster configuration") from None
    except ValueError as error:  # JSONDecodeError; and a number of over 4300 digits
        raise ConfigError(f"{what} is not valid JSON ({_short(str(error))})") from None


def _ascii_int(text):
    """An --index argument: ASCII digits (with a sign), as in TF_CONFIG's JSON."""
    if not (isinstance(text, str) and text.isascii() and re.fullmatch(r"[-+]?\d{1,18}", text)):
        raise argparse.ArgumentTypeError(f"not an integer: {_short(text, 40)}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """Refuses bad flags with a ConfigError (one line, exit code 2), not a usage text."""

    def error(self, message):
        raise ConfigError(message)


def _parser():
    parser = _Parser(
        prog="tfgc-server",
        description="Serve one ps or worker task of a ParameterServerStrategy cluster, "
                    "with tfgc's ops loaded. The task comes from TF_CONFIG, or from "
                    "--cluster-spec, --job and --index (all three), which override it.",
        epilog="Exit codes: 0 stopped by SIGTERM/SIGINT, 128 + the signal's number "
               "stopped by SIGHUP/SIGQUIT/SIGUSR1, 1 could not start, 2 bad "
               "configuration. See docs/deployment.md.")
    parser.add_argument("--cluster-spec", metavar="JSON",
                        help='the cluster, {"ps": ["host:port", ...], "worker": [...], ...}')
    parser.add_argument("--job", metavar="NAME", help="this task's job: ps or worker")
    parser.add_argument("--index", metavar="I", type=_ascii_int,
                        help="this task's index in its job")
    parser.add_argument("--traffic-every", metavar="SECONDS", type=float,
                        help="log the TCP bytes exchanged with each other task (read from "
                             "`ss`, iproute2) every SECONDS, and once more on exit")
    return parser


def read_task(argv: typing.Optional[typing.Sequence[str]], environ: typing.Mapping[str, str]
              ) -> tuple[dict[str, list[str]], str, int, typing.Optional[float]]:
    """The task to serve, from the command line `argv` and the environment `environ`.

    Reads nothing but its arguments and imports nothing: it runs before TensorFlow loads.

    Returns:
      (cluster, job, index, traffic_every_s), validated; traffic_every_s may be None.

    Raises:
      ConfigError: the message (one line) says what is wrong.
    """
    args = _parser().parse_args(argv)
    flags = (args.cluster_spec, args.job, args.index)
    if all(f is None for f in flags):
        cluster, job, index = parse_tf_config(environ.get("TF_CONFIG"))
    elif any(f is None for f in flags):
        raise ConfigError("--cluster-spec, --job and --index go together: give all "
                          "three, or none and TF_CONFIG")
    else:
        cluster, job, index = parse_flags(*flags)
    if args.traffic_every is not None:
        if not args.traffic_every > 0:
            raise ConfigError("--traffic-every must be a number of seconds > 0, got "
                              f"{args.traffic_every}")
        if shutil.which("ss") is None:
            raise ConfigError("--traffic-every reads socket counters with `ss`, which is "
                              "not installed (it comes with iproute2)")
    return cluster, job, index, args.traffic_every


def exposure_warning(cluster: typing.Mapping[str, typing.Sequence[str]], job: str,
                     index: int) -> str:
    """The warning printed when the server's port may be reachable from other hosts."""
    _, port = split_address(cluster[job][index], f"/job:{job}/task:{index}")
    peers = sorted({split_address(a, "")[0]
                    for name, addresses in cluster.items() for i, a in enumerate(addresses)
                    if (name, i) != (job, index)})
    return (
        f"tfgc-server: SECURITY: /job:{job}/task:{index} listens on TCP port {port} of "
        "EVERY network interface of this machine (TensorFlow's gRPC server binds the "
        "wildcard address, whatever host the cluster spec names), with no "
        "authentication and no encryption. Anyone who can reach this port can run "
        "arbitrary TensorFlow ops in this process, reading and writing any file it may.\n"
        "Keep every task on a private network (a VPC subnet, VLAN or VPN that only the "
        "cluster's machines reach), never give a task a public address, and let a host "
        f"firewall accept port {port} only from the cluster's other tasks: "
        f"{', '.join(peers) or '(none)'}; e.g. with nftables:\n"
        f"    nft add rule inet filter input tcp dport {port} ip saddr "
        f"{{ {', '.join(peers) or 'PEER'} }} accept\n"
        f"    nft add rule inet filter input tcp dport {port} drop\n"
        "(host names must be given as addresses there). See docs/deployment.md, "
        "\"Security\"."
    )


def _warn_if_exposed(cluster, job, index):
    from tfgc.cluster import isolation

    if isolation.in_private_network():
        return False
    isolation._banner(exposure_warning(cluster, job, index))
    return True


def _check_ops():
    """Runs one tfgc op here, so a server whose op library did not load never serves.

    Returns:
      The path of the op library.

    Raises:
      RuntimeError: the op did not run or gave a wrong result.
    """
    import tensorflow as tf

    import tfgc_ops

    try:
        # A run of three 121 bytes is zero-run encoded as the single byte 244.
        encoded = tfgc_ops.zero_run_encode(tf.constant([121, 121, 121], tf.uint8)).numpy()
    except Exception as error:  # any failure means the ops are unusable here
        raise RuntimeError(f"tfgc's op library does not work in this process: "
                           f"{type(error).__name__}: {error}") from None
    if encoded.tolist() != [244]:
        raise RuntimeError(f"tfgc's op library gave a wrong result ({encoded.tolist()} "
                           "instead of [244]); rebuild it against this TensorFlow")
    return tfgc_ops.library_path


def traffic_line(traffic: typing.Mapping[tuple[str, int], typing.Mapping[str, int]]) -> str:
    """One log line from `tfgc.cluster.task_traffic()`'s result."""
    parts = [f"{job}:{index} sent {t['sent']:,d} B, received {t['received']:,d} B"
             for (job, index), t in sorted(traffic.items())]
    return ("traffic (TCP bytes over this task's open connections, from ss): "
            + ("; ".join(parts) or "no open connections to other tasks"))


def _log_traffic(config, log):
    from tfgc.cluster import ClusterError, task_traffic

    try:
        log(traffic_line(task_traffic(config)))
    except ClusterError as error:  # one unreadable listing must not stop the server
        log(f"traffic not read: {error}")


def serve(cluster: typing.Mapping[str, typing.Sequence[str]], job: str, index: int,
          log: typing.Callable[[str], None] = _log, warn_if_exposed: bool = True,
          traffic_every_s: typing.Optional[float] = None) -> typing.NoReturn:
    """Serves task `job:index` of `cluster` until a stop signal; never returns.

    The caller validated the task (`validate`). The signals of `STOP_SIGNALS` are
    handled from the moment this is called, so a SIGTERM while TensorFlow starts the
    server also ends the process, once the server is up, with its line and exit code.

    Args:
      cluster: {job: [address, ...]}.
      job: the task's job ("ps" or "worker").
      index: the task's index in its job.
      log: prints one line of the server's log.
      warn_if_exposed: print the security warning outside a private network
        namespace (LocalCluster's servers leave it to their launcher).
      traffic_every_s: if set, log the bytes exchanged with every other task
        (`tfgc.cluster.task_traffic`) every that many seconds, and once more on exit.

    Exits the process: `exit_code(signal)` on a stop signal (0 on SIGTERM/SIGINT), 1 if
    the ops or the server do not start.
    """
    stop = threading.Event()
    received = []

    def on_signal(signum, frame):
        received.append(signum)
        stop.set()

    _take_signals(on_signal)

    where = f"/job:{job}/task:{index}"
    import tensorflow as tf

    import tfgc

    try:
        library = _check_ops()
    except RuntimeError as error:
        log(f"not serving {where}: {error}")
        _exit(EXIT_FAILED)
    if warn_if_exposed:
        _warn_if_exposed(cluster, job, index)
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                                      task_index=index, protocol="grpc", start=True)
    except tf.errors.OpError as error:
        # The text keeps TensorFlow's words ("Could not start gRPC server"), which
        # LocalCluster reads to retry on fresh ports.
        log(f"not serving {where}: could not start its server on {cluster[job][index]}: "
            f"{error.message}")
        _exit(EXIT_FAILED)
    log(f"serving {where} at {cluster[job][index]} ({server.target}; tfgc "
        f"{tfgc.__version__}, TensorFlow {tf.__version__}, ops {library})")
    config = {"cluster": cluster, "task": {"type": job, "index": index}}
    wait_s = 1.0 if traffic_every_s is None else min(1.0, traffic_every_s)
    next_traffic = None if traffic_every_s is None else time.monotonic() + traffic_every_s
    # The main thread waits on an event rather than in Server.join(): join() blocks in
    # C++, where Python signal handlers never run.
    while not stop.wait(timeout=wait_s):
        if next_traffic is not None and time.monotonic() >= next_traffic:
            _log_traffic(config, log)
            # next_traffic is set only with traffic_every_s.
            next_traffic = time.monotonic() + traffic_every_s  # type: ignore[operator]
    code = exit_code(received[0])
    log(f"{signal.Signals(received[0]).name} received; stopping {where} (exit code {code})")
    if traffic_every_s is not None:
        _log_traffic(config, log)  # the totals up to the end
    _exit(code)


def _exit(code: int) -> typing.NoReturn:
    """Ends the process at once: TensorFlow cannot shut a gRPC server down cleanly
    (Server has no stop), and interpreter teardown with its threads running can hang."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: typing.Optional[typing.Sequence[str]] = None,
         environ: typing.Optional[typing.Mapping[str, str]] = None) -> int:
    """The command line; returns the exit code when it refuses to start.

    First of all it takes the stop signals (`STOP_SIGNALS`); in a `tfgc-server` process
    `_before_tensorflow` did that, and checked the configuration, before TensorFlow
    loaded.

    Args:
      argv: arguments (default: sys.argv[1:]).
      environ: the environment to read TF_CONFIG from (default: os.environ).
    """
    _take_signals()
    _end_quiet_start()
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    try:
        cluster, job, index, traffic_every_s = read_task(argv, environ)
    except ConfigError as error:
        _refuse(error)
        return EXIT_BAD_CONFIG
    serve(cluster, job, index, traffic_every_s=traffic_every_s)


# --- before TensorFlow loads ------------------------------------------------------------

# (saved stderr, Python's stderr, the forwarding thread) while TensorFlow's start-up
# log is filtered.
_quiet = None


def _is_server_process():
    """True in the process of the `tfgc-server` console script or `python -m
    tfgc.server`, while it imports tfgc (before its main module runs)."""
    if not sys.argv:
        return False
    if os.path.basename(sys.argv[0]).removesuffix(".exe") == "tfgc-server":
        return True
    # `python -m tfgc.server`: argv[0] is "-m" while the module is being found.
    orig = getattr(sys, "orig_argv", [])
    for i, arg in enumerate(orig[1:], 1):
        if arg == "-m":
            return orig[i + 1:i + 2] == ["tfgc.server"]
        if arg.startswith("-m"):
            return arg[2:] == "tfgc.server"
    return False


def _severity(line):
    """0-3 for an INFO, WARNING, ERROR or FATAL line of TensorFlow's C++ log, else None."""
    if line.startswith(_ABSL_PREAMBLE):
        return 1
    match = _ABSL_LINE.match(line)
    return None if match is None else b"IWEF".index(match.group(1))


def _forward_start_log(read_fd, write_fd, level):
    """Copies what the pipe `read_fd` gets to `write_fd`, but for TensorFlow's log lines
    below `level` (TF_CPP_MIN_LOG_LEVEL)."""
    with open(read_fd, "rb") as lines:
        for line in lines:
            severity = _severity(line)
            if severity is not None and severity < level:
                continue
            try:
                while line:
                    line = line[os.write(write_fd, line):]
            except OSError:
                return


def _quiet_start():
    """Until `_end_quiet_start`, filters what C and C++ code writes to stderr (fd 2):
    TensorFlow logs its start-up lines while it loads, before it reads
    TF_CPP_MIN_LOG_LEVEL. Python's own writes (sys.stderr) are not filtered."""
    global _quiet
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return
    if level <= 0 or _quiet is not None:
        return
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    # Python writes past the pipe, on a copy of the real stderr that stays open: a
    # logging handler made meanwhile (absl's) keeps it.
    python_stderr = sys.stderr
    sys.stderr = open(os.dup(saved), "w", buffering=1, errors="backslashreplace",
                      encoding=getattr(python_stderr, "encoding", None) or "utf-8")
    thread = threading.Thread(target=_forward_start_log, args=(read_fd, saved, level),
                              name="tfgc-server-start-log", daemon=True)
    thread.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    _quiet = (saved, python_stderr, thread)


def _end_quiet_start():
    """Ends `_quiet_start`: stderr is itself again, with what the pipe held passed on."""
    global _quiet
    if _quiet is None:
        return
    saved, python_stderr, thread = _quiet
    _quiet = None
    sys.stderr.flush()
    os.dup2(saved, 2)  # closes the pipe's last write end: the thread reads to its end
    thread.join(timeout=10)
    sys.stderr = python_stderr
    if not thread.is_alive():
        os.close(saved)


def _before_tensorflow():
    """What a `tfgc-server` process does first, as `import tfgc` starts (tfgc's
    `__init__` imports this module before TensorFlow): it takes the stop signals,
    checks its configuration (exit code 2 and one line if it is wrong), sets
    TF_CPP_MIN_LOG_LEVEL to `DEFAULT_TF_LOG_LEVEL` unless set, and filters TensorFlow's
    start-up log by that level until `main` runs. Does nothing in any other process."""
    if not _is_server_process():
        return
    # This module is imported before runpy runs it as __main__ (which hands over to
    # this copy's main); runpy's warning about that is expected.
    warnings.filterwarnings("ignore", message=r"'tfgc\.server' found in sys\.modules",
                            category=RuntimeWarning)
    _take_signals()
    try:
        read_task(sys.argv[1:], os.environ)
    except ConfigError as error:
        _refuse(error)
        _exit(EXIT_BAD_CONFIG)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", DEFAULT_TF_LOG_LEVEL)
    atexit.register(_end_quiet_start)  # a traceback while TensorFlow loads is passed on
    _quiet_start()


if __name__ == "tfgc.server":
    _before_tensorflow()
elif __name__ == "__main__":
    # `python -m tfgc.server`: tfgc imported tfgc.server first; its main runs.
    from tfgc.server import main as _main

    sys.exit(_main())
