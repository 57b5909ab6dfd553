"""Keras (tf_keras) callbacks of tfgc; imported on first use, as they need tf_keras.

`TrafficLogger` puts the optimizer's bytes on the wire per step into the Keras logs (and
a CSV), `OuterSteps` runs the meetings of local steps in `fit`, and `MQGrad` (from
tfgc.mqgrad) picks the quantization bits as training goes.
"""
import csv
from typing import Any, Mapping, Optional

import tf_keras

from tfgc.distribute import is_parameter_server
from tfgc.mqgrad.callback import MQGrad
from tfgc.optimizer.base import CompressingBase, compressing_optimizer

__all__ = ["MQGrad", "OuterSteps", "TrafficLogger"]

COLUMNS = (
    "push_bytes", "push_plain_bytes", "push_dense_bytes", "compression_ratio",
    "dense_compression_ratio", "bits_per_value",
    "pull_bytes", "pull_plain_bytes", "pull_dense_bytes", "pull_compression_ratio",
    "pull_dense_compression_ratio", "pull_bits_per_value",
)


class TrafficLogger(tf_keras.callbacks.Callback):
    """Adds the optimizer's traffic per training step to each epoch's Keras logs.

    Keys, as means per step over the epoch (History, TensorBoard, CSVLogger and the
    progress bar's epoch line see them): `push_bytes` (bytes on the wire for one step's
    gradients), `push_plain_bytes` (what plain TensorFlow sends for the same step: dense
    gradients as dense tensors, a sparse gradient's distinct rows and their ids),
    `push_dense_bytes` (every gradient as a dense tensor), `compression_ratio` (plain
    TensorFlow's bytes over tfgc's: the saving a user sees on the sockets),
    `dense_compression_ratio` (dense bytes over tfgc's, the ratio papers report) and
    `bits_per_value` (of pushes, per dense value of a 4-byte dtype); where pulls are
    compressed also the same `pull_` keys. Counts are exact (they add up
    `payload_nbytes` of what was sent) and per step of the optimizer
    (`optimizer.iterations`), so `steps_per_execution` does not change them.

    It changes no other log: Keras replaces an epoch's last-step logs by its metrics'
    results only when no callback added keys to them, so at an epoch's last batch it
    hands Keras those results together with its own keys. The keys reach every other
    callback whatever their order in the list; under ParameterServerStrategy, where
    batch logs are remote values, they are added at the epoch's end instead: list it
    before callbacks that read them there (TensorBoard, CSVLogger). Keras 3's `fit`
    (which hands each callback a copy of the batch logs) gets them at each epoch's end
    too, in the logs that History, CSVLogger, TensorBoard and the progress bar read.

    Counters are read at epoch boundaries only, unless per-step CSV files are asked for.

    Args:
      optimizer: the `tfgc.DistributedOptimizer` whose traffic to report; by default the
        model's optimizer.
      csv_path: if given, one row per batch hook (per step, or per `steps_per_execution`
        steps, as per-step means) is appended to this file.
      per_variable_csv_path: if given, one row per batch hook, variable and direction
        (step, variable, direction, bytes, dense_bytes) is appended to this file.
    """

    def __init__(self, optimizer: Any = None, csv_path: Optional[str] = None,
                 per_variable_csv_path: Optional[str] = None) -> None:
        super().__init__()
        # Lets tf_keras run the batch hooks under ParameterServerStrategy; logs stay
        # tensors (or remote values), and this callback reads none of them.
        self._supports_tf_logs = True
        self._optimizer = optimizer
        self.csv_path = csv_path
        self.per_variable_csv_path = per_variable_csv_path
        self._last_by_variable: Optional[dict[str, dict[str, int]]] = None
        self._variable_writer = None
        self._variable_file = None
        self._last = None  # (iterations, counters) at the last per-step row
        self._epoch_start = None
        self._epoch_logged = False
        self._writer = None
        self._file = None

    @property
    def optimizer(self) -> CompressingBase:
        """The tfgc optimizer counted: the one given, or the model's (inside its
        loss-scale optimizer under mixed precision)."""
        given = self._optimizer or self.model.optimizer
        found = compressing_optimizer(given)
        if found is None:
            raise TypeError(
                f"TrafficLogger reports a tfgc.DistributedOptimizer's traffic; "
                f"{type(given).__name__} is not one (nor wraps one): compile the model "
                "with a DistributedOptimizer or pass optimizer=")
        return found

    def _reading(self):
        """(optimizer steps, {counter: bytes}), or None before the optimizer is built."""
        counters = self.optimizer.read_traffic()
        if counters is None:
            return None  # not built yet
        return int(self.optimizer.iterations.numpy()), counters

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self.optimizer  # noqa: B018 (fails now, not silently at every epoch's end)
        if self.csv_path:
            self._file, self._writer = _open_csv(self.csv_path, ("step",) + COLUMNS)
        if self.per_variable_csv_path:
            self._variable_file, self._variable_writer = _open_csv(
                self.per_variable_csv_path, ("step", "variable", "direction", "bytes", "plain_bytes",
                 "dense_bytes")
            )
            self._last_by_variable = self.optimizer.traffic_by_variable()
        self._last = self._reading() if self._writer or self._variable_writer else None

    def on_epoch_begin(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._epoch_start = self._reading()
        self._epoch_logged = False

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._writer is not None or self._variable_writer is not None:
            self._write_rows(batch)
        steps = (self.params or {}).get("steps")
        # Keras 3 hands every callback a copy of the batch logs: keys added there reach
        # no one, so its epochs get them at their end only.
        if isinstance(logs, dict) and steps and batch + 1 >= steps and self._tf_keras_fit():
            figures = self._epoch_figures()
            if figures:
                # Keras would drop these logs for its metrics' results because of the
                # added keys: give it those results, so that nothing else changes.
                logs.update(self.model.get_metrics_result())
                logs.update(figures)
                self._epoch_logged = True

    def _tf_keras_fit(self):
        return isinstance(self.model, tf_keras.Model)

    def _write_rows(self, batch):
        now = self._reading()
        if now is None:
            return
        if self._last is None:
            self._last = (0, {name: 0 for name in now[1]})
        steps = now[0] - self._last[0]
        if steps <= 0:
            return
        if self._writer is not None:
            step = per_step_traffic(self._last[1], now[1], steps=steps, with_pulls=True)
            self._writer.writerow([batch] + [step[k] for k in COLUMNS])
        self._last = now
        if self._variable_writer is not None:
            self._write_per_variable(batch)

    def _write_per_variable(self, batch):
        now = self.optimizer.traffic_by_variable()
        for name, counts in now.items():
            before = self._last_by_variable.get(name, {})
            for direction in ("push", "pull"):
                sent, plain, dense = (
                    counts[f"{direction}_{kind}"] - before.get(f"{direction}_{kind}", 0)
                    for kind in ("bytes", "plain_bytes", "dense_bytes"))
                if dense:
                    self._variable_writer.writerow([batch, name, direction, sent, plain,
                                                    dense])
        self._last_by_variable = now

    def _epoch_figures(self):
        """This epoch's traffic per step so far, or {} when there is none to tell."""
        now = self._reading()
        if now is None:
            return {}
        # Unbuilt at the epoch's start: its counters and steps started at 0 since.
        start = self._epoch_start or (0, {name: 0 for name in now[1]})
        steps = now[0] - start[0]
        if steps <= 0:
            return {}
        return per_step_traffic(start[1], now[1], steps=steps)

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        if logs is not None and not self._epoch_logged:
            logs.update(self._epoch_figures())

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
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


def per_step_traffic(before: Mapping[str, int], after: Mapping[str, int], steps: int,
                     with_pulls: bool = False) -> dict[str, float]:
    """Per-step traffic between two readings of `optimizer.traffic` (dicts of ints).

    Pull keys are included when pulls were counted in between (compressed pulls), or
    always with `with_pulls` (CSV columns are fixed).
    """
    result = {}
    for direction, prefix in (("push", ""), ("pull", "pull_")):
        sent, plain, dense = (
            (after[f"{direction}_{kind}"] - before[f"{direction}_{kind}"]) / steps
            for kind in ("bytes", "plain_bytes", "dense_bytes"))
        if direction == "pull" and not dense and not with_pulls:
            continue
        result[f"{direction}_bytes"] = float(sent)
        result[f"{direction}_plain_bytes"] = float(plain)
        result[f"{direction}_dense_bytes"] = float(dense)
        result[f"{prefix}compression_ratio"] = plain / sent if sent else 0.0
        result[f"{prefix}dense_compression_ratio"] = dense / sent if sent else 0.0
        result[f"{prefix}bits_per_value"] = 32.0 * sent / dense if dense else 0.0
    return result



class OuterSteps(tf_keras.callbacks.Callback):
    """Runs the replicas' meetings of local steps in `fit` (see `tfgc.local_steps`).

    After every batch it has the model's `DistributedOptimizer` meet (one compressed
    all-reduce of the pseudo-gradients, then the outer step) once `local_steps` steps
    were taken since the last meeting, and at the end of training it meets over the
    steps left, so the model `fit` returns is the replicas' common one. Every worker of
    MultiWorkerMirroredStrategy runs it. `steps_per_execution` must divide
    `local_steps` (batch callbacks run once per execution). Under
    ParameterServerStrategy the workers meet the servers inside their own steps and
    it does nothing: the model `fit` returns is the servers', which lacks what each
    worker trained since its last meeting.

    Raises:
      ValueError: at the start of training, the model's optimizer has no local steps.
    """

    def __init__(self) -> None:
        super().__init__()
        # It reads no logs: tf_keras then lets it run under ParameterServerStrategy.
        self._supports_tf_logs = True

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        optimizer = compressing_optimizer(self.model.optimizer)
        if optimizer is None or optimizer.outer_optimizer is None:
            raise ValueError(
                "OuterSteps runs the meetings of local steps: compile the model with "
                "tfgc.DistributedOptimizer(..., local_steps=H)")
        # None under parameter servers: nothing to run. Any: a tf_keras tfgc optimizer,
        # whose meetings (synchronize, ...) its base class CompressingBase does not have.
        self._optimizer: Any = (None if is_parameter_server(self.model.distribute_strategy)
                           else optimizer)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._optimizer is not None:
            self._optimizer.maybe_synchronize(self.model.distribute_strategy)

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        if self._optimizer is not None and self._optimizer.local_steps_since_meeting() > 0:
            self._optimizer.synchronize(self.model.distribute_strategy)
