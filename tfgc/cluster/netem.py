"""Link emulation: each task in a network namespace of its own, links with a rate and a delay.

Root only; needs `ip` and `tc` (iproute2). Each task runs in its own namespace, joined
to the others by veth pairs on a bridge in one more namespace. Every link's rate is
shaped with a tc token bucket (tbf) on what each task sends, as tc on each machine's
NIC would; a link's one-way delay (and loss rate) is applied to the same frames by
netem where the kernel has it, else by a delay line process in the hub namespace
(`delayline.py`). The chief reaches the tasks through one veth pair whose address is
on a private /24 that no existing route uses; the namespaces have no other interface
and no default route, so nothing leaves them. Everything is deleted on stop.
"""
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
import sys
from typing import Optional, Sequence, Union

from tfgc.cluster import isolation
from tfgc.cluster.processes import ClusterError, pid_alive

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$", re.I)
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}
_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.I)
_DELAY_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_NETNS_PREFIX = "tfgc-"
_DELAY_LINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayline.py")


def parse_rate(rate: str) -> float:
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


def parse_delay(delay: str) -> float:
    """'25ms' -> 0.025 seconds (units us, ms or s; 0 allowed).

    Raises:
      ValueError: not a delay in these units.
    """
    match = _DELAY.match(str(delay).strip())
    if not match:
        raise ValueError(f"delay must look like '25ms', '100us' or '0.1s', got {delay!r}")
    return float(match.group(1)) * _DELAY_SCALE[match.group(2).lower()]


def parse_loss(loss: Union[str, float]) -> float:
    """'1%' or 0.01 -> 0.01: the probability that a link drops a frame.

    Raises:
      ValueError: not in [0, 1) (a link that drops everything carries nothing).
    """
    text = str(loss).strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"loss must look like '1%' or 0.01, got {loss!r}") from None
    if not 0 <= value < 1:
        raise ValueError(f"loss must be in [0, 1), got {loss!r}")
    return value


def parse_link(spec: str) -> dict[str, Optional[str]]:
    """'10mbit/25ms' -> {"bandwidth": "10mbit", "delay": "25ms", "loss": None}.

    A link is its rate, then optionally its one-way delay and its loss rate, joined by
    '/': "100mbit", "10mbit/25ms", "1mbit/50ms/0.1%". No rate leaves the rate unshaped
    ("/25ms"). Each part is checked as `parse_rate`, `parse_delay` and
    `parse_loss` check it.

    Raises:
      ValueError: a part that does not parse, or more than three parts.
    """
    parts = str(spec).strip().split("/")
    if len(parts) > 3 or not any(parts):
        raise ValueError(f"a link looks like '10mbit', '10mbit/25ms' or '10mbit/25ms/1%', "
                         f"got {spec!r}")
    bandwidth = parts[0] or None
    delay = parts[1] if len(parts) > 1 else None
    loss = parts[2] if len(parts) > 2 else None
    if bandwidth is not None:
        parse_rate(bandwidth)
    if delay is not None:
        parse_delay(delay)
    if loss is not None:
        parse_loss(loss)
    if bandwidth is None and delay is None and loss is None:
        raise ValueError(f"a link needs a rate, a delay or a loss rate, got {spec!r}")
    return {"bandwidth": bandwidth, "delay": delay, "loss": loss}


def _run(cmd):
    """Runs `cmd`; returns its stdout. Raises ClusterError with its stderr if it fails."""
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True,
                              timeout=30).stdout
    except subprocess.CalledProcessError as error:
        raise ClusterError(
            f"`{' '.join(cmd)}` failed ({error.returncode}): {error.stderr.strip()}"
        ) from None


def emulation_unavailable() -> Optional[str]:
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


def _has_netem(netns):
    """Whether this kernel has the netem qdisc (tried on a dummy link in `netns`)."""
    probe = ["ip", "-n", netns, "link", "add", "netemprobe", "type", "dummy"]
    if subprocess.run(probe, capture_output=True, timeout=10).returncode:
        return False
    try:
        added = subprocess.run(["tc", "-n", netns, "qdisc", "add", "dev", "netemprobe",
                                "root", "netem", "delay", "1ms"],
                               capture_output=True, timeout=10)
        return added.returncode == 0
    finally:
        subprocess.run(["ip", "-n", netns, "link", "del", "netemprobe"],
                       capture_output=True, timeout=10)


def netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def remove_stale_namespaces() -> list[str]:
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
    """Network namespaces for the tasks, on a bridge, with every link's rate and delay set.

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

    With a `delay`, every frame a task sends also waits that long before it reaches
    the bridge (and is dropped with probability `loss`), so the round trip between two
    tasks is 2 x delay. Where the kernel has netem, a netem qdisc above the tbf on the
    same interface does it; where it has not, each task's veth ends in the hub, off
    the bridge, and a delay line process there (`delayline.py`) moves frames between
    it and a second veth pair on the bridge. The chief's link is delayed alike.

    A `tasks` list that names ("chief", 0) gives the chief a namespace of its own
    too, as on a cluster of separate machines: `hosts` then maps it to that
    namespace's address, and this namespace's link carries nothing of the cluster.

    Args:
      rate: each link's rate in tc units ("10mbit"), or None for no shaping.
      tasks: [(job, index)] of the tasks that get a namespace.
      delay: each link's one-way delay ("25ms"), or None.
      loss: the probability that a link drops a frame ("0.1%" or 0.001), or None.
    """

    _count = 0

    def __init__(self, rate: Optional[str], tasks: Sequence[tuple[str, int]],
                 delay: Optional[str] = None, loss: Union[str, float, None] = None) -> None:
        reason = emulation_unavailable()
        if reason:
            raise ClusterError(reason)
        if rate is None and delay is None and loss is None:
            raise ValueError("an emulated network needs a rate, a delay or a loss rate")
        self.rate = None if rate is None else str(rate)
        self.bits_per_s = None if rate is None else parse_rate(rate)
        self.delay_s = 0.0 if delay is None else parse_delay(delay)
        self.loss = 0.0 if loss is None else parse_loss(loss)
        self.tasks = list(tasks)  # [(job, index)]
        EmulatedNetwork._count += 1
        self.prefix = f"{_NETNS_PREFIX}{os.getpid()}-{EmulatedNetwork._count}"
        self.hub = f"{self.prefix}-hub"
        # Unique among live processes (an interface name has at most 15 characters). A
        # draw from the global `random` was not: training code seeds it, and two test
        # processes seeded alike drew the same name ("RTNETLINK answers: File exists").
        self.root_link = f"tfgc{os.getpid():06x}{EmulatedNetwork._count % 256:02x}"
        self.namespaces: dict[tuple[str, int], str] = {}  # (job, index) -> namespace name
        # (job, index) -> ip; ("chief", 0) is this namespace
        self.hosts: dict[tuple[str, int], str] = {}
        self.delay_method: Optional[str] = None  # "netem" or "delay line", once set up with a delay
        self._created: list[str] = []
        self._line: Optional[subprocess.Popen[str]] = None  # the delay line's Popen
        # [(far end of a task's link, its port to the bridge)]
        self._line_pairs: list[tuple[str, str]] = []

    @property
    def delayed(self) -> bool:
        return self.delay_s > 0 or self.loss > 0

    def _shape(self, device, netns=None):
        """Rate (tbf) and, with netem, delay and loss on what `device` sends."""
        cmd = ["tc"] + (["-n", netns] if netns else [])
        parent = ["root"]
        if self.delayed and self.delay_method == "netem":
            # Sized for the frames one delay holds at the rate (or 64 MB unshaped).
            held = 64 << 20 if self.bits_per_s is None else self.bits_per_s / 8 * self.delay_s
            limit = max(1000, int(4 * held / 1500))
            _run(cmd + ["qdisc", "add", "dev", device, "root", "handle", "1:", "netem",
                        "delay", f"{self.delay_s * 1e6:.0f}us",
                        "loss", f"{self.loss * 100:.6f}%", "limit", str(limit)])
            parent = ["parent", "1:1", "handle", "10:"]
        if self.bits_per_s is None:
            return
        # Burst: at least 64 KB (one GSO super-packet), about 4 ms at line rate above that.
        # The queue only ever holds what TCP's small-queue limit lets one host's sockets
        # put in it (the sender's own qdisc pushes back), so it never drops.
        burst = max(64 * 1024, int(self.bits_per_s / 8 / 250))
        limit = min(64 << 20, max(2 << 20, int(self.bits_per_s / 8)))
        _run(cmd + ["qdisc", "add", "dev", device, *parent, "tbf",
                    "rate", self.rate, "burst", str(burst), "limit", str(limit)])

    def setup(self) -> dict[tuple[str, int], str]:
        """Creates and shapes everything; returns {(job, index): ip}. Undone on error."""
        remove_stale_namespaces()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return dict(self.hosts)

    def _attach(self, name):
        """Joins `name`, the hub end of a task's link, to the bridge.

        Directly, or, where a delay line delays the link, through the line: `name`
        stays off the bridge, and the line moves its frames to and from `l<name>`,
        whose veth peer `b<name>` is the bridge port.
        """
        hub = self.hub
        if self.delay_method != "delay line":
            _run(["ip", "-n", hub, "link", "set", name, "master", "br0", "up"])
            return
        line_end, bridge_end = f"l{name}", f"b{name}"
        _run(["ip", "-n", hub, "link", "add", line_end, "type", "veth",
              "peer", "name", bridge_end])
        _run(["ip", "-n", hub, "link", "set", bridge_end, "master", "br0", "up"])
        _run(["ip", "-n", hub, "link", "set", line_end, "up"])
        _run(["ip", "-n", hub, "link", "set", name, "up"])
        self._line_pairs.append((name, line_end))

    def _setup(self):
        subnet = _free_subnet()
        ips = subnet.hosts()
        hub = self.hub
        _run(["ip", "netns", "add", hub])
        self._created.append(hub)
        _run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", hub, "link", "set", "br0", "up"])
        if self.delayed:
            self.delay_method = "netem" if _has_netem(hub) else "delay line"

        root_ip = str(next(ips))
        _run(["ip", "link", "add", self.root_link, "type", "veth",
              "peer", "name", "chief", "netns", hub])
        self._attach("chief")
        _run(["ip", "addr", "add", f"{root_ip}/{subnet.prefixlen}", "dev", self.root_link])
        self._single_segments(self.root_link)
        _run(["ip", "link", "set", self.root_link, "up"])
        self._shape(self.root_link)
        self.hosts[("chief", 0)] = root_ip

        for k, task in enumerate(self.tasks):
            ns = f"{self.prefix}-{task[0]}{task[1]}"
            ip = str(next(ips))
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            port = f"p{k}"
            _run(["ip", "-n", hub, "link", "add", port, "type", "veth",
                  "peer", "name", "eth0", "netns", ns])
            self._attach(port)
            _run(["ip", "-n", ns, "addr", "add", f"{ip}/{subnet.prefixlen}", "dev", "eth0"])
            self._single_segments("eth0", ns)
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._shape("eth0", ns)  # what the task sends
            self.namespaces[task] = ns
            self.hosts[task] = ip
        if self._line_pairs:
            self._start_delay_line()

    def _single_segments(self, device, netns=None):
        """With a loss rate, `device` sends one segment per frame, so that a loss is one
        packet's, not a 64 KB offload burst's."""
        if self.loss:
            _run(["ip"] + (["-n", netns] if netns else []) +
                 ["link", "set", "dev", device, "gso_max_segs", "1"])

    def _start_delay_line(self):
        cmd = ["ip", "netns", "exec", self.hub, sys.executable, "-S", _DELAY_LINE,
               "--delay-ms", repr(self.delay_s * 1e3), "--loss", repr(self.loss),
               "--parent", str(os.getpid()),
               *(f"{inner}:{outer}" for inner, outer in self._line_pairs)]
        # Queue: 4x what one delay holds at the rate, at least 4 MB per direction.
        held = 16 << 20 if self.bits_per_s is None else self.bits_per_s / 8 * self.delay_s
        cmd += ["--queue-bytes", str(int(max(4 << 20, 4 * held)))]
        self._line = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        first = self._line.stdout.readline().strip()
        if first != "ready":
            self._line.kill()
            _, err = self._line.communicate(timeout=10)
            raise ClusterError(f"the delay line did not start: {first} {err.strip()}")

    def delay_line_counts(self) -> dict[str, dict[str, int]]:
        """What the delay line forwarded, delayed, lost and dropped, per link; stops it.

        Returns:
          {"<task port>:<line port>": {"delayed": frames, "passed": frames, "lost":
          frames, "overflow": frames, "send_errors": frames}}, or {} without a line.
        """
        if self._line is None:
            return {}
        if self._line.poll() is None:
            self._line.terminate()
        out, _ = self._line.communicate(timeout=10)
        self._line = None
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}

    def teardown(self) -> None:
        """Stops the delay line; deletes the namespaces (with their links) and the chief's
        link; idempotent."""
        if self._line is not None:
            if self._line.poll() is None:
                self._line.terminate()
            try:
                self._line.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self._line.kill()
                self._line.communicate()
            self._line = None
        for ns in reversed(self._created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._created = []
        # Gone with its peer in the hub namespace already; make sure.
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True, timeout=30)

    def exec_prefix(self, task: tuple[str, int]) -> list[str]:
        """Command prefix that runs a program inside `task`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[task]]

    def link_bytes(self, task: tuple[str, int]) -> dict[str, int]:
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
