"""Compressed pushes on a real parameter-server cluster: model.fit under
ParameterServerStrategy, bytes counted per socket.

Each run has a coordinator process of its own (one cluster per process; see
test_ps_pulls)."""

import pytest

import cluster_scripts

# The coordinator runs in a process of its own: ParameterServerStrategy connects the
# process's eager context to the cluster.
COORDINATOR = cluster_scripts.script(
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    y = data.target
    name = sys.argv[1]
    # A bound codec's per-worker state.
    STATE = {"powersgd": "q", "powersgd_bfloat16": "q", "signum": "momentum"}
    tf_keras.mixed_precision.set_global_policy(sys.argv[2] if len(sys.argv) > 2 else "float32")
    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=240) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([
                tf_keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                tf_keras.layers.Dense(10), tf_keras.layers.Activation("linear", dtype="float32")])
            opt = tf_keras.optimizers.SGD(0.1)
            codecs = {"threelc": tfgc.codecs.ThreeLC(1.0), "powersgd": tfgc.codecs.PowerSGD(2),
                      "powersgd_bfloat16": tfgc.codecs.PowerSGD(2, factors_dtype="bfloat16"),
                      "signum": tfgc.codecs.Signum(0.9)}
            if name in codecs:
                opt = tfgc.DistributedOptimizer(opt, compression=codecs[name])
                opt.build(model.trainable_variables)
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=0).repeat().batch(32)
        before = c.traffic_between("worker", "ps")
        history = model.fit(dataset, epochs=3, steps_per_epoch=15, verbose=0)
        rows = c.settled_socket_bytes()  # the last step's push may still be crossing
        result = {
            "loss": history.history["loss"],
            "worker_to_ps": c.traffic_between("worker", "ps", rows=rows) - before,
            "ps_to_worker": c.traffic_between("ps", "worker", rows=rows),
            "iterations": int(opt.iterations.numpy()),
            "counted": int(opt.traffic["push_bytes"].numpy()) if name != "none" else None,
            # Where each codec keeps its sender's state (PowerSGD's warm start, Signum's
            # momentum).
            "state": sorted({"PerWorkerVariable" in [c.__name__ for c in type(v).__mro__]
                             for v in [getattr(opt.codec_for(w), STATE[name])
                                       for w in model.trainable_variables
                                       if name in STATE and len(w.shape) == 2]}),
        }
    send_report(result)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_servers_receive_only_compressed_gradients(run_report):
    plain, compressed = (run_report(COORDINATOR, timeout=400, args=[name])
                         for name in ("none", "threelc"))
    steps = 45
    gradient_bytes = (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert plain["iterations"] == compressed["iterations"] == steps
    # Uncompressed: every step pushes every gradient in fp32.
    assert plain["worker_to_ps"] >= steps * gradient_bytes
    # ThreeLC: the PS partitions received payloads, not fp32 (decode ran on the PS).
    assert compressed["worker_to_ps"] < plain["worker_to_ps"] / 8
    assert compressed["worker_to_ps"] >= compressed["counted"]
    # Without a pull codec the same fp32 model goes back to the workers.
    assert compressed["ps_to_worker"] > 0.8 * plain["ps_to_worker"]
    # Training still learns.
    assert compressed["loss"][-1] < compressed["loss"][0]
    assert compressed["loss"][-1] < plain["loss"][-1] + 0.2


# Bytes a step pushes with codecs whose sender keeps per-worker state; the biases go in
# float16 (below min_elements).
STATEFUL_PAYLOADS = {
    # Rank 2: P and Q of both kernels in float32.
    "powersgd": 4 * 2 * ((64 + 256) + (256 + 10)) + 2 * (256 + 10),
    # The same in bfloat16.
    "powersgd_bfloat16": 2 * 2 * ((64 + 256) + (256 + 10)) + 2 * (256 + 10),
    # Sign bits of both kernels, each with its length word and scale.
    "signum": (64 * 256 // 8 + 8) + (256 * 10 // 8 + 8) + 2 * (256 + 10),
}


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STATEFUL_PAYLOADS))
def test_parameter_servers_decode_pushes_from_each_workers_own_codec_state(run_report, name):
    # PowerSGD's warm start, Signum's momentum: read and written on each worker.
    report = run_report(COORDINATOR, timeout=400, args=[name])
    steps = 45
    gradient_bytes = (64 * 256 + 256 + 256 * 10 + 10) * 4
    payload = STATEFUL_PAYLOADS[name]
    assert report["iterations"] == steps
    assert report["state"] == [True]  # per-worker variables
    assert report["counted"] == steps * payload
    assert steps * payload <= report["worker_to_ps"] < steps * gradient_bytes / 6
    assert report["loss"][-1] < report["loss"][0]


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_servers_receive_compressed_bfloat16_mixed_precision_gradients(run_report):
    # tf_keras refuses mixed_float16 under ParameterServerStrategy itself (no loss
    # scaling there); mixed_bfloat16 trains, and its float32 gradients go compressed.
    report = run_report(COORDINATOR, timeout=400, args=["threelc", "mixed_bfloat16"])
    steps = 45
    gradient_bytes = (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert report["iterations"] == steps
    assert report["worker_to_ps"] < 0.15 * steps * gradient_bytes, report
    assert report["worker_to_ps"] >= report["counted"], report
    assert report["loss"][-1] < report["loss"][0]
