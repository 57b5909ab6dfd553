"""tf_keras batch-norm moving statistics updated on their parameter server.

In a training step tf_keras computes a moving statistic's new value where the step
runs: its fused batch norm reads the moving mean and variance as inputs, the other
path reads them to compute `(v - batch) * decay`. Under ParameterServerStrategy each
statistic's value then crosses to the worker and its update crosses back: two
transfers per statistic and step, each a request and a tensor (ResNet-20: 38
statistics, ~13 KB each way of every step).

Which layers do so is chosen per model: `tfgc.compressed_pulls()` marks the
statistics it creates (`batch_norm_on_server=True`, the default), and
`tfgc.batch_norm_on_server(model, enabled)` switches a built model's layers on or
off. For a marked statistic that is a `NamedServerVariable`, the update is computed
on its server instead, with Keras's arithmetic (`v -= (v - batch) * (1 - momentum)`):
only the batch's statistics cross, with the decay and Keras's "batch not empty" flag.
In a step of the strategy's `run` they ride in the step's push message to their server
(`tfgc.ps.riders`: no transfer of their own; as bfloat16, see `StatisticsUpdate`);
where no push to that server carries them, they cross packed into one tensor per layer
and server (per statistic on Keras's unfused path). Other variables, layers with batch
renormalization or a mask, and eager code update as Keras does it.

To reach the training step, tf_keras's `BatchNormalizationBase._fused_batch_norm` and
`_assign_moving_average` are replaced, process-wide, by `enable` (`tfgc._compat.
replace_batch_norm_updates`), which runs where a user asks for statistics on their
servers: a pulls scope entered under ParameterServerStrategy, or `batch_norm_on_server`;
never as a side effect of making a variable. The replacements hand every layer whose
statistics are not marked back to tf_keras's own methods.
"""
import sys
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union

import tensorflow as tf

from tfgc import _compat
from tfgc.codecs.base import Codec, Payload, concat_flat, split_flat
from tfgc.codecs.identity import Cast, NoCompression
from tfgc.distribute import is_parameter_server
from tfgc.ps.server_variables import NamedServerVariable
from tfgc.ps import riders

if TYPE_CHECKING:
    import tf_keras

_MARK = "tfgc_batch_norm_on_server"  # set on a NamedServerVariable to update it there


def mark(variable: tf.Variable, enabled: bool = True) -> bool:
    """Has `variable`'s moving-average updates computed on its server (`enabled`) or
    as Keras computes them, once `enable` has run for its strategy. Only a
    `NamedServerVariable` (also in ParameterServerStrategy's wrapper) can be updated
    there.

    Args:
      variable: a moving statistic.
      enabled: update it on its server (True) or as Keras does (False).

    Returns:
      Whether `variable` is one that this changes (a `NamedServerVariable`).
    """
    inner = _compat.unwrap_caching_variable(variable)
    if not isinstance(inner, NamedServerVariable):
        return False
    setattr(inner, _MARK, bool(enabled))
    return True


def enable(strategy: Optional[tf.distribute.Strategy] = None) -> None:
    """Installs what marked statistics need: tfgc's route of tf_keras's batch-norm
    updates (`install`) and, under ParameterServerStrategy, the collection of riders in
    `strategy`'s steps (`riders.collect_in_steps`), whose push messages carry them.

    Called where a user asks for statistics on their servers (a pulls scope entered,
    `batch_norm_on_server`), never by creating a variable.

    Args:
      strategy: the statistics' strategy (default: the one in scope).
    """
    install()
    strategy = strategy or tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        riders.collect_in_steps(strategy)


