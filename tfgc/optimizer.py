"""DistributedOptimizer: compress gradients where they cross the wire (tf_keras optimizers).

Where the wire is depends on the strategy in scope when gradients are applied; the
wire is chosen once per step (see tfgc.wire):

* ParameterServerStrategy: each worker encodes its gradients (with error feedback kept
  on the worker) and packs all payloads bound for one parameter server into ONE fused
  uint8 message; the server's graph partition receives only that message, unpacks it
  against the layout both sides know and decodes locally.
* Mirrored / MultiWorkerMirroredStrategy (more than one replica): a `summable` codec's
  floating payload tensors are all-reduced in the compressed domain and decoded once;
  any other codec's payloads are all-gathered (padded to the longest) and every
  replica decodes and sums all of them.
* No strategy (one replica): gradients are encoded, fused, unpacked and decoded
  locally, so the effect of compression on accuracy can be studied on one machine.

Variables with fewer than `min_elements` elements (biases, batch norm) are not
compressed by the main codec: they travel in the fused message encoded by
`small_compression` (float16 by default; None sends them as they are), and are
all-reduced as they are under all-reduce strategies.
"""
import json
import warnings

import tensorflow as tf

from tfgc import codecs
from tfgc.codecs import base
from tfgc.distribute import (
    DEFAULT_MIN_ELEMENTS, dense_nbytes, is_parameter_server, local_variable, require_ops_on,
    worker_devices,
)
from tfgc.memory import ErrorFeedback, feedback_step
from tfgc.variables import PulledVariable
from tfgc.wire import ParameterServerPull, choose_wire
from tfgc.wire.wires import DEFAULT_BUCKET_BYTES

#: The codec of gradients below `min_elements`, unless the optimizer is given another.
DEFAULT_SMALL_COMPRESSION = "float16"
# Traffic is counted per direction and per variable: bytes on the wire, and the bytes of
# the dense tensors they replace.
DIRECTIONS = ("push", "pull")


