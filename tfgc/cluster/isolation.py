"""A private network namespace for the clusters tfgc starts: reachable from inside only.

TensorFlow's gRPC server listens on every interface of its network namespace (it
hard-codes the wildcard address; a cluster spec that says 127.0.0.1 does not change
that) and has no authentication: whoever reaches a task's port can run any TensorFlow
op in that process, reading and writing its files included. On a machine with a
network interface, a local cluster is open to every host that can route to it.

So every cluster tfgc starts is private by default: `LocalCluster.start()` refuses,
with an `ExposedClusterError` that says what to do, when its process's network
namespace can reach anything beyond the namespaces tfgc makes (`ways_out`).
tfgc's launchers (`python -m tfgc.cluster`, `models.train`, `make demo`, the cluster
benchmarks and `make test` through `python -m tfgc.cluster.private`) first move their
process into a network namespace of its own whose only interface is loopback; a
script that starts a `LocalCluster` itself calls `isolate()` first thing in `main()`.
The coordinator, the servers and the worker scripts they start inherit the namespace
and talk over 127.0.0.1 as before; no other host, and no process outside the
namespace, can connect to them. The namespace is made with unshare(2): CLONE_NEWNET as
root, or inside a new unprivileged user namespace where the kernel allows one.

What counts as private is judged by what the namespace can reach, read from the kernel
with `ip -j` (iproute2), never by interface names (anyone can name a link "tfgc0"):

- its links are loopback and veths whose peer lies in another namespace; every
  namespace reached that way is judged alike, and may also hold bridges and veth pairs
  with both ends inside it (the hub of bandwidth emulation and its delay line). Any
  other link (a NIC, a bridge or dummy here, tun, macvlan, a veth pair whose both ends
  are here, ...) is a way out. A namespace behind a veth must be one `ip -n NAME`
  reads (named in /run/netns); one without a name is a way out, unless it is the
  namespace the walk came from (a task namespace of an emulated network whose chief
  runs in an unnamed namespace is therefore not private);
- every address is loopback, IPv6 link-local, or in the range bandwidth emulation
  draws its subnets from (`EMULATION_RANGE`);
- every route leads to such addresses: no default route, no route or gateway outside
  them (blackhole, unreachable and prohibit routes lead nowhere and are fine).

Without `ip`, only a namespace whose one interface is loopback is private.

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

This module imports only the standard library, but importing it by its name
(`tfgc.cluster.isolation`, `from tfgc import cluster`) imports the `tfgc` package
first, and that loads TensorFlow and tfgc's op library (it registers tfgc's ops and
Keras optimizers on import, so that any process with tfgc can decode and load saved
models). A program that imports it is therefore already multi-threaded, and
`isolate()` starts it again. To start a command inside a private namespace before it
loads anything, run it as `python -m tfgc.cluster.private COMMAND`: the launcher
(which loads tfgc, and so starts itself again) replaces itself with COMMAND there,
which starts afresh, already isolated.
"""
import ctypes
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import warnings
from typing import Optional

# Set (to "1") by `isolate()` before it starts the program again in a new namespace.
_REEXEC_MARKER = "TFGC_PRIVATE_NETWORK"
# "0" turns isolation off.
SWITCH = "TFGC_NETWORK_ISOLATION"
# `LocalCluster(network=...)`: refuse to start outside a private namespace, or allow it.
PRIVATE, EXPOSED = "private", "exposed"
NETWORKS = (PRIVATE, EXPOSED)
# Where bandwidth emulation (`netem._free_subnet`) draws its /24s from: 10.200-254.x.0.
EMULATION_RANGE = (ipaddress.ip_address("10.200.0.0"), ipaddress.ip_address("10.254.255.255"))
# Addresses that lead nowhere beyond the links they sit on.
_LOCAL_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "::1/128", "fe80::/10", "224.0.0.0/4", "ff00::/8"))
# Routes of these types deliver nothing anywhere.
_DEAD_END_ROUTES = ("blackhole", "unreachable", "prohibit", "throw")
# The most namespaces `ways_out` walks through before it calls the rest a way out.
_MAX_NAMESPACES = 256
_IP_TIMEOUT_S = 10

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


