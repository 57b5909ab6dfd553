"""Sparse gradients (an embedding's `tf.IndexedSlices`) stay sparse under every codec.

One process: the fused wire encodes and decodes here, so what the counters count is
what a parameter server's message would carry. What crosses real sockets is in
tests/test_sparse_embeddings.py.
"""
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
import tfgc_ops
from models import recommender
from tfgc.codecs.rows import SparseRows, distinct_rows, plain_nbytes

C = tfgc.codecs

VOCABULARY, DIM, LENGTH, BATCH = 5000, 16, 20, 64


def batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = recommender.zipf_ids(rng, (BATCH, LENGTH), VOCABULARY)
    return ids, rng.normal(size=(BATCH, 1)).astype(np.float32)


def model():
    return recommender.token_model(VOCABULARY, DIM, LENGTH)


def fit_once(optimizer, build_first=False, seed=0):
    """One fit step of the token model; returns (model, warnings' texts)."""
    net = model()
    net.compile(optimizer, "mse")
    ids, y = batch(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if build_first:
            optimizer.build(net.trainable_variables)
        net.fit(ids, y, epochs=1, batch_size=BATCH, verbose=0)
    return net, [str(w.message) for w in caught]


def plain_push_bytes(ids):
    """What plain TensorFlow sends for one step: the distinct rows and their int32 ids,
    the head's kernel and bias dense."""
    return len(np.unique(ids)) * (DIM * 4 + 4) + (DIM + 1) * 4


def test_an_embedding_keeps_no_dense_residual_and_counts_against_plain_tensorflow():
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.FastSGD(), min_elements=DIM)
    net, caught = fit_once(optimizer)
    assert not [w for w in caught if "residual" in w], caught
    # The head's kernel (16 elements) keeps its residual; the embedding none.
    residuals = list(optimizer._residuals.values())
    assert [r.shape.as_list() for r in residuals] == [[DIM, 1]]
    traffic = {k: int(v.numpy()) for k, v in optimizer.traffic.items()}
    ids, _ = batch()
    assert traffic["push_plain_bytes"] == plain_push_bytes(ids)
    assert traffic["push_dense_bytes"] == (VOCABULARY * DIM + DIM + 1) * 4
    # FastSGD: one byte per value and the rows' packed ids, against 4 + 4 / DIM.
    assert traffic["push_bytes"] < traffic["push_plain_bytes"] / 3
    by_variable = optimizer.traffic_by_variable()[net.get_layer("embedding").embeddings.name]
    assert by_variable["push_plain_bytes"] == len(np.unique(ids)) * (DIM * 4 + 4)


def test_a_residual_made_before_the_first_step_is_left_unused_with_a_warning():
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.NoCompression())
    net, caught = fit_once(optimizer, build_first=True)
    unused = [w for w in caught if "stays unused" in w]
    assert len(unused) == 1 and "0.3 MB" in unused[0], caught
    # Sent as its rows all the same: what plain TensorFlow sends, and the dense shape.
    counted = optimizer.traffic_by_variable()[net.get_layer("embedding").embeddings.name]
    assert counted["push_plain_bytes"] < counted["push_bytes"] <= counted["push_plain_bytes"] + 32


def test_sparse_error_feedback_keeps_a_dense_residual_and_says_what_it_costs():
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.TopK(0.01), sparse_error_feedback=True)
    assert optimizer.get_config()["sparse_error_feedback"] is True
    net, caught = fit_once(optimizer)
    costly = [w for w in caught if "sparse_error_feedback=True" in w]
    assert len(costly) == 1 and "0.3 MB" in costly[0], caught
    embedding = net.get_layer("embedding").embeddings
    # Sent densified, but counted against the rows plain TensorFlow would send.
    ids, _ = batch()
    counted = optimizer.traffic_by_variable()[embedding.name]
    assert counted["push_plain_bytes"] == len(np.unique(ids)) * (DIM * 4 + 4), counted
    (residual,) = [r for r in optimizer._residuals.values() if r.shape == embedding.shape]
    assert np.count_nonzero(residual.numpy()) > 0  # what TopK left of the densified rows


@pytest.mark.parametrize("codec", [
    C.NoCompression(), C.FastSGD(), C.TopK(0.01), C.ThreeLC(1.0), C.Int8(), C.Quantize(4),
    C.Cast("bfloat16"), C.OneBit(), C.Sparsify(0.1),
], ids=lambda codec: codec.name)
def test_every_codec_sends_an_embeddings_rows_and_no_more_than_plain(codec):
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=codec,
                                          error_feedback=False)
    net, _ = fit_once(optimizer)
    embedding = net.get_layer("embedding").embeddings.name
    counted = optimizer.traffic_by_variable()[embedding]
    assert counted["push_bytes"] <= 1.01 * counted["push_plain_bytes"] + 32, counted
    reference = model()
    reference.compile(tf_keras.optimizers.SGD(0.1), "mse")
    ids, y = batch()
    reference.fit(ids, y, epochs=1, batch_size=BATCH, verbose=0)
    moved = net.get_layer("embedding").embeddings.numpy() - model().get_layer(
        "embedding").embeddings.numpy()
    expected = reference.get_layer("embedding").embeddings.numpy() - model().get_layer(
        "embedding").embeddings.numpy()
    # Only the looked-up rows move.
    untouched = np.setdiff1d(np.arange(VOCABULARY), ids)
    assert not moved[untouched].any()
    if codec.name == "NoCompression":
        np.testing.assert_allclose(moved, expected, atol=1e-7)


