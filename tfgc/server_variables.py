"""Parameter-server variables that a traced step reaches by name, not by a passed handle.

TensorFlow passes every resource that a step's parameter-server part touches as an
argument of the remote function call: one ~87-byte remote handle per variable and
step (a ResNet-20 with momentum: ~120 of them, 10 KB of every push). A variable made
here holds a resource with a name of its own on its server. Inside a traced function
its `handle` is a `VarHandleOp` of that name placed on the server, made once per
function graph: the server finds the resource itself, so nothing crosses for it.
Eager code (the coordinator: initial values, checkpoints, `get_weights`) and
SavedModel exports use the handle as any variable does.

`by_name(variable)` turns a plain variable on a parameter server into one; tfgc does
so for the variables made in `tfgc.compressed_pulls()` (the masters of the pulled
weights, and the others, such as batch-norm statistics), for the slots of a tf_keras
`DistributedOptimizer` and for its own server state. `TFGC_NAMED_SERVER_VARIABLES=0`
in the coordinator's environment turns it off (every handle crosses, as TensorFlow
does it).
"""

import contextlib
import os
import uuid
import weakref

import tensorflow as tf
from tensorflow.python.distribute import ps_values
from tensorflow.python.eager import context
from tensorflow.python.framework import func_graph, ops
from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops
from tensorflow.python.saved_model import save_context

# Names are unique per process; the token keeps two coordinators of one cluster apart.
_TOKEN = uuid.uuid4().hex[:12]


def by_name(variable):
    """`variable` as a `NamedServerVariable` if it is a plain variable on a parameter
    server (or in ParameterServerStrategy's `CachingVariable` wrapper, which then
    wraps the named one); any other variable as it is."""
    if os.environ.get("TFGC_NAMED_SERVER_VARIABLES", "1") == "0":
        return variable  # turned off: every handle crosses, as TensorFlow does it
    if isinstance(variable, ps_values.CachingVariable):
        inner = by_name(variable.get())
        return variable if inner is variable.get() else _NamedCachingVariable(inner)
    if type(variable) is not resource_variable_ops.ResourceVariable:  # noqa: E721 (exact)
        return variable
    if "/job:ps" not in (variable.device or ""):
        return variable
    return NamedServerVariable(variable)


class NamedServerVariable(resource_variable_ops.ResourceVariable):
    """A copy of a parameter-server variable whose resource has a name (see the module).

    Args:
      variable: the variable to copy (its value, device, name and settings); it is
        left as it is and can be dropped.
    """

    def __init__(self, variable):  # pylint: disable=super-init-not-called
        name = variable.name.split(":")[0]
        self._resource_name = f"tfgc_{_TOKEN}_{ops.uid()}_{name}"
        device = variable.device
        with ops.init_scope(), ops.device(device):
            handle = gen_resource_variable_ops.var_handle_op(
                dtype=variable.dtype, shape=variable.shape, shared_name=self._resource_name,
                name=name)
            # Read and assigned on the server: the value does not travel.
            gen_resource_variable_ops.assign_variable_op(
                handle, gen_resource_variable_ops.read_variable_op(variable.handle,
                                                                   variable.dtype))
        handle._parent_trackable = weakref.ref(self)  # pylint: disable=protected-access
        resource_variable_ops.BaseResourceVariable.__init__(
            self, trainable=variable.trainable, shape=variable.shape, dtype=variable.dtype,
            handle=handle, constraint=variable.constraint,
            synchronization=variable.synchronization, aggregation=variable.aggregation,
            distribute_strategy=variable._distribute_strategy,  # pylint: disable=protected-access
            unique_id=self._resource_name, handle_name=name, in_graph_mode=False)
        # A named resource outlives its handles unless it is destroyed.
        self._deleter = _Deleter(handle, device)
        self._graph_handles = weakref.WeakKeyDictionary()  # function graph -> handle

    @property
    def handle(self):
        graph = ops.get_default_graph()
        if (tf.executing_eagerly() or not isinstance(graph, func_graph.FuncGraph)
                or save_context.in_save_context()):
            return self._handle
        if graph not in self._graph_handles:
            self._graph_handles[graph] = self._handle_in(graph)
        return self._graph_handles[graph]

    def _handle_in(self, graph):
        """The handle for `graph`: made in the outermost function graph it is nested in
        (so that every use in one traced step is one tensor, which orders them) and
        captured by the inner ones (a cond or loop body)."""
        outer = graph.outer_graph
        if isinstance(outer, func_graph.FuncGraph):
            with outer.as_default():
                outer_handle = self.handle
            return graph.capture(outer_handle)
        with ops.control_dependencies(None), ops.device(self._handle.device):
            handle = gen_resource_variable_ops.var_handle_op(
                dtype=self.dtype, shape=self.shape, shared_name=self._resource_name)
        # A VarHandleOp is stateful without a resource input, so TensorFlow's automatic
        # control dependencies would chain it after the step's earlier stateful ops
        # (asserts, other handles): every named variable's first use would wait for
        # them, which serializes the updates on the server and changed how two
        # asynchronous workers' updates interleave (ResNet-20 trained worse). Making
        # a handle needs no order.
        manager = getattr(graph, "experimental_acd_manager", None)
        if manager is not None:
            manager.run_independently(handle.op)
        return handle


class _NamedCachingVariable(ps_values.CachingVariable):
    """ParameterServerStrategy's wrapper around a `NamedServerVariable`.

    The wrapper inherits `BaseResourceVariable`'s methods (`scatter_add` and others)
    and finds `_handle` on the wrapped variable: there it is the eager handle, which a
    traced step would capture and pass, a second handle for one resource that orders
    nothing with the named one. Here it is the wrapped variable's `handle`, the named
    one inside a traced step.
    """

    @property
    def _handle(self):
        return self._v.handle


class _Deleter:
    """Destroys a named resource when its variable is collected (as TensorFlow's
    `EagerResourceDeleter`), quietly when its server is gone already: a cluster that
    shut down took the resource with it."""

    __slots__ = ["_handle", "_device", "_context"]

    def __init__(self, handle, device):
        self._handle, self._device = handle, device
        self._context = context.context()  # kept alive until the op below has run

    def __del__(self):
        try:
            with context.eager_mode(), ops.device(self._device):
                gen_resource_variable_ops.destroy_resource_op(self._handle,
                                                              ignore_lookup_error=True)
        except (tf.errors.OpError, TypeError, AttributeError):
            pass  # the server is gone, or so is the interpreter's state at exit


@contextlib.contextmanager
def created_by_name():
    """Plain parameter-server variables created inside are `NamedServerVariable`s
    (where `by_name` names variables at all)."""

    def creator(next_creator, **kwargs):
        return by_name(next_creator(**kwargs))

    with tf.variable_creator_scope(creator):
        yield
