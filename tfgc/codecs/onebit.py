"""1-bit quantization with squared-error-minimizing values (1-bit SGD, Seide et al. 2014)."""
import tensorflow as tf

from tfgc.codecs import base, bitpack


class OneBit(base.ReconstructingCodec):
    """One bit per value: x >= 0 or not, each side dequantized to its mean.

    The two means minimize the squared error of a sign quantizer (3LC's "MQE 1-bit").
    Biased: run it under `tfgc.ErrorFeedback`, as 1-bit SGD does.

    Payload: {"data": sign bits, "positive", "negative" (means in x's dtype), "shape"}.
    """

    def __init__(self):
        self._codes = base.CompiledForLarge(_sign_codes)

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        upper, positive, negative, finite = self._codes(x)
        positive = base.round_to(base.nan_unless(finite, positive), x.dtype)
        negative = base.round_to(base.nan_unless(finite, negative), x.dtype)
        payload = {
            "data": bitpack.pack_bits(upper, 1),
            "positive": tf.cast(positive, x.dtype),
            "negative": tf.cast(negative, x.dtype),
            "shape": base.shape_of(x),
        }
        values = tf.where(upper > 0, positive, negative)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload):
        shape = payload["shape"]
        n = tf.reduce_prod(shape)
        data = base.check_size(payload["data"], bitpack.packed_size(n, 1), self.name)
        upper = bitpack.unpack_bits(data, 1, n) > 0
        values = tf.where(upper, payload["positive"], payload["negative"])
        return tf.reshape(values, base.static_shape(shape))


def _sign_codes(x):
    """(int32 1 where x >= 0 else 0, mean of those values, mean of the others, all finite)."""
    flat = tf.reshape(tf.cast(x, tf.float32), [-1])
    upper = flat >= 0
    return (tf.cast(upper, tf.int32), _mean_where(flat, upper), _mean_where(flat, ~upper),
            base.all_finite(flat))


def _mean_where(values, mask):
    count = base.column_sum(tf.cast(mask, tf.float32))  # exact below 2^24 per column
    return base.column_sum(tf.where(mask, values, 0.0)) / tf.maximum(count, 1.0)
