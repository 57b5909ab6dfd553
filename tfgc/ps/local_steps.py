"""Local steps under ParameterServerStrategy: each worker trains its own copy of the
model and meets the parameter servers every H of its own steps (tfgc.local_steps).

The copy is the worker's caches of compressed pulls (tfgc.ps.variables), so the model is
made under `tfgc.compressed_pulls()` and the optimizer has a `pull_compression`. In a
worker's step k (its own count, `CompressedPulls.local_step`):

    k % H == 0          the step pulls (the master's change, compressed); the copy's
                        value then is the round's anchor
    every step          copy <- inner step(copy, gradient)        on the worker alone
    (k + 1) % H == 0    the worker pushes d = anchor - copy (compressed, with error
                        feedback) in one message to each server, which applies the
                        outer step to the master with the worker's share of the
                        workers' mean, d / W:
                            m <- momentum * m + d / W
                            master <- master - lr * (d / W + momentum * m)    (Nesterov)
                        and the copy returns to the anchor, which is what the server's
                        snapshot of it holds, so the next pull brings the master's change

The step's batch-norm statistics updates for the servers (`tfgc.ps.moving_statistics`)
wait on the worker too: each step folds them into a per-worker state, and the meeting's
message carries the one update they compose to, which leaves each server's statistics
as the worker's updates one after another would have (between meetings a server's
statistics are those of the workers' last meetings).

Workers meet asynchronously, as ParameterServerStrategy's workers push gradients: each
meeting applies that worker's share at once (there is no mean to wait for), so W
workers that meet from one anchor move the master to their copies' mean with
`OuterSGD.averaging()` (learning rate 1, no momentum), as under MultiWorkerMirrored.
With one worker, averaging and H = 1, a step is the synchronous step: the worker's SGD
step, pushed and applied to the master (with W workers, `OuterSGD(learning_rate=W,
momentum=0)` applies each worker's step in full, as synchronous training does).

The inner optimizer runs on the worker, where tfgc makes its step: tf_keras's SGD
(momentum, Nesterov), Adam or AdamW (DiLoCo's inner optimizer), with weight decay and a
learning-rate schedule of the optimizer's `iterations`, which count every worker's
steps. Adam's bias correction counts the worker's own steps: each worker runs an Adam
of its own. The inner optimizer's slots (momentum, or Adam's moments), the anchors and
the residuals are per-worker variables, as the caches are; a restarted worker (or a
resumed run) starts a round afresh: a full pull, its anchor from it, zero slots and its
step count at 0. The outer momentum lives on the servers beside the masters and is
checkpointed with the optimizer.

Branches: a meeting is two `tf.cond`s of the step, the worker's encoding and each
server's decoding and outer step (see `ServerMeetings._meet_when_due`); a branch's
function cannot reach a worker's per-worker variables, so those are read before the
branches and written after them (the residuals through `tfgc.memory.StagedResidual`).
"""
import warnings
from typing import Any, Iterable, Optional, Sequence, Union

import tensorflow as tf

from tfgc import _compat
from tfgc.codecs import base
from tfgc.distribute import local_variable, num_workers, zeros_of
from tfgc.memory import StagedResidual
from tfgc.ps.server_variables import created_by_name
from tfgc.ps.variables import PulledVariable
from tfgc.ps import riders
from tfgc.wire.wires import ParameterServerPush


def check_inner_optimizer(optimizer: Any) -> None:
    """Raises NotImplementedError unless `optimizer` (a tf_keras optimizer) is one whose
    step tfgc runs on a worker: SGD, Adam or AdamW, without gradient clipping (nor
    AMSGrad)."""
    import tf_keras  # noqa: PLC0415

    if not isinstance(optimizer, (tf_keras.optimizers.SGD, tf_keras.optimizers.Adam,
                                  tf_keras.optimizers.AdamW)):
        raise NotImplementedError(
            "local_steps under ParameterServerStrategy runs the inner optimizer's step on "
            "each worker, which tfgc does for tf_keras.optimizers.SGD, Adam and AdamW "
            f"(weight decay, schedules) only, not yet for {type(optimizer).__name__}")
    clipping = {name: getattr(optimizer, name, None)
                for name in ("clipnorm", "clipvalue", "global_clipnorm")}
    if any(value is not None for value in clipping.values()):
        raise NotImplementedError(
            "local_steps under ParameterServerStrategy does not clip gradients yet: make "
            f"the optimizer without "
            f"{', '.join(k for k, v in clipping.items() if v is not None)}")
    if getattr(optimizer, "amsgrad", False):
        raise NotImplementedError(
            "local_steps under ParameterServerStrategy does not run AMSGrad's step yet: "
            "make the Adam without amsgrad")


