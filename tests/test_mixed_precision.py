"""Mixed precision: tfgc inside Keras's loss-scale optimizers, either way they are wrapped.

Under an all-reduce strategy tf_keras's LossScaleOptimizer sums the replicas' gradients
itself before applying them; tfgc must still put its own compressed sum on the wire
(each replica encodes its own unscaled gradient), agree with the other replicas on
skipping non-finite steps, and leave its residuals alone when a step is skipped. The
scripts run with two replicas in one process (collectives, as between workers); the
bytes on real sockets are checked in test_mwms.py.
"""
import textwrap

import numpy as np
import pytest

import tfgc
from tfgc import codecs as C

pytestmark = pytest.mark.slow

LOSS_SCALED_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras, tfgc
    strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=[50, 40]).astype(np.float32) for _ in range(2)]
    codec = tfgc.codecs.ThreeLC(1.0)
    SCALE = 2.0 ** 10  # a power of two: unscaling is exact
    with strategy.scope():
        var = tf.Variable(np.zeros([50, 40], np.float32))
        opt = tf_keras.mixed_precision.LossScaleOptimizer(
            tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=codec),
            initial_scale=SCALE)
        opt.build([var])
    compressing = tfgc.optimizer.compressing_optimizer(opt)
    residual = next(iter(compressing._residuals.values()))

    @tf.function
    def step(poison):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.gather(tf.constant(np.stack(grads)), r) * SCALE
            # Replica 1 alone overflows when asked to.
            g = g + tf.where(poison & tf.equal(r, 1), np.inf, 0.0)
            # As tf_keras's train_step does (LossScaleOptimizer.compute_gradients).
            [g] = opt.get_unscaled_gradients([g])
            opt.apply_gradients([(g, var)])
        strategy.run(replica_fn)

    report = {"outer": type(opt).__name__, "inner": type(compressing).__name__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tfgc must not think someone else summed them
        step(tf.constant(False))
    report["w1"] = var.numpy().tolist()
    report["residuals1"] = [t.numpy().tolist() for t in strategy.experimental_local_results(residual)]
    report["push"] = int(compressing.traffic["push_bytes"])
    report["scale1"] = float(opt.loss_scale)
    step(tf.constant(True))
    report["w2"] = var.numpy().tolist()
    report["residuals2"] = [t.numpy().tolist() for t in strategy.experimental_local_results(residual)]
    report["push2"] = int(compressing.traffic["push_bytes"])
    report["scale2"] = float(opt.loss_scale)
    report["iterations"] = int(opt.iterations.numpy())
    report["grads"] = [g.tolist() for g in grads]
    print("REPORT " + json.dumps(report))
    """
)


def test_loss_scaled_replicas_each_send_their_own_compressed_gradient(run_report):
    # The user's wrapping order ends as this one (see the test of the rewrap below, and
    # the matrix's "lso_first" cells).
    report = run_report(LOSS_SCALED_SCRIPT, timeout=300)
    assert report["outer"] == "LossScaleOptimizerV3" and report["inner"] == "DistributedSGD"
    codec = C.ThreeLC(1.0)
    grads = [np.asarray(g, np.float32) for g in report["grads"]]
    decoded = [codec.decode(codec.encode(g)).numpy() for g in grads]
    # Each replica encoded its own unscaled gradient; the update is the sum of the
    # decodings (not a decoding of the sum, which the loss-scale optimizer's own
    # fp32 all-reduce used to hand tfgc).
    np.testing.assert_allclose(report["w1"], -(decoded[0] + decoded[1]), atol=1e-5)
    assert not np.allclose(report["w1"], -codec.decode(codec.encode(grads[0] + grads[1])).numpy(),
                           atol=1e-3)
    for r in range(2):  # residuals in the gradients' units, whatever the loss scale
        np.testing.assert_allclose(report["residuals1"][r], grads[r] - decoded[r], atol=1e-5)
    assert 0 < report["push"] < 2 * 50 * 40 * 4 / 10
    # One replica's gradient overflowed: both skipped the step, weights, residuals and
    # counters untouched, and the loss scale halved.
    np.testing.assert_array_equal(report["w2"], report["w1"])
    np.testing.assert_array_equal(report["residuals2"], report["residuals1"])
    assert report["push2"] == report["push"]
    assert report["scale2"] == report["scale1"] / 2
    assert report["iterations"] == 2


ELSEWHERE_SCRIPT = textwrap.dedent(
    """
    import json, warnings
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras, tfgc
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        var = tf.Variable(np.zeros([50, 40], np.float32))
        opt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0),
                                        compression=tfgc.codecs.ThreeLC(1.0))
        opt.build([var])

    @tf.function
    def step():
        def replica_fn():
            g = tf.ones([50, 40])
            summed = tf.distribute.get_replica_context().all_reduce("SUM", g)
            opt.apply_gradients([(summed, var)], skip_gradients_aggregation=True)
        strategy.run(replica_fn)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
    print("REPORT " + json.dumps({
        "warnings": [str(w.message) for w in caught if "summed across replicas" in str(w.message)],
        "w": float(var.numpy()[0, 0]), "push": int(opt.traffic["push_bytes"]),
        "dense": int(opt.traffic["push_dense_bytes"])}))
    """
)


def test_gradients_summed_elsewhere_are_applied_uncounted_with_a_warning(run_report):
    report = run_report(ELSEWHERE_SCRIPT, timeout=300)
    assert len(report["warnings"]) == 1 and "nothing is compressed" in report["warnings"][0]
    assert report["w"] == -2.0  # the sum, applied exactly (no quantization)
    assert report["push"] == report["dense"] == 0  # no claim of compression


def test_wrapping_a_loss_scale_optimizer_puts_it_outside():
    import tf_keras

    lso = tf_keras.mixed_precision.LossScaleOptimizer(
        tf_keras.optimizers.SGD(0.1), initial_scale=256, dynamic_growth_steps=7)
    opt = tfgc.DistributedOptimizer(lso, compression=C.ThreeLC(1.0))
    assert isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
    assert type(opt.inner_optimizer).__name__ == "DistributedSGD"
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (256, 7)
    assert tfgc.optimizer.compressing_optimizer(opt) is opt.inner_optimizer
    with pytest.raises(TypeError, match="already a DistributedOptimizer"):
        tfgc.DistributedOptimizer(opt, compression=C.ThreeLC(1.0))


def test_wrapping_a_keras3_loss_scale_optimizer_puts_it_outside():
    import keras

    lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=256.0, dynamic_growth_steps=7)
    opt = tfgc.DistributedOptimizer(lso, compression=C.Int8())
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert type(opt.inner_optimizer).__name__ == "DistributedSGD"
    assert (opt.initial_scale, opt.dynamic_growth_steps) == (256.0, 7)
