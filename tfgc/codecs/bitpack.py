"""Packing of small unsigned codes (1..8 bits each) into bytes, most significant first
(the C++ op `tfgc_ops.pack_bits`).

`bits` may be a Python int or an int32 tensor (e.g. a tf.Variable an agent changes
between steps): the graph does not depend on its value, so changing it never retraces.
"""
from typing import Union

import tensorflow as tf

import tfgc_ops


def packed_size(n: Union[int, tf.Tensor], bits: Union[int, tf.Tensor]) -> tf.Tensor:
    """Bytes that n codes of `bits` bits take."""
    return (tf.cast(n, tf.int64) * tf.cast(bits, tf.int64) + 7) // 8


def pack_bits(codes: tf.Tensor, bits: Union[int, tf.Tensor]) -> tf.Tensor:
    """Integer codes in [0, 2^bits), any shape -> uint8 of ceil(n * bits / 8) bytes."""
    return tfgc_ops.pack_bits(tf.reshape(tf.cast(codes, tf.int32), [-1]), bits)


def unpack_bits(packed: tf.Tensor, bits: Union[int, tf.Tensor],
                n: Union[int, tf.Tensor]) -> tf.Tensor:
    """Inverse of `pack_bits`: the n codes as int32; `packed` must be exactly their bytes."""
    return tfgc_ops.unpack_bits(packed, bits, n)
