"""The MQGrad tf_keras callback: feeds an `MQGradAgent` the losses and times of
`model.fit` and writes its bits into a `Quantize` codec."""
import time
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tf_keras

from tfgc import _compat
from tfgc.codecs.adaptive import AdaptiveQuantize
from tfgc.codecs.quantize import Quantize
from tfgc.distribute import dense_nbytes
from tfgc.mqgrad.agent import MQGradAgent
from tfgc.optimizer.base import compressing_optimizer
from tfgc.wire.message import fused_nbytes


class MQGrad(tf_keras.callbacks.Callback):
    """Lets an `MQGradAgent` choose a `Quantize` codec's bits during `model.fit`.

        with strategy.scope():
            codec = tfgc.codecs.Quantize(bits=tf.Variable(2, dtype=tf.int32))
            optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.2), codec)
            model.compile(optimizer, loss)
        mqgrad = tfgc.callbacks.MQGrad(optimizer, T=5, seed=0)
        model.fit(data, callbacks=[mqgrad])
        tf.train.Checkpoint(model=model, agent=mqgrad.agent).save(path)

    After every batch the callback recovers the batch loss from the logs (Keras logs the
    epoch's running mean; the batch's own loss is (k+1)·mean_k - k·mean_{k-1}), measures
    the batch's time (wall time from batch begin to end, or `time_model`'s), feeds both to
    the agent and assigns the agent's bits to `codec.bits`. The batch logs get `bits`
    (the bits the batch just used) and `mqgrad_ms` (the time charged), except under
    ParameterServerStrategy, where batch logs are a read-only RemoteValue; the epoch logs
    (History, TensorBoard) get the bits in force at the epoch's end.

    The bits chosen at the end of batch m apply from batch m + 1: a Keras callback cannot
    act between a batch's loss and its update. The paper's iteration indices are kept
    (MDP step at m % T == 0, windows (t-1)T+1..tT), so each window's first loss comes
    from an update made with the previous window's bits.

    Distribution:

    * ParameterServerStrategy (tf_keras `fit`): the callback runs once, on the
      coordinator. Create the codec inside `strategy.scope()` so its `bits` variable lives
      on a parameter server; every worker reads it there. Reading the loss waits for each
      step to finish, so the bits assigned after step m are the ones every later step
      reads (the paper's server also waits for every loss before it answers).
    * MultiWorkerMirroredStrategy: every worker runs its own callback. At each MDP step
      the workers all-reduce their window of losses and times (a mean: the paper's global
      loss), so their agents, which must be built with the same `seed`, take identical
      decisions; the same collective compares the bits every worker uses and raises if
      they differ.

    Args:
      codec_or_optimizer: a `tfgc.codecs.Quantize` (with a `bits` variable), or a
        `tfgc.DistributedOptimizer` whose compression is one; None: the model's optimizer.
      T: iterations per MDP step.
      time_model: a `TimeModel` charging compute + bytes / bandwidth; None: wall time.
      loss_key: the logs entry holding the running mean loss.
      agent: an `MQGradAgent` to use (for example one restored from a checkpoint);
        exclusive with the agent arguments below.
      **agent_kwargs: `MQGradAgent` arguments (initial_bits, alpha, epsilon, eta,
        discount, reward_scale, min_bits, max_bits, hidden_units, seed).

    Attributes:
      agent: the `MQGradAgent`; save it with `tf.train.Checkpoint(agent=callback.agent)`.
      trace: one dict per batch: the bits used, the loss, the time charged (ms).
      steps: the agent's `last_step` dict of every MDP step, with the seconds it took.
    """

    def __init__(self, codec_or_optimizer: Any = None, T: int = 5,  # noqa: N803 (the paper's T)
                 time_model: Any = None, loss_key: str = "loss", agent: Any = None,
                 **agent_kwargs: Any) -> None:
        super().__init__()
        # Batch hooks under ParameterServerStrategy must take the logs as they come
        # (RemoteValues); `_number` fetches what it reads.
        self._supports_tf_logs = True
        if agent is not None:
            if agent_kwargs or T != agent.T:
                raise ValueError("pass either an agent or agent arguments, not both")
        else:
            agent = MQGradAgent(T=T, **agent_kwargs)
        self.agent = agent
        self.time_model = time_model
        self.loss_key = loss_key
        self._target = codec_or_optimizer
        self.codec: Optional[Quantize] = None
        self._optimizer = None
        self._bytes_by_bits: dict = {}
        self._multi_worker = False
        self._previous_mean: Optional[tuple[int, float]] = None
        self._batch_start: Optional[float] = None
        self.trace: list = []
        self.steps: list = []

    # --- setup ---

    def _resolve(self):
        target = self._target if self._target is not None else self.model.optimizer
        optimizer = None
        if isinstance(target, Quantize):
            codec = target
        else:
            # A loss-scale optimizer (mixed precision) holds the tfgc one.
            target = compressing_optimizer(target) or target
            codec, optimizer = getattr(target, "compression", None), target
        if not isinstance(codec, Quantize) or isinstance(codec, AdaptiveQuantize):
            raise TypeError(
                "MQGrad needs a tfgc.codecs.Quantize codec (or a DistributedOptimizer using "
                f"one) whose bits it can set; got {type(target).__name__}")
        if optimizer is None:
            model_optimizer = compressing_optimizer(getattr(self.model, "optimizer", None))
            if getattr(model_optimizer, "compression", None) is codec:
                optimizer = model_optimizer
        return codec, optimizer

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self.codec, self._optimizer = self._resolve()
        strategy = self.model.distribute_strategy
        self._multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        if self._multi_worker and not self.agent.seeded:
            raise ValueError(
                "Under MultiWorkerMirroredStrategy every worker runs MQGrad: pass the same "
                "seed= on every worker so that their agents make the same choices")
        steps_per_execution = _compat.tf_keras_steps_per_execution(self.model)
        if steps_per_execution is not None and int(steps_per_execution.numpy()) != 1:
            raise ValueError("MQGrad needs one callback call per step: compile with "
                             "steps_per_execution=1")
        self._set_bits(self.agent.bits)

    def on_epoch_begin(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._previous_mean = None

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._batch_start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        if isinstance(logs, dict):  # History and TensorBoard get the bits per epoch
            logs["bits"] = self.agent.bits

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # on_train_batch_begin set _batch_start.
        wall_ms = 1000.0 * (time.perf_counter() - self._batch_start)  # type: ignore[operator]
        # Under ParameterServerStrategy the logs are one RemoteValue: fetching it waits
        # for the step.
        values = logs.fetch() if hasattr(logs, "fetch") else (logs or {})
        if self.loss_key not in values:
            raise KeyError(f"MQGrad reads the loss from logs[{self.loss_key!r}]; the logs "
                           f"have {sorted(values)}")
        mean = _number(values[self.loss_key])
        if self._previous_mean is None:
            loss = mean
        else:
            seen, previous = self._previous_mean
            loss = ((batch + 1) * mean - seen * previous) / (batch + 1 - seen)
        self._previous_mean = (batch + 1, mean)
        used = self.agent.bits
        cost = wall_ms
        if self.time_model is not None:
            cost = self.time_model.cost_ms(wall_ms, self.step_bytes(used))
        started, steps_before = time.perf_counter(), self.agent.t
        bits = self.agent.observe(loss, cost, self._all_reduce if self._multi_worker else None)
        if self.agent.t != steps_before:
            step = dict(self.agent.last_step, seconds=time.perf_counter() - started)
            self.steps.append(step)
        if bits != used:
            self._set_bits(bits)
        self.trace.append({"bits": used, "loss": loss, "ms": cost})
        if isinstance(logs, dict):
            logs["bits"] = used
            logs["mqgrad_ms"] = cost

    def _set_bits(self, bits):
        self.codec.bits.assign(int(bits))

    # --- bytes per step (for the time model) ---

    def step_bytes(self, bits: int) -> int:
        """Bytes one step pushes with `bits`: every trainable variable's share of the
        fused message (`tfgc.wire`), as the optimizer counts it.

        Variables the optimizer compresses count the Quantize payload of their shape
        (its size does not depend on the values); the others their small-tensor
        payload, or their dense bytes without an optimizer.

        Raises:
          RuntimeError: training has not begun: `on_train_begin` (which `model.fit`
            calls) finds the codec and the optimizer whose bytes this counts.
        """
        if self.codec is None:
            raise RuntimeError(
                "MQGrad.step_bytes counts the bytes of the codec that on_train_begin "
                "finds: training has not begun (model.fit calls on_train_begin; a loop "
                "of its own calls set_model and on_train_begin first)")
        if bits not in self._bytes_by_bits:
            total = 0
            for variable in self.model.trainable_variables:
                optimizer = self._optimizer
                if optimizer is None and not variable.dtype.is_floating:
                    total += dense_nbytes(variable)
                    continue
                zeros = tf.zeros(variable.shape, variable.dtype)
                if optimizer is None or optimizer.compresses(variable):
                    # The bits as a tensor, as in training (a constant would be left
                    # out of the message as static).
                    total += fused_nbytes(self.codec.encode_with_bits,
                                          zeros,
                                          tf.constant(bits, tf.int32))
                else:
                    total += fused_nbytes(optimizer.wire_codec(variable).encode, zeros)
            self._bytes_by_bits[bits] = total
        return self._bytes_by_bits[bits]

    # --- agreement across workers (MultiWorkerMirroredStrategy) ---

    def _all_reduce(self, losses, costs, bits):
        """Mean of every worker's window; raises if the workers' bits differ."""
        strategy = self.model.distribute_strategy
        vector = tf.constant(np.concatenate([losses, costs, [bits]]), tf.float64)
        per_replica = strategy.experimental_distribute_values_from_function(lambda _: vector)
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        mean = total.numpy() / strategy.num_replicas_in_sync
        if mean[-1] != bits:
            raise RuntimeError(
                f"MQGrad agents disagree across workers: this one uses {bits} bits, the "
                f"mean is {mean[-1]}; build every worker's MQGrad with the same arguments "
                "and seed, and restore the same checkpoint on all of them")
        n = len(losses)
        return mean[:n], mean[n:2 * n]


def _number(value):
    """A Python float from a logs value: a number, a numpy value or a tensor."""
    if hasattr(value, "fetch"):  # a RemoteValue
        value = value.fetch()
    if hasattr(value, "numpy"):
        value = value.numpy()
    return float(value)
