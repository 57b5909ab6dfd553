"""Parameter-server variables reached by name (tfgc.ps.server_variables) on a real cluster.

The same training runs twice, in fresh processes, once with the server's variables
reached by name (the default) and once with their handles passed on every call, as
TensorFlow does (`cluster_scripts.PASS_HANDLES`); each is 1 ps, 1 worker, tf_keras
`fit` of a small conv net with batch norm under `compressed_pulls()`, SGD with momentum
and ThreeLC both ways, then FastSGD's sparse logistic regression with Adam, whose
sparse update adds to its slots with `scatter_add` between reads of them. With names,
the model's variables on the server (masters, batch-norm statistics) and the
optimizer's slots must be named; both runs must train identically (losses and final
weights), and a checkpoint must restore them.
"""
import numpy as np
import pytest
import tensorflow as tf

import cluster_scripts
from tfgc.ps import server_variables

COORDINATOR = cluster_scripts.script(
    """
    from models import data as data_lib, sparse_models
    from tfgc.ps import server_variables

    def unnamed(variables):
        inner = [(v.name, getattr(getattr(v, "master", v), "_v", getattr(v, "master", v)))
                 for v in variables]
        return [name for name, v in inner
                if not isinstance(v, server_variables.NamedServerVariable)]

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8, 8, 4)).astype("float32")
    y = rng.integers(0, 10, 64)
    images = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    train, _ = data_lib.load_sparse("reuters_corn")
    sparse = sparse_models.sparse_dataset(train, 256, shuffle=False)
    report = {}
    with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=400) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope(), tfgc.compressed_pulls():
            tf_keras.utils.set_random_seed(0)
            conv = tf_keras.Sequential([
                tf_keras.Input((8, 8, 4)), tf_keras.layers.Conv2D(8, 3, padding="same"),
                tf_keras.layers.BatchNormalization(), tf_keras.layers.ReLU(),
                tf_keras.layers.GlobalAveragePooling2D(), tf_keras.layers.Dense(10)])
        with strategy.scope():
            codec = tfgc.codecs.ThreeLC(1.0)
            # Small tensors uncompressed: the batch-norm statistics then ride in the
            # push message as float32, which keeps Keras's arithmetic exactly.
            opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.05, momentum=0.9),
                                            compression=codec, pull_compression=codec,
                                            small_compression=None)
            opt.build(conv.trainable_variables)
            conv.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = conv.fit(images, epochs=4, steps_per_epoch=1, verbose=0)
        report["conv"] = {"loss": history.history["loss"],
                          "weights": [float(np.sum(w)) for w in conv.get_weights()],
                          "unnamed": unnamed(conv.variables),
                          "unnamed_slots": len(unnamed(opt.variables())),
                          "slots": len(opt.variables())}
        # A checkpoint restores named variables (model and slots).
        checkpoint = tf.train.Checkpoint(model=conv, optimizer=opt)
        path = checkpoint.save(os.path.join(sys.argv[1], "ckpt"))
        saved = [w.copy() for w in conv.get_weights()] + [v.numpy() for v in opt.variables()]
        for v in conv.variables + opt.variables():
            v.assign(tf.zeros_like(v))
        checkpoint.restore(path)
        restored = conv.get_weights() + [v.numpy() for v in opt.variables()]
        report["conv"]["restored"] = all(np.array_equal(a, b) for a, b in zip(saved, restored))

        # Sparse Adam adds to its slots with `scatter_add` between reads of them.
        with strategy.scope():
            linear = sparse_models.keras_model(train.num_features, l2=1e-4,
                                               packed_reads=False)
            adam = tfgc.DistributedOptimizer(sparse_models.adam(0.01),
                                             compression=tfgc.codecs.NoCompression(),
                                             error_feedback=False)
            adam.build(linear.trainable_variables)
            linear.compile(adam, sparse_models.keras_loss("logistic"))
        history = linear.fit(sparse, epochs=3, steps_per_epoch=1, verbose=0)
        report["sparse"] = {"loss": history.history["loss"],
                            "weights": [float(np.sum(w)) for w in linear.get_weights()],
                            "unnamed_slots": len(unnamed(adam.variables()))}

    send_report(report)
    """, pass_handles=True)


