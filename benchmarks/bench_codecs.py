"""Encode and decode throughput of every codec, in one table, against a one-pass XLA probe.

    python benchmarks/bench_codecs.py --values 16777216 --repeats 5

One process, TensorFlow set to --threads intra- and inter-op threads (default 1) and the
BFC CPU allocator (TF_CPU_ALLOCATOR_USE_BFC=true, set before TensorFlow is imported, so
that a fresh large tensor reuses memory instead of page-faulting). The input is one
float32 tensor of --values heavy-tailed, gradient-like values (Student-t, df=3, * 1e-3,
seed 0; the `t3` buffer of bench_throughput.py).

For each codec, inside a tf.function:
  encode   codec.encode(x) -> payload; the function returns the whole payload, so no
           part of the work can be pruned away.
  decode   codec.decode(payload) -> tensor; the function returns the whole tensor.
FastSGD, made for sparse gradients, drops every value below sum|v| / b^tau: on the dense
input it keeps a handful of values, so it also gets a row on a sparse input (the same
values with 99% of them zeroed at random positions, seed 1).
Both are reported in GB/s of float32 input (4 bytes per value), best of --repeats samples
(bench_throughput.measure: warm-up call, then samples of >= 20 ms).

The probe is `tf.function(lambda x: x * 2.0, jit_compile=True)` over the same tensor,
measured in the same process: the cost of one read and one fresh float32 write of this
size. The ratio columns divide each codec's throughput by the probe's, which makes rows
comparable across runs on a shared, noisy machine. The target ("every codec at
memory speed") is >= 1 GB/s per thread and >= 0.2x the probe, both ways.

GradiVeQ is not in the table: it is stateful (PCA bases learnt from the layer's own
gradients, per slice) and its cost is measured in benchmarks/gradiveq_study.py.
PowerSGD, also bound to one variable, is measured on the input seen as a matrix of 4096
columns (its warm start moves with every encode, as in training).
"""
import argparse
import json
import os
import sys

import numpy as np

TARGET_GBPS = 1.0
TARGET_PROBE_RATIO = 0.2


def codecs_to_measure():
    """(label, codec) for every stateless codec, in a default or typical configuration."""
    from tfgc import codecs as C

    return [
        ("NoCompression", C.NoCompression()),
        ("Cast(float16)", C.Cast("float16")),
        ("Cast(bfloat16)", C.Cast("bfloat16")),
        ("Int8", C.Int8()),
        ("Quantize(4)", C.Quantize(4)),
        ("Quantize(8)", C.Quantize(8)),
        ("AdaptiveQuantize", C.AdaptiveQuantize()),
        ("QSGD(4)", C.QSGD(4, seed=1)),
        ("QSGD(8)", C.QSGD(8, seed=1)),
        ("LogQuant(4)", C.LogQuant(4)),
        ("OneBit", C.OneBit()),
        ("StochasticTernary", C.StochasticTernary(seed=1)),
        ("ThreeLC(1.0)", C.ThreeLC(1.0)),
        ("ThreeLC(1.75)", C.ThreeLC(1.75)),
        ("ThreeLC(1.0) rANS", C.ThreeLC(1.0, coder="entropy")),
        ("Sparsify(0.05)", C.Sparsify(0.05)),
        ("TopK(0.01)", C.TopK(0.01)),
        ("FastSGD", C.FastSGD()),
        ("FastSGD (1% non-zero)", C.FastSGD()),
        ("RandomK(0.01)", C.RandomK(0.01, seed=1)),
        ("ScaledSign", C.ScaledSign()),
        ("PowerSGD(1)", AsMatrix(C.PowerSGD(rank=1))),
        ("PowerSGD(4)", AsMatrix(C.PowerSGD(rank=4))),
    ]


class AsMatrix:
    """A PowerSGD codec bound to a matrix of 4096 columns, fed the benchmark's vector
    (bound at the first encode, when the vector's length is known)."""

    COLUMNS = 4096

    def __init__(self, codec):
        self.codec = codec
        self.layer = None

    def encode(self, x):
        import tensorflow as tf

        shape = [x.shape[0] // self.COLUMNS, self.COLUMNS]
        if self.layer is None:
            self.layer = self.codec.bind(tf.Variable(tf.zeros(shape), name="matrix"))
        if x.shape[0] != shape[0] * shape[1]:
            x = x[: shape[0] * shape[1]]
        return self.layer.encode(tf.reshape(x, shape))

    def decode(self, payload):
        return self.layer.decode(payload)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", type=int, default=1 << 24, help="float32 values")
    parser.add_argument("--threads", type=int, default=1, help="TF intra/inter-op threads")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per figure")
    parser.add_argument("--only", default=None,
                        help="comma-separated labels to measure (default: all)")
    parser.add_argument("--out", default=None, help="also write the table to this JSON file")
    return parser.parse_args()


def main():
    args = parse_args()
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_throughput import make_t3, measure

    from tfgc.codecs import payload_nbytes

    values = make_t3(args.values)
    x = tf.constant(values)
    keep = np.random.default_rng(1).random(args.values) < 0.01
    x_sparse = tf.constant(np.where(keep, values, np.float32(0)))
    del values, keep
    nbytes = args.values * 4
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731

    probe = tf.function(lambda t: t * 2.0, jit_compile=True)
    probe_gbps = gbps(measure(lambda: probe(x), args.repeats)[0])
    print(f"{args.values:,} float32 values, {args.threads} TF thread(s), BFC allocator; "
          f"probe (XLA y = 2x): {probe_gbps:.2f} GB/s", flush=True)

    wanted = set(args.only.split(",")) if args.only else None
    rows = []
    for label, codec in codecs_to_measure():
        if wanted is not None and label not in wanted:
            continue
        data = x_sparse if "non-zero" in label else x
        encode = tf.function(codec.encode)
        payload = encode(data)
        decode = tf.function(codec.decode)
        bits = 8.0 * int(payload_nbytes(payload)) / args.values
        enc = gbps(measure(lambda: encode(data), args.repeats)[0])
        dec = gbps(measure(lambda: decode(payload), args.repeats)[0])
        row = (label, bits, enc, dec, enc / probe_gbps, dec / probe_gbps)
        met = (min(enc, dec) >= TARGET_GBPS * args.threads
               and min(enc, dec) / probe_gbps >= TARGET_PROBE_RATIO)
        rows.append(row + ("yes" if met else "no",))
        print(f"  {label}: {bits:.3f} bits/value, enc {enc:.2f} GB/s, dec {dec:.2f} GB/s",
              flush=True)

    header = ("codec", "bits/value", "enc GB/s", "dec GB/s", "enc/probe", "dec/probe",
              f">= {TARGET_GBPS:g} GB/s/thread & {TARGET_PROBE_RATIO:g}x probe")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for label, bits, enc, dec, enc_ratio, dec_ratio, met in rows:
        print(f"| {label} | {bits:.3f} | {enc:.2f} | {dec:.2f} | {enc_ratio:.2f} | "
              f"{dec_ratio:.2f} | {met} |")
    missed = [row[0] for row in rows if row[-1] == "no"]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} codecs meet the target"
          + (f"; not: {', '.join(missed)}" if missed else ""))
    if args.out:
        keys = ("codec", "bits_per_value", "encode_gbps", "decode_gbps", "encode_over_probe",
                "decode_over_probe", "target_met")
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "probe_gbps": probe_gbps,
                       "target_gbps_per_thread": TARGET_GBPS,
                       "target_probe_ratio": TARGET_PROBE_RATIO,
                       "rows": [dict(zip(keys, row)) for row in rows]}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
