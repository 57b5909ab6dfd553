"""tfgc's C++ TensorFlow ops: 3LC's quantize-and-fold and unfold, zero-run encoding and
entropy coding of the quartic bytes, FastSGD's threshold filter and key bit-packing,
OneBit's sign bits, the packing of small codes into bytes (the quantizers' payloads),
uniform quantization (a tensor's range, then its packed codes), LogQuant's decoder, and
stochastic rounding (QSGD, stochastic 3-values) with draws that
depend only on a seed and each value's index.

The op library is compiled at install time against the installed TensorFlow. A library
built for another TensorFlow minor version cannot load (TensorFlow's C++ ABI changes
between minors), so the version it was built for is recorded in build_info.json and
checked here before loading, with a message that says how to rebuild.
"""
import glob
import json
import os

import numpy as np
import tensorflow as tf

__all__ = ["largest_magnitude", "sign_bits_encode", "magnitude_filter", "magnitude_select",
           "bitmap_expand",
           "quartic_fold", "quartic_unfold", "batch_largest_magnitude", "batch_quartic_fold",
           "batch_quartic_unfold", "zero_run_encode", "zero_run_decode", "quartic_entropy_encode",
           "quartic_entropy_decode", "pack_keys", "unpack_keys", "check_flag_bits", "pack_bits",
           "unpack_bits", "value_range", "uniform_quantize", "qsgd_norms", "qsgd_encode", "qsgd_decode",
           "stochastic_ternary_fold", "log_levels_encode", "log_levels_decode", "row_sums",
           "library_path"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.dirname(_HERE)
_REBUILD_HINT = (
    "Rebuild the ops against the TensorFlow you have: in the tfgc source tree run\n"
    "    python -m pip install --no-build-isolation --force-reinstall --no-deps -e .\n"
    "(or `make install`; {root} looks like {what})."
)
MIN_FLAG_BITS, MAX_FLAG_BITS = 1, 5


def _rebuild_hint():
    is_source = os.path.exists(os.path.join(_SOURCE_ROOT, "setup.py"))
    return _REBUILD_HINT.format(
        root=_SOURCE_ROOT, what="the source tree" if is_source else "an installed copy"
    )


def _minor(version):
    return ".".join(version.split(".")[:2])


def _find_library():
    candidates = sorted(glob.glob(os.path.join(_HERE, "_tfgc_ops*.so")))
    info_path = os.path.join(_HERE, "build_info.json")
    if not candidates or not os.path.exists(info_path):
        raise ImportError(
            f"tfgc's op library is not built (looked for _tfgc_ops*.so and build_info.json "
            f"in {_HERE}).\n" + _rebuild_hint()
        )
    with open(info_path) as f:
        info = json.load(f)
    built_for = info.get("tensorflow", "unknown")
    if _minor(built_for) != _minor(tf.__version__):
        raise ImportError(
            f"tfgc's op library was built for TensorFlow {built_for} but TensorFlow "
            f"{tf.__version__} is installed; a library built for one minor version does not "
            f"load in another.\n" + _rebuild_hint()
        )
    named = os.path.join(_HERE, info.get("library", ""))
    return named if os.path.exists(named) else candidates[0]


def _load():
    path = _find_library()
    try:
        return path, tf.load_op_library(path)
    except tf.errors.NotFoundError as error:  # e.g. undefined symbols from a stale build
        raise ImportError(
            f"tfgc's op library {path} failed to load: {error}\n" + _rebuild_hint()
        ) from error


library_path, _ops = _load()


def _as_bytes(data, what):
    """`data` as a uint8 tensor, refusing anything that is not already bytes.

    A tensor must be uint8; an array or list must hold integers in 0..255 (a silent
    conversion would wrap 300 to 44 and -1 to 255).
    """
    if isinstance(data, (tf.Tensor, tf.Variable)):
        if data.dtype != tf.uint8:
            raise ValueError(f"{what} takes a uint8 tensor, got {data.dtype.name}")
        return tf.convert_to_tensor(data)
    array = np.asarray(data)
    if array.dtype == np.uint8:
        return tf.convert_to_tensor(array)
    if array.size == 0 and array.dtype == np.float64:  # an empty list
        return tf.zeros(array.shape, tf.uint8)
    if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
        raise ValueError(f"{what} takes bytes (integers in 0..255), got {array.dtype.name} "
                         f"values" + (f" in {array.min()}..{array.max()}" if array.size else ""))
    return tf.convert_to_tensor(array.astype(np.uint8))


def check_flag_bits(flag_bits, what="flag_bits"):
    """`flag_bits` as an int in 1..5; a fraction or a bool is refused, not truncated.

    Raises:
      ValueError: naming `what`, when `flag_bits` is not an integer in 1..5.
    """
    integral = (not isinstance(flag_bits, bool)
                and isinstance(flag_bits, (int, float, np.integer, np.floating))
                and flag_bits == int(flag_bits))
    if not integral or not MIN_FLAG_BITS <= int(flag_bits) <= MAX_FLAG_BITS:
        raise ValueError(f"{what} must be an integer in [1, 5], got {flag_bits!r}")
    return int(flag_bits)


def largest_magnitude(x):
    """max|x| of a 1-D float32 tensor in one pass; NaN if a value is not finite, 0 if empty."""
    return _ops.tfgc_largest_magnitude(tf.convert_to_tensor(x, tf.float32))


def sign_bits_encode(x):
    """One-bit sign quantization of a 1-D float32 tensor in one pass.

    Returns:
      (packed, sums, counts): uint8 [ceil(n / 8)] with bit i (most significant bit
      first, the last byte zero-padded) = x_i >= 0, as `pack_bits(codes, 1)` packs them;
      float64 [2], the sums of the values >= 0 and of the others (NaN counts with the
      others; a non-finite value makes its side's sum non-finite); int64 [2], how many
      values each sum holds (`reference.sign_bits_encode`).
    """
    return _ops.tfgc_sign_bits_encode(tf.convert_to_tensor(x, tf.float32))


def magnitude_select(x, wanted, positions="bitmap", non_finite_in_wanted=False):
    """The `wanted` largest magnitudes of a float32 vector, exactly, in three passes.

    Selects the `wanted` largest nonzero finite |x_i| (fewer when fewer are nonzero; ties
    at the threshold in position order) and every value that is not finite, which counts
    in `wanted` when `non_finite_in_wanted` (`reference.magnitude_select`).

    Args:
      x: 1-D float32 tensor (at most 2^31 - 1 values).
      wanted: integer scalar.
      positions: "bitmap" (uint8, bit i most significant first, as `pack_bits` packs
        1-bit codes) or "indices" (int32, ascending).
      non_finite_in_wanted: whether the non-finite values use up part of `wanted`.

    Returns:
      (positions, values, reconstruction): the selection as asked; the selected values
      in position order; x where selected and 0 elsewhere (computed only where used).
    """
    types = {"bitmap": tf.uint8, "indices": tf.int32}
    if positions not in types:
        raise ValueError(f"positions must be 'bitmap' or 'indices', got {positions!r}")
    return _ops.tfgc_magnitude_select(
        tf.convert_to_tensor(x, tf.float32), tf.cast(wanted, tf.int64),
        non_finite_in_wanted=bool(non_finite_in_wanted), positions_type=types[positions])


def bitmap_expand(bitmap, values, n):
    """The inverse of `magnitude_select`'s bitmap and values (Sparsify's decode).

    Returns:
      float32 [n]: the next of `values` where bit i of `bitmap` is set (most significant
      bit first), else 0.

    Raises:
      tf.errors.InvalidArgumentError: the bitmap is not ceil(n / 8) bytes, or its first n
        bits do not select exactly as many values as given (checked before allocating).
    """
    return _ops.tfgc_bitmap_expand(tf.convert_to_tensor(bitmap, tf.uint8),
                                   tf.convert_to_tensor(values, tf.float32),
                                   tf.cast(n, tf.int64))


def magnitude_filter(v, factor):
    """FastSGD's threshold filter (Algorithm 1 with its early stop) in two passes over v.

    Args:
      v: 1-D floating values (float16 and bfloat16 are widened to float32).
      factor: b^-tau; a value can pass the filter when |v| >= sum * factor.

    Returns:
      (sum, positions): float64 scalar, the sum of |v| over the finite values rounded to
      v's wire dtype (float64 for float64 input, else float32), NaN when a value is not
      finite; int64 positions, ascending, of the values with 0 < |v| >= sum * factor and
      of every value that is not finite (`reference.magnitude_filter`).
    """
    v = tf.convert_to_tensor(v)
    if v.dtype != tf.float64:
        v = tf.cast(v, tf.float32)
    return _ops.tfgc_magnitude_filter(v, tf.cast(factor, tf.float64))


def row_sums(rows, indices, num_rows):
    """The rows of a sparse gradient summed by distinct index, in ascending index order.

    Without hashing every index or summing into the dense tensor: distinct indices come
    from a bitmap of [0, num_rows) when it is small next to the indices, else from
    sorting them.

    Args:
      rows: [n, row_size] float32 or float64.
      indices: [n] int32 or int64, each in [0, num_rows).
      num_rows: the dense tensor's first dimension.

    Returns:
      (distinct, sums): int64 [u], the distinct indices ascending; [u, row_size] of rows'
      dtype, row k the sum (added in position order) of the rows whose index is
      distinct[k] (`reference.row_sums`).

    Raises:
      tf.errors.InvalidArgumentError: an index is outside [0, num_rows), or rows and
        indices do not match.
    """
    return _ops.tfgc_row_sums(tf.convert_to_tensor(rows), tf.convert_to_tensor(indices),
                              tf.cast(num_rows, tf.int64))


def quartic_fold(x, scale):
    """3LC's quantization and quartic folding (sections 3.1-3.2) in one pass.

    Args:
      x: 1-D float32 tensor of n values.
      scale: float32 scalar M; q = round-half-even(x / M) clamped to [-1, 1], and every q
        is 0 when M is not > 0 (zero or NaN).

    Returns:
      1-D uint8 tensor of ceil(n / 5) bytes, byte i = sum over k of
      (q[k g + i] + 1) * 3^(4 - k) with g the byte count and the pad's q = 0
      (`reference.quartic_encode`).
    """
    return _ops.tfgc_quartic_fold(tf.convert_to_tensor(x, tf.float32),
                                  tf.convert_to_tensor(scale, tf.float32))


def quartic_unfold(quartic, n, scale):
    """Inverse of `quartic_fold`: the n float32 values q * scale.

    Raises:
      tf.errors.InvalidArgumentError: `quartic` does not have exactly ceil(n / 5) bytes
        (checked before anything is allocated), or a byte is above 242.
    """
    return _ops.tfgc_quartic_unfold(_as_bytes(quartic, "quartic_unfold"), tf.cast(n, tf.int64),
                                    tf.convert_to_tensor(scale, tf.float32))


def batch_largest_magnitude(x, sizes):
    """`largest_magnitude` of each of a batch of tensors laid end to end in 1-D float32
    `x`, whose element counts are the Python ints `sizes`: float32 [len(sizes)]."""
    return _ops.tfgc_batch_largest_magnitude(tf.convert_to_tensor(x, tf.float32),
                                             sizes=[int(s) for s in sizes])


def batch_quartic_fold(x, scales, sizes):
    """`quartic_fold` of each of a batch of tensors laid end to end in 1-D float32 `x`
    (element counts: the Python ints `sizes`), tensor i with scale `scales[i]`; their
    bytes laid end to end (ceil(size / 5) each)."""
    return _ops.tfgc_batch_quartic_fold(tf.convert_to_tensor(x, tf.float32),
                                        tf.convert_to_tensor(scales, tf.float32),
                                        sizes=[int(s) for s in sizes])


def batch_quartic_unfold(quartic, scales, sizes):
    """Inverse of `batch_quartic_fold`: the tensors' float32 values laid end to end.

    Raises:
      tf.errors.InvalidArgumentError: `quartic` does not hold exactly ceil(size / 5)
        bytes per tensor, a byte is above 242, or `scales` has not one per tensor.
    """
    return _ops.tfgc_batch_quartic_unfold(_as_bytes(quartic, "batch_quartic_unfold"),
                                          tf.convert_to_tensor(scales, tf.float32),
                                          sizes=[int(s) for s in sizes])


def value_range(x):
    """A float32 vector's range in one pass.

    Returns:
      (extremes, finite, sum_squares): float32 [min, max] (+inf, -inf for an empty x;
      unspecified unless every value is finite), a bool scalar that says whether every
      value is finite, and the sum of the squares in float64.
    """
    return _ops.tfgc_value_range(tf.convert_to_tensor(x, tf.float32))


def uniform_quantize(x, low, step, bits):
    """Uniform quantization of a float32 vector, packed as `pack_bits` packs its codes.

    Code q_i = round((x_i - low) / d) with ties to even, d = step if step > 0 else 1,
    clamped to [0, 2^bits - 1]; a quotient that is NaN (x_i or low NaN) gives 0.

    Args:
      x: 1-D float32 tensor.
      low, step: float32 scalars.
      bits: int or int32 scalar tensor in 1..8.

    Returns:
      (packed, reconstructed): ceil(n * bits / 8) uint8, and low + q_i * step (computed
      only where it is used).

    Raises:
      tf.errors.InvalidArgumentError: bits outside 1..8, or x not 1-D.
    """
    return _ops.tfgc_uniform_quantize(tf.convert_to_tensor(x, tf.float32),
                                      tf.cast(low, tf.float32), tf.cast(step, tf.float32),
                                      tf.cast(bits, tf.int32))


def qsgd_norms(x, bucket_size):
    """L2 norm of each bucket of `bucket_size` values of 1-D float32 `x` (the last one
    short), summed in double; NaN or Inf where a value is not finite."""
    return _ops.tfgc_qsgd_norms(tf.convert_to_tensor(x, tf.float32), bucket_size=int(bucket_size))


def qsgd_encode(x, norms, seed, bits, bucket_size):
    """QSGD's stochastic rounding of 1-D float32 `x`, packed `bits` bits per value.

    Value j of bucket b gets level l = min(floor(t) + [u_j < t - floor(t)], s) with
    t = min(|x_j| * (s / norms[b]), s), s = 2^(bits-1) - 1, and code (x_j < 0) << (bits - 1) | l;
    a bucket whose norm is not > 0 and finite sends level 0. The draw u_j in [0, 1)
    depends only on `seed` (2 int64) and j (`reference.uniform_draws`).

    Returns:
      uint8 tensor of ceil(n * bits / 8) bytes, packed as `pack_bits` packs.
    """
    return _ops.tfgc_qsgd_encode(tf.convert_to_tensor(x, tf.float32),
                                 tf.convert_to_tensor(norms, tf.float32),
                                 tf.cast(seed, tf.int64), bits=int(bits),
                                 bucket_size=int(bucket_size))


def qsgd_decode(packed, norms, n, bits, bucket_size):
    """Inverse of `qsgd_encode`: the n float32 values (+-l * norms[b]) / s.

    Raises:
      tf.errors.InvalidArgumentError: `packed` does not hold exactly n codes or `norms`
        is not one per bucket (checked before anything is allocated).
    """
    return _ops.tfgc_qsgd_decode(_as_bytes(packed, "qsgd_decode"),
                                 tf.convert_to_tensor(norms, tf.float32), tf.cast(n, tf.int64),
                                 bits=int(bits), bucket_size=int(bucket_size))


def stochastic_ternary_fold(x, scale, seed):
    """3LC's stochastic 3-values of 1-D float32 `x`, folded as `quartic_fold` folds.

    q_j = sign(x_j) when u_j < |x_j| * (1 / scale), else 0 (every q is 0 when `scale` is not
    > 0); u_j as in `qsgd_encode`. Unfold with `quartic_unfold`.
    """
    return _ops.tfgc_stochastic_ternary_fold(tf.convert_to_tensor(x, tf.float32),
                                             tf.convert_to_tensor(scale, tf.float32),
                                             tf.cast(seed, tf.int64))


def log_levels_encode(x, largest, bits):
    """LogQuant's sign-level codes of 1-D float32 `x`, packed `bits` bits each, in one pass.

    With fsr = ceil(log2 largest) (0 unless `largest` is positive and finite), x_i gets level
    m = fsr - round(log2 |x_i|) + 1 where 1 <= m <= 2^(bits - 1) - 1, else 0 (also for 0,
    Inf and NaN), and x_i's sign bit on top; both roundings are exact, no logarithm is
    computed (`reference.log_levels_codes`).

    Args:
      x: 1-D float32.
      largest: max |x_i|, NaN when some x_i is not finite (`largest_magnitude(x)`).
      bits: 2..8.

    Returns:
      (packed uint8 codes, the float32 values `log_levels_decode` gives for them, scale):
      scale is 2^fsr, or NaN when `largest` is not finite.
    """
    return _ops.tfgc_log_levels_encode(tf.convert_to_tensor(x, tf.float32),
                                       tf.convert_to_tensor(largest, tf.float32), bits=int(bits))


def log_levels_decode(packed, scale, n, bits):
    """LogQuant's n float32 values from sign-level codes packed `bits` bits each.

    Level m = 0 is 0 and m >= 1 is +-scale * 2^(1 - m); a scale that is not finite gives
    +-scale everywhere (`reference.log_levels_values`).

    Raises:
      tf.errors.InvalidArgumentError: `packed` does not hold exactly n codes (checked
        before anything is allocated), or bits outside 2..8.
    """
    return _ops.tfgc_log_levels_decode(_as_bytes(packed, "log_levels_decode"),
                                       tf.convert_to_tensor(scale, tf.float32),
                                       tf.cast(n, tf.int64), bits=int(bits))


def zero_run_encode(quartic):
    """Zero-run encodes quartic bytes (3LC section 3.3).

    Args:
      quartic: 1-D uint8 tensor of quartic-encoded bytes, each in 0..242.

    Returns:
      1-D uint8 tensor where each run of k bytes equal to 121 (2 <= k <= 14) is one byte
      243 + (k - 2); longer runs are split greedily into 14s.

    Raises:
      ValueError: the input is not bytes (a tensor of another dtype, values beyond 0..255).
      tf.errors.InvalidArgumentError: a byte is above 242 or the input is not 1-D.
    """
    return _ops.tfgc_zero_run_encode(_as_bytes(quartic, "zero_run_encode"))


def zero_run_decode(encoded):
    """Exact inverse of `zero_run_encode`; any byte string decodes.

    Args:
      encoded: 1-D uint8 tensor.

    Returns:
      1-D uint8 tensor of quartic bytes.

    Raises:
      ValueError: the input is not bytes (a tensor of another dtype, values beyond 0..255).
    """
    return _ops.tfgc_zero_run_decode(_as_bytes(encoded, "zero_run_decode"))


def _group_sizes(groups):
    """Group sizes as a 1-D int64 tensor; an empty list is no groups."""
    if not isinstance(groups, (tf.Tensor, tf.Variable)):
        array = np.asarray(groups)
        if array.size == 0:
            array = array.astype(np.int64)
        groups = tf.convert_to_tensor(array)
    if not groups.dtype.is_integer:
        raise ValueError(f"groups must be integer sizes, got {groups.dtype.name}")
    return tf.reshape(tf.cast(groups, tf.int64), [-1])


def quartic_entropy_encode(quartic, groups):
    """Entropy-codes quartic bytes, a smaller alternative to `zero_run_encode`.

    Each group (e.g. one tensor's bytes) is coded with rANS under one number: the share
    of its 3-values that are nonzero, assumed independent with random signs. The format
    is in tfgc_ops/cc/quartic_rans.h and, executable, in `reference.quartic_entropy_encode`.

    Args:
      quartic: 1-D uint8 tensor of quartic-encoded bytes, each in 0..242.
      groups: 1-D integer sizes of the groups, summing to the length of `quartic`; the
        receiver needs the same sizes to decode.

    Returns:
      1-D uint8 tensor: two bytes per group, a 4-byte rANS state, then the stream.

    Raises:
      ValueError: the input is not bytes, or groups are not integers.
      tf.errors.InvalidArgumentError: a byte is above 242, the groups do not sum to the
        input's length, or a size is negative.
    """
    return _ops.tfgc_quartic_entropy_encode(_as_bytes(quartic, "quartic_entropy_encode"),
                                            _group_sizes(groups))


def quartic_entropy_decode(encoded, groups):
    """Exact inverse of `quartic_entropy_encode` with the same groups.

    The output has exactly sum(groups) bytes, a size the receiver knows; nothing is
    allocated from what the message declares.

    Args:
      encoded: 1-D uint8 tensor.
      groups: 1-D integer group sizes, as given to the encoder.

    Returns:
      1-D uint8 tensor of quartic bytes.

    Raises:
      ValueError: the input is not bytes, or groups are not integers.
      tf.errors.InvalidArgumentError: `encoded` is not a complete encoding of groups of
        these sizes (truncated, too long, or corrupt).
    """
    return _ops.tfgc_quartic_entropy_decode(_as_bytes(encoded, "quartic_entropy_decode"),
                                            _group_sizes(groups))


def pack_keys(keys, flag_bits=2):
    """Packs sparse keys as delta keys in adaptive bit-level binary (FastSGD Algorithm 2).

    Args:
      keys: 1-D int32 or int64 tensor of non-negative, strictly increasing keys.
      flag_bits: bits of the length flag, 1..5 (the paper recommends 2).

    Returns:
      1-D uint8 tensor: a header (flag bits, delta bit length, LEB128 key count) then the
      bit stream of (flag, delta) entries, most significant bit first.

    Raises:
      ValueError: flag_bits is not an integer in 1..5.
      tf.errors.InvalidArgumentError: keys are negative, not strictly increasing, or not 1-D.
    """
    flag_bits = check_flag_bits(flag_bits)
    keys = tf.convert_to_tensor(keys)
    if keys.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"keys must be int32 or int64, got {keys.dtype.name}")
    return _ops.tfgc_pack_keys(keys, flag_bits=flag_bits)


