"""Mixed precision: tfgc's optimizers inside Keras's loss-scale optimizers.

A loss-scale optimizer (tf_keras's `LossScaleOptimizerV3`, Keras 3's
`LossScaleOptimizer`) multiplies the loss by a scale, divides the gradients by it and
skips the steps whose gradients are not finite. tfgc's optimizer always sits inside it,
so that it encodes unscaled gradients (its residuals stay in the gradients' units
whatever the scale does) and a skipped step never reaches the wire or the residuals.

tf_keras's wrapper sums the replicas' gradients itself, with the inner optimizer's
`aggregate_gradients`, before it decides whether to apply them, and then calls the
inner `apply_gradients(..., skip_gradients_aggregation=True)`. tfgc's tf_keras
optimizer answers the first call with `agree_on_finiteness`: the gradients stay per
replica (its compressed wire sums them when they are applied), and the replicas agree
on whether the step is finite, which the sum used to make them do. Keras 3's wrapper
calls the inner optimizer's `apply`, whose replica sum tfgc replaces anyway.
"""
from typing import Any, Callable, Optional, Sequence, Union

import tensorflow as tf


def loss_scale_rewrapper(optimizer: Any) -> Optional[Callable[[Any], Any]]:
    """For a loss-scale optimizer, a function that wraps another optimizer in one with
    the same settings; None for any other optimizer."""
    try:
        import tf_keras  # noqa: PLC0415
    except ImportError:
        tf_keras = None
    if tf_keras is not None:
        mixed_precision = tf_keras.mixed_precision
        if isinstance(optimizer, mixed_precision.LossScaleOptimizer):
            settings = {"dynamic": optimizer.dynamic, "initial_scale": optimizer.initial_scale}
            if optimizer.dynamic:
                settings["dynamic_growth_steps"] = optimizer.dynamic_growth_steps
            return lambda inner: mixed_precision.LossScaleOptimizer(inner, **settings)
    keras_class = _keras3_loss_scale_class()
    if keras_class is not None and isinstance(optimizer, keras_class):
        return lambda inner: keras_class(
            inner, initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps)
    return None


def _keras3_loss_scale_class():
    try:
        import keras  # noqa: PLC0415
    except ImportError:
        return None
    return getattr(keras.optimizers, "LossScaleOptimizer", None)


def agree_on_finiteness(
    grads_and_vars: Sequence[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]],
) -> list[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]]:
    """Makes every replica see non-finite gradients when any replica has them.

    The replicas' gradients are left as they are (not summed) except one, the
    smallest, to which NaN is added on every replica when some replica's gradients are
    not all finite: a loss-scale optimizer then skips the step everywhere. It costs one
    scalar all-reduce.

    Args:
      grads_and_vars: one replica's (gradient, variable) pairs, in replica context.

    Returns:
      The pairs, with at most one gradient changed.
    """
    present = [(i, g) for i, (g, _) in enumerate(grads_and_vars) if g is not None]
    if not present:
        return list(grads_and_vars)
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for _, g in present]
    finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in values]))
    context = tf.distribute.get_replica_context()
    not_finite = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
    position, gradient = min(present, key=lambda p: _size(p[1]))
    dtype = gradient.dtype
    poison = tf.where(not_finite > 0, tf.constant(float("nan"), dtype), tf.constant(0, dtype))
    if isinstance(gradient, tf.IndexedSlices):
        gradient = tf.IndexedSlices(gradient.values + poison, gradient.indices,
                                    gradient.dense_shape)
    else:
        gradient = gradient + poison
    pairs = list(grads_and_vars)
    pairs[position] = (gradient, pairs[position][1])
    return pairs


def _size(gradient):
    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
    return values.shape.num_elements() or float("inf")
