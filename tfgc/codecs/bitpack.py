"""Packing of small unsigned codes (1..8 bits each) into bytes, most significant first.

`bits` may be a Python int or an int32 tensor (e.g. a tf.Variable an agent changes
between steps): the graph does not depend on its value, so changing it never retraces.
"""
import tensorflow as tf


def _shifts(bits):
    bits = tf.cast(bits, tf.int64)
    value_shifts = bits * (7 - tf.range(8, dtype=tf.int64))          # 8 codes per group
    byte_shifts = 8 * (bits - 1 - tf.range(bits, dtype=tf.int64))    # `bits` bytes per group
    return value_shifts, byte_shifts


def packed_size(n, bits):
    """Bytes that n codes of `bits` bits take."""
    return (tf.cast(n, tf.int64) * tf.cast(bits, tf.int64) + 7) // 8


def join_sign(negative, level, bits):
    """Sign-magnitude codes: the sign in the top bit of `bits`, a level below it."""
    sign = tf.bitwise.left_shift(tf.cast(negative, tf.int32), bits - 1)
    return sign | tf.cast(level, tf.int32)


def split_sign(codes, bits):
    """Inverse of `join_sign`: (negative as bool, level as float32)."""
    negative = tf.bitwise.right_shift(codes, bits - 1) > 0
    level = codes & (tf.bitwise.left_shift(1, bits - 1) - 1)
    return negative, tf.cast(level, tf.float32)


def pack_bits(codes, bits):
    """1-D integer codes in [0, 2^bits) -> uint8 of ceil(n * bits / 8) bytes."""
    codes = tf.cast(tf.reshape(codes, [-1]), tf.int64)
    n = tf.size(codes, out_type=tf.int64)
    groups = (n + 7) // 8
    codes = tf.reshape(tf.pad(codes, [[0, 8 * groups - n]]), [groups, 8])
    value_shifts, byte_shifts = _shifts(bits)
    # Codes occupy disjoint bits, so the sum is their bitwise OR.
    words = tf.reduce_sum(tf.bitwise.left_shift(codes, value_shifts), axis=1)
    packed = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[:, None], byte_shifts), 255)
    return tf.cast(tf.reshape(packed, [-1])[: packed_size(n, bits)], tf.uint8)


def unpack_bits(packed, bits, n):
    """Inverse of `pack_bits`: the first n codes as int32."""
    n = tf.cast(n, tf.int64)
    bits64 = tf.cast(bits, tf.int64)
    groups = (n + 7) // 8
    padded = tf.pad(tf.cast(packed, tf.int64), [[0, groups * bits64 - tf.size(packed, tf.int64)]])
    value_shifts, byte_shifts = _shifts(bits)
    words = tf.reduce_sum(tf.bitwise.left_shift(tf.reshape(padded, [groups, bits64]), byte_shifts), 1)
    mask = tf.bitwise.left_shift(tf.constant(1, tf.int64), bits64) - 1
    codes = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[:, None], value_shifts), mask)
    return tf.cast(tf.reshape(codes, [-1])[:n], tf.int32)
