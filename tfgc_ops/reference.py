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
