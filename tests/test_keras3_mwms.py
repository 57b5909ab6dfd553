"""Keras 3 under MultiWorkerMirroredStrategy in two real processes: `tfgc.fit_across_workers`
(Keras 3's own `fit` fails there before its first step, keras-team/keras#20585), with
the bytes read from each worker's sockets."""
import numpy as np
import pytest

import cluster_scripts
from tfgc import cluster

ROWS, COLS = 512, 512  # the compressed kernel: 1 MiB of fp32 gradient per step
STEPS_PER_EPOCH, EPOCHS = 5, 2
# Bytes per step a worker sends beside its payload under all-gather: the headers of
# three collectives (sizes, shapes, payloads) and the padding of its payload to the
# longer of the two workers'.
OVERHEAD = 8192

WORKER = cluster_scripts.script(
    """
    rows, cols, steps_per_epoch, epochs = map(int, sys.argv[1:5])
    # The mean squared error over `cols` outputs: a step of rate LR cuts the error by
    # about 1 - 2 * LR / cols, and a batch of 256 keeps its largest curvature under
    # 6 / cols: stable (and not fast: the loss falls by about 3% a step).
    LR = 8.0
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    index = strategy.cluster_resolver.task_id
    import keras

    # A fixed linear teacher: the loss falls under any working optimizer.
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(rows, cols)).astype("float32") / rows ** 0.5
    x = rng.normal(size=(1024, rows)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x @ teacher)).repeat().batch(256)

    def train(codec):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((rows,)),
                                      keras.layers.Dense(cols, use_bias=False)])
            optimizer = keras.optimizers.SGD(LR)
            callbacks = []
            if codec is not None:
                optimizer = tfgc.DistributedOptimizer(optimizer, compression=codec)
                callbacks = [tfgc.callbacks.TrafficLogger()]
            model.compile(optimizer, "mse")
        # The first epoch traces and sets up the collectives; the bytes are the rest's.
        tfgc.fit_across_workers(model, strategy, data, 1, steps_per_epoch, verbose=0)
        before = cluster.task_traffic()
        history = tfgc.fit_across_workers(model, strategy, data, epochs, steps_per_epoch,
                                          callbacks=callbacks, verbose=0)
        after = cluster.task_traffic()
        peer = ("worker", 1 - index)
        sent = after[peer]["sent"] - before.get(peer, {"sent": 0})["sent"]
        return {"history": history, "sent_per_step": sent / (epochs * steps_per_epoch)}

    report = {"index": index, "plain": train(None),
              "threelc": train(tfgc.codecs.ThreeLC(1.0))}
    # A barrier: neither worker closes its sockets before both have read them.
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    send_report(report)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_keras3_trains_across_two_processes_with_compressed_gradients(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    c = cluster.LocalCluster(num_ps=0, num_workers=2, log_dir=tmp_path / "logs")
    try:
        results = c.run_workers(
            [str(script), str(ROWS), str(COLS), str(STEPS_PER_EPOCH), str(EPOCHS)],
            timeout_s=300, check=True)
    finally:
        c.stop()
    reports = [cluster_scripts.read_report(r.stdout, r.stderr) for r in results]
    assert sorted(r["index"] for r in reports) == [0, 1]
    for report in reports:
        plain, ours = report["plain"], report["threelc"]
        for run in (plain, ours):
            loss = run["history"]["loss"]
            assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], report
        assert plain["sent_per_step"] >= ROWS * COLS * 4, report  # ring all-reduce of fp32
        assert ours["sent_per_step"] <= 0.1 * plain["sent_per_step"], report
        # TrafficLogger's keys reach the history: per step, what both workers pushed;
        # under all-gather each worker sends its own payload once.
        pushed = ours["history"]["push_bytes"]
        assert len(pushed) == EPOCHS and min(pushed) > 0, report
        counted = np.mean(pushed) / 2
        assert counted <= ours["sent_per_step"] <= 1.02 * counted + OVERHEAD, report
    # The same loss on both workers: one model, trained in step.
    np.testing.assert_allclose(reports[0]["threelc"]["history"]["loss"],
                               reports[1]["threelc"]["history"]["loss"], rtol=1e-6)
