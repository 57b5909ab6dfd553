"""rANS entropy coding of quartic bytes, the smaller alternative to zero-run encoding
(cc/quartic_rans*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike, as_bytes, group_sizes
from tfgc_ops._load import ops as _ops

__all__ = ["quartic_entropy_encode", "quartic_entropy_decode"]


def quartic_entropy_encode(quartic: TensorLike, groups: TensorLike) -> tf.Tensor:
    """Entropy-codes quartic bytes, a smaller alternative to `zero_run_encode`.

    Each group (e.g. one tensor's bytes) is coded with rANS under one number: the share
    of its 3-values that are nonzero, assumed independent with random signs. The format
    is in tfgc_ops/cc/quartic_rans.h and, executable, in `reference_ops.quartic_entropy_encode`.

    Args:
      quartic: 1-D uint8 tensor of quartic-encoded bytes, each in 0..242.
      groups: 1-D integer sizes of the groups, summing to the length of `quartic`; the
        receiver needs the same sizes to decode.

    Returns:
      1-D uint8 tensor: two bytes per group, a 4-byte rANS state, then the stream.

    Raises:
      ValueError: the input is not bytes, or groups are not integers.
      tf.errors.InvalidArgumentError: a byte is above 242, the groups do not sum to the
        input's length, or a size is negative.
    """
    return _ops.tfgc_quartic_entropy_encode(as_bytes(quartic, "quartic_entropy_encode"),
                                            group_sizes(groups))


def quartic_entropy_decode(encoded: TensorLike, groups: TensorLike) -> tf.Tensor:
    """Exact inverse of `quartic_entropy_encode` with the same groups.

    The output has exactly sum(groups) bytes, a size the receiver knows; nothing is
    allocated from what the message declares.

    Args:
      encoded: 1-D uint8 tensor.
      groups: 1-D integer group sizes, as given to the encoder.

    Returns:
      1-D uint8 tensor of quartic bytes.

    Raises:
      ValueError: the input is not bytes, or groups are not integers.
      tf.errors.InvalidArgumentError: `encoded` is not a complete encoding of groups of
        these sizes (truncated, too long, or corrupt).
    """
    return _ops.tfgc_quartic_entropy_decode(as_bytes(encoded, "quartic_entropy_decode"),
                                            group_sizes(groups))
