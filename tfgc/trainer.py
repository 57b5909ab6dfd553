"""`fit`-like training of Keras 3 models where Keras 3's `fit` does not run.

- Under ParameterServerStrategy, which Keras 3's `fit` does not support
  (keras-team/keras#18624): `fit_on_parameter_servers`, through TensorFlow's
  `ClusterCoordinator`.
- Under MultiWorkerMirroredStrategy across processes, where Keras 3's `fit` fails
  before its first step, with or without tfgc (keras-team/keras#20585: its symbolic
  build reduces the first batch, a tuple of per-replica values, which TensorFlow's
  cross-worker reduce does not take): `fit_across_workers`.
"""
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import tensorflow as tf

from tfgc.distribute import is_parameter_server

if TYPE_CHECKING:
    import keras


def fit_on_parameter_servers(
    model: "keras.Model",
    strategy: tf.distribute.Strategy,
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    epochs: int,
    steps_per_epoch: int,
    callbacks: Iterable[Any] = (),
    verbose: int = 1,
) -> dict[str, list[float]]:
    """Trains a compiled Keras 3 model on a parameter-server cluster, `fit`-like.

    Each step runs on whichever worker is free (asynchronous training, as tf_keras's
    `fit` under ParameterServerStrategy): the worker reads the variables, computes the
    loss and gradients of one batch of its own dataset, and the model's optimizer
    applies them, a `tfgc.DistributedOptimizer` pushing them compressed, one fused
    message per parameter server.

    The optimizer needs no build call: its per-worker error-feedback buffers are made
    at the first step.

    Args:
      model: a Keras 3 model created and compiled (optimizer and loss) in
        `strategy.scope()`.
      strategy: the `tf.distribute.experimental.ParameterServerStrategy`.
      dataset_fn: called on each worker with a `tf.distribute.InputContext`; returns a
        repeated, batched `tf.data.Dataset` of (x, y) or (x, y, sample_weight).
      epochs: how many epochs.
      steps_per_epoch: steps scheduled per epoch (over all workers).
      callbacks: objects with Keras's callback methods (`keras.callbacks.Callback`,
        `tfgc.callbacks.TrafficLogger`); epoch-level hooks only, since a step's values
        stay on its worker until the epoch's end.
      verbose: 1 prints one line per epoch, 0 nothing.

    Returns:
      A dict of per-epoch lists: "loss" (mean over the epoch's steps) and whatever the
      callbacks add to the epoch logs.

    Raises:
      ValueError: `strategy` is not a ParameterServerStrategy, or the model is not
        compiled.
    """
    if not is_parameter_server(strategy):
        raise ValueError(
            "fit_on_parameter_servers trains under ParameterServerStrategy; under other "
            "strategies use model.fit, or fit_across_workers under MultiWorkerMirroredStrategy "
            f"across processes (got {type(strategy).__name__})")
    _check_compiled(model)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    per_worker_data = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker_data)
    # The coordinator sends every trace of the step to every task: one trace.
    replica_step = _replica_step(model, strategy)

    @tf.function
    def train_step(iterator):
        return strategy.run(replica_step, args=(next(iterator),))

    def run_epoch():
        losses = [coordinator.schedule(train_step, args=(iterator,))
                  for _ in range(steps_per_epoch)]
        coordinator.join()
        return float(np.mean([loss.fetch() for loss in losses]))

    return _run_epochs(model, run_epoch, epochs, steps_per_epoch, callbacks, verbose)