def interfaces() -> list[str]:
    """Names of the network interfaces of this process's namespace."""
    return sorted(name for _, name in socket.if_nameindex())


def in_private_network() -> bool:
    """True when this process's network namespace has no way out (`ways_out`): only
    loopback, or veths into namespaces that are private alike (bandwidth emulation's)."""
    if not sys.platform.startswith("linux"):
        return False
    return not ways_out()


def _ip(args, netns=None):
    """`ip -j ARGS` (in namespace `netns`), parsed. Raises OSError, ValueError or
    subprocess.SubprocessError when it cannot be read."""
    cmd = ["ip", *(["-n", netns] if netns else []), "-j", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if done.returncode != 0:
        raise OSError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")
    return json.loads(done.stdout) if done.stdout.strip() else []


def _is_local(network):
    """True when every address of `network` is loopback, link-local, multicast or in
    `EMULATION_RANGE`."""
    if any(network.version == n.version and network.subnet_of(n) for n in _LOCAL_NETWORKS):
        return True
    first, last = EMULATION_RANGE
    return (network.version == 4 and first <= network.network_address
            and network.broadcast_address <= last)


def _address_ways_out(addresses, where):
    reasons = []
    for link in addresses:
        for info in link.get("addr_info", []):
            text = f"{info.get('local')}/{info.get('prefixlen')}"
            try:
                local = _is_local(ipaddress.ip_network(info.get("local")))
            except ValueError:
                local = False
            if not local:
                reasons.append(f"address {text} on {link.get('ifname')}{where}")
    return reasons


def _route_ways_out(routes, where):
    reasons = []
    for route in routes:
        if route.get("type") in _DEAD_END_ROUTES:
            continue
        dst = route.get("dst", "?")
        hops = [route.get("gateway")] + [h.get("gateway") for h in route.get("nexthops", [])]
        text = " ".join(filter(None, [
            "a default route" if dst == "default" else f"a route to {dst}",
            *(f"via {h}" for h in hops if h), route.get("dev") and f"dev {route['dev']}"]))
        try:
            local = dst != "default" and _is_local(ipaddress.ip_network(dst, strict=False))
            local = local and all(_is_local(ipaddress.ip_network(h)) for h in hops if h)
        except ValueError:
            local = False
        if not local:
            reasons.append(f"{text}{where}")
    return reasons


def _netns_inode(name):
    """The inode that identifies namespace `name` (/run/netns/NAME), or None."""
    try:
        return os.stat(os.path.join("/run/netns", name)).st_ino
    except (OSError, ValueError):
        return None


def ways_out() -> list[str]:
    """Why this process's network namespace is not private: what it can reach.

    Walks from this namespace through the peers of its veths to every namespace linked
    to it, reading each one's links, addresses and routes with `ip -j` (see the module
    docstring for the rules). Judged by link kinds, addresses and routes, never by
    interface names.

    Returns:
      A list of sentences, one per way out ("eth0: a link of kind device ..."); empty
      when the namespace is private.
    """
    if not sys.platform.startswith("linux"):
        return ["this platform has no network namespaces"]
    if shutil.which("ip") is None:
        return [f"{name}: a link besides loopback (without `ip`, iproute2, where it leads "
                "cannot be read)" for name in interfaces() if name != "lo"]
    try:
        start = os.stat("/proc/self/ns/net").st_ino
    except OSError as error:
        return [f"this process's network namespace cannot be read ({error})"]
    names = {start: None}  # inode -> the namespace's name (None: this one)
    queue = [start]
    veths = {}  # (inode, ifindex) -> (peer inode, peer ifindex) of veths between namespaces
    unnamed = []  # (inode, link, where) of veths whose peer namespace has no name
    reasons = []
    while queue:
        inode = queue.pop(0)
        name = names[inode]
        where = "" if name is None else f" (in namespace {name}, linked to this one)"
        try:
            links = _ip(["-d", "link", "show"], name)
            addresses = _ip(["addr", "show"], name)
            routes = _ip(["route", "show", "table", "all"], name)  # IPv4 and IPv6
            ids = {}
            if any("link_netnsid" in link for link in links):
                ids = {entry.get("nsid"): entry.get("name")
                       for entry in _ip(["netns", "list-id"], name)}
        except (OSError, ValueError, subprocess.SubprocessError) as error:
            reasons.append(f"namespace {name or '(this one)'} cannot be read: {error}")
            continue
        for link in links:
            ifname = link.get("ifname", "?")
            kind = (link.get("linkinfo") or {}).get("info_kind")
            if link.get("link_type") == "loopback" and kind is None:
                continue
            if kind == "veth" and "link_netnsid" in link:
                peer_name = ids.get(link["link_netnsid"])
                peer = None if peer_name is None else _netns_inode(peer_name)
                if peer is None:
                    unnamed.append((inode, link, where))
                    continue
                veths[(inode, link.get("ifindex"))] = (peer, link.get("link_index"))
                if peer not in names:
                    if len(names) >= _MAX_NAMESPACES:
                        reasons.append(f"more than {_MAX_NAMESPACES} namespaces are "
                                       "linked to this one")
                        return reasons
                    names[peer] = peer_name
                    queue.append(peer)
                continue
            if name is not None and kind in ("bridge", "veth"):
                continue  # a hub's bridge, or a veth pair with both ends in the hub
            if kind == "veth":
                what = f"a veth pair whose other end ({link.get('link')}) is here too"
            else:
                what = (f"a link of kind {kind or 'device'} ({link.get('link_type')}), "
                        "not a veth into another namespace")
            reasons.append(f"{ifname}{where}: {what}")
        reasons += _address_ways_out(addresses, where)
        reasons += _route_ways_out(routes, where)
    for inode, link, where in unnamed:
        # The veth the walk came in through leads back to where it came from.
        back = (inode, link.get("ifindex"))
        if any(peer == back and here[1] == link.get("link_index")
               for here, peer in veths.items()):
            continue
        reasons.append(f"{link.get('ifname')}{where}: a veth into a namespace with no "
                       "name in /run/netns, which `ip -n` cannot read")
    return reasons


def in_user_namespace() -> bool:
    """True inside a user namespace other than the initial one (where "root" is not)."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def disabled() -> bool:
    """True when `TFGC_NETWORK_ISOLATION=0` asks for no isolation."""
    return os.environ.get(SWITCH, "1").strip().lower() in ("0", "no", "false", "off")


def _unshare_flags():
    """unshare(2) flags that make a network namespace for this user."""
    if os.geteuid() == 0 and not in_user_namespace():
        return _CLONE_NEWNET
    return _CLONE_NEWUSER | _CLONE_NEWNET


def unshare_command() -> list[str]:
    """The `unshare` command line prefix equivalent to `_unshare_flags()`."""
    if _unshare_flags() == _CLONE_NEWNET:
        return ["unshare", "--net"]
    # Mapped to root inside so that the restarted program may bring loopback up.
    return ["unshare", "--user", "--map-root-user", "--net"]


def unavailable() -> Optional[str]:
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


def warn_exposed(reason: str, stacklevel: int = 3) -> None:
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


def refusal_message() -> str:
    """What `ExposedClusterError` says here: why a cluster may not start, and what to do."""
    reasons = ways_out()
    if len(reasons) > 8:
        reasons = reasons[:8] + [f"{len(reasons) - 8} more"]
    if reasons:
        where = f"can reach beyond itself ({'; '.join(reasons)})"
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


def check_network(network: str, stacklevel: int = 3) -> None:
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


def isolate() -> bool:
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
        _cannot_isolate("the namespace made for it can reach beyond itself: "
                        + "; ".join(ways_out()))
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
