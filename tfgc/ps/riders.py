"""Riders: a step's other updates to a parameter server, carried in its fused push.

A training step writes to its parameter servers more than gradients: tf_keras batch
norm's moving statistics are updated on their server (tfgc.ps.moving_statistics). Sent on
its own, each such update costs one more tensor, request and set of frames per step, as
much on the sockets at high compression as the gradients' whole message. A `Rider` is
such an update made to travel inside the step's fused message to its server
(`ParameterServerPush`): the wire packs its values with the gradients' payloads, and on
the server hands it what arrived.

Riding is only safe where the step is sure to send that message, in the graph the
update was made in. So updates ride only inside a step that collects them
(`collecting`, entered around every replica step of a strategy by
`collect_in_steps(strategy)`), in that step's own graph, and whatever the step's pushes
did not take when it ends (a server with no gradient that step, a push inside a
`tf.cond`, a step without a tfgc optimizer) is sent on its own (`Rider.send_alone`),
as it would have been without riding. Outside such a step `ride` says no, and the
caller sends the update at once.

A rider whose updates compose (`Rider.folds`: batch-norm statistics) can also wait on
the worker: a round of them folds into one state (`fold`) that makes them all at once
(`folded`), which is how local steps send them only when the worker meets its servers
(tfgc.ps.local_steps).
"""
import abc
import contextlib
import threading
from typing import TYPE_CHECKING, Iterator, Optional, Union

import tensorflow as tf

if TYPE_CHECKING:
    from tfgc.codecs.base import Codec, Payload

_COLLECTING = "_tfgc_collects_riders"  # set on the `run` a strategy got from us


class Rider(abc.ABC):
    """An update for one parameter server that may travel in the step's push message.

    Args:
      device: the server's device (where `apply` runs).
    """

    def __init__(self, device: str) -> None:
        self.device = _canonical(device)

    @abc.abstractmethod
    def payload(self, small_compression: Optional["Codec"]) -> "Payload":
        """What the update sends (a flat dict of tensors), made on the worker.

        Args:
          small_compression: the pushing optimizer's small-tensor codec, or None where
            it sends small tensors as they are.
        """

    @abc.abstractmethod
    def apply(self, payload: dict[str, tf.Tensor], small_compression: Optional["Codec"]
              ) -> Union[tf.Tensor, tf.Variable]:
        """Makes the update from the `payload` that arrived; runs on the server."""

    @abc.abstractmethod
    def dense_nbytes(self) -> int:
        """Bytes of the values it replaces as Keras sends them (for the counters)."""

    @abc.abstractmethod
    def send_alone(self) -> Union[tf.Tensor, tf.Variable]:
        """Makes the update with a transfer of its own (no push carried it)."""

    #: Whether a run of this rider's updates composes into one (`fold`, `folded`).
    folds = False

    def state_size(self) -> int:
        """Elements of the float32 state a run of these updates folds into."""
        raise NotImplementedError(f"{type(self).__name__} does not fold")

    def fold(self, state: tf.Tensor) -> tf.Tensor:
        """The state after this update, from `state`, the one of the updates before it
        (zeros: none yet); made on the worker."""
        raise NotImplementedError(f"{type(self).__name__} does not fold")

    def folded(self, state: tf.Tensor) -> "Rider":
        """A rider that makes the updates folded into `state` at once."""
        raise NotImplementedError(f"{type(self).__name__} does not fold")


class _Step:
    """The riders of one replica step, waiting for its pushes."""

    def __init__(self):
        self.riders = []


# The collecting steps by the graph they trace: a strategy may run its replica function
# in threads of its own (mirrored replicas), which enter the same graph.
_lock = threading.Lock()
_steps: dict = {}  # graph -> [_Step], innermost last


def _current_step():
    """The innermost step collecting in the current graph, or None."""
    with _lock:
        steps = _steps.get(tf.compat.v1.get_default_graph())
        return steps[-1] if steps else None


@contextlib.contextmanager
def collecting() -> Iterator[None]:
    """Collects the riders of the code inside (one replica step); when it ends without
    an error, sends alone those that no push took."""
    graph, step = tf.compat.v1.get_default_graph(), _Step()
    with _lock:
        _steps.setdefault(graph, []).append(step)
    try:
        yield
    finally:
        with _lock:
            _steps[graph].pop()
            if not _steps[graph]:
                del _steps[graph]
    for rider in step.riders:
        rider.send_alone()


def ride(rider: Rider) -> bool:
    """Leaves `rider` for the step's push to its server, if the current step collects
    riders. Returns False when it does not: the caller then makes the update itself."""
    step = _current_step()
    if step is None:
        return False
    with _lock:
        step.riders.append(rider)
    return True


def take(device: str, folding: Optional[bool] = None) -> list[Rider]:
    """The riders waiting for a push to `device` in the current step (removed: the push
    carries them); none outside a collecting step.

    Args:
      device: the server.
      folding: None for all of them, True for those that fold, False for the others.
    """
    step = _current_step()
    if step is None:
        return []
    device = _canonical(device)

    def taken(rider):
        return rider.device == device and folding in (None, rider.folds)

    with _lock:
        riders = [rider for rider in step.riders if taken(rider)]
        step.riders = [rider for rider in step.riders if not taken(rider)]
    return riders


def collect_in_steps(strategy: tf.distribute.Strategy) -> None:
    """Has every replica step `strategy.run` traces collect riders (`collecting`).

    Replaces the `run` of this strategy object (not of its class) with one that calls
    the original inside `collecting()`; a second call changes nothing. tf_keras's
    `fit` and custom training loops alike reach their steps through `strategy.run`.
    """
    run = strategy.run
    if getattr(run, _COLLECTING, False):
        return

    def collecting_run(fn, args=(), kwargs=None, options=None):
        with collecting():
            return run(fn, args=args, kwargs=kwargs, options=options)

    setattr(collecting_run, _COLLECTING, True)
    strategy.run = collecting_run


def _canonical(device):
    return tf.DeviceSpec.from_string(device).to_string()