def batch_norm_on_server(model: "tf_keras.layers.Layer", enabled: bool = True) -> int:
    """Switches where a tf_keras model's batch-norm moving statistics are updated.

    With `enabled`, the moving mean and variance of every `BatchNormalization` layer in
    `model` (nested models included) are updated on their parameter server in a
    training step: only the batch's statistics cross, once per layer and server (see
    the module). Without, Keras reads them to the worker and writes them back, as it
    does for any variable. It applies to statistics made in `tfgc.compressed_pulls()`
    under ParameterServerStrategy (those are `NamedServerVariable`s), where it is on by
    default (`compressed_pulls(batch_norm_on_server=...)`); others are left as they are.
    Call it before the model's training step is traced (before `fit`): a step traced
    already keeps the updates it was traced with.

        with strategy.scope(), tfgc.compressed_pulls():
            model = make_model()
        tfgc.batch_norm_on_server(model, enabled=False)  # Keras's own updates

    Args:
      model: a tf_keras model or layer.
      enabled: update on the server (True) or as Keras does (False).

    Returns:
      The number of batch-norm layers whose statistics this switched.
    """
    layers = [model, *getattr(model, "submodules", ())]
    strategy = getattr(model, "distribute_strategy", None)  # tf_keras models have one
    switched = 0
    for layer in layers:
        statistics = [getattr(layer, name, None) for name in ("moving_mean", "moving_variance")]
        if any(v is None for v in statistics) or not hasattr(layer, "momentum"):
            continue  # not a batch norm (or not built)
        changed = [mark(v, enabled) for v in statistics]
        switched += any(changed)
    if switched and enabled:
        enable(strategy)
    return switched


def install() -> None:
    """Routes tf_keras's `BatchNormalization` moving-statistics updates of marked named
    server variables through `update_on_server` (once per process; without tf_keras
    loaded, nothing: Keras 3 updates its own way)."""
    if "tf_keras" not in sys.modules:
        return
    _compat.replace_batch_norm_updates(_fused_batch_norm, _assign_moving_average)


def _fused_batch_norm(keras, layer, inputs, mask, training):
    if (mask is not None or layer.renorm
            or _compat.static_training(training) is not True
            or _on_server(layer.moving_mean) is None
            or _on_server(layer.moving_variance) is None):
        return keras(layer, inputs, mask, training)
    return _fused_training_step(layer, inputs)


def _assign_moving_average(keras, layer, variable, value, momentum, inputs_size):
    if _on_server(variable) is None:
        return keras(layer, variable, value, momentum, inputs_size)
    return update_on_server([(variable, value)], momentum, inputs_size)


def _on_server(variable):
    """The marked `NamedServerVariable` behind `variable` (itself or in ParameterServer-
    Strategy's wrapper) while a traced step is being built; otherwise None."""
    inner = _compat.unwrap_caching_variable(variable)
    if (not isinstance(inner, NamedServerVariable) or not getattr(inner, _MARK, False)
            or tf.executing_eagerly()):
        return None
    return inner if _compat.is_function_graph(tf.compat.v1.get_default_graph()) else None


def _fused_training_step(layer, inputs):
    """`layer`'s fused batch norm in training, as tf_keras computes it, with its moving
    statistics updated on their server (one transfer for both, where they share it)."""
    settings = _compat.batch_norm_settings(layer)
    param_shape, param_dtype = settings.param_shape, settings.param_dtype
    gamma = layer.gamma if layer.scale else tf.ones(param_shape, param_dtype)
    beta = layer.beta if layer.center else tf.zeros(param_shape, param_dtype)
    # Without running statistics in, the op returns the batch's (the variance with
    # Bessel's correction, which Keras's moving variance does not have).
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs, gamma, beta, epsilon=layer.epsilon, is_training=True,
        data_format=settings.data_format)
    if not settings.bessels_correction_test_only:
        count = tf.cast(tf.size(inputs) / tf.size(variance), variance.dtype)
        variance = variance * ((count - 1.0) / count)
    batch_size = tf.shape(inputs)[0] if settings.supports_zero_size_input else None
    layer.add_update(lambda: update_on_server(
        [(layer.moving_mean, mean), (layer.moving_variance, variance)],
        layer.momentum, batch_size))
    return outputs


