"""The uncompressed baseline and the 16-bit casts practitioners compare against first."""
import collections.abc
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from tfgc.codecs import base


class NoCompression(base.Codec):
    """Sends the tensor as it is: the reference every ratio is measured against.

    Sparse gradients (`tf.IndexedSlices`, e.g. of an embedding or a sparse linear
    model) travel as TensorFlow sends them: their values and row indices, plus the dense
    shape, and decode to `tf.IndexedSlices` again.
    """

    compiles_with_xla = True

    summable = True
    accepts_indexed_slices = True

    def encode(self, x: Union[tf.Tensor, tf.IndexedSlices]) -> base.Payload:
        if isinstance(x, tf.IndexedSlices):
            return _slices_payload(x, self.name)
        return {"values": base.check_floating(x, self.name)}

    def decode(self, payload: base.Payload, expected_shape: Optional[base.Shape] = None
               ) -> Union[tf.Tensor, tf.IndexedSlices]:
        if isinstance(payload, collections.abc.Mapping) and "indices" in payload:
            return _slices_from_payload(self, payload, expected_shape)
        fields = base.check_payload(payload, self.name, _DENSE_FIELDS)
        return base.check_decoded_field(
            fields["values"], self, expected_shape,
            bytes_per_element=self.decoded_bytes_per_element(fields))

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding is the payload's values: nothing is allocated, and they are
        bounded as the dense tensor they are (for IndexedSlices: a receiver may make)."""
        return fields["values"].dtype.size

    def encode_and_reconstruct(self, x: Union[tf.Tensor, tf.IndexedSlices]
                               ) -> tuple[base.Payload, Union[tf.Tensor, tf.IndexedSlices]]:
        payload = self.encode(x)
        return payload, x if isinstance(x, tf.IndexedSlices) else payload["values"]


class Cast(base.Codec):
    """Sends float16 or bfloat16 and casts back to the input dtype.

    Args:
      dtype: "float16" or "bfloat16".

    Finite values beyond float16's range saturate at +-65504 rather than becoming Inf,
    so only a non-finite input decodes non-finite. Summable: casts commute with sums up
    to rounding.

    Batched (`encode_and_reconstruct_flat` of several tensors): the tensors' values,
    laid end to end, cast in one op; the same bytes as each tensor's payload, one after
    the other. The fused wires send a model's small tensors (biases, batch-norm
    parameters) this way.
    """

    compiles_with_xla = True

    summable = True
    batched = True

    def __init__(self, dtype: Union[str, tf.DType] = "float16") -> None:
        self.dtype = tf.as_dtype(dtype)
        if self.dtype not in (tf.float16, tf.bfloat16):
            raise ValueError(f"Cast sends float16 or bfloat16, got {self.dtype.name}")
        self._cast = base.CompiledForLarge(self._saturating_cast)

    def get_config(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name}

    def encode(self, x: tf.Tensor) -> base.Payload:
        x = base.check_floating(x, self.name)
        # The receiver needs the input dtype: a zero-size tensor carries it for free.
        return {"values": self._cast(x), "dtype": tf.zeros([0], x.dtype)}

    def _saturating_cast(self, x):
        if self.dtype == tf.float16 and x.dtype != tf.float16:
            largest = tf.constant(tf.float16.max, x.dtype)
            x = tf.where(tf.math.is_finite(x), tf.clip_by_value(x, -largest, largest), x)
        return tf.cast(x, self.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields = base.check_payload(payload, self.name, self._fields())
        values = base.check_decoded_field(
            fields["values"], self, expected_shape,
            bytes_per_element=self.decoded_bytes_per_element(fields))
        return tf.cast(values, fields["dtype"].dtype)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding, in the marker's dtype."""
        return fields["dtype"].dtype.size

    def _fields(self):
        return {"values": base.Field((self.dtype,)), "dtype": base.DTYPE_MARKER}

    # The batch is already one vector: its payload is that vector's.

    def encode_and_reconstruct_flat(self, flat: tf.Tensor, shapes: Sequence[base.Shape]
                                    ) -> tuple[base.Payload, tf.Tensor]:
        if len(shapes) == 1:
            return super().encode_and_reconstruct_flat(flat, shapes)
        base.group_sizes(flat, shapes, self.name)
        payload = self.encode(flat)
        return payload, self.decode(payload)

    def decode_flat(self, payload: base.Payload, shapes: Sequence[base.Shape]) -> tf.Tensor:
        if len(shapes) == 1:
            return super().decode_flat(payload, shapes)
        total = sum(tf.TensorShape(shape).num_elements() for shape in shapes)
        return self.decode(payload, expected_shape=[total])


