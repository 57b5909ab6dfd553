"""One fused message for many payloads: what crosses the wire once per receiver and step.

Sending each payload tensor on its own costs a gRPC frame and a transfer per tensor,
which on models with many variables weighs more than the payloads themselves. A
`Layout` packs the payloads bound for one receiver into ONE uint8 tensor and unpacks it
on the other side.

Both sides know the layout: it is made from the payloads' structure (keys, dtypes,
static shapes) while the step is traced, and the receiving side's graph is part of the
same trace. So the message carries no shapes, no dtypes and no keys:

    message = [lengths of the variable-length entries, int32 little-endian]
              [the bytes of every sent entry, in layout order]

Entries whose value is known when the step is traced (a static shape, a dtype marker)
are not sent at all: the receiver's graph holds the same constant (run eagerly,
nothing is left out but empty entries of rank other than 1, and every vector carries
its length). Fixed-shape entries (a scale) need no length. A message whose size
disagrees with the layout and its lengths fails with InvalidArgument on the receiver
before any entry is read, and the receiver allocates nothing beyond the message it
holds.
"""
import dataclasses
import re
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional, Sequence, TypeVar

import numpy as np
import tensorflow as tf

_LENGTH_BYTES = 4  # one int32 per variable-length entry

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One payload tensor's place in a message.

    Attributes:
      payload: index of the payload the tensor belongs to.
      key: its key in that payload.
      dtype: its dtype.
      shape: its static shape; None for a rank-1 tensor of run-time length.
      constant: its value when known at trace time (then it is not sent).
    """

    payload: int
    key: str
    dtype: tf.DType
    shape: Optional[tuple] = None
    constant: Optional[np.ndarray] = None

    @property
    def sent(self) -> bool:
        return self.constant is None

    @property
    def fixed_nbytes(self) -> int:
        """Bytes of a fixed-shape sent entry."""
        # Asked of fixed-shape entries only, whose shape is set.
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size  # type: ignore[arg-type]


def _entry(payload_index, key, tensor):
    tensor = tf.convert_to_tensor(tensor)
    # Eagerly every value is known; only what a traced graph knows is left out.
    constant = None if tf.executing_eagerly() else tf.get_static_value(tensor)
    # Eagerly every shape is known, but a vector's length may be the data's (another
    # replica's message has its own): vectors always carry their length, even empty.
    eager_vector = tf.executing_eagerly() and tensor.shape.rank == 1
    if tensor.shape.num_elements() == 0 and not eager_vector:
        constant = np.zeros(tensor.shape, tensor.dtype.as_numpy_dtype)
    if constant is not None:
        return Entry(payload_index, key, tensor.dtype, tuple(constant.shape), np.asarray(constant))
    if tensor.shape.is_fully_defined() and not eager_vector:
        return Entry(payload_index, key, tensor.dtype, tuple(tensor.shape.as_list()))
    if tensor.shape.rank != 1:
        raise ValueError(
            f"a fused message carries fixed-shape or rank-1 tensors; payload entry {key!r} "
            f"has shape {tensor.shape}"
        )
    return Entry(payload_index, key, tensor.dtype)


def to_bytes(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor`'s bytes as a 1-D uint8 tensor (bool as one byte per element)."""
    flat = tf.reshape(tensor, [-1])
    if tensor.dtype == tf.bool:
        return tf.cast(flat, tf.uint8)
    if tensor.dtype == tf.uint8:
        return flat
    return tf.reshape(tf.bitcast(flat, tf.uint8), [-1])


