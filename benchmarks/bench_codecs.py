"""Encode and decode throughput of every codec, in one table, against a one-pass XLA probe.

    python benchmarks/bench_codecs.py --values 16777216 --repeats 5

It runs as a file, not as `python -m benchmarks.bench_codecs`: `PYTHONPATH=<tree> python
benchmarks/bench_codecs.py` times another tree's tfgc (its ops built there), which the
repository root on sys.path (what `-m` puts there) would hide behind this checkout's.

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
(a warm-up call, then samples of >= 20 ms, as bench_throughput.measure takes them), each
sample timed on two clocks: CPU time (time.process_time, every thread of the process)
and wall time.

The clock. The targets are judged on CPU time: on a shared machine, wall time also
counts the time the process waited for a core, so a loaded machine reads as slow codecs.
CPU time counts only the
cycles the process ran. It is the process's, not the calling thread's: a tf.function's
kernels run on TensorFlow's pool threads, not on the Python thread that calls it, so the
caller's own thread time would miss them. With --threads 1 (the default) one pool
thread does the work, and GB per CPU-second is GB/s per thread, the target's unit. CPU
time still moves under load (shared caches and memory bandwidth), far less than wall.

The probe is `tf.function(lambda x: x * 2.0, jit_compile=True)` over the same tensor,
measured in the same process on both clocks: the cost of one read and one fresh float32
write of this size. The ratio columns divide each codec's throughput by the probe's on
the same clock, which makes rows comparable across runs on a shared, noisy machine. The
target ("every codec at memory speed") is >= 1 GB/s per thread and >= 0.2x the probe,
both ways, in CPU time.

--tile PERIOD replaces the input by its first PERIOD values repeated (a tiled gradient:
many equal magnitudes), the tie-heavy case of Sparsify's and TopK's selection.

GradiVeQ is not in the table: it is stateful (PCA bases learnt from the layer's own
gradients, per slice) and its cost is measured in benchmarks/gradiveq_study.py.
PowerSGD, also bound to one variable, is measured on the input seen as a matrix of 4096
columns (its warm start moves with every encode, as in training). Signum, bound to a
variable of the input's shape, keeps its momentum (each encode updates it, as in
training); its decode is ScaledSign's.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

TARGET_GBPS = 1.0
TARGET_PROBE_RATIO = 0.2


def codecs_to_measure():
    """(label, function making the codec) for every codec measured, in a default or typical
    configuration; a codec is made only where measured (--only), so that the script also
    runs against an older tfgc that lacks some of them."""
    from tfgc import codecs as C

    return [
        ("NoCompression", lambda: C.NoCompression()),
        ("Cast(float16)", lambda: C.Cast("float16")),
        ("Cast(bfloat16)", lambda: C.Cast("bfloat16")),
        ("Int8", lambda: C.Int8()),
        ("Quantize(4)", lambda: C.Quantize(4)),
        ("Quantize(8)", lambda: C.Quantize(8)),
        ("AdaptiveQuantize", lambda: C.AdaptiveQuantize()),
        ("QSGD(4)", lambda: C.QSGD(4, seed=1)),
        ("QSGD(8)", lambda: C.QSGD(8, seed=1)),
        ("LogQuant(4)", lambda: C.LogQuant(4)),
        ("OneBit", lambda: C.OneBit()),
        ("StochasticTernary", lambda: C.StochasticTernary(seed=1)),
        ("ThreeLC(1.0)", lambda: C.ThreeLC(1.0)),
        ("ThreeLC(1.75)", lambda: C.ThreeLC(1.75)),
        ("ThreeLC(1.0) rANS", lambda: C.ThreeLC(1.0, coder="entropy")),
        ("Sparsify(0.05)", lambda: C.Sparsify(0.05)),
        ("TopK(0.01)", lambda: C.TopK(0.01)),
        ("FastSGD", lambda: C.FastSGD()),
        ("FastSGD (1% non-zero)", lambda: C.FastSGD()),
        ("RandomK(0.01)", lambda: C.RandomK(0.01, seed=1)),
        ("ScaledSign", lambda: C.ScaledSign()),
        ("Signum(0.9)", lambda: Bound(C.Signum(0.9))),
        ("PowerSGD(1)", lambda: AsMatrix(C.PowerSGD(rank=1))),
        ("PowerSGD(4)", lambda: AsMatrix(C.PowerSGD(rank=4))),
    ]


class Bound:
    """A codec bound to a variable of the benchmark's vector (at the first encode)."""

    def __init__(self, codec):
        self.codec = codec
        self.layer = None

    def encode(self, x):
        import tensorflow as tf

        if self.layer is None:
            self.layer = self.codec.bind(tf.Variable(tf.zeros(x.shape), name="vector"))
        return self.layer.encode(x)

    def decode(self, payload):
        return self.layer.decode(payload)


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
    parser.add_argument("--tile", type=int, default=0,
                        help="repeat the input's first TILE values (a tie-heavy input)")
    parser.add_argument("--only", default=None,
                        help="comma-separated labels to measure (default: all)")
    parser.add_argument("--out", default=None, help="also write the table to this JSON file")
    return parser.parse_args()


