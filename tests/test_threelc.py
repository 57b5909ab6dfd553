"""ThreeLC: the paper's formulas, the reference byte format, edge cases."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc_ops import reference


def expected_bytes(x, sparsity):
    flat = np.asarray(x, np.float32).reshape(-1)
    scale = np.abs(flat).max() * sparsity if flat.size else 0.0
    q = np.round(flat / scale) if scale > 0 else np.zeros_like(flat)
    return reference.zero_run_encode(reference.quartic_encode(q.astype(np.int8))), scale, q


@pytest.mark.parametrize("sparsity", [1.0, 1.5, 1.75, 1.9])
@pytest.mark.parametrize("shape", [[1000], [33, 17], [3, 3, 16, 16], [1]])
def test_threelc_matches_paper_and_reference(rng, sparsity, shape):
    x = rng.standard_t(3, size=shape).astype(np.float32)
    codec = tfgc.codecs.ThreeLC(sparsity)
    payload = codec.encode(x)
    data, scale, q = expected_bytes(x, sparsity)
    np.testing.assert_array_equal(payload["data"].numpy(), data)
    np.testing.assert_allclose(payload["scale"].numpy(), scale, rtol=1e-6)
    decoded = codec.decode(payload).numpy()
    assert decoded.shape == tuple(shape) and decoded.dtype == np.float32
    np.testing.assert_allclose(decoded.reshape(-1), q * np.float32(scale), rtol=1e-6)
    # Rounding error is at most M/2 (3LC section 3.1).
    assert np.abs(decoded - x).max() <= scale / 2 * (1 + 1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_threelc_keeps_dtype(dtype):
    x = tf.cast(tf.linspace(-1.0, 1.0, 101), dtype)
    codec = tfgc.codecs.ThreeLC()
    payload, reconstructed = codec.encode_and_reconstruct(x)
    decoded = codec.decode(payload)
    assert decoded.dtype == dtype and decoded.shape == x.shape
    np.testing.assert_array_equal(
        tf.cast(decoded, tf.float32).numpy(), tf.cast(reconstructed, tf.float32).numpy()
    )


def test_threelc_sparsity_trades_bytes_for_error(rng):
    x = rng.standard_t(3, size=100_000).astype(np.float32)
    sizes, errors = [], []
    for s in (1.0, 1.5, 1.9):
        codec = tfgc.codecs.ThreeLC(s)
        payload = codec.encode(x)
        sizes.append(int(tfgc.codecs.payload_nbytes(payload)))
        errors.append(np.linalg.norm(codec.decode(payload).numpy() - x))
    assert sizes[0] >= sizes[1] >= sizes[2]
    assert sizes[0] < x.nbytes / 20  # 1.6 bits/value before zero-run, heavy-tailed data


def test_all_zero_tensor_compresses_280x():
    x = tf.zeros([1000, 1000])
    payload = tfgc.codecs.ThreeLC().encode(x)
    ratio = x.shape.num_elements() * 4 / int(tfgc.codecs.payload_nbytes(payload))
    assert 279 < ratio <= 280
    np.testing.assert_array_equal(tfgc.codecs.ThreeLC().decode(payload).numpy(), 0)


def test_quartic_alone_is_1_6_bits_per_value():
    # Values +-M only: no byte is 121, so zero-run encoding changes nothing.
    x = np.where(np.arange(10_000) % 3 == 0, 1.0, -1.0).astype(np.float32)
    payload = tfgc.codecs.ThreeLC().encode(x)
    assert payload["data"].shape == (2000,)
    np.testing.assert_array_equal(tfgc.codecs.ThreeLC().decode(payload).numpy(), x)


@pytest.mark.parametrize("shape", [[], [0], [0, 5], [1], [4], [6]])
def test_threelc_small_and_empty(shape):
    x = tf.fill(shape, 0.5) if shape else tf.constant(0.5)
    codec = tfgc.codecs.ThreeLC()
    decoded = codec.decode(codec.encode(x))
    assert decoded.shape == x.shape
    np.testing.assert_array_equal(decoded.numpy(), x.numpy())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_threelc_non_finite_decodes_to_nan(bad):
    x = np.ones(20, np.float32)
    x[7] = bad
    codec = tfgc.codecs.ThreeLC()
    payload = codec.encode(x)
    assert np.isnan(codec.decode(payload).numpy()).all()
    assert np.isnan(codec.encode_and_reconstruct(x)[1].numpy()).all()


def test_threelc_in_tf_function_matches_eager(rng):
    x = tf.constant(rng.normal(size=[64, 10]).astype(np.float32))
    codec = tfgc.codecs.ThreeLC(1.5)

    @tf.function
    def roundtrip(x):
        payload = codec.encode(x)
        return payload, codec.decode(payload)

    payload, decoded = roundtrip(x)
    eager = codec.encode(x)
    np.testing.assert_array_equal(payload["data"].numpy(), eager["data"].numpy())
    np.testing.assert_array_equal(decoded.numpy(), codec.decode(eager).numpy())
    assert decoded.shape == x.shape  # static shape survives tracing


def test_threelc_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"\[1, 2\)"):
        tfgc.codecs.ThreeLC(2.0)
    with pytest.raises(ValueError):
        tfgc.codecs.ThreeLC(0.5)
    with pytest.raises(TypeError, match="floating"):
        tfgc.codecs.ThreeLC().encode(tf.constant([1, 2, 3]))


def test_threelc_rejects_payload_that_does_not_match_shape():
    codec = tfgc.codecs.ThreeLC()
    payload = dict(codec.encode(tf.ones([100])))
    payload["shape"] = tf.constant([200])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match its shape"):
        codec.decode(payload)


def test_payload_nbytes_counts_every_tensor():
    payload = {"a": tf.zeros([10], tf.uint8), "b": tf.zeros([3], tf.float32),
               "c": tf.zeros([2], tf.int32)}
    assert int(tfgc.codecs.payload_nbytes(payload)) == 10 + 12 + 8


def test_codec_config_roundtrip():
    codec = tfgc.codecs.ThreeLC(1.75)
    again = tfgc.codecs.ThreeLC.from_config(codec.get_config())
    assert again.sparsity == 1.75 and repr(again) == "ThreeLC(sparsity=1.75)"
