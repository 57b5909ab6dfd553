"""Compresses real gradients with every tfgc codec and prints a comparison table.

A small Keras MLP is trained on scikit-learn's bundled digits (real 8x8 handwritten
digits, no network needed); the gradients of several steps are kept, and each codec
encodes and decodes the same gradients:

    python -m models.codec_demo [--steps 30] [--keep 10] [--repeats 3] [--csv out.csv]

Columns: bits per value on the wire, compression ratio against fp32, relative L2 error
of one encode/decode, relative L2 error of the sum over all kept steps when the codec
runs under ErrorFeedback (what training sees), encode and decode throughput in GB/s of
fp32 input (inside tf.function, best of --repeats).
"""
import argparse
import csv
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tfgc

DATASET_NOTE = "scikit-learn digits (1797 real 8x8 images, bundled with scikit-learn)"


def demo_codecs():
    """The codecs compared, by display name: every codec tfgc has, at the papers' settings."""
    codecs = tfgc.codecs
    return {
        "fp32 (none)": codecs.NoCompression(),
        "fp16": codecs.Cast("float16"),
        "bf16": codecs.Cast("bfloat16"),
        "8-bit int": codecs.Int8(),
        "Quantize 8-bit": codecs.Quantize(8),
        "Quantize 4-bit": codecs.Quantize(4),
        "Quantize 2-bit": codecs.Quantize(2),
        "QSGD 4-bit": codecs.QSGD(4, seed=0),
        "LogQuant 4-bit": codecs.LogQuant(4),
        "Stoch 3-value+QE": codecs.StochasticTernary(seed=0),
        "MQE 1-bit": codecs.OneBit(),
        "25% sparsify": codecs.Sparsify(0.25),
        "5% sparsify": codecs.Sparsify(0.05),
        "Top-k 1%": codecs.TopK(0.01),
        "FastSGD": codecs.FastSGD(),
        "3LC s=1.00": codecs.ThreeLC(1.0),
        "3LC s=1.50": codecs.ThreeLC(1.5),
        "3LC s=1.75": codecs.ThreeLC(1.75),
        "3LC s=1.90": codecs.ThreeLC(1.9),
        "3LC s=1.00 rANS": codecs.ThreeLC(1.0, coder="entropy"),
        "3LC s=1.75 rANS": codecs.ThreeLC(1.75, coder="entropy"),
    }


def load_digits():
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype(np.float32).reshape(-1, 64)
    return images, digits.target.astype(np.int64)


def train_and_collect_gradients(steps, keep, batch_size=64, seed=0):
    """Trains an MLP with SGD and returns the gradients of the last `keep` steps."""
    tf.keras.utils.set_random_seed(seed)
    images, labels = load_digits()
    model = tf.keras.Sequential(
        [
            tf.keras.Input([64]),
            tf.keras.layers.Dense(512, activation="relu"),
            tf.keras.layers.Dense(512, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(0.05)
    rng = np.random.default_rng(seed)
    kept = []
    for step in range(steps):
        batch = rng.choice(len(images), batch_size, replace=False)
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[batch], model(images[batch], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if step >= steps - keep:
            kept.append([tf.identity(g) for g in grads])
        if step % 10 == 0 or step == steps - 1:
            print(f"  step {step + 1}/{steps}  loss {float(loss):.3f}", flush=True)
    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return kept, n_params


def best_seconds(fn, repeats):
    fn()  # trace and compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(codec, gradient_sets, repeats):
    """Bits/value, ratio, relative error and GB/s of one codec over all gradients."""
    values = sum(int(tf.size(g)) for g in gradient_sets[0]) * len(gradient_sets)
    fp32_bytes = 4 * values
    wire_bytes, err_sq, ref_sq = 0, 0.0, 0.0
    for grads in gradient_sets:
        for g in grads:
            payload = codec.encode(g)
            wire_bytes += int(tfgc.codecs.payload_nbytes(payload))
            decoded = codec.decode(payload)
            err_sq += float(tf.reduce_sum(tf.square(decoded - g)))
            ref_sq += float(tf.reduce_sum(tf.square(g)))

    with warnings.catch_warnings():  # measured on unbiased codecs too, on purpose
        warnings.simplefilter("ignore")
        feedback = tfgc.ErrorFeedback(codec)
    sums_in = [tf.zeros_like(g) for g in gradient_sets[0]]
    sums_sent = [tf.zeros_like(g) for g in gradient_sets[0]]
    for grads in gradient_sets:
        for i, g in enumerate(grads):
            sums_in[i] += g
            sums_sent[i] += feedback.decode(feedback.encode(g, key=i))
    feedback_err_sq = sum(float(tf.reduce_sum(tf.square(a - b))) for a, b in zip(sums_sent, sums_in))
    feedback_ref_sq = sum(float(tf.reduce_sum(tf.square(b))) for b in sums_in)

    @tf.function
    def encode_all(sets):
        return [[codec.encode(g) for g in grads] for grads in sets]

    @tf.function
    def decode_all(payloads):
        return [[codec.decode(p) for p in ps] for ps in payloads]

    payloads = encode_all(gradient_sets)
    # Reading one scalar per output forces the work without copying it to Python.
    encode_s = best_seconds(
        lambda: [tf.nest.map_structure(lambda t: t.shape, ps) for ps in encode_all(gradient_sets)],
        repeats,
    )
    decode_s = best_seconds(lambda: decode_all(payloads), repeats)
    return {
        "bits_per_value": 8 * wire_bytes / values,
        "ratio": fp32_bytes / wire_bytes,
        "relative_error": (err_sq / ref_sq) ** 0.5 if ref_sq else 0.0,
        "feedback_error": (feedback_err_sq / feedback_ref_sq) ** 0.5 if feedback_ref_sq else 0.0,
        "encode_gbps": fp32_bytes / encode_s / 1e9,
        "decode_gbps": fp32_bytes / decode_s / 1e9,
    }


def format_table(rows):
    header = (f"{'codec':<18}{'bits/value':>11}{'ratio':>9}{'rel. error':>12}{'with EF':>9}"
              f"{'enc GB/s':>10}{'dec GB/s':>10}")
    lines = [header, "-" * len(header)]
    for name, r in rows.items():
        lines.append(
            f"{name:<18}{r['bits_per_value']:>11.3f}{r['ratio']:>9.1f}{r['relative_error']:>12.4f}"
            f"{r['feedback_error']:>9.4f}"
            f"{r['encode_gbps']:>10.3f}{r['decode_gbps']:>10.3f}"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--keep", type=int, default=10, help="compress the last N steps' gradients")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (best is kept)")
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args = parser.parse_args(argv)
    if not 1 <= args.keep <= args.steps:
        parser.error("--keep must be in [1, --steps]")

    print(f"dataset: {DATASET_NOTE}")
    print(f"training an MLP 64-512-512-10 for {args.steps} steps ...", flush=True)
    gradient_sets, n_params = train_and_collect_gradients(args.steps, args.keep)
    print(f"compressing the gradients of {args.keep} steps x {n_params} parameters "
          f"with each codec ...", flush=True)
    rows = {}
    for name, codec in demo_codecs().items():
        rows[name] = measure(codec, gradient_sets, args.repeats)
        print(f"  {name} done", flush=True)
    print()
    print(format_table(rows))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["codec"] + list(next(iter(rows.values()))))
            for name, r in rows.items():
                writer.writerow([name] + [f"{v:.6g}" for v in r.values()])
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