def fit_across_workers(
    model: "keras.Model",
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    epochs: int,
    steps_per_epoch: int,
    callbacks: Iterable[Any] = (),
    verbose: int = 1,
) -> dict[str, list[float]]:
    """Trains a compiled Keras 3 model under MultiWorkerMirroredStrategy, `fit`-like.

    Keras 3's `fit` fails across processes under this strategy before its first step
    (keras-team/keras#20585), with or without tfgc; in one process (one worker) it
    runs, and there `model.fit` is the way. This runs the step Keras's `fit` runs: each
    worker computes the loss of its share of the global batch (scaled for the
    replicas, as `fit` scales it) and the model's optimizer applies the gradients, a
    `tfgc.DistributedOptimizer` exchanging them compressed. Every worker runs the
    same call, as with `fit`.

    Args:
      model: a Keras 3 model created and compiled (optimizer and loss) in
        `strategy.scope()`.
      strategy: the `tf.distribute.MultiWorkerMirroredStrategy` (or
        `MirroredStrategy`).
      dataset: a repeated, batched `tf.data.Dataset` of (x, y) or (x, y,
        sample_weight) batches of the global batch size; each worker reads its share
        (`strategy.experimental_distribute_dataset`).
      epochs: how many epochs.
      steps_per_epoch: steps per epoch.
      callbacks: objects with Keras's callback methods (`keras.callbacks.Callback`,
        `tfgc.callbacks.TrafficLogger`); epoch-level hooks only.
      verbose: 1 prints one line per epoch, 0 nothing.

    Returns:
      A dict of per-epoch lists: "loss" (mean over the epoch's steps and the global
      batch) and whatever the callbacks add to the epoch logs.

    Raises:
      ValueError: `strategy` is a ParameterServerStrategy (use
        `fit_on_parameter_servers`), or the model is not compiled.
    """
    if is_parameter_server(strategy):
        raise ValueError("fit_across_workers trains under MultiWorkerMirroredStrategy; "
                         "under ParameterServerStrategy use fit_on_parameter_servers")
    _check_compiled(model)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    replica_step = _replica_step(model, strategy)

    @tf.function
    def train_step(iterator):
        # Each replica's loss is scaled by 1/replicas (as in `fit`): their sum is the
        # global batch's mean loss.
        per_replica = strategy.run(replica_step, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def run_epoch():
        return float(np.mean([train_step(iterator).numpy()
                              for _ in range(steps_per_epoch)]))

    return _run_epochs(model, run_epoch, epochs, steps_per_epoch, callbacks, verbose)


def _replica_step(model, strategy):
    """One replica's step of Keras 3's `fit`: loss, gradients, the optimizer's apply.

    Builds the model's optimizer first, in `strategy`'s scope: built in the step's first
    trace, its variables would make the step trace again.
    """
    import keras  # noqa: PLC0415 (Keras 3 users only)

    if not model.optimizer.built:
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)

    def replica_step(batch):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            # Under a strategy Keras scales the loss by 1/replicas, as `fit` does.
            loss = model.compute_loss(x, y, y_pred, sample_weight)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(gradients, model.trainable_variables)
        return loss

    return replica_step


def _check_compiled(model):
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ValueError("compile the model (optimizer and loss) before training it")


def _run_epochs(model, run_epoch, epochs, steps_per_epoch, callbacks, verbose):
    """Keras's epoch loop around `run_epoch` (which returns the epoch's mean loss):
    callbacks' epoch hooks, the history and a line per epoch."""
    callbacks = list(callbacks)
    params = {"epochs": epochs, "steps": steps_per_epoch, "verbose": verbose}
    for callback in callbacks:
        callback.set_model(model)
        callback.set_params(params)
    history = {}
    model.stop_training = False
    _call(callbacks, "on_train_begin", {})
    for epoch in range(epochs):
        _call(callbacks, "on_epoch_begin", epoch, {})
        start = time.monotonic()
        logs = {"loss": run_epoch()}
        _call(callbacks, "on_epoch_end", epoch, logs)
        for key, value in logs.items():
            history.setdefault(key, []).append(value)
        if verbose:
            figures = ", ".join(f"{key} {value:.4g}" for key, value in logs.items())
            print(f"epoch {epoch + 1}/{epochs}: {steps_per_epoch} steps in "
                  f"{time.monotonic() - start:.1f} s, {figures}", flush=True)
        if model.stop_training:
            break
    _call(callbacks, "on_train_end", {})
    return history


def _call(callbacks, hook, *args):
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)
