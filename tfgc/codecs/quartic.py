"""Quartic encoding (3LC section 3.2): five 3-values {-1, 0, 1} folded into one byte.

Plain TF functions meant to be called inside an XLA-compiled function, where they fuse
with the quantization that produces the 3-values.
"""
import tensorflow as tf

POWERS = (81, 27, 9, 3, 1)
ZERO_GROUP = 121  # five zero 3-values


def fold(ternary):
    """1-D float tensor of 3-values -> uint8 bytes a = 81 p0 + 27 p1 + 9 p2 + 3 p3 + p4.

    The paper's steps: add 1, cast to uint8, pad to a multiple of 5, split into five
    contiguous partitions p0..p4. The pad is a 3-value 0 (digit 1) so that a zero tail
    joins a zero run.
    """
    n = tf.size(ternary)
    digits = tf.cast(ternary + 1.0, tf.uint8)
    groups = (n + 4) // 5
    digits = tf.pad(digits, [[0, 5 * groups - n]], constant_values=1)
    parts = tf.reshape(digits, [5, groups])
    quartic = tf.zeros([groups], tf.uint8)
    for i, power in enumerate(POWERS):
        quartic += parts[i] * power
    return quartic


def unfold(quartic, n):
    """uint8 bytes -> the first n 3-values as float32 (inverse of `fold`)."""
    parts = [(quartic // power) % 3 for power in POWERS]
    return tf.cast(tf.concat(parts, axis=0)[:n], tf.float32) - 1.0


def groups_for(n):
    """Bytes that n 3-values fold into."""
    return (n + 4) // 5
