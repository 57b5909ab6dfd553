"""DistributedOptimizer on a real multi-process MultiWorkerMirroredStrategy cluster.

Two worker processes (started by `tfgc.cluster.LocalCluster.run_workers`, each with
its TF_CONFIG) train tf_keras models with `model.fit` under MultiWorkerMirroredStrategy
with ring collectives. Each worker reads its own TCP counters (`task_traffic`, from
`ss`) around each fit, so the bytes below are what the collectives really sent.
"""

import numpy as np
import pytest

import cluster_scripts

from tfgc import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROWS, COLS = 512, 512  # the compressed kernel: 1 MiB of fp32 gradient per step
STEPS = 4
LR = 0.5  # a power of two: the SGD update adds no rounding of its own

WORKER = cluster_scripts.script(
    """
    out_dir, rows, cols, steps, lr = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
    names = sys.argv[6].split(",")
    RING = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=RING))
    index = strategy.cluster_resolver.task_id
    assert strategy.num_replicas_in_sync == 2

    # Each worker has its own batch (a fixed linear teacher plus worker-specific inputs):
    # the two replicas' gradients differ, so the sum is not just twice one of them.
    rng = np.random.default_rng(100 + index)
    teacher = np.random.default_rng(7).normal(size=(rows, cols)).astype("float32") / rows ** 0.5
    x = rng.normal(size=(64, rows)).astype("float32")
    y = x @ teacher

    def dataset_fn(input_context):
        return tf.data.Dataset.from_tensors((x, y)).repeat()

    data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    codecs = {
        "fp32": None,
        "fp16": tfgc.codecs.Cast("float16"),
        "int8": tfgc.codecs.Int8(),
        "threelc": tfgc.codecs.ThreeLC(1.0),
    }
    report = {"index": index}
    for name in names:
        # "codec" or "codec@policy" (a mixed precision policy: compile wraps the
        # optimizer in a loss-scale optimizer), "codec@policy@lso_first" (the user
        # wraps a LossScaleOptimizer in the DistributedOptimizer).
        codec_name, policy, *order = name.split("@") + ["float32"] * (name.count("@") == 0)
        codec = codecs[codec_name]
        tf_keras.mixed_precision.set_global_policy(policy)
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential(
                [tf_keras.layers.Dense(cols, use_bias=False, input_shape=(rows,)),
                 tf_keras.layers.Activation("linear", dtype="float32")])
            optimizer = tf_keras.optimizers.SGD(lr)
            if order:
                optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
            if codec is not None:
                optimizer = tfgc.DistributedOptimizer(optimizer, compression=codec)
            model.compile(optimizer, "mse")
        kernel = model.trainable_variables[0]

        @tf.function
        def local_gradient():
            # The same loss (scaled for the replicas) as tf_keras's train_step.
            def fn():
                with tf.GradientTape() as tape:
                    xt, yt = tf.constant(x), tf.constant(y)
                    loss = model.compute_loss(xt, yt, model(xt, training=True))
                return tape.gradient(loss, kernel)
            return strategy.run(fn)

        if name == "fp16":  # the exactness check reads these
            gradient = strategy.experimental_local_results(local_gradient())[0].numpy()
            np.save(os.path.join(out_dir, f"grad{index}.npy"), gradient)
            np.save(os.path.join(out_dir, f"w0_{index}.npy"), kernel.numpy())
        # One step, read the update, then measure the bytes of `steps` more steps
        # (tracing and first-use collective setup happen in the first fit).
        model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
        if name == "fp16":
            np.save(os.path.join(out_dir, f"w1_{index}.npy"), kernel.numpy())
        before = cluster.task_traffic()
        history = model.fit(data, epochs=steps, steps_per_epoch=1, verbose=0)
        after = cluster.task_traffic()
        peer = ("worker", 1 - index)
        report[name] = {
            "sent": after[peer]["sent"] - before.get(peer, {"sent": 0})["sent"],
            "loss": history.history["loss"],
            "payload": (int(tfgc.optimizer.compressing_optimizer(optimizer)
                            .traffic["push_bytes"].numpy()) if codec is not None else None),
        }
    # A barrier: neither worker exits (closing its sockets) before both have read
    # their counters.
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    send_report(report)
    """
)


def run_workers(tmp_path, names):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    c = cluster.LocalCluster(num_ps=0, num_workers=2, log_dir=tmp_path / "logs")
    try:
        results = c.run_workers(
            [str(script), str(tmp_path), str(ROWS), str(COLS), str(STEPS), str(LR),
             ",".join(names)],
            timeout_s=300, check=True,
        )
    finally:
        c.stop()
    reports = []
    for r in results:
        reports.append(cluster_scripts.read_report(r.stdout, r.stderr))
    return reports


DENSE = ROWS * COLS * 4  # bytes of the kernel's fp32 gradient


