"""tfgc.BoundedAdam: Adam's steps one at a time, a bounded step when read half-updated.

Under ParameterServerStrategy, the warning for plain Adam with sparse gradients is
checked on a real cluster in tests/test_sparse_ps.py.
"""
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc.optimizer.bounded_adam import consistent_step_bound, warns_of_interleaved_adam


@pytest.mark.parametrize("sparse", [True, False])
def test_steps_like_keras_adam_to_the_bit(sparse):
    rng = np.random.default_rng(0)
    start = rng.standard_normal(50).astype(np.float32)
    plain, bounded = tf.Variable(start), tf.Variable(start)
    keras_adam = tf_keras.optimizers.Adam(0.01, epsilon=1e-8)
    bounded_adam = tfgc.BoundedAdam(0.01, epsilon=1e-8)
    for _ in range(6):
        if sparse:
            gradient = tf.IndexedSlices(tf.constant(rng.standard_normal(10), tf.float32),
                                        tf.constant(rng.choice(50, 10, replace=False)),
                                        tf.constant([50]))
        else:
            gradient = tf.constant(rng.standard_normal(50), tf.float32)
        keras_adam.apply_gradients([(gradient, plain)])
        bounded_adam.apply_gradients([(gradient, bounded)])
    np.testing.assert_array_equal(bounded.numpy(), plain.numpy())


def test_caps_a_step_read_between_two_workers_updates():
    # A row whose m holds another worker's gradient but whose v does not yet (v = 0):
    # Keras's Adam moves it by lr * m / epsilon, BoundedAdam by the consistent bound.
    moved = {}
    for name, optimizer in (("keras", tf_keras.optimizers.Adam(0.01, epsilon=1e-8)),
                            ("bounded", tfgc.BoundedAdam(0.01, epsilon=1e-8))):
        weights = tf.Variable(tf.zeros([4]))
        optimizer.build([weights])
        optimizer.iterations.assign(1000)  # bias corrections ~1: alpha ~ lr
        optimizer._momentums[0].assign([0.0, 1e-3, 0.0, 0.0])
        zero = tf.IndexedSlices(tf.zeros([1]), tf.constant([3]), tf.constant([4]))
        optimizer.apply_gradients([(zero, weights)])
        moved[name] = float(-weights.numpy()[1])
    alpha = 0.01 * np.sqrt(1 - 0.999**1001) / (1 - 0.9**1001)  # Adam's step size
    assert moved["keras"] == pytest.approx(alpha * 0.9e-3 / 1e-8, rel=1e-3)  # ~716
    # At most (1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)) = 7.27 steps of alpha.
    assert moved["bounded"] == pytest.approx(alpha * 0.1 / np.sqrt(0.001 * (1 - 0.81 / 0.999)),
                                             rel=1e-5)


def test_the_bound_is_reached_by_no_gradient_sequence_and_approached_by_the_worst():
    b1, b2 = 0.9, 0.999
    bound = float(consistent_step_bound(b1, b2))
    assert bound == pytest.approx(7.27, abs=0.01)
    rng = np.random.default_rng(1)
    for _ in range(200):
        m = v = 0.0
        for g in rng.standard_normal(rng.integers(1, 300)) * rng.lognormal(0, 3):
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            assert abs(m) <= bound * np.sqrt(v) * (1 + 1e-9)
    # Cauchy-Schwarz is tight: the gradient k steps old proportional to (b1 / b2)^k.
    m = v = 0.0
    for k in reversed(range(2000)):
        g = (b1 / b2) ** k
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    assert abs(m) / np.sqrt(v) == pytest.approx(bound, rel=1e-6)


def test_refuses_betas_without_a_finite_bound():
    with pytest.raises(ValueError, match="beta_1\\^2 < beta_2"):
        tfgc.BoundedAdam(0.01, beta_1=0.9995, beta_2=0.999)
    tfgc.BoundedAdam(0.01, beta_1=0.9995, beta_2=0.999, amsgrad=True)  # Keras's update


def test_which_optimizers_are_warned_of():
    codec = tfgc.codecs.Int8()
    adam = tf_keras.optimizers.Adam(0.01)
    assert warns_of_interleaved_adam(adam)
    assert warns_of_interleaved_adam(tfgc.DistributedOptimizer(adam, compression=codec))
    for quiet in (tfgc.BoundedAdam(0.01), tf_keras.optimizers.Adam(0.01, amsgrad=True),
                  tf_keras.optimizers.SGD(0.1),
                  tfgc.DistributedOptimizer(tfgc.BoundedAdam(0.01), compression=codec)):
        assert not warns_of_interleaved_adam(quiet), quiet


def test_no_warning_outside_parameter_servers():
    variable = tf.Variable(tf.zeros([8, 2]))
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.Adam(0.01),
                                          compression=tfgc.codecs.Int8(), min_elements=1)
    rows = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 5]), tf.constant([8, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer.apply_gradients([(rows, variable)])


def test_a_model_compiled_with_it_saves_and_loads(run_python, tmp_path):
    path = tmp_path / "model.keras"
    run_python(f"""
import numpy as np, tf_keras
import tfgc
model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)])
opt = tfgc.DistributedOptimizer(tfgc.BoundedAdam(0.02), compression=tfgc.codecs.Int8(),
                                min_elements=1)
model.compile(opt, "mse")
model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
model.save({str(path)!r})
""", timeout=120)
    out = run_python(f"""
import tf_keras
import tfgc  # registers tfgc's optimizer classes, BoundedAdam's included
model = tf_keras.models.load_model({str(path)!r})
opt = model.optimizer
print(type(opt).__name__, isinstance(opt, tfgc.BoundedAdam), round(float(opt.learning_rate), 6),
      int(opt.iterations.numpy()))
""", timeout=120)
    assert out.split() == ["DistributedBoundedAdam", "True", "0.02", "1"]  # 1 step before saving
