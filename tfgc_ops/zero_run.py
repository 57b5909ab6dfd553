"""3LC's zero-run encoding of quartic bytes (section 3.3; cc/zero_run*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes
from tfgc_ops._load import ops as _ops

__all__ = ["zero_run_encode", "zero_run_decode"]


def zero_run_encode(quartic: TensorLike) -> tf.Tensor:
    """Zero-run encodes quartic bytes (3LC section 3.3).

    Args:
      quartic: 1-D uint8 tensor of quartic-encoded bytes, each in 0..242.

    Returns:
      1-D uint8 tensor where each run of k bytes equal to 121 (2 <= k <= 14) is one byte
      243 + (k - 2); longer runs are split greedily into 14s.

    Raises:
      ValueError: the input is not bytes (a tensor of another dtype, values beyond 0..255).
      tf.errors.InvalidArgumentError: a byte is above 242 or the input is not 1-D.
    """
    return _ops.tfgc_zero_run_encode(as_bytes(quartic, "zero_run_encode"))


def zero_run_decode(encoded: TensorLike) -> tf.Tensor:
    """Exact inverse of `zero_run_encode`; any byte string decodes.

    Args:
      encoded: 1-D uint8 tensor.

    Returns:
      1-D uint8 tensor of quartic bytes.

    Raises:
      ValueError: the input is not bytes (a tensor of another dtype, values beyond 0..255).
    """
    return _ops.tfgc_zero_run_decode(as_bytes(encoded, "zero_run_decode"))
