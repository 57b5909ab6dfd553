"""Chunked top-k with 2-bit values: SparseLoCo's compressor of pseudo-gradients.

SparseLoCo (Sarfi et al., 2025, arXiv 2508.15706) sends each replica's pseudo-gradient
(what its local steps moved the weights between two meetings) as top-k within chunks of
4096 values at 1-3% density, the kept values quantized to 2 bits, with error feedback on
each replica. `ChunkedTopK` sends the same: per chunk, the positions of its largest
magnitudes in ceil(log2(chunk)) bits each, and a 2-bit code per kept value.
"""
import math
from typing import Any, Mapping, Optional

import tensorflow as tf

from tfgc.codecs import base
from tfgc_ops import chunked

_FIELDS = {
    "positions": base.BYTES,
    "codes": base.BYTES,
    "levels": base.FLOAT_VECTOR,
    "shape": base.SHAPE,
}
_CODE_BITS = 2
MIN_CHUNK, MAX_CHUNK = 2, 1 << 16


class ChunkedTopK(base.ReconstructingCodec):
    """Keeps the largest magnitudes of each chunk of values, 2 bits per kept value.

    The tensor, flattened, is cut into chunks of `chunk` values (the last one shorter
    when `chunk` does not divide its size). A whole chunk keeps its
    k = ceil(density * chunk) largest magnitudes, exactly (ties in position order); a
    last chunk of `length` values keeps ceil(length * k / chunk). Each kept value is sent
    as its position within the chunk, in ceil(log2(chunk)) bits, and a 2-bit code: its
    sign and which of its chunk's two magnitude levels it takes. The two levels are a
    two-level Lloyd-Max quantizer of the chunk's kept magnitudes (each level the mean of
    the magnitudes it stands for, split at their midpoint), sent in the tensor's dtype.
    Two levels rather than one scale because the kept values are the tail of the
    distribution, whose magnitudes spread over several times the smallest one kept.

    Every chunk sends exactly its k entries, so the payload's size depends on the shape
    alone: a whole chunk takes k * (ceil(log2(chunk)) + 2) bits and two levels. A chunk
    with fewer nonzero values than k sends them all at the high level and fills its
    entries with zeros' positions at a low level of 0. A chunk holding a value that is not
    finite sends NaN levels (its decoding is NaN: a failed step stays visible).

    Biased (most values are not sent): run it with error feedback, which
    `tfgc.DistributedOptimizer` keeps on each replica by default. Not summable: under
    all-reduce strategies each replica's payload is all-gathered, decoded and summed.

    Payload: {"positions": uint8, every chunk's positions (ascending within it) packed
    most significant bit first; "codes": uint8, their 2-bit codes (bit 1: negative, bit
    0: the high level) packed likewise; "levels": (low, high) per chunk in x's dtype;
    "shape": int32}. float64 values are selected and quantized as float32.

    Args:
      density: the share of each chunk kept, in (0, 1]; SparseLoCo uses 0.01-0.03.
      chunk: values per chunk, 2..65536 (positions of at most 16 bits).
    """

    def __init__(self, density: float = 0.02, chunk: int = 4096) -> None:
        density = base.check_real(density, "ChunkedTopK density")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"ChunkedTopK density must be in (0, 1], got {density}")
        self.density = density
        self.chunk = base.check_integer(chunk, "ChunkedTopK chunk", MIN_CHUNK, MAX_CHUNK)

    def get_config(self) -> dict[str, Any]:
        return {"density": self.density, "chunk": self.chunk}

    @property
    def kept(self) -> int:
        """Values a whole chunk keeps: ceil(density * chunk), at least 1."""
        return min(self.chunk, max(1, math.ceil(self.density * self.chunk)))

    @property
    def index_bits(self) -> int:
        """Bits of one position within a chunk: ceil(log2(chunk))."""
        return max(1, (self.chunk - 1).bit_length())

    def payload_nbytes(self, shape: base.Shape, dtype: tf.DType = tf.float32) -> int:
        """The exact bytes of the payload of a tensor of `shape` and `dtype`:
        ceil(K * ceil(log2(chunk)) / 8) + ceil(K * 2 / 8) + 2 * chunks * dtype.size
        + 4 * rank, K the entries of all the chunks."""
        dims = tf.TensorShape(shape).as_list()
        n = math.prod(dims)
        total, chunks = self._sizes(n)
        return (-(-total * self.index_bits // 8) + -(-total * _CODE_BITS // 8)
                + 2 * chunks * tf.as_dtype(dtype).size + 4 * len(dims))

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(tf.convert_to_tensor(x), self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        positions, codes, levels = chunked.chunk_top_k_encode(flat, self.chunk, self.kept)
        levels = tf.cast(levels, x.dtype)  # what the receiver reads, and x's dtype
        payload = {"positions": positions, "codes": codes, "levels": levels,
                   "shape": base.shape_of(x)}
        dense = chunked.chunk_top_k_decode(positions, codes, tf.cast(levels, tf.float32),
                                           tf.size(flat, out_type=tf.int64), self.chunk,
                                           self.kept)
        return payload, tf.reshape(tf.cast(dense, x.dtype), tf.shape(x))

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        dtype = fields["levels"].dtype
        total, chunks = self._sizes(n)
        # The op checks these again and the positions themselves, before allocating.
        positions = base.check_size(fields["positions"], (total * self.index_bits + 7) // 8,
                                    self.name, key="positions")
        codes = base.check_size(fields["codes"], (total * _CODE_BITS + 7) // 8, self.name,
                                key="codes")
        levels = base.check_size(fields["levels"], 2 * chunks, self.name, key="levels")
        dense = chunked.chunk_top_k_decode(positions, codes, tf.cast(levels, tf.float32), n,
                                           self.chunk, self.kept)
        return base.with_static_shape(tf.cast(dense, dtype), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding as float32 and its cast to the levels' dtype, and the levels as
        float32 (two per chunk)."""
        return 4 + base.extra_bytes(fields["levels"].dtype) + 8 / self.chunk

    def _sizes(self, n):
        """(entries of all the chunks, chunks) of n values: Python ints for an int n,
        else int64 tensors."""
        chunk, kept = self.chunk, self.kept
        if isinstance(n, int):
            if n == 0:
                return 0, 0
            chunks = -(-n // chunk)
            last = n - (chunks - 1) * chunk
            return (chunks - 1) * kept + -(-last * kept // chunk), chunks
        n = tf.cast(n, tf.int64)
        chunks = (n + chunk - 1) // chunk
        last = n - (chunks - 1) * chunk
        total = tf.where(n > 0, (chunks - 1) * kept + (last * kept + chunk - 1) // chunk,
                         tf.constant(0, tf.int64))
        return total, chunks
