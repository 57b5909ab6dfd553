"""Non-finite gradients: a step whose gradients arrive non-finite is skipped.

A gradient can be finite where it is computed and not where it is applied: an encode
can overflow (LogQuant's scale, PowerSGD's products, a float16 wire sum),
and summing the replicas' gradients can overflow float32. A loss-scale optimizer
checks the gradients before tfgc encodes them, so it cannot see that. tfgc checks what
it hands the inner optimizer instead, the decoded gradients (one reduction per tensor,
all in this replica, and no collective: the replicas decode the same sums, so they
agree), and when one of them is not finite it skips the step: no variable or slot
moves, no residual changes, and `iterations` still counts the step, as a loss-scale
optimizer's skip does. A NaN or Inf gradient is skipped the same way, with or without
a loss-scale optimizer.

Under parameter servers the worker checks what it sends instead, before it sends it:
the payloads' floating tensors and the residuals it keeps. A residual holds the
gradient less its decoded payload, so a decode that overflows shows there, for every
codec with error feedback; a check on the servers would cost each step a round trip
(the servers' flag to the worker and the decision back before they apply). A codec
without error feedback whose decode overflows a finite payload is not caught there.

The residuals are read before the step and written after the check
(`tfgc.memory.StagedResidual`), so that a skipped step leaves them as they were.
"""
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence, Union

import tensorflow as tf

from tfgc import _compat
from tfgc.memory import StagedResidual
from tfgc.optimizer import xla
from tfgc.wire import choose_wire
from tfgc.wire.wires import ParameterServerPush

if TYPE_CHECKING:
    from tfgc.optimizer.base import CompressingBase


def send_checked(
    optimizer: "CompressingBase", strategy: tf.distribute.Strategy,
    grads_and_vars: Sequence[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]],
    aggregate: bool,
) -> tuple[list[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]],
           Optional[tf.Tensor]]:
    """Sends `optimizer`'s gradients as `CompressingBase._send_all` does, and checks them.

    Args:
      optimizer: a `tfgc.optimizer.CompressingBase`, built.
      strategy: the strategy in scope.
      grads_and_vars: one replica's (gradient, variable) pairs.
      aggregate: whether they are summed across the replicas.

    Returns:
      ((gradient as received, variable) pairs, a scalar bool tensor: every gradient
      received is finite (under parameter servers: every payload sent and residual
      kept); None where there is no gradient). The residuals are written only when it
      is True.
    """
    encoder = optimizer.encoder
    residuals = encoder.residuals_by_key([v for g, v in grads_and_vars if g is not None])
    olds = {key: residual.read_value() for key, residual in residuals.items()}
    staged = {key: StagedResidual(old) for key, old in olds.items()}
    wire = choose_wire(encoder.with_residuals(staged), strategy, aggregate,
                       optimizer.bucket_bytes)
    xla.refuse_compiled_step(optimizer, wire)
    if isinstance(wire, ParameterServerPush):
        # Checked on the worker, before the messages leave: a flag made on the servers
        # would cost every step a round trip to the worker and back before they apply.
        packed = wire.pack(grads_and_vars)
        checked = [t for t in wire.payload_tensors(packed) if t.dtype.is_floating]
        pairs, sent = wire.receive(packed)
        on_servers = True
    else:
        pairs, sent = wire.send(grads_and_vars)
        checked = [g for g, _ in pairs]
        on_servers = False
    optimizer.traffic_counters.record("push", sent)  # type: ignore[union-attr]  # built (see Args)
    # Only the residuals this step wrote (a sparse gradient's rows leave theirs alone).
    written = [(residuals[key], staged[key].value) for key in residuals
               if staged[key].value is not olds[key]]
    if on_servers:
        checked += [value for _, value in written]
    finite = all_finite(checked)
    if finite is None:
        for residual, value in written:
            residual.assign(value)
    elif written:
        def keep():
            for residual, value in written:
                residual.assign(value)

        tf.cond(finite, keep, lambda: None)
    return pairs, finite


def all_finite(gradients: Iterable[Optional[Union[tf.Tensor, tf.IndexedSlices]]]
               ) -> Optional[tf.Tensor]:
    """A scalar bool tensor: every element of `gradients` (tensors, `tf.IndexedSlices`
    or None) is finite; None when there is no gradient."""
    checks = [tf.reduce_all(tf.math.is_finite(
        g.values if isinstance(g, tf.IndexedSlices) else g)) for g in gradients
        if g is not None]
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def apply_unless_not_finite(finite: Optional[tf.Tensor], grads: Sequence[tf.Tensor],
                            apply: Callable[[Sequence[tf.Tensor]], None],
                            skip: Callable[[], None]) -> None:
    """Runs `apply(grads)` when `finite` holds, else `skip()`, in replica context, on
    every replica alike.

    `apply` may call `merge_call` (an optimizer's `apply_gradients` does): where the
    strategy needs merge calls the condition is taken in cross-replica context, as
    tf_keras's loss-scale optimizer takes its own, and `apply` runs in each replica
    from there.

    Args:
      finite: this replica's scalar bool, the same on every replica; None: apply.
      grads: this replica's gradients (tensors), `apply`'s argument.
      apply: a function of `grads`, in replica context.
      skip: a function of nothing; it runs once per worker where `apply` would run
        once per replica in cross-replica context.
    """
    if finite is None:
        apply(grads)
        return
    if _compat.strategy_supports_no_merge_call():
        _compat.smart_cond(finite, lambda: apply(grads), skip)
        return

    def cross_replica(distribution, finite, grads):
        # The replicas' flags agree; taking them all costs nothing (they are local).
        everywhere = tf.reduce_all(tf.stack(
            [tf.identity(f) for f in distribution.experimental_local_results(finite)]))

        def apply_everywhere():
            distribution.extended.call_for_each_replica(apply, args=(grads,))

        _compat.smart_cond(everywhere, apply_everywhere, skip)

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(finite, grads))