def DistributedOptimizer(  # noqa: N802 (reads as a class at call sites, like Horovod's)
    optimizer,
    compression,
    pull_compression=None,
    min_elements=DEFAULT_MIN_ELEMENTS,
    error_feedback=True,
    small_compression=DEFAULT_SMALL_COMPRESSION,
    bucket_bytes=DEFAULT_BUCKET_BYTES,
):
    """Returns a copy of `optimizer` that compresses the gradients it applies.

    The result is an instance of a subclass of `optimizer`'s class, built from its
    config, so hyperparameters, `iterations` and `learning_rate` behave as the inner
    optimizer's. Wrap an optimizer before training: its slots are not copied.

    Args:
      optimizer: a tf_keras optimizer (`tf_keras.optimizers.Optimizer`), or a Keras 3
        optimizer for single-process and all-reduce training (see
        tfgc.keras3_optimizer).
      compression: a `tfgc.codecs.Codec` for gradients.
      pull_compression: a codec for model pulls from parameter servers (3LC): the
        variables this optimizer builds with that were created by
        `tfgc.get_variable` or under `tfgc.compressed_pulls()` are read on workers
        from caches updated by compressed deltas (see tfgc.variables).
      min_elements: variables with fewer elements are not compressed by
        `compression` (3LC's rule): they go with `small_compression`.
      error_feedback: keep each compressed variable's residual (3LC's error
        accumulation) on the worker that produced it.
      small_compression: the codec of gradients below `min_elements` on fused wires
        (parameter servers, one process): "float16" (the default: `Cast("float16")`,
        which saturates instead of overflowing), a `tfgc.codecs.Codec`, or None to
        send them as they are. All-reduce strategies sum them as they are.
      bucket_bytes: under all-reduce strategies, about how many bytes one collective
        carries (gradients are packed into buckets; default 25 MiB, as PyTorch DDP).

    Raises:
      TypeError: `optimizer` is not a Keras optimizer or `compression` not a codec.
      NotImplementedError: a Keras 3 optimizer with `pull_compression`, or one without
        the hook tfgc relies on.
    """
    if isinstance(optimizer, CompressingBase):
        raise TypeError(
            f"{type(optimizer).__name__} is already a DistributedOptimizer; wrap the inner "
            "optimizer once")
    try:
        import tf_keras  # only tf_keras users need it installed
    except ImportError:
        tf_keras = None
    name = type(optimizer).__name__
    if tf_keras is not None and isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
        raise TypeError(
            f"{name} is a legacy tf_keras optimizer ({type(optimizer).__module__}); tfgc "
            f"wraps tf_keras's current ones: use tf_keras.optimizers.{name}(...) with the "
            f"same arguments (under TF_USE_LEGACY_KERAS=1: tf.keras.optimizers.{name})")
    if tf_keras is not None and isinstance(optimizer, tf_keras.optimizers.Optimizer):
        make_class = distributed_class
    elif any(c.__module__.startswith("keras.") for c in type(optimizer).__mro__):
        from tfgc.keras3_optimizer import keras3_distributed_class  # noqa: PLC0415

        make_class = keras3_distributed_class
    else:
        raise TypeError(
            f"expected a tf_keras or Keras 3 optimizer, got {type(optimizer).__module__}.{name}")
    small_compression = _small_codec(small_compression)
    for what, codec in (("compression", compression), ("pull_compression", pull_compression),
                        ("small_compression", small_compression)):
        if codec is not None and not isinstance(codec, base.Codec):
            raise TypeError(f"{what} must be a tfgc codec, got {type(codec).__name__}")
    if compression is None:
        raise TypeError("compression must be a tfgc codec, got None")
    if isinstance(compression, ErrorFeedback) and error_feedback:
        warnings.warn(
            "compression=ErrorFeedback(...) with error_feedback=True keeps two residuals "
            "per variable; pass the bare codec (the optimizer keeps the residuals) or "
            "error_feedback=False", stacklevel=2)
    config = optimizer.get_config()
    config.update(
        compression=compression, pull_compression=pull_compression,
        min_elements=min_elements, error_feedback=error_feedback,
        small_compression=small_compression, bucket_bytes=bucket_bytes,
    )
    return make_class(type(optimizer)).from_config(config)


_DISTRIBUTED_CLASSES = {}


def distributed_class(optimizer_class):
    """The compressing subclass of a tf_keras optimizer class (made once per class)."""
    if optimizer_class not in _DISTRIBUTED_CLASSES:
        import tf_keras  # noqa: PLC0415

        name = f"Distributed{optimizer_class.__name__}"
        cls = type(name, (_CompressingMixin, optimizer_class), {})
        # Saved as "tfgc>DistributedSGD": SavedModels and .keras files load where
        # tfgc is imported.
        _DISTRIBUTED_CLASSES[optimizer_class] = tf_keras.saving.register_keras_serializable(
            package="tfgc", name=name)(cls)
    return _DISTRIBUTED_CLASSES[optimizer_class]


def register_tf_keras_optimizers():
    """Makes every tf_keras built-in optimizer's compressing class known to tf_keras's
    deserialization (`load_model`); `import tfgc` calls it. A no-op without tf_keras."""
    try:
        import tf_keras  # noqa: PLC0415
    except ImportError:
        return
    for value in vars(tf_keras.optimizers).values():
        if (isinstance(value, type) and issubclass(value, tf_keras.optimizers.Optimizer)
                and value is not tf_keras.optimizers.Optimizer):
            distributed_class(value)


