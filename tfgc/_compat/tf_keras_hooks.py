"""tfgc._compat's tf_keras hooks, probed at their first use (tf_keras is optional and
slow to import)."""
import collections
import contextlib
import inspect

import tensorflow as tf

from tfgc._compat._registry import _hook, _internal, _method, _module, missing

# --- tf_keras (probed at first use) -----------------------------------------------------


@_hook("tf_keras_batch_norm", "tf_keras",
       "tf_keras.src.layers.normalization.batch_normalization.BatchNormalizationBase's "
       "_fused_batch_norm, _assign_moving_average and _support_zero_size_input, and "
       "tf_keras.src.utils.control_flow_util.constant_value")
def _probe_tf_keras_batch_norm():
    layer_class = _module(
        "tf_keras.src.layers.normalization.batch_normalization").BatchNormalizationBase
    for method in ("_fused_batch_norm", "_assign_moving_average", "_support_zero_size_input"):
        _method(layer_class, method)
    constant_value = _module("tf_keras.src.utils.control_flow_util").constant_value
    return layer_class, constant_value


_BN_REPLACED = "_tfgc_replaced"  # marks a method replaced here (so it is done once)


def replace_batch_norm_updates(fused_batch_norm, assign_moving_average):
    """Routes tf_keras batch norm's training-time statistics through tfgc (process-wide,
    once; a no-op the second time).

    After it, `BatchNormalizationBase._fused_batch_norm(layer, inputs, mask, training)`
    calls `fused_batch_norm(keras, layer, inputs, mask, training)` and
    `_assign_moving_average(layer, variable, value, momentum, inputs_size)` calls
    `assign_moving_average(keras, layer, variable, value, momentum, inputs_size)`, with
    `keras` tf_keras's own method (to call for the layers tfgc leaves alone).

    Relies on `BatchNormalizationBase._fused_batch_norm` and `._assign_moving_average`
    (tf_keras.src.layers.normalization.batch_normalization).
    """
    layer_class, _ = _internal("tf_keras_batch_norm")
    for method, replacement in (("_fused_batch_norm", fused_batch_norm),
                                ("_assign_moving_average", assign_moving_average)):
        keras = getattr(layer_class, method)
        if not getattr(keras, _BN_REPLACED, False):
            setattr(layer_class, method, _routed(keras, replacement))


def _routed(keras, replacement):
    """A method that calls `replacement(keras, self, ...)` (tf_keras passes some of the
    arguments by keyword)."""

    def method(layer, *args, **kwargs):
        return replacement(keras, layer, *args, **kwargs)

    setattr(method, _BN_REPLACED, True)
    return method


def static_training(training):
    """tf_keras's static value of a layer's `training` argument (True, False, or None
    when it is only known when the step runs; a numpy bool for a constant tensor).

    Relies on `tf_keras.src.utils.control_flow_util.constant_value`.
    """
    return _internal("tf_keras_batch_norm")[1](training)


BatchNormSettings = collections.namedtuple(
    "BatchNormSettings",
    ["param_shape", "param_dtype", "data_format", "bessels_correction_test_only",
     "supports_zero_size_input"])


def batch_norm_settings(layer):
    """What tf_keras's fused batch norm of a built `layer` uses beyond its public
    attributes, as a `BatchNormSettings`.

    Relies on the `_param_shape`, `_param_dtype`, `_data_format` and
    `_bessels_correction_test_only` attributes of a built tf_keras
    `BatchNormalizationBase` and on its `_support_zero_size_input()`.
    """
    _internal("tf_keras_batch_norm")
    try:
        return BatchNormSettings(
            layer._param_shape, layer._param_dtype, layer._data_format,  # noqa: SLF001
            layer._bessels_correction_test_only,  # noqa: SLF001
            layer._support_zero_size_input())  # noqa: SLF001
    except AttributeError as error:
        raise missing("tf_keras_batch_norm", str(error)) from error


@_hook("tf_keras_optimizer", "tf_keras",
       "tf_keras.optimizers.Optimizer's _var_key, _build_index_dict (which sets "
       "_index_dict) and _deduplicate_sparse_grad")
def _probe_tf_keras_optimizer():
    import tf_keras  # noqa: PLC0415

    optimizer = tf_keras.optimizers.Optimizer
    for method in ("_var_key", "_build_index_dict", TF_KERAS_DEDUPLICATE_SPARSE_GRAD):
        _method(optimizer, method)
    return optimizer


