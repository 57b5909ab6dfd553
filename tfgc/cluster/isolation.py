"""A private network namespace for the clusters tfgc starts: reachable from inside only.

TensorFlow's gRPC server listens on every interface of its network namespace (it
hard-codes the wildcard address; a cluster spec that says 127.0.0.1 does not change
that) and has no authentication: whoever reaches a task's port can run any TensorFlow
op in that process, reading and writing its files included. On a machine with a
network interface, a local cluster is open to every host that can route to it.

So every cluster tfgc starts is private by default: `LocalCluster.start()` refuses,
with an `ExposedClusterError` that says what to do, when its process's network
namespace has an interface besides loopback (and the links bandwidth emulation makes).
tfgc's launchers (`python -m tfgc.cluster`, `models.train`, `make demo`, the cluster
benchmarks and `make test` through `python -m tfgc.cluster.private`) first move their
process into a network namespace of its own whose only interface is loopback; a
script that starts a `LocalCluster` itself calls `isolate()` first thing in `main()`.
The coordinator, the servers and the worker scripts they start inherit the namespace
and talk over 127.0.0.1 as before; no other host, and no process outside the
namespace, can connect to them. The namespace is made with unshare(2): CLONE_NEWNET as
root, or inside a new unprivileged user namespace where the kernel allows one.

Opting out is explicit and still warns loudly: `LocalCluster(..., network="exposed")`
for one cluster, or `TFGC_NETWORK_ISOLATION=0` in the environment for every cluster
(and `isolate()` then leaves the process where it is), e.g. to reach a task from
another machine on purpose, or where no private namespace can be made.

A process that is already multi-threaded (TensorFlow starts threads when imported)
cannot move itself: `isolate()` then starts the program again from its beginning
inside a namespace (`unshare ... python <same arguments>`, keeping its pid), so call it
first thing in `main()`. `LocalCluster.start()` never moves its process by itself:
that would also cut the rest of the program (downloads, remote logging) off the
network, and could only be done by starting the program again behind its back.
"""
import ctypes
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
import warnings

# Set (to "1") by `isolate()` before it starts the program again in a new namespace.
_REEXEC_MARKER = "TFGC_PRIVATE_NETWORK"
# "0" turns isolation off.
SWITCH = "TFGC_NETWORK_ISOLATION"
# `LocalCluster(network=...)`: refuse to start outside a private namespace, or allow it.
PRIVATE, EXPOSED = "private", "exposed"
NETWORKS = (PRIVATE, EXPOSED)
# Links that bandwidth emulation adds to the namespace that holds the chief.
_EMULATION_LINK_PREFIX = "tfgc"

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sh22x"  # struct ifreq: name, flags, padding to 40 bytes

_warned = False
# Why the last `isolate()` of this process could not make a private namespace, if so.
_isolate_failed = None


class _UnshareRefused(OSError):
    """unshare(2) failed: the process is still in its namespace."""


class ExposedClusterWarning(RuntimeWarning):
    """A cluster's servers listen in a network namespace that other hosts can reach."""


def interfaces():
    """Names of the network interfaces of this process's namespace."""
    return sorted(name for _, name in socket.if_nameindex())


def in_private_network():
    """True when this process's network namespace has no way out: only loopback (and
    the links bandwidth emulation made, which lead only to its own namespaces)."""
    if not sys.platform.startswith("linux"):
        return False
    return all(n == "lo" or n.startswith(_EMULATION_LINK_PREFIX) for n in interfaces())


def in_user_namespace():
    """True inside a user namespace other than the initial one (where "root" is not)."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def disabled():
    """True when `TFGC_NETWORK_ISOLATION=0` asks for no isolation."""
    return os.environ.get(SWITCH, "1").strip().lower() in ("0", "no", "false", "off")


def _unshare_flags():
    """unshare(2) flags that make a network namespace for this user."""
    if os.geteuid() == 0 and not in_user_namespace():
        return _CLONE_NEWNET
    return _CLONE_NEWUSER | _CLONE_NEWNET


def unshare_command():
    """The `unshare` command line prefix equivalent to `_unshare_flags()`."""
    if _unshare_flags() == _CLONE_NEWNET:
        return ["unshare", "--net"]
    # Mapped to root inside so that the restarted program may bring loopback up.
    return ["unshare", "--user", "--map-root-user", "--net"]


def unavailable():
    """Why no private network namespace can be made here (a sentence), or None."""
    if not sys.platform.startswith("linux"):
        return "private network namespaces need Linux"
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is missing"
    try:
        probe = subprocess.run([*unshare_command(), "true"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`{' '.join(unshare_command())} true` failed: {error}"
    if probe.returncode != 0:
        return (f"`{' '.join(unshare_command())} true` failed: {probe.stderr.strip()} "
                "(unprivileged user namespaces may be off: sysctl "
                "kernel.unprivileged_userns_clone / user.max_user_namespaces)")
    return None


def _bring_up_loopback():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _unshare_in_place():
    """Moves this (single-threaded) process into a new network namespace.

    Raises:
      _UnshareRefused: unshare(2) refused; the process is where it was.
    """
    uid, gid = os.getuid(), os.getgid()
    flags = _unshare_flags()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise _UnshareRefused(errno, f"unshare: {os.strerror(errno)}")
    # From here on the process is in the new namespace: a failure is an error, not a
    # reason to go on without isolation (loopback would be down).
    if flags & _CLONE_NEWUSER:
        # Keep this user's ids; the capabilities a new user namespace grants its first
        # process are enough to bring loopback up.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _bring_up_loopback()


def _banner(message):
    print("\n" + "!" * 88 + "\n" + message + "\n" + "!" * 88, file=sys.stderr, flush=True)


def warn_exposed(reason, stacklevel=3):
    """Warns, once per process and loudly, that a cluster is reachable from the network."""
    global _warned
    if _warned:
        return
    _warned = True
    message = (
        "tfgc: this cluster's gRPC servers listen on every network interface of this "
        "machine, without authentication: any host that reaches a port can run "
        f"arbitrary TensorFlow ops in the task's process ({reason}). Without that "
        "opt-out, tfgc keeps its clusters in a private network namespace: run the "
        "coordinator through `python -m tfgc.cluster`, or call `tfgc.cluster.isolate()` "
        "first thing in your script."
    )
    _banner(message)
    warnings.warn(message, ExposedClusterWarning, stacklevel=stacklevel)


def _cannot_isolate(reason):
    """Warns that `isolate()` failed, and keeps `reason` for `LocalCluster`'s refusal."""
    global _isolate_failed
    _isolate_failed = reason
    message = (
        f"tfgc: isolate() could not move this process into a private network namespace "
        f"({reason}). A LocalCluster started here will refuse to start, because its "
        "servers would listen on every network interface without authentication, "
        f'unless you opt out and accept that: LocalCluster(..., network="{EXPOSED}") '
        f"or {SWITCH}=0."
    )
    _banner(message)
    warnings.warn(message, ExposedClusterWarning, stacklevel=3)


