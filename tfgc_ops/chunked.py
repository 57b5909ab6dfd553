"""Chunked top-k with 2-bit values: ChunkedTopK's encode and decode (cc/chunk_top_k*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike
from tfgc_ops._load import ops as _ops

__all__ = ["chunk_top_k_encode", "chunk_top_k_decode"]


def chunk_top_k_encode(x: TensorLike, chunk: int, kept: int
                       ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The largest magnitudes of each chunk of a float32 vector, with 2-bit values.

    x is cut into chunks of `chunk` values (the last one shorter when `chunk` does not
    divide its size); a chunk of `length` values keeps ceil(length * kept / chunk) of
    them, its largest magnitudes exactly (ties in position order).

    Args:
      x: 1-D float32 tensor (at most 2^31 - 1 values).
      chunk: values per chunk, 2..65536.
      kept: entries a whole chunk keeps, 1..chunk.

    Returns:
      (positions, codes, levels): uint8, each entry's position within its chunk in
      ceil(log2(chunk)) bits; uint8, each entry's 2-bit code (bit 1: negative, bit 0:
      level high); float32 [2 * chunks], each chunk's (low, high) magnitudes. Both streams
      hold the chunks' entries in order, positions ascending within a chunk, packed most
      significant bit first with the last byte zero-padded.
    """
    return _ops.tfgc_chunk_top_k_encode(tf.convert_to_tensor(x, tf.float32),
                                        chunk=int(chunk), kept=int(kept))


def chunk_top_k_decode(positions: TensorLike, codes: TensorLike, levels: TensorLike,
                       n: TensorLike, chunk: int, kept: int) -> tf.Tensor:
    """The inverse of `chunk_top_k_encode`: float32 [n], sign * level at each entry's
    position, 0 elsewhere.

    Raises:
      tf.errors.InvalidArgumentError: the streams or the levels are not the sizes n values
        take, or a chunk's positions do not ascend strictly within it (checked before
        allocating).
    """
    return _ops.tfgc_chunk_top_k_decode(
        tf.convert_to_tensor(positions, tf.uint8), tf.convert_to_tensor(codes, tf.uint8),
        tf.convert_to_tensor(levels, tf.float32), tf.cast(n, tf.int64),
        chunk=int(chunk), kept=int(kept))