# The name of the tf_keras optimizer method that sums a sparse gradient's repeated rows
# (tfgc's tf_keras optimizer overrides it); `tf_keras_optimizer`'s probe checks it.
TF_KERAS_DEDUPLICATE_SPARSE_GRAD = "_deduplicate_sparse_grad"


def tf_keras_variable_index(optimizer, variable):
    """`variable`'s position in a built tf_keras optimizer (the index of its slots).

    Relies on `Optimizer._index_dict` and `Optimizer._var_key` (tf_keras.src.optimizers).

    Raises:
      KeyError: the optimizer is not built, or not for `variable`.
    """
    _internal("tf_keras_optimizer")
    index = getattr(optimizer, "_index_dict", None)  # set by build()
    if index is None:
        raise KeyError(variable.name)
    return index[optimizer._var_key(variable)]  # noqa: SLF001


def tf_keras_num_variables(optimizer):
    """How many variables a tf_keras optimizer was built for (0 before it is built).

    Relies on `Optimizer._index_dict`.
    """
    _internal("tf_keras_optimizer")
    return len(getattr(optimizer, "_index_dict", {}))


def tf_keras_deduplicate_sparse_grad(parent, grads):
    """`parent._deduplicate_sparse_grad(grads)`: each IndexedSlices gradient's repeated
    rows summed. Pass `super()` from an override of `TF_KERAS_DEDUPLICATE_SPARSE_GRAD`.

    Relies on `tf_keras.optimizers.Optimizer._deduplicate_sparse_grad`.
    """
    _internal("tf_keras_optimizer")
    return getattr(parent, TF_KERAS_DEDUPLICATE_SPARSE_GRAD)(grads)


@_hook("tf_keras_adam_slots", "tf_keras",
       "the `_momentums` and `_velocities` lists of a built tf_keras.optimizers.Adam")
def _probe_tf_keras_adam_slots():
    import tf_keras  # noqa: PLC0415

    source = inspect.getsource(tf_keras.optimizers.Adam.build)
    if "_momentums" not in source or "_velocities" not in source:
        raise LookupError("Adam.build makes no _momentums/_velocities")
    return tf_keras.optimizers.Adam


def tf_keras_adam_slots(optimizer, variable):
    """(m, v): a built tf_keras Adam's first and second moment slots of `variable`.

    Relies on Adam's `_momentums` and `_velocities`, indexed as `tf_keras_variable_index`.
    """
    _internal("tf_keras_adam_slots")
    index = tf_keras_variable_index(optimizer, variable)
    return optimizer._momentums[index], optimizer._velocities[index]  # noqa: SLF001


@_hook("tf_keras_steps_per_execution", "tf_keras",
       "the `_steps_per_execution` variable of a compiled tf_keras Model")
def _probe_tf_keras_steps_per_execution():
    import tf_keras  # noqa: PLC0415

    if "_steps_per_execution" not in inspect.getsource(tf_keras.Model.compile):
        raise LookupError("Model.compile sets no _steps_per_execution")
    return None


def tf_keras_steps_per_execution(model):
    """The `steps_per_execution` a tf_keras model was compiled with, as a variable (None
    before `compile`).

    Relies on `tf_keras.Model._steps_per_execution`.
    """
    _internal("tf_keras_steps_per_execution")
    return getattr(model, "_steps_per_execution", None)


@_hook("tf_keras_train_counter", "tf_keras",
       "a tf_keras Model's `_train_counter` variable, which its train step increments "
       "with `assign_add` under a control dependency on the step's outputs")
def _probe_tf_keras_train_counter():
    import tf_keras  # noqa: PLC0415

    if "_train_counter.assign_add" not in inspect.getsource(tf_keras.Model.make_train_function):
        raise LookupError("Model.make_train_function does not increment _train_counter")
    return None


def tf_keras_count_steps_when_they_start(model):
    """Makes a tf_keras model's step counter count a step when it starts rather than
    once its outputs exist.

    tf_keras increments `model._train_counter` (a variable on a parameter server under
    ParameterServerStrategy) with a control dependency on the step's first output (the
    loss the worker computes), so the server's part of every step waits for a tensor
    from the worker: one more round trip per step. Here the increment runs without that
    dependency. Does nothing for a model without the counter or with it already changed.

    Relies on `tf_keras.Model._train_counter` and on its train step calling
    `assign_add` on it.
    """
    _internal("tf_keras_train_counter")
    counter = getattr(model, "_train_counter", None)
    if counter is None or isinstance(counter, _CountsWhenStepsStart):
        return
    counter.__class__ = _counting_when_steps_start(type(counter))


