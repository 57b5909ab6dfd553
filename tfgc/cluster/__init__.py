"""A real local TensorFlow cluster on 127.0.0.1, for tests, demos and users.

Parameter-server clusters: `LocalCluster` starts every ps and worker task as its own
`tf.distribute.Server` process (`python -m tfgc._server`, which imports tfgc first so
that tfgc's ops run on a parameter server), waits until each one listens, and stops
them all on exit. The process that uses the cluster is the "chief" (the
ParameterServerStrategy coordinator):

    from tfgc import cluster
    cluster.isolate()   # first thing in main(): see "Network isolation" below
    with cluster.LocalCluster(num_ps=1, num_workers=2) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        ...
        print(c.traffic_between("worker", "ps"))   # exact TCP bytes, from `ss -tinp`

All-reduce clusters (MultiWorkerMirroredStrategy): every worker runs the training
script itself and hosts its own server, so `num_ps=0` starts no servers and
`run_workers` runs one process per worker, each with its `TF_CONFIG`:

    results = cluster.LocalCluster(num_ps=0, num_workers=2).run_workers(["train.py"])
    assert all(r.returncode == 0 for r in results)

From a shell:

    python -m tfgc.cluster --ps 1 --workers 2 -- train.py --epochs 1   # script = chief
    python -m tfgc.cluster --workers 2 --mwms -- train.py --epochs 1   # script = workers

Bytes are read from the kernel's per-socket TCP counters (`ss -tinp`, iproute2), which
count exactly what crossed each connection between two of the cluster's processes and
nothing else (`LocalCluster.socket_bytes`, or `task_traffic()` inside a task). Every
address in the cluster spec, and so every connection, is 127.0.0.1.

Network isolation: TensorFlow 2.21's gRPC server listens on the wildcard address (it
hard-codes "[::]:port" / "0.0.0.0:port") without authentication, so every cluster is
private by default: `LocalCluster.start()` refuses (`ExposedClusterError`, whose
message says what to do) unless its process is in a private network namespace whose
only interface is loopback (`isolation`). The command line above (and `models.train`,
`make demo`, `make test`) moves its process into one first; a script that starts a
`LocalCluster` itself calls `isolate()` first thing in `main()`:

    def main():
        cluster.isolate()   # before TensorFlow starts threads; may start main again
        with cluster.LocalCluster(num_ps=1, num_workers=2) as c:
            ...

Opting out, to reach the tasks from another machine on purpose or where no namespace
can be made, is explicit and warns loudly: `LocalCluster(..., network="exposed")`, or
`TFGC_NETWORK_ISOLATION=0` in the environment.

Bandwidth emulation (`bandwidth="10mbit"`, root only, needs `ip` and `tc` from
iproute2): each task runs in a network namespace of its own, joined to the others by
veth pairs on a bridge in one more namespace, and every link is shaped with a tc token
bucket (tbf) on what each task sends, as tc on each machine's NIC would.
The chief (this process) reaches them through one veth pair whose address is on a
private /24 that no existing route uses; namespaces have no other interface and no
default route, so nothing leaves them. Everything is deleted on stop. `delay="25ms"`
(and `loss="0.1%"`) also delays every frame a task sends, so a round trip takes
2 x delay: with netem where the kernel has it, else with a delay line process in the
hub namespace (`delayline.py`).

Creating a ParameterServerStrategy changes the eager context of its process for good
(its local device becomes /job:chief/task:0 and resources made before, under
/job:localhost, can no longer be used). Run the coordinator in a process of its own
(e.g. through the command line above), not inside a test runner shared with other
tests.

The package: `local` (LocalCluster: servers, lifecycle, fault injection), `workers`
(its worker scripts), `sockets` (`ss` accounting), `netem` (link emulation),
`delayline` (delay where the kernel has no netem), `isolation` (private network
namespaces), `processes` (errors, ports, logs, kill by pid), `cli` (the command line).
"""
from tfgc.cluster.cli import main
from tfgc.cluster.isolation import ExposedClusterWarning, in_private_network, isolate
from tfgc.cluster.local import LocalCluster
from tfgc.cluster.netem import (
    emulation_unavailable, parse_delay, parse_link, parse_rate, remove_stale_namespaces,
)
from tfgc.cluster.processes import (
    HOST, JOBS, ClusterError, ClusterTimeout, ExposedClusterError, WorkerResult,
)
from tfgc.cluster.sockets import task_traffic

__all__ = [
    "LocalCluster", "ClusterError", "ClusterTimeout", "WorkerResult", "task_traffic", "main",
    "isolate", "in_private_network", "ExposedClusterWarning", "ExposedClusterError",
    "parse_rate", "parse_delay", "parse_link",
    "emulation_unavailable", "remove_stale_namespaces", "HOST", "JOBS",
]
