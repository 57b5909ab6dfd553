"""Sparsification: exact top-k selection and its bitmap decoder (cc/magnitude_select*),
FastSGD's threshold filter (cc/magnitude_filter*), and a sparse gradient's rows summed by
index (cc/row_sums*)."""
import tensorflow as tf

from tfgc_ops._inputs import TensorLike
from tfgc_ops._load import ops as _ops

__all__ = ["magnitude_select", "bitmap_expand", "positions_expand", "magnitude_filter", "row_sums"]


def magnitude_select(x: TensorLike, wanted: TensorLike, positions: str = "bitmap",
                     non_finite_in_wanted: bool = False
                     ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The `wanted` largest magnitudes of a float32 vector, exactly, in three passes.

    Selects the `wanted` largest nonzero finite |x_i| (fewer when fewer are nonzero; ties
    at the threshold in position order) and every value that is not finite, which counts
    in `wanted` when `non_finite_in_wanted` (`reference_ops.magnitude_select`).

    Args:
      x: 1-D float32 tensor (at most 2^31 - 1 values).
      wanted: integer scalar.
      positions: "bitmap" (uint8, bit i most significant first, as `pack_bits` packs
        1-bit codes) or "indices" (int32, ascending).
      non_finite_in_wanted: whether the non-finite values use up part of `wanted`.

    Returns:
      (positions, values, reconstruction): the selection as asked; the selected values
      in position order; x where selected and 0 elsewhere (computed only where used).
    """
    types = {"bitmap": tf.uint8, "indices": tf.int32}
    if positions not in types:
        raise ValueError(f"positions must be 'bitmap' or 'indices', got {positions!r}")
    return _ops.tfgc_magnitude_select(
        tf.convert_to_tensor(x, tf.float32), tf.cast(wanted, tf.int64),
        non_finite_in_wanted=bool(non_finite_in_wanted), positions_type=types[positions])


def bitmap_expand(bitmap: TensorLike, values: TensorLike, n: TensorLike) -> tf.Tensor:
    """The inverse of `magnitude_select`'s bitmap and values (Sparsify's decode).

    Returns:
      float32 [n]: the next of `values` where bit i of `bitmap` is set (most significant
      bit first), else 0.

    Raises:
      tf.errors.InvalidArgumentError: the bitmap is not ceil(n / 8) bytes, or its first n
        bits do not select exactly as many values as given (checked before allocating).
    """
    return _ops.tfgc_bitmap_expand(tf.convert_to_tensor(bitmap, tf.uint8),
                                   tf.convert_to_tensor(values, tf.float32),
                                   tf.cast(n, tf.int64))


def positions_expand(positions: TensorLike, values: TensorLike, n: TensorLike) -> tf.Tensor:
    """The inverse of `magnitude_select`'s positions and values (TopK's decode).

    Returns:
      float32 [n]: values[j] at positions[j], 0 elsewhere, written in one pass.

    Raises:
      tf.errors.InvalidArgumentError: not as many values as positions, n negative, or
        positions not strictly ascending within [0, n) (checked before allocating).
    """
    return _ops.tfgc_positions_expand(tf.convert_to_tensor(positions, tf.int32),
                                      tf.convert_to_tensor(values, tf.float32),
                                      tf.cast(n, tf.int64))


def magnitude_filter(v: TensorLike, factor: TensorLike) -> tuple[tf.Tensor, tf.Tensor]:
    """FastSGD's threshold filter (Algorithm 1 with its early stop) in two passes over v.

    Args:
      v: 1-D floating values (float16 and bfloat16 are widened to float32).
      factor: b^-tau; a value can pass the filter when |v| >= sum * factor.

    Returns:
      (sum, positions): float64 scalar, the sum of |v| over the finite values rounded to
      v's wire dtype (float64 for float64 input, else float32), NaN when a value is not
      finite; int64 positions, ascending, of the values with 0 < |v| >= sum * factor and
      of every value that is not finite (`reference_ops.magnitude_filter`).
    """
    v = tf.convert_to_tensor(v)
    if v.dtype != tf.float64:
        v = tf.cast(v, tf.float32)
    return _ops.tfgc_magnitude_filter(v, tf.cast(factor, tf.float64))


def row_sums(rows: TensorLike, indices: TensorLike,
             num_rows: TensorLike) -> tuple[tf.Tensor, tf.Tensor]:
    """The rows of a sparse gradient summed by distinct index, in ascending index order.

    Without hashing every index or summing into the dense tensor: distinct indices come
    from a bitmap of [0, num_rows) when it is small next to the indices, else from
    sorting them.

    Args:
      rows: [n, row_size] float32 or float64.
      indices: [n] int32 or int64, each in [0, num_rows).
      num_rows: the dense tensor's first dimension.

    Returns:
      (distinct, sums): int64 [u], the distinct indices ascending; [u, row_size] of rows'
      dtype, row k the sum (added in position order) of the rows whose index is
      distinct[k] (`reference_ops.row_sums`).

    Raises:
      tf.errors.InvalidArgumentError: an index is outside [0, num_rows), or rows and
        indices do not match.
    """
    return _ops.tfgc_row_sums(tf.convert_to_tensor(rows), tf.convert_to_tensor(indices),
                              tf.cast(num_rows, tf.int64))
