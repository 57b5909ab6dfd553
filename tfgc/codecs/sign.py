"""Scaled sign: one bit per value and one scale per tensor (EF-SignSGD, Karimireddy et
al. 2019)."""
from typing import Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack


class ScaledSign(base.ReconstructingCodec):
    """Sends sign(x) packed one bit per value and the scale ||x||_1 / n.

    Every value decodes to +scale or -scale (zero counts as positive), so the decoding
    has x's l1 norm. Biased: under `tfgc.DistributedOptimizer`'s error feedback (the
    default) this is EF-SignSGD; without it, signSGD with a scale. Compared with
    `OneBit`, which dequantizes each side to its own mean, the two sides share one
    magnitude. The bits and the sums come from one C++ pass (`tfgc_ops.sign_bits_encode`,
    sums in double).

    Payload: {"data": sign bits, "scale": in x's dtype, "shape"}.
    """

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        data, sums, _ = tfgc_ops.sign_bits_encode(flat)
        n = tf.cast(tf.maximum(tf.size(flat), 1), tf.float64)
        finite = tf.reduce_all(tf.math.is_finite(sums))
        scale = base.nan_unless(finite, tf.cast((sums[0] - sums[1]) / n, tf.float32))
        scale = base.round_to(scale, x.dtype)
        payload = {"data": data, "scale": tf.cast(scale, x.dtype), "shape": base.shape_of(x)}
        values = tf.where(flat >= 0, scale, -scale)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        data = base.check_size(fields["data"], bitpack.packed_size(n, 1), self.name)
        scale = fields["scale"]
        positive = bitpack.unpack_bits(data, 1, n) > 0
        return tf.reshape(tf.where(positive, scale, -scale), dims)


_FIELDS = {"data": base.BYTES, "scale": base.FLOAT_SCALAR, "shape": base.SHAPE}
