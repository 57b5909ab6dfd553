"""DistributedOptimizer: wrapping, the single-process and all-reduce wires, state."""
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc.codecs.rows import distinct_rows

C = tfgc.codecs


def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16.0).reshape(-1, 64).astype(np.float32), data.target


def small_model():
    tf_keras.utils.set_random_seed(0)
    return tf_keras.Sequential(
        [tf_keras.layers.Dense(128, activation="relu", input_shape=(64,)), tf_keras.layers.Dense(10)]
    )


def test_wrapped_optimizer_keeps_class_and_hyperparameters():
    inner = tf_keras.optimizers.SGD(0.05, momentum=0.9)
    opt = tfgc.DistributedOptimizer(inner, compression=C.ThreeLC(1.5), min_elements=10)
    assert isinstance(opt, tf_keras.optimizers.SGD)
    assert type(opt).__name__ == "DistributedSGD"
    assert float(opt.learning_rate) == pytest.approx(0.05) and opt.momentum == 0.9
    assert int(opt.iterations) == 0
    again = type(opt).from_config(opt.get_config())
    assert repr(again.compression) == "ThreeLC(sparsity=1.5)" and again.min_elements == 10
    assert again.get_config() == opt.get_config()


def test_rejects_what_it_cannot_do():
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        tfgc.DistributedOptimizer(object(), compression=C.ThreeLC())
    with pytest.raises(TypeError, match="pull_compression"):
        tfgc.DistributedOptimizer(
            tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(), pull_compression="int8"
        )
    with pytest.raises(TypeError, match="codec"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression="3lc")
    wrapped = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC())
    with pytest.raises(TypeError, match="already a DistributedOptimizer"):
        tfgc.DistributedOptimizer(wrapped, compression=C.ThreeLC())


def test_warns_where_compression_would_silently_do_nothing_or_twice():
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC())
    with pytest.warns(UserWarning, match="compresses nothing"):
        opt.build([tf.Variable(tf.zeros([10, 10]))])  # 100 < 1024 elements
    with pytest.warns(UserWarning, match="two residuals"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                  compression=tfgc.ErrorFeedback(C.ThreeLC()))


def test_single_process_applies_the_decoded_gradient(rng):
    big = tf.Variable(rng.normal(size=[40, 50]).astype(np.float32))
    small = tf.Variable(np.ones(10, np.float32))
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=C.ThreeLC(1.0))
    g_big = rng.normal(size=[40, 50]).astype(np.float32)
    g_small = rng.normal(size=[10]).astype(np.float32)
    before = big.numpy().copy()
    opt.apply_gradients([(tf.constant(g_big), big), (tf.constant(g_small), small)])
    codec = C.ThreeLC(1.0)
    sent = codec.decode(codec.encode(g_big)).numpy()
    np.testing.assert_allclose(big.numpy(), before - sent, atol=1e-6)
    # Below min_elements: sent as float16 (the default small-tensor codec).
    np.testing.assert_allclose(small.numpy(), 1 - g_small.astype(np.float16).astype(np.float32),
                               atol=1e-6)
    residuals = list(opt._residuals.values())
    assert len(residuals) == 1
    np.testing.assert_allclose(residuals[0].numpy(), g_big - sent, atol=1e-6)
    assert int(opt.iterations) == 1


def test_sparse_gradients_stay_sparse_and_apply_like_plain_keras(rng):
    # An embedding-style gradient (duplicate rows) through NoCompression and FastSGD:
    # the IndexedSlices are not densified, and the update equals plain Keras's with the
    # same (decoded) gradient.
    rows = tf.constant([3, 7, 3, 0])
    values = tf.constant(rng.normal(size=[4, 5]).astype(np.float32))
    start = rng.normal(size=[10, 5]).astype(np.float32)
    gradient = tf.IndexedSlices(values, rows, tf.constant([10, 5]))
    for codec in (C.NoCompression(), C.FastSGD()):
        variable, reference = tf.Variable(start), tf.Variable(start)
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.Adam(0.1), compression=codec,
                                        error_feedback=False, min_elements=1)
        opt.apply_gradients([(gradient, variable)])
        tf_keras.optimizers.Adam(0.1).apply_gradients(
            [(codec.decode(codec.encode(gradient)), reference)])
        np.testing.assert_allclose(variable.numpy(), reference.numpy(), atol=1e-6)
        untouched = [1, 2, 4, 5, 6, 8, 9]
        np.testing.assert_array_equal(variable.numpy()[untouched], start[untouched])
        # The payload of the distinct rows (row 3's two summed, as tf_keras sums them),
        # plus the lengths of its vectors in the fused message.
        distinct = distinct_rows(gradient)
        assert distinct.indices.numpy().tolist() == [0, 3, 7]
        encoded = codec.encode(distinct)
        payload = int(C.base.payload_nbytes(encoded))
        pushed = int(opt.traffic["push_bytes"].numpy())
        assert payload <= pushed <= payload + 4 * len(encoded) < 10 * 5 * 4, codec
        # What plain TensorFlow sends: the three rows and their int32 ids.
        assert int(opt.traffic["push_plain_bytes"].numpy()) == 3 * (5 * 4 + 4)
        assert opt._residuals == {}


