"""The one place where tfgc touches TensorFlow's and Keras's private names.

tfgc needs a few things that TensorFlow, tf_keras and Keras 3 do not export: variable
classes to subclass, the hooks their optimizers and batch norm call, attributes that
hold a count or an index. Every such use is a *hook* here: a small named function or
constant whose docstring names the internal it relies on. No other module of tfgc
imports `tensorflow.python`, `keras.src` or `tf_keras.src`, or reads or writes a
private attribute of a TensorFlow or Keras object (tests/test_compat_fence.py checks).

Each hook is registered in `HOOKS` with a probe that finds its internal. The
TensorFlow hooks are probed when this module is imported (TensorFlow is loaded by
then, so it costs nothing); the tf_keras and Keras 3 ones at their first use (those
packages are optional and slow to import). A probe that fails raises
`UnsupportedInternalsError`, which names the hook, the installed version and the
versions the hooks were verified with (`VERIFIED`, the pins of pyproject.toml): a
TensorFlow or Keras upgrade that moves an internal fails there, loudly, and not as a
silent change of behaviour.
"""
import collections
import dataclasses
import importlib
import inspect
import weakref
from typing import Callable

# The versions every hook below was verified with (pyproject.toml pins them).
VERIFIED = {"tensorflow": "2.21", "tf_keras": "2.21.0", "keras": "3.15.x"}


class UnsupportedInternalsError(RuntimeError):
    """A TensorFlow or Keras internal that a tfgc hook relies on is missing."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """One registered hook.

    Attributes:
      name: the hook's name in this module.
      library: "tensorflow", "tf_keras" or "keras": the package that owns the internal.
      internal: what the hook relies on, as a dotted name.
      probe: returns the internal; raises ImportError, AttributeError or LookupError
        when it is missing.
      at_import: probed when this module is imported (TensorFlow hooks whose probe is
        cheap); otherwise at the hook's first use.
    """

    name: str
    library: str
    internal: str
    probe: Callable[[], object]
    at_import: bool = True


HOOKS = {}  # hook name -> Hook
_resolved = {}  # hook name -> what its probe returned


def _installed_version(library):
    try:
        return importlib.import_module(library).__version__
    except (ImportError, AttributeError):
        return "(not installed)"


def missing(name, detail=None):
    """The `UnsupportedInternalsError` of hook `name` (for hooks that find an internal
    missing at use, such as an attribute set on instances)."""
    hook = HOOKS[name]
    verified = ", ".join(f"{lib} {version}" for lib, version in VERIFIED.items())
    return UnsupportedInternalsError(
        f"tfgc hook `{name}` relies on {hook.internal}, which {hook.library} "
        f"{_installed_version(hook.library)} (installed) does not have"
        f"{f' ({detail})' if detail else ''}; tfgc's hooks were verified with {verified}. "
        "Install the versions pinned in tfgc's pyproject.toml.")


def _hook(name, library, internal, at_import=None):
    """Registers the decorated probe as hook `name`'s (see `Hook`); TensorFlow's are
    probed at import unless `at_import` is False."""
    at_import = library == "tensorflow" if at_import is None else at_import

    def register(probe):
        HOOKS[name] = Hook(name, library, internal, probe, at_import)
        return probe

    return register


def check(name):
    """Probes hook `name` now (uncached) and returns its internal.

    Raises:
      UnsupportedInternalsError: the internal is missing.
    """
    try:
        return HOOKS[name].probe()
    except (ImportError, AttributeError, LookupError) as error:
        raise missing(name, f"{type(error).__name__}: {error}") from error


def _internal(name):
    """Hook `name`'s internal, probed once (at import, or here at first use)."""
    if name not in _resolved:
        _resolved[name] = check(name)
    return _resolved[name]


def _module(path):
    return importlib.import_module(path)


def _method(owner, method):
    """`owner.method`, which must be callable (a probe's check that a hook still is)."""
    value = getattr(owner, method)
    if not callable(value):
        raise AttributeError(f"{owner.__name__}.{method} is not callable")
    return value


# --- TensorFlow: variables ------------------------------------------------------------


@_hook("BaseResourceVariable", "tensorflow",
       "tensorflow.python.ops.resource_variable_ops.BaseResourceVariable and the private "
       "methods its subclasses override (_read_variable_op, _dense_var_to_tensor, "
       "_export_to_saved_model_graph, _gather_saveables_for_checkpoint)")
def _probe_base_resource_variable():
    base = _module("tensorflow.python.ops.resource_variable_ops").BaseResourceVariable
    for method in RESOURCE_VARIABLE_OVERRIDES:
        _method(base, method)
    return base


