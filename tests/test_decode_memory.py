"""Decoders bound what they allocate in bytes, and check before they allocate.

Crafted payloads of every codec, a few bytes to a few MiB, declare huge shapes and
float64 fields; each is refused with MalformedPayloadError while the decoding process
grows by at most a few MiB, with and without an expected shape. Legitimate payloads
whose decodings take just under a (lowered) byte bound decode within it, and just
above it are refused: `decoded_bytes_per_element` counts at least what the decode
allocates. NoCompression's IndexedSlices with indices outside their dense shape, and
GradiVeQ payloads with other than S * d coefficients, are refused too.

Memory is measured in a child process per group of cases: the peak resident set
(VmHWM, reset through /proc/self/clear_refs before each case) above the resident set
before it. Run this file as a script to print the table of the crafted cases:
`python tests/test_decode_memory.py`.
"""
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest

MiB = 2**20
HUGE = 2**28  # the declared element count of the crafted payloads
LIMIT_MIB = 64  # the most a refused payload may make a decoding process grow
LOWERED_BOUND = 24 * MiB  # MAX_DECODED_BYTES in the bound's accuracy cases
SLACK_MIB = 6  # allocator and kernel overheads above the bound

# --- the cases (built in the child process) --------------------------------------------


def _crafted():
    """{name: (codec, crafted payload, expected_shape to decode it with a matching,
    consistent one of the same codec and dtype, for warming up)}; expected_shape is the
    declared shape where the payload's other fields contradict it (a receiver that
    expects that shape must still refuse it before allocating), else None."""
    import tensorflow as tf

    import tfgc
    import tfgc_ops
    from tfgc.codecs import quartic

    C = tfgc.codecs
    f64, f32 = np.float64, np.float32
    shape = np.array([HUGE], np.int32)

    def bits(count, bits_per_value):
        return np.zeros(count * bits_per_value // 8, np.uint8)

    def keys(values):
        return tfgc_ops.pack_keys(tf.constant(values, tf.int64)).numpy()

    def small(codec, dtype):
        return codec.encode(tf.constant(np.linspace(-1, 1, 1000), dtype))

    rows = tf.IndexedSlices(tf.ones([2, 3], tf.float64), tf.constant([0, 5]),
                            tf.constant([10, 3]))
    return {
        "RandomK(1.0)": (C.RandomK(1.0, seed=0), {
            "values": np.ones(1, f32), "seed": np.array([1, 2], np.int64), "shape": shape},
            [HUGE], lambda c: small(c, f32)),
        "RandomK(0.1)": (C.RandomK(0.1, seed=0), {
            "values": np.ones(1, f32), "seed": np.array([1, 2], np.int64), "shape": shape},
            [HUGE], lambda c: small(c, f32)),
        "TopK float64": (C.TopK(0.01), {
            "indices": np.zeros(0, np.int32), "values": np.zeros(0, f64), "shape": shape},
            None, lambda c: small(c, f64)),
        "ThreeLC(entropy) float64": (C.ThreeLC(1.0, coder="entropy"), {
            # rANS of all-zero 3-values: the same 6 bytes for any number of groups.
            "data": tfgc_ops.quartic_entropy_encode(
                tf.fill([5], tf.constant(121, tf.uint8)), [5]).numpy(),
            "scale": f64(1.0), "shape": shape}, None, lambda c: small(c, f64)),
        "ThreeLC(zre) float64": (C.ThreeLC(1.0), {
            "data": np.zeros(16, np.uint8), "scale": f64(1.0), "shape": shape},
            [HUGE], lambda c: small(c, f64)),
        "FastSGD float64": (C.FastSGD(), {
            "keys": keys([]), "values": np.zeros(0, np.uint8), "sum": f64(1.0),
            "dtype": np.zeros(0, f64), "shape": shape}, None, lambda c: small(c, f64)),
        "FastSGD rows float64": (C.FastSGD(), {
            # Two rows of 2**27 values, none listed as dropped: every value is kept,
            # and no code is sent for them.
            "rows": keys([0, 1]), "dense_shape": np.array([2, HUGE // 2], np.int64),
            "index_dtype": np.zeros(0, np.int32),
            "row_values.positions": keys([]), "row_values.kept_listed": np.zeros(1, np.uint8),
            "row_values.values": np.zeros(0, np.uint8), "row_values.sum": f64(1.0),
            "row_values.dtype": np.zeros(0, f64)},
            [2, HUGE // 2], lambda c: c.encode(rows)),
        "OneBit float64": (C.OneBit(), {
            "data": bits(HUGE, 1), "positive": f64(1.0), "negative": f64(-1.0),
            "shape": shape}, None, lambda c: small(c, f64)),
        "ScaledSign float64": (C.ScaledSign(), {
            "data": bits(HUGE, 1), "scale": f64(1.0), "shape": shape},
            None, lambda c: small(c, f64)),
        "Sparsify float64": (C.Sparsify(0.25), {
            "bitmap": bits(HUGE, 1), "values": np.zeros(0, f64), "shape": shape},
            None, lambda c: small(c, f64)),
        "ChunkedTopK float64": (C.ChunkedTopK(0.02), {
            "positions": np.zeros(3, np.uint8), "codes": np.zeros(1, np.uint8),
            "levels": np.zeros(2, f64), "shape": shape}, None, lambda c: small(c, f64)),
        "Sparsify float32": (C.Sparsify(0.25), {
            "bitmap": bits(HUGE, 1), "values": np.zeros(0, f32), "shape": shape},
            None, lambda c: small(c, f32)),
        "Quantize(2) float64": (C.Quantize(2), {
            "data": bits(HUGE, 2), "min": f64(0.0), "max": f64(1.0),
            "bits": np.uint8(2), "shape": shape}, None, lambda c: small(c, f64)),
        "LogQuant(2) float64": (C.LogQuant(2), {
            "data": bits(HUGE, 2), "scale": f32(1.0), "dtype": np.zeros(0, f64),
            "shape": shape}, None, lambda c: small(c, f64)),
        "QSGD(2) float64": (C.QSGD(2, seed=0), {
            "data": bits(HUGE, 2), "norms": np.zeros(HUGE // 512, f64), "shape": shape},
            None, lambda c: small(c, f64)),
        "StochasticTernary float64": (C.StochasticTernary(seed=0), {
            "data": np.full(quartic.groups_for(HUGE), 121, np.uint8), "scale": f64(1.0),
            "shape": shape}, None, lambda c: small(c, f64)),
    }


def _bounded():
    """{name: (codec, dtype)}: codecs whose decodings the byte bound limits."""
    import tfgc

    C = tfgc.codecs
    codecs = {
        "NoCompression": C.NoCompression(), "Cast(float16)": C.Cast("float16"),
        "Int8": C.Int8(), "ThreeLC": C.ThreeLC(1.0),
        "ThreeLC(entropy)": C.ThreeLC(1.0, coder="entropy"),
        "StochasticTernary": C.StochasticTernary(seed=0), "OneBit": C.OneBit(),
        "Sparsify": C.Sparsify(0.25), "TopK": C.TopK(0.5), "LogQuant": C.LogQuant(4),
        "FastSGD": C.FastSGD(), "Quantize": C.Quantize(4), "QSGD": C.QSGD(4, seed=0),
        "RandomK(1.0)": C.RandomK(1.0, seed=0), "RandomK(0.1)": C.RandomK(0.1, seed=0),
        "ScaledSign": C.ScaledSign(), "ChunkedTopK": C.ChunkedTopK(0.02),
    }
    return {f"{name} {dtype}": (codec, dtype) for name, codec in codecs.items()
            for dtype in ("float32", "float64")}


# --- the child process ------------------------------------------------------------------


def _status_kib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(decode):
    """(outcome, message, MiB the process grew by at its peak while running `decode`)."""
    import tensorflow as tf

    from tfgc.codecs import MalformedPayloadError

    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak resident set starts again from the current one
    before = _status_kib("VmRSS")
    try:
        out = decode()
        outcome, message = "decoded", ""
        del out
    except MalformedPayloadError as e:
        outcome, message = "refused", str(e)
    except tf.errors.InvalidArgumentError as e:
        outcome, message = "invalid", e.message
    except Exception as e:  # noqa: BLE001  (reported, and failed by the tests)
        outcome, message = f"error {type(e).__name__}", str(e)
    peak = _status_kib("VmHWM")
    return outcome, message[:300], max(peak - before, 0) / 1024


def _traced(codec, payload):
    """A tf.function decoding payloads whose fields are of unknown length."""
    import tensorflow as tf

    signature = {key: tf.TensorSpec([None] * tensor.shape.rank, tensor.dtype)
                 for key, tensor in payload.items()}
    return tf.function(codec.decode, input_signature=[signature])


def _run_crafted(names, modes):
    """Decodes each crafted payload, in each mode: eagerly or traced, with its expected
    shape ("declared": only those that contradict it), a small one that differs
    ("other") or none."""
    for mode in modes:
        chosen = [name for name in names if name in CONTRADICTING or
                  not mode.endswith("declared")]
        yield from _run_crafted_mode(chosen, mode)


def _run_crafted_mode(names, mode):
    import tensorflow as tf

    cases = _crafted()
    for name in names:
        codec, payload, declared, warm = cases[name]
        payload = {key: tf.constant(value) for key, value in payload.items()}
        warm = {key: tf.convert_to_tensor(value) for key, value in warm(codec).items()}
        expected = {"declared": declared, "other": [1000]}.get(mode.split()[-1])
        if mode == "traced":
            decode = _traced(codec, payload)
            decode(warm)  # traced once, kernels loaded
        else:
            codec.decode(warm)
            decode = lambda p: codec.decode(p, expected_shape=expected)  # noqa: E731
        outcome, message, grown = _measure(lambda: decode(payload))
        yield {"case": name, "mode": mode, "outcome": outcome, "grown_mib": grown,
               "message": message}


def _run_bounded(names):
    """Lowers MAX_DECODED_BYTES; encodes each codec's tensors whose decodings take just
    under and just above it (by `decoded_bytes_per_element`), and decodes them."""
    import tensorflow as tf

    from tfgc.codecs import validation

    validation.MAX_DECODED_BYTES = LOWERED_BOUND
    validation.MAX_DECODED_ELEMENTS = 2**31 - 1
    cases = _bounded()
    rng = np.random.default_rng(0)
    for name in names:
        codec, dtype = cases[name]
        probe = codec.encode(tf.constant(rng.normal(size=1000), dtype))
        codec.decode(probe)  # kernels loaded
        fields = {key: tf.convert_to_tensor(value) for key, value in probe.items()}
        per_element = validation.bytes_per_element(codec, fields)
        largest = int(LOWERED_BOUND // per_element)
        for n, side in ((largest, "under"), (int(largest * 1.02) + 8, "over")):
            x = tf.constant(rng.normal(size=n), dtype)
            payload = codec.encode(x)
            del x
            outcome, message, grown = _measure(lambda p=payload: codec.decode(p))
            yield {"case": name, "mode": side, "n": n, "per_element": per_element,
                   "outcome": outcome, "grown_mib": grown, "message": message}


def _child(kind, names, modes=()):
    """Runs cases in a fresh process; returns their results (dicts)."""
    # Every large buffer its own mapping, returned when freed (oneDNN's allocator keeps
    # them): the resident set then follows what is allocated.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
               TF_ENABLE_ONEDNN_OPTS="0", MALLOC_MMAP_THRESHOLD_="65536",
               MALLOC_TRIM_THRESHOLD_="0")
    spec = json.dumps({"kind": kind, "names": names, "modes": list(modes)})
    done = subprocess.run([sys.executable, __file__, "--child", spec], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise AssertionError(f"the child process failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _child_main(spec):
    spec = json.loads(spec)
    if spec["kind"] == "crafted":
        results = _run_crafted(spec["names"], spec["modes"])
    else:
        results = _run_bounded(spec["names"])
    for result in results:
        print(json.dumps(result), flush=True)


# --- the tests --------------------------------------------------------------------------

needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="measures memory through Linux /proc")
CRAFTED = ["RandomK(1.0)", "RandomK(0.1)", "TopK float64", "ThreeLC(entropy) float64",
           "ThreeLC(zre) float64", "FastSGD float64", "FastSGD rows float64",
           "OneBit float64", "ScaledSign float64", "Sparsify float64", "Sparsify float32",
           "ChunkedTopK float64",
           "Quantize(2) float64", "LogQuant(2) float64", "QSGD(2) float64",
           "StochasticTernary float64"]
# Payloads that contradict their declared shape: refused even by a receiver expecting it.
CONTRADICTING = ["RandomK(1.0)", "RandomK(0.1)", "ThreeLC(zre) float64",
                 "FastSGD rows float64"]


def _describe(results):
    return "\n".join(f"{r['case']} [{r['mode']}]: {r['outcome']}, grew {r['grown_mib']:.1f} MiB"
                     f" {r['message'][:160]}" for r in results)


@needs_proc
@pytest.mark.parametrize("modes", [["eager", "eager declared", "eager other"], ["traced"]],
                         ids=["eager", "traced"])
def test_crafted_payloads_are_refused_before_allocating(modes):
    results = _child("crafted", CRAFTED, modes)
    assert [(r["case"], r["mode"]) for r in results] == [
        (name, mode) for mode in modes
        for name in (CONTRADICTING if mode.endswith("declared") else CRAFTED)]
    # Eagerly everything is known while the decode is built: MalformedPayloadError.
    # Traced, the run-time checks raise InvalidArgumentError, before allocating too.
    bad = [r for r in results
           if r["outcome"] not in (("refused",) if r["mode"].startswith("eager")
                                   else ("refused", "invalid"))
           or r["grown_mib"] > LIMIT_MIB]
    assert not bad, _describe(bad)


@needs_proc
def test_decodings_stay_within_the_byte_bound_and_just_above_it_are_refused():
    results = _child("bounded", list(_bounded()))
    bound_mib = LOWERED_BOUND / MiB
    bad = [r for r in results if (
        r["mode"] == "under" and (r["outcome"] != "decoded"
                                  or r["grown_mib"] > bound_mib + SLACK_MIB))
        or (r["mode"] == "over" and (r["outcome"] != "refused" or r["grown_mib"] > SLACK_MIB))]
    assert not bad, _describe(bad)


def test_slices_with_indices_outside_the_dense_shape_are_refused():
    import tensorflow as tf

    import tfgc
    from tfgc.codecs import MalformedPayloadError

    codec = tfgc.codecs.NoCompression()
    good = codec.encode(tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 36]),
                                         tf.constant([37, 3])))
    assert codec.decode(good).indices.numpy().tolist() == [0, 36]
    for dtype in (tf.int32, tf.int64):
        signature = {key: tf.TensorSpec([None], value.dtype) for key, value in good.items()}
        signature["indices"] = tf.TensorSpec([None], dtype)
        traced = tf.function(codec.decode, input_signature=[signature])
        assert traced(dict(good, indices=tf.constant([0, 36], dtype))).values.shape == (2, 3)
        for index in (-1, 37, 42, 2**31 - 1):
            payload = dict(good, indices=tf.constant([0, index], dtype))
            for expected in (None, [37, 3]):
                with pytest.raises(MalformedPayloadError, match=r"outside \[0, 37\)"):
                    codec.decode(payload, expected_shape=expected)
            with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
                traced(payload)


def test_gradiveq_payload_with_another_coefficient_count_is_refused():
    import tensorflow as tf

    import tfgc
    from tfgc.codecs import MalformedPayloadError
    from tfgc.codecs.gradiveq import COMPRESSED

    layer = tfgc.codecs.GradiVeQ(warmup_steps=1, sampling_steps=3, compressed_steps=50,
                                 seed=0).bind(tf.Variable(tf.zeros([3, 3, 2, 4])))
    rng = np.random.default_rng(0)
    while int(layer.phase.numpy()) != COMPRESSED:
        layer.decode(layer.encode(tf.constant(rng.normal(size=[3, 3, 2, 4]), tf.float32)))
    payload = layer.encode(tf.constant(rng.normal(size=[3, 3, 2, 4]), tf.float32))
    coefficients = payload["coefficients"]
    assert coefficients.shape[0] == layer.num_slices * int(layer.dim.numpy())
    layer.decode(payload)
    for wrong in (tf.zeros([0]), tf.concat([coefficients, coefficients], 0),
                  coefficients[:-1]):
        with pytest.raises(MalformedPayloadError, match="coefficients"):
            layer.decode(dict(payload, coefficients=wrong))
    signature = {key: tf.TensorSpec([None] * value.shape.rank, value.dtype)
                 for key, value in payload.items()}
    traced = tf.function(layer.decode, input_signature=[signature])
    traced(payload)
    with pytest.raises(tf.errors.InvalidArgumentError, match="coefficients"):
        traced(dict(payload, coefficients=tf.concat([coefficients, coefficients], 0)))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child_main(sys.argv[2])
    else:
        for result in _child("crafted", CRAFTED, ["eager", "eager declared"]):
            print(f"{result['case']:28} {result['mode']:15} {result['outcome']:9} "
                  f"{result['grown_mib']:9.1f} MiB  {result['message'][:90]}", flush=True)
