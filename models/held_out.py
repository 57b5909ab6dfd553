"""Test accuracy during training, on the held-out set, off the training clock.

`models.train --eval-every N` tests the model every N Keras epochs, as its final test
does (a copy of the weights, batch-norm statistics recomputed or kept alike), so that
a time to accuracy is a time to a *test* accuracy. The evaluation pauses training;
the pause is taken off the run's clock (`Recorder.pause`: its history rows and train
time), so the times are those of training alone.
"""


def evaluator_class():
    import tf_keras

    class HeldOutAccuracy(tf_keras.callbacks.Callback):
        """Tests a copy of the model every `every` epochs; records (step, time, accuracy).

        Args:
          recorder: the run's `Recorder` (its clock and its last row's time); it must
            come before this callback, so that the epoch's row is written first.
          test: a function of the trained model that returns its test accuracy.
          every: Keras epochs between tests (the last epoch is always tested).
          epochs: the run's Keras epochs.
        """

        def __init__(self, recorder, test, every, epochs):
            super().__init__()
            self.recorder = recorder
            self.test = test
            self.every = every
            self.epochs = epochs
            self.rows = []  # {"step", "time_s", "test_accuracy"}

        def on_epoch_end(self, epoch, logs=None):
            if (epoch + 1) % self.every and epoch + 1 != self.epochs:
                return
            began = self.recorder.clock()
            row = self.recorder.rows[-1]
            accuracy = float(self.test(self.model))
            self.rows.append({"step": row["step"], "time_s": row["time_s"],
                              "test_accuracy": accuracy})
            self.recorder.pause(began, self.recorder.clock() - began)

    return HeldOutAccuracy


def evaluate_in_fit(model, dataset):
    """[loss, accuracy] of `model` on `dataset`, as `model.evaluate` computes them.

    For use inside another model's `fit` (a callback): there `evaluate` would run under
    the trained model's strategy (under parameter servers, as closures on the workers),
    whatever strategy `model` was made in. This runs the model's own `test_step` in
    this process, on its own variables.
    """
    import tensorflow as tf

    step = getattr(model, "_held_out_step", None)
    if step is None:
        step = model._held_out_step = tf.function(model.test_step)
    model.reset_metrics()
    logs = {}
    for batch in dataset:
        logs = step(batch)
    return [float(value) for value in logs.values()][:2]


def time_to(rows, target):
    """The training time at which `rows` (`HeldOutAccuracy.rows`) first reach `target`,
    or None."""
    return next((r["time_s"] for r in rows if r["test_accuracy"] >= target), None)
