"""Sparsification baselines: magnitude threshold with a bitmap, and Top-k with indices.

Both drop most values; run them under `tfgc.ErrorFeedback` so that what is not sent is
kept for later steps (as 3LC's baselines do). Non-finite values are always sent, so a
failed step stays visible after decoding.
"""
from typing import Any, Mapping, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack

# Dtypes whose values survive a round trip through float32, so the C++ selection
# (`tfgc_ops.magnitude_select`, float32) sends them exactly; float64 takes `largest`.
_THROUGH_FLOAT32 = (tf.float32, tf.float16, tf.bfloat16)

_FINITE_BITS = 0x7F800000  # +inf's bit pattern: finite non-negative float32s lie below
_FINE_SHIFT = 15
_FINE = 1 << _FINE_SHIFT  # the coarse bins' width (an exact divisor of _FINITE_BITS)


class Sparsify(base.ReconstructingCodec):
    """Sends the largest `fraction` of values by magnitude, located by a bitmap.

    Exactly k = ceil(fraction * n) nonzero values are kept (fewer when fewer are nonzero),
    ties at the threshold broken by position, plus any non-finite ones; the threshold is
    found by histograms of the magnitudes, whatever the tensor's layout (one C++ op,
    `tfgc_ops.magnitude_select`, for float32, float16 and bfloat16). Costs 1 + 32 * fraction
    bits per value for float32 (3LC's "25%" and "5% sparsification").

    Payload: {"bitmap": 1 bit per value, "values": kept values in x's dtype, "shape"}.
    """

    def __init__(self, fraction: float = 0.25) -> None:
        self.fraction = _share(fraction, "Sparsify fraction")

    def get_config(self) -> dict[str, Any]:
        return {"fraction": self.fraction}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(x, [-1])
        k = tf.cast(tf.math.ceil(self.fraction * tf.cast(tf.size(flat), tf.float32)), tf.int32)
        if x.dtype in _THROUGH_FLOAT32:
            bitmap, values, kept = tfgc_ops.magnitude_select(tf.cast(flat, tf.float32), k)
            payload = {"bitmap": bitmap, "values": tf.cast(values, x.dtype),
                       "shape": base.shape_of(x)}
            return payload, tf.reshape(tf.cast(kept, x.dtype), tf.shape(x))
        magnitude = tf.abs(tf.cast(flat, tf.float32))
        finite = tf.math.is_finite(magnitude)
        keep = largest(tf.where(finite, magnitude, 0.0), k) | ~finite
        payload = {
            "bitmap": bitpack.pack_bits(tf.cast(keep, tf.int32), 1),
            "values": tf.boolean_mask(flat, keep),
            "shape": base.shape_of(x),
        }
        return payload, tf.reshape(tf.where(keep, flat, tf.zeros_like(flat)), tf.shape(x))

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _SPARSIFY_FIELDS, expected_shape)
        dtype = fields["values"].dtype
        bitmap = base.check_size(fields["bitmap"], bitpack.packed_size(n, 1), self.name,
                                 key="bitmap")
        if dtype in _THROUGH_FLOAT32:  # the op checks both sizes before allocating
            values = tf.cast(fields["values"], tf.float32)
            dense = tfgc_ops.bitmap_expand(bitmap, values, n)
            return tf.reshape(tf.cast(dense, dtype), dims)
        positions = tf.where(bitpack.unpack_bits(bitmap, 1, n) > 0)
        values = base.check_size(fields["values"], tf.shape(positions)[0], self.name,
                                 key="values")
        dense = tf.scatter_nd(positions, values, tf.reshape(tf.cast(n, tf.int64), [1]))
        return tf.reshape(dense, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """float32, float16 and bfloat16: the kept values and the decoding as float32
        (and the decoding cast back); float64: the unpacked bitmap (int32 and bool), the
        kept positions (int64) and the decoding."""
        dtype = fields["values"].dtype
        if dtype in _THROUGH_FLOAT32:
            return 8 + base.extra_bytes(dtype)
        return 4 + 1 + 8 + dtype.size


class TopK(base.ReconstructingCodec):
    """Sends the k = ceil(ratio * n) largest-magnitude values and their int32 indices
    (fewer when fewer are non-zero; non-finite values always, as a failed step).

    Payload: {"indices": int32, strictly ascending (the C++ decode of float32, float16
    and bfloat16 values refuses others), "values" in x's dtype, "shape"}.
    """

    def __init__(self, ratio: float = 0.01) -> None:
        self.ratio = _share(ratio, "TopK ratio")

    def get_config(self) -> dict[str, Any]:
        return {"ratio": self.ratio}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(x, [-1])
        n = tf.size(flat)
        k = tf.minimum(n, tf.cast(tf.math.ceil(self.ratio * tf.cast(n, tf.float32)), tf.int32))
        if x.dtype in _THROUGH_FLOAT32:
            indices, values, kept = tfgc_ops.magnitude_select(
                tf.cast(flat, tf.float32), k, positions="indices", non_finite_in_wanted=True)
            payload = {"indices": indices, "values": tf.cast(values, x.dtype),
                       "shape": base.shape_of(x)}
            return payload, tf.reshape(tf.cast(kept, x.dtype), tf.shape(x))
        magnitude = tf.abs(tf.cast(flat, tf.float32))
        finite = tf.math.is_finite(magnitude)
        # Non-finite values first (the failure must reach the receiver), then the
        # largest of the rest by the exact two-pass threshold (no sort: tf.math.top_k
        # ran at 0.17 GB/s on 16M values); zeros are never sent.
        unseen = k - tf.reduce_sum(tf.cast(~finite, tf.int32))
        keep = (largest(tf.where(finite, magnitude, 0.0), unseen) & (unseen > 0)) | ~finite
        indices = tf.cast(tf.reshape(tf.where(keep), [-1]), tf.int32)  # ascending
        values = tf.gather(flat, indices)
        payload = {"indices": indices, "values": values, "shape": base.shape_of(x)}
        dense = tf.scatter_nd(indices[:, None], values, tf.shape(flat))
        return payload, tf.reshape(dense, tf.shape(x))

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _TOPK_FIELDS, expected_shape)
        indices = fields["indices"]
        values = base.check_size(fields["values"], tf.size(indices), self.name, key="values")
        if indices.dtype == tf.int32 and values.dtype in _THROUGH_FLOAT32:
            # One pass in C++ (`tfgc_ops.positions_expand`, which checks that the
            # indices ascend within n first): tf.scatter_nd to 1% of 16M positions ran
            # at 0.14-0.16x a one-pass XLA op.
            dense = tfgc_ops.positions_expand(indices, tf.cast(values, tf.float32), n)
            return tf.reshape(tf.cast(dense, values.dtype), dims)
        # n is at most MAX_ELEMENTS (checked), so it fits int32 indices; scatter_nd
        # refuses an index outside it.
        size = tf.reshape(tf.cast(n, indices.dtype), [1])
        dense = tf.scatter_nd(indices[:, None], values, size)
        return tf.reshape(dense, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding (as float32 for float32, float16 and bfloat16 values, cast back)
        and, per kept value, at most one per element, a copy of its index and value."""
        dtype, index = fields["values"].dtype, fields["indices"].dtype
        if index == tf.int32 and dtype in _THROUGH_FLOAT32:
            return 4 + base.extra_bytes(dtype) + 4
        return dtype.size + index.size


_SPARSIFY_FIELDS = {"bitmap": base.BYTES, "values": base.FLOAT_VECTOR, "shape": base.SHAPE}
_TOPK_FIELDS = {
    "indices": base.Field(base.INDEX_DTYPES, rank=1),
    "values": base.FLOAT_VECTOR,
    "shape": base.SHAPE,
}


def largest(magnitude: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """Mask of the k largest values of `magnitude` (finite, >= 0), zeros never included.

    A non-negative float32's bit pattern orders like its value, so the value of rank k
    is found by a histogram of the bit patterns in 2**15-wide bins and then one of unit
    bins within the bin that holds it: two counting passes, exact, with no sort and no
    sample (a strided sample sees only some columns of a matrix). The histograms also
    give how many values lie above the threshold and on it, so the mask costs one more
    pass; only extra ties at the threshold (e.g. a constant tensor) need a cumulative sum.

    Args:
        magnitude: 1-D float32, finite and non-negative.
        k: int32 scalar, how many to keep.

    Returns:
        A bool mask with min(k, number of nonzero values) entries set.
    """
    bits = tf.bitcast(magnitude, tf.int32)
    k = tf.maximum(k, 1)  # an empty or all-zero input: the pick is masked out below
    coarse_bins = tf.bitwise.right_shift(bits, _FINE_SHIFT)
    bin_, above = _bin_of_rank(_counts(coarse_bins, _FINITE_BITS // _FINE), k)
    start = bin_ * _FINE
    # Only the values in the chosen coarse bin are counted again, in unit bins; the
    # rest get an index past the end, which bincount leaves out.
    fine = _counts(tf.where(coarse_bins == bin_, bits - start, _FINE), _FINE)
    offset, above = _bin_of_rank(fine, k - above, above)
    threshold = start + offset
    tied = bits == threshold
    tied_wanted = k - above
    tied = tf.cond(
        fine[offset] > tied_wanted,
        lambda: tied & (tf.math.cumsum(tf.cast(tied, tf.int32)) <= tied_wanted),
        lambda: tied,
    )
    return ((bits > threshold) | tied) & (bits > 0)


def _counts(bins, size):
    """How many of the int32 `bins` (each >= 0) equal 0 .. size - 1; larger ones are
    left out. (bincount counts in one pass; histogram_fixed_width is ~4x slower.)"""
    return tf.raw_ops.DenseBincount(input=bins, size=tf.constant(size, tf.int32),
                                    weights=tf.zeros([0], tf.int32))


def _bin_of_rank(counts, k, above_all=0):
    """The bin holding the k-th largest entry of a histogram, and how many lie above it.

    Args:
        counts: int32 histogram, bins in ascending order of value.
        k: int32 scalar >= 1, the rank among the entries of `counts`.
        above_all: entries above the histogram's range, added to the count above.
    """
    at_or_above = tf.math.cumsum(counts, reverse=True)
    bin_ = tf.maximum(tf.math.count_nonzero(at_or_above >= k, dtype=tf.int32) - 1, 0)
    return bin_, above_all + at_or_above[bin_] - counts[bin_]


def _share(value, what):
    """`value` as a float once checked to be a share of the values, in (0, 1]."""
    value = base.check_real(value, what)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{what} must be in (0, 1], got {value}")
    return value
