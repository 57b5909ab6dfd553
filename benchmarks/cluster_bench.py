"""Step time and bytes per step on a local 1-ps / 2-worker cluster: fp32 vs Int8 vs ThreeLC,
pushes only and pushes + pulls.

    python -m benchmarks.cluster_bench                       # loopback, 100mbit, 10mbit
    python -m benchmarks.cluster_bench --bandwidths none --steps 20 --rounds 5
    python -m benchmarks.cluster_bench --model convnet42 --bandwidths none   # many tensors
    python -m benchmarks.cluster_bench --model resnet20 --bandwidths none    # compute-bound

For each bandwidth a fresh `tfgc.cluster.LocalCluster` (1 ps, 2 workers) is started
in a process of its own (the coordinator's eager context belongs to one cluster);
"none" is plain loopback, any other value is emulated with tc in network namespaces
(root and iproute2 only; otherwise that row is skipped with the reason). In each
cluster the same model is trained with tf_keras `model.fit` under
ParameterServerStrategy, once per codec, and measured after a warm-up fit. Models, all
on scikit-learn's digits: `mlp`, a 301k-parameter MLP with 6 variables (the default);
`convnet42`, 20 3x3 conv layers of 16 channels and a dense layer, 42 variables, where
per-tensor costs show; `resnet20`, the CIFAR ResNet-20 of `models.resnet` (59 trainable
variables, batch normalization) on the digits resized to 32x32x3, where a step's compute
dominates.
"fp32" is the plain tf_keras optimizer, without tfgc. Measured:

* step time: wall time of a measured fit's second Keras epoch / its steps (steps run on
  both workers; the first epoch absorbs fit's setup, and fit's teardown, which can take
  seconds under PSS, comes after), median over rounds that interleave the codecs (so
  load changes hit all of them);
* bytes per step per direction, from the kernel's per-socket TCP counters (`ss`):
  push = worker -> ps, pull = ps -> worker, and what the coordinator sent;
* the payload the optimizer counted per direction (`optimizer.traffic`), and the
  sockets' bytes over it: what the wire costs beyond the codec's own bytes.
* the compute bound: the model's step alone on one thread without a cluster (a process
  of its own, plain tf_keras), divided by the workers that can run at once on this
  machine's cores; no cluster step can be faster.

Ratios (against fp32 at the same bandwidth) are computed from numbers measured in the
same run. "int8" and "threelc" compress gradient pushes only (pulls are the fp32
model); "+pull" rows also compress model pulls with the same codec (3LC): the model is
built in the scope of a `tfgc.ParameterServers` that the optimizer is handed.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

CODECS = ("fp32", "int8", "threelc", "int8+pull", "threelc+pull")
MODELS = ("mlp", "convnet42", "resnet20")
# The repository root: each bandwidth's child runs there as `-m benchmarks.cluster_bench`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_model(name, tf_keras):
    """The benchmark's model `name` (one of MODELS) for 64-pixel digits; resnet20 ends in
    a softmax, the others in logits."""
    if name == "resnet20":
        from models import resnet

        # Digits as 32x32 grayscale, repeated into three channels.
        images = tf_keras.Sequential([
            tf_keras.layers.Reshape((8, 8, 1), input_shape=(64,)),
            tf_keras.layers.Resizing(32, 32),
            tf_keras.layers.Lambda(
                lambda x: tf_keras.backend.repeat_elements(x, 3, axis=3)),
        ])
        return tf_keras.Sequential([images, resnet.by_name("resnet20", weight_decay=0.0)])
    if name == "mlp":
        return tf_keras.Sequential([
            tf_keras.layers.Dense(512, activation="relu", input_shape=(64,)),
            tf_keras.layers.Dense(512, activation="relu"),
            tf_keras.layers.Dense(10),
        ])
    if name == "convnet42":
        convs = [tf_keras.layers.Conv2D(16, 3, padding="same", activation="relu")
                 for _ in range(20)]
        return tf_keras.Sequential([
            tf_keras.layers.Reshape((8, 8, 1), input_shape=(64,)), *convs,
            tf_keras.layers.GlobalAveragePooling2D(), tf_keras.layers.Dense(10),
        ])
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def model_loss(tf_keras, model_name):
    return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=model_name != "resnet20")


def measure(bandwidth, steps, batch, rounds, model_name="mlp"):
    """Runs in a process of its own: one cluster, every codec; returns a dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    import tf_keras

    import tfgc
    from tfgc import cluster

    rows = {}
    started = time.monotonic()
    with cluster.LocalCluster(num_ps=1, num_workers=2, bandwidth=bandwidth, timeout_s=3000) as c:
        setup_s = time.monotonic() - started
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        data = digits_dataset(tf, batch)
        models = {}
        for name in CODECS:
            base_name, pulls = name.split("+")[0], name.endswith("+pull")
            make_codec = {"fp32": None, "int8": tfgc.codecs.Int8,
                          "threelc": lambda: tfgc.codecs.ThreeLC(1.0)}[base_name]
            servers = tfgc.ParameterServers(make_codec()) if pulls else None
            with strategy.scope():
                tf_keras.utils.set_random_seed(0)
                with servers.scope() if servers is not None else contextlib.nullcontext():
                    model = build_model(model_name, tf_keras)
                optimizer = tf_keras.optimizers.SGD(0.05)
                if name != "fp32":
                    optimizer = tfgc.DistributedOptimizer(
                        optimizer, compression=make_codec(), parameter_servers=servers)
                    optimizer.build(model.trainable_variables)
                model.compile(optimizer, model_loss(tf_keras, model_name))
            model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)  # trace, connect
            models[name] = model
            rows[name] = {"step_ms": [], "push": 0, "pull": 0, "chief": 0, "loss": None,
                          "push_payload": 0, "pull_payload": 0,
                          "variables": len(model.trainable_variables),
                          "params": int(sum(np.prod(v.shape) for v in model.trainable_variables))}
        # Rounds interleave the codecs, so a change in machine load hits all of them;
        # the step time reported is the median over rounds.
        epoch_ends = EpochEnds(tf_keras)
        for _ in range(rounds):
            for name in CODECS:
                counted0 = _counted(models[name].optimizer)
                before = c.socket_bytes()
                history = models[name].fit(data, epochs=2, steps_per_epoch=steps, verbose=0,
                                           callbacks=[epoch_ends])
                wall = epoch_ends.times[1] - epoch_ends.times[0]
                after = c.socket_bytes()

                def sent(src, dst):
                    return (c.traffic_between(src, dst, rows=after)
                            - c.traffic_between(src, dst, rows=before))

                row = rows[name]
                row["step_ms"].append(1000 * wall / steps)
                # Bytes over both epochs (fit's own setup messages included).
                row["push"] += sent("worker", "ps")
                row["pull"] += sent("ps", "worker")
                row["chief"] += sent("chief", "worker") + sent("chief", "ps")
                counted1 = _counted(models[name].optimizer)
                for direction in ("push", "pull"):
                    row[f"{direction}_payload"] += counted1[direction] - counted0[direction]
                row["loss"] = history.history["loss"][-1]
        for row in rows.values():
            row["step_ms_all"] = row["step_ms"]
            row["step_ms"] = float(np.median(row["step_ms"]))
            for key in ("push", "pull", "chief", "push_payload", "pull_payload"):
                row[key] /= rounds * 2 * steps
    return {"bandwidth": bandwidth or "loopback", "setup_s": setup_s, "rows": rows}


