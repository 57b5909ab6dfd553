"""3LC's quantization and quartic folding (sections 3.1-3.2), one tensor or a batch laid end
to end, and the largest magnitude that sets its scale (cc/quartic_fold*)."""
from typing import Sequence

import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

__all__ = ["largest_magnitude", "quartic_fold", "quartic_unfold", "batch_largest_magnitude",
           "batch_quartic_fold", "batch_quartic_unfold"]


def largest_magnitude(x: TensorLike) -> tf.Tensor:
    """max|x| of a 1-D float32 tensor in one pass; NaN if a value is not finite, 0 if empty."""
    return _ops.tfgc_largest_magnitude(tf.convert_to_tensor(x, tf.float32))


def quartic_fold(x: TensorLike, scale: TensorLike) -> tf.Tensor:
    """3LC's quantization and quartic folding (sections 3.1-3.2) in one pass.

    Args:
      x: 1-D float32 tensor of n values.
      scale: float32 scalar M; q = round-half-even(x / M) clamped to [-1, 1], and every q
        is 0 when M is not > 0 (zero or NaN).

    Returns:
      1-D uint8 tensor of ceil(n / 5) bytes, byte i = sum over k of
      (q[k g + i] + 1) * 3^(4 - k) with g the byte count and the pad's q = 0
      (`reference_ops.quartic_encode`).
    """
    return _ops.tfgc_quartic_fold(tf.convert_to_tensor(x, tf.float32),
                                  tf.convert_to_tensor(scale, tf.float32))


def quartic_unfold(quartic: TensorLike, n: TensorLike, scale: TensorLike) -> tf.Tensor:
    """Inverse of `quartic_fold`: the n float32 values q * scale.

    Raises:
      tf.errors.InvalidArgumentError: `quartic` does not have exactly ceil(n / 5) bytes
        (checked before anything is allocated), or a byte is above 242.
    """
    return _ops.tfgc_quartic_unfold(as_bytes(quartic, "quartic_unfold"), tf.cast(n, tf.int64),
                                    tf.convert_to_tensor(scale, tf.float32))


def batch_largest_magnitude(x: TensorLike, sizes: Sequence[int]) -> tf.Tensor:
    """`largest_magnitude` of each of a batch of tensors laid end to end in 1-D float32
    `x`, whose element counts are the Python ints `sizes`: float32 [len(sizes)]."""
    return _ops.tfgc_batch_largest_magnitude(tf.convert_to_tensor(x, tf.float32),
                                             sizes=[int(s) for s in sizes])


def batch_quartic_fold(x: TensorLike, scales: TensorLike, sizes: Sequence[int]) -> tf.Tensor:
    """`quartic_fold` of each of a batch of tensors laid end to end in 1-D float32 `x`
    (element counts: the Python ints `sizes`), tensor i with scale `scales[i]`; their
    bytes laid end to end (ceil(size / 5) each)."""
    return _ops.tfgc_batch_quartic_fold(tf.convert_to_tensor(x, tf.float32),
                                        tf.convert_to_tensor(scales, tf.float32),
                                        sizes=[int(s) for s in sizes])


def batch_quartic_unfold(quartic: TensorLike, scales: TensorLike,
                         sizes: Sequence[int]) -> tf.Tensor:
    """Inverse of `batch_quartic_fold`: the tensors' float32 values laid end to end.

    Raises:
      tf.errors.InvalidArgumentError: `quartic` does not hold exactly ceil(size / 5)
        bytes per tensor, a byte is above 242, or `scales` has not one per tensor.
    """
    return _ops.tfgc_batch_quartic_unfold(as_bytes(quartic, "batch_quartic_unfold"),
                                          tf.convert_to_tensor(scales, tf.float32),
                                          sizes=[int(s) for s in sizes])
