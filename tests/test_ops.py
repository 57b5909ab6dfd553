"""tfgc_ops against their numpy reference: identical bytes, validated inputs."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfgc_ops
import reference_ops as reference


def quartic_bytes(rng, n, zero_fraction):
    data = rng.integers(0, 243, n).astype(np.uint8)
    data[rng.random(n) < zero_fraction] = reference.ZERO_GROUP
    return data


# --- zero-run encoding ---------------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [
        ([], []),
        ([121], [121]),  # a lone 121 stays a literal
        ([121, 121], [243]),
        ([121] * 14, [255]),
        ([121] * 15, [255, 121]),
        ([121] * 16, [255, 243]),
        ([121] * 28, [255, 255]),
        ([0, 121, 121, 121, 242, 121], [0, 244, 242, 121]),
    ],
)
def test_zero_run_encode_examples(data, expected):
    got = tfgc_ops.zero_run_encode(np.array(data, np.uint8)).numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(reference.zero_run_encode(data), expected)
    np.testing.assert_array_equal(tfgc_ops.zero_run_decode(got).numpy(), data)


@pytest.mark.parametrize("zero_fraction", [0.0, 0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("n", [1, 7, 1000, 300_000])
def test_zero_run_matches_reference(rng, n, zero_fraction):
    data = quartic_bytes(rng, n, zero_fraction)
    encoded = tfgc_ops.zero_run_encode(data).numpy()
    np.testing.assert_array_equal(encoded, reference.zero_run_encode(data))
    np.testing.assert_array_equal(tfgc_ops.zero_run_decode(encoded).numpy(), data)


def test_zero_run_runs_across_block_boundaries():
    # Blocks are 256 KiB: a run that spans several blocks must encode as one run.
    block = 256 * 1024
    data = np.full(3 * block + 17, 121, np.uint8)
    data[block - 5] = 7
    data[2 * block + 3] = 9
    encoded = tfgc_ops.zero_run_encode(data).numpy()
    np.testing.assert_array_equal(encoded, reference.zero_run_encode(data))
    assert encoded.size < data.size / 13


def test_zero_run_encode_rejects_non_quartic_bytes():
    data = np.array([1, 2, 243, 4], np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="byte 2 is 243"):
        tfgc_ops.zero_run_encode(data)


def test_zero_run_rejects_non_vectors():
    for op in (tfgc_ops.zero_run_encode, tfgc_ops.zero_run_decode):
        with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
            op(np.zeros([2, 2], np.uint8))


def test_zero_run_in_tf_function():
    f = tf.function(lambda x: tfgc_ops.zero_run_decode(tfgc_ops.zero_run_encode(x)))
    data = np.array([121] * 40 + [3], np.uint8)
    np.testing.assert_array_equal(f(data).numpy(), data)


def test_zero_run_decode_sizes_long_runs():
    encoded = np.full(100_000, 255, np.uint8)
    assert tfgc_ops.zero_run_decode(encoded).shape == (1_400_000,)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_zero_run_decode_is_total(blob):
    data = np.frombuffer(blob, np.uint8)
    decoded = tfgc_ops.zero_run_decode(data).numpy()
    np.testing.assert_array_equal(decoded, reference.zero_run_decode(data))
    # Decoded bytes are quartic, so they encode again; the greedy encoding is canonical.
    again = tfgc_ops.zero_run_encode(decoded).numpy()
    np.testing.assert_array_equal(again, reference.zero_run_encode(decoded))
    np.testing.assert_array_equal(tfgc_ops.zero_run_decode(again).numpy(), decoded)


def ternary_quartic_bytes(rng, n, nonzero):
    """Quartic bytes of 5n 3-values, each nonzero with probability `nonzero` (3LC's data)."""
    values = rng.choice(3, size=(n, 5), p=[nonzero / 2, 1 - nonzero, nonzero / 2])
    return (values @ np.array([81, 27, 9, 3, 1])).astype(np.uint8)


def test_zero_run_matches_reference_at_every_length_and_density(rng):
    # The SIMD loops stop 16-24 bytes before the end and hand over to the scalar loop:
    # every length up to a few vectors, at densities from sparse (long runs) to dense.
    for nonzero in (0.01, 0.05, 0.15, 0.3, 0.6):
        for n in list(range(0, 80)) + [255, 256, 257, 4099]:
            data = ternary_quartic_bytes(rng, n, nonzero)
            encoded = tfgc_ops.zero_run_encode(data).numpy()
            np.testing.assert_array_equal(encoded, reference.zero_run_encode(data))
            np.testing.assert_array_equal(tfgc_ops.zero_run_decode(encoded).numpy(), data)


@pytest.mark.parametrize("cap", ["scalar", "ssse3"])
def test_zero_run_capped_paths_write_the_same_bytes(cap, rng, tmp_path, monkeypatch,
                                                    run_python):
    # TFGC_ZERO_RUN_ISA=scalar makes a process take the portable loops that CPUs without
    # SSSE3 run, =ssse3 the SSSE3 loops that CPUs without AVX-512 VBMI2 run; they must
    # write what this process's own (best) loops write.
    arrays = {f"p{nonzero}": ternary_quartic_bytes(rng, 100_003, nonzero)
              for nonzero in (0.01, 0.05, 0.15, 0.3, 0.6)}
    arrays["edge"] = np.array([121] * 37 + [0] + [121] * 29 + [242] * 20, np.uint8)
    np.savez(tmp_path / "data.npz", **arrays)
    monkeypatch.setenv("TFGC_ZERO_RUN_ISA", cap)
    run_python(f"""
import numpy as np
import tfgc_ops
data = np.load({str(tmp_path / "data.npz")!r})
out = {{}}
for name in data.files:
    out[name + "_enc"] = tfgc_ops.zero_run_encode(data[name]).numpy()
    out[name + "_dec"] = tfgc_ops.zero_run_decode(out[name + "_enc"]).numpy()
np.savez({str(tmp_path / "capped.npz")!r}, **out)
""", timeout=120)
    capped = np.load(tmp_path / "capped.npz")
    for name, data in arrays.items():
        encoded = tfgc_ops.zero_run_encode(data).numpy()
        np.testing.assert_array_equal(capped[name + "_enc"], encoded)
        np.testing.assert_array_equal(capped[name + "_dec"], data)


# --- key packing ---------------------------------------------------------------------


def test_pack_keys_paper_example():
    # FastSGD Fig. 3: max delta 232 -> M = 8, classes [0,4) [4,16) [16,64) [64,256);
    # a delta of 3 is written '00' + '11'.
    keys = np.array([3, 235], np.int64)  # deltas 3 and 232
    packed = tfgc_ops.pack_keys(keys).numpy()
    assert list(packed[:3]) == [2, 8, 2]  # flag bits, M, count
    assert format(packed[3], "08b")[:4] == "0011"
    np.testing.assert_array_equal(packed, reference.pack_keys(keys))


@pytest.mark.parametrize("flag_bits", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n, density", [(0, 0.1), (1, 0.1), (500, 0.5), (3000, 0.01)])
def test_pack_keys_matches_reference(rng, flag_bits, dtype, n, density):
    universe = max(1, int(n / density))
    keys = np.sort(rng.choice(universe, size=n, replace=False)).astype(dtype)
    packed = tfgc_ops.pack_keys(keys, flag_bits=flag_bits).numpy()
    np.testing.assert_array_equal(packed, reference.pack_keys(keys, flag_bits))
    unpacked = tfgc_ops.unpack_keys(packed).numpy()
    assert unpacked.dtype == np.int64
    np.testing.assert_array_equal(unpacked, keys)


def test_pack_keys_across_blocks_and_extremes(rng):
    # More keys than one 64K block, with huge gaps and the largest int64 key.
    gaps = rng.integers(1, 1000, 200_000).astype(np.int64)
    gaps[::9973] = 2**40
    keys = np.cumsum(gaps)
    keys = np.append(keys, np.iinfo(np.int64).max)
    packed = tfgc_ops.pack_keys(keys).numpy()
    np.testing.assert_array_equal(tfgc_ops.unpack_keys(packed).numpy(), keys)
    small = keys[:3000]
    np.testing.assert_array_equal(
        tfgc_ops.pack_keys(small).numpy(), reference.pack_keys(small)
    )


def test_pack_keys_first_key_zero_and_empty():
    for keys in ([], [0], [0, 1, 2, 3]):
        packed = tfgc_ops.pack_keys(np.array(keys, np.int64)).numpy()
        np.testing.assert_array_equal(packed, reference.pack_keys(keys))
        np.testing.assert_array_equal(tfgc_ops.unpack_keys(packed).numpy(), keys)


@pytest.mark.parametrize(
    "keys, message",
    [
        ([1, 1], "strictly increasing"),
        ([5, 3], "strictly increasing"),
        ([-1, 3], "non-negative"),
    ],
)
def test_pack_keys_rejects_bad_keys(keys, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tfgc_ops.pack_keys(np.array(keys, np.int64))


def test_pack_keys_rejects_bad_arguments():
    with pytest.raises(ValueError, match="flag_bits"):
        tfgc_ops.pack_keys([1, 2], flag_bits=6)
    with pytest.raises(TypeError, match="int32 or int64"):
        tfgc_ops.pack_keys(np.array([1.0, 2.0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
        tfgc_ops.pack_keys(np.zeros([2, 2], np.int64))


@pytest.mark.parametrize(
    "packed, message",
    [
        ([], "header"),
        ([2, 8], "header"),
        ([0, 8, 1, 0], "flag bits"),
        ([2, 64, 1, 0], "bit length"),
        ([2, 8, 0x80], "truncated"),
        ([2, 8] + [0xFF] * 9 + [1], "exceeds int64"),
        ([2, 8, 100, 0], "claims 100 keys"),
        ([2, 8, 2, 0b00111100], "end inside entry"),
        ([2, 2, 2, 0b00010001], "delta 0"),
        ([2, 8, 1, 0b00110000, 0], "stray bytes"),
        ([2, 8, 1, 0b00110001], "padding"),
    ],
)
def test_unpack_keys_rejects_malformed(packed, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tfgc_ops.unpack_keys(np.array(packed, np.uint8))
    with pytest.raises(ValueError):
        reference.unpack_keys(np.array(packed, np.uint8))


def test_unpack_keys_rejects_overflow():
    # Two keys of 2^62 + 2^62 + ... : M = 63, deltas near 2^63 overflow int64.
    big = reference.pack_keys([2**62, 2**63 - 1])
    np.testing.assert_array_equal(tfgc_ops.unpack_keys(big).numpy(), [2**62, 2**63 - 1])
    header = [1, 63, 2]
    stream = "1" + "1" * 63 + "1" + "0" * 62 + "1"  # 2^63-1, then +1
    stream += "0" * (-len(stream) % 8)
    body = [int(stream[i : i + 8], 2) for i in range(0, len(stream), 8)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="overflows int64"):
        tfgc_ops.unpack_keys(np.array(header + body, np.uint8))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_unpack_keys_agrees_with_reference_on_any_bytes(blob):
    data = np.frombuffer(blob, np.uint8)
    try:
        expected = reference.unpack_keys(data)
    except ValueError:
        with pytest.raises(tf.errors.InvalidArgumentError):
            tfgc_ops.unpack_keys(data)
        return
    np.testing.assert_array_equal(tfgc_ops.unpack_keys(data).numpy(), expected)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=2**40), max_size=200),
    st.integers(min_value=0, max_value=2**20),
    st.integers(min_value=1, max_value=5),
)
def test_pack_keys_roundtrip_property(gaps, first, flag_bits):
    keys = np.cumsum([first] + gaps).astype(np.int64)
    packed = tfgc_ops.pack_keys(keys, flag_bits=flag_bits).numpy()
    np.testing.assert_array_equal(packed, reference.pack_keys(keys, flag_bits))
    np.testing.assert_array_equal(tfgc_ops.unpack_keys(packed).numpy(), keys)


@pytest.mark.parametrize("op", ["zero_run_encode", "zero_run_decode", "unpack_keys", "unpack_bits"])
@pytest.mark.parametrize("bad", [np.array([300, 5], np.int32), [-1, 5], np.array([1.5]),
                                 tf.constant([3, 5], tf.int32)])
def test_ops_refuse_what_is_not_bytes(op, bad):
    # A silent conversion would wrap 300 to 44 and -1 to 255.
    with pytest.raises(ValueError, match="bytes|uint8"):
        getattr(tfgc_ops, op)(bad, *((1, 2) if op == "unpack_bits" else ()))


def test_ops_take_byte_valued_integers_and_empty_lists():
    assert tfgc_ops.zero_run_decode(np.array([121, 5], np.int64)).numpy().tolist() == [121, 5]
    assert tfgc_ops.zero_run_decode([]).numpy().tolist() == []


@pytest.mark.parametrize("flag_bits", [2.7, True, "2", 0, 6])
def test_pack_keys_refuses_flag_bits_that_are_not_integers_in_range(flag_bits):
    with pytest.raises(ValueError, match="flag_bits"):
        tfgc_ops.pack_keys(tf.constant([1, 2, 3]), flag_bits=flag_bits)


def test_pack_keys_takes_an_integral_float_flag():
    keys = tf.constant([1, 5, 9], tf.int64)
    assert tfgc_ops.unpack_keys(tfgc_ops.pack_keys(keys, flag_bits=2.0)).numpy().tolist() == [1, 5, 9]


def test_unpack_keys_refuses_counts_the_stream_cannot_hold_before_allocating():
    # Header: flag bits 1, delta bit length 0 (no code can carry a delta >= 1, so at
    # most one key is valid), a count of 64 in LEB128, then 8 bytes of stream. The
    # stream's 64 bits would "hold" 64 one-bit entries; only one can be valid.
    packed = np.array([1, 0, 64] + [0] * 8, np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="header claims 64 keys"):
        tfgc_ops.unpack_keys(packed)
    # One key with a 0-bit delta (key 0) is a real packing and still unpacks.
    assert tfgc_ops.unpack_keys(tfgc_ops.pack_keys(tf.constant([0], tf.int64))).numpy().tolist() == [0]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1000, 3 * 64 * 1024 + 5])  # 3 blocks + a tail
def test_pack_bits_matches_reference(rng, bits, n):
    codes = rng.integers(0, 2**bits, size=n).astype(np.int32)
    codes[: min(n, 8)] = 2**bits - 1  # all ones at the start: no bit may leak
    packed = tfgc_ops.pack_bits(codes, bits).numpy()
    np.testing.assert_array_equal(packed, reference.pack_bits(codes, bits))
    assert packed.size == -(-n * bits // 8)
    np.testing.assert_array_equal(tfgc_ops.unpack_bits(packed, bits, n).numpy(), codes)


@pytest.mark.parametrize("codes, bits, message", [
    ([1, 4], 2, "code 1 is 4"), ([-1], 3, "code 0 is -1"),
    # Past the first 32 codes, which the AVX2 loops pack: their check, not the scalar one.
    ([0] * 70 + [16] + [0] * 40, 4, "code 70 is 16"), ([0] * 40 + [-1] + [256] * 3, 8, "code 40 is -1"),
    ([1], 0, r"bits must be in \[1, 8\]"),
    ([1], 9, r"bits must be in \[1, 8\]"), ([[1]], 1, "1-D"),
])
def test_pack_bits_rejects_bad_codes_and_widths(codes, bits, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tfgc_ops.pack_bits(codes, bits)


@pytest.mark.parametrize("size, bits, n", [
    (3, 8, 4),         # too few bytes
    (3, 8, 2),         # too many: a stray byte is not ignored
    (3, 8, -1),
    (12, 3, 2**62),    # would overflow n * bits; refused before allocating
    (1, 0, 1), (1, 9, 1),
])
def test_unpack_bits_checks_the_count_against_the_bytes(size, bits, n):
    with pytest.raises(tf.errors.InvalidArgumentError, match="unpack_bits"):
        tfgc_ops.unpack_bits(np.zeros(size, np.uint8), bits, n)


def test_bits_may_change_between_steps_without_retracing():
    bits = tf.Variable(2)
    traces = []

    @tf.function
    def roundtrip(codes):
        traces.append(1)
        packed = tfgc_ops.pack_bits(codes, bits)
        return packed, tfgc_ops.unpack_bits(packed, bits, tf.size(codes, tf.int64))

    codes = tf.constant([3, 0, 1, 2, 3], tf.int32)
    for width in (2, 5, 8):
        bits.assign(width)
        packed, decoded = roundtrip(codes)
        np.testing.assert_array_equal(packed.numpy(), reference.pack_bits(codes.numpy(), width))
        np.testing.assert_array_equal(decoded.numpy(), codes.numpy())
    assert len(traces) == 1


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=64), bits=st.integers(1, 8))
def test_unpack_bits_agrees_with_reference_on_any_bytes(blob, bits):
    packed = np.frombuffer(blob, np.uint8)
    n = packed.size * 8 // bits
    if -(-n * bits // 8) != packed.size:  # these bytes are no whole packing
        with pytest.raises(tf.errors.InvalidArgumentError):
            tfgc_ops.unpack_bits(packed, bits, n)
        return
    np.testing.assert_array_equal(tfgc_ops.unpack_bits(packed, bits, n).numpy(),
                                  reference.unpack_bits(packed, bits, n))
