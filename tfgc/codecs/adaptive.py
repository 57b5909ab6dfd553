"""The "Adaptive" baseline of MQGrad's paper (Oland & Raj 2015): bits chosen per tensor."""
import math
from typing import Any, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base
from tfgc.codecs.quantize import MAX_BITS, MIN_BITS, Quantize, check_bits


def adaptive_bits(x: tf.Tensor, rho: float = 0.01, min_bits: int = MIN_BITS,
                  max_bits: int = MAX_BITS) -> tf.Tensor:
    """The fewest bits whose quantization noise is at most `rho` of x's power.

    Uniform quantization of [min, max] with 2^k - 1 steps of width
    Δ_k = (max - min) / (2^k - 1) adds noise of mean square Δ_k² / 12 (uniform error
    in ±Δ_k / 2). The rule picks the smallest k in [min_bits, max_bits] with
    Δ_k² / 12 <= rho · mean(x²), i.e. a signal-to-quantization-noise ratio of at least
    1 / rho (20 dB for rho = 0.01):

        k = ceil(log2(1 + (max - min) / sqrt(12 · rho · mean(x²)))), clipped.

    An empty, all-zero or non-finite `x` gets `min_bits`.

    Returns:
      An int32 scalar tensor.
    """
    flat = tf.reshape(tf.cast(x, tf.float32), [-1])
    return _bits_for_range(tfgc_ops.value_range(flat), tf.size(flat), rho, min_bits, max_bits)


def _bits_for_range(value_range, size, rho, min_bits, max_bits):
    """`adaptive_bits` from a tensor's `tfgc_ops.value_range` and its size."""
    extremes, finite, sum_squares = value_range
    finite = finite & (size > 0)
    spread = tf.where(finite, extremes[1] - extremes[0], 0.0)
    mean_square = tf.cast(sum_squares / tf.cast(tf.maximum(size, 1), tf.float64), tf.float32)
    power = tf.where(finite, mean_square, 0.0)
    levels = spread / tf.sqrt(12.0 * rho * tf.maximum(power, 1e-30))
    bits = tf.math.ceil(tf.math.log(1.0 + levels) / math.log(2.0))
    bits = tf.where(finite & (power > 0), bits, float(min_bits))
    return tf.cast(tf.clip_by_value(bits, float(min_bits), float(max_bits)), tf.int32)


class AdaptiveQuantize(Quantize):
    """"Adaptive" (Oland & Raj 2015) as MQGrad's paper uses it: bits chosen per tensor.

    Every tensor is quantized like `Quantize`, with the bits `adaptive_bits` picks from
    the tensor's own range and mean square: the fewest bits whose uniform quantization
    noise is at most `rho` times the gradient's power. The payload carries the bits, so
    decoding needs nothing else. (Oland & Raj bound the quantization error relative to
    the gradient; the exact threshold is not given in MQGrad's paper, hence `rho`.)

    Args:
      rho: the largest allowed ratio of quantization noise power to gradient power.
      min_bits: the fewest bits allowed.
      max_bits: the most bits allowed.
    """

    def __init__(self, rho: float = 0.01, min_bits: int = MIN_BITS, max_bits: int = MAX_BITS,
                 name: Optional[str] = None) -> None:
        rho = base.check_real(rho, "AdaptiveQuantize rho")
        if not rho > 0:
            raise ValueError(f"rho must be positive, got {rho}")
        min_bits = check_bits(min_bits, "AdaptiveQuantize min_bits")
        max_bits = check_bits(max_bits, "AdaptiveQuantize max_bits")
        if min_bits > max_bits:
            raise ValueError(f"need {MIN_BITS} <= min_bits <= max_bits <= {MAX_BITS}")
        super().__init__(bits=max_bits, name=name)
        self.rho, self.min_bits, self.max_bits = rho, min_bits, max_bits

    def get_config(self) -> dict[str, Any]:
        return {"rho": self.rho, "min_bits": self.min_bits, "max_bits": self.max_bits}

    def _bits_for(self, value_range, size):
        # The range pass that quantization makes anyway also picks the bits.
        return _bits_for_range(value_range, size, self.rho, self.min_bits, self.max_bits)
