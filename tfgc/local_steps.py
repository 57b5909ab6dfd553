"""Local steps: replicas train their own copies of the model and meet every H steps.

DiLoCo (Douillard et al., 2023) and 3LC's "2 local steps" baseline. Each replica applies
the inner optimizer (the Keras optimizer a `DistributedOptimizer` wraps) to its own copy
of the model with its own gradients, H steps in a row, sending nothing. Then the
replicas send what their copies moved since they last met (the *pseudo-gradient*,
anchor - copy) through the optimizer's codec with error feedback, and an *outer
optimizer* applies the replicas' mean to the anchor, which every copy then becomes:

    every step      w_r <- inner(w_r, R * g_r)                 replica r alone
    every H steps   d   <- mean over r of decode(encode(anchor - w_r + e_r))
                    m   <- momentum * m + d
                    w_r <- anchor - lr * (d + momentum * m)    (Nesterov; lr * m without)
                    anchor <- w_r                              the same on every replica

`R * g_r`: Keras scales each replica's loss by 1/R so that the R replicas' gradients sum
to the batch's mean gradient; a replica that steps alone takes its own batch's mean.
`e_r` is replica r's residual (error feedback, kept as for gradients). With plain
averaging (`OuterSGD.averaging()`: lr 1, no momentum), uncompressed deltas and one local
step, a step is the usual synchronous step, to within float rounding.

Under MultiWorkerMirroredStrategy and MirroredStrategy the meeting is one compressed
all-reduce per H steps, through the same bucketed wire as gradients; in one process
(no strategy) the deltas are encoded and decoded locally, to study accuracy. The
meeting is a function of its own (`synchronize`), run between steps: these strategies
cannot run a collective inside a branch of a step (a `merge_call` inside control flow),
and a step that always sent something would not save the round trips. In `fit`,
`tfgc.callbacks.OuterSteps` runs it; a custom loop calls `maybe_synchronize()` after
each step. A step that would make more than H local steps in a row fails, saying so.

The anchors, the outer momentum and the step of the last meeting are optimizer
variables, saved in checkpoints. Between meetings the replicas' copies and the inner
optimizer's slots differ; a checkpoint keeps the first replica's, and a resumed run
starts every replica from them.

Batch-norm moving statistics (`recompute_statistics`): a model whose weights are an average of copies trained apart (local steps: the masters
are moved to the workers' mean pseudo-gradients) need not fit the moving statistics its
batch norms kept while training: those are averages of batch statistics of the copies.
Measured on ResNet-20 with 16 local steps under parameter servers, the servers' weights
tested at 0.23 with their moving statistics and 0.58 with batch statistics. The remedy
stochastic weight averaging uses (Izmailov et al. 2018) is a pass over some training
batches with the final weights, each batch norm's statistics set to the mean of the
batches' statistics, which `recompute_statistics` makes for the weights a model has now.
"""
import importlib
from typing import Any, Callable, Dict, Optional, Union

import tensorflow as tf

__all__ = ["OuterSGD"]


class OuterSGD:
    """The outer optimizer of local steps: SGD on the replicas' mean pseudo-gradient.

    The default is DiLoCo's: learning rate 0.7, Nesterov momentum 0.9.
    `OuterSGD.averaging()` (learning rate 1, no momentum) makes every copy the mean of
    the replicas' copies, as 3LC's "local steps" baseline.

    Args:
      learning_rate: multiplies the step; positive.
      momentum: in [0, 1).
      nesterov: Nesterov momentum (DiLoCo's); ignored without momentum.

    Raises:
      ValueError: a learning rate that is not positive, or a momentum outside [0, 1).
    """

    def __init__(self, learning_rate: float = 0.7, momentum: float = 0.9,
                 nesterov: bool = True) -> None:
        if not learning_rate > 0:
            raise ValueError(f"the outer learning rate must be positive, got {learning_rate}")
        if not 0 <= momentum < 1:
            raise ValueError(f"the outer momentum must be in [0, 1), got {momentum}")
        self.learning_rate = float(learning_rate)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    @classmethod
    def averaging(cls) -> "OuterSGD":
        """Every copy becomes the replicas' mean: learning rate 1, no momentum."""
        return cls(1.0, momentum=0.0, nesterov=False)

    def get_config(self) -> Dict[str, Any]:
        return {"learning_rate": self.learning_rate, "momentum": self.momentum,
                "nesterov": self.nesterov}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "OuterSGD":
        return cls(**config)

    def __repr__(self):
        return (f"OuterSGD(learning_rate={self.learning_rate}, momentum={self.momentum}, "
                f"nesterov={self.nesterov})")

    def __eq__(self, other):
        return isinstance(other, OuterSGD) and self.get_config() == other.get_config()

    def step(self, delta: tf.Tensor, momentum: Optional[tf.Variable]) -> tf.Tensor:
        """The step to subtract from the anchor, given the mean pseudo-gradient `delta`
        and the momentum buffer (None without momentum), which it updates first."""
        if momentum is None:
            return self.learning_rate * delta
        velocity = momentum.assign(self.momentum * momentum + delta)
        direction = delta + self.momentum * velocity if self.nesterov else velocity
        return self.learning_rate * direction


