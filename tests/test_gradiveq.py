"""GradiVeQ: flattening, the linear map (Eq. 3-5), PCA (Eq. 6), schedule and state."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc.codecs.gradiveq import COMPRESSED, SAMPLING, WARMUP, GradiVeQ, GradiVeQLayer

SHAPE = (3, 3, 4, 8)  # F * D = 32, K = 3 * 32 = 96, S = 3


def bound(shape=SHAPE, **settings):
    settings.setdefault("seed", 1)
    return GradiVeQ(**settings).bind(tf.Variable(tf.zeros(shape)))


def low_rank(rng, count, shape=SHAPE, rank=3, offset=1.0):
    """`count` gradients whose slices lie in offset + a rank-`rank` subspace."""
    k = shape[1] * shape[2] * shape[3]
    basis = rng.normal(size=[k, rank])
    rows = offset + rng.normal(size=[count, shape[0], rank]) @ basis.T
    return rows.reshape((count,) + shape).astype(np.float32)


def test_flattening_is_figure_3a_and_slices_are_multiples_of_fd():
    layer = bound()
    h, w, d, f = SHAPE
    assert (layer.slice_size, layer.num_slices, layer.num_groups) == (w * d * f, h, 1)
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    slices = layer.slices(x).numpy().reshape(-1)
    for hh, ww, dd, ff in [(0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (2, 1, 3, 7)]:
        # F filters adjacent, then depth, then width, then height.
        assert slices[((hh * w + ww) * d + dd) * f + ff] == x[hh, ww, dd, ff]
    assert bound(slice_multiple=9).slice_size == 9 * 32
    assert bound(slice_multiple=1).num_slices == 9
    with pytest.raises(ValueError, match="must divide H \\* W"):
        bound(slice_multiple=2)


def test_binds_conv_kernels_only():
    codec = GradiVeQ()
    assert isinstance(codec.bind(tf.Variable(tf.zeros(SHAPE))), GradiVeQLayer)
    assert isinstance(codec.bind(tf.Variable(tf.zeros([64, 32]))), tfgc.codecs.NoCompression)
    with pytest.raises(RuntimeError, match="bind"):
        codec.encode(tf.zeros(SHAPE))
    assert GradiVeQ.summable and codec.bind(tf.Variable(tf.zeros(SHAPE))).summable


@pytest.mark.parametrize("kwargs, message", [
    ({"loss_threshold": 1.0}, "loss_threshold"),
    ({"sampling_steps": 1}, "sampling_steps"),
    ({"compressed_steps": 0}, "compressed_steps"),
    ({"reuse": 0}, "reuse"),
    ({"sampling_bits": 1}, "bits"),
])
def test_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GradiVeQ(**kwargs)


def test_serializes_through_the_registry():
    codec = GradiVeQ(loss_threshold=0.05, warmup_steps=7, reuse=2, sampling_bits=None)
    again = tfgc.codecs.deserialize(tfgc.codecs.serialize(codec))
    assert isinstance(again, GradiVeQ) and again.get_config() == codec.get_config()


def fill_pca(layer, gradients):
    """Stores `gradients` as samples and refreshes the compressor."""
    first = np.stack([layer._grouped(layer.slices(g))[:, 0].numpy() for g in gradients])
    layer.samples.assign(first)
    layer.refresh()


def test_sum_of_encodes_is_the_encode_of_the_sum_and_span_is_exact(rng):
    layer = bound(sampling_steps=10, sampling_bits=None)
    fill_pca(layer, low_rank(rng, 10))
    assert int(layer.dim.numpy()) == 3  # rank 3 after centring
    workers = rng.normal(size=(3,) + SHAPE).astype(np.float32)
    n = len(workers)
    summed = sum(layer.compress(layer.slices(g), n) for g in workers)
    np.testing.assert_allclose(summed, layer.compress(layer.slices(workers.sum(0)), 1), atol=1e-4)
    # Gradients mu/N + U_d c: the decoded sum is their true sum (Eq. 4-5).
    u = layer.basis.numpy()[0, :, :3]
    mu = layer.mean.numpy()[0]
    inside = [(mu[None] / n + rng.normal(size=[3, 3]) @ u.T).reshape(SHAPE) for _ in range(n)]
    decoded = layer.decompress(sum(layer.compress(layer.slices(g), n) for g in inside))
    np.testing.assert_allclose(decoded.numpy().reshape(SHAPE), sum(inside), rtol=1e-4, atol=1e-4)


def test_uncentred_pca_keeps_no_mean_and_spans_the_samples(rng):
    # centred=False: mu = 0 and U_d spans the samples as they are, their offset
    # included: slices in offset + a rank-3 subspace take d = 4 (the paper's centred
    # PCA: 3, plus mu), and sums of encodes of such gradients decode exactly.
    gradients = low_rank(rng, 12)
    layer = bound(sampling_steps=10, sampling_bits=None, centred=False)
    fill_pca(layer, gradients[:10])
    assert int(layer.dim.numpy()) == 4
    np.testing.assert_array_equal(layer.mean.numpy(), 0.0)
    workers = gradients[10:]
    decoded = layer.decompress(sum(layer.compress(layer.slices(g), 2) for g in workers))
    np.testing.assert_allclose(decoded.numpy().reshape(SHAPE), workers.sum(0), rtol=1e-4,
                               atol=1e-4)
    centred = bound(sampling_steps=10, sampling_bits=None)
    fill_pca(centred, gradients[:10])
    assert int(centred.dim.numpy()) == 3 and np.abs(centred.mean.numpy()).max() > 0.1


def test_dimension_follows_equation_6(rng):
    layer = bound(sampling_steps=40, loss_threshold=0.05)
    spread = np.array([10.0, 5.0, 2.0, 1.0, 0.5] + [0.01] * 91)
    samples = rng.normal(size=[40, 96]) * spread
    layer.samples.assign(samples[:, None, :].astype(np.float32))
    layer.refresh()
    centred = samples - samples.mean(0)
    energy = np.linalg.svd(centred, compute_uv=False) ** 2
    kept = np.cumsum(energy) / energy.sum()
    expected = int(np.argmax(kept >= 0.95)) + 1
    assert int(layer.dim.numpy()) == expected
    assert layer.retained.numpy()[0] == pytest.approx(kept[expected - 1], rel=1e-5)
    u = layer.basis.numpy()[0, :, :expected]
    np.testing.assert_allclose(u.T @ u, np.eye(expected), atol=1e-5)


def test_schedule_payloads_and_samples(rng):
    layer = bound(warmup_steps=2, sampling_steps=3, compressed_steps=2)
    m = np.prod(SHAPE)
    phases, sizes = [], []
    for g in low_rank(rng, 12):
        phases.append(int(layer.phase.numpy()))
        payload = layer.encode(g)
        sizes.append(int(tfgc.codecs.payload_nbytes(payload)))
        layer.decode(payload)
    assert phases == [WARMUP] * 2 + ([SAMPLING] * 3 + [COMPRESSED] * 2) * 2
    d = int(layer.dim.numpy())
    assert d <= 3 and int(layer.refreshes.numpy()) == 2 and int(layer.step.numpy()) == 12
    assert sizes[0] == 4 * m + 4  # fp32 + the phase
    assert sizes[2] == (4 * m + 7) // 8 + 4 * 1 + 4  # 4-bit codes, one bucket norm, phase
    assert sizes[5] == 4 * layer.num_slices * d + 4


@pytest.mark.parametrize("phase", [7, -1, 2**31 - 1])
def test_payload_with_a_phase_out_of_range_is_refused_and_the_schedule_stays(rng, phase):
    layer = bound(warmup_steps=2, sampling_steps=3, compressed_steps=2)
    [g] = low_rank(rng, 1)
    payload = dict(layer.encode(g), phase=tf.constant(phase, tf.int32))
    step = int(layer.step.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="phase"):
        layer.decode(payload)
    assert int(layer.step.numpy()) == step


def test_tf_function_runs_every_phase_in_one_trace(rng):
    layer = bound(warmup_steps=1, sampling_steps=5, compressed_steps=2, sampling_bits=None)
    traces = []

    @tf.function
    def round_trip(g):
        traces.append(1)
        return layer.decode(layer.encode(g))

    gradients = low_rank(rng, 9)
    outputs = [round_trip(tf.constant(g)).numpy() for g in gradients]
    assert len(traces) == 1
    # Rank-3 samples: compressed steps of rank-3 gradients are exact.
    for g, out in zip(gradients[6:8], outputs[6:8]):
        np.testing.assert_allclose(out, g, rtol=1e-3, atol=1e-3)


def test_reuse_factor_groups_slices(rng):
    layer = bound(reuse=2, sampling_steps=5, sampling_bits=None)
    assert layer.num_groups == 2  # slices {0, 1} and {2}
    fill_pca(layer, low_rank(rng, 5))
    coefficients = layer.compress(layer.slices(low_rank(rng, 1)[0]))
    assert coefficients.shape == (3, int(layer.dim.numpy()))


def test_pooled_slices_are_all_samples_and_span_what_the_first_slice_cannot(rng):
    # Each slice of these gradients lies in its own rank-2 subspace: PCA of the first
    # slice alone (the paper's) spans 2 directions and misses the other slices; pooled
    # over all S = 3 slices of every sampling step it spans 6, and compressed steps are
    # exact. The round trip runs through the schedule (encode / decode), as training.
    h, w, d, f = SHAPE
    k = w * d * f
    bases = rng.normal(size=[h, k, 2])
    gradients = np.stack([
        np.stack([bases[i] @ rng.normal(size=2) for i in range(h)]).reshape(SHAPE)
        for _ in range(7)]).astype(np.float32)
    errors = {}
    for pool in (False, True):
        layer = bound(warmup_steps=0, sampling_steps=5, compressed_steps=5, sampling_bits=None,
                      centred=False, pool_slices=pool)
        assert layer.max_dim == (15 if pool else 5)
        for g in gradients[:5]:
            layer.decode(layer.encode(g))
        assert int(layer.phase.numpy()) == COMPRESSED
        assert int(layer.dim.numpy()) == (6 if pool else 2)
        if pool:  # row t * S + i is slice i of sampling step t
            np.testing.assert_array_equal(layer.samples.numpy()[:, 0],
                                          gradients[:5].reshape(5 * h, k))
        out = np.stack([layer.decode(layer.encode(g)).numpy() for g in gradients[5:]])
        errors[pool] = np.sum((out - gradients[5:]) ** 2) / np.sum(gradients[5:] ** 2)
    assert errors[True] < 1e-8 and errors[False] > 0.3, errors


def test_pooled_slices_need_whole_groups():
    with pytest.raises(ValueError, match="pool_slices needs reuse=2 to divide the 3 slices"):
        bound(reuse=2, pool_slices=True)
    assert bound(reuse=3, pool_slices=True).pooled_slices == 3


def test_non_finite_steps_are_not_samples(rng):
    layer = bound(warmup_steps=0, sampling_steps=2, compressed_steps=1)
    bad = np.full(SHAPE, np.nan, np.float32)
    out = layer.decode(layer.encode(bad))
    assert not np.isfinite(out.numpy()).any()
    assert int(layer.phase_step.numpy()) == 0 and int(layer.phase.numpy()) == SAMPLING
    for g in low_rank(rng, 2):
        layer.decode(layer.encode(g))
    assert int(layer.phase.numpy()) == COMPRESSED
    assert not np.isfinite(layer.decode(layer.encode(bad)).numpy()).all()


def test_early_stop_on_local_loss(rng):
    layer = bound(warmup_steps=0, sampling_steps=4, compressed_steps=50, early_stop_loss=0.1,
                  sampling_bits=None)
    gradients = low_rank(rng, 5)
    for g in gradients[:4]:
        layer.decode(layer.encode(g))
    assert int(layer.phase.numpy()) == COMPRESSED
    layer.decode(layer.encode(gradients[4]))  # in the sampled span: loss ~ 0, no vote
    assert int(layer.phase.numpy()) == COMPRESSED
    payload = layer.encode(rng.normal(size=SHAPE).astype(np.float32))  # off span
    assert payload["votes"].numpy().tolist() == [1.0]
    layer.decode(payload)
    assert int(layer.phase.numpy()) == SAMPLING and int(layer.early_stops.numpy()) == 1


def test_state_checkpoints(tmp_path, rng):
    layer = bound(warmup_steps=0, sampling_steps=3, compressed_steps=5, sampling_bits=None)
    for g in low_rank(rng, 4):
        layer.decode(layer.encode(g))
    path = tf.train.Checkpoint(codec=layer).save(str(tmp_path / "ckpt"))
    fresh = bound(warmup_steps=0, sampling_steps=3, compressed_steps=5, sampling_bits=None)
    tf.train.Checkpoint(codec=fresh).restore(path).assert_consumed()
    for name in ("step", "phase", "phase_step", "dim", "basis", "mean", "samples"):
        np.testing.assert_array_equal(getattr(fresh, name).numpy(), getattr(layer, name).numpy())


def test_distributed_optimizer_single_process(tmp_path, rng):
    import tf_keras

    model = tf_keras.Sequential([
        tf_keras.Input((8, 8, 4)),
        tf_keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
        tf_keras.layers.GlobalAveragePooling2D(),
        tf_keras.layers.Dense(8),
    ])
    codec = GradiVeQ(warmup_steps=2, sampling_steps=3, compressed_steps=3, seed=0)
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=codec,
                                          min_elements=64, error_feedback=False)
    model.compile(optimizer, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.normal(size=[64, 8, 8, 4]).astype(np.float32)
    y = rng.integers(0, 8, size=[64])
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    kernel = model.layers[0].kernel
    layer = optimizer.codec_for(kernel)
    assert isinstance(layer, GradiVeQLayer) and int(layer.step.numpy()) == 8
    assert isinstance(optimizer.codec_for(model.layers[-1].kernel), tfgc.codecs.NoCompression)
    names = [n for n, _ in tf.train.list_variables(
        tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "opt")))]
    assert any("basis" in n for n in names)


MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras, tfgc
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
shape = (3, 3, 8, 8)
with strategy.scope():
    var = tf.Variable(tf.zeros(shape))
    codec = tfgc.codecs.GradiVeQ(warmup_steps=1, sampling_steps=6, compressed_steps=3,
                                 sampling_bits=None, early_stop_loss=0.5)
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=codec,
                                    error_feedback=False, min_elements=100)
    opt.build([var])
layer = opt.codec_for(var)

@tf.function
def step(g):
    def fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(tf.gather(g, r), var)])
    strategy.run(fn)

rng = np.random.default_rng(0)
directions = rng.normal(size=[192, 3])
phases = []
for t in range(11):
    phases.append(int(layer.phase.numpy()))
    g = (0.5 + rng.normal(size=[2, 3, 3]) @ directions.T).reshape((2,) + shape)
    if t == 8:  # off the sampled span: both replicas vote to stop
        g = rng.normal(size=(2,) + shape)
    g = g.astype(np.float32)
    before = var.numpy()
    step(tf.constant(g))
    if t != 8:  # warm-up, fp32 samples, and in-span compressed steps are exact
        np.testing.assert_allclose(before - var.numpy(), g.sum(0), atol=1e-4)
assert phases == [0] + [1] * 6 + [2] * 2 + [1] * 2, phases
assert int(layer.dim.numpy()) == 3 and int(layer.early_stops.numpy()) == 1
print("ok")
"""


@pytest.mark.slow
def test_mirrored_all_reduce_sums_coefficients_and_votes(run_python):
    assert "ok" in run_python(MIRRORED_SCRIPT, timeout=300)
