"""PowerSGD, RandomK, ScaledSign and Signum: each codec's own promise (the properties every
codec shares are in test_codecs.py)."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc.codecs.base import MalformedPayloadError, Topology
from tfgc.codecs.powersgd import PowerSGDLayer, orthonormal
from tfgc.codecs.sign import SignumLayer

C = tfgc.codecs


def bound(codec, shape):
    return codec.bind(tf.Variable(tf.zeros(shape), name="kernel"))


# --- ScaledSign -------------------------------------------------------------------------


def test_scaled_sign_sends_the_sign_at_the_mean_magnitude(rng):
    x = rng.normal(size=[1001]).astype(np.float32)
    x[:5] = 0.0
    payload, sent = C.ScaledSign().encode_and_reconstruct(x)
    scale = np.abs(x.astype(np.float64)).mean()
    assert float(payload["scale"]) == pytest.approx(scale, rel=1e-6)
    np.testing.assert_array_equal(sent.numpy(), np.where(x >= 0, 1, -1) * np.float32(payload["scale"]))
    assert payload["data"].shape == [126]  # one bit a value


# --- Signum -----------------------------------------------------------------------------


def test_signum_sends_the_scaled_sign_of_its_momentum(rng):
    layer = bound(C.Signum(momentum=0.5), [40, 25])
    assert isinstance(layer, SignumLayer) and not layer.supports_error_feedback
    momentum = np.zeros([40, 25], np.float32)
    for _ in range(3):
        g = rng.normal(size=[40, 25]).astype(np.float32)
        momentum = np.float32(0.5) * momentum + g
        payload, sent = layer.encode_and_reconstruct(g)
        np.testing.assert_array_equal(layer.momentum.numpy(), momentum)
        scale = np.abs(momentum.astype(np.float64)).mean()
        assert float(payload["scale"]) == pytest.approx(scale, rel=1e-6)
        expected = np.where(momentum >= 0, 1, -1) * np.float32(payload["scale"])
        np.testing.assert_array_equal(sent.numpy(), expected)
        np.testing.assert_array_equal(layer.decode(payload).numpy(), expected)
    assert payload["data"].shape == [125]  # one bit a value
    with pytest.raises(RuntimeError, match="bind"):
        C.Signum().encode(tf.zeros([4]))
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"in \[0, 1\)"):
            C.Signum(momentum=bad)
    assert C.Signum.from_config(C.Signum(0.8).get_config()).momentum == 0.8


def test_signum_majority_vote_takes_the_sign_of_the_senders_signs(rng):
    summing, voting = bound(C.Signum(), [6]), bound(C.Signum(majority_vote=True), [6])
    scales = np.float32([0.5, 2.0, 0.25])
    signs = np.float32([[1, 1, -1, -1, 1, -1], [1, -1, -1, 1, 1, -1], [-1, 1, -1, -1, 1, 1]])
    decodings = [tf.constant(sign * scale) for sign, scale in zip(signs, scales)]
    # Two of three agree on every value but the fourth: the sign of the vote, times the
    # scales' sum (what the sum gives where all agree, as on the fifth and third).
    np.testing.assert_array_equal(voting.combine(decodings).numpy(),
                                  np.sign(signs.sum(0)) * scales.sum())
    np.testing.assert_array_equal(summing.combine(decodings).numpy(), (signs * scales[:, None]).sum(0))
    tie = voting.combine([tf.constant([1.0, -1.0]), tf.constant([-2.0, -2.0])]).numpy()
    np.testing.assert_array_equal(tie, [0.0, -3.0])
    failed = voting.combine([tf.constant([1.0, -1.0]), tf.constant([np.nan, np.nan])]).numpy()
    assert np.isnan(failed).all()  # a failed step fails the update
    config = C.Signum(0.7, majority_vote=True).get_config()
    assert C.Signum.from_config(config).majority_vote is True
    with pytest.raises(TypeError, match="majority_vote must be a bool"):
        C.Signum(majority_vote=1)
    with pytest.raises(NotImplementedError, match="applies each worker's push alone"):
        C.Signum(majority_vote=True).bind(tf.Variable(tf.zeros([4])),
                                          Topology(parameter_server=True))


def test_signum_keeps_its_momentum_through_a_non_finite_step(rng):
    layer = bound(C.Signum(), [300])
    layer.encode(rng.normal(size=[300]).astype(np.float32))
    kept = layer.momentum.numpy()
    g = np.ones([300], np.float32)
    g[7] = np.inf
    payload, _ = layer.encode_and_reconstruct(g)
    assert np.isnan(float(payload["scale"]))  # the failure travels
    np.testing.assert_array_equal(layer.momentum.numpy(), kept)


@pytest.mark.parametrize("traced", [False, True])
def test_signum_float32_step_gives_what_the_tensorflow_ops_give(rng, traced):
    # float32 steps go through one C++ op (tfgc_ops.momentum_sign_bits_encode); the
    # payload, the sent values and the kept momentum are those of beta * m + g by
    # TensorFlow's ops and ScaledSign of it, a non-finite step included.
    shape = [1000, 131]  # two of the op's 65,536-value blocks and a partial one
    layer = bound(C.Signum(momentum=0.9), shape)
    step = tf.function(layer.encode_and_reconstruct) if traced else layer.encode_and_reconstruct
    momentum = tf.zeros(shape)
    for k in range(5):
        g = (rng.standard_t(3, shape) * 10.0 ** rng.integers(-30, 30)).astype(np.float32)
        g[rng.random(shape) < 0.05] = 0.0
        g[0, :3] = [-0.0, 3e37, -3e37]  # their momenta near float32's largest
        if k == 3:
            g[5, 7] = np.nan if traced else np.inf
        new = np.float32(0.9) * momentum + g
        expected_payload, expected_sent = C.ScaledSign().encode_and_reconstruct(new)
        payload, sent = step(tf.constant(g))
        np.testing.assert_array_equal(payload["data"].numpy(), expected_payload["data"].numpy())
        np.testing.assert_array_equal(payload["scale"].numpy(), expected_payload["scale"].numpy())
        np.testing.assert_array_equal(payload["shape"].numpy(), expected_payload["shape"].numpy())
        np.testing.assert_array_equal(sent.numpy(), expected_sent.numpy())
        assert np.isnan(float(payload["scale"])) == (k == 3)
        if k != 3:
            momentum = new
        np.testing.assert_array_equal(layer.momentum.numpy(), momentum.numpy())


def test_signum_in_an_optimizer_keeps_no_residual_and_warns_of_a_second_momentum(tmp_path):
    kernel = tf.Variable(tf.ones([64, 32]), name="kernel")
    with pytest.warns(UserWarning, match="two momenta"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1, momentum=0.9),
                                  compression=C.Signum())
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Signum())
    optimizer.build([kernel])
    assert optimizer.encoder.residual(kernel) is None
    gradient = tf.reshape(tf.range(-1024.0, 1024.0), [64, 32])
    optimizer.apply_gradients([(gradient, kernel)])
    layer = optimizer.codec_for(kernel)
    np.testing.assert_array_equal(layer.momentum.numpy(), gradient.numpy())
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    resumed = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Signum())
    resumed.build([kernel])
    tf.train.Checkpoint(optimizer=resumed).restore(path).assert_consumed()
    np.testing.assert_array_equal(resumed.codec_for(kernel).momentum.numpy(), gradient.numpy())
    with pytest.raises(NotImplementedError, match="for pulls is the parameter server"):
        from tfgc.ps.pulls import default_pull_codecs
        default_pull_codecs(C.Signum()).codec_for(kernel)


# --- RandomK ----------------------------------------------------------------------------


def test_random_k_positions_cover_every_stratum_once(rng):
    x = rng.normal(size=[1000]).astype(np.float32)
    codec = C.RandomK(0.03, seed=5)
    seen = np.zeros(1000)
    for _ in range(400):
        payload, sent = codec.encode_and_reconstruct(x)
        kept = np.flatnonzero(sent.numpy())
        assert len(kept) == 30 == payload["values"].shape[0]
        # One position in each stratum of width ceil(1000 / 30) = 34 (the last, 14 wide).
        np.testing.assert_array_equal(kept // 34, np.arange(30))
        np.testing.assert_array_equal(sent.numpy()[kept], x[kept])
        seen += sent.numpy() != 0
    # Each position is drawn with probability 1 / 34 (1 / 14 in the last stratum).
    assert seen[:986].mean() == pytest.approx(400 / 34, rel=0.05)
    assert seen[:986].min() > 0


def test_rescaled_random_k_is_unbiased(rng):
    x = rng.normal(size=[1000]).astype(np.float32)
    codec = C.RandomK(0.03, seed=5, rescale=True)
    assert codec.unbiased and not C.RandomK(0.03).unbiased
    assert C.RandomK.from_config(codec.get_config()).rescale
    total = np.zeros(1000)
    draws = 1000
    for _ in range(draws):
        payload, sent = codec.encode_and_reconstruct(x)
        kept = np.flatnonzero(sent.numpy())
        # Each value times its stratum's width: 34, the last one 14.
        widths = np.where(kept < 986, 34, 14)
        np.testing.assert_allclose(sent.numpy()[kept], x[kept] * widths, rtol=1e-6)
        np.testing.assert_array_equal(codec.decode(payload).numpy(), sent.numpy())
        total += sent.numpy()
    # The mean of the draws tends to x: per value its standard error is
    # sqrt(33 / 1000) |x| = 0.18 |x|, so the mean absolute error is about 0.145 mean |x|
    # (over 1000 values); without rescaling the mean is x / 34, an error of 0.97 mean |x|.
    assert np.abs(total / draws - x).mean() < 0.3 * np.abs(x).mean()
    with pytest.raises(TypeError, match="rescale"):
        C.RandomK(0.03, rescale=1)


def test_random_k_decodes_from_the_payload_alone(rng):
    x = rng.normal(size=[64, 9]).astype(np.float32)
    payload, sent = C.RandomK(0.1).encode_and_reconstruct(x)
    np.testing.assert_array_equal(C.RandomK(0.1, seed=99).decode(payload).numpy(), sent.numpy())
    forged = dict(payload, values=payload["values"][:-1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="values does not match"):
        C.RandomK(0.1).decode(forged)


def test_random_k_replicas_share_positions_and_sum_values_alone():
    topology = Topology(all_reduce_replicas=2)
    first, second = (C.RandomK(0.1, seed=4).bind(tf.Variable(tf.zeros([50]), name="w"), topology)
                     for _ in range(2))
    assert first.summable and not C.RandomK(0.1).summable
    a, b = tf.random.normal([50]), tf.random.normal([50])
    for _ in range(3):  # the positions move with the step count, alike on both
        payload_a, sent_a = first.encode_and_reconstruct(a)
        payload_b, sent_b = second.encode_and_reconstruct(b)
        summed = dict(payload_a, values=payload_a["values"] + payload_b["values"])
        np.testing.assert_allclose(first.decode(summed).numpy(), (sent_a + sent_b).numpy())
    other = C.RandomK(0.1, seed=4).bind(tf.Variable(tf.zeros([50]), name="v"), topology)
    assert not np.array_equal(other.encode(a)["seed"].numpy(), first.encode(a)["seed"].numpy())


# --- PowerSGD: binding ------------------------------------------------------------------


def test_powersgd_binds_matrices_it_shrinks_and_sends_the_rest_as_they_are():
    codec = C.PowerSGD(rank=2)
    layer = bound(codec, [3, 3, 16, 32])
    assert isinstance(layer, PowerSGDLayer) and (layer.rows, layer.columns) == (144, 32)
    for shape in ([64], [4, 4], [3, 3, 1, 2]):  # a vector; rank 2 saves less than 2x
        assert isinstance(bound(codec, shape), C.NoCompression), shape
    assert isinstance(bound(C.PowerSGD(rank=1, min_compression_rate=1.0), [4, 4]), PowerSGDLayer)
    # With bfloat16 factors the rest goes in bfloat16, as PyTorch's bf16 wrapper sends it.
    for shape in ([64], [4, 4]):
        rest = bound(C.PowerSGD(rank=2, factors_dtype="bfloat16"), shape)
        assert isinstance(rest, C.Cast) and rest.dtype == tf.bfloat16, shape
    with pytest.raises(RuntimeError, match="bind"):
        codec.encode(tf.zeros([4, 4]))
    with pytest.raises(ValueError, match="rank must be in"):
        C.PowerSGD(rank=0)
    assert C.PowerSGD.from_config(codec.get_config()).get_config() == codec.get_config()


def test_powersgd_is_not_a_pull_codec_yet():
    from tfgc.ps.pulls import default_pull_codecs

    with pytest.raises(NotImplementedError, match="for pulls is the parameter server"):
        default_pull_codecs(C.PowerSGD()).codec_for(tf.Variable(tf.zeros([64, 64])))


# --- PowerSGD: the codec face -----------------------------------------------------------


def test_powersgd_payload_is_one_power_step_from_the_warm_start(rng):
    layer = bound(C.PowerSGD(rank=2), [6, 5, 20])
    m = rng.normal(size=[30, 20]).astype(np.float32)
    q = layer.q.numpy()
    payload, sent = layer.encode_and_reconstruct(m.reshape(6, 5, 20))
    p, _ = np.linalg.qr(m @ q)
    np.testing.assert_allclose(np.abs(payload["p"].numpy().reshape(30, 2)), np.abs(p), atol=1e-5)
    new_q = m.T @ payload["p"].numpy().reshape(30, 2)
    np.testing.assert_allclose(payload["q"].numpy().reshape(20, 2), new_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.q.numpy(), new_q, rtol=1e-5, atol=1e-5)  # the warm start
    np.testing.assert_array_equal(layer.decode(payload).numpy(), sent.numpy())
    assert int(C.payload_nbytes(payload)) == 4 * 2 * (30 + 20)


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation(rng):
    layer = bound(C.PowerSGD(rank=2), [40, 30])
    m = (rng.normal(size=[40, 5]) * [8, 4, 1, 0.5, 0.1]) @ rng.normal(size=[5, 30])
    m = m.astype(np.float32)
    singular = np.linalg.svd(m, compute_uv=False)
    best = np.sqrt((singular[2:] ** 2).sum())
    errors = [np.linalg.norm(m - layer.encode_and_reconstruct(m)[1].numpy()) for _ in range(12)]
    assert errors[0] > 1.05 * best  # a random start is not the best subspace...
    assert errors[-1] < 1.001 * best  # ...the power steps find it


def test_powersgd_sends_bfloat16_factors_and_keeps_their_rounding(rng):
    layer = bound(C.PowerSGD(rank=2, factors_dtype="bfloat16"), [30, 20])
    as_float32 = bound(C.PowerSGD(rank=2), [30, 20])
    m = rng.normal(size=[30, 20]).astype(np.float32)
    payload, sent = layer.encode_and_reconstruct(m)
    assert {t.dtype for t in payload.values()} == {tf.bfloat16}
    assert int(C.payload_nbytes(payload)) == 2 * 2 * (30 + 20)  # half of float32's
    # What was sent is what the receiver decodes, rounding and all: error feedback keeps
    # m - sent, so nothing is lost to the rounding.
    np.testing.assert_array_equal(layer.decode(payload).numpy(), sent.numpy())
    p = tf.cast(payload["p"], tf.float32).numpy().reshape(30, 2)
    q = tf.cast(payload["q"], tf.float32).numpy().reshape(20, 2)
    np.testing.assert_allclose(sent.numpy(), p @ q.T, atol=1e-5)
    reference = as_float32.encode_and_reconstruct(m)[1].numpy()
    assert np.linalg.norm(sent.numpy() - reference) < 0.01 * np.linalg.norm(reference)
    assert C.PowerSGD.from_config(layer.settings.get_config()).factors_dtype == tf.bfloat16
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        C.PowerSGD(factors_dtype="float16")
    with pytest.raises(MalformedPayloadError, match="bfloat16"):  # another codec's dtype
        layer.decode({key: tf.cast(t, tf.float32) for key, t in payload.items()})
    # Before start_step the gradient itself travels in bfloat16.
    dense_first = bound(C.PowerSGD(rank=1, start_step=1, factors_dtype="bfloat16"), [20, 10])
    payload, sent = dense_first.encode_and_reconstruct(m[:20, :10])
    assert payload["dense"].dtype == tf.bfloat16 and payload["p"].shape == [0]
    np.testing.assert_array_equal(sent.numpy(), tf.cast(payload["dense"], tf.float32).numpy()
                                  .reshape(20, 10))


def _hook_reference(gradients, q):
    """PyTorch's `powerSGD_hook` for one worker in numpy (float64): error feedback, the
    warm start Q kept as M^T P, Gram-Schmidt with its default orthogonalization_epsilon
    of 0. Returns the norm of the error kept after each step."""
    error, kept = np.zeros_like(gradients[0]), []
    for gradient in gradients:
        m = gradient + error
        p = m @ q
        for i in range(p.shape[1]):
            p[:, i] /= np.linalg.norm(p[:, i])
            for j in range(i + 1, p.shape[1]):
                p[:, j] -= (p[:, i] @ p[:, j]) * p[:, i]
        q = m.T @ p
        error = m - p @ q.T
        kept.append(np.linalg.norm(error))
    return np.array(kept)


@pytest.mark.parametrize("scale", [1e-4, 1e-3, 1e-2, 1.0, 1e2])
def test_powersgd_error_matches_pytorchs_hook_at_every_gradient_norm(rng, scale):
    """The error feedback keeps what PyTorch's hook keeps, whatever the gradient's scale
    (an epsilon added to the column norms once made small gradients' errors up to 4.6x
    larger)."""
    layer = bound(C.PowerSGD(rank=2), [64, 32])
    base_ = rng.normal(size=[64, 4]) @ rng.normal(size=[4, 32])
    gradients = [base_ + 0.3 * rng.normal(size=[64, 32]) for _ in range(8)]
    gradients = [scale * g / np.linalg.norm(g) for g in gradients]  # norms of `scale`
    expected = _hook_reference(gradients, layer.q.numpy().astype(np.float64))
    error, kept = np.zeros([64, 32], np.float32), []
    for gradient in gradients:
        m = gradient.astype(np.float32) + error
        error = m - layer.encode_and_reconstruct(m)[1].numpy()
        kept.append(np.linalg.norm(error))
    assert abs(sum(kept) / expected.sum() - 1) < 0.05, (kept, expected)
    np.testing.assert_allclose(kept, expected, rtol=0.05)


def test_powersgd_is_exact_on_matrices_of_rank_r(rng):
    layer = bound(C.PowerSGD(rank=3), [50, 40])
    m = (rng.normal(size=[50, 3]) @ rng.normal(size=[3, 40])).astype(np.float32)
    np.testing.assert_allclose(layer.encode_and_reconstruct(m)[1].numpy(), m, atol=1e-4)
    # Rank 1 inside rank 3: the extra columns of P carry nothing (no NaN, no garbage).
    m = np.outer(rng.normal(size=50), rng.normal(size=40)).astype(np.float32)
    np.testing.assert_allclose(layer.encode_and_reconstruct(m)[1].numpy(), m, atol=1e-4)


def test_orthonormal_keeps_a_degenerate_column_orthogonal(rng):
    u = rng.normal(size=[100, 1])
    columns = tf.constant(np.hstack([u, 3 * u, rng.normal(size=[100, 1])]), tf.float32)
    p = orthonormal(columns).numpy()
    gram = p.T @ p
    np.testing.assert_allclose(gram[[0, 2]][:, [0, 2]], np.eye(2), atol=1e-5)
    assert abs(gram[0, 1]) < 1e-5 and abs(gram[2, 1]) < 1e-5  # the repeat: ~0 or orthogonal


def test_powersgd_sends_dense_before_its_start_step(rng):
    layer = bound(C.PowerSGD(rank=1, start_step=2), [20, 10])
    m = rng.normal(size=[20, 10]).astype(np.float32)
    q = layer.q.numpy()
    for _ in range(2):
        payload, sent = layer.encode_and_reconstruct(m)
        assert payload["p"].shape == [0] and payload["q"].shape == [0]
        np.testing.assert_array_equal(sent.numpy(), m)
        np.testing.assert_array_equal(layer.decode(payload).numpy(), m)
    np.testing.assert_array_equal(layer.q.numpy(), q)  # the warm start waits
    payload, _ = layer.encode_and_reconstruct(m)
    assert payload["p"].shape == [20] and payload["dense"].shape == [0]
    assert int(layer.step.numpy()) == 3


def test_powersgd_state_survives_a_failed_or_zero_step(rng):
    layer = bound(C.PowerSGD(rank=2), [20, 10])
    m = rng.normal(size=[20, 10]).astype(np.float32)
    layer.encode(m)
    q = layer.q.numpy()
    bad = m.copy()
    bad[3, 4] = np.nan
    assert np.isnan(layer.decode(layer.encode(bad)).numpy()).all()
    np.testing.assert_array_equal(layer.q.numpy(), q)  # the failed step's Q is not kept
    layer.encode(np.zeros_like(m))  # Q = M^T P = 0 would keep every later P zero
    assert (np.abs(layer.q.numpy()).sum(axis=0) > 0).all()
    np.testing.assert_allclose(layer.encode_and_reconstruct(np.outer(m[:, 0], m[0]))[1].numpy(),
                               np.outer(m[:, 0], m[0]), atol=1e-4)


def test_powersgd_refuses_payloads_of_other_sizes(rng):
    layer = bound(C.PowerSGD(rank=1), [20, 10])
    payload = layer.encode(rng.normal(size=[20, 10]).astype(np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes of p, q and dense"):
        layer.decode(dict(payload, q=payload["q"][:-1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes of p, q and dense"):
        layer.decode(dict(payload, dense=tf.zeros([200])))
    # Sizes known only when it runs: checked by an assert op.
    decode = tf.function(layer.decode, input_signature=[
        {key: tf.TensorSpec([None], tf.float32) for key in payload}])
    np.testing.assert_array_equal(decode(payload).numpy(), layer.decode(payload).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes of p, q and dense"):
        decode(dict(payload, q=payload["q"][:-1]))
    with pytest.raises(MalformedPayloadError):
        layer.decode({"p": payload["p"], "q": payload["q"]})
    with pytest.raises(MalformedPayloadError, match="expected"):
        layer.decode(payload, expected_shape=[10, 20])


# --- PowerSGD in an optimizer -----------------------------------------------------------


def _train(model, optimizer, x, y, steps):
    for i in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
                y[i], model(x[i]), from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))


def _model_and_optimizer(seed, factors_dtype="float32"):
    tf.keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([tf_keras.layers.Dense(32, activation="relu"),
                                 tf_keras.layers.Dense(10)])
    model.build([None, 24])
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1, momentum=0.9),
                                          compression=C.PowerSGD(rank=2, factors_dtype=factors_dtype),
                                          min_elements=100)
    optimizer.build(model.trainable_variables)
    return model, optimizer


@pytest.mark.parametrize("factors_dtype", ["float32", "bfloat16"])
def test_powersgd_state_survives_checkpoint_and_resume_bit_for_bit(rng, tmp_path, factors_dtype):
    x = tf.constant(rng.normal(size=[8, 16, 24]).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, size=[8, 16]))
    model, optimizer = _model_and_optimizer(0, factors_dtype)
    _train(model, optimizer, x[:4], y[:4], 4)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    _train(model, optimizer, x[4:], y[4:], 4)
    again, resumed = _model_and_optimizer(1, factors_dtype)  # other initial weights and Q
    tf.train.Checkpoint(model=again, optimizer=resumed).restore(path).assert_consumed()
    layer = resumed.codec_for(again.layers[0].kernel)
    assert isinstance(layer, PowerSGDLayer) and int(layer.step.numpy()) == 4
    _train(again, resumed, x[4:], y[4:], 4)
    for a, b in zip(model.weights + optimizer.variables, again.weights + resumed.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.name)
    np.testing.assert_array_equal(optimizer.codec_for(model.layers[0].kernel).q.numpy(),
                                  layer.q.numpy())


MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras, tfgc
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
shapes = [(3, 10, 8), (12, 6)]  # matrices [30, 8] and [12, 6]
with strategy.scope():
    variables = [tf.Variable(tf.zeros(shape), name=f"kernel{i}") for i, shape in enumerate(shapes)]
    sparse = tf.Variable(tf.zeros([400]), name="bias")
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0),
                                    compression=tfgc.codecs.PowerSGD(rank=2), min_elements=10)
    opt.build(variables)
    # The first kernel again, its P and Q summed in bfloat16 (same name: same first Q).
    twin = tf.Variable(tf.zeros(shapes[0]), name="kernel0")
    opt_b = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(1.0), min_elements=10,
        compression=tfgc.codecs.PowerSGD(rank=2, factors_dtype="bfloat16"))
    opt_b.build([twin])
    opt_k = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0),
                                      compression=tfgc.codecs.RandomK(0.05, seed=1),
                                      min_elements=10)
    opt_k.build([sparse])
    signum_kernel = tf.Variable(tf.zeros([50, 4]), name="signum_kernel")
    opt_s = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0),
                                      compression=tfgc.codecs.Signum(0.5), min_elements=10)
    opt_s.build([signum_kernel])
    vote_kernel = tf.Variable(tf.zeros([50, 4]), name="vote_kernel")
    opt_v = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(1.0), compression=tfgc.codecs.Signum(0.5, majority_vote=True),
        min_elements=10)
    opt_v.build([vote_kernel])
layers = [opt.codec_for(v) for v in variables]
residuals = [opt.encoder.residual(v) for v in variables]

@tf.function
def step(gs, h, s):
    def fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(tf.gather(g, r), v) for g, v in zip(gs, variables)])
        opt_b.apply_gradients([(tf.gather(gs[0], r), twin)])
        opt_k.apply_gradients([(tf.gather(h, r), sparse)])
        opt_s.apply_gradients([(tf.gather(s, r), signum_kernel)])
        opt_v.apply_gradients([(tf.gather(s, r), vote_kernel)])
    strategy.run(fn)

def replicas(v):
    return [t.numpy() for t in strategy.experimental_local_results(v)]

def matrix(x, layer):
    return np.reshape(x, (-1, layer.rows, layer.columns))

rng = np.random.default_rng(0)
total_in = [np.zeros([l.rows, l.columns]) for l in layers]
total_out = [np.zeros([l.rows, l.columns]) for l in layers]
momenta = np.zeros([2, 50, 4], np.float32)
for t in range(6):
    gs = [rng.normal(size=(2,) + shape).astype(np.float32) for shape in shapes]
    h = rng.normal(size=(2, 400)).astype(np.float32)
    s = rng.normal(size=(2, 50, 4)).astype(np.float32)
    before_s, before_v = signum_kernel.numpy(), vote_kernel.numpy()
    qs = [replicas(layer.q) for layer in layers]
    ms = [matrix(g, l) + matrix(np.stack(replicas(r)), l) for g, l, r in zip(gs, layers, residuals)]
    befores, before_k, before_b = [v.numpy() for v in variables], sparse.numpy(), twin.numpy()
    h_total = (h + np.stack(replicas(opt_k.encoder.residual(sparse)))).sum(0)
    step([tf.constant(g) for g in gs], tf.constant(h), tf.constant(s))
    # Signum: each replica's own momentum; the update sums their scaled signs.
    momenta = np.float32(0.5) * momenta + s
    np.testing.assert_array_equal(np.stack(replicas(opt_s.codec_for(signum_kernel).momentum)),
                                  momenta)
    signs = np.where(momenta >= 0, 1.0, -1.0) * np.abs(momenta).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(before_s - signum_kernel.numpy(), signs.sum(0), atol=1e-5)
    # With the majority vote: the sign of the two replicas' signs (0 where they
    # disagree), times their scales' sum.
    vote = np.sign(np.sign(signs).sum(0)) * np.abs(momenta).mean(axis=(1, 2)).sum()
    np.testing.assert_allclose(before_v - vote_kernel.numpy(), vote, atol=1e-5)
    assert (vote == 0).any() and (vote != 0).any()
    for i, layer in enumerate(layers):
        q, m = qs[i], ms[i]
        assert np.array_equal(q[0], q[1])  # one warm start on every replica
        update = matrix(befores[i] - variables[i].numpy(), layer)[0]
        # One power step on the replicas' summed P, from the shared warm start.
        p, _ = np.linalg.qr((m[0] + m[1]) @ q[0].astype(np.float64))
        np.testing.assert_allclose(update, p @ p.T @ (m[0] + m[1]), atol=2e-4)
        for r in range(2):  # each replica keeps what its own gradient lost
            kept = matrix(replicas(residuals[i])[r], layer)[0]
            np.testing.assert_allclose(kept, m[r] - p @ p.T @ m[r], atol=2e-4)
        total_in[i] += matrix(gs[i], layer).sum(0)
        total_out[i] += update
    # bfloat16 factors: the float32 factors' update, up to their rounding.
    update = befores[0] - variables[0].numpy()
    assert np.linalg.norm(before_b - twin.numpy() - update) < 0.02 * np.linalg.norm(update)
    # RandomK: 20 shared positions a step, the values (and residuals) summed there.
    moved = np.flatnonzero(before_k - sparse.numpy())
    assert len(moved) == 20, moved
    np.testing.assert_allclose((before_k - sparse.numpy())[moved], h_total[moved], atol=1e-5)
for i, layer in enumerate(layers):
    kept = matrix(np.sum(replicas(residuals[i]), 0), layer)[0]
    np.testing.assert_allclose(total_out[i] + kept, total_in[i], atol=1e-3)
# Bytes each replica put into the collectives: P and Q (4 * 2 * ((30 + 8) + (12 + 6))),
# and the RandomK values alone (4 * 20; the seed and shape are not sent).
assert int(opt.traffic["push_bytes"]) == 6 * 2 * 448, opt.traffic
assert int(opt_b.traffic["push_bytes"]) == 6 * 2 * 2 * 2 * (30 + 8), opt_b.traffic
assert int(opt_k.traffic["push_bytes"]) == 6 * 2 * 80, opt_k.traffic
# Signum, all-gathered: 200 sign bits (25 B) with their length word, and the scale.
assert int(opt_s.traffic["push_bytes"]) == 6 * 2 * (25 + 4 + 4), opt_s.traffic
assert int(opt_v.traffic["push_bytes"]) == 6 * 2 * (25 + 4 + 4), opt_v.traffic
print("ok")
"""


@pytest.mark.slow
def test_powersgd_random_k_and_signum_across_mirrored_replicas(run_python):
    assert "ok" in run_python(MIRRORED_SCRIPT, timeout=300)
