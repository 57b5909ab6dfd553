"""tfgc.recompute_statistics: batch-norm statistics made again for the current weights."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc


def _batches(rng, count, size=16):
    return [rng.normal(2.0, 3.0, size=(size, 6)).astype("float32") for _ in range(count)]


@pytest.mark.parametrize("library", ["tf_keras", "keras"])
def test_statistics_become_the_mean_of_the_batches_statistics(library):
    lib = tf_keras if library == "tf_keras" else pytest.importorskip("keras")
    rng = np.random.default_rng(0)
    inner = lib.Sequential([lib.layers.Dense(4), lib.layers.BatchNormalization(momentum=0.9)])
    inputs = lib.Input((6,))
    first = lib.layers.BatchNormalization(momentum=0.9)
    model = lib.Model(inputs, inner(first(inputs)))  # one batch norm in a nested model
    batches = _batches(rng, 5)
    labels = np.zeros([16], "int64")
    data = tf.data.Dataset.from_tensor_slices((np.concatenate(batches), np.tile(labels, 5)))
    for norm in (first, inner.layers[1]):
        norm.moving_mean.assign(np.full([norm.moving_mean.shape[0]], 7.0, "float32"))

    assert tfgc.recompute_statistics(model, data.batch(16), batches=3) == 3
    # The first batch norm sees the data: the mean of 3 batches' means and variances.
    np.testing.assert_allclose(first.moving_mean.numpy(),
                               np.mean([b.mean(0) for b in batches[:3]], 0), rtol=1e-5)
    np.testing.assert_allclose(first.moving_variance.numpy(),
                               np.mean([b.var(0) for b in batches[:3]], 0), rtol=1e-5)
    # The nested one sees the first's output through the dense layer's current weights.
    dense = inner.layers[0]
    hidden = [dense(first(b, training=True)).numpy() for b in batches[:3]]
    np.testing.assert_allclose(inner.layers[1].moving_mean.numpy(),
                               np.mean([h.mean(0) for h in hidden], 0), rtol=1e-4, atol=1e-6)
    assert first.momentum == inner.layers[1].momentum == 0.9  # put back
    # A dataset shorter than asked for: every batch it has.
    assert tfgc.recompute_statistics(model, data.take(32).batch(16), batches=10) == 2


def test_recompute_refuses_no_batches():
    model = tf_keras.Sequential([tf_keras.layers.BatchNormalization(input_shape=(6,))])
    empty = tf.data.Dataset.from_tensor_slices(np.zeros([0, 6], "float32")).batch(4)
    with pytest.raises(ValueError, match="no batch"):
        tfgc.recompute_statistics(model, empty)
    with pytest.raises(ValueError, match="batches >= 1"):
        tfgc.recompute_statistics(model, empty, batches=0)
    plain = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(6,))])
    assert tfgc.recompute_statistics(plain, empty) == 0  # no batch norm: nothing to do
