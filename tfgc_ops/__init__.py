"""tfgc's C++ TensorFlow ops, with one module of Python wrappers per op family:

  quartic          3LC's quantize-and-fold and unfold (one tensor or a batch), and the
                   largest magnitude that sets the scale
  zero_run         zero-run encoding of the quartic bytes (3LC section 3.3)
  quartic_entropy  rANS entropy coding of the quartic bytes
  keys             FastSGD's key bit-packing
  bits             the packing of small codes into bytes (the quantizers' payloads)
  sparse           exact top-k selection, FastSGD's threshold filter, sparse row sums
  quantize         a tensor's range, uniform quantization, OneBit's sign bits (and
                   Signum's momentum step with them), LogQuant
  stochastic       stochastic rounding (QSGD, stochastic 3-values) with draws that depend
                   only on a seed and each value's index
  chunked          chunked top-k with 2-bit values (ChunkedTopK)

Every wrapper is also a name of this package (`tfgc_ops.zero_run_encode`). The formats
are also written plainly in numpy in tests/reference_ops.py, the oracle the tests hold
the ops to (not installed); `reference_ops.<name>` in a docstring is that module. Importing it
loads the op library (`_load`), which the build compiled against the installed
TensorFlow; a library built for another TensorFlow minor version is refused with a
message that says how to rebuild.
"""
from tfgc_ops._load import library_path
from tfgc_ops.bits import pack_bits, unpack_bits
from tfgc_ops.chunked import chunk_top_k_decode, chunk_top_k_encode
from tfgc_ops.keys import MAX_FLAG_BITS, MIN_FLAG_BITS, check_flag_bits, pack_keys, unpack_keys
from tfgc_ops.quantize import (
    log_levels_decode, log_levels_encode, momentum_sign_bits_encode, sign_bits_encode,
    uniform_quantize, value_range,
)
from tfgc_ops.quartic import (
    batch_largest_magnitude, batch_quartic_fold, batch_quartic_unfold, largest_magnitude,
    quartic_fold, quartic_unfold,
)
from tfgc_ops.quartic_entropy import quartic_entropy_decode, quartic_entropy_encode
from tfgc_ops.sparse import (
    bitmap_expand, magnitude_filter, magnitude_select, positions_expand, row_sums,
)
from tfgc_ops.stochastic import qsgd_decode, qsgd_encode, qsgd_norms, stochastic_ternary_fold
from tfgc_ops.zero_run import zero_run_decode, zero_run_encode

__all__ = [
    # quartic
    "largest_magnitude", "quartic_fold", "quartic_unfold", "batch_largest_magnitude",
    "batch_quartic_fold", "batch_quartic_unfold",
    # zero_run, quartic_entropy
    "zero_run_encode", "zero_run_decode", "quartic_entropy_encode", "quartic_entropy_decode",
    # keys, bits
    "pack_keys", "unpack_keys", "check_flag_bits", "pack_bits", "unpack_bits",
    # sparse
    "magnitude_select", "bitmap_expand", "positions_expand", "magnitude_filter", "row_sums",
    # quantize
    "value_range", "uniform_quantize", "sign_bits_encode", "momentum_sign_bits_encode",
    "log_levels_encode", "log_levels_decode",
    # stochastic
    "qsgd_norms", "qsgd_encode", "qsgd_decode", "stochastic_ternary_fold",
    # chunked
    "chunk_top_k_encode", "chunk_top_k_decode",
    # _load
    "library_path",
]