class Meetings:
    """One optimizer's state of local steps (a plain holder: Keras tracks the variables
    through the optimizer, which made them, and must not track the function).

    Attributes:
      variables: the model variables, in the optimizer's order.
      anchors: each variable's value at the last meeting.
      momenta: each variable's outer momentum, or None without momentum.
      synced_at: the optimizer's `iterations` at the last meeting (int64 scalar).
      function: the traced meeting, made at the first.
    """

    def __init__(self, variables: list[tf.Variable], anchors: list[tf.Variable],
                 momenta: Optional[list[tf.Variable]], synced_at: tf.Variable) -> None:
        self.variables = variables
        self.anchors = anchors
        self.momenta = momenta
        self.synced_at = synced_at
        self.function: Optional[Callable[[], Any]] = None

    def steps_since(self, iterations: tf.Variable) -> int:
        """The local steps taken since the last meeting (eager)."""
        return int(iterations.numpy()) - int(self.synced_at.numpy())


def check_local_steps(local_steps: Optional[int]) -> int:
    """`local_steps` as an int >= 1 (None: 1), or a ValueError."""
    steps = 1 if local_steps is None else local_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"local_steps must be a positive integer, got {local_steps!r}")
    return steps


def as_outer_optimizer(config: Union[OuterSGD, dict[str, Any], None]) -> OuterSGD:
    """An `OuterSGD` from itself, its config, or None (DiLoCo's default)."""
    if config is None:
        return OuterSGD()
    if isinstance(config, dict):
        return OuterSGD.from_config(config)
    if not isinstance(config, OuterSGD):
        raise TypeError(f"outer_optimizer must be a tfgc.OuterSGD, got {type(config).__name__}")
    return config


def scaled_for_one_replica(gradient: Optional[Union[tf.Tensor, tf.IndexedSlices]], replicas: int) -> Optional[Union[tf.Tensor, tf.IndexedSlices]]:
    """`gradient` times `replicas`: the gradient of the replica's own mean loss (Keras
    divided it by the replicas, for a sum across them that no local step takes)."""
    if gradient is None or replicas == 1:
        return gradient
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * replicas, gradient.indices,
                                gradient.dense_shape)
    return gradient * replicas


def too_many_local_steps(iterations: tf.Tensor, synced_at: tf.Tensor, local_steps: int
                         ) -> tf.Operation:
    """An op failing if a step now would be more than `local_steps` since the last
    meeting (nobody ran `synchronize`)."""
    return tf.debugging.Assert(
        iterations - synced_at < local_steps,
        [f"local_steps={local_steps}, but the replicas have not met for", iterations - synced_at,
         "steps: in fit, pass tfgc.callbacks.OuterSteps() in callbacks (with a "
         "steps_per_execution that divides local_steps); in a custom loop, call "
         "optimizer.maybe_synchronize() after every step"])


def recompute_statistics(model: Any, data: "tf.data.Dataset", batches: int = 10) -> int:
    """Sets the moving mean and variance of every batch norm of `model` to the mean of
    its batch statistics over the first `batches` batches of `data`, computed with the
    model's current weights.

    The model runs in training mode (`model(x, training=True)`), eagerly, where it is
    called: under ParameterServerStrategy on the coordinator, reading the servers'
    weights and writing their statistics. Nothing else is trained, but any other layer
    that updates state in training mode does so too. Batch norms are found through
    `model.layers`, nested models included; one inside a custom layer that does not list
    it there is left as it was.

    Args:
      model: a built tf_keras or Keras 3 model.
      data: a `tf.data.Dataset` of training batches: (inputs, targets[, weights]) tuples
        or inputs alone.
      batches: how many batches to average over.

    Returns:
      The number of batches used (fewer than `batches` where `data` ends first); 0 for
      a model without batch norms, which does not run.

    Raises:
      ValueError: `batches` < 1, or `data` has no batch.
    """
    if batches < 1:
        raise ValueError(f"recompute_statistics needs batches >= 1, got {batches}")
    classes = _batch_norm_classes()
    norms = [layer for layer in _layers(model) if isinstance(layer, classes)]
    if not norms:
        return 0
    momenta = [layer.momentum for layer in norms]
    used = 0
    try:
        for batch in data.take(batches):
            inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
            # v <- v * m + x * (1 - m) with m = k / (k + 1) at the k-th batch (from 0):
            # after it, v is the mean of the k + 1 batches' statistics.
            for layer in norms:
                layer.momentum = used / (used + 1)
            model(inputs, training=True)
            used += 1
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum
    if used == 0:
        raise ValueError("recompute_statistics: the dataset gave no batch")
    return used


def _layers(layer):
    """`layer` and every layer listed under it by `.layers`, depth first."""
    yield layer
    for sublayer in getattr(layer, "layers", ()):
        yield from _layers(sublayer)


def _batch_norm_classes():
    """BatchNormalization of tf_keras and of Keras 3, those installed."""
    classes = []
    for name in ("tf_keras", "keras"):
        try:
            classes.append(importlib.import_module(name).layers.BatchNormalization)
        except (ImportError, AttributeError):
            continue
    return tuple(classes)
