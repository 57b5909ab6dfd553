"""3LC's compressed model pulls: variables that workers read from a local cache.

A parameter server holds each model variable (the *master*). A worker does not read
the master on every step; it keeps a *cache* of it and, before its first read in a
step, pulls the compressed difference:

    on the PS:      delta = master - snapshot[w]        (what worker w has not seen)
                    payload = encode(delta)
                    snapshot[w] += decode(payload)
    on worker w:    cache += decode(payload)

Only the payload crosses PS -> worker. `snapshot[w]` always equals worker w's cache, so
what one pull leaves out stays in the next delta: this is 3LC's error accumulation for
pulls, kept per worker because ParameterServerStrategy runs workers asynchronously.
A worker whose caches are new (first step, or a restarted worker whose per-worker
variables were recreated) first does one full pull (tfgc.ps.pull), so it never
diverges.

The variables one parameter server hosts are pulled together, in one fused message
per step with one worker index and one full/delta decision (tfgc.ps.pull).

Gradients are taken with respect to the cache, and `DistributedOptimizer` applies them
to the master (pushed compressed as usual).

`tfgc.compressed_pulls()` around model construction makes a Keras model's own weights
this way, and `tfgc.get_variable` the variables one creates oneself; the scope's
`CompressedPulls` (tfgc.ps.pulls) owns them, decides their codec and starts their pulls.
Until their pulls start, reads go to the master uncompressed. With local steps
(tfgc.local_steps) a worker's cache holds its own steps between meetings, so an
evaluation or prediction step reads the master.
Under ParameterServerStrategy the cache is a per-worker variable; with no strategy
the same mechanism runs in one process (one worker) so accuracy can be studied
locally. Under all-reduce strategies there are no pulls and variables are created
as usual.
"""
import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Union

import tensorflow as tf

from tfgc import _compat
from tfgc.ps import moving_statistics, server_variables
from tfgc.codecs import base
from tfgc.distribute import is_parameter_server, local_variable, zeros_of

if TYPE_CHECKING:
    import numpy as np

    from tfgc.ps.pulls import CompressedPulls
    from tfgc.ps.pull import ParameterServerPull

_state = threading.local()  # set while tfgc creates variables that are no model's


def creating_buffers() -> bool:
    """Whether tfgc is creating its own buffers (no scope turns them into pulled ones)."""
    return getattr(_state, "creating_buffers", False)


@contextlib.contextmanager
def buffers() -> Iterator[None]:
    """A scope in which the variables made are tfgc's own, left as they are."""
    previous = creating_buffers()
    _state.creating_buffers = True
    try:
        yield
    finally:
        _state.creating_buffers = previous


def pulled(master: tf.Variable, min_elements: int, batch_norm_on_server: bool,
           owner: "CompressedPulls") -> tf.Variable:
    """`master` as a model variable of a `compressed_pulls` scope: a `PulledVariable`
    owned by `owner` (a tfgc.ps.pulls.CompressedPulls) where it is pulled, else itself."""
    strategy = tf.distribute.get_strategy()
    if isinstance(master, _compat.ShardedVariable):  # type: ignore[arg-type]  # a class the fence resolves at import
        # A `variable_partitioner` split it over parameter servers: each shard is
        # pulled like a variable of its own, by the group of its server.
        shards = [pulled(shard, min_elements, batch_norm_on_server, owner)
                  for shard in master.variables]
        container = _compat.ShardedVariable(shards, name=master.name.split(":")[0])
        for shard in shards:
            # The optimizer groups its slots by the masters' container: make it this one.
            _compat.set_sharded_container(getattr(shard, "master", shard), container)
        return container
    if tf.distribute.has_strategy() and not is_parameter_server(strategy):
        return master  # all-reduce strategies: every replica holds the model, no pulls
    # Named on its server: the server's part of a step reaches it without a handle
    # crossing (batch-norm statistics too, which Keras writes on every step).
    master = server_variables.by_name(master)
    if not (master.trainable and master.dtype.is_floating):
        if batch_norm_on_server:  # Keras's batch-norm statistics: updated there
            moving_statistics.mark(master)
        return master
    if master.shape.num_elements() < min_elements:
        return master
    return PulledVariable(master, owner)


