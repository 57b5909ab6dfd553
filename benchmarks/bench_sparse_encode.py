"""FastSGD's encode of a sparse gradient (`tf.IndexedSlices`) against the dense one.

The weight gradients of `models.sparse_models.SparseLinear` (logistic loss) on real
hashed Reuters text (D = 2^20): one row per distinct feature of the batch, what
`models.train --model logistic` pushes. Each gradient is encoded twice inside a
tf.function, as IndexedSlices and as the dense [D] tensor; the two payloads must hold
the same keys and values (checked), and the script prints the time of each and their
ratio, measured in the same run. Larger batches make denser gradients; the last rows
repeat the rows of the gradient (as an embedding lookup without the model's own
deduplication does) so that the encoder has duplicates to sum; then random distinct
rows (5k-500k of 2^20, normal values: not data, the case of an earlier microbenchmark).

    python -m benchmarks.bench_sparse_encode [--repeats 20]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tfgc
from models import data as data_lib
from models import sparse_models


def gradient_of(model, loss, x, y):
    """The IndexedSlices gradient of `model`'s w on the sparse batch (x, y)."""
    with tf.GradientTape() as tape:
        value = loss(y, model(x))
    return tape.gradient(value, model.layers[-1].w)


def best_time(function, argument, repeats):
    function(argument)  # trace
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function(argument)
        tf.nest.map_structure(lambda t: t.numpy(), result)
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    train, _ = data_lib.load_sparse("reuters_corn")
    model = sparse_models.keras_model(train.num_features)
    model.layers[-1].w.assign(np.random.default_rng(0).normal(size=train.num_features) * 0.01)
    loss = sparse_models.keras_loss("logistic")
    codec = tfgc.codecs.FastSGD()
    encode = tf.function(codec.encode)
    print("FastSGD(b=1.1) encode, one thread, best of", args.repeats)
    print(f"{'gradient':<34} {'rows':>8} {'sparse ms':>10} {'dense ms':>9} {'sparse/dense':>13}")
    cases = ([(f"Reuters batch {b}", b, 1) for b in (256, 1554)]
             + [(f"Reuters batch 1554, rows x{k}", 1554, k) for k in (8, 40)])
    cases += [(f"random: {n:,d} distinct rows", n, None) for n in (5_000, 50_000, 500_000)]
    rng = np.random.default_rng(0)
    for name, batch, copies in cases:
        if copies is None:
            # Random distinct sorted rows with normal values (the earlier microbenchmark's
            # case; not data).
            rows = np.sort(rng.choice(train.num_features, batch, replace=False))
            grad = tf.IndexedSlices(tf.constant(rng.standard_normal(batch), tf.float32),
                                    tf.constant(rows), tf.constant([train.num_features]))
        else:
            x, y = next(iter(sparse_models.sparse_dataset(train, batch, shuffle=False)))
            grad = gradient_of(model, loss, x, y)
            # Copies of every row, each 1/copies of the value: the same gradient, duplicated.
            grad = tf.IndexedSlices(tf.tile(grad.values / copies, [copies]),
                                    tf.tile(grad.indices, [copies]), grad.dense_shape)
        dense = tf.convert_to_tensor(grad)
        sparse_payload, dense_payload = encode(grad), encode(dense)
        for key in ("keys", "values"):
            np.testing.assert_array_equal(sparse_payload[key].numpy(), dense_payload[key].numpy())
        sparse_s = best_time(encode, grad, args.repeats)
        dense_s = best_time(encode, dense, args.repeats)
        print(f"{name:<34} {int(tf.size(grad.indices)):>8,d} {1e3 * sparse_s:>10.2f} "
              f"{1e3 * dense_s:>9.2f} {sparse_s / dense_s:>13.3f}")


if __name__ == "__main__":
    main()