class _CountsWhenStepsStart:
    """Marks a step counter changed by `tf_keras_count_steps_when_they_start`."""


_COUNTER_CLASSES: dict = {}


def _counting_when_steps_start(variable_class):
    """The subclass of `variable_class` whose `assign_add` ignores control dependencies."""
    if variable_class not in _COUNTER_CLASSES:

        class CountsWhenStepsStart(variable_class, _CountsWhenStepsStart):
            def assign_add(self, *args, **kwargs):
                with tf.control_dependencies(None):
                    return super().assign_add(*args, **kwargs)

        _COUNTER_CLASSES[variable_class] = CountsWhenStepsStart
    return _COUNTER_CLASSES[variable_class]


def tf_keras_keep_steps_per_execution_on_the_coordinator(model, make_local_variable):
    """Moves a compiled tf_keras model's `steps_per_execution` variable to the coordinator.

    tf_keras makes it in the strategy's scope, which under ParameterServerStrategy puts
    it on a parameter server, and `fit` reads it on the coordinator before it schedules
    each step (`DataHandler.steps`): three round trips to the server for every step
    scheduled, while the workers wait for steps to run. `make_local_variable(value)`
    makes its replacement, holding the same value, where the coordinator reads it
    without crossing a link. Does nothing before `compile` or while tf_keras tunes the
    value itself (its tuner holds the variable).

    Relies on `tf_keras.Model._steps_per_execution`, its `autotune_steps_per_execution`
    and `_self_setattr_tracking` (what tf_keras's own untracked attributes are set under).
    """
    _internal("tf_keras_steps_per_execution")
    current = getattr(model, "_steps_per_execution", None)
    if current is None or model.autotune_steps_per_execution:
        return
    # Not tracked: the model's weights and checkpoints stay as tf_keras makes them.
    with _untracked(model):
        model._steps_per_execution = make_local_variable(current.numpy())  # noqa: SLF001


@contextlib.contextmanager
def _untracked(model):
    """Attributes set on `model` inside are not tracked (not dependencies of its weights
    and checkpoints), as tf_keras sets its own untracked attributes."""
    tracking = model._self_setattr_tracking  # noqa: SLF001
    model._self_setattr_tracking = False  # noqa: SLF001
    try:
        yield
    finally:
        model._self_setattr_tracking = tracking  # noqa: SLF001


@_hook("tf_keras_metric_methods", "tf_keras",
       "tf_keras.Model's `metrics`, `get_metrics_result()` and `reset_metrics()`, which "
       "`fit` and `evaluate` call eagerly at each epoch's end and start")
def _probe_tf_keras_metric_methods():
    import tf_keras  # noqa: PLC0415

    for method in ("get_metrics_result", "reset_metrics"):
        _method(tf_keras.Model, method)
    if not isinstance(inspect.getattr_static(tf_keras.Model, "metrics"), property):
        raise LookupError("tf_keras.Model.metrics is not a property")
    return None


_IN_ONE_CALL = "_tfgc_metrics_in_one_call"


def tf_keras_read_metrics_in_one_call(model):
    """Makes a tf_keras model's eager `get_metrics_result()` and `reset_metrics()` one
    `tf.function` call each.

    Under ParameterServerStrategy the compiled metrics' variables live on a parameter
    server, and `fit` resets them at each epoch's start and reads them at its end from
    the coordinator, one eager operation per variable: each a round trip or more. As one
    function, each is one call. Applies while every metric is of a tf_keras class (a
    metric of the user's own may keep Python state a function would not update), and
    traces again when the model's metrics change; inside a traced step the methods run
    as tf_keras wrote them. Does nothing the second time.

    Relies on `tf_keras.Model.metrics`, `get_metrics_result` and `reset_metrics`.
    """
    _internal("tf_keras_metric_methods")
    if getattr(model, _IN_ONE_CALL, False):
        return
    with _untracked(model):
        for method in ("get_metrics_result", "reset_metrics"):
            # A plain function, not a tf.function: SavedModel saves the tf.functions it
            # finds among a model's attributes.
            setattr(model, method, _in_one_call(model, getattr(model, method)))
        setattr(model, _IN_ONE_CALL, True)