def unpack_keys(packed):
    """Inverse of `pack_keys`.

    Args:
      packed: 1-D uint8 tensor produced by `pack_keys`.

    Returns:
      1-D int64 tensor of keys.

    Raises:
      ValueError: the input is not bytes.
      tf.errors.InvalidArgumentError: the bytes are not a well-formed packing.
    """
    return _ops.tfgc_unpack_keys(_as_bytes(packed, "unpack_keys"))


def pack_bits(codes, bits):
    """Packs codes of `bits` bits into bytes, most significant bit first.

    Args:
      codes: 1-D int32 tensor, each code in [0, 2^bits).
      bits: int or int32 scalar tensor in 1..8 (a tensor may change between steps without
        retracing).

    Returns:
      1-D uint8 tensor of ceil(n * bits / 8) bytes, the last one zero-padded.

    Raises:
      tf.errors.InvalidArgumentError: bits outside 1..8, a code out of range, or codes
        that are not 1-D.
    """
    return _ops.tfgc_pack_bits(tf.convert_to_tensor(codes, tf.int32), tf.cast(bits, tf.int32))


def unpack_bits(packed, bits, n):
    """Inverse of `pack_bits`: the n codes held by exactly ceil(n * bits / 8) bytes.

    Args:
      packed: 1-D uint8 tensor.
      bits: int or int32 scalar tensor in 1..8.
      n: how many codes; checked against the bytes before anything is allocated.

    Returns:
      1-D int32 tensor of n codes.

    Raises:
      ValueError: `packed` is not bytes.
      tf.errors.InvalidArgumentError: bits outside 1..8, or n that does not match the
        number of bytes.
    """
    return _ops.tfgc_unpack_bits(_as_bytes(packed, "unpack_bits"), tf.cast(bits, tf.int32),
                                 tf.cast(n, tf.int64))
