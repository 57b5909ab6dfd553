"""FastSGD's gradient encoder: values by reciprocal mapping + logarithm quantization +
threshold filter (section 3.2, Algorithm 1); keys by delta + adaptive bit-level binary
encoding with a length flag (section 3.3, the `pack_keys` op).

For the D values v of a gradient, sum = sum|v|, R(v) = sum / |v| >= 1 and
L(v) = ceil(log_b R(v)); values with L > tau are dropped (early stop: |v| < sum / b^tau
never reaches the logarithm). The receiver rebuilds |v| = sum / b^L, which never exceeds
the true |v| (the paper's deliberate underestimate), with the sign kept.
"""
from typing import Any, Mapping, Optional, Union

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base
from tfgc.codecs import rows as sparse_rows
from tfgc.codecs.base import check_integer, check_real  # `base` is also an argument

SIGN_BIT = 0x80
MAX_THRESHOLD = 128  # L in 1..128 fits the 7 bits beside the sign


class FastSGD(base.Codec):
    """FastSGD value + key encoder, for dense tensors and `tf.IndexedSlices`.

    Args:
      base: logarithm base b > 1 (paper: 1.1). Smaller is finer and costs nothing extra.
      threshold: tau in 1..128 (paper: 128); values with L > tau are dropped.
      flag_bits: length-flag bits of the key encoder, 1..5 (paper: 2).

    Each kept value is one byte: a sign bit and L - 1 in seven bits (an L of 0, which
    only the sole non-zero value of a tensor can have, is sent as 1: a further
    underestimate by b). Dense tensors send their non-zero elements as key/value pairs.
    IndexedSlices send their distinct rows (repeated indices summed first): the rows'
    ids packed as keys and the rows' values as `encode_values` sends them
    (`tfgc.codecs.rows.SparseRows`).

    Payload: {"keys": packed keys, "values": uint8 codes, "sum": float32 (float64 for
    float64 input), "dtype": an empty tensor of the input's dtype, "shape", int32} for
    dense tensors; IndexedSlices' is `SparseRows`'s. `encode_values` sends IndexedSlices' rows
    alone, for a receiver that holds their indices: "positions" and "kept_listed"
    instead of "keys", and no shape.
    """

    accepts_indexed_slices = True

    def __init__(self, base: float = 1.1, threshold: int = MAX_THRESHOLD,
                 flag_bits: int = 2) -> None:
        base = check_real(base, "FastSGD base")
        threshold = check_integer(threshold, "FastSGD threshold", 1, MAX_THRESHOLD)
        flag_bits = tfgc_ops.check_flag_bits(flag_bits, "FastSGD flag_bits")
        if not base > 1.0:
            raise ValueError(f"FastSGD base must be > 1, got {base}")
        self.base, self.threshold, self.flag_bits = base, threshold, flag_bits

    def get_config(self) -> dict[str, Any]:
        return {"base": self.base, "threshold": self.threshold, "flag_bits": self.flag_bits}

    # --- encoding ------------------------------------------------------------------

    def encode(self, x: Union[tf.Tensor, tf.IndexedSlices]) -> base.Payload:
        if isinstance(x, tf.IndexedSlices):
            return self._encode_slices(x)
        x = base.check_floating(x, self.name)
        positions, codes, total = self._quantize(tf.reshape(x, [-1]))
        payload = self._payload(positions, codes, total, x.dtype)  # keys are the positions
        payload["shape"] = base.shape_of(x)
        return payload

    def _encode_slices(self, slices):
        # The paper's sparse path: the distinct rows' ids packed as keys, their values
        # quantized (the few dropped listed, see `encode_values`).
        return sparse_rows.SparseRows(self).encode(sparse_rows.distinct_rows(slices))

    def _payload(self, keys, codes, total, dtype):
        """The kept values' ascending keys, packed, with their codes and the sum."""
        return {"keys": tfgc_ops.pack_keys(keys, flag_bits=self.flag_bits), "values": codes,
                "sum": total, "dtype": tf.zeros([0], dtype)}

    def _quantize(self, values):
        """(positions of the kept values in 1-D `values`, their uint8 codes, the sum)."""
        wire = tf.float64 if values.dtype == tf.float64 else tf.float32
        # The sum (as received; NaN if a value is not finite) and the early stop of
        # Algorithm 1, |v| < sum / b^tau, in two C++ passes; the rest runs on the few kept.
        total, positions = tfgc_ops.magnitude_filter(values, self.base**-self.threshold)
        v = tf.cast(tf.gather(values, positions), tf.float64)
        kept = tf.abs(tf.where(tf.math.is_finite(v), v, 0.0))
        level = tf.math.ceil(tf.math.log(total / kept) / tf.math.log(tf.constant(self.base, tf.float64)))
        level = tf.maximum(tf.where(tf.math.is_finite(level), level, 1.0), 1.0)
        # Logarithms round: step up where the rebuilt value would exceed the true one
        # (as the receiver rebuilds it; a level above tau is dropped either way).
        rebuilt = tf.gather(self._magnitudes(total),
                            tf.cast(tf.minimum(level, MAX_THRESHOLD + 1), tf.int32))
        level += tf.cast(rebuilt > kept, tf.float64)
        passed = level <= self.threshold
        positions, level = tf.boolean_mask(positions, passed), tf.boolean_mask(level, passed)
        negative = tf.boolean_mask(v, passed) < 0
        codes = tf.cast(level - 1.0, tf.int32) | tf.where(negative, SIGN_BIT, 0)
        return positions, tf.cast(codes, tf.uint8), tf.cast(total, wire)

    # --- rows without their indices -------------------------------------------------

    def encode_values(self, values: tf.IndexedSlices) -> base.Payload:
        """The rows of IndexedSlices whose distinct indices the receiver holds: their
        values as `encode` sends them, without keys or shape. Which elements were kept
        travels as the shorter list of positions in the rows, packed as keys: those
        dropped (usually: with the paper's tau only |v| < sum / 1.1^128 is, a few
        percent) or those kept ("kept_listed" says which)."""
        values = base.check_floating(values, self.name)
        flat = tf.reshape(values, [-1])
        kept, codes, total = self._quantize(flat)
        count = tf.size(flat, out_type=tf.int64)
        kept_listed = 2 * tf.size(kept, out_type=tf.int64) <= count
        listed = tf.cond(kept_listed, lambda: tf.cast(kept, tf.int64),
                         lambda: _complement(tf.cast(kept, tf.int64), count))
        return {"positions": tfgc_ops.pack_keys(listed, flag_bits=self.flag_bits),
                "kept_listed": tf.reshape(tf.cast(kept_listed, tf.uint8), [1]),
                "values": codes, "sum": total, "dtype": tf.zeros([0], values.dtype)}

    def decode_values(self, payload: base.Payload, indices: tf.Tensor,
                      dense_shape: tf.Tensor) -> tf.IndexedSlices:
        fields = base.check_payload(payload, self.name, _VALUES_FIELDS)
        dense_shape = tf.cast(dense_shape, tf.int64)
        count = tf.size(indices, out_type=tf.int64) * tf.reduce_prod(dense_shape[1:])
        listed = tf.cast(tfgc_ops.unpack_keys(fields["positions"]), tf.int64)
        flag = base.check_size(fields["kept_listed"], 1, self.name, key="kept_listed")
        # One code per kept value, counted before the complement is made: a payload
        # whose codes do not match its rows is refused before anything is allocated
        # for them.
        listed_count = tf.size(listed, out_type=tf.int64)
        codes = base.check_size(
            fields["values"], tf.where(flag[0] > 0, listed_count, count - listed_count),
            self.name)
        with tf.control_dependencies([codes]):
            count = tf.identity(count)
        kept = tf.cond(flag[0] > 0, lambda: listed, lambda: _complement(listed, count))
        values = self._decoded_values(dict(fields, values=codes), tf.size(kept))
        # scatter_nd rejects a position outside the rows (a malformed payload).
        flat = tf.scatter_nd(kept[:, None], values, tf.reshape(count, [1]))
        rows = tf.reshape(flat, tf.concat([[-1], dense_shape[1:]], 0))
        return tf.IndexedSlices(rows, indices, dense_shape)

    def _magnitudes(self, total):
        """|v| rebuilt from the sum for L = 0 .. MAX_THRESHOLD + 1 (float64): the one
        table both sides read."""
        level = tf.range(MAX_THRESHOLD + 2, dtype=tf.float64)
        return total * tf.pow(tf.constant(self.base, tf.float64), -level)

    # --- decoding ------------------------------------------------------------------

    def decode(self, payload: base.Payload, expected_shape: Optional[base.Shape] = None
               ) -> Union[tf.Tensor, tf.IndexedSlices]:
        if sparse_rows.is_rows_payload(payload):
            return sparse_rows.SparseRows(self).decode(payload, expected_shape)
        fields, dims, n = base.checked_payload(self, payload, _DENSE_FIELDS, expected_shape)
        keys = tfgc_ops.unpack_keys(fields["keys"])
        values = self._decoded_values(fields, tf.size(keys))
        # scatter_nd refuses a key outside the n elements.
        dense = tf.scatter_nd(keys[:, None], values, tf.reshape(tf.cast(n, tf.int64), [1]))
        return tf.reshape(dense, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """Dense payloads: the decoding and, per kept value (at most one per element),
        its key (int64, and its copy as an index), its code as an index (int32) and its
        value. Rows sent alone (`decode_values`), per element of the rows: the
        complement of the listed positions (int32 marks, int64 positions and their copy)
        and the rows, besides the kept values' own."""
        size = fields["dtype"].dtype.size
        per_kept = 8 + 8 + 4 + size
        if "positions" in fields:
            return 4 + 8 + 8 + size + per_kept
        return size + per_kept

    def _decoded_values(self, payload, count):
        """The `count` values of `payload`'s codes (a payload with other than `count`
        codes fails before anything is allocated for them)."""
        codes = tf.cast(base.check_size(payload["values"], count, self.name), tf.int32)
        # 256 possible codes: their values are looked up, not computed per value.
        code = tf.range(256)
        magnitude = tf.gather(self._magnitudes(tf.cast(payload["sum"], tf.float64)),
                              (code & ~SIGN_BIT) + 1)
        table = tf.cast(tf.where(code & SIGN_BIT > 0, -magnitude, magnitude),
                        payload["dtype"].dtype)
        return tf.gather(table, codes)


_COMMON_FIELDS = {
    "values": base.BYTES,  # uint8 codes
    "sum": base.Field((tf.float32, tf.float64), rank=0),
    "dtype": base.DTYPE_MARKER,
}
_DENSE_FIELDS = dict(_COMMON_FIELDS, keys=base.BYTES, shape=base.SHAPE)
_VALUES_FIELDS = dict(_COMMON_FIELDS, positions=base.BYTES,
                      kept_listed=base.Field((tf.uint8,), rank=1))


def _complement(positions, count):
    """The positions in [0, count) not in `positions` (ascending; a position outside
    [0, count) fails)."""
    taken = tf.scatter_nd(positions[:, None], tf.ones_like(positions, tf.int32),
                          tf.reshape(count, [1]))
    return tf.reshape(tf.where(taken == 0), [-1])


def bits_per_key(payload: base.Payload) -> tf.Tensor:
    """Key cost of a FastSGD payload: packed key bits per sent value (header included)."""
    count = tf.maximum(tf.size(payload["values"]), 1)
    return 8.0 * tf.cast(tf.size(payload["keys"]), tf.float32) / tf.cast(count, tf.float32)
