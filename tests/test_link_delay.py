"""Emulated links with a delay: round trips of 2 x delay, the rate kept, nothing left over.

The kernel here may have no netem qdisc; then `tfgc/cluster/netem.py` delays the links
with a delay line process in the hub namespace, which is what these tests measure.
They time what crosses the links with no TensorFlow in the tasks: an ICMP echo (a
ping, from a raw socket) and a TCP transfer between two task namespaces.
"""
import json
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

from tfgc import cluster
from tfgc.cluster import netem
from tfgc.cluster.processes import pid_alive

needs_emulation = pytest.mark.skipif(
    cluster.emulation_unavailable() is not None,
    reason=str(cluster.emulation_unavailable()),
)

# Echo requests from a raw ICMP socket; prints the round trips in seconds.
PING = textwrap.dedent("""
    import json, os, socket, struct, sys, time

    def checksum(data):
        total = sum(struct.unpack(f"!{len(data) // 2}H", data))
        total = (total >> 16) + (total & 0xFFFF)
        return ~(total + (total >> 16)) & 0xFFFF

    host, count = sys.argv[1], int(sys.argv[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.settimeout(5)
    ident, rtts = os.getpid() & 0xFFFF, []
    for seq in range(count):
        body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + bytes(56)
        packet = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
        sent = time.monotonic()
        sock.sendto(packet, (host, 0))
        while True:
            reply = sock.recv(2048)
            kind, _, _, got_ident, got_seq = struct.unpack("!BBHHH", reply[20:28])
            if kind == 0 and (got_ident, got_seq) == (ident, seq):
                break
        rtts.append(time.monotonic() - sent)
        time.sleep(0.05)
    print(json.dumps(rtts))
""")

# A TCP receiver: counts the bytes after its first second (slow start is over by then)
# until the sender closes; prints {"bytes", "seconds"} of that window.
RECEIVE = textwrap.dedent("""
    import json, socket, time
    server = socket.create_server(("0.0.0.0", 5001))
    print("listening", flush=True)
    conn, _ = server.accept()
    first = time.monotonic()
    counted, start = 0, None
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        now = time.monotonic()
        if now - first >= 1.0:
            start = start or now
            counted += len(chunk)
            last = now
    print(json.dumps({"bytes": counted, "seconds": last - start}))
""")

SEND = textwrap.dedent("""
    import socket, sys, time
    conn = socket.create_connection((sys.argv[1], 5001), timeout=10)
    block, deadline = bytes(1 << 16), time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        conn.sendall(block)
    conn.close()
""")

TASKS = [("worker", 0), ("worker", 1)]


def _in(net, task, code, *args):
    return [*net.exec_prefix(task), sys.executable, "-c", code, *map(str, args)]


