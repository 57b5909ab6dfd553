"""Embedding lookups from parameter servers that cross the wire compressed.

A tf_keras `Embedding` on a parameter server gathers one row per looked-up id, repeated
ids included, and sends the rows to the worker in float32: 1,280 rows of 64 floats
(327 KB) for a batch of 64 x 20 ids, of which about 330 are distinct. `packed_gather`
reads each distinct row once: the ids cross to the server sorted and packed by
FastSGD's key encoder (`tfgc_ops.pack_keys`), and the rows come back in bfloat16 (2
bytes a value) or as int8 with one float32 scale per row (1 byte a value), decoded on
the worker. The gradient is a `tf.IndexedSlices` over those distinct rows, whose ids
the server already holds: a push whose codec can (FastSGD) then sends the rows' values
without their ids (`tfgc.ps.copies`).

`CompressedEmbedding` is tf_keras's `Embedding` with its lookups made so; off
parameter servers (one process, mirrored strategies, a worker's cached copy under
`tfgc.compressed_pulls()`) it looks rows up as `Embedding` does.

NaN and Inf: bfloat16 rows carry them as they are; an int8 row with a non-finite value
decodes to NaN throughout, so a diverged row stays visible.
"""
from typing import Any

import tensorflow as tf
import tf_keras

import tfgc_ops
from tfgc.ps import copies

ROW_ENCODINGS = ("float32", "bfloat16", "int8")


def on_parameter_server(variable: tf.Variable) -> bool:
    """Whether `variable` is one tf.Variable held by a parameter-server task."""
    return isinstance(variable, tf.Variable) and "/job:ps" in (variable.device or "")


def packed_gather(variable: tf.Variable, ids: tf.Tensor, rows: str = "bfloat16") -> tf.Tensor:
    """`tf.gather(variable, ids)` for distinct `ids`, read from `variable`'s server with
    the ids packed and the rows encoded as `rows` says.

    Args:
      variable: a tf.Variable on a parameter server, of rank 1 or more.
      ids: 1-D int32 or int64, distinct.
      rows: how the rows travel: "float32" (as they are), "bfloat16" or "int8" (a
        float32 scale per row).

    Returns:
      The rows, in `variable`'s dtype. Their gradient reaches `variable` as
      `tf.IndexedSlices` over the ascending `ids`, which the server holds a copy of.

    Raises:
      ValueError: `rows` is not one of ROW_ENCODINGS.
    """
    if rows not in ROW_ENCODINGS:
        raise ValueError(f"rows must be one of {ROW_ENCODINGS}, got {rows!r}")
    order = tf.argsort(ids)
    ascending = tf.gather(ids, order)  # pack_keys takes strictly increasing keys
    packed = tfgc_ops.pack_keys(ascending)
    dtype = variable.dtype

    @tf.custom_gradient
    def read_packed(packed):
        with tf.device(variable.device):
            unpacked = tf.cast(tfgc_ops.unpack_keys(packed), ids.dtype)
            encoded = _encode_rows(tf.gather(variable, unpacked), rows)
        # The push's rows may then travel without their ids.
        copies.note_copy(ascending, unpacked)
        decoded = _decode_rows(encoded, rows, dtype)

        def gradient(upstream, variables):
            # The ids the worker holds, not the server's copy: the push would otherwise
            # fetch those back from the server.
            del variables  # [variable]
            upstream = tf.convert_to_tensor(upstream)  # the distinct rows' sums
            dense_shape = tf.constant(variable.shape.as_list(), ids.dtype)  # not read remotely
            return None, [tf.IndexedSlices(upstream, ascending, dense_shape)]

        return decoded, gradient

    return tf.gather(read_packed(packed), tf.math.invert_permutation(order))


def _encode_rows(values, rows):
    if rows == "float32":
        return {"values": values}
    if rows == "bfloat16":
        return {"values": tf.cast(values, tf.bfloat16)}
    flat = tf.reshape(tf.cast(values, tf.float32), [tf.shape(values)[0], -1])
    largest = tf.reduce_max(tf.abs(flat), axis=1)
    finite = tf.reduce_all(tf.math.is_finite(flat), axis=1)
    scale = tf.where(largest > 0, largest / 127.0, 1.0)
    codes = tf.where(finite[:, None], tf.round(flat / scale[:, None]), 0.0)
    return {"codes": tf.cast(codes, tf.int8), "scale": tf.where(finite, scale, float("nan")),
            "shape": tf.shape(values)}


def _decode_rows(encoded, rows, dtype):
    if rows != "int8":
        return tf.cast(encoded["values"], dtype)
    values = tf.cast(encoded["codes"], tf.float32) * encoded["scale"][:, None]
    return tf.cast(tf.reshape(values, encoded["shape"]), dtype)


def lookup(variable: tf.Variable, ids: tf.Tensor, rows: str = "bfloat16") -> tf.Tensor:
    """`tf.nn.embedding_lookup(variable, ids)`, each distinct id's row read once, through
    `packed_gather` where `variable` is on a parameter server."""
    if not on_parameter_server(variable):
        return tf.nn.embedding_lookup(variable, ids)
    id_dtype = ids.dtype if ids.dtype in (tf.int32, tf.int64) else tf.int32
    flat = tf.reshape(tf.cast(ids, id_dtype), [-1])
    distinct, position = tf.unique(flat, out_idx=id_dtype)
    found = tf.gather(packed_gather(variable, distinct, rows), position)
    return tf.reshape(found, tf.concat([tf.shape(ids), tf.shape(found)[1:]], 0))


@tf_keras.saving.register_keras_serializable(package="tfgc")
class CompressedEmbedding(tf_keras.layers.Embedding):
    """tf_keras's `Embedding`, whose lookups from a parameter server send each distinct
    row once, compressed (see the module doc).

    Args:
      input_dim: as `tf_keras.layers.Embedding`'s.
      output_dim: as `tf_keras.layers.Embedding`'s.
      rows: how looked-up rows travel from the server: "bfloat16" (the default),
        "int8" (a float32 scale per row) or "float32".
      **kwargs: as `tf_keras.layers.Embedding`'s.
    """

    def __init__(self, input_dim: int, output_dim: int, rows: str = "bfloat16",
                 **kwargs: Any) -> None:
        if rows not in ROW_ENCODINGS:
            raise ValueError(f"rows must be one of {ROW_ENCODINGS}, got {rows!r}")
        super().__init__(input_dim, output_dim, **kwargs)
        self.rows = rows

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        if not (tf.is_tensor(inputs) and on_parameter_server(self.embeddings)
                and not isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor))):
            return super().call(inputs)
        out = lookup(self.embeddings, inputs, self.rows)
        if self._dtype_policy.compute_dtype != self._dtype_policy.variable_dtype:
            out = tf.cast(out, self._dtype_policy.compute_dtype)
        return out

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rows": self.rows}
