"""Properties every codec must have, and each codec's own promise."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
import tfgc_ops
from tfgc.codecs import fastsgd
from tfgc.codecs.base import SendsValuesAlone, decode_group, encode_group
from tfgc.codecs.adaptive import adaptive_bits
import reference_ops as reference

C = tfgc.codecs


def all_codecs():
    return [
        C.NoCompression(), C.Cast("float16"), C.Cast("bfloat16"), C.Int8(), C.ThreeLC(1.0),
        C.ThreeLC(1.9), C.StochasticTernary(seed=3), C.OneBit(), C.Sparsify(0.25),
        C.Sparsify(0.05), C.TopK(0.01), C.LogQuant(4), C.FastSGD(), C.Quantize(2),
        C.Quantize(8), C.QSGD(4, seed=3), C.ScaledSign(), C.RandomK(0.25, seed=3),
        C.ChunkedTopK(0.05, chunk=64),
    ]


CODECS = all_codecs()
IDS = [repr(c) for c in CODECS]


def gradient_like(rng, shape, dtype=np.float32):
    return (rng.standard_t(3, size=shape) * 1e-2).astype(dtype)


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
@pytest.mark.parametrize("shape", [[], [0], [1], [7], [33, 5], [3, 3, 4, 2]])
def test_decode_keeps_shape_and_dtype(rng, codec, dtype, shape):
    x = tf.cast(gradient_like(rng, shape), dtype)
    payload = codec.encode(x)
    assert all(isinstance(t, tf.Tensor) for t in tf.nest.flatten(payload))
    decoded = codec.decode(payload)
    assert decoded.shape == x.shape and decoded.dtype == dtype
    payload, reconstructed = codec.encode_and_reconstruct(x)
    assert reconstructed.shape == x.shape and reconstructed.dtype == dtype
    if not isinstance(codec, C.StochasticCodec):  # deterministic codecs: sender == receiver
        np.testing.assert_array_equal(
            tf.cast(reconstructed, tf.float64).numpy(),
            tf.cast(codec.decode(payload), tf.float64).numpy(),
        )


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_wire_bytes_follow_the_table(rng, codec):
    x = gradient_like(rng, [200, 50])
    bits = 8 * int(C.payload_nbytes(codec.encode(x))) / x.size
    nominal = {
        C.NoCompression: lambda: 32, C.Cast: lambda: 16, C.Int8: lambda: 8,
        C.StochasticTernary: lambda: 1.6, C.OneBit: lambda: 1, C.LogQuant: lambda: codec.bits,
        C.QSGD: lambda: codec.bits + 32 / codec.bucket_size, C.ScaledSign: lambda: 1,
    }
    if type(codec) in nominal:
        expected = nominal[type(codec)]()
        assert expected <= bits < expected + 0.05
    elif isinstance(codec, C.Quantize):
        assert int(codec.bits.numpy()) <= bits < int(codec.bits.numpy()) + 0.05
    elif isinstance(codec, C.Sparsify):
        assert bits == pytest.approx(1 + 32 * codec.fraction, rel=0.01)
    elif isinstance(codec, C.TopK):
        assert bits == pytest.approx(64 * codec.ratio, rel=0.05)
    elif isinstance(codec, C.RandomK):
        assert bits == pytest.approx(32 * codec.fraction, rel=0.01)
    elif isinstance(codec, C.ChunkedTopK):
        assert bits == 8 * codec.payload_nbytes(x.shape) / x.size
    elif isinstance(codec, C.ThreeLC):
        assert bits <= 1.6 + 0.05


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_decodes_non_finite(rng, codec, bad):
    x = gradient_like(rng, [40])
    x[11] = bad
    decoded = codec.decode(codec.encode(x)).numpy()
    assert not np.isfinite(decoded).all()


@pytest.mark.filterwarnings("ignore:ErrorFeedback around .* an unbiased codec")  # on purpose
@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_error_feedback_conserves_every_codec(rng, codec):
    feedback = tfgc.ErrorFeedback(codec)
    total_in, total_sent = np.zeros(300), np.zeros(300)
    for _ in range(8):
        x = gradient_like(rng, [300])
        total_in += x
        total_sent += feedback.decode(feedback.encode(x, key="g")).numpy()
    residual = feedback.residuals["g"].numpy()
    np.testing.assert_allclose(total_sent + residual, total_in, atol=1e-5)


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_usable_in_tf_function(rng, codec):
    x = tf.constant(gradient_like(rng, [64, 3]))
    roundtrip = tf.function(lambda x: codec.decode(codec.encode(x)))
    decoded = roundtrip(x)
    assert decoded.shape == x.shape  # static shape survives tracing
    if not isinstance(codec, C.StochasticCodec):
        np.testing.assert_array_equal(decoded.numpy(), codec.decode(codec.encode(x)).numpy())


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_config_roundtrip(codec):
    again = type(codec).from_config(codec.get_config())
    assert again.get_config() == codec.get_config()


def test_huge_tensors_are_refused_before_allocation():
    codec = C.ThreeLC()
    traced = tf.function(codec.encode, input_signature=[tf.TensorSpec([2**31], tf.float32)])
    with pytest.raises(ValueError, match="above 2147483647 elements"):
        traced.get_concrete_function()


# --- stochastic codecs: unbiased ------------------------------------------------------


@pytest.mark.parametrize("codec", [C.StochasticTernary(seed=7), C.QSGD(2, seed=7), C.QSGD(4, seed=7)],
                         ids=["ternary", "qsgd2", "qsgd4"])
def test_stochastic_codecs_are_unbiased(rng, codec):
    x = gradient_like(rng, [64])
    draws = 4000
    encode_many = tf.function(lambda x: tf.add_n([codec.decode(codec.encode(x)) for _ in range(50)]))
    mean = sum(encode_many(x).numpy() for _ in range(draws // 50)) / draws
    spread = np.abs(x).max() if isinstance(codec, C.StochasticTernary) else np.linalg.norm(x)
    # QSGD's buckets hold 512 values, so here one bucket: its norm is ||x||.
    # Standard error of the mean is at most spread / (2 sqrt(draws)); allow 5 of them.
    np.testing.assert_allclose(mean, x, atol=5 * spread / (2 * np.sqrt(draws)))


def test_qsgd_buckets_have_their_own_norms(rng):
    x = np.concatenate([np.full(8, 100.0), np.full(8, 0.01)]).astype(np.float32)
    codec = C.QSGD(4, bucket_size=8, seed=1)
    payload = codec.encode(x)
    np.testing.assert_allclose(payload["norms"].numpy(), [100 * np.sqrt(8), 0.01 * np.sqrt(8)], rtol=1e-6)
    decoded = codec.decode(payload).numpy()
    assert np.abs(decoded[8:]).max() <= 0.01 * np.sqrt(8) + 1e-7


def test_stochastic_codecs_reproduce_with_a_seed(rng):
    x = gradient_like(rng, [100])
    a, b = C.QSGD(4, seed=11), C.QSGD(4, seed=11)
    np.testing.assert_array_equal(a.encode(x)["data"].numpy(), b.encode(x)["data"].numpy())


# --- deterministic codecs: their own bounds -----------------------------------------


@pytest.mark.parametrize("bits", range(2, 9))
def test_quantize_error_bound(rng, bits):
    x = gradient_like(rng, [1000])
    decoded = C.Quantize(bits).decode(C.Quantize(bits).encode(x)).numpy()
    step = (x.max() - x.min()) / (2**bits - 1)
    assert np.abs(decoded - x).max() <= step / 2 * (1 + 1e-4) + 1e-9


def test_quantize_bits_change_without_retracing(rng):
    bits = tf.Variable(2, dtype=tf.int32)
    codec = C.Quantize(bits)
    x = tf.constant(gradient_like(rng, [1000]))
    step = tf.function(lambda x: (C.payload_nbytes(codec.encode(x)), codec.decode(codec.encode(x))))
    sizes, errors = [], []
    for k in (2, 4, 8):
        bits.assign(k)
        size, decoded = step(x)
        sizes.append(int(size))
        errors.append(float(tf.norm(decoded - x)))
    assert step.experimental_get_tracing_count() == 1
    assert sizes[0] < sizes[1] < sizes[2] and sizes[2] - sizes[0] == 6 * 1000 // 8
    assert errors[0] > errors[1] > errors[2]
    bits.assign(9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bits must be in"):
        step(x)


def test_fastsgd_never_overestimates_and_keeps_signs(rng):
    x = gradient_like(rng, [5000]).astype(np.float64)
    for codec in (C.FastSGD(), C.FastSGD(base=2.0, threshold=20), C.FastSGD(base=1.01)):
        decoded = codec.decode(codec.encode(x)).numpy()
        assert (np.abs(decoded) <= np.abs(x)).all()
        sent = decoded != 0
        assert (np.sign(decoded[sent]) == np.sign(x[sent])).all()
        # Within one factor of b of the truth where sent.
        assert (np.abs(decoded[sent]) * codec.base >= np.abs(x[sent]) * (1 - 1e-9)).all()


def test_fastsgd_threshold_filter(rng):
    x = gradient_like(rng, [2000])
    codec = C.FastSGD(base=2.0, threshold=10)
    decoded = codec.decode(codec.encode(x)).numpy()
    cutoff = np.abs(x).sum() / 2.0**10
    assert (decoded[np.abs(x) < cutoff] == 0).all()
    assert (decoded[np.abs(x) >= cutoff * 2] != 0).all()


def test_fastsgd_sparse_keys_cost(rng):
    # A gradient with 5% non-zeros: keys cost about log2(D/d) + l bits.
    x = np.zeros(200_000, np.float32)
    where = np.sort(rng.choice(x.size, 10_000, replace=False))
    x[where] = gradient_like(rng, [where.size])
    payload = C.FastSGD().encode(x)
    assert float(fastsgd.bits_per_key(payload)) <= np.log2(20) + 2 + 1.5
    decoded = C.FastSGD().decode(payload).numpy()
    assert set(np.flatnonzero(decoded)) <= set(where)


def test_fastsgd_indexed_slices_sum_duplicates():
    values = tf.constant([[1.0, -2.0], [3.0, 0.5], [0.25, 4.0]])
    slices = tf.IndexedSlices(values, tf.constant([5, 2, 5]), tf.constant([8, 2]))
    codec = C.FastSGD()  # b = 1.1, tau = 128: everything within 1.1^128 of the sum is kept
    decoded = codec.decode(codec.encode(slices))
    assert isinstance(decoded, tf.IndexedSlices)
    assert decoded.indices.numpy().tolist() == [2, 5]
    dense = tf.convert_to_tensor(decoded).numpy()
    expected = np.zeros([8, 2], np.float32)
    expected[5] = [1.25, 2.0]
    expected[2] = [3.0, 0.5]
    assert (np.abs(dense) <= np.abs(expected) + 1e-7).all()
    np.testing.assert_allclose(dense, expected, rtol=0.1)


# Repeated rows summed by row_sums' bitmap (a small first dimension) or by its sort (a
# large one), ascending distinct ones taken as they are; one value per row or several.
@pytest.mark.parametrize("rows", ["bitmap", "sorting", "ascending"])
@pytest.mark.parametrize("row_shape", [[], [3]])
def test_fastsgd_indexed_slices_encode_like_their_dense_tensor(rng, rows, row_shape):
    num_rows = 2**21 if rows == "sorting" else 1000
    indices = {"bitmap": rng.integers(0, 1000, 2000), "sorting": rng.integers(0, num_rows, 50),
               "ascending": np.sort(rng.choice(1000, 50, replace=False))}[rows]
    indices = np.concatenate([indices, indices[:5]]) if rows == "sorting" else indices
    values = gradient_like(rng, [indices.size] + row_shape)
    slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices),
                              tf.constant([num_rows] + row_shape))
    codec = C.FastSGD()
    sparse, dense = codec.encode(slices), codec.encode(tf.convert_to_tensor(slices))
    # The same codes and sum; the sparse payload keys its distinct rows, not elements.
    for key in ("values", "sum"):
        np.testing.assert_array_equal(sparse["row_values." + key].numpy(), dense[key].numpy())
    np.testing.assert_array_equal(tfgc_ops.unpack_keys(sparse["rows"]).numpy(),
                                  np.unique(indices))
    np.testing.assert_array_equal(tf.convert_to_tensor(codec.decode(sparse)).numpy(),
                                  codec.decode(dense).numpy())


def test_fastsgd_indexed_slices_keep_their_dtype_and_refuse_rows_out_of_range():
    values = tf.constant([[1.0, -2.0], [3.0, 0.5], [0.25, 4.0]], tf.float16)
    slices = tf.IndexedSlices(values, tf.constant([5, 2, 5]), tf.constant([8, 2]))
    codec = C.FastSGD()
    decoded = tf.convert_to_tensor(codec.decode(codec.encode(slices)))
    assert decoded.dtype == tf.float16
    np.testing.assert_allclose(decoded.numpy()[[2, 5]], [[3.0, 0.5], [1.25, 2.0]], rtol=0.1)
    for indices in ([5, 8, 5], [5, -1, 5]):
        beyond = tf.IndexedSlices(values, tf.constant(indices), tf.constant([8, 2]))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"is not in \[0, 8\)"):
            codec.encode(beyond)


@pytest.mark.parametrize("threshold", [128, 3])
def test_fastsgd_values_alone_decode_like_the_full_payload(rng, threshold):
    # Rows sent without their (distinct, ascending) indices decode, against the
    # receiver's indices, to what the keyed payload decodes to; their codes are the same.
    indices = tf.constant(np.sort(rng.choice(1000, 50, replace=False)))
    values = tf.constant(gradient_like(rng, [50, 3]))
    dense_shape = tf.constant([1000, 3], tf.int64)
    codec = C.FastSGD(threshold=threshold)
    keyed = codec.encode(tf.IndexedSlices(values, indices, dense_shape))
    alone = codec.encode_values(values)
    assert "keys" not in alone and "dense_shape" not in alone
    np.testing.assert_array_equal(alone["values"].numpy(), keyed["row_values.values"].numpy())
    # The shorter list of positions travels: those dropped (a few here with the
    # paper's tau), or those kept (few with tau = 3).
    kept = keyed["row_values.values"].shape[0]
    dropped_listed = threshold == 128
    assert (kept > 75) == dropped_listed
    assert alone["kept_listed"].numpy().tolist() == [0 if dropped_listed else 1]
    listed = tfgc_ops.unpack_keys(alone["positions"]).shape[0]
    assert listed == (150 - kept if dropped_listed else kept)
    decoded = codec.decode_values(alone, indices, dense_shape)
    assert isinstance(decoded, tf.IndexedSlices)
    np.testing.assert_array_equal(decoded.indices.numpy(), indices.numpy())
    np.testing.assert_array_equal(tf.convert_to_tensor(decoded).numpy(),
                                  tf.convert_to_tensor(codec.decode(keyed)).numpy())


def test_fastsgd_values_alone_refuse_payloads_that_do_not_fit_the_indices(rng):
    values = tf.constant(gradient_like(rng, [50, 3]))
    indices, dense_shape = tf.range(50, dtype=tf.int64), tf.constant([1000, 3], tf.int64)
    codec = C.FastSGD()
    payload = codec.encode_values(values)
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match its shape"):
        codec.decode_values(payload, indices[:40], dense_shape)  # fewer rows than codes
    # Positions past the rows, listed kept or dropped: nothing is written out of bounds.
    for kept_listed in (0, 1):
        beyond = dict(payload, positions=tfgc_ops.pack_keys(tf.constant([0, 5000], tf.int64)),
                      kept_listed=tf.constant([kept_listed], tf.uint8),
                      values=payload["values"][:2 if kept_listed else 148])
        with pytest.raises(tf.errors.InvalidArgumentError):
            codec.decode_values(beyond, indices, dense_shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match its shape"):
        codec.decode_values(dict(payload, kept_listed=tf.zeros([0], tf.uint8)), indices,
                            dense_shape)
    assert isinstance(codec, SendsValuesAlone)
    assert not isinstance(C.ThreeLC(1.0), SendsValuesAlone)


def test_no_compression_sends_indexed_slices_as_tensorflow_does():
    # Values and rows as they are (duplicates too), the rows of a rank-2 variable intact.
    values = tf.constant([[1.0, -2.0], [3.0, 0.5], [0.25, 4.0]])
    slices = tf.IndexedSlices(values, tf.constant([5, 2, 5]), tf.constant([8, 2]))
    codec = C.NoCompression()
    payload = codec.encode(slices)
    assert C.base.payload_nbytes(payload) == 3 * 2 * 4 + 3 * 4 + 2 * 8
    decoded = codec.decode(payload)
    assert isinstance(decoded, tf.IndexedSlices)
    np.testing.assert_array_equal(decoded.values.numpy(), values.numpy())
    np.testing.assert_array_equal(decoded.indices.numpy(), [5, 2, 5])
    np.testing.assert_array_equal(decoded.dense_shape.numpy(), [8, 2])
    assert codec.encode_and_reconstruct(slices)[1] is slices
    # Values that do not fill the declared rows are refused.
    short = dict(payload, values=payload["values"][:-1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match its shape"):
        codec.decode(short)
    with pytest.raises(ValueError, match="dense_shape"):
        codec.encode(tf.IndexedSlices(values, tf.constant([5, 2, 5])))


def test_fastsgd_rejects_bad_arguments():
    with pytest.raises(ValueError, match="base"):
        C.FastSGD(base=1.0)
    with pytest.raises(ValueError, match="threshold"):
        C.FastSGD(threshold=129)
    with pytest.raises(ValueError, match="flag_bits"):
        C.FastSGD(flag_bits=6)
    with pytest.raises(ValueError, match="FastSGD flag_bits"):  # not truncated to 2
        C.FastSGD(flag_bits=2.7)
    assert C.FastSGD(flag_bits=2.0).flag_bits == 2


def test_one_bit_values_minimize_squared_error(rng):
    x = gradient_like(rng, [500])
    payload = C.OneBit().encode(x)
    assert float(payload["positive"]) == pytest.approx(x[x >= 0].mean(), rel=1e-5)
    assert float(payload["negative"]) == pytest.approx(x[x < 0].mean(), rel=1e-5)


def test_sparsifiers_keep_the_largest(rng):
    x = gradient_like(rng, [10_000])
    top = C.TopK(0.01).decode(C.TopK(0.01).encode(x)).numpy()
    assert np.count_nonzero(top) == 100
    assert np.abs(x[top != 0]).min() >= np.sort(np.abs(x))[-100]
    kept = C.Sparsify(0.05).decode(C.Sparsify(0.05).encode(x)).numpy() != 0
    assert np.count_nonzero(kept) == 500
    assert np.abs(x[kept]).min() >= np.abs(x[~kept]).max()


def test_topk_sends_no_zeros_ties_by_position_and_non_finite_first():
    sparse = np.zeros([1000], np.float32)
    sparse[[3, 500, 999]] = [1.0, -2.0, 0.5]  # k = 10, three non-zeros: only those sent
    payload = C.TopK(0.01).encode(sparse)
    assert payload["indices"].numpy().tolist() == [3, 500, 999]
    np.testing.assert_array_equal(C.TopK(0.01).decode(payload).numpy(), sparse)
    tied = np.full([1000], 3.0, np.float32)  # all tied: the first k by position
    assert C.TopK(0.01).encode(tied)["indices"].numpy().tolist() == list(range(10))
    poisoned = np.arange(1000, dtype=np.float32)
    poisoned[[7, 8]] = [np.nan, -np.inf]  # sent, and the 8 largest others
    indices = C.TopK(0.01).encode(poisoned)["indices"].numpy().tolist()
    assert indices == [7, 8] + list(range(992, 1000))


def _structured_layouts(rng):
    """Dense-layer-like gradients whose large values sit where a strided sample misses."""
    columns = rng.normal(size=[1024, 256]).astype(np.float32)
    columns[:, ::64] *= 10  # every 64th column larger
    rows = rng.normal(size=[1024, 256]).astype(np.float32)
    rows[7::16] *= 1e3  # every 16th row larger
    blocks = rng.normal(size=[512, 512]).astype(np.float32) * 1e-3
    blocks[:32, :32] = rng.normal(size=[32, 32]) * 50  # one hot block
    sorted_ramp = np.sort(rng.exponential(size=[300_000])).astype(np.float32)
    return {"columns": columns, "rows": rows, "blocks": blocks, "sorted": sorted_ramp}


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.05, 0.25])
def test_sparsify_keeps_its_fraction_on_any_layout(rng, fraction):
    for name, x in _structured_layouts(rng).items():
        kept = C.Sparsify(fraction).decode(C.Sparsify(fraction).encode(x)).numpy() != 0
        assert np.count_nonzero(kept) == int(np.ceil(fraction * x.size)), name
        assert np.abs(x[kept]).min() >= np.abs(x[~kept]).max(), name


def test_sparsify_ties_zeros_and_non_finite():
    constant = np.full([1000], 3.0, np.float32)  # all tied: the first 250 by position
    kept = C.Sparsify(0.25).decode(C.Sparsify(0.25).encode(constant)).numpy() != 0
    assert kept[:250].all() and not kept[250:].any()
    sparse = np.zeros([1000], np.float32)
    sparse[[3, 500]] = [1.0, -2.0]  # fewer nonzeros than the fraction: zeros are not sent
    payload = C.Sparsify(0.25).encode(sparse)
    assert payload["values"].shape == [2]
    np.testing.assert_array_equal(C.Sparsify(0.25).decode(payload).numpy(), sparse)
    assert C.Sparsify(0.25).encode(np.zeros([10], np.float32))["values"].shape == [0]
    with_inf = np.arange(100, dtype=np.float32)
    with_inf[10] = np.inf  # sent on top of the largest 10% of the finite values
    kept = C.Sparsify(0.1).decode(C.Sparsify(0.1).encode(with_inf)).numpy()
    assert np.isinf(kept[10]) and np.count_nonzero(kept) == 11
    empty = C.Sparsify(0.5).encode(np.zeros([0, 4], np.float32))
    assert C.Sparsify(0.5).decode(empty).shape == [0, 4]


def test_logquant_rounds_to_powers_of_two():
    x = np.array([1.0, -0.5, 0.3, 0.0, 1e-9, 0.7], np.float32)
    decoded = C.LogQuant(4).decode(C.LogQuant(4).encode(x)).numpy()
    np.testing.assert_array_equal(decoded, [1.0, -0.5, 0.25, 0.0, 0.0, 0.5])


def test_cast_saturates_instead_of_overflowing():
    x = np.array([1e6, -1e6, 1.0], np.float32)
    decoded = C.Cast("float16").decode(C.Cast("float16").encode(x)).numpy()
    np.testing.assert_array_equal(decoded, [65504.0, -65504.0, 1.0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("input_dtype", [np.float32, np.float64])
def test_cast_compiled_for_large_tensors_matches_the_plain_path(rng, dtype, input_dtype):
    codec = C.Cast(dtype)
    x = (rng.normal(size=[C.base.JIT_MIN_ELEMENTS]) * 3e4).astype(input_dtype)
    x[:6] = [1e5, -1e6, np.inf, -np.inf, np.nan, 65519.0]
    compiled = codec.encode(x)["values"].numpy()  # >= JIT_MIN_ELEMENTS: the XLA pass
    plain = np.concatenate([codec.encode(part)["values"].numpy() for part in np.split(x, 8)])
    np.testing.assert_array_equal(compiled.view(np.uint16), plain.view(np.uint16))
    assert np.isinf(compiled[2:4].astype(np.float32)).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_batch_sends_each_tensors_bytes_in_turn(rng, dtype):
    codec = C.Cast(dtype)
    xs = [tf.constant(gradient_like(rng, shape) * 1e4) for shape in ([3, 4], [5], [1, 2, 2])]
    payload, sents = encode_group(codec, xs)
    apart = [codec.encode(x) for x in xs]
    np.testing.assert_array_equal(
        payload["values"].numpy().view(np.uint16),
        np.concatenate([p["values"].numpy().reshape(-1) for p in apart]).view(np.uint16))
    for x, sent, decoded, alone in zip(xs, sents, decode_group(codec, payload, [x.shape for x in xs]),
                                       apart):
        assert sent.shape == x.shape and decoded.shape == x.shape
        np.testing.assert_array_equal(sent.numpy(), codec.decode(alone).numpy())
        np.testing.assert_array_equal(decoded.numpy(), sent.numpy())
    with pytest.raises(ValueError, match="one dtype"):
        encode_group(codec, [xs[0], tf.cast(xs[1], tf.float64)])[0]


@pytest.mark.parametrize("codec, count", [
    (C.Cast("float16"), 1), (C.Cast("float16"), 3), (C.ThreeLC(1.0), 1), (C.ThreeLC(1.0), 3),
    (C.ThreeLC(1.5, coder="entropy"), 3), (C.Int8(), 1),  # not batched: one tensor a group
], ids=lambda c: getattr(c, "name", str(c)))
def test_a_flat_group_is_the_group_laid_end_to_end(rng, codec, count):
    shapes = [[3, 4], [7], [2, 2, 5]][:count]
    xs = [tf.constant(gradient_like(rng, shape)) for shape in shapes]
    flat = tf.concat([tf.reshape(x, [-1]) for x in xs], 0)
    payload, sent = codec.encode_and_reconstruct_flat(flat, shapes)
    group_payload, group_sent = encode_group(codec, xs)
    assert sorted(payload) == sorted(group_payload)
    for key in payload:
        np.testing.assert_array_equal(payload[key].numpy(), group_payload[key].numpy())
    expected = np.concatenate([t.numpy().reshape(-1) for t in group_sent])
    np.testing.assert_array_equal(sent.numpy(), expected)
    np.testing.assert_array_equal(codec.decode_flat(payload, shapes).numpy(), expected)


def test_a_codec_that_is_not_batched_refuses_a_group_of_several():
    flat = tf.zeros([12])
    with pytest.raises(NotImplementedError, match="one tensor per payload"):
        C.Int8().encode_and_reconstruct_flat(flat, [[4], [8]])
    with pytest.raises(NotImplementedError, match="one tensor per payload"):
        C.Int8().decode_flat({}, [[4], [8]])


@pytest.mark.parametrize("codec", [C.Cast("float16"), C.ThreeLC(1.0)], ids=lambda c: c.name)
def test_a_batched_group_must_fill_its_vector(codec):
    with pytest.raises(ValueError, match="must lie in a vector of as many values"):
        codec.encode_and_reconstruct_flat(tf.zeros([13]), [[4], [8]])
    with pytest.raises(ValueError, match="static shapes"):
        codec.encode_and_reconstruct_flat(tf.zeros([12]), [[4], [None]])


def test_malformed_payload_is_refused(rng):
    x = gradient_like(rng, [100])
    for codec in (C.Quantize(4), C.QSGD(4, seed=1), C.OneBit(), C.LogQuant(3), C.StochasticTernary(seed=1)):
        payload = dict(codec.encode(x))
        payload["shape"] = tf.constant([400])
        # The codecs decoded by C++ ops say it in the op's words.
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="does not match its shape|bytes do not hold"):
            codec.decode(payload)


COMPILED_ENCODERS = {
    "Int8": C.Int8, "Quantize(4)": lambda: C.Quantize(4), "Quantize(8)": lambda: C.Quantize(8),
    "AdaptiveQuantize": C.AdaptiveQuantize, "OneBit": C.OneBit, "LogQuant(4)": lambda: C.LogQuant(4),
    "QSGD(4)": lambda: C.QSGD(4, seed=3), "StochasticTernary": lambda: C.StochasticTernary(seed=3),
}


@pytest.mark.parametrize("name", sorted(COMPILED_ENCODERS))
def test_compiled_encoders_agree_with_the_plain_path(rng, monkeypatch, name):
    make = COMPILED_ENCODERS[name]
    x = gradient_like(rng, [C.base.JIT_MIN_ELEMENTS])  # large enough for the XLA pass
    compiled, reconstructed = make().encode_and_reconstruct(x)
    # What the sender reconstructs is exactly what the receiver decodes.
    np.testing.assert_array_equal(make().decode(compiled).numpy(), reconstructed.numpy())
    monkeypatch.setattr(C.base, "JIT_MIN_ELEMENTS", 2**40)
    plain, _ = make().encode_and_reconstruct(x)
    assert compiled.keys() == plain.keys()
    for key in compiled:
        got, want = compiled[key].numpy(), plain[key].numpy()
        if (name, key) in (("OneBit", "positive"), ("OneBit", "negative"), ("QSGD(4)", "norms")):
            np.testing.assert_allclose(got, want, rtol=1e-5)  # sums in another order
        elif name in ("LogQuant(4)", "QSGD(4)") and key == "data":
            # An ulp of difference (XLA's log, a norm summed in another order) moves
            # the values next to a rounding boundary.
            assert np.mean(got != want) <= 1e-3, key
        else:
            np.testing.assert_array_equal(got, want, err_msg=key)


@pytest.mark.parametrize("name", sorted(COMPILED_ENCODERS))
def test_compiled_encoders_follow_the_non_finite_policy(rng, name):
    x = gradient_like(rng, [C.base.JIT_MIN_ELEMENTS])
    x[123] = np.nan
    codec = COMPILED_ENCODERS[name]()
    payload, reconstructed = codec.encode_and_reconstruct(x)
    assert np.isnan(codec.decode(payload).numpy()).all()
    assert np.isnan(reconstructed.numpy()).all()


@pytest.mark.parametrize("shape", [[0], [1], [9], [64, 33]])
@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_quantize_payload_is_its_definition(rng, shape, bits):
    # q = round((x - min) / step), ties to even, step = (max - min) / (2^K - 1), in float32.
    x = gradient_like(rng, shape)
    x.reshape(-1)[:3] = x.reshape(-1)[:1]  # repeated values (and the minimum among them)
    payload, reconstructed = C.Quantize(bits).encode_and_reconstruct(x)
    low = np.float32(x.min()) if x.size else np.float32(0)
    high = np.float32(x.max()) if x.size else np.float32(0)
    step = (high - low) / np.float32(2**bits - 1)
    codes = np.round((x.reshape(-1) - low) / (step if step > 0 else np.float32(1)))
    codes = np.clip(codes, 0, 2**bits - 1).astype(np.int32)
    assert (float(payload["min"]), float(payload["max"]), int(payload["bits"])) == (low, high, bits)
    np.testing.assert_array_equal(payload["data"].numpy(), reference.pack_bits(codes, bits))
    np.testing.assert_array_equal(reconstructed.numpy().reshape(-1), low + codes.astype(np.float32) * step)


def test_adaptive_quantize_uses_the_bits_of_its_rule(rng):
    for rho in (0.1, 0.01, 0.0001):
        x = gradient_like(rng, [1000])
        payload = C.AdaptiveQuantize(rho=rho).encode(x)
        assert int(payload["bits"]) == int(adaptive_bits(x, rho))
        np.testing.assert_array_equal(payload["data"].numpy(),
                                      C.Quantize(int(payload["bits"])).encode(x)["data"].numpy())


@pytest.mark.parametrize("bits", [2, 5, 8])
def test_logquant_levels_decode_to_exact_powers_of_two(bits):
    levels = np.arange(2 ** (bits - 1), dtype=np.int32)
    codes = np.concatenate([levels, levels | (1 << (bits - 1))])  # both signs
    for scale in (1.0, 2.0 ** 100):
        payload = {"data": tfgc_ops.pack_bits(codes, bits), "scale": tf.constant(scale),
                   "dtype": tf.zeros([0]), "shape": tf.constant([codes.size])}
        values = C.LogQuant(bits).decode(payload).numpy()
        magnitude = np.where(levels > 0, np.ldexp(np.float32(scale), 1 - levels), 0.0)
        np.testing.assert_array_equal(values, np.concatenate([magnitude, -magnitude]))


@pytest.mark.parametrize("settings", [C.PowerSGD(), C.Signum(), C.GradiVeQ()],
                         ids=["PowerSGD", "Signum", "GradiVeQ"])
def test_per_variable_settings_neither_encode_nor_decode(settings):
    with pytest.raises(RuntimeError, match=r"codec\.bind\(variable\)"):
        settings.encode(tf.zeros([4]))
    with pytest.raises(RuntimeError, match=r"codec\.bind\(variable\)"):
        settings.decode({})

    # Its decode refuses by itself, not through whatever encode a subclass has.
    class Encodes(type(settings)):
        def encode(self, x):
            return {"values": x}

    with pytest.raises(RuntimeError, match=r"codec\.bind\(variable\)"):
        Encodes().decode({"values": tf.zeros([4])})
