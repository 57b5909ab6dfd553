"""Sparse gradients (`tf.IndexedSlices`) on the wire: their distinct rows, each once.

An embedding's gradient holds one row per looked-up id, repeated ids included (a
batch of 1,280 Zipf-distributed ids touches about 330 rows). Plain TensorFlow sums the
repeated rows before it sends them to a parameter server (tf_keras's
`_deduplicate_sparse_grad`); `distinct_rows` does the same, in ascending id order, so
that every codec sends no more rows than TensorFlow would.

`SparseRows` sends the distinct rows with a codec that compresses dense tensors: the
rows' ids packed by FastSGD's key encoder (`tfgc_ops.pack_keys`: delta + adaptive
bit-level binary), the rows' values as one vector encoded by the codec, and the dense
shape. The receiver gets `tf.IndexedSlices` of those rows again, so a sparse gradient
stays sparse whatever the codec.
"""
import collections.abc
from typing import Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base

_INNER = "row_values."  # the prefix of the inner codec's payload keys


def distinct_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """`slices` with each repeated index's rows summed, indices ascending and of the
    input's dtype (the same gradient: `tf.convert_to_tensor` of both is equal).

    Raises:
      ValueError: `slices` has no dense shape.
      tf.errors.InvalidArgumentError: an index lies outside the dense shape's rows.
    """
    if slices.dense_shape is None:
        raise ValueError("tf.IndexedSlices without a dense_shape cannot be sent")
    values = slices.values
    dense_shape = tf.cast(slices.dense_shape, tf.int64)
    count = tf.size(slices.indices, out_type=tf.int64)
    row_shape = values.shape[1:]
    wide = values if values.dtype in (tf.float32, tf.float64) else tf.cast(values, tf.float32)
    # One C++ pass: no hashing of rows, no pass over the dense tensor.
    ids, sums = tfgc_ops.row_sums(tf.reshape(wide, tf.stack([count, -1])), slices.indices,
                                  dense_shape[0])
    sums = tf.reshape(tf.cast(sums, values.dtype), tf.concat([[-1], tf.shape(values)[1:]], 0))
    sums.set_shape(tf.TensorShape([None]).concatenate(row_shape))
    return tf.IndexedSlices(sums, tf.cast(ids, slices.indices.dtype), slices.dense_shape)


def plain_nbytes(slices: tf.IndexedSlices) -> tf.Tensor:
    """What TensorFlow sends of `slices` (their values and indices), an int64 scalar."""
    values = tf.size(slices.values, out_type=tf.int64) * slices.values.dtype.size
    return values + tf.size(slices.indices, out_type=tf.int64) * slices.indices.dtype.size


def is_rows_payload(payload: base.Payload) -> bool:
    """Whether `payload` is a `SparseRows` payload."""
    return isinstance(payload, collections.abc.Mapping) and "rows" in payload


class SparseRows(base.Codec):
    """Sends `tf.IndexedSlices` as their distinct rows, the values encoded by `codec`.

    Args:
      codec: a codec of dense tensors (it encodes the rows' values as one vector), or one
        that sends the rows of slices alone (`tfgc.codecs.base.SendsValuesAlone`:
        FastSGD), whose `encode_values` is used.

    Not summable (replicas' rows differ: their payloads are all-gathered), and made by
    the encoder per gradient, never saved in a config.

    Payload: {"rows": the distinct row ids ascending, packed (`tfgc_ops.pack_keys`),
    "dense_shape": int64, "index_dtype": an empty tensor of the indices' dtype, and the
    codec's payload of the values under keys prefixed "row_values."}. Decodes to
    `tf.IndexedSlices` of those rows; the gradient sent must have distinct ascending
    indices (`distinct_rows`).
    """

    accepts_indexed_slices = True

    def __init__(self, codec: base.Codec) -> None:
        self.codec = codec

    @property
    def name(self) -> str:
        return f"{self.codec.name} (sparse rows)"

    def _values_alone(self):
        return isinstance(self.codec, base.SendsValuesAlone)

    def encode(self, x: tf.IndexedSlices) -> base.Payload:
        if not isinstance(x, tf.IndexedSlices):
            raise TypeError(f"{self.name} sends tf.IndexedSlices, got {type(x).__name__}")
        ids = tf.cast(x.indices, tf.int64)
        if self._values_alone():
            inner = self.codec.encode_values(x.values)  # type: ignore[attr-defined]
        else:
            inner = self.codec.encode(tf.reshape(x.values, [-1]))
        payload = {_INNER + key: tensor for key, tensor in inner.items()}
        payload.update(rows=tfgc_ops.pack_keys(ids),
                       dense_shape=tf.cast(x.dense_shape, tf.int64),
                       index_dtype=tf.zeros([0], x.indices.dtype))
        return payload

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.IndexedSlices:
        if not isinstance(payload, collections.abc.Mapping):
            raise base.MalformedPayloadError(
                f"{self.name}: a payload is a dict of tensors, got {type(payload).__name__}")
        inner = {key[len(_INNER):]: tensor for key, tensor in payload.items()
                 if key.startswith(_INNER)}
        fields = base.check_payload(
            {key: tensor for key, tensor in payload.items() if not key.startswith(_INNER)},
            self.name, _FIELDS)
        dims, _ = base.checked_shape(self, fields["dense_shape"], expected_shape, dense=False,
                                     key="dense_shape",
                                     bytes_per_element=self._bytes_per_element(inner))
        dense_shape = (tf.constant(dims, tf.int64, shape=[len(dims)]) if isinstance(dims, list)
                       else tf.cast(dims, tf.int64))
        ids = tfgc_ops.unpack_keys(fields["rows"])
        inside = tf.debugging.Assert(
            tf.reduce_all(ids < dense_shape[0]),
            [f"{self.name} payload: a row id lies outside its dense_shape"])
        with tf.control_dependencies([inside]):
            ids = tf.identity(ids)
        row_shape = (None if expected_shape is None
                     else tf.TensorShape(expected_shape)[1:].as_list())
        if self._values_alone():
            slices = self.codec.decode_values(inner, ids, dense_shape)  # type: ignore[attr-defined]
            values = slices.values
        else:
            row_size = tf.reduce_prod(dense_shape[1:])
            count = tf.size(ids, out_type=tf.int64) * row_size
            flat = base.check_size(self.codec.decode(inner), count, self.name,
                                   key=_INNER + "values")
            values = tf.reshape(flat, tf.concat([[-1], dense_shape[1:]], 0))
        if row_shape is not None:
            values = tf.reshape(values, [-1] + row_shape)
        indices = tf.cast(ids, fields["index_dtype"].dtype)
        return tf.IndexedSlices(values, indices, dense_shape)

    def _bytes_per_element(self, inner):
        """What decoding takes per element of the dense shape: a codec that sends the
        rows' values alone decodes them as large as the rows are (at most the dense
        shape), by its own count; another's decoding is bounded by its own shape, and
        the dense shape by one float32 per element, as the dense tensor a receiver may
        make of the slices."""
        if not self._values_alone():
            return 4
        try:
            fields = {key: tf.convert_to_tensor(tensor) for key, tensor in inner.items()}
            return base.bytes_per_element(self.codec, fields)
        except (KeyError, TypeError, ValueError):
            return 4  # a payload the codec refuses before decoding anything


_FIELDS = {
    "rows": base.BYTES,
    "dense_shape": base.SHAPE,
    "index_dtype": base.Field(base.INDEX_DTYPES, rank=1),
}

