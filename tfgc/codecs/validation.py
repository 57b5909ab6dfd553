"""Payload validation: what every decoder checks before it decodes.

A payload is data from elsewhere, so nothing it declares is trusted. `decode(payload, expected_shape=None)` checks the payload's keys (none
missing, none extra: a payload of another codec is refused), the dtype and rank of each
field, the declared shape against `expected_shape` (the receiver's own knowledge, e.g.
the variable's shape) or, without one, against the codec's byte bound, and every
field's element count against that shape, all before anything is allocated for the
declared shape.

The byte bound: without `expected_shape`, a decoding may allocate at most the codec's
`max_decoded_bytes` (default `MAX_DECODED_BYTES`, 1 GiB), counted as the declared
element count times `codec.decoded_bytes_per_element(fields)`: the bytes per element of
its output and of every intermediate it makes (the dtypes come from the payload's
fields: a float64 decoding counts 8 bytes for its output, int32 codes 4, int64
positions 8). With `expected_shape`, what is allocated for the shape is what the caller
expects anyway. Either way, what a decoder allocates beyond that is at most a small
multiple of the payload's own bytes, and a field whose size the declared shape fixes is
checked before anything is allocated for the shape.

What is known while the decode is built (eagerly: everything) is checked at once and
raises `MalformedPayloadError` (both a `ValueError` and a `tf.errors.InvalidArgumentError`);
the rest is checked by assert ops, which raise `tf.errors.InvalidArgumentError` with
the same words when run, before the ops that allocate for the shape. Either way the
message names the codec and what it found.
"""
import collections.abc
import functools
import inspect
import math
import numbers
from typing import TYPE_CHECKING, Any, Final, Literal, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
    from tfgc.codecs.base import Codec, Payload, Shape

MAX_ELEMENTS = 2**31 - 1  # shapes travel as int32
#: The most bytes a decoding may allocate (its output and its intermediates) when its
#: caller gives no `expected_shape`: a payload declaring a shape whose decoding would
#: take more is refused before anything is allocated for it. Set a codec's
#: `max_decoded_bytes` (or this constant) to decode larger tensors without an expected
#: shape.
MAX_DECODED_BYTES = 2**30
#: Deprecated: the byte bound (`MAX_DECODED_BYTES`) is the limit. A further bound on the
#: elements of a decoding without `expected_shape`, kept for code that sets it (or a
#: codec's `max_decoded_elements`); at its default, MAX_DECODED_BYTES // 4, it binds only
#: for decodings that take fewer than 4 bytes per element.
MAX_DECODED_ELEMENTS = MAX_DECODED_BYTES // 4


class MalformedPayloadError(tf.errors.InvalidArgumentError, ValueError):
    """A payload its codec refuses, found while the decode is built (eagerly: at once).

    Both a `tf.errors.InvalidArgumentError`, as the run-time checks of the same payload
    raise, and a `ValueError`.
    """

    def __init__(self, node_def: Any, op: Optional[tf.Operation] = None,
                 message: Optional[str] = None, *args: Any) -> None:
        # Raised here with the message alone; TensorFlow re-raising one from traced code
        # (autograph) passes node_def, op and message, as to any InvalidArgumentError.
        if op is None and message is None:
            node_def, message = None, node_def
        super().__init__(node_def, op, message, *args)


@functools.lru_cache(maxsize=None)
def _takes_expected_shape(codec_type):
    try:
        return "expected_shape" in inspect.signature(codec_type.decode).parameters
    except (TypeError, ValueError):
        return False


def decode_expecting(codec: "Codec", payload: "Payload",
                     expected_shape: Optional["Shape"]) -> tf.Tensor:
    """`codec.decode(payload, expected_shape=...)` where the shape is fully defined, else
    `codec.decode(payload)`; also for a codec whose `decode` takes no expected shape
    (one defined outside this package, a wrapper)."""
    shape = None if expected_shape is None else tf.TensorShape(expected_shape)
    if shape is not None and shape.is_fully_defined() and _takes_expected_shape(type(codec)):
        return codec.decode(payload, expected_shape=shape)
    return codec.decode(payload)


def decoded_byte_bound(codec: "Codec") -> int:
    """The most bytes `codec`'s decoding may allocate without an expected shape."""
    bound = getattr(codec, "max_decoded_bytes", None)
    return MAX_DECODED_BYTES if bound is None else int(bound)


