"""The byte formats of tfgc's ops, written plainly in numpy: the spec in executable form.

Tests run these next to the C++ ops on the same inputs and require identical bytes.
Written for clarity, not speed.
"""
import numpy as np

ZERO_GROUP = 121  # quartic code of five zero 3-values
MAX_LITERAL = 242
FIRST_RUN_BYTE = 243
MAX_RUN = 14


def quartic_encode(ternary):
    """Folds 3-values {-1, 0, 1} into bytes, five per byte (3LC section 3.2).

    Steps as the paper's: add 1, cast to uint8, flatten, pad to a multiple of 5, split
    into five contiguous partitions p0..p4, a = 81 p0 + 27 p1 + 9 p2 + 3 p3 + p4. The pad
    is a 3-value 0 (byte 1 after adding 1), so a zero tail joins a zero run.
    """
    digits = (np.asarray(ternary).reshape(-1) + 1).astype(np.uint8)
    padded_len = -(-digits.size // 5) * 5
    digits = np.concatenate([digits, np.ones(padded_len - digits.size, np.uint8)])
    parts = digits.reshape(5, -1).astype(np.int32)
    return (81 * parts[0] + 27 * parts[1] + 9 * parts[2] + 3 * parts[3] + parts[4]).astype(
        np.uint8
    )


def quartic_decode(quartic, size):
    """Inverse of `quartic_encode`: the first `size` 3-values as int8."""
    q = np.asarray(quartic, dtype=np.int32)
    parts = [(q // 81) % 3, (q // 27) % 3, (q // 9) % 3, (q // 3) % 3, q % 3]
    return (np.concatenate(parts)[:size] - 1).astype(np.int8)


def zero_run_encode(quartic):
    """Greedy zero-run encoding (3LC section 3.3) of bytes in 0..242."""
    data = np.asarray(quartic, dtype=np.uint8).reshape(-1)
    if data.size and data.max() > MAX_LITERAL:
        raise ValueError("quartic-encoded bytes must be in 0..242")
    out = []
    i = 0
    while i < data.size:
        if data[i] != ZERO_GROUP:
            out.append(int(data[i]))
            i += 1
            continue
        run = 0
        while i + run < data.size and data[i + run] == ZERO_GROUP:
            run += 1
        i += run
        out.extend([FIRST_RUN_BYTE + MAX_RUN - 2] * (run // MAX_RUN))
        rest = run % MAX_RUN
        if rest == 1:
            out.append(ZERO_GROUP)
        elif rest > 1:
            out.append(FIRST_RUN_BYTE + rest - 2)
    return np.array(out, dtype=np.uint8)


def zero_run_decode(encoded):
    """Inverse of `zero_run_encode`; bytes >= 243 are runs of 2..14 bytes of 121."""
    out = []
    for byte in np.asarray(encoded, dtype=np.uint8).reshape(-1):
        if byte < FIRST_RUN_BYTE:
            out.append(int(byte))
        else:
            out.extend([ZERO_GROUP] * (int(byte) - FIRST_RUN_BYTE + 2))
    return np.array(out, dtype=np.uint8)


# Quartic entropy coding (tfgc_ops/cc/quartic_rans.h): rANS under a per-group model in
# which every 3-value is nonzero with probability q / 65536, with a random sign.
PROB_BITS = 16
PROB_SCALE = 1 << PROB_BITS
RANS_LOW = 1 << 23
CLASS_SIZES = (1, 10, 40, 80, 80, 32)  # bytes with k = 0..5 nonzero 3-values


def nonzero_count(byte):
    """How many of a quartic byte's five 3-values are nonzero (base-3 digits != 1)."""
    return sum((int(byte) // power) % 3 != 1 for power in (81, 27, 9, 3, 1))


def _rank_in_class():
    ranks, seen = {}, [0] * 6
    for byte in range(MAX_LITERAL + 1):
        k = nonzero_count(byte)
        ranks[byte], seen[k] = seen[k], seen[k] + 1
    return ranks


_RANK = _rank_in_class()
_BY_CLASS = sorted(range(MAX_LITERAL + 1), key=lambda b: (nonzero_count(b), b))


def quartic_model(q):
    """(frequency of each class's bytes, cumulative start of each class) for q in 1..65535."""
    a = PROB_SCALE - q
    freq = [0] * 6
    for k in range(1, 6):
        shift = 64 + k
        freq[k] = max(1, (a ** (5 - k) * q ** k + (1 << (shift - 1))) >> shift)
    zero = PROB_SCALE - sum(n * f for n, f in zip(CLASS_SIZES[1:], freq[1:]))
    while zero < 1:
        widest = max((k for k in range(1, 6) if freq[k] > 1),
                     key=lambda k: (CLASS_SIZES[k] * freq[k], -k))
        cut = min(freq[widest] - 1, -(-(1 - zero) // CLASS_SIZES[widest]))
        freq[widest] -= cut
        zero += cut * CLASS_SIZES[widest]
    freq[0] = zero
    starts = [sum(n * f for n, f in zip(CLASS_SIZES[:k], freq[:k])) for k in range(6)]
    return freq, starts


def quartic_q(group):
    """The q sent for a group: its share of nonzero 3-values in 1/65536, 0 if none."""
    nonzero = sum(nonzero_count(b) for b in group)
    if nonzero == 0:
        return 0
    values = 5 * len(group)
    return min(max((2 * nonzero * PROB_SCALE + values) // (2 * values), 1), PROB_SCALE - 1)


def quartic_entropy_encode(quartic, groups):
    """rANS coding of quartic bytes, group by group (the format of quartic_rans.h)."""
    data = [int(b) for b in np.asarray(quartic, np.uint8).reshape(-1)]
    if any(b > MAX_LITERAL for b in data) or sum(groups) != len(data):
        raise ValueError("bytes must be in 0..242 and the groups must cover them exactly")
    bounds = np.cumsum([0] + list(groups))
    qs = [quartic_q(data[bounds[g]:bounds[g + 1]]) for g in range(len(groups))]
    stream, x = [], RANS_LOW  # bytes in the order they are written, i.e. reversed
    for g in reversed(range(len(groups))):
        if qs[g] == 0:
            continue
        freq, starts = quartic_model(qs[g])
        for byte in reversed(data[bounds[g]:bounds[g + 1]]):
            k = nonzero_count(byte)
            f, start = freq[k], starts[k] + _RANK[byte] * freq[k]
            while x >= ((RANS_LOW >> PROB_BITS) << 8) * f:
                stream.append(x & 0xFF)
                x >>= 8
            x = (x // f << PROB_BITS) + x % f + start
    header = [byte for q in qs for byte in (q & 0xFF, q >> 8)]
    state = [(x >> shift) & 0xFF for shift in (0, 8, 16, 24)]
    return np.array(header + state + stream[::-1], np.uint8)


def quartic_entropy_decode(encoded, groups):
    """Inverse of `quartic_entropy_encode`; raises ValueError on a malformed encoding."""
    data = [int(b) for b in np.asarray(encoded, np.uint8).reshape(-1)]
    at = 2 * len(groups) + 4
    if len(data) < at:
        raise ValueError("shorter than the header and state")
    x = sum(data[at - 4 + i] << (8 * i) for i in range(4))
    if not RANS_LOW <= x < 1 << 31:
        raise ValueError("initial state out of range")
    out = []
    for g, size in enumerate(groups):
        q = data[2 * g] | data[2 * g + 1] << 8
        if q == 0:
            out.extend([ZERO_GROUP] * size)
            continue
        freq, starts = quartic_model(q)
        for _ in range(size):
            slot = x % PROB_SCALE
            k = max(k for k in range(6) if starts[k] <= slot)
            rank = (slot - starts[k]) // freq[k]
            out.append(_BY_CLASS[sum(CLASS_SIZES[:k]) + rank])
            x = freq[k] * (x >> PROB_BITS) + slot - starts[k] - rank * freq[k]
            while x < RANS_LOW:
                if at == len(data):
                    raise ValueError("the stream ends before its symbols do")
                x, at = x << 8 | data[at], at + 1
    if at != len(data) or x != RANS_LOW:
        raise ValueError("bytes left over, or a final state that is not the initial one")
    return np.array(out, np.uint8)


def code_lengths(max_bits, flag_bits):
    """Code length of each of the 2^l flag classes: ceil((c + 1) * M / 2^l)."""
    classes = 1 << flag_bits
    return [-(-(c + 1) * max_bits // classes) for c in range(classes)]


def pack_keys(keys, flag_bits=2):
    """Delta keys + adaptive bit-level binary encoding with a length flag (FastSGD)."""
    keys = [int(k) for k in np.asarray(keys).reshape(-1)]
    if not 1 <= flag_bits <= 5:
        raise ValueError("flag_bits must be in [1, 5]")
    if any(k < 0 for k in keys) or any(b <= a for a, b in zip(keys, keys[1:])):
        raise ValueError("keys must be non-negative and strictly increasing")
    deltas = [b - a for a, b in zip([0] + keys, keys)]
    max_bits = max(deltas, default=0).bit_length()
    lengths = code_lengths(max_bits, flag_bits)
    bits = []
    for delta in deltas:
        c = next(c for c, length in enumerate(lengths) if delta.bit_length() <= length)
        bits.append(format(c, f"0{flag_bits}b"))
        bits.append(format(delta, f"0{lengths[c]}b") if lengths[c] else "")
    stream = "".join(bits)
    stream += "0" * (-len(stream) % 8)
    header = [flag_bits, max_bits] + _leb128(len(keys))
    body = [int(stream[i : i + 8], 2) for i in range(0, len(stream), 8)]
    return np.array(header + body, dtype=np.uint8)


def unpack_keys(packed):
    """Inverse of `pack_keys`; raises ValueError on malformed input."""
    data = [int(b) for b in np.asarray(packed, dtype=np.uint8).reshape(-1)]
    if len(data) < 3:
        raise ValueError("too short for a header")
    flag_bits, max_bits = data[0], data[1]
    if not 1 <= flag_bits <= 5 or max_bits > 63:
        raise ValueError("bad header")
    count, position = 0, 2
    for shift in range(0, 63, 7):
        if position >= len(data):
            raise ValueError("truncated count")
        count |= (data[position] & 0x7F) << shift
        position += 1
        if not data[position - 1] & 0x80:
            break
    else:
        raise ValueError("count exceeds int64")
    stream = "".join(format(b, "08b") for b in data[position:])
    lengths = code_lengths(max_bits, flag_bits)
    keys, key, cursor = [], 0, 0
    for j in range(count):
        if cursor + flag_bits > len(stream):
            raise ValueError("truncated entry")
        c = int(stream[cursor : cursor + flag_bits], 2)
        cursor += flag_bits
        if cursor + lengths[c] > len(stream):
            raise ValueError("truncated entry")
        delta = int(stream[cursor : cursor + lengths[c]] or "0", 2)
        cursor += lengths[c]
        if j > 0 and delta == 0:
            raise ValueError("keys not strictly increasing")
        key += delta
        if key >= 2**63:
            raise ValueError("key overflows int64")
        keys.append(key)
    if -(-cursor // 8) * 8 != len(stream) or "1" in stream[cursor:]:
        raise ValueError("stray bytes or bits after the last entry")
    return np.array(keys, dtype=np.int64)


def _leb128(value):
    out = []
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return out


def sign_bits_encode(x):
    """`tfgc_ops.sign_bits_encode`: sign bits (x >= 0) packed most significant bit first,
    and the double sums and counts of the values >= 0 and of the others."""
    x = np.asarray(x, np.float32)
    upper = x >= 0
    wide = x.astype(np.float64)
    sums = np.array([wide[upper].sum(), wide[~upper].sum()])
    counts = np.array([upper.sum(), (~upper).sum()], np.int64)
    return np.packbits(upper), sums, counts


def magnitude_filter(v, factor):
    """`tfgc_ops.magnitude_filter`: (sum of |v| over finite values rounded to the wire
    dtype, or NaN; positions of 0 < |v| >= sum * factor and of non-finite values)."""
    v = np.asarray(v)
    wire = np.float64 if v.dtype == np.float64 else np.float32
    wide = v.astype(np.float64)
    finite = np.isfinite(wide)
    magnitude = np.abs(wide)
    total = float(wire(magnitude[finite].sum())) if finite.all() else float("nan")
    with np.errstate(invalid="ignore"):
        candidate = ((magnitude > 0) & (magnitude >= total * factor)) | ~finite
    return total, np.flatnonzero(candidate)


def row_sums(rows, indices, num_rows):
    """`tfgc_ops.row_sums`: (distinct indices ascending, the sums of their rows)."""
    rows, indices = np.asarray(rows), np.asarray(indices, np.int64)
    assert indices.size == 0 or (indices.min() >= 0 and indices.max() < num_rows)
    distinct, slots = np.unique(indices, return_inverse=True)
    sums = np.zeros((distinct.size,) + rows.shape[1:], rows.dtype)
    np.add.at(sums, slots.reshape(-1), rows)  # unbuffered: in position order
    return distinct, sums


def magnitude_select(x, wanted, non_finite_in_wanted=False):
    """`tfgc_ops.magnitude_select`'s selection as a bool mask: the `wanted` largest
    nonzero finite |x| (ties in position order), and every non-finite value."""
    x = np.asarray(x, np.float32)
    patterns = x.view(np.uint32) & np.uint32(0x7FFFFFFF)  # orders like the magnitude
    finite = patterns < np.uint32(0x7F800000)
    if non_finite_in_wanted:
        wanted -= int((~finite).sum())
    candidates = np.flatnonzero(finite & (patterns > 0))
    order = candidates[np.argsort(-patterns[candidates].astype(np.int64), kind="stable")]
    keep = ~finite
    keep[order[:max(0, min(wanted, order.size))]] = True
    return keep


def pack_bits(codes, bits):
    """Codes in [0, 2^bits) as one bit stream, most significant bit first, zero-padded."""
    codes = np.asarray(codes, np.int64).reshape(-1)
    assert 1 <= bits <= 8 and (codes.size == 0 or (codes.min() >= 0 and codes.max() < 2**bits))
    stream = (codes[:, None] >> np.arange(bits - 1, -1, -1)) & 1  # each code's bits, MSB first
    return np.packbits(stream.reshape(-1).astype(np.uint8))


def unpack_bits(packed, bits, n):
    """Inverse of `pack_bits`: the first n codes."""
    stream = np.unpackbits(np.asarray(packed, np.uint8))[: n * bits].reshape(n, bits)
    return (stream.astype(np.int64) << np.arange(bits - 1, -1, -1)).sum(axis=1).astype(np.int32)


def uniform_codes(x, low, step, bits):
    """Uniform quantization codes of float32 `x` (see `tfgc_ops.uniform_quantize`):
    round((x - low) / d), ties to even, d = step if step > 0 else 1, clamped to
    [0, 2^bits - 1], NaN giving 0; all in float32 arithmetic."""
    x = np.asarray(x, np.float32).reshape(-1)
    low, step = np.float32(low), np.float32(step)
    divisor = step if step > 0 else np.float32(1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        quotient = (x - low) / divisor
    quotient = np.where(np.isnan(quotient), np.float32(0.0), quotient)
    return np.round(np.clip(quotient, 0, 2**bits - 1)).astype(np.int32)


def uniform_reconstruction(codes, low, step):
    """low + code * step in float32, what the receiver of uniform codes computes."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.float32(low) + np.asarray(codes).astype(np.float32) * np.float32(step)


# --- stochastic rounding (the ops qsgd_encode / stochastic_ternary_fold) ------------------

_MASK64 = (1 << 64) - 1


def _finalize(z):
    """SplitMix64's finalizer of a Python int."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _mix32(x):
    """The draws' 32-bit mixing function ("lowbias32") of a uint32 array."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def uniform_draws(seed, n, first=0):
    """The draws u_first..u_{first+n-1} in [0, 1) of the stochastic-rounding ops under
    `seed` (two ints): the top 24 bits of mix32(lo32(j) * g + c), a Weyl sequence with
    key = finalize(seed0 ^ finalize(seed1)), step g = hi32(key) | 1 and offset
    c = lo32(key) + hi32(j) * 0x9E3779B9, all modulo 2^32."""
    s0, s1 = (int(s) & _MASK64 for s in seed)
    key = _finalize(s0 ^ _finalize(s1))
    j = np.arange(first, first + n, dtype=np.uint64)
    step, low_key = np.uint32((key >> 32) | 1), np.uint32(key & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        offset = low_key + (j >> np.uint64(32)).astype(np.uint32) * np.uint32(0x9E3779B9)
        state = (j & np.uint64(0xFFFFFFFF)).astype(np.uint32) * step + offset
        return (_mix32(state) >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def qsgd_codes(x, norms, seed, bits, bucket_size):
    """QSGD's sign-level codes of float32 `x` (see `tfgc_ops.qsgd_encode`), unpacked."""
    x = np.asarray(x, np.float32)
    levels = np.float32(2 ** (bits - 1) - 1)
    norm = np.repeat(np.asarray(norms, np.float32), bucket_size)[:x.size]
    usable = (norm > 0) & np.isfinite(norm)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        safe = np.where(usable, norm, np.float32(1))
        subnormal = float(levels) / safe.astype(np.float64) > np.finfo(np.float32).max
        factor = np.where(subnormal, np.float32(0), levels / safe).astype(np.float32)
        t = np.where(subnormal, np.abs(x) / safe * levels, np.abs(x) * factor)
        t = np.minimum(t, levels)
    t = np.where(usable, t, np.float32(0))
    lower = np.floor(t)
    level = np.minimum(lower + (uniform_draws(seed, x.size) < t - lower), levels)
    level = np.where(usable, level, 0).astype(np.int32)
    return ((x < 0).astype(np.int32) << (bits - 1)) | level


def qsgd_values(codes, norms, bits, bucket_size):
    """The float32 values of QSGD `codes` with bucket `norms`."""
    codes = np.asarray(codes, np.int32)
    levels = np.float32(2 ** (bits - 1) - 1)
    level = (codes & ((1 << (bits - 1)) - 1)).astype(np.float32)
    signed = np.where(codes >> (bits - 1) > 0, -level, level)
    norm = np.repeat(np.asarray(norms, np.float32), bucket_size)[:codes.size]
    with np.errstate(invalid="ignore"):  # 0 * an unusable (infinite) norm is NaN, as sent
        return (signed / levels * norm).astype(np.float32)


def stochastic_ternary(x, scale, seed):
    """The stochastic 3-values of float32 `x` (see `tfgc_ops.stochastic_ternary_fold`)."""
    x = np.asarray(x, np.float32)
    if not scale > 0:
        return np.zeros(x.size, np.int8)
    keep = uniform_draws(seed, x.size) < np.abs(x) * (np.float32(1) / np.float32(scale))
    return np.where(keep, np.sign(x), 0).astype(np.int8)


def log_levels_codes(x, bits, largest=None):
    """LogQuant's (int32 sign-level codes, full-scale exponent fsr) of float32 `x`, as
    `tfgc_ops.log_levels_encode(x, largest, bits)` computes them: fsr is the least k with
    2^k >= largest (0 unless largest > 0 and finite), round(log2 |x|) is exact (the
    significand against sqrt(1/2) in float64), the sign bit is x's own (np.signbit).
    `largest` defaults to max|x|, NaN when a value is not finite (as `largest_magnitude`)."""
    x = np.asarray(x, np.float32).ravel()
    magnitude = np.abs(x).astype(np.float64)
    finite = np.isfinite(x)
    if largest is None:
        largest = magnitude.max() if finite.all() and x.size else (np.nan if x.size else 0.0)
    largest = float(np.float32(largest))
    full_scale = 0
    if np.isfinite(largest) and largest > 0:
        significand, exponent = np.frexp(largest)
        full_scale = int(exponent) - 1 if significand == 0.5 else int(exponent)
    significand, exponent = np.frexp(np.where(finite, magnitude, 0.0))
    rounded = np.where(significand >= np.sqrt(0.5), exponent, exponent - 1)
    level = full_scale - rounded + 1
    levels = 2 ** (bits - 1) - 1
    level = np.where(finite & (magnitude > 0) & (level >= 1) & (level <= levels), level, 0)
    return (level | np.signbit(x).astype(np.int64) << (bits - 1)).astype(np.int32), full_scale


def log_levels_values(codes, scale, bits):
    """LogQuant's float32 values of sign-level `codes` (see `tfgc_ops.log_levels_decode`)."""
    codes = np.asarray(codes, np.int32)
    level = codes & ((1 << (bits - 1)) - 1)
    scale = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        magnitude = np.where(level > 0, scale * np.ldexp(np.float32(1), 1 - level), np.float32(0))
    magnitude = magnitude.astype(np.float32) if np.isfinite(scale) else np.full(codes.shape, scale)
    return np.where(codes >> (bits - 1) > 0, -magnitude, magnitude).astype(np.float32)
