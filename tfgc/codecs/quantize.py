"""Uniform integer quantization: MQGrad's K-bit quantizer and the 8-bit int baseline."""
from typing import Any, Mapping, Optional, Union

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack

MIN_BITS, MAX_BITS = 2, 8


class Quantize(tf.Module, base.ReconstructingCodec):
    """Uniform K-bit quantization over the tensor's [min, max] range, bit-packed.

    x -> q = round((x - min) / step), step = (max - min) / (2^K - 1); K bits per value on
    the wire (not a byte). The error is at most step / 2 per element.

    Args:
      bits: K in 2..8, or an int32 tf.Variable holding K so that an agent (MQGrad) can
        change it between steps without retracing; the payload size follows it.

    Payload: {"data": packed codes, "min", "max", "bits": uint8, "shape"}.
    """

    def __init__(self, bits: Union[int, tf.Variable] = 8, name: Optional[str] = None) -> None:
        tf.Module.__init__(self, name=name)
        if isinstance(bits, tf.Variable):
            if bits.dtype != tf.int32:
                raise TypeError(f"Quantize bits variable must be int32, got {bits.dtype.name}")
            self.bits = bits
        else:
            self.bits = tf.Variable(check_bits(bits), dtype=tf.int32, trainable=False, name="bits")

    def get_config(self) -> dict[str, Any]:
        return {"bits": int(self.bits.numpy())}

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        return self._quantize(base.check_floating(x, self.name))

    def encode_with_bits(self, x: tf.Tensor, bits: Union[int, tf.Tensor]) -> base.Payload:
        """The payload of `x` quantized with `bits` (2..8, a number or an int32 tensor)
        instead of `self.bits`, e.g. to size what a number of bits would send."""
        x = base.check_floating(x, self.name)
        if not tf.is_tensor(bits):
            check_bits(bits)
        return self._quantize(x, tf.convert_to_tensor(bits, tf.int32))[0]

    def _quantize(self, x, bits=None):
        """(payload, reconstruction) of floating `x` with `bits` (an int32 scalar in range),
        or with `_bits_for` its range when `bits` is None.

        Two passes of C++ (`tfgc_ops.value_range`, `tfgc_ops.uniform_quantize`): the range,
        then the codes, packed, and their reconstruction.
        """
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        value_range = tfgc_ops.value_range(flat)
        if bits is None:
            bits = self._bits_for(value_range, tf.size(flat))
        extremes, finite, _ = value_range
        # min and max as the receiver reads them (rounded to x's dtype); 0 when empty.
        measured = finite & (tf.size(flat) > 0)
        low = base.round_to(tf.where(measured, extremes[0], 0.0), x.dtype)
        high = base.round_to(tf.where(measured, extremes[1], 0.0), x.dtype)
        step = (high - low) / _levels(bits)
        # A NaN low gives every value code 0 and a NaN reconstruction (the non-finite policy).
        low = base.nan_unless(finite, low)
        packed, reconstructed = tfgc_ops.uniform_quantize(flat, low, step, bits)
        payload = {
            "data": packed,
            "min": tf.cast(low, x.dtype),
            "max": tf.cast(high, x.dtype),
            "bits": tf.cast(bits, tf.uint8),
            "shape": base.shape_of(x),
        }
        return payload, tf.cast(tf.reshape(reconstructed, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        base.check_same_dtype(fields, ["min", "max"], self.name)
        bits = _payload_bits(fields["bits"], self.name)
        data = base.check_size(fields["data"], bitpack.packed_size(n, bits), self.name)
        codes = tf.cast(bitpack.unpack_bits(data, bits, n), tf.float32)
        low = tf.cast(fields["min"], tf.float32)
        step = (tf.cast(fields["max"], tf.float32) - low) / _levels(bits)
        values = tf.cast(low + codes * step, fields["min"].dtype)
        return tf.reshape(values, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The unpacked codes (int32, then float32), two float32 steps of the
        dequantization, and its cast to the payload's dtype."""
        return 4 + 4 + 4 + 4 + base.extra_bytes(fields["min"].dtype)

    def _bits_for(self, value_range, size):
        """The bits to quantize a tensor with, given its `tfgc_ops.value_range` and size:
        `self.bits`, checked. Subclasses that choose the bits per tensor (MQGrad's
        "Adaptive" baseline) override this."""
        del value_range, size  # the same bits for every tensor
        return self._checked_bits()

    def _checked_bits(self):
        bits = tf.convert_to_tensor(self.bits)
        check = tf.debugging.assert_equal(
            (bits >= MIN_BITS) & (bits <= MAX_BITS), True,
            message=f"Quantize bits must be in [{MIN_BITS}, {MAX_BITS}]",
        )
        with tf.control_dependencies([check]):
            return tf.identity(bits)


_FIELDS = {
    "data": base.BYTES,
    "min": base.FLOAT_SCALAR,
    "max": base.FLOAT_SCALAR,
    "bits": base.Field((tf.uint8,), rank=0),
    "shape": base.SHAPE,
}


def _payload_bits(bits, codec_name):
    """A payload's uint8 `bits` as int32, once checked to be in [MIN_BITS, MAX_BITS]
    (0 bits would divide by zero levels)."""
    value = tf.get_static_value(bits)
    if value is not None:
        if not MIN_BITS <= int(value) <= MAX_BITS:
            raise base.MalformedPayloadError(
                f"{codec_name} payload: bits must be in [{MIN_BITS}, {MAX_BITS}], got {int(value)}")
        return tf.constant(int(value), tf.int32)
    bits = tf.cast(bits, tf.int32)
    check = tf.debugging.Assert(
        (bits >= MIN_BITS) & (bits <= MAX_BITS),
        [f"{codec_name} payload: bits must be in [{MIN_BITS}, {MAX_BITS}], got", bits])
    with tf.control_dependencies([check]):
        return tf.identity(bits)


def _levels(bits):
    """The largest K-bit code, 2^K - 1, as float32."""
    return tf.cast(tf.bitwise.left_shift(1, bits) - 1, tf.float32)


def check_bits(bits: Union[int, float], what: str = "bits") -> int:
    """`bits` as an int once checked to be an integer in [MIN_BITS, MAX_BITS]."""
    return base.check_integer(bits, what, MIN_BITS, MAX_BITS)


class Int8(base.ReconstructingCodec):
    """8-bit integers in [-127, 127] scaled by max|x| / 127 (3LC's "8-bit int").

    Payload: {"data": int8, "scale", "shape"}.
    """

    compiles_with_xla = True

    def __init__(self) -> None:
        self._codes = base.CompiledForLarge(_int8_codes)

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        q, scale, finite = self._codes(x)
        scale = base.round_to(base.nan_unless(finite, scale), x.dtype)
        payload = {
            "data": q,
            "scale": tf.cast(scale, x.dtype),
            "shape": base.shape_of(x),
        }
        reconstructed = tf.cast(q, tf.float32) * scale
        return payload, tf.cast(tf.reshape(reconstructed, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _INT8_FIELDS, expected_shape)
        data = base.check_size(fields["data"], n, self.name)
        scale = fields["scale"]
        values = tf.cast(tf.cast(data, tf.float32) * tf.cast(scale, tf.float32), scale.dtype)
        return base.with_static_shape(values, dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The codes as float32, scaled, and cast to the payload's dtype."""
        return 4 + 4 + base.extra_bytes(fields["scale"].dtype)


_INT8_FIELDS = {
    "data": base.Field((tf.int8,), rank=1),
    "scale": base.FLOAT_SCALAR,
    "shape": base.SHAPE,
}


def _int8_codes(x):
    """(int8 codes, max|x| / 127, all finite) of `x`."""
    flat = tf.reshape(tf.cast(x, tf.float32), [-1])
    finite = base.all_finite(flat)
    scale = base.largest_magnitude(flat) / 127.0
    q = tf.round(flat / tf.where(scale > 0, scale, 1.0))
    q = tf.where(finite, tf.clip_by_value(q, -127.0, 127.0), 0.0)
    return tf.cast(q, tf.int8), scale, finite