class CompressingBase:
    """What tfgc's optimizer subclasses share, whichever Keras they extend: the codec
    bound to each variable, error-feedback buffers, traffic counters and the wires.

    Subclasses call `_init_compression` from `__init__` and `_build_compression` from
    `build`, and define `_variable_index`.
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if str(getattr(save_type, "value", save_type)) == "savedmodel":
            # Error-feedback residuals are per-worker buffers under ParameterServerStrategy,
            # which a SavedModel cannot hold; an exported model needs none of them.
            # Checkpoints (BackupAndRestore, tf.train.Checkpoint) keep them.
            children.pop("_residuals", None)
        return children

    def _init_compression(self, compression, pull_compression, min_elements, error_feedback,
                          small_compression, bucket_bytes):
        compression, pull_compression, small_compression = (
            codecs.deserialize(c) if isinstance(c, dict) else c
            for c in (compression, pull_compression, _small_codec(small_compression)))
        self.compression = compression
        self.pull_compression = pull_compression
        self.small_compression = small_compression
        self._uncompressed = codecs.NoCompression()
        self.min_elements = int(min_elements)
        self.error_feedback = bool(error_feedback)
        if int(bucket_bytes) <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self._residuals = {}
        self._settings = None  # see wire_settings
        self._codecs = {}  # the codec bound to each compressed variable, by key
        # Per direction, a [2, variables + 1] int64 counter: payload bytes and dense
        # bytes per variable (the last column: variables built later). One update per
        # step and direction keeps counting off the wire.
        self._traffic = None

    def _variable_index(self, variable):
        """The variable's position in the optimizer (as for its slots)."""
        raise NotImplementedError

    def _compression_config(self, config):
        config.update(
            compression=codecs.serialize(self.compression),
            pull_compression=(
                None if self.pull_compression is None else codecs.serialize(self.pull_compression)
            ),
            min_elements=self.min_elements,
            error_feedback=self.error_feedback,
            small_compression=(
                None if self.small_compression is None
                else codecs.serialize(self.small_compression)
            ),
            bucket_bytes=self.bucket_bytes,
        )
        return config

    def wire_settings(self):
        """What every replica must agree on for compressed updates to stay in step (a
        JSON string, read when the optimizer is built)."""
        if self._settings is None:
            self._settings = json.dumps(self._compression_config({}), sort_keys=True,
                                        default=str)
        return self._settings

    def compresses(self, variable):
        """True when `variable`'s gradients are compressed."""
        return (
            variable.dtype.is_floating
            and variable.shape.num_elements() is not None
            and variable.shape.num_elements() >= self.min_elements
        )

    def _build_compression(self, var_list):
        """Creates the traffic counters, bound codecs and residuals of `var_list`."""
        self.wire_settings()  # eagerly: a codec's config may read a variable
        if self._traffic is None:
            if var_list and not any(self.compresses(v) for v in var_list):
                warnings.warn(
                    f"no variable has min_elements={self.min_elements} elements or more: "
                    f"{self.compression.name} compresses nothing (the largest has "
                    f"{max(v.shape.num_elements() or 0 for v in var_list)}); lower "
                    "min_elements to compress them", stacklevel=3)
            strategy = tf.distribute.get_strategy()
            if is_parameter_server(strategy) and tf.executing_eagerly():
                require_ops_on([v.device for v in var_list] + worker_devices(strategy))
            if self.pull_compression is not None and not getattr(self, "_saw_pulled", False):
                warnings.warn(
                    "pull_compression is set but no variable was created under "
                    "tfgc.compressed_pulls(): the model is pulled as it is (fp32). Build the "
                    "model inside that scope (a Keras model without an input shape makes "
                    "its weights at its first call: `model.build(input_shape)` there)",
                    stacklevel=3)
            self._traffic_names = [v.name for v in var_list] + ["(variables built later)"]
            self._traffic = {
                d: _counter_variable([2, len(var_list) + 1], f"{d}_traffic") for d in DIRECTIONS
            }
        missing = [
            v for v in var_list if self.compresses(v) and self._key(v) not in self._codecs
        ]
        strategy = tf.distribute.get_strategy()
        if missing and is_parameter_server(strategy) and not tf.distribute.in_cross_replica_context():
            # Per-worker variables cannot be created while a worker function is traced.
            raise RuntimeError(
                "Under ParameterServerStrategy, build the DistributedOptimizer before "
                "training so that its per-worker error-feedback buffers exist: "
                "`with strategy.scope(): optimizer.build(model.trainable_variables)`"
            )
        for variable in missing:
            codec = self.compression.bind(variable)
            self._codecs[self._key(variable)] = codec
            if self.error_feedback and codec.supports_error_feedback:
                self._residuals[self._residual_key(variable)] = _residual_variable(variable)

    def _key(self, variable):
        # Positions are stable across processes, so checkpoints restore state to the
        # right variables.
        return f"codec_{self._variable_index(variable)}"

    def _residual_key(self, variable):
        return f"residual_{self._variable_index(variable)}"

    def _master_of(self, variable):
        """The variable updates go to; enables compressed pulls of a `PulledVariable`."""
        if not isinstance(variable, PulledVariable):
            return variable
        self._enable_pulls([variable])
        return variable.master

    def _enable_pulls(self, variables):
        """Makes the `PulledVariable`s among `variables` pull through
        `pull_compression`, one group (one message per step) per parameter server."""
        if any(isinstance(v, PulledVariable) for v in variables):
            self._saw_pulled = True
        waiting = [v for v in variables if isinstance(v, PulledVariable) and v.pull_codec is None]
        if not waiting:
            return
        if self.pull_compression is None:
            warnings.warn(
                f"{len(waiting)} variable(s) were created under tfgc.compressed_pulls(), but "
                "this DistributedOptimizer has no pull_compression: they are pulled as they "
                "are (fp32); pass pull_compression=... to compress them", stacklevel=3)
            return
        if not tf.executing_eagerly() and not tf.distribute.in_cross_replica_context():
            # The step reading these variables was traced with uncompressed pulls.
            raise RuntimeError(
                "Compressed pulls start when the DistributedOptimizer is built: call "
                "`optimizer.build(model.trainable_variables)` (inside strategy.scope() "
                "if there is a strategy) before training"
            )
        groups = {}  # one per parameter server (and dtype: the snapshots are one buffer)
        for variable in waiting:
            groups.setdefault((variable.master.device, variable.master.dtype), []).append(variable)
        for members in groups.values():
            pull_codecs = [self.pull_compression.bind(v.master) if self.compresses(v.master)
                           else self.wire_codec(v.master) for v in members]
            group = ParameterServerPull(members, pull_codecs,
                                        count=lambda rows: self._record("pull", rows))
            for variable, codec in zip(members, pull_codecs):
                variable.enable_compressed_pulls(codec, group)

    @property
    def traffic(self):
        """Cumulative bytes as scalar tensors: `push_bytes`, `push_dense_bytes` (the
        gradients pushed, compressed and as dense tensors), `pull_bytes`,
        `pull_dense_bytes` (model pulls); None until built."""
        if self._traffic is None:
            return None
        totals = {}
        for direction, counter in self._traffic.items():
            sums = tf.reduce_sum(tf.convert_to_tensor(counter), axis=1)
            totals[f"{direction}_bytes"], totals[f"{direction}_dense_bytes"] = sums[0], sums[1]
        return totals

    def traffic_by_variable(self):
        """{variable name: {"push_bytes", "push_dense_bytes", "pull_bytes",
        "pull_dense_bytes"}} as Python ints, cumulative (eager only)."""
        if self._traffic is None:
            return {}
        counts = {d: tf.convert_to_tensor(c).numpy() for d, c in self._traffic.items()}
        return {
            name: {
                f"{d}_{kind}": int(counts[d][row, column])
                for d in DIRECTIONS for row, kind in enumerate(("bytes", "dense_bytes"))
            }
            for column, name in enumerate(self._traffic_names)
            if any(counts[d][1, column] for d in DIRECTIONS)
        }

    def _record(self, direction, sent):
        """Adds one step's [(variable, payload bytes)] to the `direction` counter."""
        if not sent:
            return
        # Columns are the variables' positions at the first build; later ones share
        # the last column.
        other = len(self._traffic_names) - 1
        columns = [min(self._variable_index(v), other) for v, _ in sent]
        indices = [[row, c] for row in (0, 1) for c in columns]
        updates = [tf.cast(b, tf.int64) for _, b in sent]
        updates += [tf.constant(dense_nbytes(v), tf.int64) for v, _ in sent]
        counter = self._traffic[direction]
        counter.assign_add(tf.scatter_nd(indices, tf.stack(updates), counter.shape))

    def codec_for(self, variable):
        """The codec bound to `variable` (see `Codec.bind`)."""
        return self._codecs[self._key(variable)]

    def wire_codec(self, variable):
        """The codec `variable`'s gradients travel with: its bound codec, or the
        small-tensor codec below `min_elements`."""
        if self.compresses(variable):
            return self.codec_for(variable)
        return self._uncompressed if self.small_compression is None else self.small_compression

    def wire_payload(self, gradient, variable):
        """Encodes one gradient for the wire (with error feedback where kept)."""
        codec = self.wire_codec(variable)
        if isinstance(gradient, tf.IndexedSlices) and not codec.accepts_indexed_slices:
            gradient = tf.convert_to_tensor(gradient)
        residual = self._residuals.get(self._residual_key(variable))
        if residual is None or not self.compresses(variable):
            return codec.encode(gradient)
        return feedback_step(codec, tf.convert_to_tensor(gradient), residual)[0]

    def _send_all(self, strategy, grads_and_vars, aggregate):
        """Sends every gradient over the wire `strategy` calls for and counts the bytes;
        returns the (gradient as received, variable) pairs."""
        wire = choose_wire(self, strategy, aggregate, self.bucket_bytes)
        pairs, sent = wire.send(grads_and_vars)
        self._record("push", sent)
        return pairs


