"""Parameter-server training that survives a dead task: restart, restore, go on.

TensorFlow's ClusterCoordinator recovers from a worker that dies, but not from a
parameter server: `fit` raises UnavailableError, and the coordinator's process cannot
go on even once the server is back (its eager context still refers to the dead
server's resources). A fresh coordinator that restores the last checkpoint resumes
exactly, so `models.train --strategy ps` runs each attempt in a child process:

1. the child starts its local cluster and trains with tf_keras `BackupAndRestore`,
   which saves the model and optimizer (error-feedback counters and byte counters
   included) at the end of each Keras epoch (`--log-every` steps) that ends
   `--backup-every-s` seconds or more after the last save (or the start of training);
2. when `fit` fails and a task of its cluster is dead, the child exits with
   `EXIT_TASK_LOST`;
3. this supervisor then starts a fresh attempt, whose `BackupAndRestore` resumes at the
   first epoch not yet saved, up to `--max-restarts` times.

An attempt whose loss became NaN or infinite exits with `EXIT_DIVERGED`
(`models.divergence`) and is not restarted: it would resume at the same learning rate.

At most `--backup-every-s` seconds of steps plus one Keras epoch are redone per
restart. Saving is not free: under ParameterServerStrategy TensorFlow traces a new
save function for every save, which with ResNet-20 on two cores costs ~1 s of the
coordinator's time; saved every 10-step epoch, that was 15-20% of fp32's step time.
Per-worker state that lives only on the workers (error-feedback residuals, pull caches)
starts over from zeros, as when a worker restarts. History rows of earlier attempts are
kept; socket counters and step times cover the last attempt only.
"""
import os
import shutil
import subprocess
import sys
import time

from models.divergence import EXIT_DIVERGED

EXIT_TASK_LOST = 75  # EX_TEMPFAIL: a task of the attempt's cluster died


class TaskLost(RuntimeError):
    """Training stopped because a task of the local cluster died."""


def _log(message):
    print(f"[models.train] {message}", file=sys.stderr, flush=True)


def run_with_restarts(argv, out, max_restarts):
    """Runs `python -m models.train <argv> --_attempt` until it succeeds.

    Args:
      argv: the command line of this run (without `--_attempt`).
      out: the run's output directory (backups and rows of earlier attempts go there;
        those of an earlier run are removed first).
      max_restarts: how many times an attempt that lost a task is started again.

    Returns:
      The exit code of the last attempt.
    """
    from tfgc.cluster.processes import die_with_parent

    clear(out)
    command = [sys.executable, "-m", "models.train", *argv, "--_attempt"]
    for attempt in range(max_restarts + 1):
        # Same process group: a Ctrl-C reaches the attempt too; it dies with us.
        proc = subprocess.Popen(command, preexec_fn=die_with_parent)
        try:
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != EXIT_TASK_LOST:
            if code == 0:
                clear(out)
            elif code == EXIT_DIVERGED:
                # Resuming would redo the same steps at the same learning rate.
                _log("the loss diverged (see above); not restarting")
            return code
        if attempt < max_restarts:
            _log(f"a task of the cluster died; restarting the cluster and resuming from the "
                 f"last backup (restart {attempt + 1} of {max_restarts})")
    _log(f"a task of the cluster died again after {max_restarts} restart(s); giving up")
    return EXIT_TASK_LOST


def backup_dir(out):
    """Where an attempt's `BackupAndRestore` keeps its checkpoint."""
    return os.path.join(out, "backup")


def backup_callbacks(out, every_s=0.0, clock=time.monotonic, pause=None):
    """(first, last): tf_keras `BackupAndRestore` for `backup_dir(out)`, split in two.

    Put `first` before every other callback and `last` after them: the backup is
    restored before any callback starts training (the recorder reads the restored
    step), and an epoch is saved only after every callback has ended it (the recorder
    has written the epoch's history row). Saved first, a backup could cover an epoch
    whose row was lost with the parameter server that died in between.

    Args:
      out: the run's output directory.
      every_s: `last` saves each epoch that ends at least this many seconds after the
        previous save ended, or training began (0: every epoch).
      clock: seconds, monotonic (tests pass their own).
      pause: called as `pause(began, seconds)` (`clock()` times) after each save;
        `models.train` passes its recorder's, which takes the save off the run's clock.
    """
    import tf_keras

    class RestoreFirst(tf_keras.callbacks.BackupAndRestore):
        def on_epoch_end(self, epoch, logs=None):
            pass  # `last` saves

        def save(self, epoch, logs):
            super().on_epoch_end(epoch, logs)

    class SaveLast(tf_keras.callbacks.Callback):
        def __init__(self, backup):
            super().__init__()
            self.backup = backup
            self.saved_at = None  # clock() when the last save ended

        def on_train_begin(self, logs=None):
            self.saved_at = clock()

        def on_epoch_end(self, epoch, logs=None):
            began = clock()
            if began - self.saved_at < every_s:
                return
            self.backup.save(epoch, logs)
            self.saved_at = clock()
            if pause is not None:
                pause(began, self.saved_at - began)

    if every_s < 0:
        raise ValueError(f"every_s must be >= 0, got {every_s}")
    first = RestoreFirst(backup_dir(out))
    return first, SaveLast(first)


def rows_path(out):
    """Where attempts keep the history rows written so far."""
    return os.path.join(out, "history-attempts.jsonl")


def clear(out):
    """Removes what attempts leave behind (a new run starts from step 0)."""
    shutil.rmtree(backup_dir(out), ignore_errors=True)
    try:
        os.remove(rows_path(out))
    except FileNotFoundError:
        pass
