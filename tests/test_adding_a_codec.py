"""The codec of docs/adding-a-codec.md, run as the page shows it: its code is read from
the page, so the guide and what is tested cannot drift apart."""
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc.codecs import base

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "adding-a-codec.md"


@pytest.fixture(scope="module")
def scaled_sign():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    namespace = {}
    exec(blocks[0], namespace)  # noqa: S102  (the guide's own example)
    return namespace["ScaledSign"]


def test_the_guide_s_codec_is_about_thirty_lines(scaled_sign):
    source = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)[0]
    assert len(source.strip().splitlines()) <= 35
    assert tfgc.codecs.lookup("ScaledSign") is scaled_sign


def test_one_bit_per_value_and_the_mean_magnitude(scaled_sign, rng):
    x = tf.constant(rng.normal(size=[512, 512]), tf.float32)
    codec = scaled_sign()
    payload = codec.encode(x)
    assert tfgc.codecs.payload_nbytes(payload) == 512 * 512 // 8 + 4 + 2 * 4
    decoded = codec.decode(payload, expected_shape=[512, 512]).numpy()
    scale = np.abs(x.numpy()).mean()
    np.testing.assert_allclose(np.abs(decoded), scale, rtol=1e-6)
    np.testing.assert_array_equal(decoded > 0, x.numpy() >= 0)
    odd = tf.constant([-1.0, 2.0, -3.0], tf.float16)  # not whole bytes; another dtype
    back = codec.decode(codec.encode(odd))
    assert back.dtype == tf.float16 and back.numpy().tolist() == [-2.0, 2.0, -2.0]


def test_malformed_payloads_are_refused(scaled_sign):
    codec = scaled_sign()
    payload = dict(codec.encode(tf.ones([64])))
    with pytest.raises(base.MalformedPayloadError):
        codec.decode(payload, expected_shape=[65])  # declares 64 values
    payload["signs"] = payload["signs"][:-1]
    with pytest.raises((base.MalformedPayloadError, tf.errors.InvalidArgumentError)):
        codec.decode(payload, expected_shape=[64])
    huge = dict(codec.encode(tf.ones([8])), shape=tf.constant([1 << 30, 1 << 30]))
    with pytest.raises((base.MalformedPayloadError, tf.errors.InvalidArgumentError)):
        codec.decode(huge)


def test_it_trains_through_distributed_optimizer_and_its_config_loads(scaled_sign, rng):
    x = rng.normal(size=[512, 32]).astype("float32")
    y = (x @ rng.normal(size=[32, 1])).astype("float32")
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf_keras.layers.Dense(1)])
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.01),
                                          compression=scaled_sign())
    model.compile(optimizer, "mse")
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    kernel = model.trainable_variables[0]
    assert type(optimizer.codec_for(kernel)).__name__ == "ScaledSign"
    assert optimizer.encoder.residual(kernel) is not None  # biased: error feedback kept
    config = optimizer.get_config()
    restored = type(optimizer).from_config(config)
    assert type(restored.compression).__name__ == "ScaledSign"