def update_on_server(updates: Sequence[tuple[tf.Variable, tf.Tensor]], momentum: Union[float, tf.Tensor],
                     inputs_size: Optional[tf.Tensor] = None) -> Union[tf.Tensor, tf.Variable]:
    """`v -= (v - value) * (1 - momentum)` for each `(v, value)` of `updates`, computed
    on each variable's server, and not at all where `inputs_size` (a batch size) is 0:
    tf_keras's moving-average update. Per server, the values ride in the step's push
    message where the step collects riders (`tfgc.ps.riders`), else cross packed
    into one tensor of their own.

    Args:
      updates: (variable, value) pairs, each value of its variable's shape.
      momentum: a float or scalar tensor.
      inputs_size: None, or the batch size as a scalar tensor.

    Returns:
      The last update's result, as `assign_sub` returns it; the variable where the
      update rides (it is made later in the step, by the push).

    Raises:
      ValueError: `updates` is empty.
    """
    _require_statistics(updates)
    by_server: dict[str, list[tuple[tf.Variable, tf.Tensor]]] = {}  # round-robin placement may put a layer's two statistics apart
    for variable, value in updates:
        device = _compat.unwrap_caching_variable(variable).device
        by_server.setdefault(device, []).append((variable, value))
    dtype = updates[0][0].dtype.base_dtype
    decay = tf.cast(tf.convert_to_tensor(1.0 - momentum, name="decay"), dtype)
    applies = (tf.ones([], dtype) if inputs_size is None
               else tf.cast(inputs_size > 0, dtype))
    for device, pairs in by_server.items():
        update = StatisticsUpdate(device, pairs, tf.stack([decay, applies]))
        result = pairs[-1][0] if riders.ride(update) else update.send_alone()
    return result


class StatisticsUpdate(riders.Rider):
    """tf_keras's moving-average update of statistics on one server.

    It rides in the push message as bfloat16 (float32's range: a variance may exceed
    float16's; each value rounded to 8 significant bits, about 0.4% at most, which the
    moving average then averages over about 1 / (1 - momentum) steps), or as float32
    where the optimizer sends small tensors uncompressed (`small_compression=None`).
    The decay and the "batch not empty" flag always arrive exactly.

    Args:
      device: the statistics' server.
      pairs: (variable, batch value) pairs of the variables on `device`.
      rates: [decay, applies] in the variables' dtype.

    Raises:
      ValueError: `pairs` is empty.
    """

    def __init__(self, device: str, pairs: Sequence[tuple[tf.Variable, tf.Tensor]], rates: tf.Tensor) -> None:
        _require_statistics(pairs)
        super().__init__(device)
        self.variables = [variable for variable, _ in pairs]
        dtype = self.variables[0].dtype.base_dtype
        self.values = concat_flat([tf.cast(value, dtype) for _, value in pairs])
        self.rates = rates

    def payload(self, small_compression: Optional[Codec]) -> Payload:
        return {**_codec(small_compression).encode(self.values), "rates": self.rates}

    def apply(self, payload: dict[str, tf.Tensor], small_compression: Optional[Codec]
              ) -> Union[tf.Tensor, tf.Variable]:
        payload = dict(payload)
        rates = payload.pop("rates")
        values = _codec(small_compression).decode(payload, expected_shape=self.values.shape)
        return self._assign(tf.cast(values, self.rates.dtype), rates)

    def dense_nbytes(self) -> int:
        return self.values.shape.num_elements() * self.values.dtype.size

    # A run of updates v <- v - (v - x_k) * d_k (d_k: the decay where the batch was not
    # empty, else 0) is one: v <- (1 - S) * v + A, with A <- (1 - d_k) * A + d_k * x_k
    # and S <- 1 - (1 - d_k) * (1 - S), both from 0. The state is [A, S].
    folds = True

    def state_size(self) -> int:
        return self.values.shape.num_elements() + 1

    def fold(self, state: tf.Tensor) -> tf.Tensor:
        decay, applies = tf.unstack(tf.cast(self.rates, tf.float32))
        decay = decay * tf.cast(applies > 0, tf.float32)
        moved, stepped = state[:-1], state[-1:]
        return tf.concat([(1.0 - decay) * moved + decay * tf.cast(self.values, tf.float32),
                          1.0 - (1.0 - decay) * (1.0 - stepped)], axis=0)

    def folded(self, state: tf.Tensor) -> "FoldedStatistics":
        return FoldedStatistics(self.device, self.variables, state)

    def send_alone(self) -> Union[tf.Tensor, tf.Variable]:
        # The values, decay and flag packed into one tensor: all that crosses.
        packed = tf.concat([self.values, self.rates], axis=0)
        with tf.name_scope("AssignMovingAvg"), tf.device(self.device):
            values, rates = tf.split(packed, [self.values.shape[0], 2])
            return self._assign(values, rates)

    def _assign(self, values, rates):
        """`v -= (v - value) * decay` for each variable where the batch was not empty."""
        decay, applies = tf.unstack(rates)
        shapes = [variable.shape for variable in self.variables]
        for variable, value in zip(self.variables, split_flat(values, shapes)):
            delta = (variable - value) * decay
            result = variable.assign_sub(tf.where(applies > 0, delta, tf.zeros_like(delta)))
        return result


