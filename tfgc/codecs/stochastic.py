"""Unbiased stochastic quantizers: TernGrad-like 3-values and QSGD."""
from typing import Any, Mapping, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, quantize


class StochasticTernary(base.StochasticCodec):
    """Stochastic 3-value quantization + quartic encoding (3LC's "Stoch 3-value + QE").

    q = sign(x) with probability |x| / M, else 0, M = max|x|: E[M q] = x (TernGrad
    without gradient clipping); 1.6 bits per value. One pass of C++ each way
    (`tfgc_ops.stochastic_ternary_fold`, `quartic_unfold`).

    Payload: {"data": quartic bytes, "scale": M in x's dtype, "shape"}.
    """

    unbiased = True

    def __init__(self, seed: Optional[int] = None) -> None:
        super().__init__(seed=seed, name="stochastic_ternary")

    def get_config(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        # NaN when a value is not finite: every 3-value is then 0 and decodes to NaN.
        scale = base.round_to(tfgc_ops.largest_magnitude(flat), x.dtype)
        data = tfgc_ops.stochastic_ternary_fold(flat, scale, self.draw_seed())
        payload = {
            "data": data,
            "scale": tf.cast(scale, x.dtype),
            "shape": base.shape_of(x),
        }
        values = tfgc_ops.quartic_unfold(data, tf.size(flat), scale)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _TERNARY_FIELDS, expected_shape)
        scale = fields["scale"]
        values = tfgc_ops.quartic_unfold(fields["data"], n, tf.cast(scale, tf.float32))
        return tf.reshape(tf.cast(values, scale.dtype), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding as float32, and cast to the payload's dtype."""
        return 4 + base.extra_bytes(fields["scale"].dtype)


_TERNARY_FIELDS = {"data": base.BYTES, "scale": base.FLOAT_SCALAR, "shape": base.SHAPE}


class QSGD(base.StochasticCodec):
    """QSGD (Alistarh et al. 2017): stochastic rounding of |x| / ||bucket||_2 to s levels.

    The flattened tensor is split into buckets of `bucket_size` values (QSGD's d; the
    last one shorter), each with its own L2 norm. With `bits` K, each value is a sign
    bit and a level in 0..s, s = 2^(K-1) - 1, rounded up with probability equal to the
    remainder, so E[decode] = x. K bits per value plus 32 bits per bucket. One pass of
    C++ each way after the norms (`tfgc_ops.qsgd_encode`, `qsgd_decode`). A bucket norm
    that is not finite (a non-finite value, or finite values whose norm overflows x's
    dtype) makes every norm NaN, so the whole tensor decodes to NaN.

    Args:
      bits: K in 2..8 (GradiVeQ samples with 4).
      bucket_size: values per norm (QSGD's experiments use 512).
      seed: int for reproducible draws.

    Payload: {"data": packed codes, "norms" (one per bucket, x's dtype), "shape"}.
    """

    unbiased = True

    def __init__(self, bits: int = 4, bucket_size: int = 512, seed: Optional[int] = None) -> None:
        bits = quantize.check_bits(bits, "QSGD bits")
        bucket_size = base.check_integer(bucket_size, "QSGD bucket_size", low=1)
        super().__init__(seed=seed, name="qsgd")
        self.bits = bits
        self.bucket_size = bucket_size
        self.levels = 2 ** (self.bits - 1) - 1

    def get_config(self) -> dict[str, Any]:
        return {"bits": self.bits, "bucket_size": self.bucket_size, "seed": self.seed}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        norms = base.round_to(tfgc_ops.qsgd_norms(flat, self.bucket_size), x.dtype)
        norms = base.nan_unless(base.all_finite(norms), norms)
        data = tfgc_ops.qsgd_encode(flat, norms, self.draw_seed(), self.bits, self.bucket_size)
        payload = {
            "data": data,
            "norms": tf.cast(norms, x.dtype),
            "shape": base.shape_of(x),
        }
        values = tfgc_ops.qsgd_decode(data, norms, tf.size(flat), self.bits, self.bucket_size)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _QSGD_FIELDS, expected_shape)
        norms = fields["norms"]
        values = tfgc_ops.qsgd_decode(fields["data"], tf.cast(norms, tf.float32), n,
                                      self.bits, self.bucket_size)
        return tf.reshape(tf.cast(values, norms.dtype), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding as float32, and cast to the payload's dtype."""
        return 4 + base.extra_bytes(fields["norms"].dtype)


_QSGD_FIELDS = {"data": base.BYTES, "norms": base.FLOAT_VECTOR, "shape": base.SHAPE}


class SeededQSGD(QSGD):
    """QSGD whose rounding draws are stateless in a seed (no generator variable to
    keep in sync across replicas), exposing its payload's parts."""

    def __init__(self, bits: int, bucket_size: int) -> None:
        super().__init__(bits=bits, bucket_size=bucket_size, seed=0)
        self._draw_seed = None

    def draw_seed(self) -> tf.Tensor:
        return self._draw_seed

    def encode_parts(self, flat: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        self._draw_seed = seed
        try:
            payload = self.encode(flat)
        finally:
            self._draw_seed = None
        return payload["data"], tf.cast(payload["norms"], tf.float32)

    def decode_parts(self, data: tf.Tensor, norms: tf.Tensor, n: int) -> tf.Tensor:
        return self.decode({"data": data, "norms": norms, "shape": tf.constant([n], tf.int32)},
                           expected_shape=[n])
