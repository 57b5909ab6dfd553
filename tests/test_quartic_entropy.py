"""The quartic entropy coder: byte-identical to its numpy reference, exact round trips,
near the entropy of its model, and clear errors for anything that is not an encoding."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfgc_ops
import reference_ops as reference

encode, decode = tfgc_ops.quartic_entropy_encode, tfgc_ops.quartic_entropy_decode


def ternary_bytes(rng, n_values, nonzero_share):
    """Quartic bytes of n_values independent 3-values, each nonzero with the given share."""
    values = (rng.random(n_values) < nonzero_share) * rng.choice([-1, 1], n_values)
    return reference.quartic_encode(values)


def iid_entropy_bytes(quartic):
    """The model's ideal size in bytes: -log2 P of every 3-value under its own share."""
    counts = np.array([reference.nonzero_count(b) for b in range(243)])[quartic]
    p = counts.sum() / (5 * quartic.size)
    if p == 0:
        return 0.0
    bits = -(counts * np.log2(p / 2) + (5 - counts) * np.log2(1 - p)).sum()
    return bits / 8


@pytest.mark.parametrize("share", [0.0, 0.001, 0.02, 0.3, 2 / 3, 0.95, 1.0])
@pytest.mark.parametrize("sizes", [[0], [1], [7], [400], [5, 0, 300, 1], [0, 0]])
def test_matches_the_reference_and_round_trips(rng, share, sizes):
    quartic = ternary_bytes(rng, 5 * sum(sizes), share)
    expected = reference.quartic_entropy_encode(quartic, sizes)
    encoded = encode(quartic, sizes).numpy()
    np.testing.assert_array_equal(encoded, expected)
    np.testing.assert_array_equal(decode(encoded, sizes).numpy(), quartic)
    np.testing.assert_array_equal(reference.quartic_entropy_decode(encoded, sizes), quartic)


def test_any_byte_distribution_round_trips(rng):
    # Not the model's distribution: every quartic byte alike, and long constant stretches.
    sizes = [3000, 1, 2000]
    quartic = np.concatenate([rng.integers(0, 243, 3000), [242], np.full(2000, 7)]).astype(np.uint8)
    np.testing.assert_array_equal(decode(encode(quartic, sizes), sizes).numpy(), quartic)


def model_cost_bytes(quartic):
    """What an exact coder would spend under the 16-bit model the encoder sends."""
    counts = np.array([reference.nonzero_count(b) for b in range(243)])[quartic]
    freq, _ = reference.quartic_model(reference.quartic_q(quartic))
    return -np.log2(np.array(freq)[counts] / reference.PROB_SCALE).sum() / 8


@pytest.mark.parametrize("share", [0.0005, 0.005, 0.05, 0.3])
def test_size_is_the_models_cost_plus_a_few_bytes(rng, share):
    quartic = ternary_bytes(rng, 500_000, share)
    size = int(encode(quartic, [quartic.size]).shape[0])
    assert size <= model_cost_bytes(quartic) + 2 + 4 + 4  # header, state, a partial byte
    assert size < int(tfgc_ops.zero_run_encode(quartic).shape[0])


@pytest.mark.parametrize("share", [0.02, 0.05, 0.3])
def test_the_16_bit_model_is_within_one_percent_of_the_entropy(rng, share):
    # Below a share of ~1% the 242 nonzero bytes' minimum frequency of 1/65536 starts to
    # cost: 1.8% at 0.005, 15% at 0.0005 (still far below zero-run encoding).
    quartic = ternary_bytes(rng, 500_000, share)
    assert model_cost_bytes(quartic) <= 1.01 * iid_entropy_bytes(quartic)


def test_an_all_zero_group_costs_nothing_but_its_header():
    sizes = [10_000, 5]
    quartic = np.full(10_005, 121, np.uint8)
    quartic[-1] = 122
    encoded = encode(quartic, sizes)
    assert encoded.numpy()[:2].tolist() == [0, 0]  # q = 0: the group is all 121
    assert int(encoded.shape[0]) <= 2 * 2 + 4 + 2


def test_groups_of_different_sparsity_each_get_their_own_model(rng):
    sparse, dense = ternary_bytes(rng, 50_000, 0.01), ternary_bytes(rng, 50_000, 0.5)
    quartic, sizes = np.concatenate([sparse, dense]), [sparse.size, dense.size]
    one_model = int(encode(quartic, [quartic.size]).shape[0])
    own_models = int(encode(quartic, sizes).shape[0])
    assert own_models < 0.97 * one_model


def test_runs_inside_tf_function_with_dynamic_sizes(rng):
    quartic = ternary_bytes(rng, 5 * 900, 0.1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8), tf.TensorSpec([None], tf.int64)])
    def round_trip(q, groups):
        return decode(encode(q, groups), groups)

    np.testing.assert_array_equal(round_trip(quartic, [400, 500]).numpy(), quartic)


@pytest.mark.parametrize("quartic, groups, message", [
    (np.array([121, 243], np.uint8), [2], "byte 1 is 243"),
    (np.array([121, 121], np.uint8), [3], "groups sum to 3 bytes but the input has 2"),
    (np.array([121, 121], np.uint8), [3, -1], "group 1 has size -1"),
])
def test_encode_rejects_bad_input(quartic, groups, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        encode(quartic, groups)


def test_encode_refuses_non_bytes_and_non_integer_groups():
    with pytest.raises(ValueError, match="bytes"):
        encode(np.array([300], np.int32), [1])
    with pytest.raises(ValueError, match="integer sizes"):
        encode(np.array([121], np.uint8), [1.0])


@pytest.fixture
def good(rng):
    sizes = [700, 300]
    quartic = ternary_bytes(rng, 5000, 0.2)
    return quartic, sizes, encode(quartic, sizes).numpy()


def test_decode_rejects_truncated_extended_and_corrupt_streams(good):
    quartic, sizes, encoded = good
    bad_streams = {
        "truncated": encoded[:-1],
        "extended": np.concatenate([encoded, [0]]).astype(np.uint8),
        "header only": encoded[:5],
        "state out of range": np.concatenate([encoded[:4], [0, 0, 0, 0x80], encoded[8:]]),
        "other group sizes": None,
    }
    for name, stream in bad_streams.items():
        groups = [701, 300] if stream is None else sizes
        with pytest.raises(tf.errors.InvalidArgumentError, match="quartic_entropy_decode"):
            decode(encoded if stream is None else stream.astype(np.uint8), groups)


def test_decode_output_size_is_the_receivers_not_the_messages(good):
    quartic, sizes, encoded = good
    out = decode(encoded, sizes)
    assert out.shape == [sum(sizes)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot hold the header"):
        decode(encoded[:3], sizes)


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=80), sizes=st.lists(st.integers(0, 40), max_size=4))
def test_decode_agrees_with_the_reference_on_any_bytes(blob, sizes):
    data = np.frombuffer(blob, np.uint8)
    try:
        expected = reference.quartic_entropy_decode(data, sizes)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(tf.errors.InvalidArgumentError):
            decode(data, sizes)
    else:
        np.testing.assert_array_equal(decode(data, sizes).numpy(), expected)


def test_model_frequencies_always_sum_to_the_scale():
    for q in list(range(1, 70)) + list(range(70, 65536, 97)) + [65535]:
        freq, starts = reference.quartic_model(q)
        assert min(freq) >= 1
        assert sum(n * f for n, f in zip(reference.CLASS_SIZES, freq)) == reference.PROB_SCALE
        assert starts[0] == 0