class FoldedStatistics(riders.Rider):
    """A run of one worker's `StatisticsUpdate`s of statistics on one server, made at
    once: `v <- (1 - S) * v + A` from the folded state [A, S] (see
    `StatisticsUpdate.fold`), exactly the run's updates made one after another.

    A rides as the updates' values do (bfloat16, or float32 where the optimizer sends
    small tensors uncompressed); S arrives exactly.

    Args:
      device: the statistics' server.
      variables: the statistics on `device`.
      state: the folded state, float32.

    Raises:
      ValueError: `variables` is empty.
    """

    def __init__(self, device: str, variables: Iterable[tf.Variable], state: tf.Tensor) -> None:
        super().__init__(device)
        self.variables = list(variables)
        _require_statistics(self.variables)
        self.moved, self.stepped = state[:-1], state[-1:]

    def payload(self, small_compression: Optional[Codec]) -> Payload:
        return {**_codec(small_compression).encode(self.moved), "stepped": self.stepped}

    def apply(self, payload: dict[str, tf.Tensor], small_compression: Optional[Codec]
              ) -> Union[tf.Tensor, tf.Variable]:
        payload = dict(payload)
        stepped = payload.pop("stepped")
        moved = _codec(small_compression).decode(payload, expected_shape=self.moved.shape)
        dtype = self.variables[0].dtype.base_dtype  # one dtype: `StatisticsUpdate` casts to it
        kept = tf.cast(1.0 - stepped[0], dtype)
        shapes = [variable.shape for variable in self.variables]
        for variable, value in zip(self.variables, split_flat(moved, shapes)):
            result = variable.assign(kept * variable + tf.cast(value, dtype))
        return result

    def dense_nbytes(self) -> int:
        return sum(v.shape.num_elements() * v.dtype.size for v in self.variables)

    def send_alone(self) -> Union[tf.Tensor, tf.Variable]:
        raise NotImplementedError(
            "folded batch-norm statistics travel in a meeting's message only")


def _require_statistics(statistics):
    """Raises ValueError if `statistics` is empty. Every caller updates a layer's moving
    mean and variance; an update of none has no dtype and no result to return, and
    passing it over would leave a layer's statistics unmoved without a word."""
    if not statistics:
        raise ValueError("no statistics to update: a batch-norm statistics update "
                         "needs at least one")


def _codec(small_compression):
    """How statistics ride: see `StatisticsUpdate`."""
    return NoCompression() if small_compression is None else Cast("bfloat16")