def decoded_element_bound(codec: "Codec") -> int:
    """The most elements `codec` decodes to without an expected shape (deprecated: see
    `MAX_DECODED_ELEMENTS`)."""
    bound = getattr(codec, "max_decoded_elements", None)
    return MAX_DECODED_ELEMENTS if bound is None else int(bound)


def extra_bytes(dtype: tf.DType, computed: tf.DType = tf.float32) -> int:
    """Bytes per element of a cast from `computed` (what a decoder computes in) to
    `dtype`: none where they are the same dtype (the cast is no op)."""
    dtype = tf.as_dtype(dtype)
    return 0 if dtype == tf.as_dtype(computed) else dtype.size


def bytes_per_element(codec: "Codec", fields: Mapping[str, tf.Tensor]) -> float:
    """`codec.decoded_bytes_per_element(fields)`, or 4 (one float32) for a codec without
    it."""
    per_element = getattr(codec, "decoded_bytes_per_element", None)
    return 4 if per_element is None else float(per_element(fields))


class Field:
    """What a payload field must be: its dtype, and its rank and size where fixed.

    Args:
      dtypes: a tuple of `tf.DType`s, or FLOATING for any floating dtype.
      rank: the field's rank, or None for any.
      size: its number of elements, or None for any (checked where static).
    """

    def __init__(self, dtypes: Union[tuple[tf.DType, ...], Literal["floating"]],
                 rank: Optional[int] = None, size: Optional[int] = None) -> None:
        self.dtypes, self.rank, self.size = dtypes, rank, size

    def describe(self) -> str:
        if self.dtypes == FLOATING:
            return "a floating dtype"
        return " or ".join(dtype.name for dtype in self.dtypes)

    def admits(self, dtype: tf.DType) -> bool:
        return dtype.is_floating if self.dtypes == FLOATING else dtype in self.dtypes


FLOATING: Final = "floating"
INDEX_DTYPES = (tf.int32, tf.int64)
SHAPE = Field(INDEX_DTYPES, rank=1)  # a declared shape
BYTES = Field((tf.uint8,), rank=1)
FLOAT_SCALAR = Field(FLOATING, rank=0)
FLOAT_VECTOR = Field(FLOATING, rank=1)
DTYPE_MARKER = Field(FLOATING, rank=1, size=0)  # an empty tensor of the input's dtype


def check_payload(payload: "Payload", codec_name: str,
                  fields: Mapping[str, Field]) -> dict[str, tf.Tensor]:
    """The fields of `payload` as tensors, once checked against `fields`.

    Static checks only (no op is added): the keys are exactly those of `fields`, and
    each field has its dtype, and its rank and size where `fields` fixes them and the
    field's static shape shows them.

    Args:
      payload: a mapping of keys to tensors (or values convertible to tensors).
      codec_name: the decoding codec's name, for messages.
      fields: {key: `Field`}.

    Raises:
      MalformedPayloadError: naming the codec and the offending key or field.
    """
    if not isinstance(payload, collections.abc.Mapping):
        raise MalformedPayloadError(
            f"{codec_name}: a payload is a dict of tensors, got {type(payload).__name__}")
    if payload.keys() != fields.keys():
        keys, wanted = set(payload), set(fields)
        raise MalformedPayloadError(
            f"{codec_name}: payload keys {sorted(keys, key=str)} are not the expected "
            f"{sorted(wanted)} (missing {sorted(wanted - keys)}, unexpected "
            f"{sorted(keys - wanted, key=str)}): is it another codec's payload?")
    checked = {}
    for key, field in fields.items():
        tensor = tf.convert_to_tensor(payload[key])
        if not field.admits(tensor.dtype):
            raise MalformedPayloadError(
                f"{codec_name}: payload field {key!r} is {tensor.dtype.name}, expected "
                f"{field.describe()}")
        rank = tensor.shape.rank
        if field.rank is not None and rank is not None and rank != field.rank:
            raise MalformedPayloadError(
                f"{codec_name}: payload field {key!r} has shape {tensor.shape}, expected "
                f"rank {field.rank}")
        size = tensor.shape.num_elements()
        if field.size is not None and size is not None and size != field.size:
            raise MalformedPayloadError(
                f"{codec_name}: payload field {key!r} has {size} elements, expected "
                f"{field.size}")
        checked[key] = tensor
    return checked


