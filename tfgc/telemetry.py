"""Traffic telemetry: bytes on the wire per step, as Keras logs and CSV."""
import csv

import tf_keras


COLUMNS = (
    "push_bytes", "push_dense_bytes", "compression_ratio", "bits_per_value",
    "pull_bytes", "pull_dense_bytes", "pull_compression_ratio", "pull_bits_per_value",
)


class TrafficLogger(tf_keras.callbacks.Callback):
    """Adds the optimizer's traffic of each training step to the Keras logs.

    Keys added to the batch logs (the progress bar shows them) and, as the epoch's mean
    per step, to the epoch logs (History, TensorBoard): `push_bytes` (bytes on the wire
    for one step's gradients), `push_dense_bytes` (the same gradients uncompressed),
    `compression_ratio` and `bits_per_value` (of pushes, for the gradients' dtype
    taken as 4 bytes); with compressed pulls also `pull_bytes`, `pull_dense_bytes`,
    `pull_compression_ratio` and `pull_bits_per_value`. Counts are exact: they add up
    `payload_nbytes` of what was sent.

    Args:
      optimizer: the `tfgc.DistributedOptimizer` whose traffic to report; by default the
        model's optimizer.
      csv_path: if given, one row per step is appended to this file.
      per_variable_csv_path: if given, one row per step, variable and direction
        (step, variable, direction, bytes, dense_bytes) is appended to this file.
    """

    def __init__(self, optimizer=None, csv_path=None, per_variable_csv_path=None):
        super().__init__()
        # Lets tf_keras run the batch hooks under ParameterServerStrategy, where steps
        # are asynchronous: a batch's reading covers the steps finished by then, and
        # epoch figures are exact (fit joins the workers at each epoch end).
        self._supports_tf_logs = True
        self._optimizer = optimizer
        self.csv_path = csv_path
        self.per_variable_csv_path = per_variable_csv_path
        self._last_by_variable = None
        self._variable_writer = None
        self._variable_file = None
        self._last = None
        self._epoch_start = None
        self._epoch_steps = 0
        self._writer = None
        self._file = None

    @property
    def optimizer(self):
        return self._optimizer or self.model.optimizer

    def _counters(self):
        traffic = getattr(self.optimizer, "traffic", None)
        if traffic is None:
            return None  # not built yet, or not a tfgc optimizer
        return {name: int(value.numpy()) for name, value in traffic.items()}

    def on_train_begin(self, logs=None):
        self._last = self._counters()
        if self.csv_path:
            self._file, self._writer = _open_csv(self.csv_path, ("step",) + COLUMNS)
        if self.per_variable_csv_path:
            self._variable_file, self._variable_writer = _open_csv(
                self.per_variable_csv_path, ("step", "variable", "direction", "bytes", "dense_bytes")
            )
            self._last_by_variable = self.optimizer.traffic_by_variable()

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
        if isinstance(logs, dict):  # under ParameterServerStrategy: a RemoteValue
            logs.update(step)
        if self._writer is not None:
            self._writer.writerow([batch] + [step[k] for k in COLUMNS])
        if self._variable_writer is not None:
            self._write_per_variable(batch)

    def _write_per_variable(self, batch):
        now = self.optimizer.traffic_by_variable()
        for name, counts in now.items():
            before = self._last_by_variable.get(name, {})
            for direction in ("push", "pull"):
                sent = counts[f"{direction}_bytes"] - before.get(f"{direction}_bytes", 0)
                dense = counts[f"{direction}_dense_bytes"] - before.get(f"{direction}_dense_bytes", 0)
                if dense:
                    self._variable_writer.writerow([batch, name, direction, sent, dense])
        self._last_by_variable = now

    def on_epoch_end(self, epoch, logs=None):
        counters = self._counters()
        if counters is not None and logs is not None and self._epoch_steps:
            logs.update(_traffic(self._epoch_start, counters, steps=self._epoch_steps))

    def on_train_end(self, logs=None):
        for handle in (self._file, self._variable_file):
            if handle is not None:
                handle.close()
        self._file, self._writer = None, None
        self._variable_file, self._variable_writer = None, None


def _open_csv(path, header):
    handle = open(path, "a", newline="")
    writer = csv.writer(handle)
    if handle.tell() == 0:
        writer.writerow(header)
    return handle, writer


def _traffic(before, after, steps):
    """Per-step traffic between two counter readings (None: the counters started at 0)."""
    before = before or {name: 0 for name in after}
    result = {}
    for direction, prefix in (("push", ""), ("pull", "pull_")):
        sent = (after[f"{direction}_bytes"] - before[f"{direction}_bytes"]) / steps
        dense = (after[f"{direction}_dense_bytes"] - before[f"{direction}_dense_bytes"]) / steps
        result[f"{direction}_bytes"] = float(sent)
        result[f"{direction}_dense_bytes"] = float(dense)
        result[f"{prefix}compression_ratio"] = dense / sent if sent else 0.0
        result[f"{prefix}bits_per_value"] = 32.0 * sent / dense if dense else 0.0
    return result
