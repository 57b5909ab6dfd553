"""Logarithmic quantization (LogQuant, Miyashita et al. 2016): signed powers of two."""
from typing import Any, Mapping, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, quantize


class LogQuant(base.ReconstructingCodec):
    """Each value becomes sign(x) * 2^e, e = round(log2|x|), in a window below max|x|.

    With K bits per value, one bit is the sign and K-1 bits a level m: m = 0 is zero and
    m >= 1 is 2^(fsr - m + 1), where 2^fsr = the power of two at or above max|x| (the
    "full-scale range"). Values below the window's smallest power become zero. Both
    roundings are exact (from the floats' bits, no logarithm is computed); Inf and NaN
    make the scale NaN, so the receiver decodes NaN (the non-finite policy).

    Args:
      bits: K in 2..8.

    Payload: {"data": packed codes, "scale": 2^fsr (float32, as 2^16 overflows float16),
    "dtype": an empty tensor of x's dtype, "shape"}.
    """

    def __init__(self, bits: int = 4) -> None:
        self.bits = quantize.check_bits(bits, "LogQuant bits")

    def get_config(self) -> dict[str, Any]:
        return {"bits": self.bits}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        # One C++ pass after the largest magnitude (NaN for a non-finite input, which makes
        # the scale NaN): exact roundings, no logarithm; `values` are the receiver's
        # decoding of the sent bytes.
        data, values, scale = tfgc_ops.log_levels_encode(
            flat, tfgc_ops.largest_magnitude(flat), self.bits)
        payload = {
            "data": data,
            "scale": scale,
            "dtype": tf.zeros([0], x.dtype),
            "shape": base.shape_of(x),
        }
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        # One pass of C++: level m >= 1 is +-scale * 2^(1 - m), 0 is 0.
        values = tfgc_ops.log_levels_decode(fields["data"], fields["scale"], n, self.bits)
        return tf.reshape(tf.cast(values, fields["dtype"].dtype), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding as float32, and cast to the payload's dtype."""
        return 4 + base.extra_bytes(fields["dtype"].dtype)


_FIELDS = {
    "data": base.BYTES,
    "scale": base.Field((tf.float32,), rank=0),
    "dtype": base.DTYPE_MARKER,
    "shape": base.SHAPE,
}