# The private methods of BaseResourceVariable that tfgc's variable wrappers override
# (tfgc.variables.PulledVariable); the probe above checks that TensorFlow still has them.
RESOURCE_VARIABLE_OVERRIDES = ("_read_variable_op", "_dense_var_to_tensor",
                               "_export_to_saved_model_graph",
                               "_gather_saveables_for_checkpoint")


@_hook("ResourceVariable", "tensorflow",
       "tensorflow.python.ops.resource_variable_ops.ResourceVariable (the exact class of a "
       "plain tf.Variable, subclassed by tfgc.server_variables.NamedServerVariable)")
def _probe_resource_variable():
    return _module("tensorflow.python.ops.resource_variable_ops").ResourceVariable


@_hook("act_as_resource_variable", "tensorflow",
       "tensorflow.python.ops.resource_variable_ops.is_resource_variable accepting any "
       "object with a `_should_act_as_resource_variable` attribute")
def _probe_act_as_resource_variable():
    ops = _module("tensorflow.python.ops.resource_variable_ops")

    class Marked:
        _should_act_as_resource_variable = None

    if not ops.is_resource_variable(Marked()):
        raise LookupError("is_resource_variable ignores _should_act_as_resource_variable")
    return ops.is_resource_variable


@_hook("variable_accessed", "tensorflow",
       "tensorflow.python.ops.resource_variable_ops.variable_accessed")
def _probe_variable_accessed():
    return _module("tensorflow.python.ops.resource_variable_ops").variable_accessed


@_hook("init_variable_from_handle", "tensorflow",
       "BaseResourceVariable.__init__'s private keyword arguments (handle, unique_id, "
       "handle_name, in_graph_mode, distribute_strategy)")
def _probe_init_from_handle():
    init = _module("tensorflow.python.ops.resource_variable_ops").BaseResourceVariable.__init__
    parameters = inspect.signature(init).parameters
    needed = {"handle", "unique_id", "handle_name", "in_graph_mode", "distribute_strategy"}
    if not needed <= set(parameters):
        raise LookupError(f"no parameter(s) {sorted(needed - set(parameters))}")
    return init


@_hook("distribute_strategy_of", "tensorflow",
       "the `_distribute_strategy` attribute of a TensorFlow variable")
def _probe_distribute_strategy_of():
    return None  # an instance attribute: checked at each use


@_hook("resource_handle", "tensorflow",
       "the `_handle` attribute of a BaseResourceVariable (its eager resource handle)")
def _probe_resource_handle():
    return None  # an instance attribute: checked at each use


@_hook("set_parent_trackable", "tensorflow",
       "the `_parent_trackable` weak reference TensorFlow sets on a variable's handle",
       at_import=False)
def _probe_set_parent_trackable():
    # Written, never read here: check that TensorFlow still sets (and so reads) it.
    source = inspect.getsource(_module("tensorflow.python.ops.resource_variable_ops"))
    if "_parent_trackable" not in source:
        raise LookupError("resource_variable_ops no longer sets _parent_trackable")


@_hook("ShardedVariable", "tensorflow",
       "tensorflow.python.distribute.sharded_variable.ShardedVariable and the "
       "`_sharded_container` weak reference it sets on its shards")
def _probe_sharded_variable():
    return _module("tensorflow.python.distribute.sharded_variable").ShardedVariable


@_hook("CachingVariable", "tensorflow",
       "tensorflow.python.distribute.ps_values.CachingVariable (ParameterServerStrategy's "
       "variable wrapper), its `get()` and its `_handle` lookup through `__getattr__`")
def _probe_caching_variable():
    caching = _module("tensorflow.python.distribute.ps_values").CachingVariable
    _method(caching, "get")
    _method(caching, "__getattr__")
    return caching


@_hook("VARIABLE_VALUE_KEY", "tensorflow",
       "tensorflow.python.trackable.base.VARIABLE_VALUE_KEY (a variable's checkpoint key)")
def _probe_variable_value_key():
    return _module("tensorflow.python.trackable.base").VARIABLE_VALUE_KEY


@_hook("trackable_children", "tensorflow",
       "tensorflow.python.trackable.base.Trackable._trackable_children")
def _probe_trackable_children():
    return _method(_module("tensorflow.python.trackable.base").Trackable,
                   "_trackable_children")


@_hook("Trackable", "tensorflow",
       "tensorflow.python.trackable.base.Trackable (tf.__internal__.tracking.Trackable)")
