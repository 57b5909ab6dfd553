"""ErrorFeedback: conservation, the non-finite policy, per-tensor state, checkpoints."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc


@pytest.mark.parametrize("codec", [tfgc.codecs.ThreeLC(1.0), tfgc.codecs.ThreeLC(1.9)])
def test_sent_plus_residual_equals_inputs(rng, codec):
    ef = tfgc.ErrorFeedback(codec)
    total_in = np.zeros([50, 20], np.float64)
    total_sent = np.zeros_like(total_in)
    for _ in range(30):
        x = rng.normal(size=[50, 20]).astype(np.float32)
        payload = ef.encode(x, key="w")
        total_in += x
        total_sent += ef.decode(payload).numpy()
    residual = ef.residuals["w"].numpy()
    np.testing.assert_allclose(total_sent + residual, total_in, atol=1e-4)
    assert np.count_nonzero(total_sent) > 0


def test_reconstruction_equals_receiver_decode(rng):
    ef = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC(1.5))
    x = rng.normal(size=[300]).astype(np.float32)
    payload, sent = ef.encode_and_reconstruct(x, key="v")
    np.testing.assert_array_equal(sent.numpy(), ef.decode(payload).numpy())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_step_leaves_residual_untouched(rng, bad):
    ef = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC())
    ef.encode(rng.normal(size=[40]).astype(np.float32), key="w")
    before = ef.residuals["w"].numpy().copy()
    poisoned = rng.normal(size=[40]).astype(np.float32)
    poisoned[3] = bad
    payload = ef.encode(poisoned, key="w")
    assert np.isnan(ef.decode(payload).numpy()).all()  # the failure stays visible
    np.testing.assert_array_equal(ef.residuals["w"].numpy(), before)
    ef.encode(rng.normal(size=[40]).astype(np.float32), key="w")
    assert np.isfinite(ef.residuals["w"].numpy()).all()


def test_streams_are_separate_and_shapes_checked():
    ef = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC())
    ef.encode(tf.ones([4]) * tf.constant([1.0, 0.1, 0.1, 0.1]), key="a")
    ef.encode(tf.ones([3]), key="b")
    assert set(ef.residuals) == {"a", "b"}
    assert np.abs(ef.residuals["a"].numpy()).max() > 0
    np.testing.assert_array_equal(ef.residuals["b"].numpy(), 0)
    with pytest.raises(ValueError, match="one key per tensor"):
        ef.encode(tf.ones([5]), key="a")


def test_in_tf_function_with_precreated_residual():
    ef = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC())
    ef.residual("w", [8], tf.float32)
    step = tf.function(lambda x: ef.decode(ef.encode(x, key="w")))
    x = tf.constant([1.0, 0.3, 0.2, 0.1, 0, 0, 0, 0])
    sent = step(x) + step(x)
    np.testing.assert_allclose(sent.numpy() + ef.residuals["w"].numpy(), 2 * x.numpy(), atol=1e-6)


def test_residuals_checkpoint_and_restore(tmp_path, rng):
    ef = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC())
    ef.encode(rng.normal(size=[10]).astype(np.float32), key="w")
    saved = ef.residuals["w"].numpy().copy()
    path = tf.train.Checkpoint(ef=ef).save(str(tmp_path / "ckpt"))
    restored = tfgc.ErrorFeedback(tfgc.codecs.ThreeLC())
    restored.residual("w", [10])
    tf.train.Checkpoint(ef=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored.residuals["w"].numpy(), saved)


def test_wraps_only_codecs():
    with pytest.raises(TypeError, match="Codec"):
        tfgc.ErrorFeedback(lambda x: x)


OVERFLOWING = [
    # (codec, dtype, a finite value that overflows inside the codec's wire format)
    (tfgc.codecs.ThreeLC(1.75), np.float32, 3.0e38),  # M = s * max|x| beyond float32
    (tfgc.codecs.ThreeLC(1.0), np.float64, 1.0e300),  # float64 beyond float32's range
    (tfgc.codecs.Int8(), np.float16, 65504.0),
    (tfgc.codecs.Cast("bfloat16"), np.float16, 65504.0),
    (tfgc.codecs.LogQuant(), np.float32, 3.0e38),
    (tfgc.codecs.QSGD(seed=0), np.float32, 3.0e38),
]


def test_one_bit_means_do_not_overflow_on_the_largest_values():
    # Its sums are in double: values near float32's limit give finite means, sent as is.
    x = np.full(64, 3.0e38, np.float32)
    x[::2] *= -1
    payload, sent = tfgc.codecs.OneBit().encode_and_reconstruct(tf.constant(x))
    assert float(payload["positive"]) == pytest.approx(3.0e38, rel=1e-6)
    assert float(payload["negative"]) == pytest.approx(-3.0e38, rel=1e-6)
    np.testing.assert_allclose(sent.numpy(), x, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:ErrorFeedback around .* an unbiased codec")  # on purpose
@pytest.mark.parametrize("codec,dtype,huge", OVERFLOWING, ids=lambda v: repr(v)[:24])
def test_residual_stays_finite_when_a_finite_input_overflows_the_codec(rng, codec, dtype, huge):
    ef = tfgc.ErrorFeedback(codec)
    shape = [64]
    for step in range(20):
        x = rng.normal(size=shape).astype(dtype)
        if step % 3 == 1:
            x[step % 64] = huge * (-1) ** step  # finite, at the edge of the range
            x[(step + 7) % 64] = -huge
        before = ef.residuals["w"].numpy().copy() if "w" in ef.residuals else np.zeros(shape)
        sent = ef.encode_and_reconstruct(tf.constant(x), key="w")[1].numpy()
        residual = ef.residuals["w"].numpy()
        assert np.isfinite(residual).all(), (step, codec)
        if not np.isfinite(sent).all():
            np.testing.assert_array_equal(residual, before)
    # Each step either conserved (sent + residual == input + old residual) or, where
    # the decoding overflowed, kept the old residual: both hold a finite residual.
