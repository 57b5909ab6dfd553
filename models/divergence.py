"""Stopping a run whose training loss is no longer finite.

Once the loss is NaN or infinite the weights are too, and every later step, restart or
test only spends time on a chance-level model. `models.train` therefore stops at the
first non-finite loss it sees, says which model diverged, where, and at which learning
rate, and exits with `EXIT_DIVERGED`. The parameter-server supervisor
(`models.supervise`) does not restart such a run: its backup holds the weights that
diverged once with the same learning rate.

Where the loss is seen: after every step when the batch logs are local values (no
strategy, MultiWorkerMirroredStrategy); under ParameterServerStrategy, whose batch logs
are remote values that tf_keras does not hand to callbacks, at the end of each Keras
epoch (`--log-every` steps).
"""
import math

#: Exit code of a run stopped because its loss became NaN or infinite.
EXIT_DIVERGED = 3


class Diverged(RuntimeError):
    """The training loss became NaN or infinite; the message says where and what to do."""


def _non_finite(value):
    """True when `value` (a Python or NumPy number, a scalar tensor) is NaN or infinite."""
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def describe(model, loss, step, epoch, epochs, lr, lr_scaled, strategy):
    """The message of a diverged run (also what `models.train` prints).

    Args:
      model: the `--model` name.
      loss: the non-finite loss seen.
      step: the step after which it was seen (steps of `--steps`).
      epoch: the Keras epoch it was seen in (0-based).
      epochs: Keras epochs in the run.
      lr: `--lr` (per replica).
      lr_scaled: the initial learning rate the optimizer used (`lr` x synchronous
        replicas).
      strategy: the `--strategy`.
    """
    scaled = f" ({lr_scaled:g} after scaling by the replicas)" if lr_scaled != lr else ""
    return (f"{model} diverged: the training loss is {float(loss)} at step {step} "
            f"(epoch {epoch + 1} of {epochs}) under --strategy {strategy}, with learning "
            f"rate --lr {lr:g}{scaled}. Stopped; retry with a lower --lr, e.g. "
            f"--lr {lr / 10:g}")


def stop_on_divergence(model, steps_per_epoch, epochs, lr, lr_scaled, strategy, per_batch):
    """A tf_keras callback that raises `Diverged` at the first non-finite loss.

    Unlike tf_keras `TerminateOnNaN`, which only ends `fit` (the run would then test and
    exit as if it had succeeded), the exception reaches `models.train`, which exits with
    `EXIT_DIVERGED`. Put it after the history recorder (the row with the bad loss is
    kept) and before the backup's save (a diverged epoch is never saved).

    Args:
      model: the `--model` name (for the message).
      steps_per_epoch: steps per Keras epoch (`--log-every`).
      epochs: Keras epochs in the run.
      lr: `--lr`, per replica.
      lr_scaled: the optimizer's initial learning rate.
      strategy: the `--strategy`.
      per_batch: whether batch logs reach callbacks (all strategies but ps); then the
        loss is checked after every step as well as at each epoch's end.
    """
    import tf_keras

    class StopOnDivergence(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def _check(self, step, logs):
            loss = (logs or {}).get("loss")
            if loss is not None and _non_finite(loss):
                raise Diverged(describe(model, loss, step, self.epoch, epochs, lr,
                                        lr_scaled, strategy))

        def on_epoch_end(self, epoch, logs=None):
            self._check((epoch + 1) * steps_per_epoch, logs)

    # A separate class: tf_keras refuses any callback that defines a batch hook under
    # ParameterServerStrategy.
    class StopOnDivergenceEachStep(StopOnDivergence):
        def on_train_batch_end(self, batch, logs=None):
            self._check(self.epoch * steps_per_epoch + batch + 1, logs)

    return StopOnDivergenceEachStep() if per_batch else StopOnDivergence()


def first_non_finite(rows):
    """The first history row whose loss is NaN or infinite, or None."""
    for row in rows:
        if row.get("loss") is not None and _non_finite(row["loss"]):
            return row
    return None
