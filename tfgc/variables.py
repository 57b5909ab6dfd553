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
variables were recreated) first does one full fp32 pull, so it never diverges.

The variables one parameter server hosts are pulled together, in one fused message
per step with one worker index and one full/delta decision (tfgc.wire.pull).

Gradients are taken with respect to the cache, and `DistributedOptimizer` applies them
to the master (pushed compressed as usual).

Use `get_variable` for variables you create yourself, or `compressed_pulls()` around
model construction so that a Keras model's own weights are created this way. Pulls
are compressed with the `pull_compression` codec of the `DistributedOptimizer` that
builds with these variables, or, at the first traced step, of the one
`DistributedOptimizer` with `pull_compression` made under the same strategy and not yet
built; until then, reads go to the master uncompressed.
Under ParameterServerStrategy the cache is a per-worker variable; with no strategy
the same mechanism runs in one process (one worker) so accuracy can be studied
locally. Under all-reduce strategies there are no pulls and variables are created
as usual.
"""
import contextlib
import threading
import warnings
import weakref
from typing import Any, Iterator, Sequence

import tensorflow as tf

from tfgc import _compat, moving_statistics, server_variables
from tfgc.codecs import base
from tfgc.distribute import is_parameter_server, local_variable

_state = threading.local()  # set while this module creates its own buffers

# Per strategy: the PulledVariables made under it that pull nothing yet (in creation
# order), and the DistributedOptimizers with pull_compression made under it. The first
# traced read of such a variable lets the one optimizer start every one's pulls.
_not_started = weakref.WeakKeyDictionary()  # strategy -> [weakref to PulledVariable]
_pullers = weakref.WeakKeyDictionary()  # strategy -> WeakSet of optimizers


def register_puller(optimizer):
    """Lets `optimizer` (it has a pull_compression) start the pulls of the
    PulledVariables of the current strategy at their first traced read."""
    _pullers.setdefault(tf.distribute.get_strategy(), weakref.WeakSet()).add(optimizer)


def _start_pulls():
    """Has the current strategy's one pulling optimizer not yet built start the pulls of
    every PulledVariable made under the strategy (one group per parameter server).
    Nothing happens when there is no such optimizer, or more than one (then the
    optimizer that builds with the variables starts them). A built optimizer is left
    out: its variables are fixed, so a later model's belong to another optimizer (its
    construction reads them before that optimizer exists)."""
    strategy = tf.distribute.get_strategy()
    pullers = [p for p in _pullers.get(strategy, ()) if not p.built_compression]
    if len(pullers) != 1:
        return
    waiting = [v for v in (ref() for ref in _not_started.pop(strategy, ()))
               if v is not None and v.pull_codec is None]
    with tf.init_scope():  # its buffers are made outside the step being traced
        pullers[0].enable_pulls(waiting)


def get_variable(name: str, shape: Sequence[int], dtype: tf.DType = tf.float32,
                 initializer: Any = "glorot_uniform", trainable: bool = True) -> tf.Variable:
    """Creates a model variable whose pulls from its parameter server can be compressed.

    Same arguments as `Layer.add_weight`. Call it inside `strategy.scope()`: the master
    is placed on a parameter server as any variable, and its per-worker snapshots on
    the same server, its cache on each worker. Trainable floating variables get these
    buffers whatever their size; others are returned as plain variables.

    Args:
      name: variable name.
      shape: fully defined shape.
      dtype: variable dtype.
      initializer: a Keras initializer, its name, or a callable (shape, dtype) -> tensor.
      trainable: whether gradients update it.

    Returns:
      A `PulledVariable` (usable wherever a tf.Variable is), or a tf.Variable when the
      variable is not trainable, not floating, or the strategy has no pulls.
    """
    import tf_keras

    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise ValueError(f"get_variable needs a fully defined shape, got {shape}")
    init = tf_keras.initializers.get(initializer)
    master = tf.Variable(
        lambda: init(shape, dtype), dtype=dtype, name=name, trainable=trainable
    )
    return _maybe_pulled(master, min_elements=0, batch_norm_on_server=True)


@contextlib.contextmanager
def compressed_pulls(min_elements: int = 0,
                     batch_norm_on_server: bool = True) -> Iterator[None]:
    """Creates the trainable variables made in this scope as `PulledVariable`s.

    Enter it inside `strategy.scope()` around model construction:

        with strategy.scope(), tfgc.compressed_pulls():
            model = make_model()

    Args:
      min_elements: smaller variables stay plain variables, read from their server as
        they are on every step. By default every trainable floating variable is
        pulled, in one message per server and step: those the optimizer compresses
        with `pull_compression`, the small ones (biases, batch norm; below the
        optimizer's `min_elements`) with its small-tensor codec, as its pushes.
      batch_norm_on_server: under ParameterServerStrategy, update the moving statistics
        of the tf_keras batch-norm layers made in this scope on their server, where
        only the batch's statistics cross (tfgc.moving_statistics); False leaves them
        to Keras, which reads them to the worker and writes them back on every step.
        `tfgc.batch_norm_on_server(model, enabled)` switches it for a built model.
    """

    strategy = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and not is_parameter_server(strategy):
        warnings.warn(
            "tfgc.compressed_pulls() changes nothing under an all-reduce strategy (every "
            f"replica of {type(strategy).__name__} holds the model; nothing is pulled); "
            "it applies to ParameterServerStrategy and to single-process training",
            stacklevel=3)

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        if getattr(_state, "creating_buffers", False):
            return variable
        return _maybe_pulled(variable, min_elements, batch_norm_on_server)

    with tf.variable_creator_scope(creator):
        yield


def _maybe_pulled(master, min_elements, batch_norm_on_server):
    strategy = tf.distribute.get_strategy()
    if isinstance(master, _compat.ShardedVariable):
        # A `variable_partitioner` split it over parameter servers: each shard is
        # pulled like a variable of its own, by the group of its server.
        shards = [_maybe_pulled(shard, min_elements, batch_norm_on_server)
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
    return PulledVariable(master)


class PulledVariable(_compat.BaseResourceVariable):
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

    def __init__(self, master):  # pylint: disable=super-init-not-called
        # Like TF's own variable wrappers, this one holds no resource of its own.
        self._master = master
        per_worker = is_parameter_server(tf.distribute.get_strategy())
        base_name = master.name.split(":")[0]
        _state.creating_buffers = True
        try:
            self.cache = local_variable(tf.zeros(master.shape, master.dtype),
                                        f"{base_name}/pull_cache", per_worker)
        finally:
            _state.creating_buffers = False
        self._codec = None
        self._group = None  # the tfgc.wire.ParameterServerPull that pulls this variable
        _not_started.setdefault(tf.distribute.get_strategy(), []).append(weakref.ref(self))
        self._pulled = weakref.WeakKeyDictionary()  # graph -> (cache handle, pull op)

    @property
    def master(self):
        return self._master

    @property
    def pull_codec(self):
        return self._codec

    @property
    def snapshots(self):
        """[workers, *shape]: what each worker's cache holds, read from the server."""
        return None if self._group is None else self._group.snapshots_of(self)

    @property
    def synced(self):
        """Per worker, whether its cache has had its first full pull (shared by the
        variables pulled together); None until compressed pulls are enabled."""
        return None if self._group is None else self._group.synced

    def enable_compressed_pulls(self, codec, group):
        """Makes reads in replica functions pull through `codec` (done by the optimizer).

        Args:
          codec: the `tfgc.codecs.Codec` for this variable's deltas.
          group: the `tfgc.wire.ParameterServerPull` that pulls this variable with the
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
            _start_pulls()
        return in_step and self._codec is not None

    def _cache_state(self):
        """(cache handle, pull op) of the current graph; the pull is added on first use."""
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._pulled:
            # One handle per graph: the tape watches and differentiates this tensor.
            handle = self.cache.handle
            self._pulled[graph] = (handle, None)  # a read while adding the pull: no pull
            self._pulled[graph] = (handle, self._group.pull_op(graph))
        return self._pulled[graph]

    @property
    def handle(self):
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

    def value(self):
        return self._read_variable_op()

    def read_value(self):
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

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return self._master.assign(value, use_locking, name, read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return self._master.assign_add(delta, use_locking, name, read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return self._master.assign_sub(delta, use_locking, name, read_value)

    def sparse_read(self, indices, name=None):
        return tf.gather(self.value(), indices, name=name)

    def numpy(self):
        return self._master.numpy()

    @property
    def initializer(self):
        return self._master.initializer

    @property
    def initial_value(self):
        return self._master.initial_value

    @property
    def op(self):
        return self._master.op

    @property
    def graph(self):
        return self._master.graph

    @property
    def device(self):
        return self._master.device

    @property
    def shape(self):
        return self._master.shape

    def get_shape(self):
        return self._master.shape

    @property
    def dtype(self):
        return self._master.dtype

    @property
    def name(self):
        return self._master.name

    @property
    def trainable(self):
        return self._master.trainable

    @property
    def synchronization(self):
        return self._master.synchronization

    @property
    def aggregation(self):
        return self._master.aggregation

    @property
    def constraint(self):
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
