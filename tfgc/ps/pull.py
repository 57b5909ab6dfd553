"""The pull wire: one fused message per parameter server, worker and step for all the
compressed-pull variables (3LC's model pulls) that server hosts.

Each `PulledVariable` (tfgc.ps.variables) keeps a master on its parameter server, one
snapshot row per worker next to it and a cache on each worker. Per step, on the first
read of any of them, the worker pulls all of them at once:

    server:  state = 2 * worker index + synced                (the server's copy)
    server:  payload_i = encode(master_i - snapshot_i[w])     for every variable i
             (a batched codec's deltas: one payload for all, `Codec.encode_and_reconstruct_flat`)
             full = the masters' bytes if not synced, else nothing
             message = Layout.pack([payload_1, ..., payload_k, {"full": full}])
             snapshot_i[w] = synced ? snapshot_i[w] + decode(payload_i) : full_i
    worker:  cache_i = synced ? cache_i + decode(payload_i) : full_i

One worker index and one full/delta decision per step serve every variable, and the
selection is arithmetic (no cond across devices). Each worker's state has a copy on the
server (a per-worker variable that lives there), so the only tensor that crosses is the
message coming back, and it can leave as soon as the server's part of the step starts:
a tensor the worker sent would be asked for only then, one more round trip. With local
steps (tfgc.local_steps) a worker pulls at the first of every H of its steps only: the
worker sends its state, which in the other steps says so (-1), and the server's part
and the worker's decoding sit in a branch each side takes on its own, so an empty
message comes back and the cache keeps what the worker's own steps made of it. A new
cache (the first step, or a restarted worker, whose per-worker variables TensorFlow
recreates) is unsynced and takes one full pull of all variables. Where the group's
pulls compress, a full pull of float32 masters sends them in bfloat16, half the bytes
of the largest message a worker receives: the snapshot row holds what was sent, so the
rounding stays in the next deltas, as what any pull leaves out does. Uncompressed pulls
(`NoCompression`) send them as they are.

Both sides work on the group's values as one flat vector (variables in payload order,
so each payload's are contiguous): the subtraction, the snapshot update, the full
section and the cache update are one op each for the group, not one per variable.
That keeps the traced step small, which is most of what a first step costs.
"""
from typing import TYPE_CHECKING, Callable, Optional, Sequence, TypeVar

import tensorflow as tf

from tfgc import _compat
from tfgc.codecs import base
from tfgc.codecs.identity import NoCompression
from tfgc.distribute import (
    colocated_with, is_parameter_server, local_variable, num_workers, worker_index)
from tfgc.wire.message import (
    Layout, checked_size, from_bytes, payload_units, shares_by_position, to_bytes)

if TYPE_CHECKING:
    from tfgc.ps.variables import PulledVariable

_T = TypeVar("_T")