def _probe_trackable():
    return _module("tensorflow.python.trackable.base").Trackable


# --- TensorFlow: graphs, contexts, strategies -------------------------------------------


@_hook("in_save_context", "tensorflow",
       "tensorflow.python.saved_model.save_context.in_save_context")
def _probe_in_save_context():
    return _module("tensorflow.python.saved_model.save_context").in_save_context


@_hook("FuncGraph", "tensorflow", "tensorflow.python.framework.func_graph.FuncGraph")
def _probe_func_graph():
    return _module("tensorflow.python.framework.func_graph").FuncGraph


@_hook("eager_context", "tensorflow",
       "tensorflow.python.eager.context.context and context.eager_mode")
def _probe_eager_context():
    context = _module("tensorflow.python.eager.context")
    return context.context, context.eager_mode


@_hook("ps_num_workers", "tensorflow",
       "the `_num_workers` attribute of ParameterServerStrategy")
def _probe_ps_num_workers():
    return None  # an instance attribute: checked at each use


BaseResourceVariable = None  # set below, from the probes
ResourceVariable = None
ShardedVariable = None
CachingVariable = None
VARIABLE_VALUE_KEY = None
Trackable = None


def _check_tensorflow_hooks():
    """Probes every TensorFlow hook (at import) and binds the constants."""
    for name, hook in HOOKS.items():
        if hook.at_import:
            _resolved[name] = check(name)
    globals().update({name: _resolved[name] for name in (
        "BaseResourceVariable", "ResourceVariable", "ShardedVariable", "CachingVariable",
        "VARIABLE_VALUE_KEY", "Trackable")})


def in_save_context():
    """Whether a SavedModel export is tracing functions now.

    Relies on `tensorflow.python.saved_model.save_context.in_save_context`.
    """
    return _resolved["in_save_context"]()


def is_function_graph(graph):
    """Whether `graph` is a tf.function's graph (or one nested in it).

    Relies on `tensorflow.python.framework.func_graph.FuncGraph`.
    """
    return isinstance(graph, _resolved["FuncGraph"])


def eager_context():
    """The process's eager context object (kept alive by whoever must outlive it).

    Relies on `tensorflow.python.eager.context.context`.
    """
    return _resolved["eager_context"][0]()


def eager_mode():
    """A context manager that runs its body eagerly (also inside a graph, or at exit).

    Relies on `tensorflow.python.eager.context.eager_mode`.
    """
    return _resolved["eager_context"][1]()


def variable_accessed(variable):
    """Records a read of `variable` on the active gradient tapes (what TensorFlow's own
    variables do on each read).

    Relies on `tensorflow.python.ops.resource_variable_ops.variable_accessed`.
    """
    _resolved["variable_accessed"](variable)


def init_variable_from_handle(variable, handle, source, unique_id, handle_name):
    """Initializes `variable` (a `ResourceVariable` subclass) around an existing resource
    `handle`, with `source`'s settings (trainable, shape, dtype, constraint,
    synchronization, aggregation, distribution strategy), eagerly.

    Relies on `BaseResourceVariable.__init__`'s private keyword arguments (handle,
    unique_id, handle_name, in_graph_mode, distribute_strategy) and on a variable's
    `_distribute_strategy` attribute.
    """
    _resolved["init_variable_from_handle"](
        variable, trainable=source.trainable, shape=source.shape, dtype=source.dtype,
        handle=handle, constraint=source.constraint, synchronization=source.synchronization,
        aggregation=source.aggregation, distribute_strategy=distribute_strategy_of(source),
        unique_id=unique_id, handle_name=handle_name, in_graph_mode=False)


def distribute_strategy_of(variable):
    """The strategy `variable` was created under (None outside any).

    Relies on the `_distribute_strategy` attribute of TensorFlow variables.
    """
    try:
        return variable._distribute_strategy  # noqa: SLF001
    except AttributeError as error:
        raise missing("distribute_strategy_of") from error


def set_parent_trackable(handle, owner):
    """Makes `handle` point back to `owner`, as TensorFlow does for a variable's own
    handle (SavedModel and checkpoint code find the variable from its handle).

    Relies on the `_parent_trackable` attribute of resource handles.
    """
    _internal("set_parent_trackable")
    handle._parent_trackable = weakref.ref(owner)  # noqa: SLF001


def resource_handle(variable):
    """The eager resource handle a `BaseResourceVariable` was made with (its `handle`
    property may return another one, as `NamedServerVariable`'s does in a function).

    Relies on the `_handle` attribute of `BaseResourceVariable`.
    """
    try:
        return variable._handle  # noqa: SLF001
    except AttributeError as error:
        raise missing("resource_handle") from error


