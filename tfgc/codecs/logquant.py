"""Logarithmic quantization (LogQuant, Miyashita et al. 2016): signed powers of two."""
import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack, quantize


class LogQuant(base.ReconstructingCodec):
    """Each value becomes sign(x) * 2^e, e = round(log2|x|), in a window below max|x|.

    With K bits per value, one bit is the sign and K-1 bits a level m: m = 0 is zero and
    m >= 1 is 2^(fsr - m + 1), where 2^fsr = the power of two at or above max|x| (the
    "full-scale range"). Values below the window's smallest power become zero.

    Args:
      bits: K in 2..8.

    Payload: {"data": packed codes, "scale": 2^fsr (float32, as 2^16 overflows float16),
    "dtype": an empty tensor of x's dtype, "shape"}.
    """

    def __init__(self, bits=4):
        quantize.check_bits(bits)
        self.bits = int(bits)
        self.levels = 2 ** (self.bits - 1) - 1
        self._codes = base.CompiledForLarge(self._signed_levels)

    def get_config(self):
        return {"bits": self.bits}

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        codes, full_scale, finite = self._codes(x)
        scale = base.nan_unless(finite, tf.pow(2.0, full_scale))
        data = bitpack.pack_bits(codes, self.bits)
        payload = {
            "data": data,
            "scale": scale,
            "dtype": tf.zeros([0], x.dtype),
            "shape": base.shape_of(x),
        }
        # The receiver's decoding of the sent bytes, by construction.
        values = tfgc_ops.log_levels_decode(data, scale, tf.size(x), self.bits)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def _signed_levels(self, x):
        """(int32 codes, the full-scale exponent fsr, all finite) of `x`."""
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        finite = base.all_finite(flat)
        magnitude = tf.abs(tf.where(finite, flat, 0.0))
        largest = base.largest_magnitude(flat)
        full_scale = tf.where(largest > 0, tf.math.ceil(_log2(largest)), 0.0)
        exponent = tf.round(_log2(tf.where(magnitude > 0, magnitude, 1.0)))
        level = full_scale - tf.minimum(full_scale, exponent) + 1.0
        level = tf.where((magnitude > 0) & (level <= self.levels), level, 0.0)
        return bitpack.join_sign(flat < 0, level, self.bits), full_scale, finite

    def decode(self, payload):
        shape = payload["shape"]
        # One pass of C++: level m >= 1 is +-scale * 2^(1 - m), 0 is 0.
        values = tfgc_ops.log_levels_decode(payload["data"], payload["scale"],
                                            tf.reduce_prod(shape), self.bits)
        return tf.reshape(tf.cast(values, payload["dtype"].dtype), base.static_shape(shape))

def _log2(x):
    return tf.math.log(x) / tf.math.log(2.0)
