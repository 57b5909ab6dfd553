"""An embedding model under parameter servers: tfgc's bytes against plain TensorFlow's.

    python -m tfgc.cluster.private python -m benchmarks.sparse_embeddings
    python -m tfgc.cluster.private python -m benchmarks.sparse_embeddings --steps 40 \\
        --out results/sparse_embeddings/token_regressor.json

A tf_keras model with an `Embedding(50000, 64)` (batches of 64 x 20 Zipf-distributed
token ids, mean-pooled, one dense output: `models.recommender.token_model`) trains with
tf_keras `fit` under ParameterServerStrategy on a local cluster (1 parameter server, 2
workers, loopback), once per configuration in the same cluster:

* `plain`: the same script without tfgc (tf_keras SGD, tf_keras `Embedding`): the twin
  every ratio is taken against;
* `none`, `fastsgd`, `topk`, `threelc`: `tfgc.DistributedOptimizer` with that codec on
  pushes, the documented way (default error feedback), tf_keras `Embedding`;
* `fastsgd_lookups`, `fastsgd_int8_lookups`: FastSGD pushes, and the rows looked up
  through `tfgc.CompressedEmbedding` (bfloat16, or int8 with a scale per row).

After a warm-up fit (tracing, connections) one measured fit of `--steps` steps runs.
Per step, from the kernel's socket counters (`ss`): bytes from the workers to the
server (pushes, and the lookups' ids) and back (the looked-up rows); from the
optimizer's counters: the push bytes counted and what plain TensorFlow would send
(`push_plain_bytes`); the step time (the fit's wall time over its steps); and each
run's held-out mean squared error after `--train-steps` steps in all (evaluated on
the coordinator from the servers' weights, every run alike; SGD, learning rate 0.5). Ratios are of totals over the measured fit. Prints a
table and writes JSON (`--out`).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CONFIGS = ("plain", "none", "fastsgd", "fastsgd_lookups", "fastsgd_int8_lookups", "topk",
           "threelc")


def _setup(name):
    """(codec or None for plain TF, the embedding layer class) of configuration `name`."""
    import tf_keras  # noqa: PLC0415

    import tfgc  # noqa: PLC0415

    codecs = {"plain": None, "none": tfgc.codecs.NoCompression(),
              "fastsgd": tfgc.codecs.FastSGD(), "fastsgd_lookups": tfgc.codecs.FastSGD(),
              "fastsgd_int8_lookups": tfgc.codecs.FastSGD(), "topk": tfgc.codecs.TopK(0.01),
              "threelc": tfgc.codecs.ThreeLC(1.0)}
    embedding = tf_keras.layers.Embedding
    if name == "fastsgd_lookups":
        embedding = tfgc.CompressedEmbedding
    elif name == "fastsgd_int8_lookups":
        def embedding(*args, **kwargs):
            return tfgc.CompressedEmbedding(*args, rows="int8", **kwargs)
    return codecs[name], embedding


def measure(configs, steps, warmup=5, train_steps=200, learning_rate=0.5, timeout_s=900):
    """Runs every configuration in one local cluster; returns {name: figures}."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415

    import tfgc  # noqa: PLC0415
    from models import recommender  # noqa: PLC0415
    from tfgc import cluster  # noqa: PLC0415

    cluster.isolate()
    data, (held_ids, held_targets) = recommender.token_dataset()
    results = {}
    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=timeout_s) as local:
        strategy = tf.distribute.ParameterServerStrategy(local.resolver)
        for name in configs:
            codec, embedding = _setup(name)
            with strategy.scope():
                model = recommender.token_model(embedding=embedding)
                optimizer = tf_keras.optimizers.SGD(learning_rate)
                if codec is not None:
                    optimizer = tfgc.DistributedOptimizer(optimizer, compression=codec)
                model.compile(optimizer, loss="mse")
            model.fit(data, epochs=1, steps_per_epoch=warmup, verbose=0)
            before = local.settled_socket_bytes()
            counted0 = _counted(optimizer)
            start = time.perf_counter()
            model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            wall = time.perf_counter() - start
            after = local.settled_socket_bytes()
            counted1 = _counted(optimizer)
            if train_steps > warmup + steps:
                model.fit(data, epochs=1, steps_per_epoch=train_steps - warmup - steps,
                          verbose=0)
            # Evaluated on the coordinator from the servers' weights, every run alike.
            local_model = recommender.token_model()
            local_model.set_weights(model.get_weights())
            prediction = local_model.predict(held_ids, batch_size=1024, verbose=0)
            figures = {
                direction: (local.traffic_between(src, dst, rows=after)
                            - local.traffic_between(src, dst, rows=before)) / steps
                for direction, (src, dst) in {"worker_to_ps": ("worker", "ps"),
                                              "ps_to_worker": ("ps", "worker"),
                                              "chief_to_worker": ("chief", "worker")}.items()}
            figures["step_s"] = wall / steps
            figures["held_out_mse"] = float(np.mean((prediction - held_targets) ** 2))
            if counted0 is not None:
                figures["push_bytes_counted"] = (counted1[0] - counted0[0]) / steps
                figures["push_plain_bytes_counted"] = (counted1[1] - counted0[1]) / steps
                figures["push_dense_bytes_counted"] = (counted1[2] - counted0[2]) / steps
                figures["residuals"] = len(optimizer._residuals)  # noqa: SLF001
            results[name] = figures
            print(f"{name}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    plain = results.get("plain")
    if plain:
        for figures in results.values():
            for direction in ("worker_to_ps", "ps_to_worker"):
                figures[f"{direction}_vs_plain"] = figures[direction] / plain[direction]
            if "push_bytes_counted" in figures:
                figures["counted_ratio"] = (figures["push_plain_bytes_counted"]
                                            / figures["push_bytes_counted"])
                figures["socket_ratio"] = plain["worker_to_ps"] / figures["worker_to_ps"]
    return results


def _counted(optimizer):
    import tfgc  # noqa: PLC0415

    found = tfgc.optimizer.base.compressing_optimizer(optimizer)
    if found is None:
        return None
    traffic = found.read_traffic()
    if traffic is None:
        return 0, 0, 0
    return traffic["push_bytes"], traffic["push_plain_bytes"], traffic["push_dense_bytes"]


def table(results):
    """The results as a Markdown table."""
    lines = ["| run | worker->PS B/step (x plain) | PS->worker B/step (x plain) | counted "
             "ratio vs plain | socket ratio vs plain | s/step | held-out MSE |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        counted = f"{r['counted_ratio']:.2f}" if "counted_ratio" in r else "-"
        socket = f"{r['socket_ratio']:.2f}" if "socket_ratio" in r else "-"
        lines.append(
            f"| {name} | {r['worker_to_ps']:,.0f} ({r.get('worker_to_ps_vs_plain', 1):.3f}) | "
            f"{r['ps_to_worker']:,.0f} ({r.get('ps_to_worker_vs_plain', 1):.3f}) | {counted} | "
            f"{socket} | {r['step_s']:.3f} | {r['held_out_mse']:.4f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=200,
                        help="steps in all before the held-out error is measured")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args(argv)
    results = measure(args.configs, args.steps, args.warmup, args.train_steps)
    print(table(results))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump({"command": " ".join(["python -m benchmarks.sparse_embeddings"]
                                           + (argv if argv is not None else sys.argv[1:])),
                       "steps": args.steps, "results": results}, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