def check_same_dtype(fields: Mapping[str, tf.Tensor], keys: Sequence[str],
                     codec_name: str) -> None:
    """Raises MalformedPayloadError unless the checked `fields` at `keys` share a dtype."""
    first = fields[keys[0]].dtype
    for key in keys[1:]:
        if fields[key].dtype != first:
            raise MalformedPayloadError(
                f"{codec_name}: payload field {key!r} is {fields[key].dtype.name}, expected "
                f"{first.name} as {keys[0]!r}")


def static_dims(shape: "Shape", codec_name: str, what: str = "expected_shape") -> list[int]:
    """A fully defined shape (list, tuple or `tf.TensorShape`) as a list of ints."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        raise ValueError(f"{codec_name}: {what} must be fully defined, got {shape}")
    return shape.as_list()


def checked_shape(codec: "Codec", shape: tf.Tensor, expected_shape: Optional["Shape"] = None,
                  dense: bool = True, key: str = "shape", bytes_per_element: float = 4
                  ) -> tuple[Union[list[int], tf.Tensor], Union[int, tf.Tensor]]:
    """The shape a payload declares, checked before anything is allocated for it.

    With `expected_shape`, the declared shape must be it; without, its decoding must
    take at most `decoded_byte_bound(codec)` bytes (its element count times
    `bytes_per_element`) and have at most `decoded_element_bound(codec)` elements.
    Dimensions must be non-negative, and a dense decoding has at most MAX_ELEMENTS
    elements (shapes travel as int32).

    Args:
      codec: the decoding codec (its name and bounds).
      shape: the payload's rank-1 integer shape field (checked by `check_payload`).
      expected_shape: None, or the fully defined shape the caller expects.
      dense: whether the decoding is a dense tensor of this shape (False for
        `tf.IndexedSlices`, which hold only some of its rows).
      key: the field's name, for messages.
      bytes_per_element: what the decoding allocates per element of the shape, its
        output and intermediates together (`Codec.decoded_bytes_per_element`).

    Returns:
      (dims, n): dims is the shape as a list of ints where known while the decode is
      built (always with `expected_shape`), else an int64 tensor; n is its number of
      elements, an int or an int64 tensor. Tensors carry the run-time checks, so every
      op built from them runs after them.

    Raises:
      MalformedPayloadError: a check fails on values known while the decode is built.
    """
    name = codec.name
    expected = None if expected_shape is None else static_dims(expected_shape, name)
    if expected is not None and dense and int(np.prod(expected)) > MAX_ELEMENTS:
        raise MalformedPayloadError(
            f"{name}: expected shape {expected} has more than {MAX_ELEMENTS} elements")
    bound = decoded_element_bound(codec)
    if dense:
        bound = min(bound, MAX_ELEMENTS)
    byte_bound = decoded_byte_bound(codec)
    per_element = float(bytes_per_element)
    value = tf.get_static_value(shape)
    if value is not None:
        dims = [int(d) for d in np.reshape(value, [-1])]
        n = int(np.prod(dims, dtype=object))  # exact: Python ints never wrap
        if any(d < 0 for d in dims):
            raise MalformedPayloadError(
                f"{name}: payload declares {key} {dims}, with a negative dimension")
        if expected is not None and dims != expected:
            raise MalformedPayloadError(
                f"{name}: payload declares {key} {dims}, expected {expected}")
        if expected is None and n * per_element > byte_bound:
            raise MalformedPayloadError(
                _above_byte_bound(name, key, dims, n, per_element, byte_bound))
        if expected is None and n > bound:
            raise MalformedPayloadError(_above_bound(name, key, dims, n, bound))
        return dims, n
    shape = tf.convert_to_tensor(shape)
    # Int32 (or string) data keeps an Assert a bare op, not a cond (see tf.debugging.Assert).
    shown = shape if shape.dtype == tf.int32 else tf.strings.as_string(shape)
    wide = tf.cast(shape, tf.int64)
    if expected is not None:
        rank = len(expected)
        if shape.shape.num_elements() not in (None, rank):
            raise MalformedPayloadError(
                f"{name}: payload declares a {key} of rank {shape.shape.num_elements()}, "
                f"expected {expected}")
        # Padded, so that a declared shape of another rank compares unequal, not fails.
        padded = tf.concat([wide, tf.fill([rank], tf.constant(-1, tf.int64))], 0)[:rank]
        matches = tf.logical_and(tf.equal(tf.size(wide), rank),
                                 tf.reduce_all(tf.equal(padded, expected)))
        checks = [tf.debugging.Assert(
            matches, [f"{name}: payload declares {key}", shown, f"expected {expected}"])]
        with tf.control_dependencies(checks):
            return expected, tf.identity(tf.constant(int(np.prod(expected)), tf.int64))
    non_negative = tf.debugging.Assert(
        tf.reduce_all(wide >= 0),
        [f"{name}: payload declares {key}", shown, "with a negative dimension"])
    # The product in float64 never wraps (in int32, [65536, 65536] has 0 elements).
    total = tf.reduce_prod(tf.cast(wide, tf.float64))
    within_bytes = tf.debugging.Assert(
        total * per_element <= byte_bound,
        [f"{name}: payload declares {key}", shown,
         f"whose decoding takes more than max_decoded_bytes={byte_bound} bytes "
         f"({_per_element(per_element)} bytes per element); pass the expected_shape of "
         "the decoding, or raise the codec's max_decoded_bytes"])
    bounded = tf.debugging.Assert(
        total <= bound,
        [f"{name}: payload declares {key}", shown,
         f"with more than max_decoded_elements={bound} elements; pass the expected_shape "
         "of the decoding, or raise the codec's max_decoded_elements"])
    with tf.control_dependencies([non_negative, within_bytes, bounded]):
        return tf.identity(wide), tf.reduce_prod(wide)


def checked_payload(codec: "Codec", payload: "Payload", fields: Mapping[str, Field],
                    expected_shape: Optional["Shape"] = None, key: str = "shape",
                    dense: bool = True
                    ) -> tuple[dict[str, tf.Tensor], Union[list[int], tf.Tensor],
                               Union[int, tf.Tensor]]:
    """`check_payload` and `checked_shape` of its `key` field, whose decoding takes
    `bytes_per_element(codec, fields)` bytes per element: (fields, dims, n)."""
    checked = check_payload(payload, codec.name, fields)
    dims, n = checked_shape(codec, checked[key], expected_shape, dense=dense, key=key,
                            bytes_per_element=bytes_per_element(codec, checked))
    return checked, dims, n


def with_static_shape(tensor: tf.Tensor, dims: Union[list[int], tf.Tensor]) -> tf.Tensor:
    """`tensor`, whose checks have established it holds prod(dims) values, in the shape
    `dims` (a list of ints, or a tensor).

    Grappler removes a Reshape to a static shape that the input's static shape is merely
    compatible with ([None] -> [3000]), and with it the size checks before it, so a
    vector of the wrong length would pass as one of `dims`; a vector bound for a vector
    shape is given its static shape instead, which leaves the checks in place.
    """
    if not isinstance(dims, list):
        return tf.reshape(tensor, dims)
    if tensor.shape.rank == 1 and len(dims) == 1:
        if tf.executing_eagerly() or tensor.shape.is_fully_defined():
            return tf.reshape(tensor, dims)  # known sizes: nothing for Grappler to assume
        tensor = tf.identity(tensor)
        tensor.set_shape(dims)
        return tensor
    return tf.reshape(tensor, dims)


def _per_element(per_element):
    return int(per_element) if per_element == int(per_element) else round(per_element, 2)


def _above_byte_bound(name, key, dims, n, per_element, bound):
    return (f"{name}: payload declares {key} {dims} ({n} elements), whose decoding takes "
            f"{math.ceil(n * per_element)} bytes ({_per_element(per_element)} per element), "
            f"more than max_decoded_bytes={bound}; pass the expected_shape of the "
            "decoding, or raise the codec's max_decoded_bytes")


def _above_bound(name, key, dims, n, bound):
    return (f"{name}: payload declares {key} {dims} ({n} elements), more than "
            f"max_decoded_elements={bound}; pass the expected_shape of the decoding, or "
            "raise the codec's max_decoded_elements")


def check_decoded_field(tensor: tf.Tensor, codec: "Codec",
                        expected_shape: Optional["Shape"] = None, key: str = "values",
                        bytes_per_element: Optional[float] = None) -> tf.Tensor:
    """`tensor`, a payload field of the decoding's own shape (NoCompression, Cast), once
    its shape is checked to be `expected_shape`, or else its decoding to be within the
    codec's bounds (`bytes_per_element`: what the decoding takes per element, None: the
    field's own dtype size); reshaped to `expected_shape` where that adds static shape."""
    name = codec.name
    if expected_shape is not None:
        expected = static_dims(expected_shape, name)
        if tensor.shape.rank is not None and tensor.shape.rank != len(expected) \
                or not tensor.shape.is_compatible_with(expected):
            raise MalformedPayloadError(
                f"{name}: payload field {key!r} has shape {tensor.shape.as_list()}, "
                f"expected {expected}")
        if tensor.shape.is_fully_defined():
            return tensor
        matches = tf.reduce_all(tf.equal(tf.shape(tensor), expected))
        check = tf.debugging.Assert(
            matches, [f"{name}: payload field {key!r} has shape", tf.shape(tensor),
                      f"expected {expected}"])
        with tf.control_dependencies([check]):
            return with_static_shape(tf.identity(tensor), expected)
    bound = decoded_element_bound(codec)
    byte_bound = decoded_byte_bound(codec)
    per_element = float(tensor.dtype.size if bytes_per_element is None else bytes_per_element)
    size = tensor.shape.num_elements()
    if size is not None:
        shape = tensor.shape.as_list()
        if size * per_element > byte_bound:
            raise MalformedPayloadError(_above_byte_bound(
                name, f"field {key!r} of shape", shape, size, per_element, byte_bound))
        if size > bound:
            raise MalformedPayloadError(
                _above_bound(name, f"field {key!r} of shape", shape, size, bound))
        return tensor
    size = tf.size(tensor, out_type=tf.int64)
    within_bytes = tf.debugging.Assert(
        tf.cast(size, tf.float64) * per_element <= byte_bound,
        [f"{name}: payload field {key!r} has shape", tf.shape(tensor),
         f"whose decoding takes more than max_decoded_bytes={byte_bound} bytes"])
    bounded = tf.debugging.Assert(
        size <= bound,
        [f"{name}: payload field {key!r} has shape", tf.shape(tensor),
         f"with more than max_decoded_elements={bound} elements"])
    with tf.control_dependencies([within_bytes, bounded]):
        return tf.identity(tensor)