MIN_SAMPLE_S = 0.02


def measure(fn, repeats):
    """(best CPU seconds, best wall seconds) per call of fn: a warm-up call, then
    `repeats` samples of >= MIN_SAMPLE_S wall time, each timed on both clocks."""
    fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    inner = max(1, int(MIN_SAMPLE_S / max(once, 1e-7)))
    cpu, wall = [], []
    for _ in range(repeats):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        for _ in range(inner):
            fn()
        cpu.append((time.process_time() - start_cpu) / inner)
        wall.append((time.perf_counter() - start_wall) / inner)
    return min(cpu), min(wall)


def main():
    args = parse_args()
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    load_before = os.getloadavg()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    # Run as a file (the docstring says why): bench_throughput is imported as its neighbour.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_throughput import make_t3

    from tfgc.codecs import payload_nbytes

    values = make_t3(args.values)
    if args.tile:
        values = np.resize(values[: args.tile], args.values)
    x = tf.constant(values)
    keep = np.random.default_rng(1).random(args.values) < 0.01
    x_sparse = tf.constant(np.where(keep, values, np.float32(0)))
    del values, keep
    nbytes = args.values * 4
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731

    probe = tf.function(lambda t: t * 2.0, jit_compile=True)
    probe_gbps, probe_wall = map(gbps, measure(lambda: probe(x), args.repeats))
    print(f"{args.values:,} float32 values{f' (tiled every {args.tile})' if args.tile else ''}, "
          f"{args.threads} TF thread(s), BFC allocator; probe (XLA y = 2x): "
          f"{probe_gbps:.2f} GB/s CPU time, {probe_wall:.2f} GB/s wall", flush=True)

    wanted = set(args.only.split(",")) if args.only else None
    rows, wall_rows = [], []
    for label, make in codecs_to_measure():
        if wanted is not None and label not in wanted:
            continue
        codec = make()
        data = x_sparse if "non-zero" in label else x
        encode = tf.function(codec.encode)
        payload = encode(data)
        decode = tf.function(codec.decode)
        bits = 8.0 * int(payload_nbytes(payload)) / args.values
        enc, enc_wall = map(gbps, measure(lambda: encode(data), args.repeats))
        dec, dec_wall = map(gbps, measure(lambda: decode(payload), args.repeats))
        row = (label, bits, enc, dec, enc / probe_gbps, dec / probe_gbps)
        # GB per CPU-second is already per thread: the threads' CPU times add up.
        met = (min(enc, dec) >= TARGET_GBPS
               and min(enc, dec) / probe_gbps >= TARGET_PROBE_RATIO)
        rows.append(row + ("yes" if met else "no",))
        wall_rows.append((enc_wall, dec_wall, enc_wall / probe_wall, dec_wall / probe_wall))
        print(f"  {label}: {bits:.3f} bits/value, enc {enc:.2f} GB/s, dec {dec:.2f} GB/s "
              f"(wall {enc_wall:.2f} / {dec_wall:.2f})", flush=True)

    header = ("codec", "bits/value", "enc GB/s", "dec GB/s", "enc/probe", "dec/probe",
              f">= {TARGET_GBPS:g} GB/s/thread & {TARGET_PROBE_RATIO:g}x probe",
              "wall enc GB/s", "wall dec GB/s")
    print("\nCPU time (wall time in the last two columns)")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for (label, bits, enc, dec, enc_ratio, dec_ratio, met), wall in zip(rows, wall_rows):
        print(f"| {label} | {bits:.3f} | {enc:.2f} | {dec:.2f} | {enc_ratio:.2f} | "
              f"{dec_ratio:.2f} | {met} | {wall[0]:.2f} | {wall[1]:.2f} |")
    missed = [row[0] for row in rows if row[-1] == "no"]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} codecs meet the target in CPU time"
          + (f"; not: {', '.join(missed)}" if missed else ""))
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}; "
          f"{os.cpu_count()} CPUs")
    if args.out:
        keys = ("codec", "bits_per_value", "encode_gbps", "decode_gbps", "encode_over_probe",
                "decode_over_probe", "target_met")
        wall_keys = ("encode_gbps_wall", "decode_gbps_wall", "encode_over_probe_wall",
                     "decode_over_probe_wall")
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "clock": "cpu (time.process_time)",
                       "probe_gbps": probe_gbps, "probe_gbps_wall": probe_wall,
                       "load_average_before": load_before, "load_average_after": load_after,
                       "cpus": os.cpu_count(),
                       "target_gbps_per_thread": TARGET_GBPS,
                       "target_probe_ratio": TARGET_PROBE_RATIO,
                       "rows": [dict(zip(keys, row)) | dict(zip(wall_keys, wall))
                                for row, wall in zip(rows, wall_rows)]}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
