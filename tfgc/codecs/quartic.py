"""Quartic encoding (3LC section 3.2): five 3-values {-1, 0, 1} folded into one byte.

Plain TF functions meant to be called inside an XLA-compiled function, where they fuse
with the quantization that produces the 3-values.
"""
import tensorflow as tf

POWERS = (81, 27, 9, 3, 1)
ZERO_GROUP = 121  # five zero 3-values


def fold(ternary):
    """1-D float tensor of 3-values -> uint8 bytes a = 81 p0 + 27 p1 + 9 p2 + 3 p3 + p4.

    The paper's steps: add 1, pad to a multiple of 5, split into five contiguous
    partitions p0..p4, weigh and sum. The pad is a 3-value 0 so that a zero tail joins a
    zero run. Summing in float over the [5, groups] view lets XLA fuse the whole fold
    into the pass that produces the 3-values.
    """
    n = tf.size(ternary)
    groups = (n + 4) // 5
    parts = tf.reshape(tf.pad(ternary, [[0, 5 * groups - n]]), [5, groups])
    weights = tf.constant(POWERS, tf.float32)[:, None]
    return tf.cast(tf.reduce_sum((parts + 1.0) * weights, axis=0), tf.uint8)


def unfold(quartic, n):
    """uint8 bytes -> the first n 3-values as float32 (inverse of `fold`)."""
    parts = [(quartic // power) % 3 for power in POWERS]
    return tf.cast(tf.concat(parts, axis=0)[:n], tf.float32) - 1.0


def groups_for(n):
    """Bytes that n 3-values fold into."""
    return (n + 4) // 5
