"""TF_CONFIG end to end, as on separate machines.

Every task of a cluster is a process in a network namespace of its own, with an
address of its own (`netem.EmulatedNetwork`, whose 10 Gbit/s links carry the traffic
without shaping it), started only the way a machine of a real cluster starts it
(docs/deployment.md), each with its own TF_CONFIG naming the namespaces' addresses:
`python -m tfgc.server` for the ps and worker tasks of ParameterServerStrategy,
`python -m models.train --tf-config` for its chief and for the workers of
MultiWorkerMirroredStrategy. What crossed the wire is read from the kernel, from
outside the tasks: each task's socket counters (`ss` in its namespace) and the
counters of its link.

Root only (it makes namespaces, veth pairs and qdiscs); skipped elsewhere.
"""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tfgc.cluster import isolation, netem, processes, sockets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATE = "10gbit"  # far above what the tasks send here: the links shape nothing
# One port for every task, each on an address of its own, as on separate machines.
PORT = 2222
RUN_TIMEOUT_S = 180
# The smallest ResNet-20 run models.train allows here: digits (bundled with
# scikit-learn, so offline), few images, small batches, no TensorBoard.
TRAIN = ["-m", "models.train", "--tf-config", "--model", "resnet20", "--dataset", "digits",
         "--train-limit", "256", "--test-limit", "64", "--batch-size", "16",
         "--no-tensorboard", "--compression", "threelc"]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(netem.emulation_unavailable() is not None,
                       reason=f"each task needs a network namespace of its own, and "
                              f"{netem.emulation_unavailable()}"),
]


class Machines:
    """The tasks of a cluster, each a process in a network namespace of its own.

    Leaving the `with` block kills every process it started (by pid, with its process
    group) and reaps it, then deletes the namespaces and links, whatever happened.
    """

    def __init__(self, tasks, log_dir):
        self.net = netem.EmulatedNetwork(RATE, tasks)
        self.log_dir = log_dir
        self.procs = {}  # (job, index) -> Popen
        self.cluster = None

    def __enter__(self):
        hosts = self.net.setup()
        self.cluster = {}
        for task in self.net.tasks:
            self.cluster.setdefault(task[0], []).append(f"{hosts[task]}:{PORT}")
        return self

    def __exit__(self, *exc):
        try:
            for proc in self.procs.values():
                processes.kill_group(proc)
        finally:
            self.net.teardown()
        return False

    def tf_config(self, task):
        return {"cluster": self.cluster, "task": {"type": task[0], "index": task[1]}}

    def log(self, task):
        return os.path.join(self.log_dir, f"{task[0]}{task[1]}.log")

    def start(self, task, argv):
        """Starts `python ARGV` as `task`, in its namespace, with its own TF_CONFIG."""
        env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(self.tf_config(task)))
        with open(self.log(task), "w") as log:
            self.procs[task] = subprocess.Popen(
                [*self.net.exec_prefix(task), sys.executable, *argv], cwd=REPO, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=processes.die_with_parent)
        return self.procs[task]

    def wait(self, task, timeout_s):
        """`task`'s exit code; fails the test with its log's tail if it runs too long."""
        try:
            return self.procs[task].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{task} still ran after {timeout_s} s:\n{self.tail(task)}")

    def tail(self, task, lines=40):
        return processes.log_tail(self.log(task), lines)

    def traffic(self, task):
        """{peer task: {"sent", "received"}} over `task`'s open connections, read by
        `ss` in its namespace."""
        return sockets.task_traffic(self.tf_config(task), pid=self.procs[task].pid,
                                    netns=self.net.namespaces[task])

    def strangers(self, task):
        """Established connections of `task`'s namespace to anything but a task."""
        hosts = {address.rsplit(":", 1)[0] for a in self.cluster.values() for address in a}
        return [(s["local"], s["peer"]) for s in sockets.ss_sockets(
            ["state", "established"], netns=self.net.namespaces[task])
            if s["peer"][0] not in hosts]


def _left_behind(net):
    """The namespaces and the launcher's link of `net` that still exist."""
    namespaces = [n for n in netem.netns_list() if n.startswith(net.prefix + "-")]
    return namespaces + [n for n in isolation.interfaces() if n == net.root_link]


def _outputs(out):
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "history.csv")) as f:
        rows = list(csv.DictReader(f))
    assert os.path.getsize(os.path.join(out, "plot.png")) > 1000
    return summary, rows


def _logged_traffic(log_text):
    """{(job, index): (sent, received)} from the last traffic line of a tfgc-server log."""
    lines = [line for line in log_text.splitlines() if "traffic (TCP bytes" in line]
    assert lines, log_text[-3000:]
    return {(job, int(index)): (int(sent.replace(",", "")), int(received.replace(",", "")))
            for job, index, sent, received in re.findall(
                r"(\w+):(\d+) sent ([\d,]+) B, received ([\d,]+) B", lines[-1])}


