"""Throughput of tfgc's 3LC path on CPU, next to memcpy and zstd, per TensorFlow thread count.

    python -m benchmarks.bench_throughput --mb 100 --threads 1,2 --repeats 5

For each thread count the script runs a fresh subprocess of itself in which TensorFlow is
set to that many intra- and inter-op threads before any op runs (and OMP_NUM_THREADS /
TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS are set for it), so every number in one
table comes from one process and one thread setting. All subprocesses read the same
buffers, generated once by the parent:

  t3      fp32 Student-t (df=3) * 1e-3: heavy-tailed, gradient-like, i.i.d.
          (np.random.default_rng(0).standard_t(3)); one tensor of --mb MB.
  ef      fp32 Gaussian gradients with a persistent per-element mean (sd 0.3 of the noise)
          after --ef-steps steps of error feedback at s=1.0 (residual r += g - M*q):
          the input ThreeLC sees in steady-state training with tfgc.ErrorFeedback. Far
          denser 3-values than i.i.d. t3, so it exercises the literal paths of the ops.

Each data set is quantized with ThreeLC at every --sparsities value. Measured per
(data set, s), in GB/s (1 GB = 1e9 bytes), best and median of --repeats timed samples
(each sample loops until it has run >= 20 ms, after a warm-up call):

  memcpy            np.copyto of the fp32 buffer into a preallocated array (one thread,
                    whatever --threads says): the machine's physical reference.
  zero-run enc/dec  tfgc_ops.zero_run_encode / zero_run_decode, GB/s of op INPUT bytes
                    (quartic bytes for encode, zero-run bytes for decode; decode's output
                    rate is printed too). The quartic bytes are the codec's own.
  ThreeLC enc/dec   ThreeLC(s).encode (x -> payload) and .decode (payload -> tensor) inside
                    a tf.function, GB/s of fp32 tensor bytes. The function returns a scalar
                    that depends on the result (payload_nbytes / the last decoded value).
  zstd-1            python-zstandard level 1 (single-threaded, whatever --threads says) on
                    the same quartic bytes, if zstandard imports: ratio and compress /
                    decompress GB/s of quartic bytes.
  breakdown         ThreeLC's steps (tfgc/codecs/threelc.py's _quantize_and_fold and
                    _unfold_and_scale, copied here) called alone, and a probe: an
                    XLA y = 2x of the fp32 buffer, i.e. the cost of producing one fresh
                    fp32 tensor of this size in TensorFlow (allocation + first touch).

The final table divides every throughput by memcpy of the same process, gives the
speed-up between the largest and the smallest thread count, and checks the targets per
thread (GB/s divided by the thread count): zero-run >= 1.5 GB/s encode and >= 3 GB/s
decode, ThreeLC >= 2 GB/s encode and >= 5 GB/s decode (fp32 bytes). A zero-run decode
target above what writing the output at memcpy's speed allows (memcpy / zero-run ratio
of input bytes per second) is AT LIMIT, and met, at >= 90% of that limit.

--glibc-tunables passes GLIBC_TUNABLES to the subprocesses, e.g. glibc.malloc.hugetlb=1
to let glibc back TensorFlow's large allocations with transparent huge pages.
--bfc sets TF_CPU_ALLOCATOR_USE_BFC=true in the subprocesses: TensorFlow's own CPU
allocator then reuses memory instead of page-faulting every fresh large tensor.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# The repository root, where the subprocesses run as `-m benchmarks.bench_throughput`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS = {  # GB/s per thread
    "zre_enc": 1.5,
    "zre_dec": 3.0,
    "zre_dec_out": 3.0,  # the same target read on decoded (quartic) bytes
    "tlc_enc": 2.0,
    "tlc_dec": 5.0,
}
MIN_SAMPLE_S = 0.02
THREAD_ENV = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def log(message):
    print(message, flush=True)


# ThreeLC's own steps on a float32 tensor, measured alone in the breakdown (the codec runs
# the same ops: tfgc/codecs/threelc.py's _quantize_and_fold and _unfold_and_scale).


def quantize_and_fold(x, sparsity):
    """Quartic bytes of float32 `x` at sparsity s: M = max|x| * s, then one fold pass."""
    import tensorflow as tf  # imported in the child, after its thread settings

    import tfgc_ops

    flat = tf.reshape(x, [-1])
    return tfgc_ops.quartic_fold(flat, tfgc_ops.largest_magnitude(flat) * sparsity)


def unfold_and_scale(quartic, scale, shape):
    """The float32 tensor of `shape` that quartic bytes and scale M decode to."""
    import tensorflow as tf

    import tfgc_ops

    n = tf.reduce_prod(tf.cast(shape, tf.int64))
    return tf.reshape(tfgc_ops.quartic_unfold(quartic, n, tf.cast(scale, tf.float32)), shape)


# ---------------------------------------------------------------------------------------
# Machine and data (parent)


def machine_info():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": model,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def make_t3(n):
    x = np.random.default_rng(0).standard_t(df=3, size=n)
    return (x * 1e-3).astype(np.float32)


def make_ef(n, steps, sparsity=1.0):
    """Input of ThreeLC after `steps` error-feedback steps on correlated Gaussian gradients."""
    rng = np.random.default_rng(1)
    mean = rng.standard_normal(n, dtype=np.float32) * np.float32(0.3)
    residual = np.zeros(n, np.float32)
    total = np.empty(n, np.float32)
    for _ in range(steps + 1):
        np.add(mean, rng.standard_normal(n, dtype=np.float32), out=total)
        total += residual
        if _ == steps:
            break
        scale = np.float32(np.abs(total).max()) * np.float32(sparsity)
        sent = np.rint(total / scale) * scale
        np.subtract(total, sent, out=residual)
    return total * np.float32(1e-3)


# ---------------------------------------------------------------------------------------
# Measurement helpers (child)


def measure(fn, repeats):
    """(best, median) seconds per call of fn, after a warm-up call."""
    fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    inner = max(1, int(MIN_SAMPLE_S / max(once, 1e-7)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return min(samples), statistics.median(samples)


def rate(nbytes, seconds):
    return {"bytes": int(nbytes), "best_s": seconds[0], "median_s": seconds[1],
            "gbps": nbytes / seconds[0] / 1e9, "gbps_median": nbytes / seconds[1] / 1e9}


def child(args):
    threads = args.threads_child
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import tfgc_ops
    from tfgc.codecs import ThreeLC, payload_nbytes

    tag = f"[threads={threads}]"
    log(f"{tag} TF {tf.__version__}, intra={tf.config.threading.get_intra_op_parallelism_threads()} "
        f"inter={tf.config.threading.get_inter_op_parallelism_threads()}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}, "
        f"TF_CPU_ALLOCATOR_USE_BFC={os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', '')!r}, "
        f"loadavg={os.getloadavg()}")
    try:
        import zstandard
    except ImportError:
        zstandard = None
        log(f"{tag} zstandard not importable: zstd rows skipped")

    results = {"threads": threads, "tf": tf.__version__, "datasets": {},
               "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
    buffers = {name: np.load(os.path.join(args.data_dir, f"{name}.npy")) for name in args.datasets}

    first = buffers[args.datasets[0]]
    destination = np.empty_like(first)
    results["memcpy"] = rate(first.nbytes, measure(lambda: np.copyto(destination, first),
                                                    args.repeats))
    log(f"{tag} memcpy {results['memcpy']['gbps']:.2f} GB/s")
    del destination

    # Cost of one fresh fp32 tensor of this size: XLA y = 2x.
    probe_input = tf.constant(first)
    double = tf.function(lambda x: x * 2.0, jit_compile=True)
    results["alloc_probe"] = rate(first.nbytes, measure(lambda: double(probe_input), args.repeats))
    del probe_input

    for name in args.datasets:
        x = buffers[name]
        xt = tf.constant(x)
        for sparsity in args.sparsities:
            key = f"{name} s={sparsity:g}"
            row = {"fp32_bytes": int(x.nbytes), "values": int(x.size), "sparsity": sparsity}
            codec = ThreeLC(sparsity)

            encode_fn = tf.function(lambda t, codec=codec: payload_nbytes(codec.encode(t)))
            payload = tf.function(codec.encode)(xt)
            data, scale, shape = payload["data"], payload["scale"], payload["shape"]

            @tf.function
            def decode_fn(data, scale, shape, codec=codec):
                out = codec.decode({"data": data, "scale": scale, "shape": shape})
                return tf.reshape(out, [-1])[-1]

            quartic = tfgc_ops.zero_run_decode(data)
            quartic_np = quartic.numpy()
            row["quartic_bytes"] = int(quartic_np.size)
            row["zre_bytes"] = int(data.shape[0])
            row["zre_ratio"] = quartic_np.size / max(1, int(data.shape[0]))
            row["nonzero_frac"] = float(np.mean(quartic_np != 121)) if quartic_np.size else 0.0
            row["payload_bytes"] = int(payload_nbytes(payload))
            row["fp32_ratio"] = x.nbytes / row["payload_bytes"]
            if args.check:
                from tests import reference_ops as reference

                m = np.float32(np.abs(x).max()) * np.float32(sparsity)
                expected = reference.quartic_encode(np.rint(x / (m if m > 0 else np.float32(1))))
                row["matches_reference"] = bool(np.array_equal(expected, quartic_np))
                del expected
            log(f"{tag} {key}: zero-run ratio {row['zre_ratio']:.2f}, non-121 quartic bytes "
                f"{100 * row['nonzero_frac']:.3f}%, fp32->payload {row['fp32_ratio']:.1f}x")

            row["zre_enc"] = rate(quartic_np.size,
                                  measure(lambda: tfgc_ops.zero_run_encode(quartic), args.repeats))
            row["zre_dec"] = rate(data.shape[0],
                                  measure(lambda: tfgc_ops.zero_run_decode(data), args.repeats))
            row["zre_dec_out"] = dict(row["zre_dec"], bytes=int(quartic_np.size))
            row["zre_dec_out"]["gbps"] = quartic_np.size / row["zre_dec"]["best_s"] / 1e9
            row["zre_dec_out"]["gbps_median"] = quartic_np.size / row["zre_dec"]["median_s"] / 1e9
            row["zre_dec_out_gbps"] = row["zre_dec_out"]["gbps"]
            log(f"{tag} {key}: zero-run enc {row['zre_enc']['gbps']:.2f} GB/s, "
                f"dec {row['zre_dec']['gbps']:.2f} GB/s in ({row['zre_dec_out_gbps']:.2f} out)")

            row["tlc_enc"] = rate(x.nbytes, measure(lambda: encode_fn(xt).numpy(), args.repeats))
            row["tlc_dec"] = rate(x.nbytes, measure(lambda: decode_fn(data, scale, shape).numpy(),
                                                    args.repeats))
            log(f"{tag} {key}: ThreeLC enc {row['tlc_enc']['gbps']:.2f} GB/s, "
                f"dec {row['tlc_dec']['gbps']:.2f} GB/s (fp32)")

            s_tensor = tf.constant(sparsity)
            try:
                row["qf"] = rate(x.nbytes, measure(lambda: quantize_and_fold(xt, s_tensor),
                                                   args.repeats))
            except Exception as error:  # an op changed: report, go on
                row["qf_error"] = f"{type(error).__name__}: {error}"[:200]
            try:
                row["unfold"] = rate(x.nbytes, measure(
                    lambda: unfold_and_scale(quartic, scale, shape), args.repeats))
            except Exception as error:
                row["unfold_error"] = f"{type(error).__name__}: {error}"[:200]

            if zstandard is not None:
                compressor = zstandard.ZstdCompressor(level=1)  # one thread: a per-core reference
                decompressor = zstandard.ZstdDecompressor()
                raw = quartic_np.tobytes()
                packed = compressor.compress(raw)
                assert decompressor.decompress(packed) == raw
                row["zstd_bytes"] = len(packed)
                row["zstd_ratio"] = len(raw) / len(packed)
                row["zstd_enc"] = rate(len(raw), measure(lambda: compressor.compress(raw),
                                                         args.repeats))
                row["zstd_dec"] = rate(len(raw), measure(lambda: decompressor.decompress(packed),
                                                         args.repeats))
                log(f"{tag} {key}: zstd-1 ratio {row['zstd_ratio']:.2f}, "
                    f"enc {row['zstd_enc']['gbps']:.2f} dec {row['zstd_dec']['gbps']:.2f} GB/s")
            results["datasets"][key] = row
        del xt
    results["loadavg_end"] = os.getloadavg()
    with open(args.json_out, "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------------------------------
# Tables (parent)


def fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(lines):
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(lines[0]))]
    for j, row in enumerate(lines):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        print("| " + " | ".join(cells) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                                 for i, w in enumerate(widths)) + "|")
    sys.stdout.flush()


ROWS = [  # (row key, label, bytes counted)
    ("zre_enc", "zero-run encode", "quartic B in"),
    ("zre_dec", "zero-run decode", "zero-run B in"),
    ("zre_dec_out", "zero-run decode", "quartic B out"),
    ("tlc_enc", "ThreeLC encode", "fp32 B in"),
    ("tlc_dec", "ThreeLC decode", "fp32 B out"),
    ("zstd_enc", "zstd-1 compress, 1 thread", "quartic B in"),
    ("zstd_dec", "zstd-1 decompress, 1 thread", "quartic B out"),
]


def thread_table(result):
    memcpy = result["memcpy"]["gbps"]
    probe = result["alloc_probe"]["gbps"]
    lines = [["measurement", "MB", "GB/s best", "GB/s median", "x memcpy"]]
    lines.append(["memcpy fp32 (np.copyto)", fmt(result["memcpy"]["bytes"] / 1e6, 1),
                  fmt(memcpy), fmt(result["memcpy"]["gbps_median"]), "1.00"])
    lines.append(["TF fresh fp32 tensor (XLA y=2x)", fmt(result["alloc_probe"]["bytes"] / 1e6, 1),
                  fmt(probe), fmt(result["alloc_probe"]["gbps_median"]), fmt(probe / memcpy)])
    for key, row in result["datasets"].items():
        for name, label, unit in ROWS:
            if name not in row:
                continue
            r = row[name]
            lines.append([f"{key}: {label} ({unit})", fmt(r["bytes"] / 1e6, 1), fmt(r["gbps"]),
                          fmt(r["gbps_median"]), fmt(r["gbps"] / memcpy)])
    print_table(lines)
    print()
    lines = [["data set", "non-121 quartic B", "zero-run ratio", "zstd-1 ratio",
              "fp32 -> payload", "quartic == numpy reference"]]
    for key, row in result["datasets"].items():
        lines.append([key, f"{100 * row['nonzero_frac']:.3f}%", fmt(row["zre_ratio"]),
                      fmt(row.get("zstd_ratio")), f"{row['fp32_ratio']:.1f}x",
                      {True: "yes", False: "NO", None: "-"}[row.get("matches_reference")]])
    print_table(lines)
    print()
    lines = [["breakdown (ms, best)", "ThreeLC encode", "= _quantize_and_fold", "+ zero_run_encode",
              "+ rest", "ThreeLC decode", "= zero_run_decode", "+ _unfold_and_scale", "+ rest",
              "fresh fp32 tensor"]]
    for key, row in result["datasets"].items():
        ms = lambda name: row[name]["best_s"] * 1e3 if name in row else None  # noqa: E731
        enc, qf, zre = ms("tlc_enc"), ms("qf"), ms("zre_enc")
        dec, zrd, unfold = ms("tlc_dec"), ms("zre_dec"), ms("unfold")
        lines.append([key, fmt(enc, 1), fmt(qf, 1), fmt(zre, 1),
                      fmt(enc - qf - zre if qf is not None else None, 1),
                      fmt(dec, 1), fmt(zrd, 1), fmt(unfold, 1),
                      fmt(dec - zrd - unfold if unfold is not None else None, 1),
                      fmt(result["alloc_probe"]["best_s"] * 1e3, 1)])
    print_table(lines)
    for key, row in result["datasets"].items():
        for name in ("qf_error", "unfold_error"):
            if name in row:
                print(f"  {key}: {name}: {row[name]}")


def combined_table(results):
    lo, hi = results[0], results[-1]
    lines = [["measurement"]]
    for r in results:
        t = r["threads"]
        lines[0] += [f"{t}t GB/s", f"{t}t x memcpy"]
    if len(results) > 1:
        lines[0].append(f"{hi['threads']}t/{lo['threads']}t")
    lines[0].append("target/thread")
    for r in results:
        lines[0] += [f"{r['threads']}t per thread", f"{r['threads']}t"]
    memcpy_row = ["memcpy fp32"]
    for r in results:
        memcpy_row += [fmt(r["memcpy"]["gbps"]), "1.00"]
    if len(results) > 1:
        memcpy_row.append(fmt(hi["memcpy"]["gbps"] / lo["memcpy"]["gbps"]))
    memcpy_row.append("-")
    for r in results:
        memcpy_row += ["-", "-"]
    lines.append(memcpy_row)
    verdicts = []
    for key in lo["datasets"]:
        for name, label, _ in ROWS:
            if name not in lo["datasets"][key]:
                continue
            line = [f"{key}: {label}" + (" (out B)" if name == "zre_dec_out" else "")]
            for r in results:
                g = r["datasets"][key][name]["gbps"]
                line += [fmt(g), fmt(g / r["memcpy"]["gbps"])]
            if len(results) > 1:
                line.append(fmt(hi["datasets"][key][name]["gbps"]
                                / lo["datasets"][key][name]["gbps"]))
            target = TARGETS.get(name)
            line.append(fmt(target, 1) if target else "-")
            for r in results:
                per = r["datasets"][key][name]["gbps"] / r["threads"]
                verdict = "-" if not target else judge(name, per, target, r["datasets"][key],
                                                       r["memcpy"]["gbps"])
                line += [fmt(per), verdict]
                if target:
                    verdicts.append(verdict)
            lines.append(line)
    print_table(lines)
    met = verdicts.count("PASS") + verdicts.count("AT LIMIT")
    print(f"\ntargets met: {met} of {len(verdicts)} "
          f"(per thread = GB/s / threads; zero-run GB/s count op input bytes; AT LIMIT: "
          f"{verdicts.count('AT LIMIT')} zero-run decode rows whose input-byte target asks "
          f"for more output than memcpy writes, met at >= 90% of that limit)")


def judge(name, per_thread, target, row, memcpy_gbps):
    """PASS or MISS against a per-thread target. Zero-run decoding writes ratio output
    bytes per input byte, so its input-byte rate can never exceed memcpy / ratio (one
    thread writing at memcpy's speed): where the target lies above that limit (sparse
    bytes, ratio up to 14), reaching 90% of the limit is AT LIMIT, which counts as met."""
    if per_thread >= target:
        return "PASS"
    if name == "zre_dec":
        limit = memcpy_gbps / row["zre_ratio"]
        if target > limit and per_thread >= 0.9 * limit:
            return "AT LIMIT"
    return "MISS"


# ---------------------------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0, help="fp32 MB per buffer (1e6 B)")
    parser.add_argument("--threads", default="1,2", help="comma-separated TF thread counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per measurement")
    parser.add_argument("--sparsities", default="1.0,1.75", help="ThreeLC s values")
    parser.add_argument("--datasets", default="t3,ef", help="t3, ef or both")
    parser.add_argument("--ef-steps", type=int, default=8, help="error-feedback warm-up steps")
    parser.add_argument("--bfc", action="store_true",
                        help="TF_CPU_ALLOCATOR_USE_BFC=true for the subprocesses")
    parser.add_argument("--glibc-tunables", default=None,
                        help="GLIBC_TUNABLES for the subprocesses (default: inherit)")
    parser.add_argument("--json", default=None, help="also write all results to this file")
    # internal: the per-thread-count subprocess
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sparsities = [float(s) for s in args.sparsities.split(",") if s]
    args.datasets = [d for d in args.datasets.split(",") if d]
    if any(d not in ("t3", "ef") for d in args.datasets) or not args.datasets:
        parser.error("--datasets takes t3 and/or ef")
    return args


def main():
    args = parse_args()
    if args.child:
        child(args)
        return
    started = time.perf_counter()
    threads = [int(t) for t in args.threads.split(",") if t]
    info = machine_info()
    n = max(5, int(args.mb * 1e6) // 4)
    log(f"machine: nproc={info['nproc']} affinity={info['affinity']} cpu={info['cpu_model']!r} "
        f"loadavg={info['loadavg']}")
    log(f"command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    if info["loadavg"] and info["loadavg"][0] > 0.5:
        log(f"warning: 1-min load average {info['loadavg'][0]:.2f}: other processes share the "
            "CPUs, expect noisy numbers")
    data_dir = tempfile.mkdtemp(prefix="tfgc_bench_")
    try:
        if "t3" in args.datasets:
            log(f"generating t3: {n:,} fp32 values ({4 * n / 1e6:.1f} MB)")
            np.save(os.path.join(data_dir, "t3.npy"), make_t3(n))
        if "ef" in args.datasets:
            log(f"generating ef: {n:,} fp32 values, {args.ef_steps} error-feedback steps")
            np.save(os.path.join(data_dir, "ef.npy"), make_ef(n, args.ef_steps))
        results = []
        for i, t in enumerate(threads):
            log(f"--- subprocess with {t} TF thread(s) ---")
            env = dict(os.environ)
            for name in THREAD_ENV:
                env[name] = str(t)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            if args.glibc_tunables is not None:
                env["GLIBC_TUNABLES"] = args.glibc_tunables
            if args.bfc:
                env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
            out = os.path.join(data_dir, f"result_{t}.json")
            command = [sys.executable, "-m", "benchmarks.bench_throughput", "--child",
                       f"--threads-child={t}", f"--data-dir={data_dir}", f"--json-out={out}",
                       f"--repeats={args.repeats}",
                       f"--sparsities={','.join(str(s) for s in args.sparsities)}",
                       f"--datasets={','.join(args.datasets)}"]
            if i == 0:
                command.append("--check")
            subprocess.run(command, env=env, check=True, cwd=ROOT)
            with open(out) as f:
                results.append(json.load(f))
            print(f"\n## {t} thread(s)  (TF {results[-1]['tf']}, "
                  f"{n:,} fp32 values = {4 * n / 1e6:.1f} MB)\n")
            thread_table(results[-1])
            print()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print("## combined: GB/s, fraction of memcpy (same process), speed-up, targets\n")
    combined_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "argv": sys.argv, "results": results}, f, indent=1)
    log(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