def refusal_message():
    """What `ExposedClusterError` says here: why a cluster may not start, and what to do."""
    others = [n for n in interfaces() if n != "lo" and not n.startswith(_EMULATION_LINK_PREFIX)]
    if others:
        where = f"has interfaces besides loopback ({', '.join(others)})"
    else:
        where = "is not known to be private on this platform"
    opt_out = (
        "opt out explicitly, accepting that risk (e.g. to reach the tasks from another "
        f'machine on purpose): LocalCluster(..., network="{EXPOSED}"), or {SWITCH}=0 in '
        "the environment; either still warns."
    )
    lines = [
        f"tfgc: LocalCluster refuses to start: this process's network namespace {where}, "
        "and TensorFlow's gRPC servers listen on every interface without authentication, "
        "so any host that reaches a task's port could run arbitrary TensorFlow ops in "
        "that task's process, reading and writing its files included."
    ]
    why_not = _isolate_failed or unavailable()
    if why_not is None:
        lines += [
            "Keep the cluster in a private network namespace (loopback only) instead:",
            "  - call `tfgc.cluster.isolate()` first thing in main(), before the cluster "
            "starts (the tasks inherit the namespace), or",
            "  - run the program under `python -m tfgc.cluster.private python SCRIPT ...`, "
            "or let `python -m tfgc.cluster ... -- SCRIPT` start the cluster for it.",
            "Or " + opt_out,
        ]
    else:
        lines += [
            f"No private network namespace can be made here ({why_not}).",
            "Run it where one can (as root, or where unprivileged user namespaces are "
            "allowed), or " + opt_out,
        ]
    return "\n".join(lines)


def check_network(network, stacklevel=3):
    """Checks that a cluster may listen in this process's network namespace.

    Args:
      network: `PRIVATE` (only in a private namespace, unless `TFGC_NETWORK_ISOLATION=0`)
        or `EXPOSED` (anywhere: the caller accepts the risk).
      stacklevel: of the warning, as for `warnings.warn` called by the caller.

    Raises:
      ValueError: `network` is neither.
      ExposedClusterError: `PRIVATE` outside a private namespace, without the opt-out.
        Its message says how to isolate the program, or how to opt out.
    """
    # Imported here: this module must load without tfgc (and so TensorFlow), so that a
    # process that loads only it is still single-threaded and can move in place.
    from tfgc.cluster.processes import ExposedClusterError

    if network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(map(repr, NETWORKS))}, "
                         f"got {network!r}")
    if in_private_network():
        return
    if network == EXPOSED:
        warn_exposed(f'LocalCluster(network="{EXPOSED}")', stacklevel + 1)
    elif disabled():
        warn_exposed(f"{SWITCH}=0", stacklevel + 1)
    else:
        raise ExposedClusterError(refusal_message())


def isolate():
    """Moves this process into a private network namespace (loopback only), if needed.

    Call it first thing in a program that starts a cluster: the tasks it starts then
    inherit the namespace. A single-threaded process moves in place; a multi-threaded
    one (TensorFlow imported) is started again from its beginning inside a new
    namespace with the same arguments and pid, so this call does not return there.

    Returns:
      True when the process is in a private network namespace. False, after a loud
      warning, when `TFGC_NETWORK_ISOLATION=0` (clusters then start exposed), or when
      none can be made here (a `LocalCluster` then refuses to start unless it opts
      out with `network="exposed"`).
    """
    restarted = os.environ.pop(_REEXEC_MARKER, None) == "1"
    if restarted:
        _bring_up_loopback()  # started again by the last branch below; lo starts down
    if in_private_network():
        return True
    if restarted:
        _cannot_isolate("the namespace made for it has other interfaces")
        return False
    if disabled():
        warn_exposed(f"{SWITCH}=0")
        return False
    if len(os.listdir("/proc/self/task")) == 1:
        try:
            _unshare_in_place()
        except _UnshareRefused as error:
            _cannot_isolate(str(error))
            return False
        return True
    reason = unavailable()
    if reason is not None:
        _cannot_isolate(reason)
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[_REEXEC_MARKER] = "1"
    argv = [*unshare_command(), "--", sys.executable, *sys.orig_argv[1:]]
    os.execvp(argv[0], argv)
