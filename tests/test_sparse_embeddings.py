"""An embedding model on real clusters, beside its plain TensorFlow twin, from sockets.

Parameter servers (1 ps, 2 workers; `benchmarks.sparse_embeddings`, the workflow of
the sparse-models guide): `Embedding(50000, 64)`, batches of 64 x 20 Zipf ids. Each
run's bytes per step in both directions are read from the kernel's socket counters
and compared with the same script without tfgc, in the same cluster.

MultiWorkerMirroredStrategy (2 workers, ring collectives): sparse gradients are
all-gathered as their rows, and `BackupAndRestore` saves send no residual between the
workers.
"""
import numpy as np
import pytest

import cluster_scripts
from tfgc import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 10

PARAMETER_SERVERS = cluster_scripts.script(
    """
    from benchmarks import sparse_embeddings

    send_report(sparse_embeddings.measure(
        ["plain", "none", "fastsgd_lookups"], steps=int(sys.argv[1]), warmup=3,
        train_steps=0, timeout_s=400))
    """
)


def test_embedding_pushes_and_lookups_against_plain_tensorflow(run_report):
    report = run_report(PARAMETER_SERVERS, timeout=500, args=[STEPS])
    plain, none, fastsgd = report["plain"], report["none"], report["fastsgd_lookups"]
    # The plain twin's push: about 300 distinct rows of 64 floats and their ids; its
    # lookups: every one of the 1,280 looked-up rows, repeats included.
    assert 60_000 < plain["worker_to_ps"] < 120_000, report
    assert 1280 * 64 * 4 < plain["ps_to_worker"] < 1.05 * 1280 * 64 * 4 + 8000, report
    # NoCompression sends what plain TensorFlow sends, each way.
    for direction in ("worker_to_ps", "ps_to_worker"):
        assert none[direction] <= 1.05 * plain[direction], (direction, report)
    assert none["residuals"] == 0 and fastsgd["residuals"] == 0, report
    # FastSGD's rows (one byte a value) and compressed lookups (bfloat16, each
    # distinct row once).
    assert fastsgd["worker_to_ps"] < plain["worker_to_ps"] / 3, report
    assert fastsgd["ps_to_worker"] < plain["ps_to_worker"] / 4, report
    # What the counters count against plain TensorFlow is what the sockets show.
    for run in (none, fastsgd):
        assert abs(run["counted_ratio"] / run["socket_ratio"] - 1) < 0.1, report


ROWS = COLS = 512  # a dense kernel whose 1 MiB residual a save would all-reduce
MWMS_STEPS = 20

MWMS_WORKER = cluster_scripts.script(
    """
    from models import recommender

    out_dir, steps = sys.argv[1], int(sys.argv[2])
    RING = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=RING))
    index = strategy.cluster_resolver.task_id
    peer = ("worker", 1 - index)
    rng = np.random.default_rng(100 + index)
    ids = recommender.zipf_ids(rng, (64, 20), 50_000)
    targets = rng.normal(size=(64, 1)).astype("float32")
    x = rng.normal(size=(64, 512)).astype("float32")
    # Each worker's own batch, as it is (no rebatching across the workers).
    tokens = tf_keras.utils.experimental.DatasetCreator(
        lambda context: tf.data.Dataset.from_tensors((ids, targets)).repeat())
    dense = tf_keras.utils.experimental.DatasetCreator(
        lambda context: tf.data.Dataset.from_tensors((x, x)).repeat())
    report = {"index": index, "distinct": int(len(np.unique(ids)))}

    def sent_per_step(model, data, callbacks=()):
        model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # trace, connect
        before = cluster.task_traffic()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=list(callbacks))
        after = cluster.task_traffic()
        return (after[peer]["sent"] - before.get(peer, {"sent": 0})["sent"]) / steps

    for name, codec in (("plain", None), ("none", tfgc.codecs.NoCompression()),
                        ("fastsgd", tfgc.codecs.FastSGD())):
        with strategy.scope():
            model = recommender.token_model()
            optimizer = tf_keras.optimizers.SGD(0.5)
            if codec is not None:
                optimizer = tfgc.DistributedOptimizer(optimizer, compression=codec)
            model.compile(optimizer, "mse")
        report[name] = {"sent": sent_per_step(model, tokens)}
        if codec is not None:
            report[name]["residuals"] = len(optimizer._residuals)
    for backup in (None, 10):
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([tf_keras.layers.Dense(512, use_bias=False,
                                                               input_shape=(512,))])
            model.compile(tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                                    compression=tfgc.codecs.ThreeLC(1.0)), "mse")
        callbacks = [] if backup is None else [tf_keras.callbacks.BackupAndRestore(
            os.path.join(out_dir, "backup"), save_freq=backup, delete_checkpoint=False)]
        report[f"backup_{backup}"] = sent_per_step(model, dense, callbacks)
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)  # a barrier
    send_report(report)
    """
)


def test_mwms_gathers_sparse_rows_and_backups_send_no_residual(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(MWMS_WORKER)
    local = cluster.LocalCluster(num_ps=0, num_workers=2, log_dir=tmp_path / "logs")
    try:
        results = local.run_workers([str(script), str(tmp_path), str(MWMS_STEPS)],
                                    timeout_s=400, check=True)
    finally:
        local.stop()
    for result in results:
        report = cluster_scripts.read_report(result.stdout, result.stderr)
        plain, none, fastsgd = report["plain"], report["none"], report["fastsgd"]
        # Plain TensorFlow all-gathers every looked-up row, repeats included: 1,280 of
        # 64 floats and their ids (each worker sends its own to the other, in a ring).
        assert 1280 * 260 < plain["sent"] < 1280 * 264 * 1.1, report
        # tfgc gathers the distinct rows: fewer than plain, never more.
        assert none["sent"] < plain["sent"] * report["distinct"] / 1280 * 1.1, report
        assert fastsgd["sent"] < none["sent"] / 3, report
        assert none["residuals"] == fastsgd["residuals"] == 0, report
        # Two saves of a 1 MiB residual in 20 steps: an all-reduce of each would add
        # 100 KB a step; a save reads each worker's own residual.
        no_backup, backup = report["backup_None"], report["backup_10"]
        assert backup <= 1.05 * no_backup + 500, report
        assert np.isfinite(no_backup) and no_backup > 0, report
