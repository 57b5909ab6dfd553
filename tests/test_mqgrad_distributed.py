"""MQGrad on real multi-process clusters on 127.0.0.1: every replica uses the bits the
agent chose, at the same step.

* ParameterServerStrategy: one coordinator (its own process) runs the callback; the
  bytes every step pushed to the parameter server must be exactly the payload size of
  the bits the agent had set before that step.
* MultiWorkerMirroredStrategy: each worker runs its own callback; the bits the
  payloads carried inside every train step (recorded by the codec as it encodes) must
  be the same on both workers and equal to what the agents chose, although the
  workers' wall times differ.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# A digits MLP with a Quantize codec whose bits the agent moves (epsilon=0.5, T=2, so
# the bits change several times in 40 steps).
COMMON = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np, tensorflow as tf, tf_keras
    from sklearn.datasets import load_digits
    import tfgc
    from tfgc import mqgrad

    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    y = data.target

    def build(codec):
        tf_keras.utils.set_random_seed(0)
        model = tf_keras.Sequential([
            tf_keras.layers.Dense(128, activation="relu", input_shape=(64,)),
            tf_keras.layers.Dense(10)])
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=codec,
                                        error_feedback=False)
        return model, opt
    """
)

PSS_COORDINATOR = COMMON + textwrap.dedent(
    """
    from tfgc import cluster

    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=240) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope():
            codec = tfgc.codecs.Quantize(bits=tf.Variable(2, dtype=tf.int32))
            model, opt = build(codec)
            opt.build(model.trainable_variables)
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callback = tfgc.callbacks.MQGrad(opt, T=2, seed=3, epsilon=0.5)
        pushed = []

        class PushedBytes(tf_keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self._supports_tf_logs = True  # a batch hook under PSS

            def on_train_batch_end(self, batch, logs=None):
                pushed.append(int(opt.traffic["push_bytes"].numpy()))

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=0).repeat().batch(32)
        model.fit(dataset, epochs=2, steps_per_epoch=20, verbose=0,
                  callbacks=[callback, PushedBytes()])
        print("RESULTS " + json.dumps({
            "device": codec.bits.device,
            "pushed": pushed,
            "bits": [step["bits"] for step in callback.trace],
            "losses": [step["loss"] for step in callback.trace],
            "bytes_by_bits": {b: callback.step_bytes(b) for b in range(2, 9)},
        }))
    """
)

MWMS_WORKER = COMMON + textwrap.dedent(
    """
    RING = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=RING))
    index = strategy.cluster_resolver.task_id
    # What the payloads of each step really carried, recorded inside the train step in
    # a variable of this worker only (created outside the strategy scope).
    seen = tf.Variable(0, dtype=tf.int32)

    class RecordingQuantize(tfgc.codecs.Quantize):
        def encode_and_reconstruct(self, x):
            payload, reconstructed = super().encode_and_reconstruct(x)
            with tf.control_dependencies([seen.assign(tf.cast(payload["bits"], tf.int32))]):
                return payload, tf.identity(reconstructed)

    with strategy.scope():
        codec = RecordingQuantize(bits=tf.Variable(2, dtype=tf.int32))
        model, opt = build(codec)
        model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = tfgc.callbacks.MQGrad(opt, T=2, seed=3, epsilon=0.5)
    carried = []

    class Carried(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            carried.append(int(seen.numpy()))

    class SlowerWorker(tf_keras.callbacks.Callback):
        # Worker 1 is slower, so the workers' wall times clearly differ.
        def on_train_batch_begin(self, batch, logs=None):
            if index == 1:
                time.sleep(0.01)

    def dataset_fn(context):
        return (tf.data.Dataset.from_tensor_slices((x, y))
                .shard(context.num_input_pipelines, context.input_pipeline_id)
                .shuffle(2000, seed=0).repeat().batch(context.get_per_replica_batch_size(32)))

    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2,
              steps_per_epoch=20, verbose=0, callbacks=[callback, SlowerWorker(), Carried()])
    print("RESULTS " + json.dumps({
        "carried": carried,
        "bits": [step["bits"] for step in callback.trace],
        "ms": [step["ms"] for step in callback.trace],
        "final_bits": int(codec.bits.numpy()),
        "agent_bits": callback.agent.bits,
    }))
    """
)


def _results(stdout):
    line = next(l for l in stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_parameter_server_steps_use_the_bits_the_agent_set(run_python):
    results = _results(run_python(PSS_COORDINATOR, timeout=420))
    assert "/job:ps" in results["device"]
    bits, pushed = results["bits"], results["pushed"]
    assert len(bits) == len(pushed) == 40
    assert len(set(bits)) >= 2, bits  # the agent did change the bits
    assert all(2 <= b <= 8 for b in bits)
    expected = {int(k): v for k, v in results["bytes_by_bits"].items()}
    # Step m pushed exactly the payload of the bits in force before it: every worker read
    # the parameter server's bits variable after the coordinator's assignment.
    per_step = [pushed[0]] + [b - a for a, b in zip(pushed, pushed[1:])]
    assert per_step == [expected[b] for b in bits]
    # The batch losses recovered from Keras' running means are real losses.
    losses = results["losses"]
    assert all(0.0 < loss < 5.0 for loss in losses), losses
    assert sum(losses[-10:]) < sum(losses[:10])


def test_multi_worker_mirrored_workers_agree_on_bits(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(MWMS_WORKER)
    addresses = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    try:
        for index in range(2):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_CONFIG=json.dumps(
                {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}))
            out = open(tmp_path / f"worker{index}.out", "w")
            procs.append(subprocess.Popen([sys.executable, str(script)], stdout=out,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:  # stop what is left, by process group of each child we started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    logs = [(tmp_path / f"worker{i}.out").read_text() for i in range(2)]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    first, second = (_results(log) for log in logs)
    assert len(first["bits"]) == 40
    assert len(set(first["bits"])) >= 2, first["bits"]
    # Every step's payloads carried the bits the agent chose, the same on both workers.
    assert first["carried"] == first["bits"] == second["bits"] == second["carried"]
    assert first["final_bits"] == first["agent_bits"] == second["final_bits"]
    # ... although the workers measured different times.
    assert first["ms"] != second["ms"]
