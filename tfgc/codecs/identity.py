"""The uncompressed baseline and the 16-bit casts practitioners compare against first."""
import tensorflow as tf

from tfgc.codecs import base


class NoCompression(base.Codec):
    """Sends the tensor as it is: the reference every ratio is measured against."""

    summable = True

    def encode(self, x):
        return {"values": base.check_floating(x, self.name)}

    def decode(self, payload):
        return payload["values"]

    def encode_and_reconstruct(self, x):
        payload = self.encode(x)
        return payload, payload["values"]


class Cast(base.Codec):
    """Sends float16 or bfloat16 and casts back to the input dtype.

    Args:
      dtype: "float16" or "bfloat16".

    Finite values beyond float16's range saturate at +-65504 rather than becoming Inf,
    so only a non-finite input decodes non-finite. Summable: casts commute with sums up
    to rounding.
    """

    summable = True

    def __init__(self, dtype="float16"):
        self.dtype = tf.as_dtype(dtype)
        if self.dtype not in (tf.float16, tf.bfloat16):
            raise ValueError(f"Cast sends float16 or bfloat16, got {self.dtype.name}")
        self._cast = base.CompiledForLarge(self._saturating_cast)

    def get_config(self):
        return {"dtype": self.dtype.name}

    def encode(self, x):
        x = base.check_floating(x, self.name)
        # The receiver needs the input dtype: a zero-size tensor carries it for free.
        return {"values": self._cast(x), "dtype": tf.zeros([0], x.dtype)}

    def _saturating_cast(self, x):
        if self.dtype == tf.float16 and x.dtype != tf.float16:
            largest = tf.constant(tf.float16.max, x.dtype)
            x = tf.where(tf.math.is_finite(x), tf.clip_by_value(x, -largest, largest), x)
        return tf.cast(x, self.dtype)

    def decode(self, payload):
        return tf.cast(payload["values"], payload["dtype"].dtype)
