"""Stochastic rounding with draws that depend only on a seed and each value's index:
QSGD and 3LC's stochastic 3-values (cc/stochastic_rounding*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

__all__ = ["qsgd_norms", "qsgd_encode", "qsgd_decode", "stochastic_ternary_fold"]


def qsgd_norms(x: TensorLike, bucket_size: int) -> tf.Tensor:
    """L2 norm of each bucket of `bucket_size` values of 1-D float32 `x` (the last one
    short), summed in double; NaN or Inf where a value is not finite."""
    return _ops.tfgc_qsgd_norms(tf.convert_to_tensor(x, tf.float32), bucket_size=int(bucket_size))


def qsgd_encode(x: TensorLike, norms: TensorLike, seed: TensorLike, bits: int,
                bucket_size: int) -> tf.Tensor:
    """QSGD's stochastic rounding of 1-D float32 `x`, packed `bits` bits per value.

    Value j of bucket b gets level l = min(floor(t) + [u_j < t - floor(t)], s) with
    t = min(|x_j| * (s / norms[b]), s), s = 2^(bits-1) - 1, and code (x_j < 0) << (bits - 1) | l;
    a bucket whose norm is not > 0 and finite sends level 0. The draw u_j in [0, 1)
    depends only on `seed` (2 int64) and j (`reference_ops.uniform_draws`).

    Returns:
      uint8 tensor of ceil(n * bits / 8) bytes, packed as `pack_bits` packs.
    """
    return _ops.tfgc_qsgd_encode(tf.convert_to_tensor(x, tf.float32),
                                 tf.convert_to_tensor(norms, tf.float32),
                                 tf.cast(seed, tf.int64), bits=int(bits),
                                 bucket_size=int(bucket_size))


def qsgd_decode(packed: TensorLike, norms: TensorLike, n: TensorLike, bits: int,
                bucket_size: int) -> tf.Tensor:
    """Inverse of `qsgd_encode`: the n float32 values (+-l * norms[b]) / s.

    Raises:
      tf.errors.InvalidArgumentError: `packed` does not hold exactly n codes or `norms`
        is not one per bucket (checked before anything is allocated).
    """
    return _ops.tfgc_qsgd_decode(as_bytes(packed, "qsgd_decode"),
                                 tf.convert_to_tensor(norms, tf.float32), tf.cast(n, tf.int64),
                                 bits=int(bits), bucket_size=int(bucket_size))


def stochastic_ternary_fold(x: TensorLike, scale: TensorLike, seed: TensorLike) -> tf.Tensor:
    """3LC's stochastic 3-values of 1-D float32 `x`, folded as `quartic_fold` folds.

    q_j = sign(x_j) when u_j < |x_j| * (1 / scale), else 0 (every q is 0 when `scale` is not
    > 0); u_j as in `qsgd_encode`. Unfold with `quartic_unfold`.
    """
    return _ops.tfgc_stochastic_ternary_fold(tf.convert_to_tensor(x, tf.float32),
                                             tf.convert_to_tensor(scale, tf.float32),
                                             tf.cast(seed, tf.int64))