class PackedPerWorker:
    """Per-worker tensors of given shapes kept in one per-worker variable per dtype.

    A traced step passes the coordinator's call to a worker one remote handle per
    per-worker variable it touches (about 90 bytes each, every step): ResNet-20's local
    steps kept an anchor and a momentum per model variable, 130 handles and 11 KB of
    every call. Packed, they are one handle per dtype; reads and writes go through the
    whole buffer, once per step.

    Args:
      specs: (shape, dtype) of each tensor, in order.
      name: the variables' name (the dtype's name is appended).
    """

    def __init__(self, specs: Sequence[tuple[base.Shape, tf.DType]], name: str) -> None:
        self._dtypes = [tf.as_dtype(dtype) for _, dtype in specs]
        # Each dtype's shapes, in order: its buffer holds them end to end.
        self._shapes: dict[tf.DType, list[tf.TensorShape]] = {}
        for (shape, _), dtype in zip(specs, self._dtypes):
            self._shapes.setdefault(dtype, []).append(tf.TensorShape(shape))
        self._buffers = {
            dtype: local_variable(zeros_of([sum(s.num_elements() for s in shapes)], dtype),
                                  f"{name}/{dtype.name}", per_worker=True)
            for dtype, shapes in self._shapes.items()}

    def read(self) -> list[tf.Tensor]:
        """The tensors, in the order of `specs`."""
        parts = {dtype: iter(base.split_flat(tf.convert_to_tensor(buffer), self._shapes[dtype]))
                 for dtype, buffer in self._buffers.items()}
        return [next(parts[dtype]) for dtype in self._dtypes]

    def assign(self, values: Sequence[tf.Tensor]) -> list[Any]:
        """The writes of `values` (tensors in the order of `specs`): one op per dtype."""
        return [buffer.assign(base.concat_flat(
                    [value for value, d in zip(values, self._dtypes) if d == dtype]))
                for dtype, buffer in self._buffers.items()]


class _InnerState:
    """The inner optimizer's slots, `slot_names` per model variable, packed per worker."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, optimizer, masters):
        self.optimizer = optimizer
        self._count = len(masters)
        self._state = (PackedPerWorker([(m.shape, m.dtype) for m in masters
                                        for _ in self.slot_names], "inner_slots")
                       if self.slot_names else None)

    def read(self):
        """Each model variable's slot values, as `step` takes them (once per step)."""
        if self._state is None:
            return [[] for _ in range(self._count)]
        values, per = self._state.read(), len(self.slot_names)
        return [values[i * per:(i + 1) * per] for i in range(self._count)]

    def assign(self, slot_values):
        """The writes of each model variable's new slot values (`step`'s second value)."""
        if self._state is None:
            return []
        return self._state.assign([value for values in slot_values for value in values])


class InnerSGD(_InnerState):
    """tf_keras SGD's step on a worker's copy: its momentum (if any) per-worker."""

    counts_steps = False

    def __init__(self, optimizer: Any, masters: Sequence[tf.Variable]) -> None:
        self.slot_names = ("momentum",) if optimizer.momentum else ()
        super().__init__(optimizer, masters)

    def step(self, copy: tf.Tensor, gradient: tf.Tensor, rate: tf.Tensor,
             slots: Sequence[tf.Tensor], step_number: Optional[tf.Tensor]
             ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(the copy after the step, the new values of its `slots`)."""
        del step_number
        if not slots:
            return copy - gradient * rate, []
        momentum = tf.cast(self.optimizer.momentum, copy.dtype)
        velocity = -gradient * rate + momentum * slots[0]
        step = -gradient * rate + momentum * velocity if self.optimizer.nesterov else velocity
        return copy + step, [velocity]


class InnerAdam(_InnerState):
    """tf_keras Adam's (and AdamW's) step on a worker's copy: its first and second
    moments per-worker, bias-corrected with the worker's own step number (each worker
    runs an Adam of its own)."""

    counts_steps = True
    slot_names = ("m", "v")

    def step(self, copy: tf.Tensor, gradient: tf.Tensor, rate: tf.Tensor,
             slots: Sequence[tf.Tensor], step_number: Optional[tf.Tensor]
             ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(the copy after the step, the new first and second moments)."""
        optimizer, dtype = self.optimizer, copy.dtype
        beta_1, beta_2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
        number = tf.cast(step_number, dtype)
        alpha = rate * tf.sqrt(1 - tf.pow(beta_2, number)) / (1 - tf.pow(beta_1, number))
        m, v = slots
        m = m + (gradient - m) * (1 - beta_1)
        v = v + (tf.square(gradient) - v) * (1 - beta_2)
        return copy - (m * alpha) / (tf.sqrt(v) + tf.cast(optimizer.epsilon, dtype)), [m, v]


