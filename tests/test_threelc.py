"""ThreeLC: the paper's formulas, the reference byte format, edge cases."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc import memory
from tfgc.codecs.base import decode_group, encode_group
import reference_ops as reference


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


def test_batched_encoding_decodes_each_tensor_as_its_own_encoding(rng):
    codec = tfgc.codecs.ThreeLC(1.0)
    shapes = [(3, 3, 16, 16), (7,), (10, 64), (1,), (0,)]
    # Scales that differ by orders of magnitude: each tensor keeps its own M.
    xs = [(rng.standard_t(3, size=s) * 10.0 ** i).astype(np.float32) for i, s in enumerate(shapes)]
    payload, sent = encode_group(codec, [tf.constant(x) for x in xs])
    assert sorted(payload) == ["data", "scales"]  # no shapes: the receiver knows them
    decoded = decode_group(codec, payload, shapes)
    for x, reconstruction, out in zip(xs, sent, decoded):
        alone = codec.decode(codec.encode(x)).numpy()
        np.testing.assert_array_equal(out.numpy(), alone)
        np.testing.assert_array_equal(reconstruction.numpy(), alone)
    # One zero-run stream: fewer bytes than the tensors' own payloads together.
    apart = sum(int(tfgc.codecs.payload_nbytes(codec.encode(x))) for x in xs)
    assert int(tfgc.codecs.payload_nbytes(payload)) < apart


def test_batched_encoding_takes_one_dtype_and_checks_the_size(rng):
    codec = tfgc.codecs.ThreeLC(1.0)
    with pytest.raises(ValueError, match="one dtype"):
        encode_group(codec, [tf.zeros([4]), tf.zeros([4], tf.float16)])[0]
    payload = encode_group(codec, [tf.ones([10]), tf.ones([5])])[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match"):
        decode_group(codec, payload, [(10,), (6,)])  # one more group than was sent


def test_batched_error_feedback_equals_one_tensor_at_a_time(rng):
    codec = tfgc.codecs.ThreeLC(1.75)
    shapes = [(40, 40), (300,)]
    together = [tf.Variable(tf.zeros(s)) for s in shapes]
    alone = [tf.Variable(tf.zeros(s)) for s in shapes]
    for _ in range(5):
        xs = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]
        _, sent = memory.feedback_batch_step(codec, xs, together)
        for x, residual, out in zip(xs, alone, sent):
            np.testing.assert_array_equal(out.numpy(), memory.feedback_step(codec, x, residual)[1].numpy())
    for a, b in zip(together, alone):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_batched_error_feedback_keeps_each_residual_finite_on_its_own(rng):
    codec = tfgc.codecs.ThreeLC(1.0)
    shapes = [(4, 4), (0,), (7,)]
    together = [tf.Variable(tf.fill(s, 0.5)) for s in shapes]
    alone = tf.Variable(tf.fill(shapes[2], 0.5))
    xs = [rng.normal(size=s).astype(np.float32) for s in shapes]
    xs[0][1, 2] = np.nan  # its residual keeps its value; the others move on
    memory.feedback_batch_step(codec, [tf.constant(x) for x in xs], together)
    np.testing.assert_array_equal(together[0].numpy(), np.full(shapes[0], 0.5, np.float32))
    memory.feedback_step(codec, tf.constant(xs[2]), alone)
    np.testing.assert_array_equal(together[2].numpy(), alone.numpy())
    assert not np.array_equal(alone.numpy(), np.full(shapes[2], 0.5, np.float32))


def test_batched_error_feedback_survives_a_finite_input_that_overflows_the_codec(rng):
    # M = 1.75 * max|x| overflows float32 for the first tensor only: its decoding is not
    # finite, so its residual keeps its value, and every residual stays finite.
    codec = tfgc.codecs.ThreeLC(1.75)
    residuals = [tf.Variable(tf.zeros([5])), tf.Variable(tf.zeros([6]))]
    for step in range(4):
        huge = np.full(5, 3e38 if step % 2 == 0 else 1.0, np.float32)
        small = rng.normal(size=6).astype(np.float32)
        memory.feedback_batch_step(codec, [tf.constant(huge), tf.constant(small)], residuals)
        assert all(np.isfinite(r.numpy()).all() for r in residuals)
    assert np.abs(residuals[1].numpy()).sum() > 0


@pytest.mark.parametrize("sparsity", [1.0, 1.75])
def test_entropy_coder_decodes_what_zero_run_does_in_fewer_bytes(rng, sparsity):
    zre, entropy = tfgc.codecs.ThreeLC(sparsity), tfgc.codecs.ThreeLC(sparsity, coder="entropy")
    shapes = [(3, 3, 16, 16), (7,), (10, 640), (1,), (0,)]
    xs = [tf.constant(rng.standard_t(3, size=s).astype(np.float32)) for s in shapes]
    for x in xs:
        np.testing.assert_array_equal(entropy.decode(entropy.encode(x)).numpy(),
                                      zre.decode(zre.encode(x)).numpy())
    payload, sent = encode_group(entropy, xs)
    for x, reconstruction, out in zip(xs, sent, decode_group(entropy, payload, shapes)):
        expected = zre.decode(zre.encode(x)).numpy()
        np.testing.assert_array_equal(out.numpy(), expected)
        np.testing.assert_array_equal(reconstruction.numpy(), expected)
    zre_bytes = int(tfgc.codecs.payload_nbytes(encode_group(zre, xs)[0]))
    assert int(tfgc.codecs.payload_nbytes(payload)) < zre_bytes


def test_entropy_coder_config_and_errors():
    codec = tfgc.codecs.ThreeLC(1.75, coder="entropy")
    again = tfgc.codecs.deserialize(tfgc.codecs.serialize(codec))
    assert again.coder == "entropy" and repr(again) == "ThreeLC(sparsity=1.75, coder='entropy')"
    with pytest.raises(ValueError, match="coder must be one of"):
        tfgc.codecs.ThreeLC(1.0, coder="huffman")
    payload = encode_group(codec, [tf.ones([10]), tf.ones([5])])[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="quartic_entropy_decode"):
        decode_group(codec, payload, [(10,), (6,)])  # one more group than was sent
