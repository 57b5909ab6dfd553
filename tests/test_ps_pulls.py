"""Compressed pulls on a real parameter-server cluster: model.fit under
ParameterServerStrategy with the model's weights created under tfgc.compressed_pulls().

Each run has a coordinator process of its own: connecting one process to a second
cluster after the first one stopped is not something TensorFlow supports (it crashed
the process now and then)."""

import pytest

import cluster_scripts

COORDINATOR = cluster_scripts.script(
    """
    from sklearn.datasets import load_digits
    from tfgc.ps.variables import PulledVariable

    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    y = data.target
    name = sys.argv[1]
    wide = name == "wide_threelc_pulls"
    epochs, hidden = (1, 8192) if wide else (3, 256)
    if wide:
        x, y = x[:64], y[:64]
    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=240) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope(), tfgc.compressed_pulls():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([
                tf_keras.layers.Dense(hidden, activation="relu", input_shape=(64,)),
                tf_keras.layers.Dense(10)])
        with strategy.scope():
            pull = tfgc.codecs.ThreeLC(1.0) if name.endswith("threelc_pulls") else None
            opt = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.1), compression=tfgc.codecs.ThreeLC(1.0),
                pull_compression=pull)
            opt.build(model.trainable_variables)
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=0).repeat().batch(32)
        history = model.fit(dataset, epochs=epochs, steps_per_epoch=15, verbose=0,
                            callbacks=[tfgc.callbacks.TrafficLogger()])
        kernel = model.trainable_variables[0]
        result = {
            "loss": history.history["loss"],
            "pull_ratio": history.history.get("pull_compression_ratio"),
            "ps_to_worker": c.traffic_between("ps", "worker"),
            "chief_to_worker": c.traffic_between("chief", "worker"),
            "traffic": {k: int(v.numpy()) for k, v in opt.traffic.items()},
            "wrapped": isinstance(kernel, PulledVariable),
        }
        if pull is not None:
            caches = [v.numpy() for v in kernel.cache.read_all()]
            snapshots, master = kernel.snapshots.numpy(), kernel.master.numpy()
            result["cache_is_snapshot"] = [bool(np.array_equal(caches[w], snapshots[w]))
                                           for w in range(2)]
            result["cache_error"] = [float(np.abs(caches[w] - master).max()) for w in range(2)]
            result["master_scale"] = float(np.abs(master).max())
    send_report(result)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_pulls_cross_compressed_and_caches_track_the_master(run_report):
    plain, compressed = (run_report(COORDINATOR, timeout=400, args=[name])
                         for name in ("fp32_pulls", "threelc_pulls"))
    assert plain["wrapped"] and compressed["wrapped"]
    # Without a pull codec the variables are read from the PS in fp32 (45 steps x model).
    model_bytes = (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert plain["ps_to_worker"] >= 45 * model_bytes
    assert plain["traffic"]["pull_bytes"] == 0
    # With ThreeLC pulls the PS sends deltas: one full pull per worker, then ternary bytes.
    assert compressed["ps_to_worker"] < plain["ps_to_worker"] / 3
    counted = compressed["traffic"]
    assert counted["pull_dense_bytes"] == 45 * model_bytes  # biases too (as float16)
    assert counted["pull_bytes"] < counted["pull_dense_bytes"] / 8
    assert compressed["ps_to_worker"] >= counted["pull_bytes"]
    # Each worker's cache is what its PS snapshot says it is, close to the master.
    assert compressed["cache_is_snapshot"] == [True, True]
    assert max(compressed["cache_error"]) < 0.2 * compressed["master_scale"]
    # Training learns as with fp32 pulls.
    assert compressed["loss"][-1] < 0.8 * compressed["loss"][0]
    assert compressed["loss"][-1] < plain["loss"][-1] + 0.2


@pytest.mark.cluster
@pytest.mark.slow
def test_per_worker_buffers_are_not_sent_from_the_coordinator(run_report):
    # Each worker's residuals and pull caches (a copy of the model each) start as zeros
    # made on the worker: the coordinator sends the workers the step's functions and 64
    # examples, 0.46 MB, less than one copy of the 2.4 MB model (copied from the
    # coordinator, the zeros made it 10.3 MB: a residual and a cache to each worker).
    report = run_report(COORDINATOR, timeout=400, args=["wide_threelc_pulls"])
    model_bytes = (64 * 8192 + 8192 + 8192 * 10 + 10) * 4
    assert 0 < report["chief_to_worker"] < model_bytes, report["chief_to_worker"]
    assert report["loss"][-1] < 10  # it trained (15 steps; the first loss is 2.3)
