"""Bytes per worker step and the parameter server's CPU time per step, for 1 to N workers.

    python -m tfgc.cluster.private python -m benchmarks.worker_scaling
    python -m tfgc.cluster.private python -m benchmarks.worker_scaling --workers 1,2,4,8 \
        --steps 160

For each worker count a fresh `tfgc.cluster.LocalCluster` (1 parameter server, N
workers, loopback) runs in a process of its own and trains a small model with tf_keras
`model.fit` under ParameterServerStrategy, ThreeLC(1.0) on pushes and pulls (the model
built in a `tfgc.ParameterServers` scope), batch 32 of scikit-learn's digits. After a
warm-up fit (tracing, connections, each worker's first full pull) one measured fit runs
`--steps` steps spread over the workers by TensorFlow's coordinator. Measured over that
fit, from the kernel and nothing else:

* bytes per worker step, each direction: every worker's socket bytes to (from) the
  server (`ss`), summed, over the optimizer's step count;
* the server's CPU time per step: its process's user + system time (/proc/PID/stat)
  over the fit, over the steps; the server decodes each push, applies it, and encodes
  each worker's pull against that worker's snapshot;
* steps per second of the whole cluster, and that every fit ended (no deadlock: each
  is bounded by `--timeout`).

On a 2-core machine 8 workers share the cores with the server, so the step rate says
little; the bytes and the server's CPU time per step are what this measures. Prints a
table and writes the rows as JSON (`--out`).
"""
import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks import cluster_bench  # its models and data


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(workers, steps, model_name, timeout):
    """Runs in a process of its own: one cluster of `workers` workers; returns a dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf_keras

    import tfgc
    from tfgc import cluster

    with cluster.LocalCluster(num_ps=1, num_workers=workers, timeout_s=timeout) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        data = cluster_bench.digits_dataset(tf, 32)
        servers = tfgc.ParameterServers(tfgc.codecs.ThreeLC(1.0))
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            with servers.scope():
                model = cluster_bench.build_model(model_name, tf_keras)
            optimizer = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.05), compression=tfgc.codecs.ThreeLC(1.0),
                parameter_servers=servers)
            optimizer.build(model.trainable_variables)
            model.compile(optimizer, cluster_bench.model_loss(tf_keras, model_name))
        # Every worker traces, connects and takes its first full pull here.
        model.fit(data, epochs=1, steps_per_epoch=4 * workers, verbose=0)
        server = c.pids["ps"][0]
        rows = c.settled_socket_bytes()
        pushed = c.traffic_between("worker", "ps", rows=rows)
        pulled = c.traffic_between("ps", "worker", rows=rows)
        iterations, cpu, started = int(optimizer.iterations.numpy()), cpu_seconds(server), time.monotonic()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
        seconds = time.monotonic() - started
        cpu = cpu_seconds(server) - cpu
        rows = c.settled_socket_bytes()
        done = int(optimizer.iterations.numpy()) - iterations
        return {
            "workers": workers, "model": model_name, "steps": done,
            "push_bytes_per_step": (c.traffic_between("worker", "ps", rows=rows) - pushed) / done,
            "pull_bytes_per_step": (c.traffic_between("ps", "worker", rows=rows) - pulled) / done,
            "server_cpu_ms_per_step": 1000 * cpu / done,
            "steps_per_s": done / seconds,
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=160, help="measured steps per count")
    parser.add_argument("--model", default="convnet42", choices=cluster_bench.MODELS)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per count")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print("ROW " + json.dumps(measure(args.child, args.steps, args.model, args.timeout)),
              flush=True)
        return 0
    rows = []
    for workers in [int(n) for n in args.workers.split(",")]:
        print(f"[worker_scaling] {workers} worker(s) ...", flush=True)
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.worker_scaling", "--child", str(workers),
             "--steps", str(args.steps), "--model", args.model, "--timeout", str(args.timeout)],
            capture_output=True, text=True, timeout=args.timeout + 120, cwd=cluster_bench.ROOT)
        found = [line[4:] for line in child.stdout.splitlines() if line.startswith("ROW ")]
        if child.returncode or not found:
            sys.exit(f"{workers} worker(s) failed (rc {child.returncode}):\n{child.stderr[-3000:]}")
        rows.append(json.loads(found[-1]))
    one = rows[0]
    print(f"\n{args.model}, ThreeLC(1.0) pushes and pulls, 1 PS, {args.steps} measured steps\n")
    print("| workers | push B/step | pull B/step | vs 1 worker | server CPU ms/step | "
          "vs 1 worker | steps/s |\n|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['workers']} | {row['push_bytes_per_step']:,.0f} | "
              f"{row['pull_bytes_per_step']:,.0f} | "
              f"{row['push_bytes_per_step'] / one['push_bytes_per_step']:.3f}x / "
              f"{row['pull_bytes_per_step'] / one['pull_bytes_per_step']:.3f}x | "
              f"{row['server_cpu_ms_per_step']:.2f} | "
              f"{row['server_cpu_ms_per_step'] / one['server_cpu_ms_per_step']:.2f}x | "
              f"{row['steps_per_s']:.1f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