@pytest.mark.cluster
@pytest.mark.slow
def test_named_server_variables_train_as_passed_handles_do(run_report, tmp_path):
    named = run_report(COORDINATOR, timeout=400, args=[tmp_path / "named"])
    passed = run_report(COORDINATOR, timeout=400, args=[tmp_path / "passed", "--pass-handles"])
    # Sparse Adam's slots named (not its step counter), its training unchanged: a slot
    # reached through a second, captured handle was updated out of order.
    assert named["sparse"]["unnamed_slots"] == 1, named["sparse"]
    assert named["sparse"]["loss"] == passed["sparse"]["loss"], (named, passed)
    np.testing.assert_allclose(named["sparse"]["weights"], passed["sparse"]["weights"],
                               rtol=1e-6)
    named, passed = named["conv"], passed["conv"]
    assert named["unnamed"] == [], named
    # 6 momentum slots named; not the step counter, which tf_keras makes with the
    # optimizer, before tfgc builds it (one handle).
    assert named["slots"] == 7 and named["unnamed_slots"] == 1, named
    assert len(passed["unnamed"]) == 8, passed
    assert named["loss"] == passed["loss"], (named, passed)
    np.testing.assert_allclose(named["weights"], passed["weights"], rtol=1e-6)
    assert all(np.isfinite(named["loss"])), named
    assert named["restored"] and passed["restored"], (named, passed)


def test_a_traced_step_makes_one_unordered_handle_per_named_variable():
    # One handle per function graph, captured by nested ones, and made outside the
    # step's order of stateful ops: chained after the step's asserts, every named
    # variable's first use waited for them, which changed how two asynchronous
    # workers' updates interleave.
    variable = server_variables.NamedServerVariable(tf.Variable([1.0, 2.0]))

    @tf.function
    def step(flag):
        tf.debugging.Assert(flag, ["stateful, no resource input"])
        variable.assign_add([1.0, 1.0])
        tf.cond(flag, lambda: variable.assign_add([10.0, 10.0]),
                lambda: variable.assign([0.0, 0.0]))
        return variable.read_value() * 2.0

    np.testing.assert_array_equal(step(tf.constant(True)).numpy(), [24.0, 26.0])
    graph = step.get_concrete_function(tf.TensorSpec([], tf.bool)).graph
    handles = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
    assert len(handles) == 1, handles
    assert handles[0].control_inputs == [], handles[0].control_inputs
    assert not graph.captures or all(t.dtype != tf.resource for t in graph.external_captures)
    # Eager code sees an ordinary variable, and the variable's resource is its own.
    np.testing.assert_array_equal(variable.numpy(), [12.0, 13.0])


FIRST_STEP_COORDINATOR = cluster_scripts.script(
    """
    from tfgc.ps import server_variables

    # Models of many small variables, fp32 both ways (messages of fixed sizes), each
    # optimizer built by its model's first step, as `compile` and `fit` alone do it.
    configs = {  # name: (built before `fit`, local steps, outer optimizer)
        "built": (True, 1, None), "first_step": (False, 1, None),
        "average": (False, 2, tfgc.OuterSGD.averaging()),
        "nesterov": (False, 2, tfgc.OuterSGD(0.7, momentum=0.9, nesterov=True))}
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 4))
    data = tf.data.Dataset.from_tensor_slices((x, y.astype("float32"))).repeat().batch(16)
    fp32 = tfgc.codecs.NoCompression()
    report = {}
    with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=200) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        for config, (built, local_steps, outer) in configs.items():
            with strategy.scope(), tfgc.compressed_pulls():
                model = tf_keras.Sequential([tf_keras.Input((4,))] + [
                    tf_keras.layers.Dense(4) for _ in range(30)])
            with strategy.scope():
                opt = tfgc.DistributedOptimizer(
                    tf_keras.optimizers.SGD(0.01, momentum=0.9), compression=fp32,
                    pull_compression=fp32, local_steps=local_steps, outer_optimizer=outer)
                if built:
                    opt.build(model.trainable_variables)
                model.compile(opt, "mse")
            model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)
            rows = c.settled_socket_bytes()
            before = c.traffic_between("worker", "ps", rows=rows)
            model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)
            rows = c.settled_socket_bytes()
            sent = c.traffic_between("worker", "ps", rows=rows) - before
            named = [isinstance(getattr(v, "_v", v), server_variables.NamedServerVariable)
                     for v in opt.variables()]
            report[config] = {"bytes_per_step": sent / 20, "variables": len(named),
                              "named": sum(named)}
    send_report(report)
    """)


@pytest.mark.cluster
@pytest.mark.slow
def test_variables_made_in_the_first_step_are_reached_by_name(run_report):
    # Without `build` before `fit`, tf_keras builds the optimizer (its momentum slots)
    # while the first step traces, as tfgc makes local steps' outer momenta: 60
    # variables each, whose handles would cross with every step (~85 bytes each, 5 KB
    # a step) were they not named.
    runs = run_report(FIRST_STEP_COORDINATOR, timeout=300)
    for config, slots in (("first_step", 60), ("nesterov", 120)):
        assert runs[config]["named"] == slots, runs
    for plain, more in (("built", "first_step"), ("average", "nesterov")):
        extra = runs[more]["bytes_per_step"] - runs[plain]["bytes_per_step"]
        assert abs(extra) < 1024, runs
