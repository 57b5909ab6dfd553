"""Where a parameter-server step's round trips go: one step's exchanges, timed by the worker.

    python -m tfgc.cluster.private python -m benchmarks.step_anatomy --delay 50ms

It trains a small Dense model with tf_keras `fit` on 1 parameter server + 2 workers
linked with a one-way delay (round trip = 2 x delay), once per configuration, with
TensorFlow's logging of its cross-process tensor transfers on in the workers
(`TF_CPP_VMODULE` for the rendezvous and eager execution). From worker 0's log it
reads, for each of its steps in the last epoch, when the step's function started, when
each tensor from the server arrived (TensorFlow's receiver asks for each one; the
server's part of the step asks for the worker's), when the function returned, and when
its next step's call arrived, all in round trips after the function started. A worker
whose next call comes much later than its function returned waited for the
coordinator to schedule a step.

Configurations: `plain` (tf_keras's SGD, no tfgc), `fp32` (tfgc, no compression,
uncompressed pulls) and `threelc` (ThreeLC pushes and pulls). Raw output:
`results/round_trips/anatomy.json`; `--report` prints its table.
"""
import argparse
import json
import os
import re
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "round_trips", "anatomy.json")
CONFIGS = ("plain", "fp32", "threelc")
_VMODULE = "base_rendezvous_mgr=2,execute=1"
_LINE = re.compile(r"^I\d{4} [\d:]+?:(?P<time>\d+\.\d+)\s+\d+ (?P<where>\S+)\] (?P<text>.*)$")
_EDGE = re.compile(r";edge_\d+_(?P<name>[^;]+);")


def train(config, delay, steps, workers, log_dir):
    """Trains `config` for two epochs of `steps`; returns the last epoch's start time."""
    import tensorflow as tf
    import tf_keras as keras

    import tfgc
    from tfgc import cluster

    env = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": _VMODULE}
    epoch_starts = []

    class EpochStart(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            epoch_starts.append(time.time())

    with cluster.LocalCluster(num_ps=1, num_workers=workers, delay=delay, timeout_s=600,
                              log_dir=log_dir, env=env) as local:
        strategy = tf.distribute.ParameterServerStrategy(local.resolver)

        def layers():
            return [keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]

        with strategy.scope():
            if config == "plain":
                model = keras.Sequential(layers())
                model.build((None, 32))
                optimizer = keras.optimizers.SGD(0.01)
            else:
                codec = tfgc.codecs.ThreeLC(1.0) if config == "threelc" else None
                servers = tfgc.ParameterServers(codec)
                with servers.scope():
                    model = keras.Sequential(layers())
                    model.build((None, 32))
                optimizer = tfgc.DistributedOptimizer(
                    keras.optimizers.SGD(0.01),
                    compression=codec or tfgc.codecs.NoCompression(), parameter_servers=servers)
            model.compile(optimizer, loss="mse")
        x = tf.random.normal((256, 32), seed=0)
        data = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1))).repeat().batch(32)
        model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[EpochStart()])
    return epoch_starts[-1]


def steps_in_log(path, since, rtt_s):
    """Each step after `since` in a worker log: its events in round trips after it started."""
    steps, current = [], None
    with open(path, errors="replace") as f:
        for line in f:
            match = _LINE.match(line)
            if not match or float(match["time"]) < since:
                continue
            t, text = float(match["time"]), match["text"]
            if "Entering eager executing local operation '__inference_train_function" in text:
                if steps and "next_call" not in steps[-1]:
                    steps[-1]["next_call"] = round((t - steps[-1]["t0"]) / rtt_s, 2)
                current = {"t0": t, "arrived": []}
                steps.append(current)
            elif current is None:
                continue
            elif "Finished Remote Recv" in text:
                edge = _EDGE.search(text)
                name = edge["name"] if edge else text[-60:]
                current["arrived"].append([round((t - current["t0"]) / rtt_s, 2), name])
            elif "Exiting eager executing local operation '__inference_train_function" in text:
                current["returned"] = round((t - current["t0"]) / rtt_s, 2)
    return [dict((k, v) for k, v in s.items() if k != "t0") for s in steps]


def report(results):
    """The table: per configuration, the median step's milestones in round trips."""
    lines = ["| configuration | last tensor from the server | function returned | "
             "next step's call | tensors from the server (arrival in RTT) |",
             "|---|---|---|---|---|"]
    for config in results["configs"]:
        steps = [s for s in results["steps"][config] if "next_call" in s and "returned" in s]
        if not steps:
            continue
        step = sorted(steps, key=lambda s: s["next_call"])[len(steps) // 2]
        last = max((a[0] for a in step["arrived"]), default=0.0)
        arrivals = sorted({f"{a[0]:.1f}: {a[1].split('/')[-1]}" for a in step["arrived"]})
        lines.append(f"| {config} | {last:.2f} | {step['returned']:.2f} | "
                     f"{step['next_call']:.2f} | {'; '.join(arrivals)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", default="50ms", help="one-way delay of every link")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=12, help="steps per epoch (2 epochs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--report", action="store_true", help="print --out's table; run nothing")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.out) as f:
            print(report(json.load(f)))
        return 0
    from tfgc.cluster.netem import parse_delay

    rtt_s = 2 * parse_delay(args.delay)
    configs = args.configs.split(",")
    results = {"delay": args.delay, "rtt_s": rtt_s, "workers": args.workers,
               "configs": configs, "steps": {},
               "command": "python -m benchmarks.step_anatomy " + " ".join(argv or sys.argv[1:])}
    for config in configs:
        with tempfile.TemporaryDirectory(prefix="tfgc-anatomy-") as log_dir:
            since = train(config, args.delay, args.steps, args.workers, log_dir)
            results["steps"][config] = steps_in_log(
                os.path.join(log_dir, "worker-0.log"), since, rtt_s)
        print(f"[step anatomy] {config}: {len(results['steps'][config])} steps", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
