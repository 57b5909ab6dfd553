"""A finite gradient that an encode overflows (LogQuant's scale near float32's limit)
must not reach the weights: tfgc checks the gradients it decodes and skips the step
where one is not finite, weights, slots and residuals untouched, as a loss-scale
optimizer skips a step it sees non-finite; and no extreme value may stall the steps
after it.

Each script trains one codec after another (every codec) on a conv kernel, a dense
matrix and a bias: a normal step, then one step per finite extreme value (3e38, -3e38,
1e30 and float32's largest) in one element of the kernel's gradient, each followed by
a normal step. Under MirroredStrategy only replica 0's gradient holds the value, so the
replicas must agree to skip; under parameter servers (two, on a real cluster) the
worker's check must stop both servers' updates. Both Keras flavours, with and without
a loss-scale optimizer.
"""
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np, tensorflow as tf
    FLAVOUR, STRATEGY, LSO = sys.argv[1], sys.argv[2], sys.argv[3] == "lso"
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tfgc
    from tfgc import codecs as C
    if FLAVOUR == "tf_keras":
        import tf_keras as K
        make_variable = tf.Variable
        lso_class = K.mixed_precision.LossScaleOptimizer
    else:
        import keras as K
        make_variable = K.Variable
        lso_class = K.optimizers.LossScaleOptimizer
    if STRATEGY == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    elif STRATEGY == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(
            ["/cpu:0", "/cpu:1"])
    elif STRATEGY == "ps":  # two servers, so that a step's skip spans both
        from tfgc import cluster
        servers = cluster.LocalCluster(num_ps=2, num_workers=1, timeout_s=600).__enter__()
        strategy = tf.distribute.experimental.ParameterServerStrategy(servers.resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    else:
        strategy = tf.distribute.get_strategy()
    VALUES = [3e38, -3e38, 1e30, float(np.finfo(np.float32).max)]
    SHAPES = {"kernel": [3, 3, 8, 16], "dense": [64, 32], "bias": [16]}
    rng = np.random.default_rng(0)
    INITIAL = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    GRADS = {k: (rng.normal(size=s) * 1e-2).astype(np.float32) for k, s in SHAPES.items()}

    def local(value, per_worker=False):
        if STRATEGY == "ps" and per_worker:  # the worker's copy (a residual)
            return [coordinator.schedule(tf.function(value.read_value)).fetch()]
        if STRATEGY == "ps":
            return [value.numpy()]
        if not isinstance(value, tf.Variable):
            value = value.value  # a Keras 3 variable's tf.Variable
        return [tf.convert_to_tensor(t).numpy() for t in strategy.experimental_local_results(value)]

    def run(name):
        with strategy.scope():
            variables = [make_variable(INITIAL[k], name=k) for k in SHAPES]
            inner = K.optimizers.SGD(0.5)
            if LSO:
                inner = lso_class(inner, initial_scale=1.0)
            opt = tfgc.DistributedOptimizer(inner, compression=C.lookup(name)())
            opt.build(variables)
        compressing = tfgc.optimizer.compressing_optimizer(opt)
        residuals = list(compressing._residuals.values())

        @tf.function
        def step(value):
            def replica_fn():
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                grads = [tf.constant(GRADS[k]) for k in SHAPES]
                # One element of replica 0's kernel gradient takes the value (0: none).
                extreme = tf.where(tf.equal(r, 0) & tf.not_equal(value, 0.0), value,
                                   grads[0][0, 0, 0, 0])
                grads[0] = tf.tensor_scatter_nd_update(grads[0], [[0, 0, 0, 0]], [extreme])
                if LSO and FLAVOUR == "tf_keras":
                    grads = opt.get_unscaled_gradients(grads)  # as its train_step does
                if FLAVOUR == "tf_keras":
                    opt.apply_gradients(list(zip(grads, variables)))
                else:
                    opt.apply(grads, variables)
            strategy.run(replica_fn)

        def run_step(value):
            if STRATEGY == "ps":
                coordinator.schedule(step, args=(value,))
                coordinator.join()
            else:
                step(value)

        def state():
            return ([local(v) for v in variables], [local(r, per_worker=True) for r in residuals],
                    int(opt.iterations.numpy()))

        steps = []
        for value in [0.0] + [v for value in VALUES for v in (value, 0.0)]:
            (w0, r0, i0) = state()
            run_step(tf.constant(value, tf.float32))
            (w1, r1, i1) = state()
            steps.append({
                "value": value,
                "finite": all(np.isfinite(c).all() for w in w1 + r1 for c in w),
                "replicas_agree": all(np.array_equal(w[0], c) for w in w1 for c in w),
                "weights_kept": all(np.array_equal(a, b) for x, y in zip(w0, w1)
                                    for a, b in zip(x, y)),
                "residuals_kept": all(np.array_equal(a, b) for x, y in zip(r0, r1)
                                      for a, b in zip(x, y)),
                "counted": i1 == i0 + 1,
                "first": [w[0].tolist() for w in w1] if len(steps) == 0 else None,
                "first_residuals": [r[0].tolist() for r in r1] if len(steps) == 0 else None,
            })
        return steps

    report = {name: run(name) for name in C.names()}
    if STRATEGY == "ps":
        servers.__exit__(None, None, None)
    print("REPORT " + json.dumps(report))
    """
)

# The codecs whose encode overflows a finite 3e38 (or float32's largest): unchecked,
# their weights become Inf or NaN. (QSGD's decode divides a level by the levels before
# it scales the norm, and PowerSGD's normalisation divides a column by its largest
# magnitude before its norm, so that neither overflows.)
OVERFLOWING = {"LogQuant"}
# Codecs whose first step is a pure function of the gradient (no state, no randomness):
# the first step's weights and residuals are computed here bit for bit.
DETERMINISTIC = ["NoCompression", "Cast", "Int8", "ThreeLC", "OneBit", "Sparsify", "TopK",
                 "LogQuant", "Quantize", "AdaptiveQuantize", "ScaledSign"]
CONFIGS = [("tf_keras", "none", "plain"), ("tf_keras", "none", "lso"),
           ("tf_keras", "mirrored", "plain"), ("tf_keras", "mirrored", "lso"),
           ("tf_keras", "mwms", "plain"),
           ("keras3", "none", "plain"), ("keras3", "none", "lso"),
           ("keras3", "mirrored", "plain"), ("keras3", "mirrored", "lso"),
           # No loss-scale optimizer: tf_keras's refuses ParameterServerStrategy.
           ("tf_keras", "ps", "plain"), ("keras3", "ps", "plain")]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{config: report}, each config's script run once (in a fresh process: logical
    devices) as the tests ask for it."""
    return {}


def report_for(reports, run_report, config):
    if config not in reports:
        reports[config] = run_report(SCRIPT, timeout=900, args=config)
    return reports[config]


@pytest.mark.parametrize("config", CONFIGS, ids=["-".join(c) for c in CONFIGS])
def test_no_finite_gradient_makes_the_weights_non_finite(reports, run_report, config):
    report = report_for(reports, run_report, config)
    import tfgc

    assert sorted(report) == tfgc.codecs.names()  # every codec
    skipped = set()
    for name, steps in report.items():
        for index, step in enumerate(steps):
            where = f"{name} after a gradient holding {step['value']:g} ({'-'.join(config)})"
            assert step["finite"], f"{where}: weights or residuals not finite"
            assert step["replicas_agree"], f"{where}: the replicas' copies differ"
            assert step["counted"], f"{where}: iterations did not count the step"
            if step["weights_kept"]:
                # A skipped step: nothing moved, the residuals included.
                assert step["residuals_kept"], f"{where}: skipped, but residuals moved"
                skipped.add(name)
            if step["value"] == 0:
                # A normal step moves the weights, after an extreme one too: neither
                # skipped nor sent as zeros while a residual holds the extreme value.
                assert not step["weights_kept"], f"{where}: a normal step moved nothing"
    # The overflowing codecs' steps were caught and skipped, not merely survived.
    assert OVERFLOWING <= skipped, sorted(OVERFLOWING - skipped)


def test_a_normal_step_is_what_it_was(reports, run_report):
    """A normal gradient's step is unchanged, bit for bit: w - lr * decode(encode(g)),
    residual g - decode(encode(g))."""
    import tensorflow as tf

    import tfgc
    from tfgc import codecs as C

    report = report_for(reports, run_report, ("tf_keras", "none", "plain"))
    rng = np.random.default_rng(0)
    shapes = {"kernel": [3, 3, 8, 16], "dense": [64, 32], "bias": [16]}
    initial = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    grads = {k: (rng.normal(size=s) * 1e-2).astype(np.float32) for k, s in shapes.items()}
    half = np.float32(0.5)
    for name in DETERMINISTIC:
        first = report[name][0]
        expected_residuals = []
        for index, key in enumerate(shapes):
            variable = tf.Variable(initial[key])
            codec = (tfgc.wire.encoder.bind_to(C.lookup(name)(), variable,
                                               tfgc.codecs.base.Topology())
                     if key != "bias" else C.Cast("float16"))
            decoded = codec.decode(codec.encode(tf.constant(grads[key]))).numpy()
            np.testing.assert_array_equal(
                np.asarray(first["first"][index], np.float32),
                initial[key] + -(decoded * half), err_msg=f"{name}: {key}")
            if key != "bias" and codec.supports_error_feedback:
                expected_residuals.append(grads[key] - decoded)
        assert len(first["first_residuals"]) == len(expected_residuals), name
        for got, expected in zip(first["first_residuals"], expected_residuals):
            np.testing.assert_array_equal(np.asarray(got, np.float32), expected,
                                          err_msg=name)
