"""The public codec API checks what a payload declares against what the caller expects:
keys, dtypes, element counts and the declared shape, eagerly and inside tf.function,
before anything is allocated for it."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc.codecs import validation
from tfgc.codecs.base import decode_group, encode_group

C = tfgc.codecs

# Codecs whose payload declares the decoded tensor's shape.
SHAPED = [
    C.Int8(), C.ThreeLC(1.0), C.ThreeLC(1.75, coder="entropy"), C.StochasticTernary(seed=0),
    C.OneBit(), C.Sparsify(0.25), C.TopK(0.05), C.LogQuant(4), C.FastSGD(), C.Quantize(4),
    C.AdaptiveQuantize(), C.QSGD(4, seed=0), C.ChunkedTopK(0.05, chunk=64),
]
EVERY = [C.NoCompression(), C.Cast("float16"), C.Cast("bfloat16")] + SHAPED
# Both refusals carry the same words: at once where the checked value is known while
# the decode is built, from an assert when it runs otherwise.
REFUSED = (ValueError, tf.errors.InvalidArgumentError)


def gradient(shape=(30, 100), seed=0):
    rng = np.random.default_rng(seed)
    return tf.constant((rng.standard_t(3, size=shape) * 1e-2).astype(np.float32))


def traced_decode(codec, payload, **kwargs):
    """`codec.decode(payload)` inside a tf.function whose payload tensors are run-time
    values of unknown length: nothing about them is static but dtypes and ranks."""
    payload = {key: tf.convert_to_tensor(value) for key, value in payload.items()}
    signature = {key: tf.TensorSpec([None] * value.shape.rank, value.dtype)
                 for key, value in payload.items()}

    @tf.function(input_signature=[signature])
    def decode(p):
        return codec.decode(p, **kwargs)

    return decode(payload)


def test_topk_payload_declaring_a_huge_shape_is_refused_before_allocating():
    payload = {"indices": [0], "values": [1.0], "shape": [2**30]}
    with pytest.raises(ValueError, match=r"TopK.*\[1073741824\].*max_decoded_bytes"):
        C.TopK().decode(payload)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_decoded_bytes"):
        traced_decode(C.TopK(), payload)


@pytest.mark.parametrize("codec", SHAPED, ids=repr)
@pytest.mark.parametrize("shape", [[2**30], [65536, 65536], [2**31 - 1, 2**31 - 1, 4]])
def test_declared_shape_above_the_bound_is_refused(codec, shape):
    payload = dict(codec.encode(gradient()), shape=tf.constant(shape, tf.int32))
    with pytest.raises(ValueError, match=rf"{codec.name}.*max_decoded_bytes={2**30}"):
        codec.decode(payload)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_decoded_bytes"):
        traced_decode(codec, payload)


@pytest.mark.parametrize("codec", [C.TopK(0.05), C.Sparsify(0.25)], ids=repr)
def test_shape_whose_product_overflows_int32_names_the_shape(codec):
    # Its int32 product wraps to 0: once "Indices and updates specified for empty output".
    payload = dict(codec.encode(gradient()), shape=tf.constant([65536, 65536]))
    with pytest.raises(ValueError, match=r"\[65536, 65536\] \(4294967296 elements\)"):
        codec.decode(payload)


@pytest.mark.parametrize("codec", SHAPED, ids=repr)
def test_negative_declared_dimensions_are_refused(codec):
    payload = dict(codec.encode(gradient()), shape=tf.constant([-30, -100]))
    with pytest.raises(ValueError, match="negative"):
        codec.decode(payload)
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative"):
        traced_decode(codec, payload)


def test_the_bound_is_overridable_and_an_expected_shape_replaces_it(monkeypatch):
    x = gradient()
    codec = C.ThreeLC(1.0)
    payload = codec.encode(x)
    monkeypatch.setattr(validation, "MAX_DECODED_ELEMENTS", 1000)
    with pytest.raises(ValueError, match=r"\[30, 100\] \(3000 elements\).*=1000"):
        codec.decode(payload)
    # The caller's shape is the bound: the decoding is what the caller allocates anyway.
    expected = decode_group(codec, payload, [x.shape])[0]
    assert expected.shape == x.shape
    np.testing.assert_array_equal(codec.decode(payload, expected_shape=x.shape).numpy(),
                                  expected.numpy())
    monkeypatch.undo()
    codec.max_decoded_elements = 2999
    with pytest.raises(ValueError, match="max_decoded_elements=2999"):
        codec.decode(payload)
    codec.max_decoded_elements = 3000
    assert codec.decode(payload).shape == x.shape
    # The byte bound: 3000 float32 values through 600 quartic bytes take 12600 bytes.
    monkeypatch.setattr(validation, "MAX_DECODED_BYTES", 12599)
    with pytest.raises(ValueError, match=r"\(3000 elements\).*12600 bytes.*=12599"):
        codec.decode(payload)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_decoded_bytes=12599"):
        traced_decode(codec, payload)
    assert codec.decode(payload, expected_shape=x.shape).shape == x.shape
    codec.max_decoded_bytes = 12600
    assert codec.decode(payload).shape == x.shape


def test_the_byte_bound_counts_the_decoded_dtype():
    # float64 fields make a float64 decoding: twice the bytes of float32.
    x = gradient()
    for codec in (C.Int8(), C.OneBit(), C.TopK(0.05), C.Quantize(4), C.RandomK(0.5, seed=0)):
        wide = codec.encode(tf.cast(x, tf.float64))
        narrow = codec.encode(x)
        fields = {key: tf.convert_to_tensor(value) for key, value in wide.items()}
        per_element = validation.bytes_per_element(codec, fields)
        assert per_element > validation.bytes_per_element(
            codec, {key: tf.convert_to_tensor(value) for key, value in narrow.items()})
        codec.max_decoded_bytes = int(3000 * per_element)
        assert codec.decode(wide).dtype == tf.float64
        codec.max_decoded_bytes -= 1
        with pytest.raises(ValueError, match="max_decoded_bytes"):
            codec.decode(wide)
        assert codec.decode(narrow).shape == x.shape


@pytest.mark.parametrize("codec", EVERY, ids=repr)
def test_declared_shape_must_be_the_expected_one(codec):
    x = gradient()
    payload = codec.encode(x)
    np.testing.assert_array_equal(codec.decode(payload, expected_shape=[30, 100]).numpy(),
                                  codec.decode(payload).numpy())
    traced = traced_decode(codec, payload, expected_shape=(30, 100))
    assert traced.shape == (30, 100)  # static: the caller's shape
    for wrong in ([100, 30], [3000], [30, 101]):
        with pytest.raises(ValueError, match=rf"{codec.name}.*expected \[{wrong[0]}"):
            codec.decode(payload, expected_shape=wrong)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{codec.name}"):
            traced_decode(codec, payload, expected_shape=wrong)


@pytest.mark.parametrize("sender, receiver", [
    (C.Sparsify(0.25), C.NoCompression()),
    (C.FastSGD(), C.Cast("float16")),
    (C.FastSGD(), C.NoCompression()),
    (C.Int8(), C.ThreeLC(1.0)),  # the same keys: the dtype of "data" tells
    (C.Quantize(4), C.LogQuant(4)),
    (C.TopK(0.05), C.Sparsify(0.25)),
    (C.NoCompression(), C.Cast("float16")),
    (C.OneBit(), C.QSGD(4, seed=0)),
], ids=lambda codec: codec.name)
def test_payload_of_another_codec_is_refused(sender, receiver):
    payload = sender.encode(gradient())
    with pytest.raises(ValueError, match=rf"{receiver.name}: payload (keys|field)"):
        receiver.decode(payload)
    with pytest.raises(ValueError, match=rf"{receiver.name}: payload (keys|field)"):
        decode_group(receiver, payload, [(30, 100)])


def test_payload_of_a_codec_with_the_same_layout_fails_on_its_sizes():
    # ThreeLC's zero-run coded bytes, read as StochasticTernary's plain quartic bytes.
    payload = C.ThreeLC(1.0).encode(gradient())
    with pytest.raises(tf.errors.InvalidArgumentError, match="bytes do not hold"):
        C.StochasticTernary(seed=0).decode(payload)


@pytest.mark.parametrize("codec", EVERY, ids=repr)
def test_missing_and_extra_keys_are_named(codec):
    payload = codec.encode(gradient())
    key = sorted(payload)[0]
    with pytest.raises(ValueError, match=rf"missing \['{key}'\]"):
        codec.decode({k: v for k, v in payload.items() if k != key})
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        codec.decode(dict(payload, extra=tf.zeros([1])))


@pytest.mark.parametrize("codec", [C.NoCompression(), C.Cast("float16"), C.Cast("bfloat16")],
                         ids=repr)
def test_truncated_values_are_refused_against_the_expected_shape(codec):
    x = gradient([3000])
    payload = codec.encode(x)
    short = dict(payload, values=payload["values"][:-1])
    with pytest.raises(ValueError, match=r"values.*2999.*3000"):
        codec.decode(short, expected_shape=x.shape)
    with pytest.raises(ValueError, match=r"values.*2999.*3000"):
        decode_group(codec, short, [x.shape])
    with pytest.raises(tf.errors.InvalidArgumentError, match="values"):
        traced_decode(codec, short, expected_shape=x.shape)
    # The batched format checks the group's total.
    if codec.batched:
        with pytest.raises(REFUSED, match="values"):
            decode_group(codec, short, [(1000,), (2000,)])


@pytest.mark.parametrize("codec, key", [
    (C.Int8(), "data"), (C.NoCompression(), "values"), (C.Cast("float16"), "values"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_vector_of_the_wrong_length_is_refused_under_a_constant_shape(codec, key):
    # As a traced fused message gives it: the shape a constant, the data of run-time
    # length. Grappler drops a Reshape of [None] to [3000] and the checks before it;
    # the decoding must still fail, not return 2999 values.
    x = gradient([3000])
    payload = codec.encode(x)
    signature = {k: tf.TensorSpec([None] if v.shape.rank == 1 else v.shape, v.dtype)
                 for k, v in payload.items() if k != "shape"}

    @tf.function(input_signature=[signature])
    def decode(p):
        if "shape" in payload:
            p = dict(p, shape=tf.constant([3000]))
        return decode_group(codec, p, [x.shape])[0]

    sent = {k: v for k, v in payload.items() if k != "shape"}
    np.testing.assert_array_equal(decode(sent).numpy(), codec.decode(payload).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{codec.name}(:| payload)"):
        decode(dict(sent, **{key: sent[key][:-1]}))


@pytest.mark.parametrize("codec, key, value, words", [
    (C.ThreeLC(1.0), "scale", tf.constant(1, tf.int32), "'scale' is int32"),
    (C.Int8(), "data", tf.zeros([3000], tf.uint8), "'data' is uint8, expected int8"),
    (C.TopK(0.05), "indices", tf.zeros([150], tf.float32), "'indices' is float32"),
    (C.Sparsify(0.25), "values", tf.zeros([750], tf.int32), "'values' is int32"),
    (C.Quantize(4), "bits", tf.constant(4, tf.int32), "'bits' is int32, expected uint8"),
    (C.Quantize(4), "max", tf.constant(1.0, tf.float64), "'max' is float64.*'min'"),
    (C.OneBit(), "shape", tf.constant([30.0, 100.0]), "'shape' is float32"),
    (C.FastSGD(), "sum", tf.constant(1, tf.int64), "'sum' is int64"),
    (C.LogQuant(4), "dtype", tf.zeros([0], tf.int32), "'dtype' is int32"),
    (C.Cast("float16"), "values", tf.zeros([30, 100], tf.bfloat16), "'values' is bfloat16"),
    (C.NoCompression(), "values", tf.zeros([30, 100], tf.int32), "'values' is int32"),
    (C.QSGD(4, seed=0), "norms", tf.zeros([6], tf.uint8), "'norms' is uint8"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_fields_of_another_dtype_are_refused(codec, key, value, words):
    payload = dict(codec.encode(gradient()), **{key: value})
    with pytest.raises(ValueError, match=rf"{codec.name}: payload field {words}"):
        codec.decode(payload)


@pytest.mark.parametrize("codec, key, value", [
    (C.ThreeLC(1.0), "scale", tf.ones([2])),
    (C.Int8(), "scale", tf.ones([3000])),
    (C.Quantize(4), "bits", tf.constant([4], tf.uint8)),
    (C.TopK(0.05), "shape", tf.constant([[30, 100]])),
    (C.Cast("float16"), "dtype", tf.zeros([3])),
], ids=lambda v: v if isinstance(v, str) else None)
def test_fields_of_another_rank_or_size_are_refused(codec, key, value):
    payload = dict(codec.encode(gradient()), **{key: value})
    with pytest.raises(ValueError, match=rf"{codec.name}: payload field '{key}'"):
        codec.decode(payload)


@pytest.mark.parametrize("codec, key", [
    (C.Int8(), "data"), (C.TopK(0.05), "values"), (C.Quantize(4), "data"), (C.OneBit(), "data"),
], ids=lambda v: v if isinstance(v, str) else v.name)
def test_element_counts_must_agree_with_the_declared_shape(codec, key):
    payload = codec.encode(gradient())
    for size in (0, 1, int(tf.size(payload[key])) + 1):
        bad = dict(payload, **{key: tf.zeros([size], payload[key].dtype)})
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{codec.name} payload"):
            codec.decode(bad)
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{codec.name} payload"):
            traced_decode(codec, bad)


def test_quantize_bits_out_of_range_in_a_payload_are_refused():
    payload = C.Quantize(4).encode(gradient())
    for bits in (0, 1, 9, 255):
        bad = dict(payload, bits=tf.constant(bits, tf.uint8))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"bits.*\[2, 8\]"):
            C.Quantize(4).decode(bad)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"bits.*\[2, 8\]"):
            traced_decode(C.Quantize(4), bad)


def test_threelc_batch_payload_needs_one_scale_per_tensor():
    codec = C.ThreeLC(1.0)
    shapes = [(3, 4), (7,), (20,)]
    payload = encode_group(codec, [gradient(s) for s in shapes])[0]
    with pytest.raises(ValueError, match=r"scales does not match.*3 elements, expected 2"):
        decode_group(codec, payload, shapes[:2])
    with pytest.raises(ValueError, match="payload keys"):
        decode_group(codec, dict(payload, shape=tf.constant([3])), shapes)


def test_values_alone_payload_keys_and_dtypes_are_checked():
    codec = C.FastSGD()
    values = gradient([5, 4])
    payload = codec.encode_values(values)
    indices, dense_shape = tf.constant([0, 2, 3, 6, 9]), tf.constant([10, 4], tf.int64)
    assert codec.decode_values(payload, indices, dense_shape).values.shape == (5, 4)
    with pytest.raises(ValueError, match=r"missing \['kept_listed', 'positions'\]"):
        codec.decode_values(codec.encode(values), indices, dense_shape)
    with pytest.raises(ValueError, match="'kept_listed' is int32"):
        codec.decode_values(dict(payload, kept_listed=tf.constant([1])), indices, dense_shape)


def test_sparse_payload_dense_shape_is_bounded_and_checked():
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]), tf.constant([5, 3]))
    for codec in (C.NoCompression(), C.FastSGD()):
        payload = codec.encode(slices)
        huge = dict(payload, dense_shape=tf.constant([2**20, 2**20], payload["dense_shape"].dtype))
        with pytest.raises(ValueError, match="max_decoded_bytes"):
            codec.decode(huge)
        with pytest.raises(ValueError, match=r"expected \[5, 4\]"):
            codec.decode(payload, expected_shape=[5, 4])
        assert codec.decode(payload, expected_shape=[5, 3]).dense_shape.numpy().tolist() == [5, 3]


@pytest.mark.parametrize("make, error", [
    (lambda: C.Quantize(bits=2.5), ValueError),
    (lambda: C.Quantize(bits="4"), TypeError),
    (lambda: C.Quantize(bits=True), TypeError),
    (lambda: C.Quantize(bits=None), TypeError),
    (lambda: C.AdaptiveQuantize(min_bits=2.5), ValueError),
    (lambda: C.AdaptiveQuantize(max_bits=7.5), ValueError),
    (lambda: C.AdaptiveQuantize(rho=float("inf")), ValueError),
    (lambda: C.LogQuant(bits=3.5), ValueError),
    (lambda: C.QSGD(bits=4.5), ValueError),
    (lambda: C.QSGD(bucket_size=511.5), ValueError),
    (lambda: C.FastSGD(threshold=7.5), ValueError),
    (lambda: C.FastSGD(base=float("inf")), ValueError),
    (lambda: C.FastSGD(base="1.1"), TypeError),
    (lambda: C.Sparsify("0.25"), TypeError),
    (lambda: C.TopK(float("nan")), ValueError),
    (lambda: C.ThreeLC(sparsity=None), TypeError),
    (lambda: C.GradiVeQ(sampling_steps=2.5), ValueError),
    (lambda: C.GradiVeQ(reuse=1.5), ValueError),
    (lambda: C.GradiVeQ(warmup_steps="10"), TypeError),
])
def test_non_integer_or_out_of_range_constructor_arguments_are_refused(make, error):
    with pytest.raises(error):
        make()


def test_integral_numbers_are_still_accepted():
    assert C.Quantize(bits=4.0).get_config() == {"bits": 4}
    assert C.QSGD(bits=np.int64(4), bucket_size=512.0).bucket_size == 512
    assert C.LogQuant(bits=np.int32(3)).bits == 3
    assert C.FastSGD(threshold=64.0).threshold == 64


def test_gradiveq_layer_payload_is_checked():
    layer = C.GradiVeQ(warmup_steps=2, sampling_steps=3).bind(tf.Variable(tf.zeros([3, 3, 2, 4])))
    payload = layer.encode(tf.ones([3, 3, 2, 4]))
    with pytest.raises(ValueError, match=r"expected \[3, 3, 4, 2\]"):
        layer.decode(payload, expected_shape=[3, 3, 4, 2])
    with pytest.raises(ValueError, match=r"unexpected \['shape'\]"):
        layer.decode(dict(payload, shape=tf.constant([72])))
    with pytest.raises(ValueError, match="'phase' is float32"):
        layer.decode(dict(payload, phase=tf.constant(0.0)))
    step = int(layer.step.numpy())
    assert layer.decode(payload, expected_shape=[3, 3, 2, 4]).shape == (3, 3, 2, 4)
    assert int(layer.step.numpy()) == step + 1