def test_distinct_rows_sum_repeats_in_ascending_order_and_keep_dtypes():
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], tf.float16)
    slices = tf.IndexedSlices(values, tf.constant([7, 2, 7]), tf.constant([9, 2]))
    distinct = distinct_rows(slices)
    assert distinct.indices.dtype == tf.int32 and distinct.values.dtype == tf.float16
    assert distinct.indices.numpy().tolist() == [2, 7]
    np.testing.assert_array_equal(distinct.values.numpy(), [[3, 4], [6, 8]])
    np.testing.assert_array_equal(tf.convert_to_tensor(distinct).numpy(),
                                  tf.convert_to_tensor(slices).numpy())
    assert int(plain_nbytes(distinct)) == 2 * 2 * 2 + 2 * 4


def test_sparse_rows_refuse_rows_outside_the_dense_shape_and_another_shape():
    codec = SparseRows(C.Int8())
    slices = distinct_rows(tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]),
                                            tf.constant([5, 3])))
    payload = codec.encode(slices)
    decoded = codec.decode(payload, expected_shape=[5, 3])
    assert decoded.indices.numpy().tolist() == [0, 4]
    np.testing.assert_allclose(decoded.values.numpy(), np.ones([2, 3]))
    with pytest.raises(ValueError, match=r"expected \[6, 3\]"):
        codec.decode(payload, expected_shape=[6, 3])
    beyond = dict(payload, rows=tfgc_ops.pack_keys(tf.constant([0, 5], tf.int64)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside its dense_shape"):
        codec.decode(beyond)
    fewer = dict(payload, rows=tfgc_ops.pack_keys(tf.constant([0], tf.int64)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match"):
        codec.decode(fewer)


def test_compressed_embedding_off_parameter_servers_is_keras_embedding():
    ids, _ = batch()
    plain = recommender.token_model(VOCABULARY, DIM, LENGTH)
    compressed = recommender.token_model(VOCABULARY, DIM, LENGTH,
                                         embedding=tfgc.CompressedEmbedding)
    np.testing.assert_array_equal(plain.predict(ids, verbose=0), compressed.predict(ids, verbose=0))
    config = compressed.get_layer("embedding").get_config()
    assert config["rows"] == "bfloat16"
    with pytest.raises(ValueError, match="rows must be one of"):
        tfgc.CompressedEmbedding(10, 2, rows="float16")


def test_int8_rows_round_within_half_a_step_and_a_non_finite_row_decodes_nan():
    from tfgc.ps import lookups

    rows = tf.constant([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [1.0, np.inf, 2.0]])
    decoded = lookups._decode_rows(lookups._encode_rows(rows, "int8"), "int8", tf.float32)
    np.testing.assert_allclose(decoded.numpy()[0], rows.numpy()[0], atol=1.0 / 254 + 1e-7)
    np.testing.assert_array_equal(decoded.numpy()[1], [0, 0, 0])
    assert np.isnan(decoded.numpy()[2]).all()


def test_build_for_fit_finds_the_sparse_gradients_before_it_builds():
    net = model()
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.ThreeLC(1.0), min_elements=DIM)
    net.compile(optimizer, "mse")
    tfgc.build_for_fit(net, tf.TensorSpec([None, 1], tf.float32))
    assert [r.shape.as_list() for r in optimizer._residuals.values()] == [[DIM, 1]]
    ids, y = batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net.fit(ids, y, epochs=1, batch_size=BATCH, verbose=0)
    assert not [w for w in caught if "residual" in str(w.message)]


KERAS3_EMBEDDING = """
import os, json
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, keras, tfgc
rng = np.random.default_rng(0)
ids = (np.minimum(rng.zipf(1.3, (64, 20)), 5000) - 1).astype("int32")
y = rng.normal(size=(64, 1)).astype("float32")
model = keras.Sequential([keras.Input((20,), dtype="int32"), keras.layers.Embedding(5000, 16),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
optimizer = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=tfgc.codecs.FastSGD(),
                                      min_elements=16)
model.compile(optimizer, "mse")
model.fit(ids, y, batch_size=64, epochs=1, verbose=0)
traffic = {k: int(v.numpy()) for k, v in optimizer.traffic.items()}
print("REPORT " + json.dumps({"traffic": traffic, "distinct": int(len(np.unique(ids))),
                              "residuals": [r.shape.as_list() for r in optimizer._residuals.values()]}))
"""


def test_keras3_embeddings_keep_no_dense_residual(run_report):
    report = run_report(KERAS3_EMBEDDING, timeout=120)
    assert report["residuals"] == [[16, 1]], report  # the dense kernel's only
    traffic = report["traffic"]
    assert traffic["push_plain_bytes"] == report["distinct"] * (16 * 4 + 4) + 17 * 4, report
    assert traffic["push_bytes"] < traffic["push_plain_bytes"] / 3, report