class ParameterServerPull:
    """Pulls a group of `PulledVariable`s that share a parameter server.

    Args:
      variables: the `PulledVariable`s (their masters on one device, of one dtype).
      codecs: the codec of each variable's deltas.
      every: with local steps, a worker pulls at the first of every `every` steps.
      local_step: with `every` > 1, the per-worker int64 count of the worker's steps.

    Attributes:
      synced: per worker, whether its caches have had their first full pull.
      snapshots: on the server, [workers, all the variables' elements]: row w is what
        worker w's caches hold. One buffer, so that the server's part of a step takes
        one more resource, not one per variable (each costs bytes on every call).
    """

    def __init__(self, variables: Sequence["PulledVariable"], codecs: Sequence[base.Codec],
                 every: int = 1, local_step: Optional[tf.Variable] = None) -> None:
        if every > 1 and local_step is None:
            raise ValueError("a pull group of local steps needs the workers' step counts")
        self.every = int(every)
        self._local_step = local_step
        kinds = {(v.master.device, v.master.dtype) for v in variables}
        if len(kinds) != 1:
            raise ValueError(f"a pull group shares one server and one dtype, got {kinds}")
        self.variables = list(variables)
        self.codecs = list(codecs)
        self.device, self.dtype = kinds.pop()
        self._sizes = [v.master.shape.num_elements() for v in self.variables]
        # Variables whose (batched) codec is shared travel as one payload.
        self._units = payload_units([id(c) if c.batched else None for c in self.codecs])
        # Positions in the flat vector: payload by payload, so each unit's are contiguous.
        self._order = [i for unit in self._units for i in unit]
        self._offsets = [0] * len(self._sizes)
        offset = 0
        for i in self._order:
            self._offsets[i] = offset
            offset += self._sizes[i]
        self.synced = local_variable(tf.constant(False), "pull_synced", per_worker=True)
        # The server keeps its own copy of each worker's state (see `pull`).
        self._server_states = (_server_copies_of_states(self.device) if every == 1
                               and is_parameter_server(tf.distribute.get_strategy()) else None)
        with colocated_with(self.variables[0].master):
            self.snapshots = local_variable(
                tf.zeros([num_workers(), sum(self._sizes)], self.dtype), "pull_snapshots",
                per_worker=False)
        # A full pull's dtype: the snapshot keeps the rounding for the next deltas.
        lossless = all(isinstance(codec, NoCompression) for codec in self.codecs)
        self._full_dtype = (tf.bfloat16 if self.dtype == tf.float32 and not lossless
                            else self.dtype)
        self._full_nbytes = sum(self._sizes) * self._full_dtype.size

    def snapshots_of(self, variable: "PulledVariable") -> tf.Tensor:
        """`variable`'s rows of the snapshot buffer, [workers, *shape]."""
        i = next(i for i, member in enumerate(self.variables) if member is variable)
        start, end = self._offsets[i], self._offsets[i] + self._sizes[i]
        rows = tf.convert_to_tensor(self.snapshots)[:, start:end]
        return tf.reshape(rows, [-1] + variable.master.shape.as_list())

    def pull(self, caches: Sequence[tf.Tensor]
             ) -> tuple[tf.Operation, list[tuple[tf.Variable, tf.Tensor]], Optional[tf.Tensor]]:
        """Adds one step's pull to the current graph.

        Args:
          caches: this graph's cache handle of each variable (per-worker variables are
            bound to a worker when the function is called).

        Returns:
          (the op to wait for, [(master, bytes of the message it accounts for)], a
          boolean scalar on the server saying whether the worker pulls, or None where it
          always does).
        """
        synced_handle = self.synced.handle
        synced = tf.raw_ops.ReadVariableOp(resource=synced_handle, dtype=tf.bool)
        # Per-worker variables are read here, outside any branch (a branch's function
        # does not get a worker's copy of them).
        currents = base.concat_flat([
            tf.raw_ops.ReadVariableOp(resource=caches[i], dtype=self.dtype)
            for i in self._order])
        if self.every == 1:
            if self._server_states is None:
                state = _sent_state(synced)
                with tf.device(self.device):
                    message, layout, counted = self._serve(state)
            else:
                # The server reads the state from its own copy of it: a tensor the
                # worker sent would be asked for only once the server's part of the step
                # started (TensorFlow's receiver asks), so the message would reach the
                # worker two round trips after the step started instead of one.
                handle = self._server_states.handle  # once: each access is sent with the call
                with tf.device(self.device):
                    state = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int32)
                    message, layout, counted = self._serve(state)
                    with tf.control_dependencies([message]):
                        tf.raw_ops.AssignVariableOp(resource=handle, value=state // 2 * 2 + 1)
            news = self._received(message, layout, synced, currents)
            asked = None
        else:
            # Set where `every` > 1 (__init__ checks it).
            step = tf.raw_ops.ReadVariableOp(resource=self._local_step.handle,  # type: ignore[union-attr]
                                             dtype=tf.int64)
            pulling = tf.logical_or(tf.logical_not(synced), step % self.every == 0)
            state = tf.where(pulling, _sent_state(synced), -1)
            with tf.device(self.device):
                message, layout, counted, asked = self._serve_when_asked(state)
            # Received here, outside the branch: the branch then switches a tensor of
            # the worker's on the worker's condition (given the server's message, the
            # switch ran on the server, which asked the worker for the condition). Not
            # tf.identity: TensorFlow's placer puts an identity with its input.
            message = tf.raw_ops.Snapshot(input=message)
            news = tf.cond(pulling, lambda: self._received(message, layout, synced, currents),
                           lambda: currents)
        updates = [tf.raw_ops.AssignVariableOp(resource=caches[i], value=new)
                   for i, new in zip(self._order, self._split(news))]
        with tf.control_dependencies(updates):
            done = tf.raw_ops.AssignVariableOp(resource=synced_handle, value=True)
        # The server's copy of the decision: the traffic counters live on a server.
        return done, counted, asked

    def _received(self, message, layout, synced, currents):
        """The caches' new values (flat) from the server's message."""
        name = f"pull message from {self.device}"
        unpacked = layout.unpack(message, name=name)
        # A stateless check, as in Layout.unpack: the full section's size.
        full = checked_size(unpacked.pop()["full"],
                            tf.where(synced, tf.constant(0, tf.int64),
                                     tf.constant(self._full_nbytes, tf.int64)),
                            name, "full section of the wrong size")
        # Decoded outside the full/delta cond: one decode, whichever it takes.
        deltas = _concat([self.codecs[unit[0]].decode_flat(payload, self._shapes(unit))
                          for unit, payload in zip(self._units, unpacked)])
        # One cond for the group, on its flat vector (each cond traces two functions).
        return tf.cond(synced, lambda: currents + deltas,
                       lambda: tf.cast(from_bytes(full, self._full_dtype), self.dtype))

    def _split(self, flat):
        """The variables' tensors, shaped, from the group's flat vector (flat order)."""
        return base.split_flat(flat, [self.variables[i].master.shape for i in self._order])

    def _counted(self, layout, payloads, full, synced):
        """[(master, bytes of the message it accounts for)]: its share of its payload,
        and its bytes in the full section on a full pull; what the full section costs
        beyond those (its length word) goes to the first."""
        *per_payload, full_share = layout.payload_nbytes(payloads + [{"full": full}])
        counted = shares_by_position(self._units, per_payload, self._sizes)
        counted[0] += full_share - tf.size(full, out_type=tf.int64)
        full_pull = tf.where(synced, tf.constant(0, tf.int64), tf.constant(1, tf.int64))
        in_full = tf.constant([size * self._full_dtype.size for size in self._sizes], tf.int64)
        counted = tf.unstack(tf.stack(counted) + full_pull * in_full, num=len(self.variables))
        return list(zip((v.master for v in self.variables), counted))

    def _serve(self, state):
        """The server's side: encodes every delta and updates the snapshots (stateful
        ops of the step: they run without anyone waiting on them); returns (message,
        its layout, the bytes counted per variable).

        The counts are made here, from what is sent, so that they reach the traffic
        counters (on a server) without crossing the wire."""
        worker, synced = state // 2, state % 2 > 0
        rows = tf.reshape(worker, [1])
        row = tf.gather(self.snapshots, worker)
        values = base.concat_flat([self.variables[i].master.read_value() for i in self._order])
        deltas = values - row
        # The reconstructions are the receiver's decodings.
        payloads, sent_by_unit = zip(*(
            self.codecs[unit[0]].encode_and_reconstruct_flat(
                self._unit_values(deltas, unit), self._shapes(unit))
            for unit in self._units))
        sent = _concat(list(sent_by_unit))
        full_values = tf.cast(values, self._full_dtype)
        new_row = tf.where(synced, row + sent, tf.cast(full_values, self.dtype))
        full = tf.cond(synced, on_device(self.device, lambda: tf.zeros([0], tf.uint8)),
                       on_device(self.device, lambda: to_bytes(full_values)))
        layout, message = Layout.pack(list(payloads) + [{"full": full}])
        with tf.control_dependencies([message]):  # encoded before the snapshots move
            self.snapshots.scatter_update(tf.IndexedSlices(new_row[None], rows))
        return message, layout, self._counted(layout, list(payloads), full, synced)

    def _serve_when_asked(self, state):
        """`_serve` for a worker that asks (state >= 0); for one in a local step
        (state -1), an empty message and nothing counted or changed. Returns `_serve`'s
        three values and whether the worker asked."""
        served = {}
        # The state and the condition on the server, and the branches' ops there too (a
        # branch's ops do not inherit the device): each tensor of a branch that lived on
        # the worker would cost a request on every step.
        state = tf.identity(state)

        def serve():
            message, served["layout"], counted = self._serve(state)
            served["masters"] = [master for master, _ in counted]
            return message, [nbytes for _, nbytes in counted]

        def decline():
            return (tf.zeros([0], tf.uint8),
                    [tf.constant(0, tf.int64) for _ in self.variables])

        asked = state >= 0
        message, nbytes = tf.cond(asked, on_device(self.device, serve),
                                  on_device(self.device, decline))
        return message, served["layout"], list(zip(served["masters"], nbytes)), asked

    def _unit_values(self, flat, unit):
        """Payload `unit`'s part of the group's flat vector."""
        start = self._offsets[unit[0]]
        return flat[start:start + sum(self._sizes[i] for i in unit)]

    def _shapes(self, unit):
        """The shapes of payload `unit`'s variables."""
        return [self.variables[i].master.shape for i in unit]


def _sent_state(synced: tf.Tensor) -> tf.Tensor:
    """The pull state a worker sends: 2 x its index + whether its caches are synced.

    One scalar: two (or a stack of them) would cross as two tensors, each with a request
    of its own (TensorFlow's optimizer cuts a stack sliced on another device into its
    parts). Made only where it is sent: the worker's index is an input of every call of
    the function that reads it."""
    return 2 * worker_index() + tf.cast(synced, tf.int32)


def _server_copies_of_states(device: str) -> tf.Variable:
    """Each worker's pull state (2 x its index + whether its caches are synced) as a
    per-worker variable whose copies live on the server `device`. A restarted worker's
    caches and its copy here are made again together, unsynced."""

    def make_copy(worker):
        with tf.init_scope(), tf.device(device):
            return _compat.ResourceVariable(tf.constant(2 * worker, tf.int32), trainable=False)

    with tf.init_scope():
        return _compat.per_worker_variable_of(tf.distribute.get_strategy(), make_copy)


def on_device(device: str, branch: Callable[[], _T]) -> Callable[[], _T]:
    """`branch` with its ops placed on `device`: a `tf.cond` branch's ops do not inherit
    the device scope the cond is made in."""

    def placed():
        with tf.device(device):
            return branch()

    return placed


def _concat(vectors):
    """The vectors laid end to end (one op, or none for one vector)."""
    return vectors[0] if len(vectors) == 1 else tf.concat(vectors, axis=0)
