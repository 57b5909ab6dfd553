"""tfgc._compat's TensorFlow hooks, probed when this module is imported (TensorFlow is
loaded by then, so it costs nothing) except those marked otherwise."""
import contextlib
import inspect
import weakref

from tfgc._compat._registry import (
    _hook, _internal, _method, _module, _resolved, check_at_import, missing)

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
# (tfgc.ps.variables.PulledVariable); the probe above checks that TensorFlow still has them.
RESOURCE_VARIABLE_OVERRIDES = ("_read_variable_op", "_dense_var_to_tensor",
                               "_export_to_saved_model_graph",
                               "_gather_saveables_for_checkpoint")


@_hook("ResourceVariable", "tensorflow",
       "tensorflow.python.ops.resource_variable_ops.ResourceVariable (the exact class of a "
       "plain tf.Variable, subclassed by tfgc.ps.server_variables.NamedServerVariable)")
def _probe_resource_variable():
    return _module("tensorflow.python.ops.resource_variable_ops").ResourceVariable


@_hook("UnliftedInitializerVariable", "tensorflow",
       "tensorflow.python.eager.polymorphic_function.polymorphic_function."
       "UnliftedInitializerVariable (what tf.Variable makes while a tf.function traces its "
       "first call, also in tf.init_scope)")
def _probe_unlifted_initializer_variable():
    return _module("tensorflow.python.eager.polymorphic_function.polymorphic_function"
                   ).UnliftedInitializerVariable


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


@_hook("in_xla_context", "tensorflow",
       "tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext (true while "
       "a tf.function(jit_compile=True) traces, also in functions it calls)")
def _probe_in_xla_context():
    return _module("tensorflow.python.ops.control_flow_util").GraphOrParentsInXlaContext


@_hook("eager_context", "tensorflow",
       "tensorflow.python.eager.context.context and context.eager_mode")
def _probe_eager_context():
    context = _module("tensorflow.python.eager.context")
    return context.context, context.eager_mode


@_hook("synchronous_executor", "tensorflow",
       "tensorflow.python.eager.executor.new_executor and pywrap_tfe's "
       "TFE_ContextGet/SetExecutorForThread")
def _probe_synchronous_executor():
    executor = _module("tensorflow.python.eager.executor")
    _method(executor.Executor, "clear_error")
    _method(executor.Executor, "handle")
    pywrap_tfe = _module("tensorflow.python.pywrap_tfe")
    context = _module("tensorflow.python.eager.context")
    _method(context.Context, "ensure_initialized")
    return (executor.new_executor, pywrap_tfe.TFE_ContextGetExecutorForThread,
            pywrap_tfe.TFE_ContextSetExecutorForThread, context.context)


@_hook("merge_calls", "tensorflow",
       "tf.__internal__.distribute.strategy_supports_no_merge_call, "
       "tf.__internal__.distribute.interim.maybe_merge_call and "
       "tf.__internal__.smart_cond.smart_cond (how Keras's optimizers and loss-scale "
       "optimizers leave replica context and take a condition there)")
def _probe_merge_calls():
    import tensorflow as tf  # noqa: PLC0415

    internal = tf.__internal__
    return (internal.distribute.strategy_supports_no_merge_call,
            internal.distribute.interim.maybe_merge_call, internal.smart_cond.smart_cond)


@_hook("ps_num_workers", "tensorflow",
       "the `_num_workers` attribute of ParameterServerStrategy")
def _probe_ps_num_workers():
    return None  # an instance attribute: checked at each use


@_hook("PerWorkerVariable", "tensorflow",
       "tensorflow.python.distribute.ps_values.PerWorkerVariable: its `handle`, "
       "_maybe_create_per_worker_vars, and the `_var_creator` (what each worker runs to "
       "make its copy) and `_coordinator_instance` its constructor sets")
def _probe_per_worker_variable():
    per_worker = _module("tensorflow.python.distribute.ps_values").PerWorkerVariable
    _method(per_worker, "_maybe_create_per_worker_vars")
    constructor = inspect.getsource(per_worker.__init__)
    for attribute in ("_var_creator", "_coordinator_instance"):
        if f"self.{attribute} =" not in constructor:
            raise LookupError(f"PerWorkerVariable.__init__ sets no {attribute}")
    return per_worker


BaseResourceVariable = None  # set below, from the probes
ResourceVariable = None
UnliftedInitializerVariable = None
ShardedVariable = None
CachingVariable = None
VARIABLE_VALUE_KEY = None
Trackable = None


def _check_tensorflow_hooks():
    """Probes every TensorFlow hook (at import) and binds the constants."""
    check_at_import("tensorflow")
    globals().update({name: _resolved[name] for name in (
        "BaseResourceVariable", "ResourceVariable", "UnliftedInitializerVariable",
        "ShardedVariable", "CachingVariable", "VARIABLE_VALUE_KEY", "Trackable")})


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


def in_xla_context(graph):
    """Whether ops made in `graph` now will be compiled by XLA (a tf.function with
    `jit_compile=True` is tracing, or one it calls).

    Relies on `tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`.
    """
    return bool(_resolved["in_xla_context"](graph))


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


