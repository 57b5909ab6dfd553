"""Compressed pulls (tfgc.ps.variables) in one process: the same mechanism as under
ParameterServerStrategy, with one worker."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from sklearn.datasets import load_digits

import tfgc
from tfgc import codecs as C
from tfgc.ps.variables import PulledVariable


def _digits():
    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    return x, data.target.astype("int64")


def _model():
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential([
        tf_keras.layers.Dense(128, activation="relu", input_shape=(64,)),
        tf_keras.layers.Dense(10),
    ])


def test_scope_wraps_only_large_trainable_weights():
    with tfgc.compressed_pulls(min_elements=1000):
        model = _model()
    first, second = model.layers
    assert isinstance(first.kernel, PulledVariable)  # 64 x 128
    assert isinstance(second.kernel, PulledVariable)  # 128 x 10
    assert not isinstance(first.bias, PulledVariable) and not isinstance(second.bias, PulledVariable)
    assert len(model.trainable_variables) == 4


def test_get_variable_reads_master_until_an_optimizer_enables_pulls():
    v = tfgc.get_variable("w", [3, 4], initializer="ones")
    assert isinstance(v, PulledVariable) and v.pull_codec is None
    np.testing.assert_array_equal(tf.function(lambda: v * 2.0)().numpy(), 2 * np.ones([3, 4]))
    v.assign_add(tf.ones([3, 4]))
    np.testing.assert_array_equal(v.numpy(), 2 * np.ones([3, 4]))
    assert tfgc.get_variable("step", [], dtype=tf.int64, initializer="zeros").dtype == tf.int64
    with pytest.raises(ValueError, match="fully defined"):
        tfgc.get_variable("bad", [None, 3])


def test_pulls_full_once_then_compressed_deltas_tracked_by_the_snapshot():
    v = tfgc.get_variable("w", [64, 32], initializer="glorot_uniform")
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.5), compression=C.NoCompression(),
                                    pull_compression=C.Int8())
    opt.build([v])

    @tf.function
    def step(g):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * g)
        grads = tape.gradient(loss, [v])
        opt.apply_gradients(zip(grads, [v]))
        return loss

    rng = np.random.default_rng(0)
    initial = v.master.numpy()
    step(tf.constant(rng.normal(size=[64, 32]), tf.float32))
    # The first pull was a full one, in bfloat16: the cache holds the master's initial
    # value as rounded, and so does the snapshot, which leaves the rounding to the deltas.
    assert bool(v.synced.numpy())
    rounded = tf.cast(tf.cast(initial, tf.bfloat16), tf.float32).numpy()
    np.testing.assert_array_equal(v.cache.numpy(), rounded)
    np.testing.assert_array_equal(v.snapshots.numpy()[0], rounded)
    assert not np.array_equal(rounded, initial)
    for _ in range(5):
        read_by_last_pull = v.master.numpy()
        step(tf.constant(rng.normal(size=[64, 32]), tf.float32))
    cache, snapshot = v.cache.numpy(), v.snapshots.numpy()[0]
    np.testing.assert_array_equal(cache, snapshot)  # both sides applied the same decodes
    # The last pull sent one update's delta (about +-2) in Int8: error <= range / 510.
    error = np.abs(cache - read_by_last_pull).max()
    assert 0 < error < 0.02
    traffic = {k: int(t.numpy()) for k, t in opt.traffic.items()}
    dense = 64 * 32 * 4
    assert traffic["pull_dense_bytes"] == 6 * dense
    # One full pull of half the bytes, then five Int8 pulls of about a quarter. The full
    # pull's message also carries the (unused) delta payload: six payloads in all.
    full = dense // 2
    assert full + 6 * dense // 4 <= traffic["pull_bytes"] < full + 6 * (dense // 4 + 64)


def test_an_uncompressed_full_pull_sends_the_masters_as_they_are():
    v = tfgc.get_variable("w", [64, 32], initializer="glorot_uniform")
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.5), compression=C.NoCompression(),
                                    pull_compression=C.NoCompression())
    opt.build([v])
    initial = v.master.numpy()
    tf.function(lambda: v * 1.0)()  # the first read pulls
    np.testing.assert_array_equal(v.cache.numpy(), initial)  # float32, not rounded
    dense = 64 * 32 * 4
    # The full section and the (unused) delta payload, each the dense bytes, and framing.
    assert 2 * dense <= int(opt.traffic["pull_bytes"].numpy()) < 2 * dense + 64


def test_gradients_flow_through_the_cache_to_the_master():
    v = tfgc.get_variable("w", [40, 40], initializer="zeros")
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=C.NoCompression(),
                                    pull_compression=C.NoCompression())
    opt.build([v])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * 3.0)
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step()
    step()
    np.testing.assert_allclose(v.master.numpy(), -6.0 * np.ones([40, 40]))
    np.testing.assert_allclose(v.cache.numpy(), -3.0 * np.ones([40, 40]))  # read before step 2


def test_training_with_compressed_pulls_learns():
    x, y = _digits()
    with tfgc.compressed_pulls():
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                    pull_compression=C.ThreeLC(1.0))
    opt.build(model.trainable_variables)
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert history.history["accuracy"][-1] > 0.85
    ratio = int(opt.traffic["pull_dense_bytes"].numpy()) / int(opt.traffic["pull_bytes"].numpy())
    assert ratio > 8  # the full pull once, then ternary deltas
    for v in model.trainable_variables:
        if isinstance(v, PulledVariable):
            np.testing.assert_array_equal(v.cache.numpy(), v.snapshots.numpy()[0])


def test_pulls_start_at_the_first_step_without_a_build():
    x, y = _digits()
    with tfgc.compressed_pulls():
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                    pull_compression=C.ThreeLC(1.0))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    pulled = [v for v in model.trainable_variables if isinstance(v, PulledVariable)]
    assert len(pulled) == 4 and all(v.pull_codec is not None for v in pulled)
    # The pulls of the first step, traced before the optimizer was built, are counted.
    traffic = {k: int(v.numpy()) for k, v in opt.traffic.items()}
    steps = int(opt.iterations.numpy())
    assert traffic["pull_dense_bytes"] == steps * sum(v.shape.num_elements() * 4 for v in pulled)
    assert 0 < traffic["pull_bytes"] < traffic["pull_dense_bytes"] / 8
    for v in pulled:
        np.testing.assert_array_equal(v.cache.numpy(), v.snapshots.numpy()[0])


def test_two_optimizers_with_one_pull_setting_need_no_build():
    x, y = _digits()
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tfgc.compressed_pulls():
        model = _model()
    with tfgc.compressed_pulls():
        other_model = _model()
    opt, other = (tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                            pull_compression=C.Int8()) for _ in range(2))
    model.compile(opt, loss)
    other_model.compile(other, loss)
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    other_model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    for optimizer, trained in ((opt, model), (other, other_model)):
        pulled = [v for v in trained.trainable_variables if isinstance(v, PulledVariable)]
        assert all(v.pull_codec is not None for v in pulled)
        dense = 2 * sum(v.shape.num_elements() * 4 for v in pulled)  # two steps
        assert int(optimizer.traffic["pull_dense_bytes"].numpy()) == dense


def test_two_optimizers_with_other_pull_settings_name_the_explicit_ways():
    x, y = _digits()
    with tfgc.compressed_pulls():
        model = _model()
    opt, other = (tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                            pull_compression=pull)
                  for pull in (C.Int8(), C.ThreeLC(1.0)))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(RuntimeError, match=r"compressed_pulls\(compression=...\)"):
        model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    assert other.pull_compression is not None  # alive until here: two candidates


def test_an_unbuilt_optimizer_made_before_the_model_leaves_its_pulls_alone():
    x, y = _digits()
    stale = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                      pull_compression=C.Int8())  # an earlier cell's
    with tfgc.compressed_pulls():
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                    pull_compression=C.ThreeLC(1.0))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    kernel = model.trainable_variables[0]
    assert type(kernel.pull_codec).__name__ == "ThreeLC"
    assert stale.pull_compression is not None  # alive until here


def test_the_scope_s_codec_pulls_without_an_optimizer_s_pull_compression():
    x, y = _digits()
    with tfgc.compressed_pulls(compression=C.ThreeLC(1.0)) as pulls:
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    pulled = [v for v in model.trainable_variables if isinstance(v, PulledVariable)]
    assert pulled == pulls.variables and all(v.owner is pulls for v in pulled)
    assert [type(v.pull_codec).__name__ for v in pulled] == ["ThreeLC", "Cast", "ThreeLC", "Cast"]
    traffic = {k: int(v.numpy()) for k, v in opt.traffic.items()}
    assert 0 < traffic["pull_bytes"] < traffic["pull_dense_bytes"] / 8


def test_get_variable_joins_the_scope_it_is_made_in():
    with tfgc.compressed_pulls() as pulls:
        v = tfgc.get_variable("w", [16, 16])
        w = tfgc.get_variable("u", [4])
    alone = tfgc.get_variable("z", [4])
    assert pulls.variables == [v, w] and v.owner is pulls
    assert alone.owner is not pulls and alone.owner.variables == [alone]
    with pytest.raises(TypeError, match="tfgc codec"):
        tfgc.compressed_pulls(compression="threelc")


def test_a_built_optimizer_leaves_a_later_models_pulls_to_its_own_optimizer():
    x, y = _digits()
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tfgc.compressed_pulls():
        first = _model()
    first_opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                          pull_compression=C.ThreeLC(1.0))
    first.compile(first_opt, loss)
    first.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)
    first_pulled = int(first_opt.traffic["pull_bytes"].numpy())
    with tfgc.compressed_pulls():
        second = _model()  # built symbolically: reads its weights while only first_opt exists
    second_opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                           compression=C.ThreeLC(1.0),
                                           pull_compression=C.ThreeLC(1.75))
    second.compile(second_opt, loss)
    history = second.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    pulled = [v for v in second.trainable_variables if isinstance(v, PulledVariable)]
    assert len(pulled) == 4
    assert [v.pull_codec.sparsity for v in pulled if second_opt.compresses(v.master)] == [1.75] * 2
    assert int(second_opt.traffic["pull_bytes"].numpy()) > 0
    assert int(first_opt.traffic["pull_bytes"].numpy()) == first_pulled


def test_checkpoint_holds_the_master(tmp_path):
    v = tfgc.get_variable("w", [8, 8], initializer="ones")
    tf.train.Checkpoint(v=v).write(str(tmp_path / "ckpt"))
    w = tf.Variable(tf.zeros([8, 8]))
    tf.train.Checkpoint(v=w).read(str(tmp_path / "ckpt")).assert_consumed()
    np.testing.assert_array_equal(w.numpy(), np.ones([8, 8]))


def _fit_and_counted(model, opt, epochs=2):
    x, y = _digits()
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=epochs, verbose=0)
    return history, {k: int(v.numpy()) for k, v in opt.traffic.items()}


@pytest.mark.parametrize("optimizer_first", [False, True])
def test_parameter_servers_own_the_pulls_whatever_is_made_first(optimizer_first, recwarn):
    servers = tfgc.ParameterServers(pull_compression=C.ThreeLC(1.0))

    def optimizer():
        return tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                         compression=C.ThreeLC(1.0), parameter_servers=servers)
    opt = optimizer() if optimizer_first else None
    with servers.scope() as pulls:
        model = _model()
    opt = opt or optimizer()
    history, traffic = _fit_and_counted(model, opt)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert pulls.codecs is servers.pull_codecs and servers.owners == [pulls]
    pulled = [v for v in model.trainable_variables if isinstance(v, PulledVariable)]
    assert len(pulled) == 4 and all(v.pull_codec is not None for v in pulled)
    steps = int(opt.iterations.numpy())
    assert traffic["pull_dense_bytes"] == steps * sum(v.shape.num_elements() * 4 for v in pulled)
    assert 0 < traffic["pull_bytes"] < traffic["pull_dense_bytes"] / 8
    # Nothing was inferred: no deprecation of the inferring path.
    assert not [w for w in recwarn if w.category is DeprecationWarning]


def test_parameter_servers_without_a_pull_codec_read_the_masters(recwarn):
    servers = tfgc.ParameterServers()
    with servers.scope():
        model = _model()
    # An optimizer made under the same (no) strategy with pull_compression is not asked.
    bystander = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.NoCompression(),
                                          pull_compression=C.Int8())
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                    parameter_servers=servers)
    _, traffic = _fit_and_counted(model, opt, epochs=1)
    assert traffic["pull_bytes"] == 0
    assert all(v.pull_codec is None for v in model.trainable_variables
               if isinstance(v, PulledVariable))
    assert bystander.pull_compression is not None  # alive until here: a candidate
    assert not [w for w in recwarn if w.category is DeprecationWarning]


def test_the_optimizer_must_be_handed_the_servers_that_own_its_model():
    servers = tfgc.ParameterServers(pull_compression=C.ThreeLC(1.0))
    with servers.scope():
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                    parameter_servers=tfgc.ParameterServers(C.ThreeLC(1.0)))
    with pytest.raises(ValueError, match="hand the same object to the optimizer"):
        opt.build(model.trainable_variables)


def test_parameter_servers_arguments_are_checked():
    servers = tfgc.ParameterServers(pull_compression=C.ThreeLC(1.0), local_steps=4)
    with pytest.raises(ValueError, match="give both the same local_steps"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                  parameter_servers=servers)
    with pytest.raises(ValueError, match="ParameterServers\\(pull_compression=...\\) only"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                  pull_compression=C.Int8(),
                                  parameter_servers=tfgc.ParameterServers(C.ThreeLC(1.0)))
    with pytest.raises(TypeError, match="takes a tfgc codec"):
        tfgc.ParameterServers(pull_compression="threelc")
    with pytest.raises(ValueError, match="local_steps must be a positive integer"):
        tfgc.ParameterServers(local_steps=0)
    with pytest.raises(ValueError, match="give a pull_compression"):
        tfgc.ParameterServers(local_steps=4)
    with pytest.raises(TypeError, match="takes a tfgc.ParameterServers"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                  parameter_servers=C.ThreeLC(1.0))


def test_a_scope_without_a_codec_that_takes_an_optimizer_s_is_deprecated():
    with tfgc.compressed_pulls():
        model = _model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0),
                                    pull_compression=C.ThreeLC(1.0))
    with pytest.warns(DeprecationWarning, match="tfgc.ParameterServers"):
        opt.build(model.trainable_variables)