def _slices_payload(slices, codec_name):
    """The payload of `tf.IndexedSlices`: values flattened (a fused message carries
    vectors), row indices and the dense shape."""
    if slices.dense_shape is None:
        raise ValueError(f"{codec_name}: IndexedSlices without a dense_shape cannot be sent")
    values = base.check_floating(slices.values, codec_name)
    return {
        "values": tf.reshape(values, [-1]),
        "indices": slices.indices,
        "dense_shape": tf.cast(slices.dense_shape, tf.int64),
    }


_DENSE_FIELDS = {"values": base.Field(base.FLOATING)}
_SLICES_FIELDS = {
    "values": base.FLOAT_VECTOR,
    "indices": base.Field(base.INDEX_DTYPES, rank=1),
    "dense_shape": base.SHAPE,
}


def _slices_from_payload(codec, payload, expected_shape):
    """Inverse of `_slices_payload`; a payload whose values do not fill its rows, or
    whose indices lie outside [0, dense_shape[0]), fails."""
    fields, dims, n = base.checked_payload(codec, payload, _SLICES_FIELDS, expected_shape,
                                           key="dense_shape", dense=False)
    indices = _indices_within(codec, fields["indices"], dims)
    count = tf.size(indices, out_type=tf.int64)
    if isinstance(dims, list):  # known while the decode is built: no ops for the shapes
        row_size = int(np.prod(dims[1:], dtype=np.int64))
        values = base.check_size(fields["values"], count * row_size, codec.name, key="values")
        values = tf.reshape(values, [-1] + dims[1:])
        dense_shape = tf.constant(dims, tf.int64, shape=[len(dims)])
        if tf.is_tensor(n):  # the declared shape is checked when the decode runs
            with tf.control_dependencies([n]):
                dense_shape = tf.identity(dense_shape)
    else:
        dense_shape = dims
        expected = count * tf.reduce_prod(dense_shape[1:])
        values = base.check_size(fields["values"], expected, codec.name, key="values")
        values = tf.reshape(values, tf.concat([[-1], dense_shape[1:]], 0))
    return tf.IndexedSlices(values, indices, dense_shape)


def _indices_within(codec, indices, dims):
    """`indices` once checked to lie in [0, dims[0]): at once where both are known while
    the decode is built, else when it runs."""
    name = codec.name
    if isinstance(dims, list) and not dims:
        raise base.MalformedPayloadError(
            f"{name} payload: dense_shape [] has no rows for the slices' indices")
    rows = dims[0] if isinstance(dims, list) else tf.get_static_value(dims[0])
    value = tf.get_static_value(indices)
    if value is not None and rows is not None:
        outside = (value < 0) | (value >= int(rows))
        if np.any(outside):
            raise base.MalformedPayloadError(
                f"{name} payload: indices {value[outside][:5].tolist()} lie outside "
                f"[0, {int(rows)}), the rows of its dense_shape")
        return indices
    rows = tf.cast(dims[0], tf.int64) if isinstance(dims, list) else tf.concat(
        [tf.cast(dims, tf.int64), tf.zeros([1], tf.int64)], 0)[0]
    wide = tf.cast(indices, tf.int64)
    check = tf.debugging.Assert(
        tf.reduce_all((wide >= 0) & (wide < rows)),
        [f"{name} payload: indices lie outside [0, dense_shape[0]); dense_shape[0] is", rows])
    with tf.control_dependencies([check]):
        return tf.identity(indices)
