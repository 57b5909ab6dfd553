"""The quantizers' one-pass ops against the numpy reference, and their input checks:
stochastic rounding (QSGD's codes, 3LC's stochastic 3-values), LogQuant's encoder and
decoder, OneBit's sign bits, and FastSGD's filter and row sums."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc_ops
import reference_ops as ref

SIZES = [0, 1, 7, 8, 9, 4099, 100_003]
SEED = [123456789012, -5]


def values(rng, size):
    return (rng.standard_t(3, size) * 1e-3).astype(np.float32)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket", [1, 7, 512])
def test_qsgd_ops_match_the_reference(rng, size, bits, bucket):
    x = values(rng, size)
    norms = tfgc_ops.qsgd_norms(x, bucket).numpy()
    naive = [np.sqrt(np.sum(x[i:i + bucket].astype(np.float64) ** 2)) for i in range(0, size, bucket)]
    np.testing.assert_allclose(norms, np.array(naive, np.float32), rtol=1e-6)
    if norms.size > 8:  # buckets that send level 0, and a tiny norm (levels near the top)
        norms[3], norms[4], norms[5], norms[6], norms[7] = 0, np.nan, np.inf, 1e-30, -1
    packed = tfgc_ops.qsgd_encode(x, norms, SEED, bits, bucket).numpy()
    codes = ref.qsgd_codes(x, norms, SEED, bits, bucket)
    np.testing.assert_array_equal(packed, ref.pack_bits(codes, bits))
    decoded = tfgc_ops.qsgd_decode(packed, norms, size, bits, bucket).numpy()
    np.testing.assert_array_equal(decoded, ref.qsgd_values(codes, norms, bits, bucket))


@pytest.mark.parametrize("size", SIZES)
def test_stochastic_ternary_fold_matches_the_reference(rng, size):
    x = values(rng, size)
    largest = float(np.abs(x).max()) if size else 1.0
    for scale in (largest, largest / 3, 0.0, float("nan")):
        fold = tfgc_ops.stochastic_ternary_fold(x, scale, SEED).numpy()
        expected = ref.quartic_encode(ref.stochastic_ternary(x, scale, SEED))
        np.testing.assert_array_equal(fold, expected)
        unfolded = tfgc_ops.quartic_unfold(fold, size, 1.0).numpy()
        np.testing.assert_array_equal(unfolded, ref.stochastic_ternary(x, scale, SEED))


def test_draws_are_uniform_and_depend_on_the_seed_only():
    u = ref.uniform_draws([3, 4], 1_000_000)
    assert 0.0 <= u.min() and u.max() < 1.0
    counts = np.histogram(u, bins=100, range=(0, 1))[0]
    # 10,000 expected per bin: a binomial standard deviation of ~99.5; allow 6 of them.
    assert np.abs(counts - 10_000).max() < 600, counts
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01  # neighbours independent
    assert not np.array_equal(u[:1000], ref.uniform_draws([3, 5], 1000))
    assert not np.array_equal(u[:1000], ref.uniform_draws([4, 4], 1000))
    # Through the op: the same seed, the same bytes, eagerly and traced.
    x = np.linspace(-1, 1, 1001, dtype=np.float32)
    traced = tf.function(lambda x: tfgc_ops.stochastic_ternary_fold(x, 1.0, SEED))
    np.testing.assert_array_equal(traced(x).numpy(),
                                  tfgc_ops.stochastic_ternary_fold(x, 1.0, SEED).numpy())


def test_stochastic_rounding_is_unbiased():
    # Level probabilities are exact to 2^-24: the mean of many roundings is the value.
    x = np.array([0.3, -0.7, 0.05, 1.0, 0.0], np.float32)
    norms = np.array([1.0], np.float32)
    total = np.zeros(5)
    for s in range(2000):
        packed = tfgc_ops.qsgd_encode(x, norms, [s, 1], 2, 8)
        total += tfgc_ops.qsgd_decode(packed, norms, 5, 2, 8).numpy()
    np.testing.assert_allclose(total / 2000, x, atol=5 * 0.5 / np.sqrt(2000))


def test_qsgd_decode_checks_sizes_before_allocating():
    norms = np.ones(1, np.float32)
    packed = np.zeros(3, np.uint8)  # 6 codes of 4 bits
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not hold exactly 7 codes"):
        tfgc_ops.qsgd_decode(packed, norms, 7, 4, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not hold exactly"):
        tfgc_ops.qsgd_decode(packed, norms, 2**62, 4, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not hold exactly"):
        tfgc_ops.qsgd_decode(packed, norms, -1, 4, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="need 2 norms, got 1"):
        tfgc_ops.qsgd_decode(packed, norms, 6, 4, 4)
    assert tfgc_ops.qsgd_decode(packed, norms, 6, 4, 512).numpy().tolist() == [0.0] * 6


def test_ops_refuse_bad_input():
    x = np.ones(10, np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="need 1 norms, got 2"):
        tfgc_ops.qsgd_encode(x, np.ones(2, np.float32), SEED, 4, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="seed must be 2 int64"):
        tfgc_ops.qsgd_encode(x, np.ones(1, np.float32), [1, 2, 3], 4, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bits must be in"):
        tfgc_ops.qsgd_encode(x, np.ones(1, np.float32), SEED, 9, 512)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bucket_size must be"):
        tfgc_ops.qsgd_norms(x, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
        tfgc_ops.stochastic_ternary_fold(np.ones([2, 5], np.float32), 1.0, SEED)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale must be a scalar"):
        tfgc_ops.stochastic_ternary_fold(x, [1.0, 2.0], SEED)


# --- LogQuant's encoder and decoder (log_levels_encode, log_levels_decode) -----------------


def log_levels_encode(x, bits, largest=None):
    """The op's (codes, decoded values, scale), with the largest magnitude from
    `largest_magnitude` unless given."""
    if largest is None:
        largest = tfgc_ops.largest_magnitude(x)
    packed, decoded, scale = tfgc_ops.log_levels_encode(x, largest, bits)
    codes = tfgc_ops.unpack_bits(packed, bits, np.size(x)).numpy()
    np.testing.assert_array_equal(packed.numpy(), ref.pack_bits(codes, bits))  # zero padding
    decoded = decoded.numpy()
    np.testing.assert_array_equal(  # the receiver's decoding, bit for bit (signed zeros too)
        decoded.view(np.int32),
        tfgc_ops.log_levels_decode(packed, scale, np.size(x), bits).numpy().view(np.int32))
    return codes, decoded, float(scale)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_log_levels_encode_matches_the_reference(rng, size, bits):
    x = values(rng, size)
    if size > 8:  # zeros of both signs, and a value to every side of sqrt(2)'s rounding line
        x[:6] = [0.0, -0.0, np.sqrt(2) * 1e-3, -np.sqrt(2) * 1e-3, 0.0, 0.0]
        x[4:6] = np.nextafter(x[2], [np.float32(0), np.float32(1)])
    codes, _, scale = log_levels_encode(x, bits)
    expected, full_scale = ref.log_levels_codes(x, bits)
    np.testing.assert_array_equal(codes, expected)
    assert scale == 2.0 ** full_scale


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_log_levels_encode_rounds_log2_exactly(bits):
    # Every float32 significand from 1.4142 to 1.4143 around 2^e, both signs, and exact
    # powers of two: round(log2 |x|) switches at sqrt(2), where float32 logarithms err.
    significands = np.arange(np.float32(1.41420), np.float32(1.41430), np.float32(2 ** -23))
    powers = np.float32(2.0) ** np.arange(-6, 1, dtype=np.float32)
    x = np.concatenate([significands * np.float32(0.25), -significands * np.float32(0.125),
                        powers, -powers]).astype(np.float32)
    codes, _, scale = log_levels_encode(x, bits)
    expected, full_scale = ref.log_levels_codes(x, bits)
    np.testing.assert_array_equal(codes, expected)
    assert full_scale == 0 and scale == 1.0  # max|x| = 1 = 2^0 exactly
    near = np.abs(x[:significands.size]) * 4  # in [1.41420, 1.41430): level 2 or 3 below 1
    rounds_up = near.astype(np.float64) > np.sqrt(2.0)
    level = codes[:significands.size] & ((1 << (bits - 1)) - 1)
    np.testing.assert_array_equal(level, np.where(rounds_up, 2, 3) if bits > 2 else 0)


def test_log_levels_encode_full_scale_and_window_edges():
    for largest, full_scale in ((1.0, 0), (1.0000001, 1), (0.75, 0), (0.5, -1), (3e38, 128),
                                (2.0**-126, -126), (2.0**-149, -149), (3 * 2.0**-149, -147)):
        x = np.array([largest, -largest], np.float32)
        codes, decoded, scale = log_levels_encode(x, 4, largest=np.float32(largest))
        assert ref.log_levels_codes(x, 4)[1] == full_scale, largest
        assert scale == np.float32(2.0) ** full_scale if full_scale < 128 else np.isinf(scale)
    # Levels 1..7 of 4 bits: 2^0 .. 2^-6; 2^-7 rounds in, 2^-7.6 rounds out.
    x = np.float32(2.0) ** np.array([0, -1, -6, -6.4, -6.6, -7], np.float32)
    codes, decoded, _ = log_levels_encode(x, 4)
    assert codes.tolist() == [1, 2, 7, 7, 0, 0]
    np.testing.assert_array_equal(decoded, [1.0, 0.5, 2.0**-6, 2.0**-6, 0.0, 0.0])


def test_log_levels_encode_subnormals_and_non_finite_values():
    # Subnormals get their exact levels (TensorFlow's kernels read floats with
    # denormals-are-zero; the op works on the bits), given a largest magnitude.
    tiny = np.array([2.0**-149, -3 * 2.0**-149, 2.0**-140, 2.0**-127, 0.0], np.float32)
    codes, _, _ = log_levels_encode(tiny, 8, largest=np.float32(2.0**-120))
    expected, _ = ref.log_levels_codes(tiny, 8, largest=2.0**-120)
    np.testing.assert_array_equal(codes, expected)
    assert codes.tolist() == [30, 128 | 28, 21, 8, 0]
    # A value that is not finite: NaN scale (so NaN decoded everywhere), fsr 0, level 0
    # for Inf and NaN, each with its own sign bit.
    x = np.array([1.0, -np.inf, np.nan, -2.0, -np.nan, -0.0], np.float32)
    codes, decoded, scale = log_levels_encode(x, 4)
    assert np.isnan(scale) and np.isnan(decoded).all()
    assert codes.tolist() == [1, 8, 0, 8, 8, 8] == ref.log_levels_codes(x, 4)[0].tolist()


def test_log_levels_encode_refuses_bad_input():
    with pytest.raises(tf.errors.InvalidArgumentError, match="bits must be in"):
        tfgc_ops.log_levels_encode(np.ones(4, np.float32), 1.0, 9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="log_levels_encode.*1-D"):
        tfgc_ops.log_levels_encode(np.ones([2, 2], np.float32), 1.0, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="largest must be a scalar"):
        tfgc_ops.log_levels_encode(np.ones(4, np.float32), [1.0, 2.0], 4)


def test_log_levels_encode_blocks_write_their_own_bytes(rng):
    # 600,001 values: three blocks of the op, encoded in parallel, each packing up to its
    # last byte (5 bits: blocks end on byte boundaries) and the short last group.
    x = values(rng, 600_001)
    codes, _, _ = log_levels_encode(x, 5)
    np.testing.assert_array_equal(codes, ref.log_levels_codes(x, 5)[0])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_log_levels_decode_matches_the_reference(rng, size, bits):
    codes = rng.integers(0, 1 << bits, size).astype(np.int32)
    packed = ref.pack_bits(codes, bits)
    # Scales whose every power is a normal float (TensorFlow flushes subnormals to 0).
    for scale in (1.0, 1.5, 2.0**100, 3e38, float("nan"), float("inf"), 0.0, -2.0):
        decoded = tfgc_ops.log_levels_decode(packed, scale, size, bits).numpy()
        np.testing.assert_array_equal(  # bit for bit: signed zeros, NaN's sign
            decoded.view(np.int32), ref.log_levels_values(codes, scale, bits).view(np.int32))


def test_log_levels_decode_checks_sizes_before_allocating():
    packed = np.zeros(3, np.uint8)  # 6 codes of 4 bits
    for n in (7, -1, 2**62):
        with pytest.raises(tf.errors.InvalidArgumentError, match="do not hold exactly"):
            tfgc_ops.log_levels_decode(packed, 1.0, n, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bits must be in"):
        tfgc_ops.log_levels_decode(packed, 1.0, 24, 1)
    assert tfgc_ops.log_levels_decode(packed, 1.0, 6, 4).numpy().tolist() == [0.0] * 6


# --- OneBit's sign bits and side sums (sign_bits_encode) ----------------------------------


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 65_535, 65_536 * 2 + 13])
def test_sign_bits_encode_matches_the_reference(rng, size):
    x = rng.standard_t(3, size).astype(np.float32)
    x[: size // 7] = 0.0  # zeros count as >= 0, as in the reference
    if size > 3:
        x[3] = -0.0
    packed, sums, counts = tfgc_ops.sign_bits_encode(x)
    expected_packed, expected_sums, expected_counts = ref.sign_bits_encode(x)
    np.testing.assert_array_equal(packed.numpy(), expected_packed)
    np.testing.assert_array_equal(counts.numpy(), expected_counts)
    np.testing.assert_allclose(sums.numpy(), expected_sums, rtol=1e-12, atol=1e-300)
    # The bits are what pack_bits makes of 1-bit codes.
    np.testing.assert_array_equal(packed.numpy(), tfgc_ops.pack_bits((x >= 0).astype(np.int32), 1))


def test_sign_bits_sums_neither_overflow_nor_hide_non_finite_values():
    big = np.full(1000, 3.0e38, np.float32)  # a float32 sum would be inf
    _, sums, counts = tfgc_ops.sign_bits_encode(np.concatenate([big, -big]))
    np.testing.assert_allclose(sums.numpy(), [3.0e41, -3.0e41], rtol=1e-6)
    np.testing.assert_array_equal(counts.numpy(), [1000, 1000])
    _, sums, counts = tfgc_ops.sign_bits_encode(np.array([1.0, np.nan, -2.0], np.float32))
    assert sums.numpy()[0] == 1.0 and np.isnan(sums.numpy()[1])  # NaN is on the other side
    np.testing.assert_array_equal(counts.numpy(), [1, 2])
    _, sums, _ = tfgc_ops.sign_bits_encode(np.array([np.inf, 1.0], np.float32))
    assert np.isinf(sums.numpy()[0])


def test_sign_bits_sums_do_not_depend_on_the_thread_count(run_python):
    # Blocks of fixed size are summed in block order: 1 and 4 threads give the same bits.
    script = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tfgc_ops
x = np.random.default_rng(5).standard_t(3, 1_000_003).astype(np.float32)
print(tfgc_ops.sign_bits_encode(x)[1].numpy().tobytes().hex())
"""
    assert run_python(script, 120, ["1"]) == run_python(script, 120, ["4"])


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 65_535, 65_536 * 2 + 13])
def test_momentum_sign_bits_encode_is_the_update_then_its_sign_bits(rng, size):
    # Signum's step: beta * momentum + x rounded as numpy's float32 multiply then add
    # round it (no fused multiply-add), then sign_bits_encode of it, bit for bit.
    momentum = (rng.standard_t(3, size) * 1e3).astype(np.float32)
    x = values(rng, size)
    x[: size // 7] = 0.0
    momentum[: size // 5] = 0.0
    if size > 3:
        x[3], momentum[3] = -0.0, -0.0
    for beta in (0.9, 0.0, 0.999):
        updated, packed, sums, counts = tfgc_ops.momentum_sign_bits_encode(momentum, x, beta)
        expected = np.float32(beta) * momentum + x
        np.testing.assert_array_equal(updated.numpy().view(np.uint32), expected.view(np.uint32))
        expected_packed, expected_sums, expected_counts = tfgc_ops.sign_bits_encode(expected)
        np.testing.assert_array_equal(packed.numpy(), expected_packed.numpy())
        np.testing.assert_array_equal(sums.numpy().view(np.uint64),
                                      expected_sums.numpy().view(np.uint64))
        np.testing.assert_array_equal(counts.numpy(), expected_counts.numpy())
        np.testing.assert_array_equal(packed.numpy(), ref.sign_bits_encode(expected)[0])


def test_momentum_sign_bits_encode_passes_non_finite_values_on_and_checks_its_inputs():
    momentum = np.array([1.0, 3.0e38, -1.0, 0.0, np.nan], np.float32)
    x = np.array([1.0, 3.0e38, np.inf, -0.0, 1.0], np.float32)
    updated, packed, sums, counts = tfgc_ops.momentum_sign_bits_encode(momentum, x, 0.5)
    np.testing.assert_array_equal(updated.numpy(), [1.5, np.inf, np.inf, 0.0, np.nan])
    assert np.isinf(sums.numpy()[0]) and np.isnan(sums.numpy()[1])
    np.testing.assert_array_equal(counts.numpy(), [4, 1])
    np.testing.assert_array_equal(packed.numpy(), [0b11110000])
    with pytest.raises(tf.errors.InvalidArgumentError, match="momentum has 4 values, x 5"):
        tfgc_ops.momentum_sign_bits_encode(momentum[:4], x, 0.5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="1-D|rank"):
        tfgc_ops.momentum_sign_bits_encode(np.zeros([2, 2], np.float32),
                                           np.zeros([2, 2], np.float32), 0.5)


def test_sign_bits_encode_refuses_what_is_not_a_vector():
    with pytest.raises(tf.errors.InvalidArgumentError, match="sign_bits_encode.*1-D"):
        tfgc_ops.sign_bits_encode(np.zeros([2, 2], np.float32))


# --- Sparsify's and TopK's selection (magnitude_select) -----------------------------------


def layouts(rng, size):
    """Values the selection must handle: heavy tails, ties and zeros, every exponent with
    non-finite values among them, subnormals, and a column-structured matrix."""
    tails = values(rng, size)
    ties = rng.integers(-2, 3, size).astype(np.float32)
    spread = (np.ldexp(1.0, -rng.integers(0, 149, size)) * rng.choice([-1, 1], size)).astype(np.float32)
    spread[rng.random(size) < 0.03] = np.nan
    spread[rng.random(size) < 0.03] = -np.inf
    tiny = np.where(rng.random(size) < 0.5, 0, rng.standard_normal(size) * 1e-40).astype(np.float32)
    columns = np.tile(np.where(np.arange(64) % 16 == 0, 10.0, 1.0), size // 64 + 1)[:size]
    return [tails, ties, spread, tiny, (columns * rng.random(size)).astype(np.float32)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("non_finite_in_wanted", [False, True])
def test_magnitude_select_matches_the_reference(rng, size, non_finite_in_wanted):
    for x in layouts(rng, size):
        for wanted in {-1, 0, 1, size // 100, size // 20, size // 2, size, size + 3}:
            keep = ref.magnitude_select(x, wanted, non_finite_in_wanted)
            bitmap, kept, dense = tfgc_ops.magnitude_select(
                x, wanted, non_finite_in_wanted=non_finite_in_wanted)
            np.testing.assert_array_equal(bitmap.numpy(), np.packbits(keep))
            np.testing.assert_array_equal(kept.numpy(), x[keep])  # NaNs compare equal here
            np.testing.assert_array_equal(dense.numpy(), np.where(keep, x, np.float32(0)))
            indices, kept, _ = tfgc_ops.magnitude_select(
                x, wanted, positions="indices", non_finite_in_wanted=non_finite_in_wanted)
            np.testing.assert_array_equal(indices.numpy(), np.flatnonzero(keep))
            np.testing.assert_array_equal(kept.numpy(), x[keep])


# From 2^20 values the AVX2 selection predicts the threshold from a sample (one value at
# a hashed offset in each stride) and reads the values once (falling back to the histograms where the sample misleads).
BRACKETED_SIZE = (1 << 20) + 13


def misleading_samples(rng, size):
    """Tensors that a sample may mislead about the values that decide the threshold:
    large values everywhere but at multiples of the sample's stride, ten huge ones, and
    tiled gradients (many values equal, repeating with a period that divides the
    stride: a sample at multiples of the stride would see a few of them)."""
    stride = size // 32768
    period = np.where(np.arange(size) % stride == 0, 1e-6, 1.0).astype(np.float32)
    spikes = values(rng, size)
    spikes[rng.choice(size, 10, replace=False)] = 1e3
    return [(period * rng.random(size)).astype(np.float32), spikes] + tiled(rng, size)


def tiled(rng, size):
    """Tie-heavy tensors: 4096 gradient values tiled, and 64 values tiled."""
    return [np.resize(values(rng, period), size) for period in (4096, 64)]


@pytest.mark.parametrize("non_finite_in_wanted", [False, True])
def test_magnitude_select_from_a_sample_matches_the_reference(rng, non_finite_in_wanted):
    size = BRACKETED_SIZE
    for x in layouts(rng, size) + misleading_samples(rng, size):
        for wanted in (-3, 0, 1, 10, size // 100, size // 20, size // 2, size, size + 3):
            keep = ref.magnitude_select(x, wanted, non_finite_in_wanted)
            bitmap, kept, _ = tfgc_ops.magnitude_select(
                x, wanted, non_finite_in_wanted=non_finite_in_wanted)
            np.testing.assert_array_equal(bitmap.numpy(), np.packbits(keep))
            np.testing.assert_array_equal(kept.numpy(), x[keep])


_CODEC_LOOPS = """
import sys
import numpy as np
import tfgc_ops
data = np.load(sys.argv[1])
x, big, tiled = data["x"], data["big"], data["tiled"]
out = {}
out["sign_bits"] = np.concatenate([t.numpy().view(np.uint8) for t in tfgc_ops.sign_bits_encode(x)])
out["momentum_sign_bits"] = np.concatenate(
    [t.numpy().view(np.uint8) for t in tfgc_ops.momentum_sign_bits_encode(big[: x.size], x, 0.9)])
for bits in (2, 4, 8):
    for bucket in (7, 512):
        norms = tfgc_ops.qsgd_norms(x, bucket)
        out[f"qsgd{bits}_{bucket}"] = tfgc_ops.qsgd_encode(x, norms, [5, 6], bits, bucket).numpy()
    out[f"pack{bits}"] = tfgc_ops.pack_bits(data["codes"] % 2**bits, bits).numpy()
for name, t in (("x", x), ("big", big), ("tiled", tiled)):
    for wanted in (1, t.size // 100, t.size // 20):
        bitmap, kept, dense = tfgc_ops.magnitude_select(t, wanted)
        indices = tfgc_ops.magnitude_select(t, wanted, positions="indices")[0]
        expanded = tfgc_ops.bitmap_expand(bitmap, kept, t.size)
        out[f"select_{name}_{wanted}"] = np.concatenate(
            [bitmap.numpy().view(np.uint8), kept.numpy().view(np.uint8),
             dense.numpy().view(np.uint8), indices.numpy().view(np.uint8),
             expanded.numpy().view(np.uint8)])
np.savez(sys.argv[2], **out)
"""


def test_codec_loops_capped_to_sse2_write_what_the_avx2_loops_write(rng, tmp_path, run_python):
    # TFGC_CODEC_ISA=sse2 makes a process take the loops that CPUs without AVX2 run
    # (QSGD's codes, 4- and 8-bit packing, the sign bits and their sums, Signum's step,
    # the selection and its write pass, on a tie-heavy tiled gradient too): the same
    # bytes as this process's loops, whichever those are.
    x = values(rng, 100_003)
    x[rng.random(x.size) < 0.01] = np.nan
    big = values(rng, BRACKETED_SIZE)
    codes = rng.integers(0, 256, 100_003).astype(np.int32)
    np.savez(tmp_path / "data.npz", x=x, big=big, codes=codes, tiled=tiled(rng, BRACKETED_SIZE)[0])
    capped = tmp_path / "capped.npz"
    run_python(_CODEC_LOOPS, timeout=120, args=[tmp_path / "data.npz", capped],
               env={"TFGC_CODEC_ISA": "sse2"})
    own = tmp_path / "own.npz"
    run_python(_CODEC_LOOPS, timeout=120, args=[tmp_path / "data.npz", own])
    capped, own = np.load(capped), np.load(own)
    assert sorted(capped.files) == sorted(own.files)
    for name in own.files:
        np.testing.assert_array_equal(capped[name], own[name], err_msg=name)


def test_magnitude_select_takes_ties_in_position_order_and_never_zeros():
    x = np.array([0.0, -3.0, 1.0, 3.0, -0.0, 3.0, 2.0, np.nan], np.float32)
    indices = lambda wanted, **kw: tfgc_ops.magnitude_select(  # noqa: E731
        x, wanted, positions="indices", **kw)[0].numpy().tolist()
    assert indices(2) == [1, 3, 7]  # the first two of the three tied at 3, and the NaN
    assert indices(2, non_finite_in_wanted=True) == [1, 7]
    assert indices(100) == [1, 2, 3, 5, 6, 7]  # zeros, of either sign, never
    assert indices(0) == [7]


@pytest.mark.parametrize("size", SIZES)
def test_bitmap_expand_inverts_the_selection(rng, size):
    for x in layouts(rng, size):
        bitmap, kept, dense = tfgc_ops.magnitude_select(x, size // 20)
        np.testing.assert_array_equal(tfgc_ops.bitmap_expand(bitmap, kept, size).numpy(),
                                      dense.numpy())


@pytest.mark.parametrize("size", [1, 8, 63, 64, 65, 1001, 100_003])
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 0.97, 1.0])
def test_bitmap_expand_of_any_bitmap_matches_numpy(rng, size, density):
    # Any bits and any float bits (NaN payloads, -0.0) come back exactly where selected.
    selected = rng.random(size) < density
    kept = rng.integers(0, 2**32, int(selected.sum()), dtype=np.uint32).view(np.float32)
    expected = np.zeros(size, np.float32)
    expected[selected] = kept
    dense = tfgc_ops.bitmap_expand(np.packbits(selected), kept, size).numpy()
    np.testing.assert_array_equal(dense.view(np.uint32), expected.view(np.uint32))


def test_bitmap_expand_refuses_sizes_that_disagree():
    bitmap = np.packbits([1, 0, 1, 0, 0, 0, 0, 0, 1]).astype(np.uint8)  # 2 bytes, 3 bits set
    values = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(tfgc_ops.bitmap_expand(bitmap, values, 9).numpy(),
                                  [1, 0, 2, 0, 0, 0, 0, 0, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="selects 2 values"):
        tfgc_ops.bitmap_expand(bitmap[:1], values, 8)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="2 bytes do not hold exactly 7 codes of 1 bits"):
        tfgc_ops.bitmap_expand(bitmap, values[:2], 7)
    with pytest.raises(tf.errors.InvalidArgumentError, match="selects 3 values"):
        tfgc_ops.bitmap_expand(bitmap, values[:2], 9)
    padded = np.array([0b10100000, 0b11111111], np.uint8)  # bits past n = 9 do not count
    np.testing.assert_array_equal(tfgc_ops.bitmap_expand(padded, values, 9).numpy(),
                                  [1, 0, 2, 0, 0, 0, 0, 0, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="bytes"):
        tfgc_ops.bitmap_expand(bitmap, values, -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bytes"):  # n + 7 overflows
        tfgc_ops.bitmap_expand(bitmap, values, 2**63 - 1)


@pytest.mark.parametrize("size", SIZES)
def test_positions_expand_inverts_the_selection(rng, size):
    for x in layouts(rng, size):
        positions, kept, dense = tfgc_ops.magnitude_select(x, size // 20, positions="indices")
        np.testing.assert_array_equal(tfgc_ops.positions_expand(positions, kept, size).numpy(),
                                      dense.numpy())


def test_positions_expand_refuses_positions_out_of_order_or_range():
    values = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(tfgc_ops.positions_expand([0, 4, 6], values, 7).numpy(),
                                  [1, 0, 0, 0, 2, 0, 3])
    np.testing.assert_array_equal(tfgc_ops.positions_expand([], [], 3).numpy(), [0, 0, 0])
    for positions, n in (([0, 4, 7], 7), ([-1, 4, 6], 7), ([0, 4, 4], 7), ([4, 0, 6], 7),
                         ([0, 1, 2], 2), ([0, 1, 2], -1)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="positions_expand"):
            tfgc_ops.positions_expand(positions, values, n)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 positions but 2 values"):
        tfgc_ops.positions_expand([0, 1, 2], values[:2], 7)


def test_magnitude_select_checks_its_inputs():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        tfgc_ops.magnitude_select(np.ones([2, 3], np.float32), 1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        tfgc_ops.magnitude_select(np.ones(3, np.float32), [1, 2])
    with pytest.raises(ValueError, match="positions"):
        tfgc_ops.magnitude_select(np.ones(3, np.float32), 1, positions="mask")


# --- FastSGD's threshold filter (magnitude_filter) ----------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("size", [0, 1, 9, 65_536 * 2 + 5])
@pytest.mark.parametrize("factor", [0.0, 1.1**-128, 1e-6, 0.5])
def test_magnitude_filter_matches_the_reference(rng, dtype, size, factor):
    v = rng.standard_t(3, size).astype(dtype)
    v[rng.random(size) < 0.3] = 0  # zeros never pass, even with a zero factor
    total, positions = tfgc_ops.magnitude_filter(v, factor)
    expected_total, expected_positions = ref.magnitude_filter(
        v.astype(np.float32) if dtype == np.float16 else v, factor)
    assert float(total) == pytest.approx(expected_total, rel=1e-12, abs=0)
    np.testing.assert_array_equal(positions.numpy(), expected_positions)


def test_magnitude_filter_reports_non_finite_values():
    v = np.array([1.0, np.inf, -2.0, np.nan, 0.0], np.float32)
    total, positions = tfgc_ops.magnitude_filter(v, 1e-3)
    assert np.isnan(float(total))  # and so no finite value passes
    np.testing.assert_array_equal(positions.numpy(), [1, 3])


def test_magnitude_filter_sum_is_the_wire_dtype_and_thread_independent(run_python):
    v = np.full(3, 1.0 + 2.0**-40, np.float64)
    assert float(tfgc_ops.magnitude_filter(v, 0.5)[0]) == 3 * (1.0 + 2.0**-40)
    assert float(tfgc_ops.magnitude_filter(v.astype(np.float32), 0.5)[0]) == 3.0
    script = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tfgc_ops
v = np.random.default_rng(5).standard_t(3, 1_000_003)
print(float(tfgc_ops.magnitude_filter(v, 1e-6)[0]).hex())
"""
    assert run_python(script, 120, ["1"]) == run_python(script, 120, ["4"])


def test_magnitude_filter_refuses_bad_input():
    with pytest.raises(tf.errors.InvalidArgumentError, match="magnitude_filter.*1-D"):
        tfgc_ops.magnitude_filter(np.zeros([2, 2], np.float32), 0.5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="factor"):
        tfgc_ops.magnitude_filter(np.zeros(4, np.float32), [0.5, 0.5])


# --- row sums (FastSGD's encode of tf.IndexedSlices) -------------------------------------

# Each path of the op: indices already ascending, a bitmap of a small range, sorting for a
# range too wide for a bitmap.
ROW_SUMS_CASES = {"ascending": (2**20, True), "bitmap": (2**20, False), "sorting": (2**40, False)}


@pytest.mark.parametrize("case", sorted(ROW_SUMS_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n, row_size", [(0, 3), (1, 1), (5000, 1), (3000, 4), (40, 0)])
def test_row_sums_match_the_reference(rng, case, dtype, index_dtype, n, row_size):
    num_rows, ascending = ROW_SUMS_CASES[case]
    if index_dtype == np.int32:
        num_rows = min(num_rows, 2**31 - 1)
    if ascending:
        indices = np.sort(rng.choice(num_rows, n, replace=False))
    else:  # repeated: a few hundred distinct indices in lookup order
        distinct = rng.choice(num_rows, max(1, n // 10), replace=False)
        indices = distinct[rng.integers(0, distinct.size, n)]
    rows = rng.standard_normal([n, row_size]).astype(dtype)
    distinct, sums = tfgc_ops.row_sums(rows, indices.astype(index_dtype), num_rows)
    expected_distinct, expected_sums = ref.row_sums(rows, indices, num_rows)
    np.testing.assert_array_equal(distinct.numpy(), expected_distinct)
    assert sums.dtype == dtype and sums.shape == (expected_distinct.size, row_size)
    np.testing.assert_array_equal(sums.numpy(), expected_sums)


@pytest.mark.parametrize("num_rows", [10, 2**40])
def test_row_sums_add_in_position_order(num_rows):
    # In float32, (1 + 1e8) - 1e8 is 0 and (-1e8 + 1e8) + 1 is 1: order shows.
    rows = np.array([[1.0], [7.0], [1e8], [-1e8]], np.float32)
    distinct, sums = tfgc_ops.row_sums(rows, np.array([5, 3, 5, 5]), num_rows)
    assert distinct.numpy().tolist() == [3, 5]
    assert sums.numpy().tolist() == [[7.0], [0.0]]


def test_row_sums_refuse_bad_input():
    rows = np.ones([3, 2], np.float32)
    for indices, where in (([0, 7, 1], r"indices\[1\] = 7"), ([0, 1, -1], r"indices\[2\] = -1")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=where + r" is not in \[0, 7\)"):
            tfgc_ops.row_sums(rows, np.array(indices), 7)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 rows but 2 indices"):
        tfgc_ops.row_sums(rows, np.array([0, 1]), 7)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rows must be 2-D"):
        tfgc_ops.row_sums(np.ones(3, np.float32), np.array([0, 1, 2]), 7)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_rows must be >= 0"):
        tfgc_ops.row_sums(np.ones([0, 2], np.float32), np.zeros(0, np.int64), -1)


# --- uniform quantization (value_range, uniform_quantize) ---------------------------------


@pytest.mark.parametrize("size", SIZES + [65_536 * 2 + 5])
def test_value_range_matches_numpy(rng, size):
    x = values(rng, size)
    extremes, finite, sum_squares = tfgc_ops.value_range(x)
    assert bool(finite)
    if size:
        np.testing.assert_array_equal(extremes.numpy(), [x.min(), x.max()])
    else:
        np.testing.assert_array_equal(extremes.numpy(), [np.inf, -np.inf])
    np.testing.assert_allclose(float(sum_squares), np.sum(x.astype(np.float64) ** 2), rtol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 5, 8, 65_536 + 3])  # in a group of 8, the tail, a later block
def test_value_range_sees_every_non_finite_value(bad, where):
    x = np.ones(65_536 + 4, np.float32)
    x[where] = bad
    assert not bool(tfgc_ops.value_range(x)[1])


def test_value_range_sums_do_not_overflow_or_depend_on_the_thread_count(run_python):
    huge = np.full(1000, 3e38, np.float32)
    assert np.isclose(float(tfgc_ops.value_range(huge)[2]), 1000 * 3e38 ** 2, rtol=1e-6)
    script = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
import tfgc_ops
x = np.random.default_rng(5).standard_t(3, 1_000_003).astype(np.float32)
print(np.float64(tfgc_ops.value_range(x)[2].numpy()).tobytes().hex())
"""
    assert run_python(script, 120, ["1"]) == run_python(script, 120, ["4"])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 7, 8])
def test_uniform_quantize_matches_the_reference(rng, size, bits):
    x = values(rng, size)
    low = float(x.min()) if size else 0.0
    step = (float(x.max()) - low) / (2**bits - 1) if size else 0.0
    # The range's own step, one that clamps most values, a zero step (divides by 1), and a
    # NaN low (every code 0, every reconstruction NaN).
    for low_, step_ in ((low, step), (low, step / 50), (low, 0.0), (float("nan"), step)):
        packed, reconstructed = tfgc_ops.uniform_quantize(x, low_, step_, bits)
        codes = ref.uniform_codes(x, low_, step_, bits)
        np.testing.assert_array_equal(packed.numpy(), ref.pack_bits(codes, bits))
        np.testing.assert_array_equal(reconstructed.numpy(),
                                      ref.uniform_reconstruction(codes, low_, step_))


def test_uniform_quantize_rounds_ties_to_even_and_codes_nan_as_zero():
    x = np.array([0.5, 1.5, 2.5, -0.4, 3.6, np.nan, np.inf, -np.inf, 2.5], np.float32)
    packed, _ = tfgc_ops.uniform_quantize(x, 0.0, 1.0, 2)
    np.testing.assert_array_equal(tfgc_ops.unpack_bits(packed, 2, x.size).numpy(),
                                  [0, 2, 2, 0, 3, 0, 3, 0, 2])


def test_uniform_quantize_refuses_bad_input():
    x = np.zeros(4, np.float32)
    for bits in (0, 9, -1):
        with pytest.raises(tf.errors.InvalidArgumentError, match="bits must be in"):
            tfgc_ops.uniform_quantize(x, 0.0, 1.0, bits)
    with pytest.raises(tf.errors.InvalidArgumentError, match="uniform_quantize.*1-D"):
        tfgc_ops.uniform_quantize(np.zeros([2, 2], np.float32), 0.0, 1.0, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="value_range.*1-D"):
        tfgc_ops.value_range(np.zeros([2, 2], np.float32))