class PulledVariable(_compat.BaseResourceVariable):  # type: ignore[misc,valid-type]  # a class the fence resolves at import
    """A model variable read on workers from a cache kept up to date by compressed pulls.

    Eager reads (on the coordinator), assignments and checkpoints go to the master.
    Reads inside a traced replica function (a training or evaluation step) pull first
    and then read the cache; gradients of those reads flow to this variable, and
    `DistributedOptimizer` applies them to `master`.

    Attributes:
      master: the variable on the parameter server.
      cache: the worker's copy (a per-worker variable under ParameterServerStrategy).
      snapshots: on the master's server, one row per worker: what that worker's cache
        holds (a view of its pull group's buffer; None until pulls are enabled).
      synced: per worker, whether its cache has had its first full pull.
    """

    def __init__(self, master: tf.Variable,  # pylint: disable=super-init-not-called
                 owner: "CompressedPulls") -> None:
        # Like TF's own variable wrappers, this one holds no resource of its own.
        self._master = master
        per_worker = is_parameter_server(tf.distribute.get_strategy())
        base_name = master.name.split(":")[0]
        with buffers():
            self.cache = local_variable(zeros_of(master.shape, master.dtype),
                                        f"{base_name}/pull_cache", per_worker)
        self._codec: Optional[base.Codec] = None
        self._group: Optional["ParameterServerPull"] = None  # the tfgc.ps.pull.ParameterServerPull that pulls this variable
        self._owner = owner
        owner.add(self)
        # graph -> (cache handle, pull op)
        self._pulled: "weakref.WeakKeyDictionary[tf.Graph, tuple[tf.Tensor, Optional[tf.Operation]]]" = (
            weakref.WeakKeyDictionary())

    @property
    def master(self) -> tf.Variable:
        return self._master

    @property
    def owner(self) -> "CompressedPulls":
        """The tfgc.ps.pulls.CompressedPulls that starts and counts this variable's pulls."""
        return self._owner

    @property
    def pull_codec(self) -> Optional[base.Codec]:
        return self._codec

    @property
    def snapshots(self) -> Optional[tf.Tensor]:
        """[workers, *shape]: what each worker's cache holds, read from the server."""
        return None if self._group is None else self._group.snapshots_of(self)

    @property
    def synced(self) -> Optional[tf.Variable]:
        """Per worker, whether its cache has had its first full pull (shared by the
        variables pulled together); None until compressed pulls are enabled."""
        return None if self._group is None else self._group.synced

    def enable_compressed_pulls(self, codec: base.Codec, group: "ParameterServerPull") -> None:
        """Makes reads in replica functions pull through `codec` (done by its owner).

        Args:
          codec: the `tfgc.codecs.Codec` for this variable's deltas.
          group: the `tfgc.ps.pull.ParameterServerPull` that pulls this variable with the
            others its parameter server hosts, in one message per step.
        """
        if not isinstance(codec, base.Codec):
            raise TypeError(f"pull codec must be a tfgc codec, got {type(codec).__name__}")
        self._codec, self._group = codec, group

    # --- where reads go -------------------------------------------------------------

    def _reads_cache(self):
        in_step = (
            not tf.executing_eagerly()
            and not tf.distribute.in_cross_replica_context()
            # A SavedModel export traces the model to serve it: from the master.
            and not _compat.in_save_context()
        )
        if in_step and self._codec is None:
            self._owner.start_at_first_read()
        if in_step and self._owner.local_step is not None and _compat.tf_keras_inference_call():
            # With local steps the cache holds the worker's own steps since it last met
            # the servers: an evaluation reads the master (fp32), and leaves the round be.
            return False
        return in_step and self._codec is not None

    def _cache_state(self):
        """(cache handle, pull op) of the current graph; the pull is added on first use."""
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._pulled:
            # One handle per graph: the tape watches and differentiates this tensor.
            handle = self.cache.handle
            self._pulled[graph] = (handle, None)  # a read while adding the pull: no pull
            self._pulled[graph] = (handle, self._owner.pull_in(graph, self._group))
        return self._pulled[graph]

    @property
    def handle(self) -> tf.Tensor:
        if self._reads_cache():
            return self._cache_state()[0]
        return self._master.handle

    def _read_variable_op(self, no_copy=False):
        del no_copy
        if not self._reads_cache():
            return self._master.value()
        handle, pull = self._cache_state()
        _compat.variable_accessed(self)
        with tf.control_dependencies([pull] if pull is not None else []):
            return tf.raw_ops.ReadVariableOp(resource=handle, dtype=self.dtype)

    def value(self) -> tf.Tensor:
        return self._read_variable_op()

    def read_value(self) -> tf.Tensor:
        return tf.identity(self._read_variable_op())

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        del name, as_ref
        if dtype is not None and not dtype.is_compatible_with(self.dtype):
            raise ValueError(
                f"Incompatible type conversion requested to type {dtype.name} for variable "
                f"of type {self.dtype.name}"
            )
        return self._read_variable_op()

    # --- the rest behaves as the master ---------------------------------------------

    def __getattr__(self, name):
        if name.startswith("_master"):
            raise AttributeError(name)
        return getattr(self._master, name)

    def assign(self, value: tf.Tensor, use_locking: Optional[bool] = None,
               name: Optional[str] = None, read_value: bool = True
               ) -> Optional[Union[tf.Variable, tf.Operation]]:
        return self._master.assign(value, use_locking, name, read_value)

    def assign_add(self, delta: tf.Tensor, use_locking: Optional[bool] = None,
                   name: Optional[str] = None, read_value: bool = True
                   ) -> Optional[Union[tf.Variable, tf.Operation]]:
        return self._master.assign_add(delta, use_locking, name, read_value)

    def assign_sub(self, delta: tf.Tensor, use_locking: Optional[bool] = None,
                   name: Optional[str] = None, read_value: bool = True
                   ) -> Optional[Union[tf.Variable, tf.Operation]]:
        return self._master.assign_sub(delta, use_locking, name, read_value)

    def sparse_read(self, indices: tf.Tensor, name: Optional[str] = None) -> tf.Tensor:
        return tf.gather(self.value(), indices, name=name)

    def numpy(self) -> "np.ndarray":
        return self._master.numpy()

    @property
    def initializer(self) -> tf.Operation:
        return self._master.initializer

    @property
    def initial_value(self) -> tf.Tensor:
        return self._master.initial_value

    @property
    def op(self) -> tf.Operation:
        return self._master.op

    @property
    def graph(self) -> tf.Graph:
        return self._master.graph

    @property
    def device(self) -> str:
        return self._master.device

    @property
    def shape(self) -> tf.TensorShape:
        return self._master.shape

    def get_shape(self) -> tf.TensorShape:
        return self._master.shape

    @property
    def dtype(self) -> tf.DType:
        return self._master.dtype

    @property
    def name(self) -> str:
        return self._master.name

    @property
    def trainable(self) -> bool:
        return self._master.trainable

    @property
    def synchronization(self) -> tf.VariableSynchronization:
        return self._master.synchronization

    @property
    def aggregation(self) -> tf.VariableAggregation:
        return self._master.aggregation

    @property
    def constraint(self) -> Optional[Callable[[tf.Tensor], tf.Tensor]]:
        return self._master.constraint

    def _should_act_as_resource_variable(self):
        """Passes resource_variable_ops.is_resource_variable."""

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        # A SavedModel holds the master; the per-worker cache is no part of the model.
        names = _compat.export_to_saved_model_graph(
            self._master, object_map, tensor_map, options, **kwargs)
        object_map[self] = object_map[self._master]
        return names

    def _gather_saveables_for_checkpoint(self):
        # Checkpoints hold the master; caches resynchronise with a full pull.
        return {_compat.VARIABLE_VALUE_KEY: self._master}

    def __repr__(self):
        return f"<PulledVariable of {self._master!r}>"

    def __array__(self, dtype=None):
        return self._master.__array__(dtype)


tf.register_tensor_conversion_function(
    PulledVariable, lambda var, dtype=None, name=None, as_ref=False:
    var._dense_var_to_tensor(dtype, name, as_ref)  # noqa: SLF001
)