def check_integer(value: Union[int, float], what: str, low: Optional[int] = None,
                  high: Optional[int] = None) -> int:
    """`value` as an int once checked to be an integer in [low, high] (None: unbounded).

    An integral float (4.0, as a config may hold) is accepted; a fraction is refused,
    not truncated.

    Raises:
      TypeError: `value` is not a real number (a string, None, a bool).
      ValueError: `value` is a fraction or out of range; the message names `what`.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if not (math.isfinite(value) and value == int(value)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(f"{what} must be in {span}, got {value}")
    return value


def check_real(value: float, what: str) -> float:
    """`value` as a float once checked to be a finite real number.

    Raises:
      TypeError: `value` is not a real number (a string, None, a bool).
      ValueError: `value` is NaN or infinite; the message names `what`.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return value


def check_floating(x: Any, codec_name: str) -> tf.Tensor:
    """Converts `x` to a tensor and checks it is a floating tensor of a supported size."""
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"{codec_name} compresses floating tensors, got {x.dtype.name}")
    if x.shape.num_elements() is not None and x.shape.num_elements() > MAX_ELEMENTS:
        raise ValueError(
            f"{codec_name}: tensors above {MAX_ELEMENTS} elements are not supported "
            f"(got shape {x.shape}); split the variable"
        )
    return x


def check_one_dtype(tensors: Sequence[tf.Tensor], codec_name: str) -> None:
    """Raises ValueError unless `tensors` (a non-empty list) share one dtype."""
    dtypes = {x.dtype for x in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"{codec_name} batches tensors of one dtype, got "
                         f"{sorted(d.name for d in dtypes) or 'no tensor'}")


def check_size(tensor: tf.Tensor, expected: Union[int, tf.Tensor], codec_name: str,
               key: str = "data") -> tf.Tensor:
    """`tensor` once its size is checked to be `expected` (a malformed payload fails):
    at once where both are known while the decode is built, else when it runs."""
    size = tensor.shape.num_elements()
    wanted = tf.get_static_value(expected)
    if size is not None and wanted is not None:
        if size != int(wanted):
            raise MalformedPayloadError(
                f"{codec_name} payload: {key} does not match its shape ({size} elements, "
                f"expected {int(wanted)})")
        return tensor
    check = tf.debugging.assert_equal(
        tf.cast(tf.size(tensor), tf.int64),
        tf.cast(expected, tf.int64),
        message=f"{codec_name} payload: {key} does not match its shape",
    )
    with tf.control_dependencies([check]):
        return tf.identity(tensor)
