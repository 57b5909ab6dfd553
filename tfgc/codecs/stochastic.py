"""Unbiased stochastic quantizers: TernGrad-like 3-values and QSGD."""
import tensorflow as tf

from tfgc.codecs import base, bitpack, quartic, quantize


class StochasticTernary(base.StochasticCodec):
    """Stochastic 3-value quantization + quartic encoding (3LC's "Stoch 3-value + QE").

    q = sign(x) with probability |x| / M, else 0, M = max|x|: E[M q] = x (TernGrad
    without gradient clipping); 1.6 bits per value.

    Payload: {"data": quartic bytes, "scale": M in x's dtype, "shape"}.
    """

    unbiased = True

    def __init__(self, seed=None):
        super().__init__(seed=seed, name="stochastic_ternary")
        self._fold = base.CompiledForLarge(_ternary_fold)

    def get_config(self):
        return {"seed": self.seed}

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        data, scale = self._fold(x, self.uniform([tf.size(x)]))
        payload = {
            "data": data,
            "scale": tf.cast(scale, x.dtype),
            "shape": base.shape_of(x),
        }
        values = quartic.unfold(data, tf.size(x)) * scale
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload):
        shape = payload["shape"]
        n = tf.reduce_prod(shape)
        data = base.check_size(payload["data"], quartic.groups_for(n), self.name)
        scale = payload["scale"]
        values = tf.cast(quartic.unfold(data, n) * tf.cast(scale, tf.float32), scale.dtype)
        return tf.reshape(values, base.static_shape(shape))


def _ternary_fold(x, uniform):
    """(quartic bytes of sign(x) kept with probability |x| / M, M = max|x| as the receiver
    reads it) for `uniform` draws in [0, 1), one per value."""
    flat = tf.reshape(tf.cast(x, tf.float32), [-1])
    finite = base.all_finite(flat)
    scale = base.round_to(base.nan_unless(finite, base.largest_magnitude(flat)), x.dtype)
    probability = tf.abs(flat) / tf.where(scale > 0, scale, 1.0)
    q = tf.where((uniform < probability) & finite, tf.sign(flat), 0.0)
    return quartic.fold(q), scale


class QSGD(base.StochasticCodec):
    """QSGD (Alistarh et al. 2017): stochastic rounding of |x| / ||bucket||_2 to s levels.

    The flattened tensor is split into buckets of `bucket_size` values (QSGD's d; the
    last one zero-padded), each with its own L2 norm. With `bits` K, each value is a sign
    bit and a level in 0..s, s = 2^(K-1) - 1, rounded up with probability equal to the
    remainder, so E[decode] = x. K bits per value plus 32 bits per bucket.

    Args:
      bits: K in 2..8 (GradiVeQ samples with 4).
      bucket_size: values per norm (QSGD's experiments use 512).
      seed: int for reproducible draws.

    Payload: {"data": packed codes, "norms" (one per bucket, x's dtype), "shape"}.
    """

    unbiased = True

    def __init__(self, bits=4, bucket_size=512, seed=None):
        quantize.check_bits(bits)
        if int(bucket_size) < 1:
            raise ValueError(f"QSGD bucket_size must be >= 1, got {bucket_size}")
        super().__init__(seed=seed, name="qsgd")
        self.bits = int(bits)
        self.bucket_size = int(bucket_size)
        self.levels = 2 ** (self.bits - 1) - 1
        self._codes = base.CompiledForLarge(self._bucket_codes)

    def get_config(self):
        return {"bits": self.bits, "bucket_size": self.bucket_size, "seed": self.seed}

    def encode_and_reconstruct(self, x):
        x = base.check_floating(x, self.name)
        count = (tf.size(x) + self.bucket_size - 1) // self.bucket_size
        codes, norms = self._codes(x, self.uniform([count, self.bucket_size]))
        payload = {
            "data": bitpack.pack_bits(codes, self.bits),
            "norms": tf.cast(norms, x.dtype),
            "shape": base.shape_of(x),
        }
        values = self._values(codes, payload["norms"], tf.size(x))
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def _bucket_codes(self, x, uniform):
        """(int32 sign-level codes, bucket norms as the receiver reads them) of `x` for
        `uniform` draws in [0, 1), one per bucket slot."""
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        finite = base.all_finite(flat)
        buckets = self._buckets(tf.where(tf.math.is_finite(flat), flat, 0.0))
        norms = base.round_to(tf.norm(buckets, axis=1, keepdims=True), x.dtype)
        norms = base.nan_unless(finite, norms)
        scaled = tf.abs(buckets) / tf.where(norms > 0, norms, 1.0) * self.levels
        lower = tf.floor(scaled)
        level = tf.minimum(lower + tf.cast(uniform < scaled - lower, tf.float32), self.levels)
        codes = bitpack.join_sign(buckets < 0, level, self.bits)
        return tf.reshape(codes, [-1])[:tf.size(flat)], tf.reshape(norms, [-1])

    def decode(self, payload):
        shape = payload["shape"]
        n = tf.reduce_prod(shape)
        data = base.check_size(payload["data"], bitpack.packed_size(n, self.bits), self.name)
        norms = base.check_size(payload["norms"], (n + self.bucket_size - 1) // self.bucket_size, self.name)
        values = self._values(bitpack.unpack_bits(data, self.bits, n), norms, n)
        return tf.reshape(tf.cast(values, norms.dtype), base.static_shape(shape))

    def _values(self, codes, norms, n):
        """The n float32 values of sign-level `codes` with bucket `norms`."""
        negative, level = bitpack.split_sign(self._buckets(codes), self.bits)
        signed = tf.where(negative, -level, level)
        values = signed * tf.cast(norms, tf.float32)[:, None] / self.levels
        return tf.reshape(values, [-1])[:n]

    def _buckets(self, flat):
        """[n] -> [ceil(n / bucket_size), bucket_size], zero-padded."""
        n = tf.size(flat)
        count = (n + self.bucket_size - 1) // self.bucket_size
        padded = tf.pad(flat, [[0, count * self.bucket_size - n]])
        return tf.reshape(padded, [count, self.bucket_size])
