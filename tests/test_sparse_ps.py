"""Sparse gradients on a real parameter-server cluster (FastSGD's workloads).

Logistic regression on hashed Reuters text (D = 2^20 features, batches of 256
documents, `models.sparse_models.keras_model`) trains with tf_keras `fit` under
ParameterServerStrategy (1 ps, 1 worker, the coordinator here), with fp32 pushes and
with FastSGD. Per step, from `ss`:

* the worker reads the batch's u distinct weights: their ids cross to the server,
  packed by FastSGD's key encoder (or as u int32 ids with `packed_reads=False`, as
  `tf.gather` sends them), and u float32 rows come back;
* the push carries its counted payload: fp32 sends the gradient's rows and ids as
  TensorFlow does (not the dense [D] tensor), FastSGD about 18 bits per row, or
  about 8 with packed reads, where the rows travel without their ids (the server
  decodes them against the ids it unpacked for the read);
* nothing else scales with u. In particular a gradient decoded on the server is
  summed there, not sent to the worker and back (tf_keras sums the rows of every
  sparse gradient before applying it, on no device in particular).
"""

import numpy as np
import pytest

import cluster_scripts
import tfgc_ops
from models import data as data_lib

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 4
BATCH = 256

COORDINATOR = cluster_scripts.script(
    """
    import warnings

    from models import data as data_lib, sparse_models

    steps, batch = int(sys.argv[1]), int(sys.argv[2])
    train, _ = data_lib.load_sparse("reuters_corn")
    report = {}
    with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=400) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        for name, codec, packed_reads in (
                ("fp32", tfgc.codecs.NoCompression(), False),
                ("fastsgd", tfgc.codecs.FastSGD(), False),
                ("fastsgd_packed_reads", tfgc.codecs.FastSGD(), True)):
            # fp32 with tf_keras's own Adam (one worker: nothing interleaves), which
            # DistributedOptimizer warns of; the others with sparse_models.adam().
            inner = (tf_keras.optimizers.Adam(0.01, epsilon=1e-8) if name == "fp32"
                     else sparse_models.adam(0.01))
            with strategy.scope():
                model = sparse_models.keras_model(train.num_features, l2=1e-4,
                                                  packed_reads=packed_reads)
                opt = tfgc.DistributedOptimizer(inner, compression=codec, error_feedback=False)
                opt.build(model.trainable_variables)
                model.compile(opt, sparse_models.keras_loss("logistic"))
            # In order, so that the test knows every batch: each fit starts the data over.
            data = sparse_models.sparse_dataset(train, batch, shuffle=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # trace, connect
            rows0 = c.settled_socket_bytes()
            pushed0 = int(opt.traffic["push_bytes"].numpy())
            history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            rows1 = c.settled_socket_bytes()
            report[name] = {
                "sent": (c.traffic_between("worker", "ps", rows=rows1)
                         - c.traffic_between("worker", "ps", rows=rows0)),
                "received": (c.traffic_between("ps", "worker", rows=rows1)
                             - c.traffic_between("ps", "worker", rows=rows0)),
                "payload": int(opt.traffic["push_bytes"].numpy()) - pushed0,
                "loss": history.history["loss"],
                "adam_warnings": [str(w.message) for w in caught
                                  if "half-updated" in str(w.message)],
            }
    send_report(report)
    """
)


def distinct_features_per_batch(batches):
    """The distinct feature ids of each of the first `batches` batches of the unshuffled
    training set, ascending."""
    train, _ = data_lib.load_sparse("reuters_corn")
    return [np.unique(train.x[i * BATCH:(i + 1) * BATCH].indices) for i in range(batches)]


def test_sparse_pushes_carry_their_payload_and_no_round_trip(run_report):
    report = run_report(COORDINATOR, timeout=400, args=[STEPS, BATCH])
    ids = distinct_features_per_batch(STEPS)
    distinct = [len(batch) for batch in ids]
    assert min(distinct) > 1000  # the reads and pushes below are not lost in the slack
    reads = 4 * sum(distinct)  # int32 ids out, float32 rows back
    slack = 4096 * STEPS
    fp32, fastsgd = report["fp32"], report["fastsgd"]
    # Plain Adam applying sparse gradients on parameter servers is warned of, once;
    # BoundedAdam is not.
    assert len(fp32["adam_warnings"]) == 1 and "tfgc.BoundedAdam" in fp32["adam_warnings"][0]
    assert fastsgd["adam_warnings"] == report["fastsgd_packed_reads"]["adam_warnings"] == []
    # fp32: each distinct row's value and int32 id, the bias's gradient and the message's
    # lengths; never the dense [2^20] tensor.
    assert 8 * sum(distinct) <= fp32["payload"] <= 8 * sum(distinct) + 64 * STEPS, fp32
    assert fastsgd["payload"] < fp32["payload"] / 3, report
    for run in (fp32, fastsgd):
        assert reads + run["payload"] <= run["sent"] <= reads + run["payload"] + slack, report
        assert reads <= run["received"] <= reads + slack, report
        assert all(np.isfinite(run["loss"])), report
    # Packed ids: the same training (same losses) for ~9 bits per id instead of 32 on
    # the way out, and the push sends the rows alone: the server holds their ids from
    # the read. So the push's payload is the keyed one less its keys (the packed ids
    # of the values kept: w has one element per row) and its shape, plus the list of
    # the few values dropped (|v| < sum / 1.1^128): at least 95% of the ids' bytes.
    packed = report["fastsgd_packed_reads"]
    packed_ids = sum(int(tfgc_ops.pack_keys(batch.astype(np.int32)).shape[0]) for batch in ids)
    assert packed_ids < sum(distinct) * 2, packed_ids  # < 16 bits per id
    saved = fastsgd["payload"] - packed["payload"]
    assert 0.95 * packed_ids <= saved <= packed_ids + 16 * STEPS, report
    np.testing.assert_allclose(packed["loss"], fastsgd["loss"], rtol=1e-6)
    assert packed_ids + packed["payload"] <= packed["sent"], report
    assert packed["sent"] <= packed_ids + packed["payload"] + slack, report
    assert 4 * sum(distinct) <= packed["received"] <= 4 * sum(distinct) + slack, report
