"""Variables that a traced step reaches by name, not by a passed handle: those on the
parameter servers, and the workers' copies of per-worker variables.

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
`DistributedOptimizer` and for its own server state.

`per_worker_by_name(variable)` does the same for the copies of a per-worker variable:
each worker's copy (and the coordinator's) is a resource of one shared name, and a
traced step looks that name up on the worker that runs it, where TensorFlow would pass
the worker's handle with every call.

TensorFlow's internals used here (the variable classes, the variable constructor's
private arguments) are reached through tfgc._compat.
"""

import contextlib
import itertools
import uuid
import weakref
from typing import Iterator, Optional

import tensorflow as tf

from tfgc import _compat

# Names are unique per process; the token keeps two coordinators of one cluster apart.
_TOKEN = uuid.uuid4().hex[:12]
_SERIAL = itertools.count()


def by_name(variable: tf.Variable) -> tf.Variable:
    """`variable` as a `NamedServerVariable` if it is a plain variable on a parameter
    server (or in ParameterServerStrategy's `CachingVariable` wrapper, which then
    wraps the named one); any other variable as it is."""
    if isinstance(variable, _compat.CachingVariable):  # type: ignore[arg-type]  # a class the fence resolves at import
        wrapped = _compat.caching_variable_inner(variable)
        inner = by_name(wrapped)
        return variable if inner is wrapped else _NamedCachingVariable(inner)
    if type(variable) is _compat.UnliftedInitializerVariable:  # noqa: E721 (exact)
        # Made while a tf.function traced its first call (tf_keras builds optimizers
        # and tfgc its server state in the first step). Made in tf.init_scope, it holds
        # its value already and is copied as a plain one; made in the traced graph, its
        # value is set only when the function runs, and it stays as it is.
        if not tf.executing_eagerly():
            return variable
    elif type(variable) is not _compat.ResourceVariable:  # noqa: E721 (exact)
        return variable
    if "/job:ps" not in (variable.device or ""):
        return variable
    return NamedServerVariable(variable)


class NamedServerVariable(_compat.ResourceVariable):  # type: ignore[misc,valid-type]  # a class the fence resolves at import
    """A copy of a parameter-server variable whose resource has a name (see the module).

    Args:
      variable: the variable to copy (its value, device, name and settings); it is
        left as it is and can be dropped.
      resource_name: the resource's name on its device: one that the copies of a
        per-worker variable share, one on each worker (see `per_worker_by_name`);
        default: a name of its own.
    """

    def __init__(self, variable: tf.Variable,  # pylint: disable=super-init-not-called
                 resource_name: Optional[str] = None) -> None:
        name = variable.name.split(":")[0]
        self._resource_name = resource_name or _unique_resource_name(name)
        device = variable.device
        with tf.init_scope(), tf.device(device):
            handle = tf.raw_ops.VarHandleOp(
                dtype=variable.dtype, shape=variable.shape, shared_name=self._resource_name,
                name=name)
            # Read and assigned on the server: the value does not travel.
            tf.raw_ops.AssignVariableOp(
                resource=handle,
                value=tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype))
        _compat.set_parent_trackable(handle, self)
        _compat.init_variable_from_handle(self, handle, variable,
                                          unique_id=self._resource_name, handle_name=name)
        # A named resource outlives its handles unless it is destroyed; a worker's copy
        # of a per-worker variable on an executor of its own (see _Deleter).
        self._deleter = _Deleter(handle, device, synchronous=resource_name is not None)
        self._graph_handles = _GraphHandles(self._resource_name, self.dtype, self.shape,
                                            device=device)

    @property
    def handle(self) -> tf.Tensor:
        graph = tf.compat.v1.get_default_graph()
        if (tf.executing_eagerly() or not _compat.is_function_graph(graph)
                or _compat.in_save_context()):
            return _compat.resource_handle(self)
        return self._graph_handles(graph)

    @property
    def device(self) -> str:
        # The server's, also inside a cond or loop body (where `handle` is a capture).
        return _compat.resource_handle(self).device


