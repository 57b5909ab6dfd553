"""Keras (tf_keras) callbacks of tfgc; imported on first use, as they need tf_keras."""
from typing import Any, Optional

import tf_keras

from tfgc.distribute import is_parameter_server
from tfgc.mqgrad.callback import MQGrad
from tfgc.optimizer.base import compressing_optimizer
from tfgc.telemetry import TrafficLogger

__all__ = ["MQGrad", "OuterSteps", "TrafficLogger"]


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
