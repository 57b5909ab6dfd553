"""Bandwidth emulation: each task in a network namespace of its own, links shaped by tc.

Root only; needs `ip` and `tc` (iproute2). Each task runs in its own namespace, joined
to the others by veth pairs on a bridge in one more namespace, and every link is
shaped with a tc token bucket (tbf) on what each task sends, as tc on each machine's
NIC would. The chief reaches them through one veth pair whose address is on a private
/24 that no existing route uses; the namespaces have no other interface and no
default route, so nothing leaves them. Everything is deleted on stop.
"""
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
import sys

from tfgc.cluster import isolation
from tfgc.cluster.processes import ClusterError, pid_alive

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$", re.I)
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_NETNS_PREFIX = "tfgc-"


def parse_rate(rate):
    """'10mbit' -> 1e7 bits per second (tc's units: bit/kbit/mbit/gbit, bps = bytes/s).

    Raises:
      ValueError: not a rate tc understands in these units, or not positive.
    """
    match = _RATE.match(str(rate).strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"bandwidth must look like '10mbit', '100mbit' or '1gbit' (tc units), got {rate!r}"
        )
    return float(match.group(1)) * _RATE_SCALE[match.group(2).lower()]


def _run(cmd):
    """Runs `cmd`; returns its stdout. Raises ClusterError with its stderr if it fails."""
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True,
                              timeout=30).stdout
    except subprocess.CalledProcessError as error:
        raise ClusterError(
            f"`{' '.join(cmd)}` failed ({error.returncode}): {error.stderr.strip()}"
        ) from None


def emulation_unavailable():
    """Why bandwidth emulation cannot run here (a sentence), or None if it can."""
    if not sys.platform.startswith("linux"):
        return "bandwidth emulation needs Linux network namespaces"
    if os.geteuid() != 0 or isolation.in_user_namespace():
        return "bandwidth emulation needs root (it creates network namespaces and tc qdiscs)"
    missing = [tool for tool in ("ip", "tc", "ss") if shutil.which(tool) is None]
    if missing:
        return (f"bandwidth emulation needs {', '.join(missing)} from iproute2 "
                "(e.g. `apt-get install -y iproute2`)")
    return None


def _free_subnet():
    """A 10.x.y.0/24 that no address or route of this namespace touches."""
    used = []
    for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
            try:
                used.append(ipaddress.ip_network(token, strict=False))
            except ValueError:
                pass
    rng = random.Random()
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{rng.randrange(200, 255)}.{rng.randrange(256)}.0/24")
        if not any(subnet.overlaps(u) for u in used if u.prefixlen > 0):
            return subnet
    raise ClusterError("found no free private /24 for the emulated network")


def netns_list():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def remove_stale_namespaces():
    """Deletes namespaces left by launchers that were killed before they cleaned up.

    Names are "tfgc-<launcher pid>-..."; only those whose launcher is gone are removed.

    Returns:
      The names removed.
    """
    removed = []
    for name in netns_list():
        match = re.match(rf"^{_NETNS_PREFIX}(\d+)-", name)
        if match and not pid_alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


