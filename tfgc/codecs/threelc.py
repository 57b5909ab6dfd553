"""3LC (Lim, Andersen, Kaminsky 2018): 3-value quantization with a sparsity multiplier,
quartic encoding and zero-run encoding.

    M = max|x| * s,  q = round(x / M) in {-1, 0, 1}      (section 3.1)
    five 3-values per byte: a = 81 p0 + 27 p1 + 9 p2 + 3 p3 + p4   (section 3.2)
    runs of byte 121 (five zeros) -> one byte 243..255   (section 3.3, C++ op)

Quantization and quartic folding run in one pass of a C++ op (`tfgc_ops.quartic_fold`,
after `largest_magnitude`), and so do unfolding and scaling (`quartic_unfold`); the
zero-run coder is a third. `coder="entropy"` replaces zero-run encoding by rANS coding
of the same quartic bytes (another C++ op): the decoded values are the same, the total
bytes 1.86-1.91x (s = 1) and 2.18-2.44x (s = 1.75) fewer than zero-run encoding's on
ResNet-20's gradients under error feedback, in two runs (docs/results/codecs.md).
"""
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, quartic


def _quantize_and_fold(x, sparsity):
    """Returns (quartic bytes, scale M in x's dtype).

    M = max|x| * s, NaN when x holds a non-finite value (every 3-value is then 0 and the
    decoding NaN), 0 for an empty tensor.
    """
    flat = tf.reshape(tf.cast(x, tf.float32), [-1])
    # Quantize with M as the receiver will read it (x's dtype), so that the sender's
    # reconstruction equals the decoding exactly.
    scale = base.round_to(tfgc_ops.largest_magnitude(flat) * sparsity, x.dtype)
    return tfgc_ops.quartic_fold(flat, scale), tf.cast(scale, x.dtype)


def _unfold_and_scale(data, scale, shape):
    """Inverse of the folding: the prod(shape) 3-values times the scale, in its dtype.

    `shape` is a tensor, or a fully defined `tf.TensorShape` (fewer ops in a traced
    step, which unfolds many tensors).
    """
    if isinstance(shape, tf.TensorShape):
        n = tf.constant(shape.num_elements(), tf.int64)
        shape = tf.constant(shape.as_list(), tf.int32, shape=[shape.rank])
    else:
        n = tf.reduce_prod(tf.cast(shape, tf.int64))
    values = tfgc_ops.quartic_unfold(data, n, tf.cast(scale, tf.float32))
    return tf.cast(tf.reshape(values, shape), scale.dtype)


def _sizes(shapes):
    """The element counts of static `shapes` (TensorShapes or tuples of ints)."""
    return [tf.TensorShape([int(d) for d in shape]).num_elements() for shape in shapes]


def _shape_for_unfold(x):
    """`x`'s static shape where fully defined, else its dynamic one."""
    static = tf.TensorShape(x.shape)
    return static if static.is_fully_defined() else tf.shape(x)


_FIELDS = {"data": base.BYTES, "scale": base.FLOAT_SCALAR, "shape": base.SHAPE}
_BATCH_FIELDS = {"data": base.BYTES, "scales": base.FLOAT_VECTOR}


