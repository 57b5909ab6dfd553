"""FastSGD's key packing: sparse keys as delta keys in adaptive bit-level binary
(Algorithm 2; cc/key_packing*)."""
import numpy as np
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

MIN_FLAG_BITS, MAX_FLAG_BITS = 1, 5

__all__ = ["check_flag_bits", "pack_keys", "unpack_keys"]


def check_flag_bits(flag_bits: int, what: str = "flag_bits") -> int:
    """`flag_bits` as an int in 1..5; a fraction or a bool is refused, not truncated.

    Raises:
      ValueError: naming `what`, when `flag_bits` is not an integer in 1..5.
    """
    integral = (not isinstance(flag_bits, bool)
                and isinstance(flag_bits, (int, float, np.integer, np.floating))
                and flag_bits == int(flag_bits))
    if not integral or not MIN_FLAG_BITS <= int(flag_bits) <= MAX_FLAG_BITS:
        raise ValueError(f"{what} must be an integer in [1, 5], got {flag_bits!r}")
    return int(flag_bits)


def pack_keys(keys: TensorLike, flag_bits: int = 2) -> tf.Tensor:
    """Packs sparse keys as delta keys in adaptive bit-level binary (FastSGD Algorithm 2).

    Args:
      keys: 1-D int32 or int64 tensor of non-negative, strictly increasing keys.
      flag_bits: bits of the length flag, 1..5 (the paper recommends 2).

    Returns:
      1-D uint8 tensor: a header (flag bits, delta bit length, LEB128 key count) then the
      bit stream of (flag, delta) entries, most significant bit first.

    Raises:
      ValueError: flag_bits is not an integer in 1..5.
      tf.errors.InvalidArgumentError: keys are negative, not strictly increasing, or not 1-D.
    """
    flag_bits = check_flag_bits(flag_bits)
    keys = tf.convert_to_tensor(keys)
    if keys.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"keys must be int32 or int64, got {keys.dtype.name}")
    return _ops.tfgc_pack_keys(keys, flag_bits=flag_bits)


def unpack_keys(packed: TensorLike) -> tf.Tensor:
    """Inverse of `pack_keys`.

    Args:
      packed: 1-D uint8 tensor produced by `pack_keys`.

    Returns:
      1-D int64 tensor of keys.

    Raises:
      ValueError: the input is not bytes.
      tf.errors.InvalidArgumentError: the bytes are not a well-formed packing.
    """
    return _ops.tfgc_unpack_keys(as_bytes(packed, "unpack_keys"))