def test_fit_with_threelc_learns_like_uncompressed():
    x, y = digits()
    accuracy = {}
    for name, codec in (("none", None), ("3lc", C.ThreeLC(1.0))):
        model = small_model()
        opt = tf_keras.optimizers.SGD(0.1)
        if codec is not None:
            opt = tfgc.DistributedOptimizer(opt, compression=codec)
        model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        accuracy[name] = model.fit(x, y, epochs=3, batch_size=64, verbose=0).history["accuracy"][-1]
    assert accuracy["none"] > 0.8
    assert accuracy["3lc"] > accuracy["none"] - 0.05


def test_residuals_checkpoint_by_position(tmp_path, rng):
    def build():
        var = tf.Variable(np.zeros([60, 30], np.float32))
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=C.ThreeLC())
        return var, opt

    var, opt = build()
    opt.apply_gradients([(tf.constant(rng.normal(size=[60, 30]).astype(np.float32)), var)])
    saved = list(opt._residuals.values())[0].numpy().copy()
    path = tf.train.Checkpoint(optimizer=opt, var=var).save(str(tmp_path / "ckpt"))
    var2, opt2 = build()
    opt2.build([var2])
    tf.train.Checkpoint(optimizer=opt2, var=var2).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(list(opt2._residuals.values())[0].numpy(), saved)


MIRRORED_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, tf_keras, tfgc
    C = tfgc.codecs
    keras3 = sys.argv[1] == "keras3"
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=[50, 40]).astype(np.float32) for _ in range(2)]
    bias_grads = [rng.normal(size=[7]).astype(np.float32) for _ in range(2)]
    for codec in (C.NoCompression(), C.ThreeLC(1.0), C.Quantize(4)):
        with strategy.scope():
            make = keras.Variable if keras3 else tf.Variable
            var, bias = make(np.zeros([50, 40], np.float32)), make(np.zeros([7], np.float32))
            inner = keras.optimizers.SGD(1.0) if keras3 else tf_keras.optimizers.SGD(1.0)
            opt = tfgc.DistributedOptimizer(inner, compression=codec)
            opt.build([var, bias])

        @tf.function
        def step():
            def replica_fn():
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                g = tf.gather(tf.constant(np.stack(grads)), r)
                b = tf.gather(tf.constant(np.stack(bias_grads)), r)
                opt.apply_gradients([(g, var), (b, bias)])
            strategy.run(replica_fn)

        step()
        expected = -sum(codec.decode(codec.encode(g)).numpy() for g in grads)
        np.testing.assert_allclose(np.asarray(var.numpy()), expected, atol=1e-5)
        # Below min_elements: all-reduced as it is.
        np.testing.assert_allclose(np.asarray(bias.numpy()), -sum(bias_grads), atol=1e-6)
        assert int(opt.traffic["push_dense_bytes"]) == 2 * (50 * 40 + 7) * 4  # both replicas
        print("ok", codec)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("keras_version", ["tf_keras", "keras3"])
def test_mirrored_sums_every_replicas_decoded_gradient(run_python, keras_version):
    assert run_python(MIRRORED_SCRIPT, timeout=300, args=[keras_version]).count("ok") == 3


def test_keras3_fit_single_process_learns_and_counts():
    import keras

    x, y = digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)
    ])
    opt = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0))
    assert isinstance(opt, keras.optimizers.SGD) and type(opt).__name__ == "DistributedSGD"
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert history.history["accuracy"][-1] > 0.85
    assert int(opt.iterations) == 3 * 57
    traffic = {k: int(v) for k, v in opt.traffic.items()}
    assert traffic["push_dense_bytes"] == 3 * 57 * (64 * 128 + 128 + 128 * 10 + 10) * 4
    assert traffic["push_bytes"] < traffic["push_dense_bytes"] / 10
    assert len(opt._residuals) == 2  # the two kernels
    again = type(opt).from_config(opt.get_config())
    assert repr(again.compression) == "ThreeLC(sparsity=1.0)"
    with pytest.raises(NotImplementedError, match="tf_keras"):
        tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=C.Int8(),
                                  pull_compression=C.Int8())