def measure_compute(steps, batch, model_name):
    """Runs in a process of its own: the step time of `model_name` trained alone with
    plain SGD on one thread, no cluster: the compute one worker's step needs at least."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf_keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf_keras.utils.set_random_seed(0)
    model = build_model(model_name, tf_keras)
    model.compile(tf_keras.optimizers.SGD(0.05), model_loss(tf_keras, model_name))
    data = digits_dataset(tf, batch)
    model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)  # trace
    epoch_ends = EpochEnds(tf_keras)
    step_ms = []
    for _ in range(3):
        model.fit(data, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[epoch_ends])
        step_ms.append(1000 * (epoch_ends.times[1] - epoch_ends.times[0]) / steps)
    return {"bandwidth": "compute", "step_ms": sorted(step_ms)[1]}


def digits_dataset(tf, batch):
    """scikit-learn's digits as a shuffled, repeated dataset of (64 floats, label)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).reshape(-1, 64).astype("float32")
    y = digits.target.astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2000, seed=0)
    return data.repeat().batch(batch)


def EpochEnds(tf_keras):
    """A callback whose `times` are the monotonic times at which the current fit's
    epochs ended."""

    class Ends(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = []

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.monotonic())

    return Ends()


def _counted(optimizer):
    """{"push", "pull"}: payload bytes a tfgc optimizer counted so far (0 for others)."""
    traffic = getattr(optimizer, "traffic", None)
    if traffic is None:
        return {"push": 0, "pull": 0}
    return {d: int(traffic[f"{d}_bytes"].numpy()) for d in ("push", "pull")}