def inner_step(optimizer: Any, masters: Sequence[tf.Variable]) -> Union[InnerSGD, InnerAdam]:
    """The worker's side of `optimizer`'s step (checked by `check_inner_optimizer`)."""
    import tf_keras  # noqa: PLC0415

    if isinstance(optimizer, tf_keras.optimizers.SGD):
        return InnerSGD(optimizer, masters)
    return InnerAdam(optimizer, masters)


class ServerMeetings:
    """One optimizer's local steps under ParameterServerStrategy (see the module doc).

    Args:
      optimizer: the tfgc tf_keras optimizer (built: its encoder and counters exist).
      variables: its model variables, `PulledVariable`s whose pulls have started with
        its `local_steps`.

    Raises:
      ValueError: a variable is not pulled, or its pulls do not skip the local steps.
      NotImplementedError: an inner optimizer other than SGD (`check_inner_optimizer`),
        or a codec that keeps per-worker state (`Codec.keeps_sender_state`).
    """

    def __init__(self, optimizer: Any, variables: Iterable[tf.Variable]) -> None:
        check_inner_optimizer(optimizer)
        for variable in variables:
            if not isinstance(variable, PulledVariable):
                raise ValueError(
                    f"local_steps under ParameterServerStrategy trains each worker's copy of "
                    f"the model, its caches of compressed pulls; {variable.name} has none: "
                    "make the model inside `servers.scope()` of the tfgc.ParameterServers "
                    "handed to the optimizer (with min_elements=0, the default)")
            codecs = variable.owner.codecs
            if codecs is None or codecs.local_steps != optimizer.local_steps:
                raise ValueError(
                    f"{variable.name} is pulled every {1 if codecs is None else codecs.local_steps}"
                    f" step(s), but the optimizer takes local_steps={optimizer.local_steps}: "
                    "make the model in the scope of tfgc.ParameterServers(..., local_steps="
                    f"{optimizer.local_steps}) and hand it to the optimizer "
                    "(parameter_servers=...), so that its pulls follow its local steps")
        self.optimizer = optimizer
        self.variables = list(variables)
        self.masters = [v.master for v in self.variables]
        if optimizer.outer_optimizer.momentum > 0:
            warnings.warn(
                "local_steps under ParameterServerStrategy with an outer momentum: each "
                "worker's meeting is an outer step of its own, and Nesterov meetings (0.7, "
                "momentum 0.9) did not train ResNet-20 with 2 workers where averaging did "
                "(docs/results/local-steps.md); consider "
                "outer_optimizer=tfgc.OuterSGD.averaging()", stacklevel=2)
        encoder = optimizer.encoder
        stateful = [m.name for m in self.masters
                    if encoder.compresses(m) and encoder.bound_codec(m).keeps_sender_state]
        if stateful:
            raise NotImplementedError(
                f"local_steps under ParameterServerStrategy encodes a meeting's "
                "pseudo-gradients in a branch, where a codec's per-worker state cannot be "
                f"read yet; the codec of {stateful[0]} keeps some ({encoder.compression!r}): "
                "use a codec without it (ThreeLC, Quantize, TopK, ...)")
        self._positions = {id(master): i for i, master in enumerate(self.masters)}
        self._workers = float(num_workers())
        self.counters = list({id(v.owner): v.owner.local_step
                              for v in self.variables if v.owner.local_step is not None}.values())
        # With one local step the anchor is the step's own copy: no variable.
        self.anchors = (PackedPerWorker([(m.shape, m.dtype) for m in self.masters], "anchors")
                        if optimizer.local_steps > 1 else None)
        self.inner = inner_step(optimizer, self.masters)
        outer = optimizer.outer_optimizer
        self._round_riders = self._round_rider_sizes = None  # made in the first step
        with created_by_name():  # reached by name on their servers (tfgc.ps.server_variables)
            self.outer_momenta = ([optimizer.add_variable_from_reference(m, "outer_momentum")
                                   for m in self.masters] if outer.momentum > 0 else None)

    def step(self, grads_and_vars: Iterable[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]],
                                                  tf.Variable]]) -> tf.Operation:
        """One local step of this worker (replica context, in a traced step): the
        inner SGD step on its copy, and a meeting when one is due.

        Args:
          grads_and_vars: (gradient, `PulledVariable`) pairs of `variables` (a missing
            or None gradient is a zero one).

        Returns:
          The op that finishes the step.

        Raises:
          ValueError: a variable that is not one of `variables`.
        """
        optimizer = self.optimizer
        gradients = [None] * len(self.variables)
        for gradient, variable in grads_and_vars:
            position = self._positions.get(id(getattr(variable, "master", variable)))
            if position is None:
                raise ValueError(
                    f"{variable.name} is not among the {len(self.variables)} variables this "
                    "optimizer's local steps were made for (the model's first step's)")
            gradients[position] = gradient
        every = optimizer.local_steps
        if every == 1:
            step_count, round_start, meeting = None, True, True
        else:
            step_count = tf.convert_to_tensor(self.counters[0])
            round_start = step_count % every == 0
            meeting = (step_count + 1) % every == 0
        rate = _compat.tf_keras_learning_rate_now(optimizer)
        # This worker's step, counted from 1 (Adam's bias correction); with a meeting
        # every step, the optimizer's count (read only where it is used: it lives on a
        # server).
        step_number = None
        if self.inner.counts_steps:
            step_number = (optimizer.iterations if every == 1 else step_count) + 1  # type: ignore[operator]  # a tensor where every > 1
        anchors, copies, slot_values = [], [], []
        old_anchors = None if every == 1 else self.anchors.read()  # type: ignore[union-attr]  # made where every > 1
        old_slots = self.inner.read()
        for index, (gradient, variable) in enumerate(zip(gradients, self.variables)):
            copy = tf.convert_to_tensor(variable)  # the cache, after this step's pull
            gradient = tf.zeros_like(copy) if gradient is None else gradient
            anchor = copy if every == 1 else tf.where(round_start, copy, old_anchors[index])  # type: ignore[index]  # read where every > 1
            rate_here = tf.cast(rate, copy.dtype)
            if _compat.tf_keras_uses_weight_decay(optimizer, variable.master):
                copy = copy - copy * tf.cast(optimizer.weight_decay, copy.dtype) * rate_here
            new_copy, values = self.inner.step(copy, tf.convert_to_tensor(gradient), rate_here,
                                               old_slots[index], step_number)
            anchors.append(anchor)
            copies.append(new_copy)
            slot_values.append(values)
        deltas = [(anchor - copy, master)
                  for anchor, copy, master in zip(anchors, copies, self.masters)]
        if every == 1:
            on_servers, writes = self._meet(optimizer.encoder, deltas), []
        else:
            on_servers, writes = self._meet_when_due(meeting, deltas)
            on_servers += self._send_riders()
            writes += self.anchors.assign(anchors)  # type: ignore[union-attr]  # made where every > 1
        # The optimizer's step count, on a server, follows the servers' part of the step;
        # the worker's writes follow nothing there (a control edge across costs a request
        # on every step), as they share no state with it.
        with tf.control_dependencies(on_servers):
            optimizer.iterations.assign_add(1)
        writes += [variable.cache.assign(tf.where(meeting, anchor, copy) if every > 1 else anchor)
                   for variable, anchor, copy in zip(self.variables, anchors, copies)]
        writes += self.inner.assign(slot_values)
        # After this step's pull has read the count (it reaches it through a handle of
        # its own, which TensorFlow's automatic ordering does not connect to this one).
        with tf.control_dependencies(copies):
            writes += [counter.assign(step_count + 1) for counter in self.counters]  # type: ignore[operator]  # no counter where every == 1
        return tf.group(writes)

    def _meet_when_due(self, meeting, deltas):
        """`_meet` when `meeting`, in branches; returns (the servers' ops, the worker's
        residual writes).

        The worker encodes the pseudo-gradients in a branch of its own, which reads and
        writes none of its per-worker variables (a branch's function cannot reach them):
        it is given the residuals' values and returns their new ones, kept where
        `meeting`. Each server's part is a branch on that server, decided there by the
        size of its message (empty when the worker does not meet): a condition that
        crossed, or ops of the branch waiting on the worker, would each cost a request
        on every step."""
        encoder = self.optimizer.encoder
        residuals = encoder.residuals_by_key(self.masters)
        keys = list(residuals)
        olds = [residuals[key].read_value() for key in keys]
        destinations = list(dict.fromkeys(master.device for _, master in deltas))
        carried, folding = self._fold_riders(meeting, destinations)
        packed = {}

        def encode():
            staged = {key: StagedResidual(old) for key, old in zip(keys, olds)}
            packed["wire"] = ParameterServerPush(encoder.with_residuals(staged))
            packed["deltas"], packed["messages"] = packed["wire"].pack(
                deltas, riders_too=False, carried=carried)
            if [m.destination for m in packed["messages"]] != destinations:
                raise RuntimeError(f"the push grouped {deltas} otherwise than by server")
            return [m.message for m in packed["messages"]], [staged[k].value for k in keys]

        def keep():
            return [tf.zeros([0], tf.uint8) for _ in destinations], olds

        sent, news = tf.cond(meeting, encode, keep)
        met = []
        for message, bytes_sent in zip(packed["messages"], sent):
            with tf.device(message.destination):
                # The size and the branch read one copy made on the server: given the
                # worker's tensor, each received it, and the message crossed twice.
                arrived = tf.identity(bytes_sent)
                message = message._replace(message=arrived)
                met.append(tf.cond(
                    tf.size(arrived) > 0,
                    lambda m=message: self._receive(packed["wire"], packed["deltas"], m),
                    tf.no_op))
        return met, folding + [residuals[key].assign(new) for key, new in zip(keys, news)]

    def _fold_riders(self, meeting, destinations):
        """Folds this step's riders that fold (batch-norm statistics) into the round's
        state on the worker (`tfgc.ps.riders`), sent when it meets.

        Returns:
          ({destination: riders that make the round's updates}, for the meeting's
          messages; the state's write: the folded state, or zeros after a meeting).
        """
        taken = [(device, rider) for device in destinations
                 for rider in riders.take(device, folding=True)]
        if not taken:
            return {}, []
        sizes = [rider.state_size() for _, rider in taken]
        if self._round_riders is None:
            with tf.init_scope():  # made in the first step
                self._round_riders = local_variable(zeros_of([sum(sizes)], tf.float32),
                                                    "round_riders", per_worker=True)
            self._round_rider_sizes = sizes
        elif sizes != self._round_rider_sizes:
            raise RuntimeError(f"a step made riders of sizes {sizes} where the first "
                               f"step's were {self._round_rider_sizes}")
        olds = tf.split(tf.convert_to_tensor(self._round_riders), sizes)
        news = [rider.fold(old) for (_, rider), old in zip(taken, olds)]
        carried = {}
        for (device, rider), new in zip(taken, news):
            carried.setdefault(device, []).append(rider.folded(new))
        state = tf.concat(news, axis=0)
        return carried, [self._round_riders.assign(
            tf.where(meeting, tf.zeros_like(state), state))]

    def _send_riders(self):
        """The step's other updates for the servers that do not fold, one message per
        server (a meeting's message may not be sent); returns the ops."""
        wire = ParameterServerPush(self.optimizer.encoder)
        ops = []
        for device in dict.fromkeys(master.device for master in self.masters):
            sent = wire.send_riders(device)
            if sent:
                ops.append(self.optimizer.traffic_counters.record("push", sent))
        return ops

    def _meet(self, encoder, deltas):
        """Pushes the pseudo-gradients `deltas` ((delta, master) pairs) through the fused
        push and applies the outer step on the servers; returns the ops."""
        wire = ParameterServerPush(encoder)
        deltas, messages = wire.pack(deltas)
        return [self._receive(wire, deltas, message) for message in messages]

    def _receive(self, wire, deltas, message):
        """A server's part of a meeting: its `message` unpacked and decoded, the outer
        step applied to its masters, the bytes counted; returns the op."""
        outer = self.optimizer.outer_optimizer
        updates = []
        with tf.device(message.destination):  # a branch's ops do not inherit the device
            received, sent = wire.receive((deltas, [message]))
            for position in message.positions:
                delta, master = received[position]
                index = self._positions[id(master)]
                momentum = None if self.outer_momenta is None else self.outer_momenta[index]
                step = outer.step(tf.convert_to_tensor(delta) / self._workers, momentum)
                updates.append(master.assign_sub(tf.cast(step, master.dtype)))
            with tf.control_dependencies(updates):
                self.optimizer.traffic_counters.record("push", sent)
            return tf.group(updates)