def test_traffic_logger_reports_each_step(tmp_path):
    x, y = digits()
    model = small_model()
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.ThreeLC(1.0))
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    csv_path, per_variable_path = tmp_path / "traffic.csv", tmp_path / "by_variable.csv"
    logger = tfgc.callbacks.TrafficLogger(csv_path=str(csv_path),
                                          per_variable_csv_path=str(per_variable_path))
    history = model.fit(x[:640], y[:640], epochs=1, batch_size=64, verbose=0, callbacks=[logger])
    dense = (64 * 128 + 128 + 128 * 10 + 10) * 4  # every gradient of one step in fp32
    assert history.history["push_dense_bytes"][-1] == dense
    # The two kernels go compressed, the biases (< min_elements) as float16.
    assert (128 + 10) * 2 < history.history["push_bytes"][-1] < dense / 10
    assert history.history["compression_ratio"][-1] > 10
    rows = csv_path.read_text().splitlines()
    assert len(rows) == 1 + 10 and rows[0].startswith("step,push_bytes")
    assert int(opt.traffic["push_dense_bytes"].numpy()) == 10 * dense
    assert "pull_bytes" not in history.history  # no compressed pulls: no pull keys
    by_variable = opt.traffic_by_variable()
    kernel = by_variable[model.layers[0].kernel.name]
    assert kernel["push_dense_bytes"] == 10 * 64 * 128 * 4
    assert 0 < kernel["push_bytes"] < kernel["push_dense_bytes"] / 10
    bias = by_variable[model.layers[0].bias.name]
    assert bias["push_dense_bytes"] == 10 * 128 * 4
    assert bias["push_bytes"] == bias["push_dense_bytes"] // 2  # float16
    assert sum(v["push_bytes"] for v in by_variable.values()) == int(opt.traffic["push_bytes"])
    rows = per_variable_path.read_text().splitlines()
    assert rows[0] == "step,variable,direction,bytes,plain_bytes,dense_bytes"
    assert len(rows) == 1 + 10 * 4  # four variables pushed every step
    step0 = [r.split(",") for r in rows[1:5]]
    assert {r[1] for r in step0} == set(by_variable) and {r[2] for r in step0} == {"push"}


def test_traffic_logger_changes_no_other_log_and_counts_per_optimizer_step():
    x, y = digits()

    class Seen(tf_keras.callbacks.Callback):
        """Listed before the logger: sees the epoch logs as TensorBoard would."""

        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(dict(logs))

    def fit(with_logger, steps_per_execution):
        tf_keras.utils.set_random_seed(0)
        model = small_model()
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8())
        model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
        seen = Seen()
        callbacks = [seen] + ([tfgc.callbacks.TrafficLogger()] if with_logger else [])
        model.fit(x[:640], y[:640], epochs=2, batch_size=64, verbose=0, shuffle=False,
                  callbacks=callbacks)
        return seen.epochs

    plain = fit(False, 1)
    logged = fit(True, 1)
    dense = (64 * 128 + 128 + 128 * 10 + 10) * 4
    for before, after in zip(plain, logged):
        assert {k: after[k] for k in before} == pytest.approx(before)  # loss, accuracy
        assert after["push_dense_bytes"] == dense  # reached a callback listed first
    # Ten steps per batch hook: still per optimizer step, not per hook.
    grouped = fit(True, 5)
    assert [e["push_dense_bytes"] for e in grouped] == [dense, dense]
    assert grouped[-1]["push_bytes"] == pytest.approx(logged[-1]["push_bytes"], rel=0.01)


class _PerVariableCodec(C.NoCompression):
    """Binds a copy per variable that remembers its shape; refuses error feedback."""

    supports_error_feedback = False

    def bind(self, variable):
        bound = _PerVariableCodec()
        bound.shape = tuple(variable.shape)
        return bound


class _TopologyCodec(C.NoCompression):
    """Remembers the topology it was bound with."""

    def bind(self, variable, topology=None):
        bound = _TopologyCodec()
        bound.topology = topology
        return bound