def test_parameter_servers_compressed_pushes_and_pulls(tmp_path):
    steps = 16
    out = str(tmp_path / "run")
    chief, ps, workers = ("chief", 0), ("ps", 0), [("worker", 0), ("worker", 1)]
    started = time.monotonic()
    with Machines([chief, ps, *workers], str(tmp_path)) as m:
        net = m.net
        assert len(_left_behind(net)) == 6  # the hub, one namespace per task, the link
        # The ps logs its own view of the traffic when it stops (the deployment guide's
        # way to see pushes and pulls on a real cluster).
        m.start(ps, ["-m", "tfgc.server", "--traffic-every", "600"])
        for worker in workers:
            m.start(worker, ["-m", "tfgc.server"])
        # Started at once, as a cluster's machines come up in any order: the chief's
        # runtime waits for the servers.
        m.start(chief, [*TRAIN, "--strategy", "ps", "--pull-compression", "threelc",
                        "--steps", str(steps), "--log-every", str(steps // 2), "--out", out])
        assert m.wait(chief, RUN_TIMEOUT_S) == 0, m.tail(chief)
        trained = time.monotonic()

        # The servers still hold their connections: read both ends of each.
        at_ps = m.traffic(ps)
        at_workers = {w: m.traffic(w) for w in workers}
        assert not [s for t in (ps, *workers) for s in m.strangers(t)]
        for job, index in (ps, *workers):
            log = processes.read_text(m.log((job, index)))
            assert f"serving /job:{job}/task:{index} at {m.cluster[job][index]}" in log, log
            # A namespace with a network interface is not private: the server says so.
            assert "SECURITY" in log, log
        for task in (ps, *workers):
            m.procs[task].send_signal(signal.SIGTERM)
        for task in (ps, *workers):
            assert m.wait(task, 30) == 0, m.tail(task)
        logged = _logged_traffic(processes.read_text(m.log(ps)))
    assert not _left_behind(net)
    assert all(proc.returncode is not None for proc in m.procs.values())

    summary, rows = _outputs(out)
    assert (summary["strategy"], summary["workers"], summary["ps"]) == ("ps", 2, 1)
    assert summary["steps"] == steps and summary["test_accuracy"] is not None
    assert (summary["compression"], summary["pull_compression"]) == ("threelc", "threelc")
    assert [int(r["step"]) for r in rows] == [steps // 2, steps]

    up = {w: at_ps[w]["received"] for w in workers}  # pushes
    down = {w: at_ps[w]["sent"] for w in workers}  # pulls
    # Both ends of each connection, read in different namespaces, agree: to the byte
    # but for the SYN that bytes_acked counts at the end that dialled, and a keepalive
    # ping that may fall between the readings.
    for w in workers:
        assert abs(at_workers[w][ps]["sent"] - up[w]) <= 256, (w, at_workers[w], at_ps)
        assert abs(at_workers[w][ps]["received"] - down[w]) <= 256, (w, at_workers[w], at_ps)
    # The ps's own log says the same (give or take keepalive pings).
    for w in workers:
        assert logged[w][1] == pytest.approx(up[w], abs=2048), (logged, at_ps)
        assert logged[w][0] == pytest.approx(down[w], abs=2048), (logged, at_ps)

    # fp32 would have moved the whole model each step, each way.
    fp32 = steps * summary["parameters"] * 4
    pushed, pulled = sum(up.values()), sum(down.values())
    # The compressed payloads crossed, and with all else that did (each worker's first
    # full pull, the RPCs' setup and framing) the totals stay well below fp32's.
    assert steps * summary["push_bytes_per_step"] <= pushed < fp32 / 5, (pushed, fp32)
    assert steps * summary["pull_bytes_per_step"] <= pulled < fp32 / 3, (pulled, fp32)
    print(f"\nps run: {trained - started:.1f} s to train, {time.monotonic() - started:.1f} s "
          f"in all; workers->ps {pushed:,d} B, ps->workers {pulled:,d} B, fp32 {fp32:,d} B "
          f"each way; per worker {up} / {down}")


def test_multi_worker_mirrored_compressed_all_reduce(tmp_path):
    steps = 8
    out = str(tmp_path / "run")
    workers = [("worker", 0), ("worker", 1)]
    started = time.monotonic()
    with Machines(workers, str(tmp_path)) as m:
        net = m.net
        # The same command on every machine; TF_CONFIG tells them apart.
        for w in workers:
            m.start(w, [*TRAIN, "--strategy", "mwms", "--steps", str(steps),
                        "--log-every", str(steps), "--out", out])
        for w in workers:
            assert m.wait(w, RUN_TIMEOUT_S) == 0, m.tail(w)
        trained = time.monotonic()
        # The workers are gone, and their sockets with them: their links still count.
        link = {w: net.link_bytes(w) for w in workers}
    assert not _left_behind(net)

    summary, rows = _outputs(out)  # written by worker 0 alone
    assert sorted(os.listdir(out)) == ["history.csv", "plot.png", "summary.json"]
    assert (summary["strategy"], summary["workers"], summary["steps"]) == ("mwms", 2, steps)
    assert summary["lr_scaled"] == pytest.approx(2 * summary["lr"])
    assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))

    # What worker 0's sockets sent to worker 1 during the steps (read by ss in its
    # namespace): at least its own payloads (the optimizer's counters sum both
    # workers'), far below fp32's all-reduce, which sends the whole model each step.
    model = summary["parameters"] * 4
    sent = summary["socket_worker0_sent_bytes_per_step"]
    assert summary["push_bytes_per_step"] / 2 <= sent < model / 10, (sent, model)
    # From outside: everything one worker put on its link reached the other (neighbour
    # discovery and broadcasts from the launcher's link aside), and nothing else did.
    w0, w1 = workers
    for a, b in ((w0, w1), (w1, w0)):
        assert abs(link[a]["sent"] - link[b]["received"]) < 16 << 10, link
    assert link[w0]["sent"] >= steps * sent
    # Worker 1 (which broadcasts no initial values) sent, in the whole run, headers and
    # setup included, well below what fp32 would have for the steps alone.
    assert link[w1]["sent"] < steps * model / 5, (link, model)
    print(f"\nmwms run: {trained - started:.1f} s; worker0 sockets sent {sent:,.0f} B/step "
          f"(fp32 {model:,d} B); links {link}")
