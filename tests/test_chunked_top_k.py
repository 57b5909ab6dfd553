"""ChunkedTopK: per-chunk top-k with 2-bit values (SparseLoCo's compressor), against a
NumPy reference of the selection, its exact payload size, its refusal of malformed
payloads, error feedback across steps, and training with it as the gradient codec and
as the pseudo-gradient codec of local steps (no strategy, and two mirrored replicas)."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc_ops import chunked

C = tfgc.codecs


def gradient_like(rng, shape, dtype=np.float32):
    return (rng.standard_t(3, size=shape) * 1e-2).astype(dtype)


def reference_selection(x, chunk, kept):
    """Per chunk, the positions a top-k keeps: the largest nonzero finite magnitudes,
    ties in position order (a stable sort), ceil(length * kept / chunk) of them."""
    selected = np.zeros(x.size, bool)
    for start in range(0, x.size, chunk):
        part = np.abs(x[start:start + chunk])
        k = -(-part.size * kept // chunk)
        order = np.argsort(-part, kind="stable")[:k]
        order = order[part[order] > 0]
        selected[start + order] = True
    return selected


@pytest.mark.parametrize("shape, chunk, density", [
    ([100, 300], 4096, 0.02), ([5000], 1000, 0.01), ([33, 5], 16, 0.25), ([7], 4096, 0.03),
    ([3, 3, 16, 16], 64, 0.1), ([4096 * 3], 4096, 0.03),
])
def test_keeps_each_chunk_s_largest_values_in_two_levels(rng, shape, chunk, density):
    codec = C.ChunkedTopK(density, chunk=chunk)
    x = gradient_like(rng, shape)
    flat = x.reshape(-1)
    payload, sent = codec.encode_and_reconstruct(tf.constant(x))
    decoded = codec.decode(payload).numpy()
    np.testing.assert_array_equal(sent.numpy(), decoded)
    assert decoded.shape == x.shape and decoded.dtype == np.float32
    out = decoded.reshape(-1)
    selected = reference_selection(flat, chunk, codec.kept)
    np.testing.assert_array_equal(out != 0, selected)  # unselected values decode to 0
    np.testing.assert_array_equal(np.sign(out[selected]), np.sign(flat[selected]))
    levels = payload["levels"].numpy().reshape(-1, 2)
    for c, start in enumerate(range(0, flat.size, chunk)):
        keep = selected[start:start + chunk]
        m = np.abs(flat[start:start + chunk][keep])
        got = np.abs(out[start:start + chunk][keep])
        low, high = levels[c]
        assert set(np.unique(got)) <= {low, high} and low <= high
        # Each level is the mean of the magnitudes it stands for, and a split by size.
        for level in {low, high}:
            np.testing.assert_allclose(level, m[got == level].mean(), rtol=1e-5)
        if low < high:
            assert m[got == low].max() <= m[got == high].min()
        # Within the 2-bit quantization error: no value further from its level than the
        # spread of the kept magnitudes, and closer overall than one scale per chunk.
        assert np.abs(m - got).max() <= m.max() - m.min() + 1e-7
        assert ((m - got) ** 2).sum() <= ((m - m.mean()) ** 2).sum() * (1 + 1e-5)


@pytest.mark.parametrize("density", [0.01, 0.02, 0.03])
@pytest.mark.parametrize("chunk", [4096, 1000, 65536, 2])
@pytest.mark.parametrize("shape", [[64, 64], [3, 3, 16, 32], [10], [0], [], [70000]])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float64])
def test_payload_bytes_follow_the_formula(rng, density, chunk, shape, dtype):
    codec = C.ChunkedTopK(density, chunk=chunk)
    x = tf.cast(gradient_like(rng, shape), dtype)
    payload = codec.encode(x)
    n = int(np.prod(shape))
    chunks = -(-n // chunk)
    k = math.ceil(density * chunk)
    total = 0 if n == 0 else (chunks - 1) * k + -(-(n - (chunks - 1) * chunk) * k // chunk)
    bits = math.ceil(math.log2(chunk))
    expected = (-(-total * bits // 8) + -(-total * 2 // 8) + 2 * chunks * dtype.size
                + 4 * len(shape))
    assert int(C.payload_nbytes(payload)) == expected == codec.payload_nbytes(shape, dtype)
    assert codec.kept == k and codec.index_bits == bits


def test_bits_per_value_of_a_whole_chunk():
    codec = C.ChunkedTopK(0.02, chunk=4096)  # 82 kept: 12-bit positions, 2-bit codes
    n = 4096 * 64
    bits = 8 * (codec.payload_nbytes([n]) - 4) / n
    assert bits == pytest.approx((82 * 14 + 64) / 4096)  # 0.296 bits per value


def test_zeros_and_sparse_chunks(rng):
    codec = C.ChunkedTopK(0.25, chunk=16)
    zeros = codec.decode(codec.encode(tf.zeros([40])))
    np.testing.assert_array_equal(zeros.numpy(), np.zeros(40))
    x = np.zeros(32, np.float32)
    x[[1, 5]] = [0.5, -1.5]  # chunk 0 keeps 4, has 2 nonzero: both, at their mean
    x[16:] = rng.normal(size=16)
    payload = codec.encode(x)
    out = codec.decode(payload).numpy()
    np.testing.assert_array_equal(out[:16] != 0, x[:16] != 0)
    np.testing.assert_allclose(out[[1, 5]], [1.0, -1.0])
    assert payload["levels"].numpy()[0] == 0.0  # the zeros' level
    assert (out[16:] != 0).sum() == 4


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_chunk_that_is_not_finite_decodes_to_nan(rng, bad):
    codec = C.ChunkedTopK(0.1, chunk=64)
    x = gradient_like(rng, [256])
    x[70] = bad
    out = codec.decode(codec.encode(x)).numpy()
    assert np.isnan(out[64:128]).any() and np.isfinite(out[:64]).all()
    assert np.isfinite(out[128:]).all()


def test_error_feedback_conserves_across_steps(rng):
    feedback = tfgc.ErrorFeedback(C.ChunkedTopK(0.02, chunk=512))
    total_in, total_sent = np.zeros(3000), np.zeros(3000)
    for _ in range(20):
        x = gradient_like(rng, [3000])
        total_in += x
        total_sent += feedback.decode(feedback.encode(x, key="g")).numpy()
    residual = feedback.residuals["g"].numpy()
    np.testing.assert_allclose(total_sent + residual, total_in, atol=1e-5)
    # The residual stays bounded: what is not sent now is sent later.
    assert np.abs(residual).max() < 20 * np.abs(gradient_like(rng, [3000])).max()


def test_malformed_payloads_are_refused(rng):
    codec = C.ChunkedTopK(0.05, chunk=64)
    x = gradient_like(rng, [300])
    good = {k: v.numpy() for k, v in codec.encode(x).items()}
    refused = (C.MalformedPayloadError, tf.errors.InvalidArgumentError)
    for key in ("positions", "codes", "levels"):
        for cut in (good[key][:-1], np.concatenate([good[key], good[key][:1]])):
            with pytest.raises(C.MalformedPayloadError, match=key):
                codec.decode(dict(good, **{key: cut}))
    with pytest.raises(C.MalformedPayloadError):
        codec.decode(good, expected_shape=[301])
    with pytest.raises(refused):
        codec.decode(dict(good, shape=np.array([2**30, 2**30], np.int32)))
    # Positions that repeat, descend or leave their chunk (6 bits, chunk 64: 4 chunks of
    # 4 entries and a last one of 44 values with 3): refused before anything is decoded.
    positions = good["positions"].copy()
    positions[:] = 0xFF  # 63, 63, ...
    with pytest.raises(tf.errors.InvalidArgumentError, match="ascend"):
        codec.decode(dict(good, positions=positions))
    # A last chunk of 44 values: a position of 44..63 is outside it.
    last = chunked.chunk_top_k_encode(np.arange(1, 45, dtype=np.float32), 64, 4)[0].numpy()
    assert last.size == 3 * 6 // 8 + 1
    bad = np.array([0b11111111, 0b11111111, 0b11000000], np.uint8)  # 63, 63, 63
    with pytest.raises(tf.errors.InvalidArgumentError, match="ascend"):
        chunked.chunk_top_k_decode(bad, np.zeros(1, np.uint8), np.ones(2, np.float32), 44, 64, 4)
    # Random bytes of the right sizes decode in bounds or are refused.
    for trial in range(200):
        mutated = {k: v.copy() for k, v in good.items()}
        key = ("positions", "codes")[trial % 2]
        mutated[key] = rng.integers(0, 256, mutated[key].size).astype(np.uint8)
        try:
            out = codec.decode(mutated, expected_shape=[300])
            assert out.shape == (300,)
        except tf.errors.InvalidArgumentError:
            pass


def test_traced_decode_checks_sizes_at_run_time(rng):
    codec = C.ChunkedTopK(0.05, chunk=64)
    good = codec.encode(gradient_like(rng, [300]))
    signature = {k: tf.TensorSpec([None] * v.shape.rank, v.dtype) for k, v in good.items()}
    decode = tf.function(codec.decode, input_signature=[signature])
    np.testing.assert_array_equal(decode(good).numpy(), codec.decode(good).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="levels"):
        decode(dict(good, levels=good["levels"][:-1]))


@pytest.mark.parametrize("bad, error", [
    (dict(density=0.0), ValueError), (dict(density=1.5), ValueError),
    (dict(density=float("nan")), ValueError), (dict(chunk=1), ValueError),
    (dict(chunk=65537), ValueError), (dict(chunk=4.5), ValueError),
    (dict(density="0.1"), TypeError),
])
def test_settings_are_checked(bad, error):
    with pytest.raises(error):
        C.ChunkedTopK(**bad)


def test_registered_and_its_config_round_trips():
    codec = C.ChunkedTopK(0.03, chunk=1024)
    again = C.deserialize(C.serialize(codec))
    assert type(again) is C.ChunkedTopK and again.get_config() == codec.get_config()
    assert "ChunkedTopK" in C.names() and not codec.summable


def _model(codec, **settings):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf_keras.layers.Dense(1)])
    model.compile(tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.01), compression=codec,
                                            min_elements=64, **settings), "mse")
    return model


def _data(rng):
    x = rng.normal(size=[512, 32]).astype("float32")
    return x, (x @ rng.normal(size=[32, 1])).astype("float32")


def test_trains_as_the_gradient_codec(rng):
    x, y = _data(rng)
    model = _model(C.ChunkedTopK(0.05, chunk=256))
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    kernel = model.trainable_variables[0]
    assert type(model.optimizer.codec_for(kernel)) is C.ChunkedTopK
    assert model.optimizer.encoder.residual(kernel) is not None


def test_trains_as_the_pseudo_gradient_codec_of_local_steps(rng):
    x, y = _data(rng)
    model = _model(C.ChunkedTopK(0.03, chunk=512), local_steps=4,
                   outer_optimizer=tfgc.OuterSGD(learning_rate=0.7, momentum=0.9))
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0,
                        callbacks=[tfgc.callbacks.OuterSteps()])
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert model.optimizer.local_steps_since_meeting() == 0
    # 4 epochs of 16 steps: 16 meetings, each one payload per compressed variable.
    pushed = int(model.optimizer.traffic["push_bytes"].numpy())
    kernel_bytes = C.ChunkedTopK(0.03, chunk=512).payload_nbytes([32, 64])
    assert pushed >= 16 * kernel_bytes


MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras, tfgc
C = tfgc.codecs
codec = C.ChunkedTopK(0.05, chunk=1024)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    var = tf.Variable(tf.ones([96, 64]))
    opt = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.5), compression=codec, min_elements=1,
        local_steps=2, outer_optimizer=tfgc.OuterSGD.averaging())
    opt.build([var])

@tf.function
def step(g):
    def fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(tf.gather(g, r), var)])
    strategy.run(fn)

rng = np.random.default_rng(0)
anchor = np.ones([96, 64], np.float32)
residuals = [np.zeros([96, 64], np.float32) for _ in range(2)]
for meeting in range(3):
    for _ in range(2):
        step(tf.constant((rng.standard_t(3, size=[2, 96, 64]) * 1e-2).astype(np.float32)))
    copies = [v.numpy() for v in strategy.experimental_local_results(var)]
    assert not np.array_equal(copies[0], copies[1])
    assert opt.maybe_synchronize(strategy)
    # Each replica's pseudo-gradient plus its residual, encoded and decoded; the meeting
    # applies their mean (every replica's payload decoded and summed).
    decoded = []
    for r in range(2):
        delta = (anchor - copies[r]) + residuals[r]
        decoded.append(codec.decode(codec.encode(delta)).numpy())
        residuals[r] = delta - decoded[-1]
    expected = anchor - (decoded[0] + decoded[1]) / 2
    met = [v.numpy() for v in strategy.experimental_local_results(var)]
    assert np.array_equal(met[0], met[1])
    np.testing.assert_allclose(met[0], expected, rtol=0, atol=1e-6)
    anchor = met[0]

# fit with OuterSteps on the two replicas: the loss falls.
x = rng.normal(size=[512, 32]).astype("float32")
y = (x @ rng.normal(size=[32, 1])).astype("float32")
with strategy.scope():
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf_keras.layers.Dense(1)])
    model.compile(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.01), compression=C.ChunkedTopK(0.03, chunk=512),
        min_elements=64, local_steps=4, outer_optimizer=tfgc.OuterSGD(0.7, 0.9)), "mse")
history = model.fit(x, y, batch_size=64, epochs=6, verbose=0,
                    callbacks=[tfgc.callbacks.OuterSteps()])
loss = history.history["loss"]
assert loss[-1] < 0.5 * loss[0], loss
print("ok", loss[0], loss[-1])
"""


@pytest.mark.slow
def test_mirrored_replicas_meet_at_the_mean_of_their_decoded_pseudo_gradients(run_python):
    assert "ok" in run_python(MIRRORED_SCRIPT, timeout=300)
