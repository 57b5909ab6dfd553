"""3LC's one-pass quantize-and-fold and unfold ops against the numpy reference."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc_ops
import reference_ops as reference


def ternary(x, scale):
    """The reference quantization: round-half-even(x / M) in [-1, 1], 0 when M <= 0."""
    if not scale > 0:
        return np.zeros(x.size)
    return np.clip(np.round(x / np.float32(scale)), -1, 1)


@pytest.mark.parametrize("n", [0, 1, 4, 5, 6, 9, 10, 11, 1000, 5 * 65536 + 3, 700_001])
@pytest.mark.parametrize("sparsity", [1.0, 1.75])
def test_fold_and_unfold_match_the_reference(rng, n, sparsity):
    x = rng.standard_t(3, n).astype(np.float32)
    scale = np.float32(np.abs(x).max() * sparsity) if n else np.float32(0)
    folded = tfgc_ops.quartic_fold(x, scale).numpy()
    q = ternary(x, scale)
    np.testing.assert_array_equal(folded, reference.quartic_encode(q))
    np.testing.assert_array_equal(tfgc_ops.quartic_unfold(folded, n, scale).numpy(),
                                  (q * scale).astype(np.float32))


def test_fold_rounds_half_to_even_and_clamps():
    x = np.array([0.5, -0.5, 1.5, -1.5, 0.49999997, 2.6, -9.0], np.float32)
    q = [0, 0, 1, -1, 0, 1, -1]
    folded = tfgc_ops.quartic_fold(x, 1.0).numpy()
    np.testing.assert_array_equal(folded, reference.quartic_encode(q))
    # 203 values (41 bytes): the first 32 bytes go through the SSE2 loop, the rest scalar.
    folded = tfgc_ops.quartic_fold(np.resize(x, 203), 1.0).numpy()
    np.testing.assert_array_equal(folded, reference.quartic_encode(np.resize(q, 203)))


@pytest.mark.parametrize("scale", [0.0, -1.0, np.nan])
def test_fold_without_a_usable_scale_sends_zeros(scale):
    folded = tfgc_ops.quartic_fold(np.ones(12, np.float32), scale).numpy()
    assert folded.tolist() == [121, 121, 121]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_largest_magnitude_is_nan_for_a_non_finite_value_anywhere(bad):
    for position in (0, 7, 8, 16, 40):  # the vector body and the scalar tail
        x = np.linspace(-3, 2, 41).astype(np.float32)
        x[position] = bad
        assert np.isnan(tfgc_ops.largest_magnitude(x).numpy())


def test_largest_magnitude(rng):
    for n in (0, 1, 7, 8, 9, 1001):
        x = rng.normal(size=n).astype(np.float32)
        expected = np.abs(x).max() if n else 0.0
        assert tfgc_ops.largest_magnitude(x).numpy() == expected
    assert tfgc_ops.largest_magnitude(-np.zeros(3, np.float32)).numpy() == 0.0


@pytest.mark.parametrize("size, n", [(3, 16), (3, 10), (0, 1), (1, 0), (2, -1)])
def test_unfold_checks_the_count_against_the_bytes_first(size, n):
    with pytest.raises(tf.errors.InvalidArgumentError, match="do not hold"):
        tfgc_ops.quartic_unfold(np.full(size, 121, np.uint8), n, 1.0)


def test_unfold_refuses_bytes_above_242():
    with pytest.raises(tf.errors.InvalidArgumentError, match="byte 1 is 243"):
        tfgc_ops.quartic_unfold(np.array([121, 243], np.uint8), 10, 1.0)


def test_ops_reject_non_vectors():
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
        tfgc_ops.quartic_fold(np.ones([2, 5], np.float32), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale must be a scalar"):
        tfgc_ops.quartic_fold(np.ones(5, np.float32), [1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
        tfgc_ops.largest_magnitude(np.ones([2, 2], np.float32))


# --- the batch ops: many tensors laid end to end, one call ---------------------------------

SIZES = [0, 1, 7, 5 * 64 * 1024 + 3, 12, 5 * 64 * 1024 * 2 + 11]  # pieces across blocks


def test_batch_ops_equal_the_ops_on_each_tensor(rng):
    xs = [rng.standard_t(3, n).astype(np.float32) for n in SIZES]
    xs[2][3] = np.nan  # a tensor with a non-finite value: its M is NaN, its 3-values 0
    xs[4][:] = 0  # an all-zero tensor: M = 0
    flat = np.concatenate(xs)
    largest = tfgc_ops.batch_largest_magnitude(flat, SIZES).numpy()
    alone = [tfgc_ops.largest_magnitude(x).numpy() for x in xs]
    np.testing.assert_array_equal(largest, alone)
    scales = largest * 1.5
    folded = tfgc_ops.batch_quartic_fold(flat, scales, SIZES).numpy()
    folded_alone = [tfgc_ops.quartic_fold(x, s).numpy() for x, s in zip(xs, scales)]
    np.testing.assert_array_equal(folded, np.concatenate(folded_alone))
    values = tfgc_ops.batch_quartic_unfold(folded, scales, SIZES).numpy()
    values_alone = [tfgc_ops.quartic_unfold(f, x.size, s).numpy()
                    for f, x, s in zip(folded_alone, xs, scales)]
    np.testing.assert_array_equal(values, np.concatenate(values_alone))


def test_batch_ops_check_their_inputs_against_the_sizes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch_largest_magnitude: 9 values"):
        tfgc_ops.batch_largest_magnitude(np.zeros(9, np.float32), [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch_quartic_fold: 9 values"):
        tfgc_ops.batch_quartic_fold(np.zeros(9, np.float32), [1.0, 1.0], [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one scale per tensor"):
        tfgc_ops.batch_quartic_fold(np.zeros(8, np.float32), [1.0], [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one scale per tensor"):
        tfgc_ops.batch_quartic_unfold(np.full(2, 121, np.uint8), [1.0, 1.0, 1.0], [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 bytes do not hold"):
        tfgc_ops.batch_quartic_unfold(np.full(3, 121, np.uint8), [1.0, 1.0], [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="quartic-encoded bytes"):
        tfgc_ops.batch_quartic_unfold(np.array([121, 243], np.uint8), [1.0, 1.0], [4, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="sizes must be >= 0"):
        tfgc_ops.batch_quartic_unfold(np.zeros(0, np.uint8), [1.0], [-5])
