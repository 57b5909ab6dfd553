"""DistributedOptimizer for tf_keras optimizers: parameter servers (pushes and pulls),
all-reduce strategies and one process."""
import contextlib
import warnings
from typing import Any

import tensorflow as tf

from tfgc import _compat, local_steps
from tfgc.distribute import is_parameter_server
from tfgc.optimizer import compiled, finite_steps, xla
from tfgc.ps import local_steps as local_steps_ps
from tfgc.optimizer.base import CompressingBase, compressing_optimizer, compressing_subclass
from tfgc.optimizer.loss_scale import agree_on_finiteness
from tfgc.ps.server_variables import created_by_name

_DISTRIBUTED_CLASSES: dict = {}


def distributed_class(optimizer_class: type[Any]) -> type[Any]:
    """The compressing subclass of a tf_keras optimizer class (made once per class)."""
    import tf_keras  # noqa: PLC0415

    return compressing_subclass(_CompressingMixin, optimizer_class, _DISTRIBUTED_CLASSES,
                                tf_keras.saving.register_keras_serializable)


def register_tf_keras_optimizers() -> None:
    """Makes the compressing class of every tf_keras built-in optimizer, and of
    `tfgc.BoundedAdam`, known to tf_keras's deserialization (`load_model`), and keeps
    models whose tfgc optimizer XLA cannot compile out of XLA and schedules the steps of
    those under ParameterServerStrategy without waiting on a server
    (`tfgc.optimizer.compiled`); `import tfgc` calls it. A no-op without tf_keras."""
    try:
        import tf_keras  # noqa: PLC0415
    except ImportError:
        return
    from tfgc.optimizer.bounded_adam import BoundedAdam  # noqa: PLC0415 (needs tf_keras)

    compiled.adapt_after_compile(
        tf_keras.Model, xla.turn_xla_off_for_tfgc, schedule_steps_without_waiting)
    for value in [*vars(tf_keras.optimizers).values(), BoundedAdam]:
        if (isinstance(value, type) and issubclass(value, tf_keras.optimizers.Optimizer)
                and value is not tf_keras.optimizers.Optimizer):
            distributed_class(value)


def schedule_steps_without_waiting(model: Any) -> None:
    """Under ParameterServerStrategy, keeps what tf_keras's `fit` waits for on each step
    off the parameter servers, for a tf_keras model compiled with a tfgc optimizer.

    - `steps_per_execution`, which `fit` reads on the coordinator before it schedules
      each step, becomes a variable of the coordinator: on a server, each read cost three
      round trips, and on a slow link the workers waited for their next step
      (`_compat.tf_keras_keep_steps_per_execution_on_the_coordinator`).
    - The step counter, on a server, counts a step when it starts instead of waiting
      for its loss from the worker, one round trip of the server's part of every step
      (`_compat.tf_keras_count_steps_when_they_start`). A step the coordinator runs again
      after a worker failure is then counted twice (the counter is read by the progress
      bar when it has no step count, and by TensorBoard's per-batch summaries).
    - The metrics, on a server, are reset at each epoch's start and read at its end in
      one call each rather than one round trip per variable
      (`_compat.tf_keras_read_metrics_in_one_call`).
    """
    if compressing_optimizer(getattr(model, "optimizer", None)) is None:
        return
    if not is_parameter_server(model.distribute_strategy):
        return
    _compat.tf_keras_keep_steps_per_execution_on_the_coordinator(model, _coordinator_variable)
    _compat.tf_keras_count_steps_when_they_start(model)
    _compat.tf_keras_read_metrics_in_one_call(model)


def _coordinator_variable(value: Any) -> tf.Variable:
    """An int64 variable of this process (the coordinator), outside any strategy."""
    with tf.init_scope():
        # (A class the fence binds at import: None to the type checker.)
        return _compat.ResourceVariable(  # type: ignore[misc]
            tf.constant(value, tf.int64), trainable=False)


