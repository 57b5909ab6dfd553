"""A delay line for emulated links where the kernel has no netem qdisc.

Run as a script (standard library only, so it starts in a fraction of a second and
imports neither tfgc nor TensorFlow) inside the hub namespace of an
`netem.EmulatedNetwork`:

    python delayline.py --delay-ms 25 [--loss 0.01] --parent PID  in0:out0 in1:out1 ...

Each `in:out` pair joins two interfaces of that namespace: `in` is the far end of a
task's link (what the task sends arrives there), `out` leads to the bridge. Every frame
that arrives on `in` waits `delay` before it leaves through `out`, as netem on the
task's own NIC would hold it; frames from the bridge pass back through `in` at once. A
round trip between two tasks is then 2 x delay. With `--loss`, each delayed frame is
dropped with that probability.

Frames are read and written with AF_PACKET sockets and their virtio-net headers, so
the kernel's segmentation offload (frames of up to 64 KB) and checksum offload work
across the line as they do across a bridge. Each direction's queue is bounded in
bytes; a frame that would overflow it is dropped and counted (TCP paces itself so
that this only happens when the line's process cannot keep up).

It prints "ready" once every socket is bound, exits on SIGTERM and as soon as the
`--parent` process is gone (its namespace would otherwise outlive a crashed
launcher), and prints what it forwarded and dropped on exit.
"""
import argparse
import collections
import json
import os
import random
import select
import signal
import socket
import sys
import time
from typing import Optional, Sequence

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_VNET_HDR = 15
_PACKET_IGNORE_OUTGOING = 23
# A virtio-net header, then a frame of at most 64 KB (a segmentation-offload frame).
_MAX_FRAME = 10 + (1 << 16) + 64
_PARENT_CHECK_S = 0.5


def _packet_socket(interface):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    sock.setsockopt(_SOL_PACKET, _PACKET_VNET_HDR, 1)
    # Not the frames this process writes to the interface itself.
    sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
    sock.bind((interface, 0))
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    return sock


class _Line:
    """One link: frames from `inner` are delayed to `outer`; the other way passes."""

    def __init__(self, inner, outer, queue_bytes):
        self.inner = _packet_socket(inner)
        self.outer = _packet_socket(outer)
        self.queue = collections.deque()  # (due, frame)
        self.queued_bytes = 0
        self.queue_bytes = queue_bytes
        self.stats = {"delayed": 0, "passed": 0, "lost": 0, "overflow": 0, "send_errors": 0}


def _send(sock, frame, stats):
    try:
        sock.send(frame)
    except (BlockingIOError, OSError):
        # A full socket buffer or a link going down: the frame is lost, as a NIC
        # would drop it, and TCP recovers.
        stats["send_errors"] += 1


def run(pairs: Sequence[tuple[str, str]], delay_s: float, loss: float, queue_bytes: int,
        parent: int, seed: Optional[int] = None) -> dict[str, dict[str, int]]:
    """Forwards frames until SIGTERM or until `parent` is gone; returns the counts."""
    rng = random.Random(seed)
    lines = [_Line(inner, outer, queue_bytes) for inner, outer in pairs]
    readers = {}
    for line in lines:
        readers[line.inner.fileno()] = (line, True)
        readers[line.outer.fileno()] = (line, False)
    poller = select.epoll()
    for fd in readers:
        poller.register(fd, select.EPOLLIN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    print("ready", flush=True)
    next_parent_check = time.monotonic() + _PARENT_CHECK_S
    while not stopping:
        now = time.monotonic()
        if now >= next_parent_check:
            if parent and os.getppid() != parent:
                break
            next_parent_check = now + _PARENT_CHECK_S
        due = min((line.queue[0][0] for line in lines if line.queue),
                  default=next_parent_check)
        try:
            events = poller.poll(max(0.0, min(due, next_parent_check) - now))
        except InterruptedError:
            continue
        for fd, _ in events:
            line, delayed = readers[fd]
            sock = line.inner if delayed else line.outer
            while True:
                try:
                    frame = sock.recv(_MAX_FRAME)
                except OSError:  # nothing more to read now (or the link went down)
                    break
                if not delayed:
                    _send(line.inner, frame, line.stats)
                    line.stats["passed"] += 1
                elif loss and rng.random() < loss:
                    line.stats["lost"] += 1
                elif line.queued_bytes + len(frame) > line.queue_bytes:
                    line.stats["overflow"] += 1
                else:
                    line.queue.append((time.monotonic() + delay_s, frame))
                    line.queued_bytes += len(frame)
        now = time.monotonic()
        for line in lines:
            while line.queue and line.queue[0][0] <= now:
                _, frame = line.queue.popleft()
                line.queued_bytes -= len(frame)
                _send(line.outer, frame, line.stats)
                line.stats["delayed"] += 1
    return {f"{inner}:{outer}": line.stats for (inner, outer), line in zip(pairs, lines)}


def _pair(text):
    inner, sep, outer = text.partition(":")
    if not sep or not inner or not outer:
        raise argparse.ArgumentTypeError(f"expected IN:OUT interface names, got {text!r}")
    return inner, outer


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", type=_pair, metavar="IN:OUT")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--queue-bytes", type=int, default=16 << 20)
    parser.add_argument("--parent", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or not 0 <= args.loss < 1:
        parser.error("need --delay-ms >= 0 and 0 <= --loss < 1")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)  # the line's timing is the link's latency
    except OSError:
        pass
    counts = run(args.pairs, args.delay_ms / 1e3, args.loss, args.queue_bytes,
                 args.parent, args.seed)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