def check_codec(report, name, low, high):
    """Bytes per step sent to the other worker, against the fp32 gradient; loss falls."""
    ratio = report[name]["sent"] / STEPS / DENSE
    assert low < ratio < high, (name, ratio, report)
    loss = report[name]["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], (name, loss)


def test_mwms_summable_codec_is_all_reduced_compressed(tmp_path):
    reports = run_workers(tmp_path, ["fp32", "fp16"])

    # The update is decode(sum of encodes), the sum taken in float16 by the all-reduce
    # itself (fp16 + fp16 rounds to fp16 once, as numpy does).
    g0, g1 = (np.load(tmp_path / f"grad{i}.npy") for i in range(2))
    w0 = np.load(tmp_path / "w0_0.npy")
    assert np.array_equal(w0, np.load(tmp_path / "w0_1.npy"))  # replicas start in sync
    summed = (g0.astype(np.float16) + g1.astype(np.float16)).astype(np.float32)
    expected = w0 - np.float32(LR) * summed
    for i in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"w1_{i}.npy"), expected)
    # ...which is not what an fp32 all-reduce would have applied.
    assert not np.array_equal(expected, w0 - np.float32(LR) * (g0 + g1))

    for report in reports:
        # Ring all-reduce on 2 workers: each sends half its tensor twice, i.e. all of it,
        # plus a little for the loss and the RPCs.
        check_codec(report, "fp32", 1.0, 1.05)
        check_codec(report, "fp16", 0.5, 0.55)


def test_mwms_non_summable_codecs_are_all_gathered_compressed(tmp_path):
    reports = run_workers(tmp_path, ["int8", "threelc"])
    for report in reports:
        # All-gather on 2 workers: each sends its own payload once.
        check_codec(report, "int8", 0.25, 0.3)
        check_codec(report, "threelc", 0.0, 0.1)
        for name in ("int8", "threelc"):
            # The optimizer's payload count (summed over both workers, STEPS + 1 steps)
            # is what crossed the wire, up to padding and RPC overhead.
            payload_per_step = report[name]["payload"] / 2 / (STEPS + 1)
            assert report[name]["sent"] / STEPS >= payload_per_step, (name, report)


def test_mwms_mixed_precision_compresses_on_the_wire(tmp_path):
    # A loss-scale optimizer around tfgc's (made by compile, or by the user's order)
    # used to sum the gradients in fp32 before tfgc saw them: 1.00x fp32 on the wire
    # while the counters claimed ~30x.
    names = ["threelc@mixed_float16", "threelc@mixed_float16@lso_first", "threelc@mixed_bfloat16"]
    reports = run_workers(tmp_path, names)
    for report in reports:
        for name in names:
            check_codec(report, name, 0.0, 0.15)
            payload_per_step = report[name]["payload"] / 2 / (STEPS + 1)
            assert report[name]["sent"] / STEPS >= payload_per_step, (name, report)


DISAGREEING_WORKER = cluster_scripts.script(
    """
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    x = np.random.default_rng(index).normal(size=(32, 64)).astype("float32")
    data = tf_keras.utils.experimental.DatasetCreator(
        lambda _: tf.data.Dataset.from_tensors((x, x[:, :8])).repeat())
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(8, input_shape=(64,))])
        # The workers were started with different codec settings.
        codec = tfgc.codecs.FastSGD(base=1.1 if index == 0 else 1.5)
        model.compile(tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), codec,
                                                min_elements=1), "mse")
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
    print("TRAINED", flush=True)
    """
)


def test_mwms_workers_with_different_codec_settings_stop_at_once(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(DISAGREEING_WORKER)
    c = cluster.LocalCluster(num_ps=0, num_workers=2, log_dir=tmp_path / "logs")
    try:
        results = c.run_workers([str(script)], timeout_s=240)
    finally:
        c.stop()
    for r in results:
        assert r.returncode != 0 and "TRAINED" not in r.stdout, (r.returncode, r.stdout)
    # Before this check the two finished with different weights and exit code 0.
    said = [r.stderr for r in results if "replicas disagree on their compression" in r.stderr]
    assert said, [r.stderr[-2000:] for r in results]
    # Each names its own settings (the error text escapes the JSON's quotes).
    assert all("FastSGD" in s and "base" in s for s in said), said


LOGGED = cluster_scripts.script(
    """
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    logs = {}
    for name, callbacks in (("plain", []), ("logged", [tfgc.callbacks.TrafficLogger()])):
        tf_keras.utils.set_random_seed(0)
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(16,))])
            opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                            compression=tfgc.codecs.Int8(), min_elements=1)
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        history = model.fit(data, epochs=2, verbose=0, callbacks=callbacks)
        logs[name] = {k: v for k, v in history.history.items()}
    send_report(logs)
    """
)


def test_traffic_logger_leaves_the_metrics_of_mwms_fit_alone(tmp_path):
    # With the logger's keys in the last batch's logs, tf_keras used to take those
    # (summed over the workers) instead of its metrics' results: twice the loss.
    script = tmp_path / "worker.py"
    script.write_text(LOGGED)
    results = cluster.LocalCluster(num_ps=0, num_workers=2, timeout_s=240).run_workers(
        [str(script)], timeout_s=240, check=True)
    for result in results:
        logs = cluster_scripts.read_report(result.stdout, result.stderr)
        plain, logged = logs["plain"], logs["logged"]
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose(logged[key], plain[key], rtol=1e-6, err_msg=key)
        assert max(plain["accuracy"]) <= 1.0
        # Per step, what both workers pushed.
        assert logged["push_dense_bytes"] == [2 * (16 * 2 + 2) * 4] * 2
        assert "pull_bytes" not in logged
