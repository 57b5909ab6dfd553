"""A replaceable error-feedback rule (tfgc.ResidualFeedback): the default is 3LC's
residual, a decay or a registered subclass changes it, and configs keep it."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc import codecs as C
from tfgc.memory import ResidualFeedback, feedback_rule, register_feedback, serialize_feedback


def _one_step(error_feedback, gradient, steps=2):
    variable = tf.Variable(tf.zeros([64, 64]))
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(1.0), compression=C.Int8(),
                                          error_feedback=error_feedback)
    for _ in range(steps):
        optimizer.apply_gradients([(gradient, variable)])
    return optimizer, variable


def test_the_default_rule_is_three_lc_s_residual_and_a_decay_scales_it(rng):
    gradient = tf.constant(rng.normal(size=[64, 64]), tf.float32)
    plain, _ = _one_step(True, gradient)
    decayed, _ = _one_step(ResidualFeedback(decay=0.5), gradient)
    assert plain.feedback == ResidualFeedback() and plain.error_feedback
    assert decayed.feedback == ResidualFeedback(0.5)
    # Replay the two steps by hand: total_t = g + decay * r_{t-1}; r_t = total_t - sent_t.
    for optimizer, decay in ((plain, 1.0), (decayed, 0.5)):
        codec, residual = C.Int8(), np.zeros([64, 64], np.float32)
        for _ in range(2):
            total = gradient.numpy() + decay * residual
            sent = codec.decode(codec.encode(tf.constant(total))).numpy()
            residual = total - sent
        (kept,) = [r for r in optimizer._residuals.values()]
        np.testing.assert_allclose(kept.numpy(), residual, atol=1e-6)


def test_no_rule_keeps_no_residual(rng):
    optimizer, _ = _one_step(False, tf.ones([64, 64]))
    assert optimizer.feedback is None and not optimizer._residuals


@register_feedback
class HalfFeedback(ResidualFeedback):
    """Adds half the gradient: a rule of one's own."""

    def accumulate(self, x, residual):
        return 0.5 * x + residual


def test_a_registered_rule_round_trips_through_the_optimizer_config(rng):
    optimizer, _ = _one_step(HalfFeedback(), tf.constant(rng.normal(size=[64, 64]), tf.float32))
    config = optimizer.get_config()
    assert config["error_feedback"] == {"class_name": "HalfFeedback", "config": {"decay": 1.0}}
    restored = type(optimizer).from_config(config)
    assert type(restored.feedback) is HalfFeedback
    assert type(optimizer).from_config(_one_step(True, tf.ones([64, 64]))[0].get_config()).feedback \
        == ResidualFeedback()
    assert serialize_feedback(None) is False and serialize_feedback(ResidualFeedback()) is True


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="decay"):
        ResidualFeedback(decay=0.0)
    with pytest.raises(TypeError, match="error_feedback"):
        feedback_rule("yes")
    with pytest.raises(TypeError, match="error_feedback"):
        feedback_rule({"class_name": "Unregistered", "config": {}})
    with pytest.raises(TypeError, match="subclass"):
        register_feedback(int)