def test_codecs_learn_the_topology_from_bind_and_old_binds_still_work():
    variable = tf.Variable(np.zeros([40, 50], np.float32))
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=_TopologyCodec(),
                                    min_elements=10)
    opt.build([variable])
    assert opt.codec_for(variable).topology == C.base.Topology(False, 1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = tf.Variable(np.zeros([40, 50], np.float32))
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                        compression=_TopologyCodec(), min_elements=10)
        opt.build([mirrored])
    assert opt.codec_for(mirrored).topology == C.base.Topology(False, 1)
    # A codec whose bind takes no topology (written before it had one) is bound as it was.
    old = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=_PerVariableCodec(),
                                    min_elements=10)
    old.build([variable])
    assert old.codec_for(variable).shape == (40, 50)


def test_codecs_are_bound_per_variable_and_may_refuse_error_feedback():
    big = tf.Variable(np.zeros([40, 50], np.float32))
    other = tf.Variable(np.zeros([64, 32], np.float32))
    small = tf.Variable(np.zeros([10], np.float32))
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=_PerVariableCodec())
    opt.build([big, other, small])
    assert opt.codec_for(big).shape == (40, 50) and opt.codec_for(other).shape == (64, 32)
    assert not opt._residuals  # error_feedback=True, but the codec refuses it
    with pytest.raises(KeyError):
        opt.codec_for(small)  # below min_elements: not compressed, no codec
    opt.apply_gradients([(tf.ones([40, 50]), big), (tf.ones([64, 32]), other)])
    np.testing.assert_array_equal(big.numpy(), -np.ones([40, 50]))


BUCKET_SCRIPT = textwrap.dedent(
    """
    import collections, json
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras, tfgc
    C = tfgc.codecs
    # One worker, two local replicas that reduce with collectives, as workers do
    # (TensorFlow's own tests build this strategy the same way).
    strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    rng = np.random.default_rng(0)
    shapes = [[64, 64]] * 8 + [[7]] * 8
    grads = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(2)]
    report = {}
    for name, codec, bucket in (("fp16-one", C.Cast("float16"), 2**30),
                                ("fp16-many", C.Cast("float16"), 16 * 1024),
                                ("threelc-one", C.ThreeLC(1.0), 2**30)):
        with strategy.scope():
            variables = [tf.Variable(np.zeros(s, np.float32)) for s in shapes]
            opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=codec,
                                            bucket_bytes=bucket)
            opt.build(variables)

        @tf.function
        def step():
            def replica_fn():
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                gs = [tf.gather(tf.constant(np.stack([g[i] for g in grads])), r)
                      for i in range(len(shapes))]
                opt.apply_gradients(zip(gs, variables))
            strategy.run(replica_fn)

        graph = step.get_concrete_function().graph.as_graph_def()
        ops = collections.Counter(n.op for n in graph.node)
        for function in graph.library.function:
            ops.update(n.op for n in function.node_def)
        step()
        def summed(i):
            if i >= 8:  # biases: below min_elements, summed as they are
                return grads[0][i] + grads[1][i]
            if codec.summable:  # float16 payloads, summed in float16 by the collective
                return sum(g[i].astype(np.float16) for g in grads).astype(np.float32)
            return sum(codec.decode(codec.encode(g[i])).numpy() for g in grads)

        expected = [-summed(i) for i in range(len(shapes))]
        error = max(float(np.abs(np.asarray(v.numpy()) - e).max())
                    for v, e in zip(variables, expected))
        report[name] = {"reduce": ops["CollectiveReduceV2"], "gather": ops["CollectiveGatherV2"],
                        "error": error}
    print("REPORT " + json.dumps(report))
    """
)


@pytest.mark.slow
def test_all_reduce_packs_gradients_into_buckets(run_report):
    report = run_report(BUCKET_SCRIPT, timeout=300)
    # Collective ops counted in the step's graph: one per replica (2) per collective.
    # fp16 payloads of 8 kernels and 8 fp32 biases: one collective per dtype.
    assert report["fp16-one"]["reduce"] == 2 * 2, report
    # 16 KiB buckets: the 64 KiB of fp16 kernels in 3 packs, plus the biases.
    assert report["fp16-many"]["reduce"] == 2 * (3 + 1), report
    # ThreeLC: one fused message gathered (sizes, shape, words; TensorFlow gathers
    # each one's length first), the biases summed.
    assert report["threelc-one"]["gather"] == 2 * 6 and report["threelc-one"]["reduce"] == 2
    for run in report.values():
        assert run["error"] < 1e-5, report