class _CompressingMixin(CompressingBase):
    """tf_keras: overrides `build` (codecs, buffers) and `apply_gradients` (the wire)."""

    def __init__(self, *args, compression, pull_compression=None,
                 min_elements=DEFAULT_MIN_ELEMENTS, error_feedback=True,
                 small_compression=DEFAULT_SMALL_COMPRESSION,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_compression(compression, pull_compression, min_elements, error_feedback,
                               small_compression, bucket_bytes)

    def get_config(self):
        return self._compression_config(super().get_config())

    def _variable_index(self, variable):
        return self._index_dict[self._var_key(variable)]

    def build(self, var_list):
        self._enable_pulls(var_list)  # all at once: one pull group per parameter server
        var_list = [self._master_of(v) for v in var_list]
        super().build(var_list)
        self._build_compression(var_list)

    def apply_gradients(self, grads_and_vars, name=None, skip_gradients_aggregation=False,
                        **kwargs):
        grads_and_vars = [(g, self._master_of(v)) for g, v in grads_and_vars]
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, name=name)
        with tf.init_scope():
            self.build([v for _, v in grads_and_vars])
        strategy = tf.distribute.get_strategy()
        aggregate = not skip_gradients_aggregation and kwargs.pop(
            "experimental_aggregate_gradients", True
        )
        pairs = self._send_all(strategy, grads_and_vars, aggregate)
        # Every wire delivers gradients ready to apply: aggregated across replicas
        # where that was asked for, or one worker's own under parameter servers.
        return super().apply_gradients(
            pairs, name=name, skip_gradients_aggregation=True, **kwargs
        )


def _small_codec(spec):
    """The small-tensor codec named by `spec` ("float16", a codec, its config, None)."""
    if isinstance(spec, str):
        if spec != DEFAULT_SMALL_COMPRESSION:
            raise ValueError(
                f'small_compression is "{DEFAULT_SMALL_COMPRESSION}", a tfgc codec or None; '
                f"got {spec!r}")
        return codecs.Cast("float16")
    return spec


def _residual_variable(variable):
    """A zero residual of `variable`'s shape kept where its gradients are produced."""
    # Under PSS one copy per worker: a residual on the parameter server would be pulled
    # in fp32. Under mirrored strategies a checkpoint keeps the replicas' sum, the total
    # unsent error.
    return local_variable(tf.zeros(variable.shape, variable.dtype),
                          f"residual/{variable.name.split(':')[0]}", per_worker=True)


def _counter_variable(shape, name):
    """Cumulative int64 byte counters that every replica or worker adds to."""
    return local_variable(tf.zeros(shape, tf.int64), name, per_worker=False)