def per_worker_by_name(variable: tf.Variable) -> tf.Variable:
    """`variable`, a per-worker variable of ParameterServerStrategy, with each worker's
    copy a named resource that a traced function looks up on the worker running it:
    TensorFlow would pass the worker's handle with every call instead (~90 bytes per
    variable and call). Any other variable is returned as it is."""
    resource_name = _unique_resource_name(variable.name.split(":")[0])
    return _compat.name_per_worker_copies(
        variable,
        named_copy=lambda created: NamedServerVariable(created, resource_name=resource_name),
        # No device: the lookup runs where the function does, on the dispatching worker.
        graph_handle=_GraphHandles(resource_name, variable.dtype, variable.shape, device=None))


def _unique_resource_name(name):
    return f"tfgc_{_TOKEN}_{next(_SERIAL)}_{name}"


class _GraphHandles:
    """A named resource's handle in each traced function: one `VarHandleOp` per
    function graph, made in the outermost function graph it is nested in (so that every
    use in one traced step is one tensor, which orders them) and captured by the inner
    ones (a cond or loop body).

    Args:
      resource_name, dtype, shape: the resource's.
      device: where to look it up; None: where the function runs.
    """

    def __init__(self, resource_name, dtype, shape, device):
        self._resource_name, self._dtype, self._shape = resource_name, dtype, shape
        self._device = device
        self._handles = weakref.WeakKeyDictionary()  # function graph -> handle

    def __call__(self, graph):
        if graph not in self._handles:
            self._handles[graph] = self._handle_in(graph)
        return self._handles[graph]

    def _handle_in(self, graph):
        outer = graph.outer_graph
        if _compat.is_function_graph(outer):
            return graph.capture(self(outer))
        with graph.as_default(), tf.control_dependencies(None), tf.device(self._device):
            handle = tf.raw_ops.VarHandleOp(
                dtype=self._dtype, shape=self._shape, shared_name=self._resource_name)
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


class _NamedCachingVariable(_compat.CachingVariable):  # type: ignore[misc,valid-type]  # a class the fence resolves at import
    """ParameterServerStrategy's wrapper around a `NamedServerVariable`.

    The wrapper inherits `BaseResourceVariable`'s methods (`scatter_add` and others)
    and finds `_handle` on the wrapped variable: there it is the eager handle, which a
    traced step would capture and pass, a second handle for one resource that orders
    nothing with the named one. Here it is the wrapped variable's `handle`, the named
    one inside a traced step.
    """

    @property
    def _handle(self):
        return _compat.caching_variable_inner(self).handle


class _Deleter:
    """Destroys a named resource when its variable is collected (as TensorFlow's
    `EagerResourceDeleter`), quietly when its task is gone already: a cluster that
    shut down took the resource with it.

    Args:
      handle, device: the resource's eager handle and its device.
      synchronous: destroy it on an executor of its own, where a failure ends there.
        A worker's copy of a per-worker variable needs it: it is collected when the
        worker restarts (the copy on the dead process is replaced), in whichever thread
        the garbage collector runs, and on a coordinator's worker thread (an
        asynchronous executor) the failed destroy would fail that worker's next steps.
    """

    __slots__ = ["_resource", "_device", "_context", "_synchronous"]

    def __init__(self, handle, device, synchronous=False):
        self._resource, self._device = handle, device
        self._context = _compat.eager_context()  # kept alive until the op below has run
        self._synchronous = synchronous

    def __del__(self):
        try:
            with (_compat.eager_mode(), tf.device(self._device),
                  _compat.synchronous_executor() if self._synchronous
                  else contextlib.nullcontext()):
                tf.raw_ops.DestroyResourceOp(resource=self._resource, ignore_lookup_error=True)
        except (tf.errors.OpError, TypeError, AttributeError):
            pass  # the task is gone, or so is the interpreter's state at exit


@contextlib.contextmanager
def created_by_name() -> Iterator[None]:
    """Plain parameter-server variables created inside are `NamedServerVariable`s
    (where `by_name` names variables at all)."""

    def creator(next_creator, **kwargs):
        return by_name(next_creator(**kwargs))

    with tf.variable_creator_scope(creator):
        yield
