"""What crosses between a worker and its parameter server in one training step, by kind.

Runs `python -m models.train --strategy ps --ps 1 --workers N` (ResNet-20 and one
worker by default), waits for steady steps, records what worker 0 and the parameter
server write to their sockets with `strace` for a few seconds, splits the bytes each
sends the other into HTTP/2 frames and gRPC messages, and sorts the messages by what
TensorFlow's runtime uses them for. From the worker to the server:

  function call    the worker asks the server to run its part of the step
                   (RunComponentFunction); its size grows with the remote resource
                   handles it carries, one per resource that part touches
  tensor requests  the worker asks for each tensor it receives from the server
                   (RecvTensor): batch-norm statistics read by Keras, pull messages,
                   metric totals, the learning-rate step
  tensors sent     the server fetches each tensor the worker made for it: the fused
                   message (uint8) and the float tensors Keras writes (batch-norm
                   moving statistics), ints
  framing          HTTP/2 frame headers, gRPC headers, window updates, pings

and the same kinds the other way (the server's requests, the tensors it sends: the
pull message, the statistics Keras reads).

Per step = bytes / the steps of the function calls seen (--steps-per-execution each).
It needs `strace` and the right to trace
a child process (root, or ptrace_scope 0):

    python -m benchmarks.wire_breakdown --compression threelc:sparsity=1.0
    python -m benchmarks.wire_breakdown --compression none        # fp32, as Keras sends it
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SENDMSG = re.compile(r"sendmsg\((\d+), \{msg_name=NULL, msg_namelen=0, msg_iov=\[(.*)\], "
                      r"msg_iovlen.*= (\d+)$")
_IOV = re.compile(r'iov_base="((?:\\x[0-9a-f]{2})*)"')
_DTYPES = {1: "float32", 3: "int32", 4: "uint8", 9: "int64", 10: "bool", 19: "float16"}


def descendants(pid):
    """PIDs of `pid`'s children, recursively (from /proc)."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children[parent].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children[todo.pop()]:
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def server_pids(root):
    """{(job, index): pid} of the tfgc servers started under process `root`."""
    servers = {}
    for pid in descendants(root):
        args = cmdline(pid)
        if b"tfgc._server" in args:
            job = args[args.index(b"--job") + 1].decode()
            servers[(job, int(args[args.index(b"--index") + 1]))] = pid
    return servers


def socket_fds(pid):
    """{fd: socket inode} of `pid`'s open sockets."""
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            fds[int(fd)] = int(target[8:-1])
    return fds


