"""A malformed-message campaign over every codec: mutated fused messages (bytes flipped,
cut, extended, lengths forged) go to a receiver that knows the layout. Each either
decodes to the shape the receiver expects or fails with InvalidArgument: no crash, no
other error, and no output sized by what the message declares."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc.codecs.base import decode_group, encode_group
from tfgc.wire import Layout

C = tfgc.codecs
CODECS = [
    C.NoCompression(), C.Cast("float16"), C.Cast("bfloat16"), C.Int8(), C.ThreeLC(1.0),
    C.ThreeLC(1.75), C.ThreeLC(1.75, coder="entropy"), C.StochasticTernary(seed=0), C.OneBit(), C.Sparsify(0.05), C.TopK(0.05),
    C.LogQuant(), C.FastSGD(), C.Quantize(4), C.QSGD(bits=4, seed=0), C.ScaledSign(),
    C.RandomK(0.1, seed=0), C.ChunkedTopK(0.05, chunk=64),
]
TRIALS = 120


def mutations(good, header_nbytes, rng):
    """Yields malformed variants of the message `good` (uint8 numpy array)."""
    for _ in range(TRIALS):
        bad = good.copy()
        kind = rng.integers(5)
        if kind == 0 and bad.size:  # flip a few bytes anywhere
            positions = rng.integers(0, bad.size, size=rng.integers(1, 4))
            bad[positions] ^= rng.integers(1, 256, size=positions.size).astype(np.uint8)
        elif kind == 1:  # cut
            bad = bad[: rng.integers(0, max(bad.size, 1))]
        elif kind == 2:  # extend with noise
            bad = np.concatenate([bad, rng.integers(0, 256, rng.integers(1, 64)).astype(np.uint8)])
        elif kind == 3 and header_nbytes:  # forge a length word
            word = rng.integers(0, header_nbytes // 4)
            value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, int(rng.integers(0, 2**32))])
            bad[4 * word: 4 * word + 4] = np.array([value], np.uint32).view(np.uint8)
        else:  # random bytes of the same size
            bad = rng.integers(0, 256, bad.size).astype(np.uint8)
        yield bad


def send_mutations(receive, good, layout, rng):
    """Passes every mutation of `good` to `receive`; returns {"refused": how many raised
    InvalidArgument, "outputs": what the others decoded to}. Any other error fails."""
    outcomes = {"refused": 0, "outputs": []}
    for bad in mutations(good, layout.header_nbytes, rng):
        try:
            outcomes["outputs"].append(receive(tf.constant(bad, tf.uint8)))
        except tf.errors.InvalidArgumentError:
            outcomes["refused"] += 1
    return outcomes


@pytest.mark.parametrize("codec", CODECS, ids=repr)
def test_malformed_fused_messages_decode_to_the_expected_shape_or_fail_cleanly(codec):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=[37, 29]).astype(np.float32))
    holder = {}

    @tf.function(input_signature=[tf.TensorSpec(x.shape, tf.float32)])
    def pack(t):
        layout, message = Layout.pack([codec.encode(t)])
        holder["layout"] = layout
        return message

    good = pack(x).numpy()
    layout = holder["layout"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8)])
    def receive(message):
        [payload] = layout.unpack(message)
        return codec.decode(payload)

    decoded = receive(tf.constant(good)).numpy()
    assert decoded.shape == tuple(x.shape)
    if not isinstance(codec, C.StochasticCodec):  # others draw anew on each encode
        np.testing.assert_array_equal(decoded, codec.decode(codec.encode(x)).numpy())
    outcomes = send_mutations(receive, good, layout, rng)
    for out in outcomes["outputs"]:
        assert out.shape == x.shape and out.dtype == x.dtype, (codec, out.shape)
    assert outcomes["refused"] > 0, outcomes  # cuts and extensions at least


@pytest.mark.parametrize(
    "codec", [C.ThreeLC(1.0), C.ThreeLC(1.75), C.Cast("float16"), C.Cast("bfloat16")], ids=repr)
def test_malformed_batched_messages_decode_to_the_expected_shapes_or_fail_cleanly(codec):
    rng = np.random.default_rng(1)
    shapes = [(3, 3, 8, 8), (7,), (20, 33)]
    xs = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]
    holder = {}

    @tf.function(input_signature=[tf.TensorSpec(s, tf.float32) for s in shapes])
    def pack(*tensors):
        layout, message = Layout.pack([encode_group(codec, list(tensors))[0]])
        holder["layout"] = layout
        return message

    good = pack(*xs).numpy()
    layout = holder["layout"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8)])
    def receive(message):
        [payload] = layout.unpack(message)
        return decode_group(codec, payload, shapes)

    for decoded, x in zip(receive(tf.constant(good)), xs):
        np.testing.assert_array_equal(decoded.numpy(), codec.decode(codec.encode(x)).numpy())
    outcomes = send_mutations(receive, good, layout, rng)
    for out in outcomes["outputs"]:
        assert [tuple(t.shape) for t in out] == shapes
    assert outcomes["refused"] > 0, outcomes
