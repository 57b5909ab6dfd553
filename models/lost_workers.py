"""Workers lost during parameter-server training, said aloud.

TensorFlow's ClusterCoordinator reschedules a dead worker's steps on the others and
says nothing: a run that lost a worker finishes on the rest with exit code 0. On a local
cluster (`tfgc.cluster.LocalCluster`, which knows its processes) this callback looks at
every epoch's end for workers that exited, logs each once with its task and exit code,
and records them for the run's summary. On a cluster described by TF_CONFIG the
processes are not this one's to watch, and nothing is recorded.
"""


def watcher(cluster, log):
    """A tf_keras callback that logs lost workers of `cluster` with `log(message)`.

    Its `lost` is a list of {"task", "exit_code", "noticed_after_epoch"}; `finished`
    is how many workers were alive at the end of training.
    """
    import tf_keras

    class LostWorkers(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.lost = []
            self.finished = len(cluster.pids["worker"])

        def _look(self, epoch):
            known = {entry["task"] for entry in self.lost}
            for (job, index), code in cluster.exited_servers().items():
                task = f"{job}:{index}"
                if job != "worker" or task in known:
                    continue
                self.lost.append({"task": task, "exit_code": code,
                                  "noticed_after_epoch": epoch})
                self.finished -= 1
                log(f"worker {index} exited with code {code} (noticed after epoch "
                    f"{epoch + 1}); training goes on with {self.finished} worker"
                    f"{'s' if self.finished != 1 else ''}: ParameterServerStrategy runs its "
                    "steps on the others")

        def on_epoch_end(self, epoch, logs=None):
            self._look(epoch)

        def on_train_end(self, logs=None):
            self._look(self.params.get("epochs", 1) - 1)

    return LostWorkers()