def _ping(net, source, target_ip, count):
    done = subprocess.run(_in(net, source, PING, target_ip, count), capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def _tcp_rate(net, sender, receiver, seconds):
    """Bits per second a TCP transfer reached from `sender` to `receiver`."""
    listener = subprocess.Popen(_in(net, receiver, RECEIVE), stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        subprocess.run(_in(net, sender, SEND, net.hosts[receiver], seconds), timeout=60,
                       check=True)
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
        listener.wait()
    window = json.loads(out)
    return window["bytes"] * 8 / window["seconds"]


@pytest.mark.cluster
@needs_emulation
@pytest.mark.parametrize("rate, delay", [("20mbit", "10ms"), ("5mbit", "50ms")])
def test_round_trips_take_twice_the_delay_and_transfers_keep_the_rate(rate, delay):
    net = netem.EmulatedNetwork(rate, TASKS, delay=delay)
    try:
        hosts = net.setup()
        rtt = 2 * netem.parse_delay(delay)
        # The first echo also waits for the neighbour lookup (a round trip of its own).
        between_tasks = _ping(net, TASKS[0], hosts[TASKS[1]], 12)[2:]
        assert abs(statistics.median(between_tasks) - rtt) <= 0.1 * rtt, between_tasks
        assert min(between_tasks) >= 0.98 * rtt, between_tasks  # never early
        from_chief = json.loads(subprocess.run(
            [sys.executable, "-c", PING, hosts[TASKS[0]], "8"], capture_output=True,
            text=True, timeout=60, check=True).stdout)[2:]
        assert abs(statistics.median(from_chief) - rtt) <= 0.1 * rtt, from_chief
        measured = _tcp_rate(net, TASKS[0], TASKS[1], seconds=4)
        assert abs(measured - netem.parse_rate(rate)) <= 0.1 * netem.parse_rate(rate), measured
        line = net._line.pid if net.delay_method == "delay line" else None
        counts = net.delay_line_counts()
    finally:
        net.teardown()
    if line is not None:
        # Every link's frames went through the line, none overflowed its queue.
        assert set(counts) == {"chief:lchief", "p0:lp0", "p1:lp1"}
        assert all(c["delayed"] > 0 and c["overflow"] == 0 for c in counts.values()), counts
        assert not pid_alive(line)
    assert not [n for n in netem.netns_list() if n.startswith(net.prefix)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert net.root_link not in links


# Datagrams, each one frame, to a port nobody listens on (the replies are not counted).
DATAGRAMS = textwrap.dedent("""
    import socket, sys, time
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(int(sys.argv[2])):
        sock.sendto(bytes(64), (sys.argv[1], 9))
        time.sleep(0.0005)
""")


@pytest.mark.cluster
@needs_emulation
def test_a_lossy_link_drops_its_share_of_frames():
    net = netem.EmulatedNetwork(None, TASKS, delay="1ms", loss="20%")
    try:
        hosts = net.setup()
        if net.delay_method != "delay line":
            pytest.skip("netem drops these frames; the count is the delay line's")
        subprocess.run(_in(net, TASKS[0], DATAGRAMS, hosts[TASKS[1]], 2000), timeout=60,
                       check=True)
        counts = net.delay_line_counts()
    finally:
        net.teardown()
    ours = counts["p0:lp0"]
    sent = ours["delayed"] + ours["lost"]
    # 20% of what p0 sent, within 5 standard deviations of a binomial draw.
    assert sent >= 2000 and abs(ours["lost"] / sent - 0.2) < 5 * (0.16 / sent) ** 0.5, ours


@pytest.mark.cluster
@needs_emulation
def test_the_links_outlive_the_servers_until_their_closes_have_crossed():
    # A connection whose close the teardown dropped would stay open in this process:
    # a later use of it (a collected resource's destroy) waits for TCP to give up.
    import socket

    from tfgc.cluster.sockets import parse_address, ss_listing

    c = cluster.LocalCluster(num_ps=1, num_workers=1, delay="100ms", timeout_s=120)
    c.start()
    try:
        ps = parse_address(c.addresses["ps"][0])
        held = socket.create_connection(ps, timeout=30)
    finally:
        c.stop()
    try:
        still_open = [s for s in ss_listing(["state", "established"])
                      if s["peer"] == ps and s["pid"] == os.getpid()]
        assert not still_open, still_open
    finally:
        held.close()


def test_link_specs_parse_and_refuse_what_tc_would_not_take():
    assert netem.parse_link("10mbit/25ms") == {"bandwidth": "10mbit", "delay": "25ms",
                                               "loss": None}
    assert netem.parse_link("1mbit/50ms/0.1%")["loss"] == "0.1%"
    assert netem.parse_link("/25ms")["bandwidth"] is None
    assert netem.parse_delay("25ms") == 0.025 and netem.parse_delay("100us") == pytest.approx(1e-4)
    assert netem.parse_loss("1%") == 0.01 and netem.parse_loss(0.5) == 0.5
    for bad in ("10mbit/25", "10 mbit", "10mbit/25ms/x", "-/25ms", "/", "10mbit/1ms/1%/1", ""):
        with pytest.raises(ValueError):
            netem.parse_link(bad)
    for bad in ("100%", "-1%", 1.0):
        with pytest.raises(ValueError, match="loss"):
            netem.parse_loss(bad)
    with pytest.raises(ValueError, match="delay"):
        cluster.LocalCluster(delay="25 ms")
    assert cluster.LocalCluster(bandwidth="10mbit", delay="25ms").link == "10mbit/25ms"
    assert cluster.LocalCluster().link is None


@pytest.mark.cluster
@needs_emulation
def test_the_delay_line_ends_with_its_launcher():
    # A launcher killed before its teardown: the line notices that its parent is gone
    # and exits, so its namespace does not live on through it.
    code = textwrap.dedent("""
        from tfgc.cluster import netem
        net = netem.EmulatedNetwork(None, [("worker", 0)], delay="5ms")
        net.setup()
        print(net.prefix, net._line.pid, flush=True)
        import os
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    prefix, line = done.stdout.split()[-2], int(done.stdout.split()[-1])
    for _ in range(50):
        if not pid_alive(line):
            break
        subprocess.run(["sleep", "0.1"])
    assert not pid_alive(line)
    # Its namespaces outlive it until the next network's start removes them.
    assert [n for n in netem.netns_list() if n.startswith(prefix)]
    netem.remove_stale_namespaces()
    assert not [n for n in netem.netns_list() if n.startswith(prefix)]


def test_command_lines_refuse_a_bad_link_before_anything_starts(tmp_path, capsys):
    from models import train
    from tfgc.cluster import cli

    script = tmp_path / "noop.py"
    script.write_text("")
    for argv in (["--link", "10mbit/25", str(script)],
                 ["--link", "10mbit", "--bandwidth", "10mbit", str(script)]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
    assert "25ms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--strategy", "local", "--link", "10mbit/25ms"])
    assert "--strategy ps or mwms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--strategy", "ps", "--link", "10mbit/25ms/2"])
    assert "loss" in capsys.readouterr().err
