"""DistributedOptimizer: compress gradients where they cross the wire.

The package: `base` (what both Keras flavours share: codecs per variable, error
feedback, counters, the wires), `tfkeras` (tf_keras optimizers: every strategy),
`keras3` (Keras 3 optimizers: one process and all-reduce).

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
import warnings
from typing import Any, Optional, Union

from tfgc.codecs.base import Codec
from tfgc.distribute import DEFAULT_MIN_ELEMENTS
from tfgc.local_steps import OuterSGD
from tfgc.memory import ErrorFeedback, ResidualFeedback
from tfgc.optimizer.base import (
    DEFAULT_SMALL_COMPRESSION, DIRECTIONS, CompressingBase, compressing_optimizer, small_codec,
)
from tfgc.optimizer.loss_scale import loss_scale_rewrapper
from tfgc.optimizer.keras3 import keras3_distributed_class, register_keras_optimizers
from tfgc.optimizer.tfkeras import distributed_class, register_tf_keras_optimizers
from tfgc.wire.wires import DEFAULT_BUCKET_BYTES

__all__ = [
    "DistributedOptimizer", "CompressingBase", "distributed_class", "keras3_distributed_class",
    "register_tf_keras_optimizers", "register_keras_optimizers", "DEFAULT_SMALL_COMPRESSION",
    "DIRECTIONS", "compressing_optimizer",
]


def DistributedOptimizer(  # noqa: N802 (reads as a class at call sites, like Horovod's)
    optimizer: Any,
    compression: Codec,
    pull_compression: Optional[Codec] = None,
    min_elements: int = DEFAULT_MIN_ELEMENTS,
    error_feedback: Union[bool, ResidualFeedback] = True,
    small_compression: Union[str, Codec, None] = DEFAULT_SMALL_COMPRESSION,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    local_steps: int = 1,
    outer_optimizer: Optional[OuterSGD] = None,
    sparse_error_feedback: bool = False,
    parameter_servers: Optional[Any] = None,
) -> Any:
    """Returns a copy of `optimizer` that compresses the gradients it applies.

    The result is an instance of a subclass of `optimizer`'s class, built from its
    config, so hyperparameters, `iterations` and `learning_rate` behave as the inner
    optimizer's. Wrap an optimizer before training: its slots are not copied.

    A loss-scale optimizer (tf_keras's or Keras 3's `LossScaleOptimizer`, for
    `mixed_float16`) stays outside: `DistributedOptimizer(LossScaleOptimizer(opt))`
    returns `LossScaleOptimizer(DistributedOptimizer(opt))` with the same loss-scale
    settings, which is also what `compile` makes of a DistributedOptimizer under a
    mixed_float16 policy. Gradients are then unscaled before they are encoded, and a
    step whose scaled gradients are not finite on some replica is skipped on every
    replica, residuals untouched.

    With or without one, a step whose decoded gradients are not finite (a NaN or Inf
    gradient, or a finite one that an encode or the replicas' sum overflowed) is
    skipped on every replica (every server under ParameterServerStrategy): weights,
    slots and residuals stay, `iterations` counts it (see tfgc.optimizer.finite_steps).

    Args:
      optimizer: a tf_keras optimizer (`tf_keras.optimizers.Optimizer`), or a Keras 3
        optimizer for single-process and all-reduce training (see
        tfgc.optimizer.keras3).
      compression: a `tfgc.codecs.Codec` for gradients.
      pull_compression: deprecated in favour of `parameter_servers`: a codec for the
        pulls of the variables made under a `tfgc.compressed_pulls()` scope that names
        no codec of its own (see tfgc.ps.pulls).
      min_elements: variables with fewer elements are not compressed by
        `compression` (3LC's rule): they go with `small_compression`.
      error_feedback: keep each compressed variable's residual (3LC's error
        accumulation) on the worker that produced it: True (`ResidualFeedback()`),
        False, or a `tfgc.memory.ResidualFeedback` with another rule (e.g. a decay).
      small_compression: the codec of gradients below `min_elements` on fused wires
        (parameter servers, one process): "float16" (the default: `Cast("float16")`,
        which saturates instead of overflowing), a `tfgc.codecs.Codec`, or None to
        send them as they are. All-reduce strategies sum them as they are.
      bucket_bytes: under all-reduce strategies, about how many bytes one collective
        carries (gradients are packed into buckets; default 25 MiB, as PyTorch DDP).
      local_steps: H > 1 trains each replica's own copy of the model for H steps, then
        the replicas meet: their pseudo-gradients (what their copies moved) cross
        compressed with `compression`, and `outer_optimizer` applies the mean
        (DiLoCo; see tfgc.local_steps). tf_keras optimizers under
        MultiWorkerMirroredStrategy, MirroredStrategy or no strategy; in `fit`, add
        `tfgc.callbacks.OuterSteps()` to the callbacks.
      outer_optimizer: the meetings' `tfgc.OuterSGD` (default with local steps:
        DiLoCo's, learning rate 0.7 and Nesterov momentum 0.9;
        `OuterSGD.averaging()` for 3LC's local-steps baseline). Given with
        `local_steps=1`, every step is a meeting.
      sparse_error_feedback: whether variables whose gradients are sparse
        (`tf.IndexedSlices`: an embedding's) keep a dense residual too. By default they
        keep none, and their gradients travel as their distinct rows, compressed with
        `compression` (`tfgc.codecs.rows`): never more than plain TensorFlow sends.
        True keeps a residual of the whole table on every worker (a warning says its
        size) and sends the gradients densified.
      parameter_servers: the `tfgc.ParameterServers` whose scope made the model's
        variables (under ParameterServerStrategy): their pulls' settings and local
        steps, which this optimizer takes (`local_steps` must be the servers'). It
        counts their pull bytes.

    Raises:
      TypeError: `optimizer` is not a Keras optimizer or `compression` not a codec.
      NotImplementedError: a Keras 3 optimizer with `pull_compression` or local steps,
        or one without the hook tfgc relies on; local steps with a loss-scale
        optimizer.
    """
    if isinstance(compressing_optimizer(optimizer), CompressingBase):
        raise TypeError(
            f"{type(optimizer).__name__} is already a DistributedOptimizer; wrap the inner "
            "optimizer once")
    rewrap = loss_scale_rewrapper(optimizer)
    if rewrap is not None and (local_steps != 1 or outer_optimizer is not None):
        raise NotImplementedError(
            "local_steps with a LossScaleOptimizer (mixed_float16) is not built yet")
    if rewrap is not None:
        # The loss-scale optimizer goes outside: it unscales gradients before tfgc
        # encodes them (residuals in the gradients' own units) and skips whole steps
        # with non-finite gradients, which then leave the residuals as they were.
        return rewrap(DistributedOptimizer(
            optimizer.inner_optimizer, compression, pull_compression=pull_compression,
            min_elements=min_elements, error_feedback=error_feedback,
            small_compression=small_compression, bucket_bytes=bucket_bytes,
            sparse_error_feedback=sparse_error_feedback,
            parameter_servers=parameter_servers))
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
        make_class = keras3_distributed_class
    else:
        raise TypeError(
            f"expected a tf_keras or Keras 3 optimizer, got {type(optimizer).__module__}.{name}")
    small_compression = small_codec(small_compression)
    for what, codec in (("compression", compression), ("pull_compression", pull_compression),
                        ("small_compression", small_compression)):
        if codec is not None and not isinstance(codec, Codec):
            raise TypeError(f"{what} must be a tfgc codec, got {type(codec).__name__}")
    if compression is None:
        raise TypeError("compression must be a tfgc codec, got None")
    if isinstance(compression, ErrorFeedback) and error_feedback:
        warnings.warn(
            "compression=ErrorFeedback(...) with error_feedback=True keeps two residuals "
            "per variable; pass the bare codec (the optimizer keeps the residuals) or "
            "error_feedback=False", stacklevel=2)
    config = optimizer.get_config()
    if compression.momentum_on_sender and config.get("momentum"):
        warnings.warn(
            f"{type(compression).__name__} applies momentum before it compresses, and "
            f"{name} has momentum={config['momentum']} of its own: the gradients would "
            f"pass two momenta; give {name} momentum=0", stacklevel=2)
    config.update(
        compression=compression, pull_compression=pull_compression,
        min_elements=min_elements, error_feedback=error_feedback,
        small_compression=small_compression, bucket_bytes=bucket_bytes,
        local_steps=local_steps, outer_optimizer=outer_optimizer,
        sparse_error_feedback=bool(sparse_error_feedback),
        parameter_servers=parameter_servers,
    )
    return make_class(type(optimizer)).from_config(config)
