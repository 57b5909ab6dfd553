"""1-bit quantization with squared-error-minimizing values (1-bit SGD, Seide et al. 2014)."""
from typing import Mapping, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack


class OneBit(base.ReconstructingCodec):
    """One bit per value: x >= 0 or not, each side dequantized to its mean.

    The two means minimize the squared error of a sign quantizer (3LC's "MQE 1-bit").
    Biased: run it under `tfgc.ErrorFeedback`, as 1-bit SGD does. The bits and both
    sides' sums come from one C++ pass (`tfgc_ops.sign_bits_encode`); the sums are in
    double, so no finite input overflows the means.

    Payload: {"data": sign bits, "positive", "negative" (means in x's dtype), "shape"}.
    """

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        data, sums, counts = tfgc_ops.sign_bits_encode(flat)
        means = tf.cast(sums / tf.cast(tf.maximum(counts, 1), tf.float64), tf.float32)
        finite = tf.reduce_all(tf.math.is_finite(sums))
        positive = base.round_to(base.nan_unless(finite, means[0]), x.dtype)
        negative = base.round_to(base.nan_unless(finite, means[1]), x.dtype)
        payload = {
            "data": data,
            "positive": tf.cast(positive, x.dtype),
            "negative": tf.cast(negative, x.dtype),
            "shape": base.shape_of(x),
        }
        values = tf.where(flat >= 0, positive, negative)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        base.check_same_dtype(fields, ["positive", "negative"], self.name)
        data = base.check_size(fields["data"], bitpack.packed_size(n, 1), self.name)
        upper = bitpack.unpack_bits(data, 1, n) > 0
        values = tf.where(upper, fields["positive"], fields["negative"])
        return tf.reshape(values, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The unpacked bits (int32, then bool) and the decoding."""
        return 4 + 1 + fields["positive"].dtype.size


_FIELDS = {
    "data": base.BYTES,
    "positive": base.FLOAT_SCALAR,
    "negative": base.FLOAT_SCALAR,
    "shape": base.SHAPE,
}