class ThreeLC(base.Codec):
    """3-value quantization + quartic encoding + zero-run encoding.

    Args:
      sparsity: the sparsity multiplier s, 1 <= s < 2. Larger s zeroes more values
        (|x| < M/2 quantizes to 0) and lets zero-run encoding compress further; s = 1
        keeps the largest magnitude exact. Use with `tfgc.ErrorFeedback`, as 3LC does.
      coder: how the quartic bytes are compressed. "zre" (default), the paper's zero-run
        encoding; "entropy", rANS under a per-tensor model of independent 3-values
        (`tfgc_ops.quartic_entropy_encode`), fewer bytes for the same decoded values;
        the coder runs at 3-7 GB/s of float32 per thread against zero-run's 5-50.

    Payload: {"data": uint8 coded bytes, "scale": M in x's dtype, "shape": int32}.
    Quartic encoding alone costs 1.6 bits per value; an all-zero float32 tensor costs
    1/70 byte per value (280x).

    Batched (`encode_and_reconstruct_flat` of several tensors): every tensor keeps its own
    M; one C++ call each quantizes and folds all of them and unfolds them, and their
    quartic bytes, laid end to end, are zero-run (or entropy) coded once:
    {"data": uint8, "scales": one M per tensor}.
    """

    CODERS = ("zre", "entropy")
    batched = True

    def __init__(self, sparsity: float = 1.0, coder: str = "zre") -> None:
        sparsity = base.check_real(sparsity, "ThreeLC sparsity")
        if not 1.0 <= sparsity < 2.0:
            raise ValueError(f"ThreeLC sparsity must be in [1, 2), got {sparsity}")
        if coder not in self.CODERS:
            raise ValueError(f"ThreeLC coder must be one of {self.CODERS}, got {coder!r}")
        self.sparsity = sparsity
        self.coder = coder

    def get_config(self) -> dict[str, Any]:
        # The default coder is left out: the default codec reads `ThreeLC(sparsity=...)`.
        config: dict[str, Any] = {"sparsity": self.sparsity}
        if self.coder != "zre":
            config["coder"] = self.coder
        return config

    def _compress(self, folded, groups):
        """Quartic bytes -> the payload's bytes; `groups` are the tensors' byte counts."""
        if self.coder == "entropy":
            return tfgc_ops.quartic_entropy_encode(folded, groups)
        return tfgc_ops.zero_run_encode(folded)

    def _expand(self, data, groups):
        """Inverse of `_compress`: exactly sum(groups) quartic bytes, or an error."""
        if self.coder == "entropy":
            return tfgc_ops.quartic_entropy_decode(data, groups)
        return base.check_size(tfgc_ops.zero_run_decode(data), tf.reduce_sum(groups), self.name)

    def encode(self, x: tf.Tensor) -> base.Payload:
        return self._encode_folded(x)[0]

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        payload, folded = self._encode_folded(x)
        # The folded bytes unfolded: what the receiver decodes, exactly, by construction.
        return payload, _unfold_and_scale(folded, payload["scale"], _shape_for_unfold(x))

    def _encode_folded(self, x):
        """(payload, the quartic bytes before zero-run or entropy coding)."""
        x = base.check_floating(x, self.name)
        folded, scale = _quantize_and_fold(x, self.sparsity)
        payload = {
            "data": self._compress(folded, tf.size(folded, tf.int64)[None]),
            "scale": scale,
            "shape": base.shape_of(x),
        }
        return payload, folded

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        # What is known while the decode is built takes no ops.
        groups = [quartic.groups_for(n)] if isinstance(n, int) else quartic.groups_for(n)[None]
        folded = self._expand(fields["data"], groups)
        shape = tf.TensorShape(dims) if isinstance(dims, list) else dims
        return _unfold_and_scale(folded, fields["scale"], shape)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The quartic bytes (one per five values), the decoding as float32, and its
        cast to the payload's dtype."""
        return 0.2 + 4 + base.extra_bytes(fields["scale"].dtype)

    def encode_and_reconstruct_flat(self, flat: tf.Tensor, shapes: Sequence[base.Shape]
                                    ) -> tuple[base.Payload, tf.Tensor]:
        if len(shapes) == 1:
            return super().encode_and_reconstruct_flat(flat, shapes)
        flat = base.check_floating(flat, self.name)
        dtype = flat.dtype
        sizes = base.group_sizes(flat, shapes, self.name)
        flat = tf.cast(flat, tf.float32)
        # Every tensor keeps its own M; the batch ops quantize, fold and unfold them all
        # in one call each, and ONE zero-run (or entropy) encode codes their bytes.
        # M as the receiver will read it (x's dtype): see _quantize_and_fold.
        scales = base.round_to(
            tfgc_ops.batch_largest_magnitude(flat, sizes) * self.sparsity, dtype)
        folded = tfgc_ops.batch_quartic_fold(flat, scales, sizes)
        groups = [quartic.groups_for(size) for size in sizes]
        payload = {"data": self._compress(folded, groups), "scales": tf.cast(scales, dtype)}
        # The folded bytes unfolded: what the receiver decodes, exactly, by construction.
        values = tfgc_ops.batch_quartic_unfold(folded, scales, sizes)
        return payload, tf.cast(values, dtype)

    def decode_flat(self, payload: base.Payload, shapes: Sequence[base.Shape]) -> tf.Tensor:
        if len(shapes) == 1:
            return super().decode_flat(payload, shapes)
        sizes = _sizes(shapes)
        fields = base.check_payload(payload, self.name, _BATCH_FIELDS)
        # One scale per tensor, named here before the bytes are expanded.
        scales = base.check_size(fields["scales"], len(sizes), self.name, key="scales")
        folded = self._expand(fields["data"], [quartic.groups_for(size) for size in sizes])
        values = tfgc_ops.batch_quartic_unfold(folded, tf.cast(scales, tf.float32), sizes)
        return tf.cast(values, scales.dtype)