def set_sharded_container(shard, container):
    """Makes `container` (a `ShardedVariable`) the container of `shard`, as the
    ShardedVariable constructor does for its own shards (optimizers group slots by it).

    Relies on the `_sharded_container` weak reference of ShardedVariable's shards.
    """
    shard._sharded_container = weakref.ref(container)  # noqa: SLF001


def export_to_saved_model_graph(variable, object_map, tensor_map, options, **kwargs):
    """`variable`'s own SavedModel export (a wrapper's export delegates to it).

    Relies on `BaseResourceVariable._export_to_saved_model_graph`.
    """
    return variable._export_to_saved_model_graph(  # noqa: SLF001
        object_map, tensor_map, options, **kwargs)


def caching_variable_inner(wrapper):
    """The variable inside ParameterServerStrategy's `CachingVariable` `wrapper`.

    Relies on `ps_values.CachingVariable.get`.
    """
    return wrapper.get()


def unwrap_caching_variable(variable):
    """`variable` without ParameterServerStrategy's `CachingVariable` wrapper, if any."""
    return variable.get() if isinstance(variable, CachingVariable) else variable


def ps_num_workers(strategy):
    """The number of worker tasks of a ParameterServerStrategy (known before its
    ClusterCoordinator exists, which has no public count either).

    Relies on `ParameterServerStrategyV2._num_workers`.
    """
    try:
        return strategy._num_workers  # noqa: SLF001
    except AttributeError as error:
        raise missing("ps_num_workers") from error


def trackable_children(parent, save_type, **kwargs):
    """`parent._trackable_children(save_type, **kwargs)`: the children a checkpoint or
    SavedModel saves. Pass `super()` from an override of `_trackable_children`
    (`TRACKABLE_CHILDREN`), so that the next class's implementation runs.

    Relies on `tensorflow.python.trackable.base.Trackable._trackable_children`.
    """
    return parent._trackable_children(save_type, **kwargs)  # noqa: SLF001


# The name of the Trackable method that decides what a checkpoint/SavedModel saves.
TRACKABLE_CHILDREN = "_trackable_children"


def is_savedmodel_save(save_type):
    """Whether `save_type` (what `_trackable_children` receives) is a SavedModel export."""
    return str(getattr(save_type, "value", save_type)) == "savedmodel"


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


# --- Keras 3 (probed at first use) -----------------------------------------------------

# The name of the Keras 3 TensorFlow-backend optimizer method that sums gradients across
# replicas (tfgc's Keras 3 optimizer overrides it); `keras3_tf_optimizer`'s probe checks it.
KERAS3_ALL_REDUCE_SUM_GRADIENTS = "_all_reduce_sum_gradients"


@_hook("keras3_tf_optimizer", "keras",
       "keras.src.backend.tensorflow.optimizer.TFOptimizer with _all_reduce_sum_gradients, "
       "and keras.src.optimizers.base_optimizer.BaseOptimizer's _get_variable_index and "
       "_trainable_variables")
def _probe_keras3_tf_optimizer():
    optimizer = _module("keras.src.backend.tensorflow.optimizer").TFOptimizer
    _method(optimizer, KERAS3_ALL_REDUCE_SUM_GRADIENTS)
    _method(optimizer, "_get_variable_index")
    return optimizer


def keras3_tf_optimizer():
    """The base class of Keras 3's TensorFlow-backend optimizers.

    Relies on `keras.src.backend.tensorflow.optimizer.TFOptimizer`.

    Raises:
      UnsupportedInternalsError: Keras 3 without it, or without
        `KERAS3_ALL_REDUCE_SUM_GRADIENTS`.
      ImportError: Keras 3 is not installed.
    """
    import keras  # noqa: F401, PLC0415  (not installed: ImportError, not a version error)

    return _internal("keras3_tf_optimizer")


def keras3_variable_index(optimizer, variable):
    """`variable`'s position in a built Keras 3 optimizer.

    Relies on `BaseOptimizer._get_variable_index`.

    Raises:
      KeyError: the optimizer was not built for `variable`.
    """
    _internal("keras3_tf_optimizer")
    return optimizer._get_variable_index(variable)  # noqa: SLF001


def keras3_num_variables(optimizer):
    """How many trainable variables a Keras 3 optimizer was built for.

    Relies on `BaseOptimizer._trainable_variables`.
    """
    _internal("keras3_tf_optimizer")
    return len(getattr(optimizer, "_trainable_variables", []))


_check_tensorflow_hooks()
