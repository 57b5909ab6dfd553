"""Codes of 1..8 bits packed into bytes, most significant bit first: the quantizers'
payloads (cc/bit_packing*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

__all__ = ["pack_bits", "unpack_bits"]


def pack_bits(codes: TensorLike, bits: TensorLike) -> tf.Tensor:
    """Packs codes of `bits` bits into bytes, most significant bit first.

    Args:
      codes: 1-D int32 tensor, each code in [0, 2^bits).
      bits: int or int32 scalar tensor in 1..8 (a tensor may change between steps without
        retracing).

    Returns:
      1-D uint8 tensor of ceil(n * bits / 8) bytes, the last one zero-padded.

    Raises:
      tf.errors.InvalidArgumentError: bits outside 1..8, a code out of range, or codes
        that are not 1-D.
    """
    return _ops.tfgc_pack_bits(tf.convert_to_tensor(codes, tf.int32), tf.cast(bits, tf.int32))


def unpack_bits(packed: TensorLike, bits: TensorLike, n: TensorLike) -> tf.Tensor:
    """Inverse of `pack_bits`: the n codes held by exactly ceil(n * bits / 8) bytes.

    Args:
      packed: 1-D uint8 tensor.
      bits: int or int32 scalar tensor in 1..8.
      n: how many codes; checked against the bytes before anything is allocated.

    Returns:
      1-D int32 tensor of n codes.

    Raises:
      ValueError: `packed` is not bytes.
      tf.errors.InvalidArgumentError: bits outside 1..8, or n that does not match the
        number of bytes.
    """
    return _ops.tfgc_unpack_bits(as_bytes(packed, "unpack_bits"), tf.cast(bits, tf.int32),
                                 tf.cast(n, tf.int64))