def socket_ports(pid):
    """{socket inode: (local port, remote port)} of `pid`'s TCP sockets."""
    inodes = set(socket_fds(pid).values())
    ports = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                inode = int(fields[9])
                if inode in inodes:
                    ports[inode] = (int(fields[1].rsplit(":", 1)[1], 16),
                                    int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def fds_to(worker, server):
    """The worker's socket fds whose other end is `server`'s process."""
    server_ports = {local for local, _ in socket_ports(server).values()}
    worker_ports = socket_ports(worker)
    return {fd for fd, inode in socket_fds(worker).items()
            if inode in worker_ports and worker_ports[inode][1] in server_ports}


def sent_bytes(strace_path, fds):
    """{fd: the bytes the traced process sent on it, in order (partial writes cut),
    from its first write that starts a run of well-formed HTTP/2 frames}: the trace
    begins wherever the process was, maybe inside a frame (a large tensor's), and
    parsing from there would misread everything after."""
    streams, writes = collections.defaultdict(bytearray), collections.defaultdict(list)
    unfinished = {}  # thread -> the start of its call, which another thread's interrupted
    with open(strace_path) as f:
        for line in f:
            thread, _, line = line.rstrip().partition(" ")
            line = line.lstrip()
            if line.endswith(" <unfinished ...>"):
                unfinished[thread] = line[:-len(" <unfinished ...>")]
                continue
            if line.startswith("<... sendmsg resumed>"):
                line = unfinished.pop(thread, "") + line[len("<... sendmsg resumed>"):]
            match = _SENDMSG.search(line)
            if match and int(match.group(1)) in fds:
                data = b"".join(bytes.fromhex(b.replace("\\x", ""))
                                for b in _IOV.findall(match.group(2)))
                fd = int(match.group(1))
                writes[fd].append(len(streams[fd]))
                streams[fd] += data[:int(match.group(3))]
    return {fd: data[next((start for start in writes[fd] if frames_from(data, start)),
                          len(data)):]
            for fd, data in streams.items()}


def frames_from(data, start):
    """Whether `data` from `start` on reads as HTTP/2 frames to its end (the last
    one may be cut by the end of the trace)."""
    i = start
    while i + 9 <= len(data):
        kind, stream = data[i + 3], int.from_bytes(data[i + 5:i + 9], "big")
        if kind > 9 or stream & 0x80000000:
            return False
        if (kind in (4, 6, 7) and stream) or (kind in (0, 1, 2, 3, 5, 9) and not stream):
            return False  # settings, ping, goaway: connection; the rest on a stream
        i += 9 + int.from_bytes(data[i:i + 3], "big")
    return True


def grpc_messages(data):
    """The gRPC messages in a run of HTTP/2 frames (whole frames expected)."""
    per_stream, i = collections.defaultdict(bytearray), 0
    while i + 9 <= len(data):
        length, kind = int.from_bytes(data[i:i + 3], "big"), data[i + 3]
        stream = int.from_bytes(data[i + 5:i + 9], "big") & 0x7FFFFFFF
        if kind == 0:  # DATA
            per_stream[stream] += data[i + 9:i + 9 + length]
        i += 9 + length
    messages = []
    for buffer in per_stream.values():
        j = 0
        while j + 5 <= len(buffer):
            n = int.from_bytes(buffer[j + 1:j + 5], "big")
            messages.append(bytes(buffer[j + 5:j + 5 + n]))
            j += 5 + n
    return messages


def tensor_dtype(message):
    """The dtype of a RecvTensorResponse's tensor, or None if it is not one."""
    # RecvTensorResponse: field 1 (TensorProto), whose field 1 is the dtype. Its
    # send_start_micros (field 3) may come first.
    j = 0
    if message[:1] == b"\x18":
        j = 1
        while j < len(message) and message[j] & 0x80:
            j += 1
        j += 1
    if message[j:j + 1] != b"\n":
        return None
    j += 1
    while j < len(message) and message[j] & 0x80:
        j += 1
    j += 1
    if message[j:j + 1] != b"\x08" or j + 1 >= len(message):
        return None
    return _DTYPES.get(message[j + 1], f"dtype {message[j + 1]}")


def classify(messages, server_device, edges=None):
    """{kind: [count, bytes]} of the messages; the number of function calls. Tensor
    requests' edge names are counted in `edges` (a Counter) when given."""
    kinds = collections.defaultdict(lambda: [0, 0])
    handles = calls = 0
    for message in messages:
        if b"_partitioned" in message:
            calls += 1
            handles += message.count(server_device) // 2  # device and op_device
            kind = "function call"
        elif b";edge_" in message:
            # A request cut by the end of the trace may lack the end of its key.
            edge = re.search(rb";edge_\d+_([^;]+);", message)
            if edge and edges is not None:
                edges[edge.group(1).decode(errors="replace")] += 1
            kind = ("tensor requests: batch-norm statistics"
                    if edge and b"BatchNorm" in edge.group(1) else "tensor requests: other")
        else:
            dtype = tensor_dtype(message)
            if dtype == "uint8":
                kind = "tensors sent: uint8 (fused messages)"
            elif dtype is not None:
                kind = f"tensors sent: {dtype}"
            else:
                kind = "other messages"
        kinds[kind][0] += 1
        kinds[kind][1] += len(message)
    return kinds, calls, handles


def tally(streams, server_device, edges=None):
    """({kind: [messages, bytes]}, all bytes, function calls, remote handles) of the
    bytes sent on some sockets ({fd: bytes}); requests' edges counted in `edges`."""
    kinds, calls, handles, total, counted = collections.defaultdict(lambda: [0, 0]), 0, 0, 0, 0
    for data in streams.values():
        total += len(data)
        messages = grpc_messages(data)
        counted += sum(len(m) for m in messages)
        these, c, h = classify(messages, server_device, edges)
        calls, handles = calls + c, handles + h
        for kind, (n, b) in these.items():
            kinds[kind][0] += n
            kinds[kind][1] += b
    kinds["framing (HTTP/2, gRPC headers)"] = [0, total - counted]
    return kinds, total, calls, handles


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compression", default="threelc:sparsity=1.0")
    parser.add_argument("--pull-compression", default=None,
                        help="default: the same as --compression")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--workers", type=int, default=1, help="worker 0 is traced")
    parser.add_argument("--local-steps", type=int, default=1,
                        help="models.train --local-steps: bytes per step then average "
                             "the steps that meet and those that do not")
    parser.add_argument("--outer-optimizer", choices=("average", "nesterov"),
                        default="average",
                        help="with --local-steps: models.train --outer-optimizer (average, "
                             "as models.cluster_demo's local-steps runs)")
    parser.add_argument("--steps-per-execution", type=int, default=1,
                        help="models.train --steps-per-execution: steps per function call")
    parser.add_argument("--warm-epochs", type=int, default=4,
                        help="Keras epochs (of 10 steps, or the first multiple of "
                             "--steps-per-execution from 10) before tracing starts")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to trace")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--requests", action="store_true",
                        help="also list the tensors requested each way, by graph edge")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        sys.exit("wire_breakdown needs strace (apt-get install strace)")
    pull = args.pull_compression or args.compression
    # Epochs of whole calls (10 steps, or the first multiple of N from 10), so that
    # every call runs N steps.
    epoch_steps = -(-10 // args.steps_per_execution) * args.steps_per_execution
    out = tempfile.mkdtemp(prefix="wire_breakdown_")
    command = [sys.executable, "-m", "models.train", "--strategy", "ps", "--ps", "1",
               "--workers", str(args.workers), "--model", args.model, "--dataset", args.dataset,
               "--train-limit", "4000", "--test-limit", "500", "--steps", "10000",
               "--log-every", str(epoch_steps), "--compression", args.compression,
               # As make demo: decay applied on the server (an L2 term in the loss
               # would have fp32 read every kernel twice per step).
               "--weight-decay-mode", "optimizer",
               "--pull-compression", pull, "--local-steps", str(args.local_steps),
               "--outer-optimizer", args.outer_optimizer,
               "--steps-per-execution", str(args.steps_per_execution),
               "--out", os.path.join(out, "run"),
               "--timeout", str(args.timeout)]
    print("[wire_breakdown]", " ".join(command[1:]), flush=True)
    log = open(os.path.join(out, "train.log"), "w")  # the run's whole life
    run = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            if run.poll() is not None:
                sys.exit(f"the training run ended early (rc {run.returncode}); see {log.name}")
            if time.monotonic() > deadline:
                sys.exit(f"no steady steps within {args.timeout} s; see {log.name}")
            with open(log.name) as f:
                epochs = re.findall(r"^Epoch (\d+)/", f.read(), re.M)
            if epochs and int(epochs[-1]) > args.warm_epochs:
                break
            time.sleep(1)
        servers = server_pids(run.pid)
        worker, server = servers[("worker", 0)], servers[("ps", 0)]
        # Both processes at once, over the same steps: the worker's writes to the
        # server (pushes) and the server's to the worker (pulls).
        traces = {pid: os.path.join(out, f"strace.{pid}") for pid in (worker, server)}
        tracers = [subprocess.Popen(
            ["timeout", str(args.seconds), "strace", "-f", "-qq", "-p", str(pid), "-e",
             "trace=sendmsg", "-s", "8000000", "-xx", "-o", path]) for pid, path in traces.items()]
        for tracer in tracers:
            tracer.wait()
        pushed = sent_bytes(traces[worker], fds_to(worker, server))
        pulled = sent_bytes(traces[server], fds_to(server, worker))
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=60)
    device = b"/job:ps/replica:0/task:0/device:CPU:0"
    push_edges, pull_edges = collections.Counter(), collections.Counter()
    push_kinds, push_total, calls, handles = tally(pushed, device, push_edges)
    if not calls:
        sys.exit("no step was seen while tracing; trace longer (--seconds)")
    handles_per_call = handles / calls
    calls *= args.steps_per_execution  # from here on: steps
    pull_kinds, pull_total, _, _ = tally(pulled, device, pull_edges)
    print(f"\n{args.model}, --compression {args.compression} --pull-compression {pull}, "
          f"--local-steps {args.local_steps} ({args.outer_optimizer} meetings), "
          f"--steps-per-execution {args.steps_per_execution}, "
          f"1 PS + {args.workers} worker(s); per step of worker 0, over {calls} steps "
          f"({handles_per_call:.0f} remote handles per function call)")
    summary = {"local_steps": args.local_steps, "outer_optimizer": args.outer_optimizer,
               "steps_per_execution": args.steps_per_execution,
               "calls": calls // args.steps_per_execution, "steps": calls,
               "handles_per_call": handles_per_call}
    for direction, kinds, total in (("worker 0 -> PS", push_kinds, push_total),
                                    ("PS -> worker 0", pull_kinds, pull_total)):
        print(f"\n{direction}\n\n| kind | messages / step | bytes / step | share |\n"
              "|---|---|---|---|")
        for kind, (n, b) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            print(f"| {kind} | {n / calls:.1f} | {b / calls:,.0f} | {b / max(total, 1):.0%} |")
        print(f"| all | | {total / calls:,.0f} | 100% |")
        summary[direction] = {"bytes_per_step": total / calls,
                              "kinds": {k: v[1] / calls for k, v in kinds.items()}}
    if args.requests:
        for who, edges in (("worker 0 asks the PS for", push_edges),
                           ("the PS asks worker 0 for", pull_edges)):
            print(f"\n{who} (per step, by graph edge)")
            for edge, n in edges.most_common():
                print(f"  {n / calls:5.1f}  {edge}")
    print(json.dumps(summary))
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
