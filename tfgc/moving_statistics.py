"""tf_keras batch-norm moving statistics updated on their parameter server.

In a training step tf_keras computes a moving statistic's new value where the step
runs: its fused batch norm reads the moving mean and variance as inputs, the other
path reads them to compute `(v - batch) * decay`. Under ParameterServerStrategy each
statistic's value then crosses to the worker and its update crosses back: two
transfers per statistic and step, each a request and a tensor (ResNet-20: 38
statistics, ~13 KB each way of every step).

For statistics that are `NamedServerVariable`s (those made in
`tfgc.compressed_pulls()`), `install()` has the update computed on their server
instead, with Keras's arithmetic (`v -= (v - batch) * (1 - momentum)`): only the
batch's statistics cross, packed with the decay and Keras's "batch not empty" flag
into one tensor (one transfer per layer and server on the fused path, per statistic
on the other). Other variables, layers with batch renormalization or a mask, and
eager code update as Keras does it.
"""
# pylint: disable=protected-access
import sys

import tensorflow as tf
from tensorflow.python.distribute import ps_values
from tensorflow.python.framework import func_graph, ops

from tfgc.server_variables import NamedServerVariable

_installed = False


def install():
    """Routes tf_keras's `BatchNormalization` moving-statistics updates of named server
    variables through `update_on_server` (once per process; a tf_keras without the
    methods replaced here keeps its own)."""
    global _installed
    if _installed or "tf_keras" not in sys.modules:  # Keras 3 updates its own way
        return
    try:
        from tf_keras.src.layers.normalization import batch_normalization
        from tf_keras.src.utils import control_flow_util
        layer_class = batch_normalization.BatchNormalizationBase
        keras_fused = layer_class._fused_batch_norm
        keras_moving_average = layer_class._assign_moving_average
    except (ImportError, AttributeError):
        return

    def _fused_batch_norm(layer, inputs, mask, training):
        if (mask is not None or layer.renorm
                or control_flow_util.constant_value(training) is not True
                or _on_server(layer.moving_mean) is None
                or _on_server(layer.moving_variance) is None):
            return keras_fused(layer, inputs, mask, training)
        return _fused_training_step(layer, inputs)

    def _assign_moving_average(layer, variable, value, momentum, inputs_size):
        if _on_server(variable) is None:
            return keras_moving_average(layer, variable, value, momentum, inputs_size)
        return update_on_server([(variable, value)], momentum, inputs_size)

    layer_class._fused_batch_norm = _fused_batch_norm
    layer_class._assign_moving_average = _assign_moving_average
    _installed = True


def _on_server(variable):
    """The `NamedServerVariable` behind `variable` (itself or in ParameterServer-
    Strategy's wrapper) while a traced step is being built; otherwise None."""
    inner = variable.get() if isinstance(variable, ps_values.CachingVariable) else variable
    if not isinstance(inner, NamedServerVariable) or tf.executing_eagerly():
        return None
    return inner if isinstance(ops.get_default_graph(), func_graph.FuncGraph) else None


def _fused_training_step(layer, inputs):
    """`layer`'s fused batch norm in training, as tf_keras computes it, with its moving
    statistics updated on their server (one transfer for both, where they share it)."""
    param_shape, param_dtype = layer._param_shape, layer._param_dtype
    gamma = layer.gamma if layer.scale else tf.ones(param_shape, param_dtype)
    beta = layer.beta if layer.center else tf.zeros(param_shape, param_dtype)
    # Without running statistics in, the op returns the batch's (the variance with
    # Bessel's correction, which Keras's moving variance does not have).
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs, gamma, beta, epsilon=layer.epsilon, is_training=True,
        data_format=layer._data_format)
    if not layer._bessels_correction_test_only:
        count = tf.cast(tf.size(inputs) / tf.size(variance), variance.dtype)
        variance = variance * ((count - 1.0) / count)
    batch_size = tf.shape(inputs)[0] if layer._support_zero_size_input() else None
    layer.add_update(lambda: update_on_server(
        [(layer.moving_mean, mean), (layer.moving_variance, variance)],
        layer.momentum, batch_size))
    return outputs


def update_on_server(updates, momentum, inputs_size=None):
    """`v -= (v - value) * (1 - momentum)` for each `(v, value)` of `updates`, computed
    on each variable's server, and not at all where `inputs_size` (a batch size) is 0:
    tf_keras's moving-average update, with one transfer per server from the step's
    device.

    Args:
      updates: (variable, value) pairs, each value of its variable's shape.
      momentum: a float or scalar tensor.
      inputs_size: None, or the batch size as a scalar tensor.

    Returns:
      The last update's result, as `assign_sub` returns it.
    """
    by_server = {}  # round-robin placement may put a layer's two statistics apart
    for variable, value in updates:
        by_server.setdefault(_on_server(variable).device, []).append((variable, value))
    for device, pairs in by_server.items():
        result = _update_on(device, pairs, momentum, inputs_size)
    return result


def _update_on(device, updates, momentum, inputs_size):
    """`update_on_server` for variables on `device`: their values packed with the decay
    and the "batch not empty" flag into one tensor, which is all that crosses."""
    variables = [variable for variable, _ in updates]
    dtype = variables[0].dtype.base_dtype
    decay = tf.cast(tf.convert_to_tensor(1.0 - momentum, name="decay"), dtype)
    applies = (tf.ones([], dtype) if inputs_size is None
               else tf.cast(inputs_size > 0, dtype))
    packed = tf.concat([tf.reshape(tf.cast(value, dtype), [-1]) for _, value in updates]
                       + [tf.stack([decay, applies])], axis=0)
    sizes = [variable.shape.num_elements() for variable in variables]
    with tf.name_scope("AssignMovingAvg"), tf.device(device):
        *values, decay, applies = tf.split(packed, sizes + [1, 1])
        for variable, value in zip(variables, values):
            delta = (variable - tf.reshape(value, variable.shape)) * decay[0]
            result = variable.assign_sub(tf.where(applies[0] > 0, delta,
                                                  tf.zeros_like(delta)))
        return result
