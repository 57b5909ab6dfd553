"""What `models.train` records per step (per Keras epoch under PSS): time, loss,
accuracy, bytes pushed, the cluster's socket counters, and where each epoch's time
went (its steps, and the work between epochs).

The run's clock counts training only: a callback that pauses training for work of the
run's own (a test of the held-out set, a backup) tells the recorder (`pause`), and the
rows' times and the train time leave that pause out."""
import json
import os
import time

HISTORY_FIELDS = ("step", "time_s", "loss", "accuracy", "push_bytes", "push_dense_bytes")


def recorder_classes():
    import tf_keras

    class Recorder(tf_keras.callbacks.Callback):
        """Records time, loss, accuracy and push bytes per step (or per epoch under PSS).

        tf_keras runs no batch-level callbacks under ParameterServerStrategy, so there
        one row is written per Keras epoch (`--log-every` steps), with the optimizer's
        push counters averaged over its steps and added to the epoch logs (progress
        bar, TensorBoard), and the cluster's socket counters read.
        """

        def __init__(self, optimizer, steps_per_epoch, per_batch, cluster=None,
                     rows_path=None, clock=time.monotonic):
            super().__init__()
            self.clock = clock  # seconds, monotonic (tests pass their own)
            self.optimizer = optimizer
            self.steps_per_epoch = steps_per_epoch
            self.per_batch = per_batch
            self.cluster = cluster
            # JSON lines of every row written, kept across attempts (models.supervise).
            self.rows_path = rows_path
            self.rows, self.socket_rows = [], []
            self.resumed_rows = 0  # rows that earlier attempts wrote
            self.epoch = 0
            self.start = None
            self.last_epoch_end = None  # clock() when the last epoch ended
            self._last_counters = None
            self.pauses = []  # (began, seconds), clock() times: off the clock
            # Per epoch, seconds from its start to its end (its steps, the wait for the
            # last of them and Keras reading the metrics), and from its end to the next
            # epoch's start (the callbacks' work at its end, the next one's set-up),
            # pauses left out.
            self.epoch_seconds, self.between_epochs_seconds = [], []
            self._epoch_began = None
            self._epoch_ended = None

        def _counters(self):
            return self.optimizer.read_traffic()

        def on_train_begin(self, logs=None):
            self.start = self.clock()
            self._last_counters = self._counters()
            # A resumed attempt starts where the restored backup ended (BackupAndRestore
            # runs first); the rows up to there come from the attempts before.
            step = int(self.optimizer.iterations.numpy())
            if self.rows_path and os.path.exists(self.rows_path):
                with open(self.rows_path) as f:
                    self.rows = [row for row in map(json.loads, f) if row["step"] <= step]
            self.resumed_rows = len(self.rows)
            if self.rows_path:
                with open(self.rows_path, "w") as f:
                    f.writelines(json.dumps(row) + "\n" for row in self.rows)
            self.read_sockets(step)

        def pause(self, began, seconds):
            """Takes `seconds` of work that began at `began` (`clock()`) off the
            run's clock: later rows' times, and the time between epochs."""
            self.pauses.append((began, seconds))
            self.start += seconds

        def paused_before(self, moment):
            """Seconds of pauses that began before `moment` (`clock()`)."""
            return sum(seconds for began, seconds in self.pauses if began < moment)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self._epoch_began = self.clock()
            if self._epoch_ended is not None:
                self.between_epochs_seconds.append(
                    self._epoch_began - self._epoch_ended
                    - (self.paused_before(self._epoch_began) - self.paused_before(self._epoch_ended)))

        def _row(self, step, logs):
            row = {"step": step, "time_s": self.clock() - self.start}
            for key in HISTORY_FIELDS[2:]:
                value = (logs or {}).get(key)
                row[key] = None if value is None else float(value)
            self.rows.append(row)
            if self.rows_path:
                with open(self.rows_path, "a") as f:
                    f.write(json.dumps(row) + "\n")

        def on_epoch_end(self, epoch, logs=None):
            step = (epoch + 1) * self.steps_per_epoch
            self._epoch_ended = self.clock()
            if self._epoch_began is not None:
                self.epoch_seconds.append(self._epoch_ended - self._epoch_began)
            if not self.per_batch:
                from tfgc.callbacks import per_step_traffic

                counters = self._counters()
                figures = per_step_traffic(self._last_counters, counters, self.steps_per_epoch)
                self._last_counters = counters
                if logs is not None:
                    logs.update({key: figures[key] for key in
                                 ("push_bytes", "push_dense_bytes", "compression_ratio")})
                self._row(step, logs)
            self.read_sockets(step)
            self.last_epoch_end = self.clock()

        def read_sockets(self, step):
            if self.cluster == "task":  # an MWMS worker: its own sockets to its peers
                from tfgc import cluster as cluster_lib

                peers = cluster_lib.task_traffic()
                self.socket_rows.append({
                    "step": step,
                    "sent": sum(v["sent"] for v in peers.values()),
                    "received": sum(v["received"] for v in peers.values()),
                })
            elif self.cluster is not None:
                rows = self.cluster.socket_bytes()
                self.socket_rows.append({
                    "step": step,
                    "worker_to_ps": self.cluster.traffic_between("worker", "ps", rows=rows),
                    "ps_to_worker": self.cluster.traffic_between("ps", "worker", rows=rows),
                    # The coordinator's calls (and what it sends once: the functions).
                    "chief_to_worker": self.cluster.traffic_between("chief", "worker", rows=rows),
                })

    class BatchRecorder(Recorder):
        def on_train_batch_end(self, batch, logs=None):
            self._row(self.epoch * self.steps_per_epoch + batch + 1, logs)

    return Recorder, BatchRecorder
