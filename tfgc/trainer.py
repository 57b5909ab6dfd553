"""Training a Keras 3 model under ParameterServerStrategy, which Keras 3's `fit` does not
support (keras-team/keras#18624), through TensorFlow's `ClusterCoordinator`.
"""
import time

import numpy as np
import tensorflow as tf

from tfgc.distribute import is_parameter_server


def fit_on_parameter_servers(model, strategy, dataset_fn, epochs, steps_per_epoch,
                             callbacks=(), verbose=1):
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
            f"strategies use model.fit (got {type(strategy).__name__})")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ValueError("compile the model (optimizer and loss) before training it")
    import keras  # noqa: PLC0415 (Keras 3 users only)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    per_worker_data = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker_data)
    optimizer = model.optimizer
    if not optimizer.built:
        # Built here, not in the step's first trace: a tf.function whose first trace
        # makes variables traces again, and the coordinator sends every trace to every
        # task.
        with strategy.scope():
            optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(iterator):
        def replica_step(batch):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x, y, y_pred, sample_weight)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(gradients, model.trainable_variables)
            return loss

        return strategy.run(replica_step, args=(next(iterator),))

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
        losses = [coordinator.schedule(train_step, args=(iterator,))
                  for _ in range(steps_per_epoch)]
        coordinator.join()
        logs = {"loss": float(np.mean([loss.fetch() for loss in losses]))}
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
