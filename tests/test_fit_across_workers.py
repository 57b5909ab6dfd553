"""`tfgc.fit_across_workers` in one process: the step Keras 3's `fit` runs, and its
refusals. (Across two processes: tests/test_keras3_mwms.py.)"""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfgc  # noqa: E402


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = x @ rng.normal(size=(8, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)


def _model(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def test_it_trains_as_keras_fit_does_under_mirrored_strategy():
    strategy = tf.distribute.MirroredStrategy()
    ours = tfgc.fit_across_workers(_model(strategy), strategy, _data(), epochs=3,
                                   steps_per_epoch=4, verbose=0)
    theirs = _model(strategy).fit(_data(), epochs=3, steps_per_epoch=4, verbose=0)
    np.testing.assert_allclose(ours["loss"], theirs.history["loss"], rtol=1e-5)
    assert ours["loss"][-1] < ours["loss"][0]


def test_it_prints_a_line_per_epoch(capsys):
    strategy = tf.distribute.MirroredStrategy()
    tfgc.fit_across_workers(_model(strategy), strategy, _data(), epochs=2,
                            steps_per_epoch=3)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]


def test_it_refuses_parameter_servers_and_uncompiled_models():
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compile the model"):
        tfgc.fit_across_workers(model, strategy, _data(), 1, 1)

    class FakeParameterServers(tf.distribute.experimental.ParameterServerStrategy):
        def __init__(self):  # noqa: D107 (no cluster: only its type is read)
            pass

    with pytest.raises(ValueError, match="fit_on_parameter_servers"):
        tfgc.fit_across_workers(_model(strategy), FakeParameterServers(), _data(), 1, 1)
