"""Quartic encoding (3LC section 3.2): five 3-values {-1, 0, 1} folded into one byte.

The folding itself runs in C++ (`tfgc_ops.quartic_fold`, `quartic_unfold`); this is the
size arithmetic the codecs share.
"""
from typing import TypeVar

import tensorflow as tf

# A count: a Python int, or an integer tensor (groups_for returns the same kind).
_Count = TypeVar("_Count", int, tf.Tensor)


def groups_for(n: _Count) -> _Count:
    """Bytes that n 3-values fold into (an int, or an integer tensor for a tensor n)."""
    return (n + 4) // 5