class _CompressingMixin(CompressingBase):
    """tf_keras: overrides `build` (codecs, buffers) and `apply_gradients` (the wire, or
    a local step)."""

    runs_local_steps = True

    def get_config(self):
        return self._compression_config(super().get_config())

    def _variable_index(self, variable):
        try:
            return _compat.tf_keras_variable_index(self, variable)
        except KeyError:
            raise self._unknown_variable(variable, _compat.tf_keras_num_variables(self)) from None

    def build(self, var_list):
        masters = self._masters(var_list)
        with created_by_name():  # the slots, reached by name (tfgc.ps.server_variables)
            super().build(masters)
        self._build_compression(masters)
        self._take_pulls(var_list)
        if self.outer_optimizer is not None:
            self._build_local_steps(masters)

    def _build_local_steps(self, variables):
        """The anchors, outer momenta and last meeting's step of local steps."""
        if getattr(self, "_meetings", None) is not None:
            return
        strategy = tf.distribute.get_strategy()
        if is_parameter_server(strategy) or self._saw_pulled:
            local_steps_ps.check_inner_optimizer(self)
            if not is_parameter_server(strategy):
                raise NotImplementedError(
                    "local_steps with compressed pulls in one process is not built yet: "
                    "they run under ParameterServerStrategy (with compressed pulls), "
                    "MultiWorkerMirroredStrategy, MirroredStrategy and in one process "
                    "without compressed pulls")
            return  # made with the model's variables at the first step (`_apply_locally`)
        anchors = [self.add_variable_from_reference(v, "anchor", initial_value=v)
                   for v in variables]
        momenta = ([self.add_variable_from_reference(v, "outer_momentum") for v in variables]
                   if self.outer_optimizer.momentum > 0 else None)
        synced_at = self.add_variable(shape=(), dtype=tf.int64, name="synced_at")
        self._meetings = local_steps.Meetings(list(variables), anchors, momenta, synced_at)

    def _deduplicate_sparse_grad(self, grads):  # _compat.TF_KERAS_DEDUPLICATE_SPARSE_GRAD
        # tf_keras sums the rows of every sparse gradient first, on no device in
        # particular: on a worker, where a gradient decoded on a parameter server would
        # cross to the worker and back. Sum each where it was decoded.
        deduplicated = []
        for grad in grads:
            on_decoder = isinstance(grad, tf.IndexedSlices) and grad.values.device
            with tf.device(grad.values.device) if on_decoder else contextlib.nullcontext():
                deduplicated += _compat.tf_keras_deduplicate_sparse_grad(super(), [grad])
        return deduplicated

    def aggregate_gradients(self, grads_and_vars):
        """Leaves the replicas' gradients to the compressed wire of `apply_gradients`.

        Called by a wrapper that sums gradients before it applies them (tf_keras's
        LossScaleOptimizer); see tfgc.optimizer.loss_scale.
        """
        strategy = tf.distribute.get_strategy()
        if self.outer_optimizer is not None:
            raise NotImplementedError(
                "local_steps with a LossScaleOptimizer (mixed_float16) is not built yet")
        if is_parameter_server(strategy) or strategy.num_replicas_in_sync == 1:
            return super().aggregate_gradients(grads_and_vars)
        self._deferred_aggregation = True
        return agree_on_finiteness(grads_and_vars)

    def apply_gradients(self, grads_and_vars, name=None, skip_gradients_aggregation=False,
                        **kwargs):
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        grads_and_vars = [(g, master) for (g, _), master in
                          zip(grads_and_vars, self._masters(variables))]
        if not grads_and_vars:
            return super().apply_gradients(grads_and_vars, name=name)
        self.encoder.note_gradients(grads_and_vars)  # before `build` makes residuals
        with tf.init_scope():
            self.build([v for _, v in grads_and_vars])
        self._take_pulls(variables)
        strategy = tf.distribute.get_strategy()
        if self.outer_optimizer is not None:
            return self._apply_locally(strategy, grads_and_vars, name, kwargs, variables)
        self._warn_of_interleaved_adam(strategy, grads_and_vars)
        aggregate = not skip_gradients_aggregation and kwargs.pop(
            "experimental_aggregate_gradients", True
        )
        if not aggregate and getattr(self, "_deferred_aggregation", False):
            aggregate = True  # `aggregate_gradients` left the sum to the wire
        elif not aggregate and _sums_replicas(strategy):
            # Someone else summed these gradients: encoding them now would cost
            # accuracy and save no byte, so they are applied as they are, uncounted.
            self._warn_aggregated_elsewhere(strategy)
            return super().apply_gradients(
                grads_and_vars, name=name, skip_gradients_aggregation=True, **kwargs)
        pairs, finite = finite_steps.send_checked(self, strategy, grads_and_vars, aggregate)
        # Every wire delivers gradients ready to apply: aggregated across replicas
        # where that was asked for, or one worker's own under parameter servers. A step
        # that arrives non-finite is skipped (tfgc.optimizer.finite_steps).
        if finite is None:
            return super().apply_gradients(
                pairs, name=name, skip_gradients_aggregation=True, **kwargs
            )
        pairs = [(g, v) for g, v in pairs if g is not None]
        variables = [v for _, v in pairs]
        apply_gradients = super().apply_gradients

        def apply(grads):
            apply_gradients(list(zip(grads, variables)), name=name,
                            skip_gradients_aggregation=True, **kwargs)

        def skip():
            # As a loss-scale optimizer's skip: the step counts, nothing else moves.
            self.iterations.assign_add(1, read_value=False)

        finite_steps.apply_unless_not_finite(finite, [g for g, _ in pairs], apply, skip)
        return self.iterations

    def _apply_locally(self, strategy, grads_and_vars, name, kwargs, variables):
        """A local step: each replica's own gradients update its own copy
        (`variables`: the step's own, `PulledVariable`s under parameter servers)."""
        if is_parameter_server(strategy):
            if getattr(self, "_server_meetings", None) is None:
                with tf.init_scope():
                    self._server_meetings = local_steps_ps.ServerMeetings(self, variables)
            return self._server_meetings.step(
                [(g, v) for (g, _), v in zip(grads_and_vars, variables)])
        kwargs.pop("experimental_aggregate_gradients", None)
        # Fails the step (it runs with the step, being stateful) when nobody synchronized.
        local_steps.too_many_local_steps(self.iterations, self._meetings.synced_at,
                                         self.local_steps)
        replicas = strategy.num_replicas_in_sync
        pairs = [(local_steps.scaled_for_one_replica(g, replicas), v) for g, v in grads_and_vars]
        return super().apply_gradients(pairs, name=name, skip_gradients_aggregation=True,
                                       **kwargs)

    def synchronize(self, strategy=None):
        """The replicas meet: each sends its pseudo-gradient (compressed), and the outer
        optimizer applies their mean to every copy (see `tfgc.local_steps`).

        Args:
          strategy: the strategy the model was made under (default: the one in scope).

        Raises:
          ValueError: the optimizer has no local steps, or is not built yet (by its first
            step or `build`).
        """
        if self.outer_optimizer is None:
            raise ValueError("synchronize() is for local steps: this optimizer was made "
                             "without local_steps or outer_optimizer")
        meetings = getattr(self, "_meetings", None)
        if meetings is None:
            raise ValueError("synchronize() before the optimizer is built (by its first step "
                             "or build()): there is nothing to meet over")
        if meetings.function is None:
            strategy = strategy or tf.distribute.get_strategy()
            meetings.function = tf.function(lambda: strategy.run(self._outer_step))
        meetings.function()

    def maybe_synchronize(self, strategy=None):
        """Runs `synchronize` if `local_steps` steps were taken since the replicas last
        met; returns whether it did. A custom loop calls it after every step."""
        if self.local_steps_since_meeting() < self.local_steps:
            return False
        self.synchronize(strategy)
        return True

    def local_steps_since_meeting(self):
        """The steps taken since the replicas last met (0 before the first step, or
        without local steps)."""
        meetings = getattr(self, "_meetings", None)
        return 0 if meetings is None else meetings.steps_since(self.iterations)

    def _outer_step(self):
        """One replica's part of a meeting (in replica context)."""
        strategy = tf.distribute.get_strategy()
        meetings = self._meetings
        deltas = [(tf.convert_to_tensor(anchor) - tf.convert_to_tensor(v), v)
                  for anchor, v in zip(meetings.anchors, meetings.variables)]
        received = self._send_all(strategy, deltas, aggregate=True)
        replicas = strategy.num_replicas_in_sync
        means = [(total / replicas, v) for total, v in received]
        return tf.distribute.get_replica_context().merge_call(
            self._apply_outer_step, args=(means,))

    def _apply_outer_step(self, distribution, means):
        """Moves every copy and anchor to anchor - the outer step (cross-replica)."""
        meetings = self._meetings

        def move(variable, mean):
            index = self._variable_index(variable)
            anchor = meetings.anchors[index]
            momentum = None if meetings.momenta is None else meetings.momenta[index]
            new = anchor - tf.cast(self.outer_optimizer.step(mean, momentum), anchor.dtype)
            return tf.group(variable.assign(new), anchor.assign(new))

        updates = [distribution.extended.update(v, move, args=(mean,), group=True)
                   for mean, v in means]
        with tf.control_dependencies(updates):
            return meetings.synced_at.assign(self.iterations)

    def _warn_aggregated_elsewhere(self, strategy):
        if getattr(self, "_warned_aggregated_elsewhere", False):
            return
        self._warned_aggregated_elsewhere = True
        warnings.warn(
            f"{type(self).__name__}.apply_gradients(skip_gradients_aggregation=True) under "
            f"{type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas: the "
            "gradients were summed across replicas before tfgc saw them, so nothing is "
            "compressed and the traffic counters count nothing. Let this optimizer "
            "aggregate (call apply_gradients without skip_gradients_aggregation), or wrap "
            "it from outside only in wrappers that aggregate with its "
            "`aggregate_gradients` (tf_keras's LossScaleOptimizer does)", stacklevel=3)

    def _warn_of_interleaved_adam(self, strategy, grads_and_vars):
        """Warns once when Adam applies sparse gradients on parameter servers, where
        another worker can read its update half-done (tfgc.optimizer.bounded_adam)."""
        from tfgc.optimizer.bounded_adam import warns_of_interleaved_adam  # noqa: PLC0415

        if (getattr(self, "_warned_interleaved_adam", False)
                or not is_parameter_server(strategy)
                or not any(isinstance(g, tf.IndexedSlices) for g, _ in grads_and_vars)
                or not warns_of_interleaved_adam(self)):
            return
        self._warned_interleaved_adam = True
        warnings.warn(
            f"{type(self).__name__} applies sparse gradients under ParameterServerStrategy: "
            "another worker can read a row's Adam state half-updated (m set, v still 0) "
            "and move it by lr * m / epsilon. Use tfgc.BoundedAdam (the same steps, each "
            "bounded) or a larger epsilon", stacklevel=3)


def _sums_replicas(strategy):
    """True for strategies whose replicas' gradients are summed (all-reduce)."""
    return not is_parameter_server(strategy) and strategy.num_replicas_in_sync > 1