def _in_one_call(model, method):
    """`method()` (bound to `model`) run eagerly as one tf.function per set of metrics."""
    functions = {}

    def in_one_call():
        metrics = model.metrics
        if not tf.executing_eagerly() or not all(
                type(m).__module__.startswith("tf_keras.") for m in metrics):
            return method()
        key = tuple(id(m) for m in metrics)
        if key not in functions:
            functions[key] = tf.function(method)
        return functions[key]()

    return in_one_call


@_hook("tf_keras_compiled_metrics", "tf_keras",
       "a compiled tf_keras Model's `compiled_metrics` container, its `built` and its "
       "`build(y_pred, y_true)`")
def _probe_tf_keras_compiled_metrics():
    import tf_keras  # noqa: PLC0415

    container = _module("tf_keras.src.engine.compile_utils").MetricsContainer
    _method(container, "build")
    if "compiled_metrics" not in inspect.getsource(tf_keras.Model.compile):
        raise LookupError("Model.compile sets no compiled_metrics")
    return None


def tf_keras_build_compiled_metrics(model, y_true, y_pred):
    """Builds the metrics a tf_keras model was compiled with (their variables), as its
    first train step would, without updating them; a no-op where they are built.

    Relies on `tf_keras.Model.compiled_metrics` and its `built` and `build`
    (tf_keras.src.engine.compile_utils.MetricsContainer).
    """
    _internal("tf_keras_compiled_metrics")
    container = getattr(model, "compiled_metrics", None)
    if container is not None and not container.built:
        container.build(y_pred, y_true)


@_hook("tf_keras_sgd_step", "tf_keras",
       "tf_keras.optimizers.Optimizer's `_learning_rate` (a value or a schedule of "
       "`iterations`) and `_use_weight_decay`")
def _probe_tf_keras_sgd_step():
    import tf_keras  # noqa: PLC0415

    # Read from the source, not an instance: the first probe can run while a step is
    # traced, and an optimizer made there would be variables made in the trace.
    if "_learning_rate" not in inspect.getsource(tf_keras.optimizers.Optimizer.learning_rate.fget):
        raise LookupError("an Optimizer's learning_rate reads no _learning_rate")
    _method(tf_keras.optimizers.Optimizer, "_use_weight_decay")
    return tf_keras.optimizers.schedules.LearningRateSchedule


def tf_keras_learning_rate_now(optimizer):
    """A tf_keras optimizer's learning rate at its current `iterations` (a schedule's
    value there, computed now: the optimizer computes it only in `apply_gradients`).

    Relies on `Optimizer._learning_rate`.
    """
    schedule_class = _internal("tf_keras_sgd_step")
    rate = optimizer._learning_rate  # noqa: SLF001
    if isinstance(rate, schedule_class):
        return tf.convert_to_tensor(rate(optimizer.iterations))
    return tf.convert_to_tensor(rate)


def tf_keras_uses_weight_decay(optimizer, variable):
    """Whether a tf_keras optimizer applies its `weight_decay` to `variable` (not
    excluded with `exclude_from_weight_decay`).

    Relies on `Optimizer._use_weight_decay`.
    """
    _internal("tf_keras_sgd_step")
    return bool(optimizer.weight_decay) and optimizer._use_weight_decay(variable)  # noqa: SLF001


@_hook("tf_keras_call_context", "tf_keras",
       "tf_keras.src.engine.base_layer_utils.call_context() and its `training`")
def _probe_tf_keras_call_context():
    module = _module("tf_keras.src.engine.base_layer_utils")
    if not hasattr(module.CallContext, "training"):
        raise LookupError("CallContext has no training")
    return module.call_context


def tf_keras_inference_call():
    """Whether the code runs inside a tf_keras layer's call with `training=False` (an
    evaluation or prediction step); False elsewhere, and where `training` is a tensor.

    Relies on `tf_keras.src.engine.base_layer_utils.call_context`.
    """
    training = _internal("tf_keras_call_context")().training
    constant = tf.get_static_value(training) if tf.is_tensor(training) else training
    return constant is not None and not bool(constant)
