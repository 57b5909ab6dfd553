"""Byte counters, fed by the wires that carried the bytes.

Per direction ("push": gradients to where they are applied, "pull": model deltas to the
workers) one int64 counter of shape [3, variables + 1]: row 0 the bytes on the wire,
row 1 the bytes of the dense tensors they replace, row 2 the bytes plain TensorFlow
sends for the same step (a dense gradient's dense bytes; a sparse gradient's distinct
rows and their ids, `tfgc.codecs.rows.plain_nbytes`), one column per variable (by its
position in the optimizer at the first build; the last column for variables built
later and for the batch-norm statistics a push carries). A step adds to each direction
once.
"""
import contextlib
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

import tensorflow as tf

from tfgc.distribute import dense_nbytes, is_parameter_server, local_variable

DIRECTIONS = ("push", "pull")


class NotAVariable(NamedTuple):
    """What a wire sent that is no optimizer variable's gradient (batch-norm statistics
    riding in a push, `tfgc.ps.riders`), in place of a variable in `record`: counted
    in the last column, with the dense bytes it replaces."""

    dense_nbytes: int


class Sent(NamedTuple):
    """What a wire sent of one variable's gradient in a step."""

    variable: Any  # the variable, or a `NotAVariable`
    nbytes: Any  # the payload's bytes (an int or an int64 scalar tensor)
    plain: Optional[Any] = None  # what plain TensorFlow sends; None: the dense tensor


ROWS = ("bytes", "dense_bytes", "plain_bytes")


def counter_variables(num_variables: int) -> dict[str, tf.Variable]:
    """{direction: a zero counter} for `num_variables` variables, made where every
    replica or worker adds to it (see `tfgc.distribute.local_variable`)."""
    return {d: local_variable(tf.zeros([len(ROWS), num_variables + 1], tf.int64), f"{d}_traffic",
                              per_worker=False)
            for d in DIRECTIONS}


class TrafficCounters:
    """Adds what the wires sent to the counters and reads them back.

    Args:
      counters: {direction: counter variable} (from `counter_variables`; the optimizer
        owns them, so checkpoints keep them).
      names: the counted variables' names, in column order.
      position: a function giving a variable's position in its optimizer.
    """

    def __init__(self, counters: Mapping[str, tf.Variable], names: Iterable[str],
                 position: Callable[[tf.Variable], int]) -> None:
        self._counters = counters
        self.names = list(names) + ["(variables built later; batch-norm statistics)"]
        self._position = position
        self._read_totals: Optional[Callable[[], dict[str, tf.Tensor]]] = None

    def record(self, direction: str, sent: Sequence[Any],
               happened: Optional[tf.Tensor] = None) -> Optional[tf.Tensor]:
        """Adds one step's sends (`Sent`s, or (variable, payload bytes) pairs) to the
        `direction` counter; returns the update (None for nothing sent).

        `happened`: a boolean scalar, False where the step did not make the transfer
        after all (a pull a worker skips in its local steps): its dense and plain bytes
        then count 0, as its payload bytes do."""
        if not sent:
            return None
        sent = [Sent(*entry) for entry in sent]
        other = len(self.names) - 1
        columns = [other if isinstance(s.variable, NotAVariable)
                   else min(self._position(s.variable), other) for s in sent]
        indices = [[row, c] for row in range(len(ROWS)) for c in columns]
        counter = self._counters[direction]
        # Under ParameterServerStrategy the update is built on the counter's server,
        # where the wires count their bytes: a dense update made on the worker would
        # cross the wire every step.
        place = (tf.device(counter.device) if is_parameter_server(tf.distribute.get_strategy())
                 else contextlib.nullcontext())
        with place:
            # One constant for all the dense sizes: a traced step records many variables.
            dense = tf.constant([_dense_nbytes(s.variable) for s in sent], tf.int64)
            if all(s.plain is None for s in sent):
                plain = dense
            else:
                plain = tf.stack([tf.cast(s.plain, tf.int64) if s.plain is not None
                                  else dense[i] for i, s in enumerate(sent)])
            if happened is not None:
                dense *= tf.cast(happened, tf.int64)
                plain *= tf.cast(happened, tf.int64)
            updates = tf.concat(
                [tf.stack([tf.cast(s.nbytes, tf.int64) for s in sent]), dense, plain], 0)
            return counter.assign_add(tf.scatter_nd(indices, updates, counter.shape))

    def totals(self) -> dict[str, tf.Tensor]:
        """Cumulative `<direction>_bytes` (on the wire), `<direction>_dense_bytes` (the
        dense tensors) and `<direction>_plain_bytes` (what plain TensorFlow sends) for
        "push" and "pull", as scalar tensors."""
        totals = {}
        for direction, counter in self._counters.items():
            sums = tf.reduce_sum(tf.convert_to_tensor(counter), axis=1)
            for row, kind in enumerate(ROWS):
                totals[f"{direction}_{kind}"] = sums[row]
        return totals

    def read(self) -> dict[str, int]:
        """`totals()` as Python ints, read in one call (eager).

        Under ParameterServerStrategy the counters live on a server, and each eager read
        of one from the coordinator is a round trip or more of its own; one function
        reads them all in one."""
        if self._read_totals is None:
            self._read_totals = tf.function(self.totals)
        return {key: int(value) for key, value in self._read_totals().items()}

    def by_variable(self) -> dict[str, dict[str, int]]:
        """{variable name: {"push_bytes", "push_dense_bytes", "push_plain_bytes", and the
        same for "pull"}} as Python ints, for the variables that were sent (eager)."""
        counts = {d: tf.convert_to_tensor(c).numpy() for d, c in self._counters.items()}
        return {
            name: {
                f"{d}_{kind}": int(counts[d][row, column])
                for d in DIRECTIONS for row, kind in enumerate(ROWS)
            }
            for column, name in enumerate(self.names)
            if any(counts[d][1, column] for d in DIRECTIONS)
        }


def _dense_nbytes(sent):
    return sent.dense_nbytes if isinstance(sent, NotAVariable) else dense_nbytes(sent)
