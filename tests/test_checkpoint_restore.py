"""What a `tf.train.Checkpoint` of a model and its DistributedOptimizer restores.

Everything the optimizer saves comes back exactly: the inner optimizer's slots and
`iterations`, the error-feedback residuals and the traffic counters. As with any
tf_keras optimizer, the optimizer's variables exist once it is built: restore after
`optimizer.build(model.trainable_variables)` to `assert_consumed()` at once, or before
it (the values then arrive when it is built, at the first step at the latest).
"""
import numpy as np
import pytest
import tensorflow as tf

import tfgc

pytestmark = pytest.mark.slow

X = np.random.default_rng(0).normal(size=(64, 64)).astype("float32")
Y = X[:, :32] * 2.0


def make():
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(32, input_shape=(64,))])
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.05, momentum=0.9),
                                          compression=tfgc.codecs.ThreeLC(1.0))
    model.compile(optimizer, "mse")
    return model, optimizer


def state(optimizer):
    return {
        "slots": [v.numpy() for v in optimizer.variables],
        "residuals": {k: v.numpy() for k, v in optimizer._residuals.items()},
        "traffic": {k: int(v) for k, v in optimizer.traffic.items()},
        "iterations": int(optimizer.iterations.numpy()),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, optimizer = make()
    model.fit(X, Y, batch_size=8, epochs=5, verbose=0)  # 40 steps
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
        str(tmp_path_factory.mktemp("ckpt") / "ckpt"))
    return path, state(optimizer), [w.numpy() for w in model.weights]


def check_restored(saved_state, optimizer, model, weights):
    restored = state(optimizer)
    assert restored["iterations"] == saved_state["iterations"] == 40
    assert restored["traffic"] == saved_state["traffic"] and restored["traffic"]["push_bytes"] > 0
    assert restored["residuals"].keys() == saved_state["residuals"].keys()
    for key, residual in saved_state["residuals"].items():
        assert np.abs(residual).max() > 0  # something to restore
        np.testing.assert_array_equal(restored["residuals"][key], residual)
    for a, b in zip(restored["slots"], saved_state["slots"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.weights, weights):
        np.testing.assert_array_equal(a.numpy(), b)


def test_restoring_into_a_built_optimizer_consumes_everything(saved):
    path, saved_state, weights = saved
    model, optimizer = make()
    optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path).assert_consumed()
    check_restored(saved_state, optimizer, model, weights)


def test_restoring_before_the_build_fills_the_optimizer_when_it_is_built(saved):
    path, saved_state, weights = saved
    model, optimizer = make()
    status = tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path)
    status.assert_existing_objects_matched()
    optimizer.build(model.trainable_variables)
    status.assert_consumed()
    check_restored(saved_state, optimizer, model, weights)
    # Training goes on from the restored state, as the original would have.
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    assert int(optimizer.iterations.numpy()) == 48