EAGER_MIRRORED_SCRIPT = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras, tfgc
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    # Different scales: the replicas' ThreeLC messages differ in length.
    grads = [rng.normal(size=[50, 40]).astype(np.float32) * (1 + 5 * r) for r in range(2)]
    codec = tfgc.codecs.ThreeLC(1.0)
    with strategy.scope():
        var = tf.Variable(np.zeros([50, 40], np.float32))
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=codec)
        opt.build([var])

    def replica_fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(tf.gather(tf.constant(np.stack(grads)), r), var)])

    strategy.run(replica_fn)  # eagerly: no tf.function
    expected = -sum(codec.decode(codec.encode(g)).numpy() for g in grads)
    print("REPORT", float(np.abs(np.asarray(var.numpy()) - expected).max()))
    """
)


@pytest.mark.slow
def test_eager_mirrored_gathers_messages_of_different_lengths(run_python):
    line = next(l for l in run_python(EAGER_MIRRORED_SCRIPT, timeout=300).splitlines()
                if l.startswith("REPORT"))
    assert float(line.split()[1]) == 0.0


def test_legacy_tf_keras_optimizers_are_named_with_the_class_to_use():
    with pytest.raises(TypeError, match=r"legacy tf_keras optimizer.*tf_keras\.optimizers\.SGD\(\.\.\.\)"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(0.1), compression=C.Int8())
    with pytest.raises(TypeError, match="expected a tf_keras or Keras 3 optimizer"):
        tfgc.DistributedOptimizer(object(), compression=C.Int8())


def test_keras3_users_need_no_tf_keras(run_python):
    out = run_python(
        """
import sys
sys.modules["tf_keras"] = None  # as if it were not installed: importing it fails
import keras, numpy as np
import tfgc
opt = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=tfgc.codecs.Int8())
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile(opt, "mse")
model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
assert tfgc.codecs.lookup("AdaptiveQuantize") is tfgc.mqgrad.AdaptiveQuantize
try:
    tfgc.callbacks
except ImportError as error:
    print("callbacks:", error)
print("ok", type(opt).__name__)
""", timeout=120)
    assert "ok DistributedSGD" in out
    assert "callbacks: tfgc.callbacks holds tf_keras callbacks" in out


def test_keras3_model_with_a_distributed_optimizer_saves_and_loads(run_python, tmp_path):
    path = tmp_path / "model.keras"
    run_python(f"""
import keras, numpy as np
import tfgc
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(64), keras.layers.Dense(2)])
opt = tfgc.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                compression=tfgc.codecs.ThreeLC(1.5), min_elements=100)
model.compile(opt, "mse")
model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
model.save({str(path)!r})
""", timeout=120)
    out = run_python(f"""
import keras, numpy as np
import tfgc  # registers tfgc's optimizer classes with Keras
model = keras.saving.load_model({str(path)!r})
opt = model.optimizer
print(type(opt).__name__, repr(opt.compression), opt.min_elements)
model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
print("trained", int(opt.iterations.numpy()))
""", timeout=120)
    assert "DistributedAdam ThreeLC(sparsity=1.5) 100" in out
    assert "trained 2" in out


def test_silent_no_ops_warn():
    import warnings

    with pytest.warns(UserWarning, match="QSGD, an unbiased codec"):
        tfgc.ErrorFeedback(C.QSGD(bits=4, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tfgc.ErrorFeedback(C.ThreeLC(1.0))  # biased: error feedback is what it needs
        with tfgc.compressed_pulls():  # single process: pulls are simulated locally
            local = tf.Variable(tf.zeros([64, 32]))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.warns(UserWarning, match="changes nothing under an all-reduce strategy"):
            with tfgc.compressed_pulls():
                pass
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8())
    with pytest.warns(UserWarning, match="has a pull codec: they are pulled as they are"):
        opt.build([local])
    # The other way round: pull_compression, but the model was built outside the scope.
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                    pull_compression=C.Int8())
    with pytest.warns(UserWarning, match="no variable was created under tfgc.compressed_pulls"):
        opt.build([tf.Variable(tf.zeros([64, 32]))])
    opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8(),
                                    pull_compression=C.Int8())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.build([local])
    # The scope without a codec takes the optimizer's, which is deprecated; nothing else.
    assert [w.category for w in caught] == [DeprecationWarning], [str(w.message) for w in caught]


def test_a_keras3_optimizer_on_a_tf_keras_model_says_what_to_wrap():
    import keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(4,))])
    opt = tfgc.DistributedOptimizer(keras.optimizers.Adam(0.1), compression=C.Int8())
    with pytest.raises(ValueError, match=r"a Keras 3 optimizer.*tf_keras\.optimizers\.Adam\(\.\.\.\)"):
        model.compile(opt, "mse")