def run_one(bandwidth, steps, batch, rounds, timeout_s, model_name="mlp"):
    """Runs `measure` in a child process; returns its result or {"error": reason}."""
    cmd = [sys.executable, "-m", "benchmarks.cluster_bench", "--child", bandwidth or "none",
           "--steps", str(steps), "--batch", str(batch), "--rounds", str(rounds),
           "--model", model_name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"bandwidth": bandwidth or "loopback", "error": f"timed out after {timeout_s} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return {"bandwidth": bandwidth or "loopback", "error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1][len("RESULT "):])


def _kb(n):
    return f"{n / 1000:,.1f}"


def report(results, steps, batch, rounds, compute=None):
    lines = [
        f"{rounds} rounds x 2 x {steps} steps per codec, interleaved, after 4 warm-up steps "
        f"(step ms: the second {steps}); "
        f"batch {batch} per worker; 1 ps + 2 workers; step ms = median over rounds",
        "",
        "| link | codec | step ms | (rounds) | push KB/step | pull KB/step | push vs fp32 | "
        "pull vs fp32 | step time vs fp32 | push socket/payload | pull socket/payload | "
        "final loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['bandwidth']} | (skipped: {result['error']}) "
                         "| | | | | | | | | | |")
            continue
        rows = result["rows"]
        base = rows["fp32"]
        for name in CODECS:
            r = rows[name]
            lines.append(
                f"| {result['bandwidth']} | {name} | {r['step_ms']:.1f} | "
                f"{' '.join(f'{t:.0f}' for t in r['step_ms_all'])} | {_kb(r['push'])} | "
                f"{_kb(r['pull'])} | {r['push'] / base['push']:.3f}x | "
                f"{r['pull'] / base['pull']:.3f}x | "
                f"{r['step_ms'] / base['step_ms']:.2f}x | "
                f"{_over(r['push'], r['push_payload'])} | {_over(r['pull'], r['pull_payload'])} | "
                f"{r['loss']:.3f} |"
            )
    fp32 = next((r["rows"]["fp32"] for r in results if "rows" in r), None)
    if fp32:
        params = fp32["params"]
        lines += ["", f"model: {params:,} parameters in {fp32['variables']} variables "
                      f"({params * 4 / 1000:,.1f} KB as fp32)"]
    if compute and "error" not in compute:
        # Two workers share the machine's cores: the cluster cannot step faster than
        # one step's compute divided by the workers that run at once.
        parallel = max(1, min(2, os.cpu_count() or 1))
        bound = compute["step_ms"] / parallel
        lines += ["", f"compute bound: one step alone on one thread (plain tf_keras, no "
                      f"cluster) {compute['step_ms']:.1f} ms; 2 workers on "
                      f"{os.cpu_count()} cores: at best {bound:.1f} ms per cluster step"]
        for result in results:
            if "rows" in result:
                step = result["rows"]["fp32"]["step_ms"]
                lines.append(f"- {result['bandwidth']}: fp32 steps at {step:.1f} ms, "
                             f"{bound / step:.0%} of that bound")
    elif compute:
        lines += ["", f"compute bound: not measured ({compute['error']})"]
    return "\n".join(lines)


def _over(socket_bytes, payload_bytes):
    """Socket bytes over counted payload bytes; '-' where nothing was counted."""
    return f"{socket_bytes / payload_bytes:.2f}x" if payload_bytes else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidths", default="none,100mbit,10mbit",
                        help="comma-separated: none (loopback) or tc rates (default %(default)s)")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per round")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of `steps` per codec, interleaved (default 3)")
    parser.add_argument("--timeout", type=int, default=1500, help="seconds per bandwidth")
    parser.add_argument("--model", default="mlp", choices=MODELS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "compute":
        result = measure_compute(args.steps, args.batch, args.model)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if args.child is not None:
        bandwidth = None if args.child == "none" else args.child
        result = measure(bandwidth, args.steps, args.batch, args.rounds, args.model)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    from tfgc import cluster

    cluster.isolate()  # the clusters it starts stay unreachable from other hosts
    results = []
    for item in args.bandwidths.split(","):
        bandwidth = None if item.strip() in ("", "none", "loopback") else item.strip()
        reason = cluster.emulation_unavailable() if bandwidth else None
        if reason:
            results.append({"bandwidth": bandwidth, "error": reason})
            continue
        print(f"[cluster_bench] measuring {bandwidth or 'loopback'} ...", file=sys.stderr,
              flush=True)
        results.append(run_one(bandwidth, args.steps, args.batch, args.rounds, args.timeout,
                               args.model))
    print("[cluster_bench] measuring one step's compute alone ...", file=sys.stderr, flush=True)
    compute = run_one("compute", args.steps, args.batch, args.rounds, args.timeout, args.model)
    print(report(results, args.steps, args.batch, args.rounds, compute))
    return 0 if all("error" not in r or "needs" in r["error"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
