"""What the wrappers accept, and the conversions that refuse what they should not."""
from typing import TypeAlias

import numpy as np
import tensorflow as tf

# Anything the wrappers convert to a tensor: a tensor, an array, a list, a number.
TensorLike: TypeAlias = tf.types.experimental.TensorLike


def as_bytes(data: TensorLike, what: str) -> tf.Tensor:
    """`data` as a uint8 tensor, refusing anything that is not already bytes.

    A tensor must be uint8; an array or list must hold integers in 0..255 (a silent
    conversion would wrap 300 to 44 and -1 to 255).
    """
    if isinstance(data, (tf.Tensor, tf.Variable)):
        if data.dtype != tf.uint8:
            raise ValueError(f"{what} takes a uint8 tensor, got {data.dtype.name}")
        return tf.convert_to_tensor(data)
    array: np.ndarray = np.asarray(data)
    if array.dtype == np.uint8:
        return tf.convert_to_tensor(array)
    if array.size == 0 and array.dtype == np.float64:  # an empty list
        return tf.zeros(array.shape, tf.uint8)
    if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
        raise ValueError(f"{what} takes bytes (integers in 0..255), got {array.dtype.name} "
                         f"values" + (f" in {array.min()}..{array.max()}" if array.size else ""))
    return tf.convert_to_tensor(array.astype(np.uint8))


def group_sizes(groups: TensorLike) -> tf.Tensor:
    """Group sizes as a 1-D int64 tensor; an empty list is no groups."""
    if not isinstance(groups, (tf.Tensor, tf.Variable)):
        array: np.ndarray = np.asarray(groups)
        if array.size == 0:
            array = array.astype(np.int64)
        groups = tf.convert_to_tensor(array)
    if not groups.dtype.is_integer:
        raise ValueError(f"groups must be integer sizes, got {groups.dtype.name}")
    return tf.reshape(tf.cast(groups, tf.int64), [-1])