def from_bytes(data: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Inverse of `to_bytes`: 1-D uint8 `data` as a 1-D tensor of `dtype`."""
    if dtype == tf.bool:
        return data > 0
    if dtype == tf.uint8:
        return data
    if dtype.size == 1:
        return tf.bitcast(data, dtype)
    return tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)


class Layout:
    """The agreed structure of a fused message: its payloads' entries, in order.

    Make one with `Layout.pack(payloads)` on the sending side; `unpack` on the
    receiving side (under the receiver's `tf.device`) returns the payloads.
    """

    def __init__(self, entries: Iterable[Entry], num_payloads: int) -> None:
        self.entries = tuple(entries)
        self.num_payloads = int(num_payloads)
        self._variable = [e for e in self.entries if e.sent and e.shape is None]
        self.header_nbytes = _LENGTH_BYTES * len(self._variable)
        self.fixed_nbytes = sum(
            e.fixed_nbytes for e in self.entries if e.sent and e.shape is not None)

    @classmethod
    def pack(cls, payloads: Sequence[Mapping[str, tf.Tensor]]) -> tuple["Layout", tf.Tensor]:
        """Returns (layout, message) for a list of payloads (flat dicts of tensors).

        The message is one 1-D uint8 tensor; entries are in payload order, each
        payload's keys sorted.
        """
        entries, sent = [], []
        for index, payload in enumerate(payloads):
            for key in sorted(payload):
                entry = _entry(index, key, payload[key])
                entries.append(entry)
                if entry.sent:
                    sent.append((entry, tf.convert_to_tensor(payload[key])))
        layout = cls(entries, len(payloads))
        lengths = [tf.size(t, out_type=tf.int32) for e, t in sent if e.shape is None]
        parts = [to_bytes(tf.stack(lengths))] if lengths else []
        parts += [to_bytes(t) for _, t in sent]
        if not parts:
            return layout, tf.zeros([0], tf.uint8)
        return layout, tf.concat(parts, axis=0)

    def _lengths(self, header):
        """The declared lengths (elements) of the variable-length entries, int64."""
        if not self._variable:
            return tf.zeros([0], tf.int64)
        return tf.cast(from_bytes(header, tf.uint32), tf.int64)

    def payload_nbytes(self, payloads: Sequence[Mapping[str, tf.Tensor]]) -> list[tf.Tensor]:
        """Bytes of the message that each payload accounts for (its sent entries and
        their length words), as int64 scalars; they add up to the message's size."""
        totals = [tf.constant(0, tf.int64) for _ in range(self.num_payloads)]
        for entry in self.entries:
            if not entry.sent:
                continue
            if entry.shape is None:
                tensor = payloads[entry.payload][entry.key]
                size = tf.size(tensor, out_type=tf.int64) * entry.dtype.size + _LENGTH_BYTES
            else:
                size = tf.constant(entry.fixed_nbytes, tf.int64)
            totals[entry.payload] += size
        return totals

    def unpack(self, message: tf.Tensor, name: str = "fused message"
               ) -> list[dict[str, tf.Tensor]]:
        """The payloads of `message`, checked against this layout, unpacked where the
        caller places it (the device that received the message).

        The checks are stateless slices that fail on a bad size (named after `name` and
        the check): a stateful Assert would be ordered after the step's other stateful
        ops, and one on another device costs a control edge across the wire every step;
        a `tf.debugging.assert_*` with tensor data becomes a cond, which sends several
        small tensors across.

        Raises:
          tf.errors.InvalidArgumentError: the message's size does not match the layout
            and the lengths it declares (when run; the failing op's name contains
            `name`, with its spaces and colons as underscores).
        """
        # Sizes are read from a copy made here, not from where the message was made
        # (TensorFlow places a Size op with its input's producer).
        message = tf.identity(tf.convert_to_tensor(message, tf.uint8))
        # Lengths are read as uint32: none is negative, and a forged one only makes the
        # declared size disagree (nothing is allocated for it).
        header = tf.slice(message, [0], [self.header_nbytes],
                          name=check_op_name(name, "shorter than its header"))
        lengths = self._lengths(header)
        sizes = tf.constant([e.dtype.size for e in self._variable], tf.int64,
                            shape=[len(self._variable)])
        declared = self.header_nbytes + self.fixed_nbytes + tf.reduce_sum(lengths * sizes)
        message = checked_size(message, declared, name, "its size does not match its layout")
        payloads: list[dict[str, tf.Tensor]] = [{} for _ in range(self.num_payloads)]
        offset = tf.constant(self.header_nbytes, tf.int64)
        variable_index = 0
        for entry in self.entries:
            if not entry.sent:
                value = tf.constant(entry.constant, entry.dtype)
            else:
                if entry.shape is None:
                    count = lengths[variable_index]
                    variable_index += 1
                    nbytes = count * entry.dtype.size
                else:
                    nbytes = tf.constant(entry.fixed_nbytes, tf.int64)
                data = tf.slice(message, tf.reshape(offset, [1]), tf.reshape(nbytes, [1]))
                offset += nbytes
                value = from_bytes(data, entry.dtype)
                if entry.shape is not None:
                    value = tf.reshape(value, entry.shape)
            payloads[entry.payload][entry.key] = value
        return payloads


def fused_nbytes(encode: Callable[..., Mapping[str, tf.Tensor]], *tensors: tf.Tensor) -> int:
    """Bytes that the payload `encode(*tensors)` takes in a traced step's fused message
    (static entries left out, length words counted), as a Python int.

    `tensors` enter as the traced function's arguments, so only what a training step
    knows statically (shapes, dtypes) is left out, not what their values would fold to.
    """

    def count(*args):
        payload = encode(*args)
        layout, _ = Layout.pack([payload])
        return layout.payload_nbytes([payload])[0]

    signature = [tf.TensorSpec(t.shape, t.dtype) for t in map(tf.convert_to_tensor, tensors)]
    return int(tf.function(count, input_signature=signature, autograph=False)(*tensors))


def payload_units(keys: Iterable[Optional[Hashable]]) -> list[list[int]]:
    """Groups positions into the payloads they travel in: positions with one batch key
    (a batched codec's tensors) share a payload, a None key travels alone. Returns
    lists of positions, in the order of their first position."""
    units: list[list[int]]
    batches: dict[Hashable, list[int]]
    units, batches = [], {}
    for position, key in enumerate(keys):
        if key is None:
            units.append([position])
        elif key in batches:
            batches[key].append(position)
        else:
            batches[key] = [position]
            units.append(batches[key])
    return units


def spread(units: Sequence[Sequence[int]], per_unit: Iterable[Iterable[_T]]) -> list[_T]:
    """Lists of values per unit (as `payload_units` groups positions) -> one value per
    position."""
    values: list[Any] = [None] * sum(len(unit) for unit in units)
    for unit, unit_values in zip(units, per_unit):
        for position, value in zip(unit, unit_values):
            values[position] = value
    return values


def shares_by_position(units: Sequence[Sequence[int]], totals: Sequence[tf.Tensor],
                       sizes: Sequence[int]) -> list[tf.Tensor]:
    """Each position's share of its unit's payload bytes (`totals`, one per unit), in
    proportion to the positions' `sizes`."""
    return spread(units, [split_bytes(total, [sizes[i] for i in unit])
                          for unit, total in zip(units, totals)])


def split_bytes(total: tf.Tensor, sizes: Sequence[int]) -> list[tf.Tensor]:
    """`total` bytes (an int64 scalar tensor) of one payload split over the tensors it
    holds, in proportion to their `sizes` (elements), adding up to `total` exactly."""
    if len(sizes) == 1 or not sum(sizes):
        return [tf.zeros_like(total)] * (len(sizes) - 1) + [total]
    # Share i is floor(total * (sizes up to i) / all) minus the one before it: a few
    # vector ops for the payload, not a few ops per tensor.
    cumulative = tf.constant(np.cumsum([0] + list(sizes)), tf.int64)
    upto = total * cumulative // sum(sizes)
    return tf.unstack(upto[1:] - upto[:-1], num=len(sizes))


def checked_size(vector: tf.Tensor, size: tf.Tensor, message_name: str, check: str
                 ) -> tf.Tensor:
    """`vector` once it is found to have `size` elements (an int64 scalar), else an
    InvalidArgumentError naming the message and the `check`: from an op named after
    them in a traced function (stateless, and kept by TensorFlow's graph optimizer,
    which takes a reshape between vectors for an identity), at once eagerly."""
    if tf.executing_eagerly():
        if int(tf.size(vector)) != int(size):
            raise tf.errors.InvalidArgumentError(
                None, None, f"{message_name}: {check} ({int(tf.size(vector))} bytes, "
                f"{int(size)} expected)")
        return vector
    with tf.name_scope(check_op_name(message_name, check)):
        beyond = tf.size(vector, out_type=tf.int64) - size
        # Fails if the vector is shorter...
        within = tf.slice(vector, tf.zeros([1], tf.int64), tf.reshape(size, [1]))
        # ...and, taking what lies beyond `size` from an empty vector, if it is longer
        # (-1, "all", is the shorter case, failed above).
        empty = tf.slice(tf.zeros([0], vector.dtype), tf.zeros([1], tf.int64),
                         tf.reshape(beyond, [1]))
        return tf.concat([within, empty], axis=0)


def check_op_name(message_name: str, check: str) -> str:
    """An op name that says which check of which message failed."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{message_name}: {check}").lstrip("_.-")
