"""How far a worker's pulled weights trail the server's, per 3LC sparsity multiplier.

A compressed pull sends `encode(master - cache)` and leaves the rest in the next delta
(error accumulation), so a worker computes its gradients at `cache = master - residual`.
This trains ResNet-20 in one process (no strategy: `tfgc.ps.variables` runs the same pull
mechanism for one worker, so the workers' asynchrony is left out) with its pulls
compressed by ThreeLC at each `--sparsity`, and after every step measures, over the
pulled variables of the main codec (the kernels):

    lag = rms(master - cache) / rms(this step's change of the master)

i.e. by how many steps' worth of updates the weights the next gradient sees trail the
server's. ThreeLC(s) sends +-s*max|delta| where |delta| > s*max|delta| / 2, so with
s = 1.75 only values above 0.875 max cross, overshoot, and keep a residual of 0.75-0.875
max: the residual shrinks slowly and the lag grows with s.

    python -m benchmarks.pull_lag --steps 400 --sparsity 1.0 1.25 1.5 1.75

Pushes are uncompressed, so the lag is the pulls' alone. Prints a table (mean lag over
the second half of the steps, the pull payload ratio, the training loss over the last 50
steps) and writes it to --out as JSON.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def measure(sparsity, args):
    """Trains with pulls compressed by ThreeLC(sparsity); returns the run's record."""
    import tf_keras

    import tfgc
    from models import train_args, workloads

    tf_keras.utils.set_random_seed(args.seed)
    options = train_args.build_parser().parse_args([
        "--model", "resnet20", "--dataset", args.dataset, "--allow-substitute",
        "--train-limit", str(args.train_limit), "--test-limit", "250",
        "--steps", str(args.steps), "--seed", str(args.seed), "--lr", str(args.lr),
        "--strategy", "local"])
    workload = workloads.ImageWorkload(options)
    servers = tfgc.ParameterServers(tfgc.codecs.ThreeLC(sparsity), small_compression=None)
    with servers.scope():
        model = workload.build_model(0.0)
    optimizer = tfgc.DistributedOptimizer(
        workload.inner_optimizer(args.lr, args.steps), compression=tfgc.codecs.NoCompression(),
        error_feedback=False, small_compression=None, parameter_servers=servers)
    optimizer.build(model.trainable_variables)
    model.compile(optimizer, workload.loss())
    pulled = [v for v in model.trainable_variables
              if isinstance(v, tfgc.ps.variables.PulledVariable) and optimizer.compresses(v.master)]
    if not pulled:
        raise RuntimeError("no variable is pulled compressed: nothing to measure")

    class Lag(tf_keras.callbacks.Callback):
        """Records the lag and the loss after every step."""

        def __init__(self):
            super().__init__()
            self.lags, self.losses = [], []
            self.previous = [v.master.numpy() for v in pulled]

        def on_train_batch_end(self, batch, logs=None):
            masters = [v.master.numpy() for v in pulled]
            residual = np.concatenate([(m - v.cache.numpy()).ravel()
                                       for m, v in zip(masters, pulled)])
            change = np.concatenate([(m - p).ravel() for m, p in zip(masters, self.previous)])
            self.previous = masters
            self.losses.append(float(logs["loss"]))
            if change.any():
                self.lags.append(float(np.sqrt(np.mean(residual ** 2) / np.mean(change ** 2))))

    lag = Lag()
    started = time.monotonic()
    model.fit(workload.train_dataset(args.batch_size), epochs=1, steps_per_epoch=args.steps,
              callbacks=[lag], verbose=0)
    counters = {k: float(v.numpy()) for k, v in optimizer.traffic.items()}
    half = len(lag.lags) // 2
    return {
        "sparsity": sparsity,
        "mean_lag_second_half": float(np.mean(lag.lags[half:])),
        "pull_payload_ratio": counters["pull_dense_bytes"] / counters["pull_bytes"],
        "loss_last_50": float(np.mean(lag.losses[-50:])),
        "seconds": time.monotonic() - started,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sparsity", type=float, nargs="+", default=[1.0, 1.25, 1.5, 1.75])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--train-limit", type=int, default=60000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/pull_lag.json")
    args = parser.parse_args(argv)
    if any(not 1.0 <= s < 2.0 for s in args.sparsity):
        parser.error("ThreeLC's sparsity multiplier is in [1, 2)")
    if args.steps < 4:
        parser.error("--steps must be at least 4")

    records = []
    for sparsity in args.sparsity:
        print(f"[pull_lag] ThreeLC({sparsity}) pulls, {args.steps} steps ...", flush=True)
        records.append(measure(sparsity, args))
    print("\n| pulls | lag (steps of updates, rms) | pull payload ratio "
          "| train loss, last 50 steps |")
    print("|---|---|---|---|")
    for r in records:
        print(f"| ThreeLC({r['sparsity']}) | {r['mean_lag_second_half']:.1f} "
              f"| {r['pull_payload_ratio']:.1f}x | {r['loss_last_50']:.3f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "runs": records}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
