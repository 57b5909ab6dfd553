"""Parameter-server setups from TensorFlow's PSS tutorial: sharded variables and full
saves work with compressed pushes and pulls; a server without tfgc fails at build."""
import json
import textwrap

import numpy as np
import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

COORDINATOR = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    import tensorflow as tf, tf_keras
    import tfgc
    from tfgc.cluster import processes

    ports = processes.reserve_ports(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
            "worker": [f"127.0.0.1:{ports[2]}"]}
    # A parameter server as a user might start it: TensorFlow only, no `import tfgc`.
    bare = ("import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
            f"{spec!r}), job_name='ps', task_index=0, protocol='grpc').join()")
    servers = [
        subprocess.Popen([sys.executable, "-c", bare], preexec_fn=processes.die_with_parent),
        subprocess.Popen([sys.executable, "-m", "tfgc._server", "--cluster-spec", json.dumps(spec),
                          "--job", "worker", "--index", "0", "--parent-pid", str(os.getpid()),
                          "--timeout", "120"], preexec_fn=processes.die_with_parent),
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(processes.accepts_connections("127.0.0.1", p) for p in ports[1:]):
            assert time.monotonic() < deadline, "servers did not listen"
            time.sleep(0.2)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.layers.Dense(64, input_shape=(32,))])
            optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                                  compression=tfgc.codecs.ThreeLC(1.0))
            try:
                optimizer.build(model.trainable_variables)
                print("BUILT", flush=True)
            except RuntimeError as error:
                print("ERROR " + str(error), flush=True)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_a_parameter_server_without_tfgc_fails_at_build_with_what_to_do(run_python):
    out = run_python(COORDINATOR, timeout=180)
    assert "BUILT" not in out
    assert "/job:ps/replica:0/task:0" in out and "cannot run tfgc's ops" in out
    assert "import tfgc in every parameter server and worker process" in out


SHARDED = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, tensorflow as tf, tf_keras
    import tfgc
    from tfgc import cluster

    out = sys.argv[1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 64)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    report = {}
    with cluster.LocalCluster(num_ps=2, num_workers=1, timeout_s=200) as c:
        # The tutorial's partitioner: variables over 1 KiB split over both servers.
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=1024, max_shards=2)
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            c.resolver, variable_partitioner=partitioner)
        with strategy.scope():
            with tfgc.compressed_pulls():
                model = tf_keras.Sequential([
                    tf_keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                    tf_keras.layers.Dense(2)])
            optimizer = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.1), compression=tfgc.codecs.ThreeLC(1.0),
                pull_compression=tfgc.codecs.ThreeLC(1.0))
            # No build call: the pulls start at the first step.
            model.compile(optimizer,
                          tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        kernel = model.layers[0].kernel
        report["kernel"] = type(kernel).__name__
        report["shards"] = [[type(v).__name__, v.device] for v in kernel.variables]
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
        # A full save (SavedModel) at every epoch end, as the tutorial's ModelCheckpoint.
        save = tf_keras.callbacks.ModelCheckpoint(out, save_weights_only=False)
        history = model.fit(data, epochs=4, steps_per_epoch=10, verbose=0, callbacks=[save])
        report["losses"] = history.history["loss"]
        report["traffic"] = {k: int(v.numpy()) for k, v in optimizer.traffic.items()}
        report["weights"] = [w.tolist() for w in model.get_weights()]
    print("REPORT " + json.dumps(report), flush=True)
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_sharded_variables_pull_compressed_and_full_saves_load(run_report, run_python, tmp_path):
    saved = tmp_path / "saved"
    report = run_report(SHARDED, timeout=240, args=[str(saved)])
    assert report["kernel"] == "ShardedVariable"
    # Each shard is pulled like a variable of its own, from its own server.
    assert [kind for kind, _ in report["shards"]] == ["PulledVariable"] * 2
    assert {device.split("/device")[0] for _, device in report["shards"]} == {
        "/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"}
    losses = report["losses"]
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]
    traffic = report["traffic"]
    assert 0 < traffic["pull_bytes"] < traffic["pull_dense_bytes"] / 5
    assert 0 < traffic["push_bytes"] < traffic["push_dense_bytes"] / 10
    # The SavedModel holds the model (no per-worker buffer) and its optimizer's class,
    # and loads in a fresh process with the weights training ended with.
    loaded = run_python(f"""
import json, numpy as np, tf_keras
import tfgc
model = tf_keras.models.load_model({str(saved)!r})
print("LOADED " + json.dumps({{"optimizer": type(model.optimizer).__name__,
                              "weights": [w.tolist() for w in model.get_weights()]}}))
""", timeout=120)
    result = json.loads(loaded.split("LOADED ", 1)[1].splitlines()[0])
    assert result["optimizer"] == "DistributedSGD"
    # (The coordinator lists a sharded kernel's shards; the loaded model, whole.)
    flat = lambda weights: np.concatenate([np.ravel(w) for w in weights])  # noqa: E731
    np.testing.assert_array_equal(flat(result["weights"]), flat(report["weights"]))


UNBUILT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, tensorflow as tf, tf_keras
    import tfgc
    from tfgc import cluster

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 32)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    report = {}
    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=200) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope():
            # No input shape: the weights are made in the first traced step, and the
            # optimizer is used as a plain one (no build call).
            model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                                         tf_keras.layers.Dense(2)])
            optimizer = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.1), compression=tfgc.codecs.ThreeLC(1.0))
            model.compile(optimizer,
                          tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
        history = model.fit(data, epochs=3, steps_per_epoch=10, verbose=0)
        report["losses"] = history.history["loss"]
        report["traffic"] = {k: int(v.numpy()) for k, v in optimizer.traffic.items()}
        report["residuals"] = [
            [[c.__name__ for c in type(r).__mro__],
             [float(np.abs(w.numpy()).sum()) for w in r.read_all()]]
            for r in optimizer._residuals.values()]
    print("REPORT " + json.dumps(report), flush=True)
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_an_unbuilt_model_trains_without_building_the_optimizer(run_report):
    report = run_report(UNBUILT, timeout=240)
    losses = report["losses"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    traffic = report["traffic"]
    assert 0 < traffic["push_bytes"] < traffic["push_dense_bytes"] / 10
    # The first Dense kernel (32x64) is compressed: one error-feedback buffer per
    # worker, made at the first step, and each worker's holds what it has not sent.
    [(classes, per_worker)] = report["residuals"]
    assert "PerWorkerVariable" in classes
    assert len(per_worker) == 2 and all(total > 0 for total in per_worker)