@contextlib.contextmanager
def synchronous_executor():
    """A context manager that runs its body's eager ops on a synchronous executor of
    their own: an op's error is raised there and then, not kept by the thread's
    (ParameterServerStrategy: asynchronous) executor to fail the thread's next ops, and
    the executor forgets it at the end (it would raise it again when collected).

    The thread's executor is swapped by its raw handle, not through
    `context.executor_scope`: that wraps the thread's executor in a Python `Executor`
    whose collection waits on it, and at exit, with the cluster's servers gone, that
    wait raises (one "Exception ignored" traceback per destroyed variable).

    Relies on `tensorflow.python.eager.executor.new_executor` (and its executors'
    `clear_error` and `handle`), and pywrap_tfe's `TFE_ContextGetExecutorForThread` and
    `TFE_ContextSetExecutorForThread`.
    """
    new_executor, get_for_thread, set_for_thread, eager_context = _resolved[
        "synchronous_executor"]
    context = eager_context()
    context.ensure_initialized()
    handle = context._context_handle  # noqa: SLF001 (what Context.executor passes)
    previous = get_for_thread(handle)
    executor = new_executor(enable_async=False)
    set_for_thread(handle, executor.handle())
    try:
        yield
    finally:
        set_for_thread(handle, previous)
        executor.clear_error()


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


def strategy_supports_no_merge_call():
    """Whether the strategy in scope runs an optimizer's update in replica context
    (without `merge_call`): no strategy, or XLA on GPUs.

    Relies on `tf.__internal__.distribute.strategy_supports_no_merge_call`.
    """
    return _resolved["merge_calls"][0]()


def maybe_merge_call(fn, strategy, *args, **kwargs):
    """`fn(strategy, *args, **kwargs)` from replica context, through `merge_call` where
    the strategy needs it (as Keras's optimizers apply gradients).

    Relies on `tf.__internal__.distribute.interim.maybe_merge_call`.
    """
    return _resolved["merge_calls"][1](fn, strategy, *args, **kwargs)


def smart_cond(pred, true_fn, false_fn):
    """`tf.cond`, or the branch itself where `pred` is known while tracing.

    Relies on `tf.__internal__.smart_cond.smart_cond`.
    """
    return _resolved["merge_calls"][2](pred, true_fn, false_fn)


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


def name_per_worker_copies(variable, named_copy, graph_handle):
    """Makes a traced function reach each worker's copy of a per-worker variable by name.

    TensorFlow's per-worker variable captures the dispatching worker's handle at each
    access in a traced function (each read, each write), and the coordinator sends every
    capture with every call: ~280 bytes each (40 reads: 11.6 KB a call; a local-steps
    step of ResNet-20 sent 113 KB). Here each worker's copy is made by
    `named_copy(created)`, a resource with a name shared by all workers' copies, and a
    traced function's `handle` is `graph_handle(graph)`, a lookup of that name on the
    worker that runs the function: nothing crosses per call. One handle per variable and
    graph also orders the variable's reads and writes. Other variables are returned as
    they are.

    TensorFlow re-runs the creator for a restarted worker, so its copies are made and
    named again (from their initial values, as TensorFlow's). The coordinator's own
    instance is named too: a function traced and run on the coordinator (a
    checkpoint's save or restore) finds it there, as TensorFlow's handle gives it.

    Relies on `PerWorkerVariable.handle`, its `_var_creator` (what each worker runs to
    make its copy), `_coordinator_instance` and `_maybe_create_per_worker_vars`.
    """
    per_worker = _resolved["PerWorkerVariable"]
    if type(variable) is not per_worker:
        return variable
    creator = variable._var_creator  # noqa: SLF001
    variable._var_creator = lambda: named_copy(creator())  # noqa: SLF001
    variable._coordinator_instance = named_copy(variable._coordinator_instance)  # noqa: SLF001
    variable.__dict__["_tfgc_graph_handle"] = graph_handle
    variable.__class__ = _named_copies_class(per_worker)
    return variable


def per_worker_variable_of(strategy, make_copy):
    """A per-worker variable of ParameterServerStrategy whose copies `make_copy` makes.

    `make_copy(index)` makes the copy of the worker of that index (and, with index 0,
    the coordinator's instance, which a trace sees); it may place the copy anywhere, e.g.
    on a parameter server, where an op of a traced step reads the dispatching worker's
    copy without the worker sending it. A traced function's `handle` is the dispatching
    worker's copy, passed with each call (read it once per trace). TensorFlow re-runs
    `make_copy` for a restarted worker, so its copy starts again from its initial value.

    Relies on `PerWorkerVariable(strategy, next_creator)`, which runs `next_creator`
    once on the coordinator and once per worker in the coordinator's dispatch context
    for that worker (`coordinator_context.get_current_dispatch_context`).
    """
    dispatch_context = _module(
        "tensorflow.python.distribute.coordinator.coordinator_context"
    ).get_current_dispatch_context

    def creator(**_):
        context = dispatch_context()
        return make_copy(context.worker_index if context is not None else 0)

    return _resolved["PerWorkerVariable"](strategy, creator)


_NAMED_COPIES_CLASSES: dict = {}


def _named_copies_class(per_worker):
    """The subclass of `per_worker` whose graph handle is a lookup by name."""
    if per_worker not in _NAMED_COPIES_CLASSES:

        class NamedCopiesPerWorkerVariable(per_worker):
            @property
            def handle(self):
                tf = _module("tensorflow")
                if tf.executing_eagerly() or in_save_context():
                    return super().handle  # the coordinator's instance, as TensorFlow's
                self._maybe_create_per_worker_vars()  # noqa: SLF001
                return self._tfgc_graph_handle(tf.compat.v1.get_default_graph())

        _NAMED_COPIES_CLASSES[per_worker] = NamedCopiesPerWorkerVariable
    return _NAMED_COPIES_CLASSES[per_worker]


_check_tensorflow_hooks()
