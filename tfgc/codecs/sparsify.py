"""Sparsification baselines: magnitude threshold with a bitmap, and Top-k with indices.

Both drop most values; run them under `tfgc.ErrorFeedback` so that what is not sent is
kept for later steps (as 3LC's baselines do). Non-finite values are always sent, so a
failed step stays visible after decoding.
"""
import tensorflow as tf

from tfgc.codecs import base, bitpack

SAMPLE_SIZE = 4096


class Sparsify(base.ReconstructingCodec):
    """Sends the largest `fraction` of values by magnitude, located by a bitmap.

    The threshold is the magnitude of rank ceil(fraction * m) in a strided sample of
    m <= 4096 values, so the kept fraction is approximate. Costs 1 + 32 * fraction bits
    per value for float32 (3LC's "25%" and "5% sparsification").

    Payload: {"bitmap": 1 bit per value, "values": kept values in x's dtype, "shape"}.
    """

    def __init__(self, fraction=0.25):
        self.fraction = _share(fraction, "Sparsify fraction")

    def get_config(self):
        return {"fraction": self.fraction}

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        flat = tf.reshape(x, [-1])
        magnitude = tf.abs(tf.cast(flat, tf.float32))
        n = tf.size(flat)
        sample = magnitude[:: tf.maximum(1, n // SAMPLE_SIZE)]
        m = tf.size(sample)
        rank = tf.clip_by_value(
            tf.cast(tf.math.ceil(self.fraction * tf.cast(m, tf.float32)), tf.int32), 1, tf.maximum(m, 1)
        )
        ordered = tf.concat([tf.sort(sample, direction="DESCENDING"), [float("inf")]], 0)
        threshold = ordered[rank - 1]
        keep = (magnitude >= threshold) | ~tf.math.is_finite(magnitude)
        payload = {
            "bitmap": bitpack.pack_bits(tf.cast(keep, tf.int32), 1),
            "values": tf.boolean_mask(flat, keep),
            "shape": base.shape_of(x),
        }
        return payload, tf.reshape(tf.where(keep, flat, tf.zeros_like(flat)), tf.shape(x))

    def decode(self, payload):
        shape = payload["shape"]
        n = tf.reduce_prod(shape)
        bitmap = base.check_size(payload["bitmap"], bitpack.packed_size(n, 1), self.name)
        positions = tf.where(bitpack.unpack_bits(bitmap, 1, n) > 0)
        values = base.check_size(payload["values"], tf.shape(positions)[0], self.name)
        dense = tf.scatter_nd(positions, values, tf.reshape(tf.cast(n, tf.int64), [1]))
        return tf.reshape(dense, base.static_shape(shape))


class TopK(base.ReconstructingCodec):
    """Sends the k = ceil(ratio * n) largest-magnitude values and their int32 indices.

    Payload: {"indices": int32 (ascending), "values" in x's dtype, "shape"}.
    """

    def __init__(self, ratio=0.01):
        self.ratio = _share(ratio, "TopK ratio")

    def get_config(self):
        return {"ratio": self.ratio}

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        flat = tf.reshape(x, [-1])
        magnitude = tf.abs(tf.cast(flat, tf.float32))
        ranking = tf.where(tf.math.is_finite(magnitude), magnitude, float("inf"))
        n = tf.size(flat)
        k = tf.minimum(n, tf.cast(tf.math.ceil(self.ratio * tf.cast(n, tf.float32)), tf.int32))
        _, indices = tf.math.top_k(ranking, k, sorted=False)
        indices = tf.sort(indices)
        values = tf.gather(flat, indices)
        payload = {"indices": indices, "values": values, "shape": base.shape_of(x)}
        dense = tf.scatter_nd(indices[:, None], values, tf.shape(flat))
        return payload, tf.reshape(dense, tf.shape(x))

    def decode(self, payload):
        shape = payload["shape"]
        n = tf.reduce_prod(shape)
        values = base.check_size(payload["values"], tf.size(payload["indices"]), self.name)
        dense = tf.scatter_nd(payload["indices"][:, None], values, tf.reshape(n, [1]))
        return tf.reshape(dense, base.static_shape(shape))



def _share(value, what):
    """`value` as a float once checked to be a share of the values, in (0, 1]."""
    value = float(value)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{what} must be in (0, 1], got {value}")
    return value
