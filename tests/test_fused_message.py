"""The fused message (tfgc.wire.Layout): many payloads in one uint8 tensor, unpacked
against the layout both sides know; malformed messages fail with InvalidArgument."""
import numpy as np
import pytest
import tensorflow as tf

import tfgc
from tfgc.wire import Layout


def payloads_of(tensors):
    codecs = [tfgc.codecs.ThreeLC(1.0), tfgc.codecs.Cast("float16"), tfgc.codecs.FastSGD(),
              tfgc.codecs.Int8()]
    return codecs, [c.encode(t) for c, t in zip(codecs, tensors)]


def example_tensors(rng):
    return [tf.constant(rng.normal(size=shape).astype(np.float32))
            for shape in ([40, 30], [17], [3, 3, 4, 5], [1000])]


def test_round_trip_in_a_traced_step_sends_no_shapes(rng):
    tensors = example_tensors(rng)

    @tf.function
    def fused(*xs):
        codecs, payloads = payloads_of(xs)
        layout, message = Layout.pack(payloads)
        decoded = [c.decode(p) for c, p in zip(codecs, layout.unpack(message))]
        counted = tf.add_n(layout.payload_nbytes(payloads))
        plain = tf.add_n([tfgc.codecs.payload_nbytes(p) for p in payloads])
        return decoded, tf.size(message, out_type=tf.int64), counted, plain

    decoded, size, counted, plain = fused(*tensors)
    codecs, payloads = payloads_of(tensors)
    for codec, payload, got in zip(codecs, payloads, decoded):
        np.testing.assert_array_equal(got.numpy(), codec.decode(payload).numpy())
    # What each payload accounts for adds up to the message.
    assert int(counted) == int(size)
    # Shapes are part of the layout, not of the message: it is smaller than the payloads
    # (ThreeLC and FastSGD carry an int32 shape each), by less than 4 bytes of lengths.
    assert int(size) < int(plain)


def test_static_entries_and_fixed_shapes_are_known_to_the_receiver():
    x = tf.zeros([10, 10])
    graph = tf.function(lambda t: Layout.pack([tfgc.codecs.ThreeLC(1.0).encode(t)])[1])
    concrete = graph.get_concrete_function(tf.TensorSpec([10, 10], tf.float32))
    message = concrete(x).numpy()
    # data (variable length: one int32 length word) + scale (4 bytes); no shape.
    length = int(np.frombuffer(message[:4].tobytes(), np.int32)[0])
    assert message.size == 4 + length + 4


def test_eager_packing_sends_every_non_empty_entry(rng):
    # Eagerly nothing is left out but empty entries, and every vector (ThreeLC's data
    # and shape) carries its length: another replica's may differ.
    x = tf.constant(rng.normal(size=[5, 4]).astype(np.float32))
    payload = tfgc.codecs.ThreeLC(1.0).encode(x)
    layout, message = Layout.pack([payload])
    assert int(tf.size(message)) == int(tfgc.codecs.payload_nbytes(payload)) + 2 * 4
    [unpacked] = layout.unpack(message)
    np.testing.assert_array_equal(tfgc.codecs.ThreeLC(1.0).decode(unpacked).numpy(),
                                  tfgc.codecs.ThreeLC(1.0).decode(payload).numpy())


def malformed_messages(message, header_bytes):
    header = np.frombuffer(message[:header_bytes].tobytes(), np.int32).copy()
    body = message[header_bytes:]
    yield "truncated", message[:-1]
    yield "one byte more", np.concatenate([message, [7]]).astype(np.uint8)
    yield "empty", message[:0]
    yield "header only", message[:header_bytes]
    grown = header.copy()
    grown[0] += 2**30  # declares a huge entry: must fail, not allocate
    yield "length too large", np.concatenate([grown.view(np.uint8), body]).astype(np.uint8)
    negative = header.copy()
    negative[0] = -5
    yield "negative length", np.concatenate([negative.view(np.uint8), body]).astype(np.uint8)
    shifted = header.copy()
    shifted[0] -= 1
    shifted[1] += 1  # same total size, lengths moved between entries
    yield "lengths moved", np.concatenate([shifted.view(np.uint8), body]).astype(np.uint8)


@pytest.mark.parametrize("case", ["truncated", "one byte more", "empty", "header only",
                                  "length too large", "negative length", "lengths moved"])
def test_malformed_messages_fail_with_invalid_argument(rng, case):
    tensors = example_tensors(rng)
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
    holder = {}

    def pack(*xs):
        _, payloads = payloads_of(xs)
        layout, message = Layout.pack(payloads)
        holder["layout"] = layout
        return message

    message = tf.function(pack, input_signature=specs)(*tensors).numpy()
    layout = holder["layout"]
    bad = dict(malformed_messages(message, layout.header_nbytes))[case]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8)])
    def receive(m):
        codecs = payloads_of(tensors)[0]
        return [c.decode(p) for c, p in zip(codecs, layout.unpack(m))]

    if case == "lengths moved":
        # The size matches, so the layout cannot tell; the decoders' own checks must.
        with pytest.raises(tf.errors.InvalidArgumentError):
            receive(tf.constant(bad, tf.uint8))
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match="fused_message"):
        receive(tf.constant(bad, tf.uint8))
    # ...and the same receiver still takes a good message.
    assert len(receive(tf.constant(message, tf.uint8))) == 4


def test_entries_of_unknown_rank_above_one_are_refused():
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def pack(x):
        return Layout.pack([{"values": x}])[1]

    with pytest.raises(ValueError, match="rank-1"):
        pack.get_concrete_function()


def test_eager_unpacking_names_the_message(rng):
    x = tf.constant(rng.normal(size=[5, 4]).astype(np.float32))
    layout, message = Layout.pack([tfgc.codecs.ThreeLC(1.0).encode(x)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="my message: its size does not match its layout"):
        layout.unpack(message[:-1], name="my message")
