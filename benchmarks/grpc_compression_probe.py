"""Does TensorFlow's RPCOptions.compression_algorithm shrink what crosses its sockets?

Starts a parameter server and a worker (tf.distribute.Server, with the algorithm in
their config's rpc_options) and connects this process as the chief, with the same
rpc_options in its eager context's config (which ParameterServerStrategy copies into
the chief's server definition). A step reads 40 variables of zeros (64x64 float32, as
compressible as bytes get) from the server and writes them back; the kernel's socket
counters give what the chief sent per call and what the worker sent per step.

    python -m tfgc.cluster.private python -m benchmarks.grpc_compression_probe ALGORITHM [LEVEL]

ALGORITHM: "" (none), "deflate" or "gzip". Prints one JSON line; the lines of the three
are results/local_steps/grpc_compression/results.jsonl.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

ALGORITHM = sys.argv[1]
LEVEL = int(sys.argv[2]) if len(sys.argv) > 2 else 2
STEPS = 50

SERVER = r'''
import json, sys, time
import tensorflow as tf
cluster, job, algorithm, level = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
config = tf.compat.v1.ConfigProto()
if algorithm:
    config.rpc_options.compression_algorithm = algorithm
    config.rpc_options.compression_level = level
tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=0,
                     protocol="grpc", config=config, start=True)
time.sleep(600)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sent_and_received(pid):
    """Bytes the process `pid` sent (acknowledged) and received on its TCP sockets."""
    lines = subprocess.run(["ss", "-H", "-tinp", "state", "established"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    sent = received = 0
    for i, line in enumerate(lines):
        if f"pid={pid}," in line:
            text = line + (lines[i + 1] if i + 1 < len(lines) else "")
            acked = re.search(r"bytes_acked:(\d+)", text)
            got = re.search(r"bytes_received:(\d+)", text)
            sent += int(acked.group(1)) if acked else 0
            received += int(got.group(1)) if got else 0
    return sent, received


def main():
    ports = {job: free_port() for job in ("chief", "ps", "worker")}
    cluster = {job: [f"127.0.0.1:{port}"] for job, port in ports.items()}
    servers = {job: subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(cluster), job,
                                      ALGORITHM, str(LEVEL)])
               for job in ("ps", "worker")}
    try:
        import tensorflow as tf
        from tensorflow.python.eager import context

        if ALGORITHM:
            config = tf.compat.v1.ConfigProto()
            config.rpc_options.compression_algorithm = ALGORITHM
            config.rpc_options.compression_level = LEVEL
            context.context()._config = config  # what connect_to_cluster copies
        for job in ("ps", "worker"):
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", ports[job]), 1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"{job} did not listen"
                    time.sleep(0.2)
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                              "task": {"type": "chief", "index": 0}})
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            tf.distribute.cluster_resolver.TFConfigClusterResolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            weights = [tf.Variable(tf.zeros([64, 64])) for _ in range(40)]

        @tf.function
        def step():
            def replica():
                for w in weights:
                    w.assign(w.read_value() * 0.5)
                return tf.constant(0.0)
            return strategy.run(replica)

        coordinator.schedule(step)
        coordinator.join()
        chief0, worker0 = sent_and_received(os.getpid()), sent_and_received(servers["worker"].pid)
        for _ in range(STEPS):
            coordinator.schedule(step)
        coordinator.join()
        chief1, worker1 = sent_and_received(os.getpid()), sent_and_received(servers["worker"].pid)
        print(json.dumps({
            "algorithm": ALGORITHM or "none", "level": LEVEL,
            "rpc_options": str(context.context().config.rpc_options).replace("\n", " "),
            "chief_sent_per_step": (chief1[0] - chief0[0]) / STEPS,
            "worker_sent_per_step": (worker1[0] - worker0[0]) / STEPS,
            "worker_received_per_step": (worker1[1] - worker0[1]) / STEPS,
            "variable_bytes_per_step": 40 * 64 * 64 * 4}), flush=True)
    finally:
        for server in servers.values():
            server.kill()
            server.wait()
    os._exit(0)  # no teardown: the servers are gone


if __name__ == "__main__":
    main()
