"""Deterministic quantizers: a vector's range and uniform quantization
(cc/uniform_quantize*), OneBit's sign bits and Signum's
momentum step (cc/sign_bits*), and LogQuant's sign-level codes
(cc/log_levels*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

__all__ = ["value_range", "uniform_quantize", "sign_bits_encode", "momentum_sign_bits_encode",
           "log_levels_encode", "log_levels_decode"]


def value_range(x: TensorLike) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """A float32 vector's range in one pass.

    Returns:
      (extremes, finite, sum_squares): float32 [min, max] (+inf, -inf for an empty x;
      unspecified unless every value is finite), a bool scalar that says whether every
      value is finite, and the sum of the squares in float64.
    """
    return _ops.tfgc_value_range(tf.convert_to_tensor(x, tf.float32))


def uniform_quantize(x: TensorLike, low: TensorLike, step: TensorLike,
                     bits: TensorLike) -> tuple[tf.Tensor, tf.Tensor]:
    """Uniform quantization of a float32 vector, packed as `pack_bits` packs its codes.

    Code q_i = round((x_i - low) / d) with ties to even, d = step if step > 0 else 1,
    clamped to [0, 2^bits - 1]; a quotient that is NaN (x_i or low NaN) gives 0.

    Args:
      x: 1-D float32 tensor.
      low: float32 scalar, the value of code 0.
      step: float32 scalar, the value between two codes.
      bits: int or int32 scalar tensor in 1..8.

    Returns:
      (packed, reconstructed): ceil(n * bits / 8) uint8, and low + q_i * step (computed
      only where it is used).

    Raises:
      tf.errors.InvalidArgumentError: bits outside 1..8, or x not 1-D.
    """
    return _ops.tfgc_uniform_quantize(tf.convert_to_tensor(x, tf.float32),
                                      tf.cast(low, tf.float32), tf.cast(step, tf.float32),
                                      tf.cast(bits, tf.int32))


def sign_bits_encode(x: TensorLike) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One-bit sign quantization of a 1-D float32 tensor in one pass.

    Returns:
      (packed, sums, counts): uint8 [ceil(n / 8)] with bit i (most significant bit
      first, the last byte zero-padded) = x_i >= 0, as `pack_bits(codes, 1)` packs them;
      float64 [2], the sums of the values >= 0 and of the others (NaN counts with the
      others; a non-finite value makes its side's sum non-finite); int64 [2], how many
      values each sum holds (`reference_ops.sign_bits_encode`).
    """
    return _ops.tfgc_sign_bits_encode(tf.convert_to_tensor(x, tf.float32))


def momentum_sign_bits_encode(
        momentum: TensorLike, x: TensorLike,
        beta: TensorLike) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Signum's sender step on 1-D float32 tensors in one pass: the updated momentum and
    `sign_bits_encode` of it.

    updated = beta * momentum + x in float32, the product rounded and then the sum (as
    TensorFlow's multiply then add round them: `beta * momentum + x` gives the same
    floats).

    Args:
      momentum: 1-D float32 tensor.
      x: 1-D float32 tensor of momentum's length.
      beta: float32 scalar.

    Returns:
      (updated, packed, sums, counts): float32 like x, and `sign_bits_encode(updated)`
      bit for bit.
    """
    return _ops.tfgc_momentum_sign_bits_encode(tf.convert_to_tensor(momentum, tf.float32),
                                                tf.convert_to_tensor(x, tf.float32),
                                                tf.convert_to_tensor(beta, tf.float32))


def log_levels_encode(x: TensorLike, largest: TensorLike,
                      bits: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """LogQuant's sign-level codes of 1-D float32 `x`, packed `bits` bits each, in one pass.

    With fsr = ceil(log2 largest) (0 unless `largest` is positive and finite), x_i gets level
    m = fsr - round(log2 |x_i|) + 1 where 1 <= m <= 2^(bits - 1) - 1, else 0 (also for 0,
    Inf and NaN), and x_i's sign bit on top; both roundings are exact, no logarithm is
    computed (`reference_ops.log_levels_codes`).

    Args:
      x: 1-D float32.
      largest: max |x_i|, NaN when some x_i is not finite (`largest_magnitude(x)`).
      bits: 2..8.

    Returns:
      (packed uint8 codes, the float32 values `log_levels_decode` gives for them, scale):
      scale is 2^fsr, or NaN when `largest` is not finite.
    """
    return _ops.tfgc_log_levels_encode(tf.convert_to_tensor(x, tf.float32),
                                       tf.convert_to_tensor(largest, tf.float32), bits=int(bits))


def log_levels_decode(packed: TensorLike, scale: TensorLike, n: TensorLike,
                      bits: int) -> tf.Tensor:
    """LogQuant's n float32 values from sign-level codes packed `bits` bits each.

    Level m = 0 is 0 and m >= 1 is +-scale * 2^(1 - m); a scale that is not finite gives
    +-scale everywhere (`reference_ops.log_levels_values`).

    Raises:
      tf.errors.InvalidArgumentError: `packed` does not hold exactly n codes (checked
        before anything is allocated), or bits outside 2..8.
    """
    return _ops.tfgc_log_levels_decode(as_bytes(packed, "log_levels_decode"),
                                       tf.convert_to_tensor(scale, tf.float32),
                                       tf.cast(n, tf.int64), bits=int(bits))