class EmulatedNetwork:
    """Network namespaces for the tasks, on a bridge, with every link shaped by tbf.

    Topology: one namespace per task with one interface, "eth0" (and lo); a "hub"
    namespace holds a bridge with the other end of each task's veth pair, and one
    more veth pair connects this (the chief's) namespace to the bridge. A tbf qdisc
    on each task's eth0 (and on the chief's link) limits what that task sends to
    `rate`, as tc on each machine's NIC does (3LC's evaluation method): a task that
    several others send to at once may receive more than `rate`. Shaping the
    receiving side too (at the bridge) would model a switch port, but without
    pushback from the senders' sockets its queue overflows, and every drop on a
    sub-millisecond RTT costs TCP a 200 ms retransmission timeout: the links would
    look several times slower than their rate.

    A `tasks` list that names ("chief", 0) gives the chief a namespace of its own
    too, as on a cluster of separate machines: `hosts` then maps it to that
    namespace's address, and this namespace's link carries nothing of the cluster.
    """

    _count = 0

    def __init__(self, rate, tasks):
        reason = emulation_unavailable()
        if reason:
            raise ClusterError(reason)
        self.rate = str(rate)
        self.bits_per_s = parse_rate(rate)
        self.tasks = list(tasks)  # [(job, index)]
        EmulatedNetwork._count += 1
        self.prefix = f"{_NETNS_PREFIX}{os.getpid()}-{EmulatedNetwork._count}"
        self.hub = f"{self.prefix}-hub"
        # Unique among live processes (an interface name has at most 15 characters). A
        # draw from the global `random` was not: training code seeds it, and two test
        # processes seeded alike drew the same name ("RTNETLINK answers: File exists").
        self.root_link = f"tfgc{os.getpid():06x}{EmulatedNetwork._count % 256:02x}"
        self.namespaces = {}  # (job, index) -> namespace name
        self.hosts = {}  # (job, index) -> ip; ("chief", 0) is this namespace
        self._created = []

    def _tbf(self, device, netns=None):
        # Burst: at least 64 KB (one GSO super-packet), about 4 ms at line rate above that.
        # The queue only ever holds what TCP's small-queue limit lets one host's sockets
        # put in it (the sender's own qdisc pushes back), so it never drops.
        burst = max(64 * 1024, int(self.bits_per_s / 8 / 250))
        limit = min(64 << 20, max(2 << 20, int(self.bits_per_s / 8)))
        cmd = ["tc"] + (["-n", netns] if netns else [])
        _run(cmd + ["qdisc", "add", "dev", device, "root", "tbf",
                    "rate", self.rate, "burst", str(burst), "limit", str(limit)])

    def setup(self):
        """Creates and shapes everything; returns {(job, index): ip}. Undone on error."""
        remove_stale_namespaces()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return dict(self.hosts)

    def _setup(self):
        subnet = _free_subnet()
        ips = subnet.hosts()
        hub = self.hub
        _run(["ip", "netns", "add", hub])
        self._created.append(hub)
        _run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", hub, "link", "set", "br0", "up"])

        root_ip = str(next(ips))
        _run(["ip", "link", "add", self.root_link, "type", "veth",
              "peer", "name", "chief", "netns", hub])
        _run(["ip", "-n", hub, "link", "set", "chief", "master", "br0", "up"])
        _run(["ip", "addr", "add", f"{root_ip}/{subnet.prefixlen}", "dev", self.root_link])
        _run(["ip", "link", "set", self.root_link, "up"])
        self._tbf(self.root_link)
        self.hosts[("chief", 0)] = root_ip

        for k, task in enumerate(self.tasks):
            ns = f"{self.prefix}-{task[0]}{task[1]}"
            ip = str(next(ips))
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            port = f"p{k}"
            _run(["ip", "-n", hub, "link", "add", port, "type", "veth",
                  "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", hub, "link", "set", port, "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/{subnet.prefixlen}", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._tbf("eth0", ns)  # what the task sends
            self.namespaces[task] = ns
            self.hosts[task] = ip

    def teardown(self):
        """Deletes the namespaces (with their links) and the chief's link; idempotent."""
        for ns in reversed(self._created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._created = []
        # Gone with its peer in the hub namespace already; make sure.
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True, timeout=30)

    def exec_prefix(self, task):
        """Command prefix that runs a program inside `task`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[task]]

    def link_bytes(self, task):
        """Bytes that crossed `task`'s link, from the kernel's counters of its interface.

        Unlike socket counters (`ss`), these outlive the task's processes and
        connections (its namespace keeps them until `teardown`), and they count every
        packet the task sent or received: TCP/IP headers, handshakes, ARP and IPv6
        neighbour discovery included.

        Args:
          task: (job, index) of a task of this network.

        Returns:
          {"sent": bytes, "received": bytes} of the task's eth0.

        Raises:
          ClusterError: `ip` failed.
        """
        out = _run(["ip", "-n", self.namespaces[task], "-s", "-j", "link", "show", "eth0"])
        stats = json.loads(out)[0]["stats64"]
        return {"sent": stats["tx"]["bytes"], "received": stats["rx"]["bytes"]}
