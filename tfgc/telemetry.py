"""Traffic telemetry: bytes on the wire per step, as Keras logs and CSV."""
import csv

import tf_keras


class TrafficLogger(tf_keras.callbacks.Callback):
    """Adds the optimizer's push traffic of each training step to the Keras logs.

    Keys added to the batch logs (the progress bar shows them) and, as the epoch's mean
    per step, to the epoch logs (History, TensorBoard): `push_bytes` (bytes on the wire
    for one step's gradients), `push_dense_bytes` (the same gradients uncompressed),
    `compression_ratio` and `bits_per_value` (assuming 4-byte values).

    Args:
      optimizer: the `tfgc.DistributedOptimizer` whose traffic to report; by default the
        model's optimizer.
      csv_path: if given, one row per step is appended to this file.
    """

    def __init__(self, optimizer=None, csv_path=None):
        super().__init__()
        self._optimizer = optimizer
        self.csv_path = csv_path
        self._last = None
        self._epoch_start = None
        self._epoch_steps = 0
        self._writer = None
        self._file = None

    def _counters(self):
        optimizer = self._optimizer or self.model.optimizer
        traffic = getattr(optimizer, "traffic", None)
        if traffic is None:
            return None  # not built yet, or not a tfgc optimizer
        return {name: int(variable.numpy()) for name, variable in traffic.items()}

    def on_train_begin(self, logs=None):
        self._last = self._counters()
        if self.csv_path:
            self._file = open(self.csv_path, "a", newline="")
            self._writer = csv.writer(self._file)
            if self._file.tell() == 0:
                self._writer.writerow(
                    ["step", "push_bytes", "push_dense_bytes", "compression_ratio", "bits_per_value"]
                )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._counters()
        self._epoch_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        counters = self._counters()
        if counters is None:
            return
        step = _traffic(self._last, counters, steps=1)
        self._last = counters
        self._epoch_steps += 1
        if logs is not None:
            logs.update(step)
        if self._writer is not None:
            self._writer.writerow([batch] + [step[k] for k in step])

    def on_epoch_end(self, epoch, logs=None):
        counters = self._counters()
        if counters is not None and logs is not None and self._epoch_steps:
            logs.update(_traffic(self._epoch_start, counters, steps=self._epoch_steps))

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()
            self._file, self._writer = None, None


def _traffic(before, after, steps):
    """Per-step traffic between two counter readings (None: the counters started at 0)."""
    before = before or {name: 0 for name in after}
    sent = (after["push_bytes"] - before["push_bytes"]) / steps
    dense = (after["push_dense_bytes"] - before["push_dense_bytes"]) / steps
    return {
        "push_bytes": float(sent),
        "push_dense_bytes": float(dense),
        "compression_ratio": dense / sent if sent else 0.0,
        "bits_per_value": 32.0 * sent / dense if dense else 0.0,
    }
