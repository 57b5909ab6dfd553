"""ChunkedTopK against TopK on ResNet-20's tensors: bits per parameter and speed.

    python -m benchmarks.bench_chunked_top_k --repeats 5
    python -m benchmarks.bench_chunked_top_k --values 16777216   # one large tensor too

The tensors are ResNet-20's (models.resnet, CIFAR-10: 269,722 trainable values in 59
variables), filled with gradient-like values (Student-t, df=3, * 1e-3, seed 0). For each
codec and density, every tensor is encoded on its own (as the optimizer's wires send
them, with no small-tensor exemption):
  bits/param  8 * (payload bytes of all the tensors) / their values;
  rel. error  ||x - decode(encode(x))|| / ||x|| over all of them (one step, no error
              feedback);
  encode, decode  GB/s of float32 input (4 bytes per value) of one tf.function over all
              the tensors, best of --repeats samples of >= 20 ms, on CPU time (every
              thread of the process) and wall time, with --threads intra- and inter-op
              threads (default 1).
With --values N, the same on one tensor of N values (the speed of the selection itself,
without the per-tensor costs of 65 small ones).
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import numpy as np  # noqa: E402


def measure(fn, repeats):
    """(best CPU seconds, best wall seconds) per call of fn over `repeats` samples."""
    fn()  # warm-up: tracing and first allocations
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        calls, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
        while True:
            fn()
            calls += 1
            wall = time.perf_counter() - wall0
            if wall >= 0.02:
                break
        best_cpu = min(best_cpu, (time.process_time() - cpu0) / calls)
        best_wall = min(best_wall, wall / calls)
    return best_cpu, best_wall


def run(tensors, codecs, repeats):
    import tensorflow as tf

    from tfgc.codecs import payload_nbytes

    values = sum(int(np.prod(t.shape)) for t in tensors)
    gigabytes = 4 * values / 1e9
    rows = []
    for label, codec in codecs:
        encode = tf.function(lambda: [codec.encode(t) for t in tensors])
        payloads = encode()
        decode = tf.function(lambda p: [codec.decode(q, expected_shape=t.shape)
                                        for q, t in zip(p, tensors)])
        decoded = decode(payloads)
        nbytes = sum(int(payload_nbytes(p)) for p in payloads)
        error = np.sqrt(sum(float(tf.reduce_sum((t - d) ** 2)) for t, d in zip(tensors, decoded))
                        / sum(float(tf.reduce_sum(t ** 2)) for t in tensors))
        enc_cpu, enc_wall = measure(encode, repeats)
        dec_cpu, dec_wall = measure(lambda: decode(payloads), repeats)
        rows.append({
            "codec": label, "values": values, "payload_bytes": nbytes,
            "bits_per_param": 8 * nbytes / values, "rel_error": error,
            "encode_gbps_cpu": gigabytes / enc_cpu, "encode_gbps_wall": gigabytes / enc_wall,
            "decode_gbps_cpu": gigabytes / dec_cpu, "decode_gbps_wall": gigabytes / dec_wall,
            "encode_ms_cpu": 1e3 * enc_cpu, "decode_ms_cpu": 1e3 * dec_cpu,
        })
    return rows


def print_table(title, rows):
    print(f"\n{title}")
    print(f"{'codec':<28}{'bits/param':>11}{'rel.err':>9}{'enc GB/s cpu':>14}"
          f"{'(wall)':>8}{'dec GB/s cpu':>14}{'(wall)':>8}{'enc ms':>9}{'dec ms':>9}")
    for r in rows:
        print(f"{r['codec']:<28}{r['bits_per_param']:>11.4f}{r['rel_error']:>9.3f}"
              f"{r['encode_gbps_cpu']:>14.3f}{r['encode_gbps_wall']:>8.3f}"
              f"{r['decode_gbps_cpu']:>14.3f}{r['decode_gbps_wall']:>8.3f}"
              f"{r['encode_ms_cpu']:>9.2f}{r['decode_ms_cpu']:>9.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--densities", default="0.01,0.02,0.03")
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--values", type=int, default=0,
                        help="also measure one tensor of this many values")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from models import resnet
    from tfgc import codecs as C

    model = resnet.resnet(20)
    rng = np.random.default_rng(0)
    tensors = [tf.constant((rng.standard_t(3, size=v.shape) * 1e-3).astype(np.float32))
               for v in model.trainable_variables]
    densities = [float(d) for d in args.densities.split(",")]
    codecs = []
    for d in densities:
        codecs.append((f"ChunkedTopK({d}, {args.chunk})", C.ChunkedTopK(d, chunk=args.chunk)))
        codecs.append((f"TopK({d})", C.TopK(d)))
    results = {"resnet20": run(tensors, codecs, args.repeats)}
    print_table(f"ResNet-20: {results['resnet20'][0]['values']} values in {len(tensors)} "
                f"tensors, {args.threads} thread(s)", results["resnet20"])
    if args.values:
        big = [tf.constant((rng.standard_t(3, size=args.values) * 1e-3).astype(np.float32))]
        results["one_tensor"] = run(big, codecs, args.repeats)
        print_table(f"One tensor of {args.values} values", results["one_tensor"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
