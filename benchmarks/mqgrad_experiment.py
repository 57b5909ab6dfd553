"""MQGrad vs fixed and adaptive bits: training loss against modelled or measured time.

Trains the same small CNN (MQGrad's architecture, narrower) on a real image dataset
once per method, with gradients quantized by `tfgc.DistributedOptimizer`. Each method
trains until the same time budget is spent. Time is either

* modelled (the default): one process, no strategy (encode and decode locally, so the
  accuracy effect is exact); every iteration costs a fixed compute time plus the bytes
  it pushed (as counted by the optimizer) both ways over a slow link (`TimeModel`), so
  the comparison is the paper's trade-off and does not depend on this machine's load;
* or measured (`--link 10mbit`): a real ParameterServerStrategy cluster on loopback
  (1 parameter server, 1 worker, `tfgc.cluster` with its links shaped by tc), wall
  time from the end of the first step. MQGrad's agent sees the same wall time. Pulls
  are compressed with `--pull-compression` (3LC by default), the same for every
  method: in fp32 the model's 2.8 MB would take over 2 s per step at 10 Mbit/s and
  drown the pushes' differences. The paper's server instead returns the averaged
  gradient quantized with the pushes' bits. One seed and one method per process;
  `--combine` joins the JSON files.

Methods: Fix(2), Fix(4), Fix(8) (`Quantize(bits=k)`; any Fix(k), k = 2..8, on request),
Adaptive (`AdaptiveQuantize`), MQGrad (`Quantize` + the `MQGrad` callback with tfgc's
defaults). A method may carry agent arguments, e.g.
`MQGrad:reward_normalization=none,epsilon_decay=1` (the paper's agent): one variant per
spec, reported under the spec. `--replicate K` shuffles the data with seed + K: a
replicate of a fixed width, compared with the fixed widths, shows how often a method
exactly as good as one of them misses a bound.

    python -m benchmarks.mqgrad_experiment                 # writes results/mqgrad/mqgrad_experiment.*
    python -m benchmarks.mqgrad_experiment --budget-s 20 --seeds 0   # a quick look
    python -m benchmarks.mqgrad_experiment --budget-s 200 --seeds 0 \
        --methods "Fix(4)" MQGrad MQGrad:initial_bits=4 --loss-targets 0.6
    python -m benchmarks.mqgrad_experiment --link 10mbit --budget-s 240 --seeds 0 \
        --methods MQGrad --out /tmp/mq/seed0_mqgrad         # measured; root, tc
"""
import argparse
import contextlib
import json
import os
import re
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
import tf_keras

import tfgc
from benchmarks.series import ema
from models.train_args import parse_compression
from tfgc import cluster as cluster_lib
from tfgc import mqgrad
from tfgc.wire.message import fused_nbytes

METHODS = ("Fix(2)", "Fix(4)", "Fix(8)", "Adaptive", "MQGrad")
FIXED_BITS = re.compile(r"Fix\([2-8]\)")  # any fixed width, e.g. Fix(3), beside the paper's
RECORDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "results", "mqgrad", "mqgrad_experiment")
# Measured runs: how long past the time budget the cluster's servers may live (start,
# the first step's tracing, the test).
CLUSTER_SLACK_S = 600


def load(name, limit, test_limit):
    """Training and test images as float32 in [0, 1], one channel when the source has one."""
    from models.data import load_images

    data = load_images(name, limit=limit, test_limit=test_limit)
    x_train, x_test = data.x_train, data.x_test
    if data.name == "fashion_mnist":  # stored padded to 32x32x3; the channels are equal
        x_train, x_test = x_train[..., :1], x_test[..., :1]
    scale = lambda x: x.astype("float32") / 255.0  # noqa: E731
    return data, scale(x_train), data.y_train, scale(x_test), data.y_test


def build_model(input_shape, num_classes, seed):
    """MQGrad's CNN shape (two 5x5 convolutions with pooling, two FC layers, softmax), narrower."""
    tf_keras.utils.set_random_seed(seed)
    layers = tf_keras.layers
    return tf_keras.Sequential([
        tf_keras.Input(shape=input_shape),
        layers.Conv2D(32, 5, padding="same", activation="relu"),
        layers.MaxPooling2D(3, strides=2),
        layers.Conv2D(32, 5, padding="same", activation="relu"),
        layers.MaxPooling2D(3, strides=2),
        layers.Flatten(),
        layers.Dense(384, activation="relu"),
        layers.Dense(192, activation="relu"),
        layers.Dense(num_classes),
    ])


class StepClock(tf_keras.callbacks.Callback):
    """Times every step and stops at the time budget.

    With a `time_model` a step costs compute + bytes / bandwidth (modelled time); without
    one, the wall time since the end of the first step (measured time; the first step
    traces the functions). Records per step: time so far (s), batch loss, bytes pushed,
    bits per compressed value, wall ms.
    """

    def __init__(self, optimizer, time_model, budget_s, dense_fraction_bytes):
        super().__init__()
        # Under ParameterServerStrategy the logs are one RemoteValue; fetching it waits
        # for the step, so every step is timed to its end.
        self._supports_tf_logs = True
        self.optimizer, self.time_model, self.budget_s = optimizer, time_model, budget_s
        self.uncompressed_bytes, self.compressed_values = dense_fraction_bytes
        self.rows, self.elapsed_s, self._last_bytes, self._previous = [], 0.0, 0, None
        self._measured_from = None

    def on_epoch_begin(self, epoch, logs=None):
        self._previous = None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        values = logs.fetch() if hasattr(logs, "fetch") else logs
        finished = time.perf_counter()
        wall_ms = 1000 * (finished - self._start)
        pushed = int(self.optimizer.traffic["push_bytes"].numpy())
        step_bytes, self._last_bytes = pushed - self._last_bytes, pushed
        mean = float(values["loss"])
        if self._previous is None:
            loss = mean
        else:  # Keras logs the epoch's running mean
            seen, previous = self._previous
            loss = ((batch + 1) * mean - seen * previous) / (batch + 1 - seen)
        self._previous = (batch + 1, mean)
        if self.time_model is not None:
            self.elapsed_s += self.time_model.cost_ms(wall_ms, step_bytes) / 1000.0
        elif self._measured_from is None:
            self._measured_from = finished
        else:
            self.elapsed_s = finished - self._measured_from
        bits = 8.0 * (step_bytes - self.uncompressed_bytes) / self.compressed_values
        self.rows.append((self.elapsed_s, loss, step_bytes, bits, wall_ms))
        if self.elapsed_s >= self.budget_s:
            self.model.stop_training = True


def record_file_dataset(x, y, path):
    """The (image, label) pairs of `x` and `y` as a dataset read from a file at `path`.

    Under ParameterServerStrategy the worker builds the input pipeline. A dataset made
    from in-memory arrays would carry them inside its graph, across the emulated link;
    a file on this machine is read by the worker locally, as a real worker reads its
    shard of the data.
    """
    image_bytes = int(np.prod(x.shape[1:]))
    records = np.concatenate(
        [np.round(x.reshape(len(x), -1) * 255.0).astype(np.uint8),
         y.astype(np.uint8).reshape(-1, 1)], axis=1)
    records.tofile(path)
    shape = x.shape[1:]

    def parse(record):
        values = tf.io.decode_raw(record, tf.uint8)
        image = tf.reshape(tf.cast(values[:image_bytes], tf.float32) / 255.0, shape)
        return image, tf.cast(values[image_bytes], y.dtype)

    return tf.data.FixedLengthRecordDataset(path, image_bytes + 1).map(parse)


REPLICATE_SUFFIX = re.compile(r", replicate \d+$")


def replicate_label(spec, replicate):
    """The name a run is reported under: "Fix(3), replicate 1" for another data order.

    A replicate of a fixed width is not a fixed width in the summaries: it is compared
    with them, which measures how often an exactly-as-good method misses a bound.
    """
    return f"{spec}, replicate {replicate}" if replicate else spec


def parse_method(spec):
    """("MQGrad", {"initial_bits": 4}) from "MQGrad:initial_bits=4"; arguments only for MQGrad."""
    name, _, arguments = spec.partition(":")
    if name not in METHODS and not FIXED_BITS.fullmatch(name):
        raise ValueError(
            f"unknown method {name!r}; known: {', '.join(METHODS)}, Fix(k) for k in 2..8")
    kwargs = {}
    for item in filter(None, arguments.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"method argument {item!r} in {spec!r} is not key=value")
        kwargs[key.strip()] = json.loads(value) if value.strip()[:1] in "-.0123456789[{" else value
    if kwargs and name != "MQGrad":
        raise ValueError(f"only MQGrad takes arguments, got {spec!r}")
    return name, kwargs


def run(spec, data, args, seed):
    if not args.link:
        return _train(spec, data, args, seed, tf.distribute.get_strategy(), records=None)
    with tempfile.TemporaryDirectory(prefix="mqgrad-records-") as records:
        cluster = cluster_lib.LocalCluster(
            num_ps=1, num_workers=1, bandwidth=args.link,
            timeout_s=args.budget_s + CLUSTER_SLACK_S).start()
        try:
            strategy = tf.distribute.experimental.ParameterServerStrategy(cluster.resolver)
            return _train(spec, data, args, seed, strategy, os.path.join(records, "train.bin"))
        finally:
            cluster.stop()


def _train(spec, data, args, seed, strategy, records):
    """One run under `strategy`; `records`: where a measured run writes its training file."""
    method, agent_kwargs = parse_method(spec)
    _, x, y, x_test, y_test = data
    measured = records is not None
    with strategy.scope():
        # Under ParameterServerStrategy the codec's bits variable (MQGrad's) and the
        # weights live on the parameter server; the worker reads them there.
        if method.startswith("Fix"):
            codec = tfgc.codecs.Quantize(bits=int(method[4]))
        elif method == "Adaptive":
            codec = mqgrad.AdaptiveQuantize(rho=args.rho)
        else:
            codec = tfgc.codecs.Quantize(bits=tf.Variable(2, dtype=tf.int32))  # the agent sets it
        servers = (tfgc.ParameterServers(parse_compression(args.pull_compression),
                                         min_elements=args.min_elements)
                   if measured else None)
        with servers.scope() if servers is not None else contextlib.nullcontext():
            model = build_model(x.shape[1:], int(y.max()) + 1, seed)
        optimizer = tfgc.DistributedOptimizer(
            tf_keras.optimizers.SGD(args.lr), compression=codec, min_elements=args.min_elements,
            error_feedback=False, parameter_servers=servers)
        optimizer.build(model.trainable_variables)  # compressed pulls start at build
        model.compile(optimizer, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    compressed = [v for v in model.trainable_variables if optimizer.compresses(v)]
    # What the small tensors' codec (float16 by default) pushes, as the optimizer counts it.
    uncompressed_bytes = sum(
        fused_nbytes(optimizer.wire_codec(v).encode, tf.zeros(v.shape, v.dtype))
        for v in model.trainable_variables if not optimizer.compresses(v))
    compressed_values = sum(v.shape.num_elements() for v in compressed)
    time_model = None if measured else mqgrad.TimeModel(args.bandwidth, compute_ms=args.compute_ms)
    clock = StepClock(optimizer, time_model, args.budget_s,
                      (uncompressed_bytes, compressed_values))
    callbacks = [clock]
    agent = None
    if method == "MQGrad":
        agent_kwargs = {"T": 5, **agent_kwargs}
        agent = tfgc.callbacks.MQGrad(optimizer, seed=seed, time_model=time_model, **agent_kwargs)
        callbacks.insert(0, agent)
    if measured:
        dataset = record_file_dataset(x, y, records)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
    order_seed = seed + args.replicate
    dataset = dataset.shuffle(len(x), seed=order_seed).repeat().batch(args.batch_size).prefetch(2)
    started = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=args.max_steps, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - started
    test_model = model
    if measured:  # tested on the coordinator, on a copy of the trained weights
        test_model = build_model(x.shape[1:], int(y.max()) + 1, seed)
        test_model.set_weights(model.get_weights())
        test_model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           metrics=["accuracy"])
    test_loss, test_accuracy = test_model.evaluate(x_test, y_test, batch_size=500, verbose=0)
    rows = np.array(clock.rows)
    result = {
        "method": replicate_label(spec, args.replicate), "seed": seed,
        "steps": len(rows), "wall_s": seconds,
        "time_s": rows[:, 0].tolist(), "loss": rows[:, 1].tolist(),
        "step_bytes": rows[:, 2].tolist(), "bits": rows[:, 3].tolist(),
        "median_step_ms": float(np.median(rows[1:, 4])),
        "test_loss": float(test_loss), "test_accuracy": float(test_accuracy),
        "compressed_values": compressed_values, "uncompressed_bytes": uncompressed_bytes,
    }
    if measured:
        result["pull_bytes_per_step"] = int(optimizer.traffic["pull_bytes"].numpy()) / len(rows)
    if agent is not None:
        overhead = np.array([s["seconds"] for s in agent.steps[1:]]) * 1e6
        result.update(
            agent_us_median=float(np.median(overhead)), agent_us_p90=float(np.percentile(overhead, 90)),
            mdp_steps=len(agent.steps),
            actions=[s["action"] for s in agent.steps],
            state_bits=[s["state_bits"] for s in agent.steps],
            rewards=[s["reward"] for s in agent.steps[1:]],
        )
    print(f"  {result['method']:9s} seed {seed}: {len(rows)} steps in {seconds:.0f} s wall, "
          f"smoothed loss {ema(trusted_losses(rows[:, 1]))[-1]:.3f}, test acc {test_accuracy:.3f}", flush=True)
    return result


def agent_overhead(steps=2000, T=5):
    """Microseconds per MDP step (and per plain iteration) of the agent alone."""
    agent = mqgrad.MQGradAgent(T=T, seed=0)
    rng = np.random.default_rng(0)
    losses, costs = 2.0 - 1e-3 * np.arange(steps * T) + rng.normal(0, 0.05, steps * T), 100.0
    mdp, plain = [], []
    for m, loss in enumerate(losses):
        started = time.perf_counter()
        agent.observe(loss, costs)
        (mdp if m % T == 0 else plain).append(time.perf_counter() - started)
    return 1e6 * np.median(mdp), 1e6 * np.percentile(mdp, 90), 1e6 * np.median(plain)


def changes(result):
    """[(modelled time s, bits)] where the bits changed."""
    bits, times = [round(b) for b in result["bits"]], result["time_s"]
    return [(round(times[i], 1), bits[i]) for i in range(len(bits)) if i == 0 or bits[i] != bits[i - 1]]


# A cross-entropy above this means the run diverged.
DIVERGED_LOSS = 1e6


def trusted_losses(losses):
    """The batch losses, NaN from the first one that is non-finite, negative or above
    DIVERGED_LOSS: after a divergence the running mean Keras logs is huge, and the batch
    losses recovered from it by subtraction are rounding noise (even small or negative)."""
    losses = np.array(losses, np.float64)
    bad = np.nonzero(~np.isfinite(losses) | (losses < 0) | (losses > DIVERGED_LOSS))[0]
    if bad.size:
        losses[bad[0]:] = np.nan
    return losses


def on_grid(result, grid):
    """The EMA of the training loss at the given modelled times (NaN past the run's end)."""
    smoothed = ema(trusted_losses(result["loss"]))
    times = np.array(result["time_s"])
    values = np.interp(grid, times, smoothed)
    values[grid > times[-1]] = np.nan
    return values


def methods_of(results):
    """The method specs in `results`, in order of first appearance."""
    return list(dict.fromkeys(r["method"] for r in results))


def plot(results, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    grid = np.linspace(0, args.budget_s, 200)
    base_colors = dict(zip(METHODS, ("tab:red", "tab:orange", "tab:green", "tab:purple", "tab:blue")))
    variant_colors = iter(("tab:cyan", "tab:brown", "tab:pink", "tab:olive", "tab:gray", "black"))
    colors = {m: base_colors.get(m) or next(variant_colors, "black") for m in methods_of(results)}
    for method in methods_of(results):
        curves = np.array([on_grid(r, grid) for r in results if r["method"] == method])
        # the median: one diverging seed does not hide the others
        left.plot(grid, np.nanmedian(curves, axis=0), label=method, color=colors[method])
    clock, how = time_axis(args)
    left.set_xlabel(f"{clock} (s): {how}")
    left.set_ylabel("training loss (EMA)")
    left.set_title(f"loss vs {clock} (median of {len(args.seeds)} seed(s))")
    left.set_ylim(0.2, 1.5)  # the first seconds fall from ~2.3 for every method
    left.legend(fontsize=8)
    for r in results:  # the first seed only: one line per method stays readable
        if r["seed"] != args.seeds[0]:
            continue
        if r["method"].startswith("MQGrad") or r["method"] == "Adaptive":
            right.plot(r["time_s"], r["bits"], color=colors[r["method"]], alpha=0.8,
                       label=r["method"])
    right.set_xlabel(f"{clock} (s)")
    right.set_ylabel("bits per value (quantized layers)")
    right.set_title(f"bits over time (seed {args.seeds[0]})")
    right.set_ylim(1.5, 8.5)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def time_axis(args):
    """(what the runs' time is, how it was made): ("modelled time", "30 ms compute + ...")
    or ("measured time", "1 PS + 1 worker, ...")."""
    if args.link:
        return "measured time", f"1 PS + 1 worker, links shaped to {args.link}"
    return "modelled time", (f"{args.compute_ms:g} ms compute + bytes / "
                             f"{args.bandwidth / 1e6:g} MB/s, both ways")


def time_to(result, level):
    """Time (modelled or measured) at which the loss EMA first reaches `level` (inf if never)."""
    below = np.nonzero(ema(trusted_losses(result["loss"])) <= level)[0]
    return result["time_s"][below[0]] if below.size else float("inf")


def _seconds(value):
    return f"{value:.1f}" if np.isfinite(value) else "never"


def summarize(results, args):
    """A markdown table per method (median loss over seeds, time to each loss level per
    seed), then, per seed and loss target, which method reached the target first."""
    grid = np.array([0.25, 0.5, 0.75, 1.0]) * args.budget_s
    levels = args.loss_targets
    lines = ["| method | steps (mean) | loss EMA @25% | @50% | @75% | @100% of budget (median of seeds) | "
             + " | ".join(f"time (s) to loss {level:g}, per seed" for level in levels)
             + " | test acc | mean bits |",
             "|---|---|---|---|---|---|" + "---|" * len(levels) + "---|---|"]
    methods = methods_of(results)
    for method in methods:
        runs = [r for r in results if r["method"] == method]
        losses = np.nanmedian([on_grid(r, grid - 1e-9) for r in runs], axis=0)
        lines.append(
            f"| {method} | {np.mean([r['steps'] for r in runs]):.0f} | "
            + " | ".join(f"{v:.3f}" for v in losses)
            + "".join(" | " + " / ".join(_seconds(time_to(r, level)) for r in runs)
                      for level in levels)
            + " | " + " / ".join(f"{r['test_accuracy']:.3f}" for r in runs) + " | "
            f"{np.mean([np.mean(r['bits']) for r in runs]):.2f} |")
    lines.append("")
    for level in levels:
        for seed in sorted({r["seed"] for r in results}):
            times = {r["method"]: time_to(r, level) for r in results if r["seed"] == seed}
            best = min(times.values())
            order = sorted(times, key=times.get)
            if not np.isfinite(best):
                lines.append(f"- loss {level:g}, seed {seed}: no method reached it")
                continue
            lines.append(
                f"- loss {level:g}, seed {seed}: first {order[0]} ({_seconds(best)} s); "
                + ", ".join(f"{m} {times[m] / best:.2f}x" if np.isfinite(times[m]) else f"{m} never"
                            for m in order[1:]))
    lines += [""] + against_best_fixed(results, levels)
    return "\n".join(lines)


def against_best_fixed(results, levels):
    """Per adaptive method: its time to each target over the fastest fixed width's at
    that seed and target, and how often it is within 5% of it."""
    fixed = {r["method"] for r in results if FIXED_BITS.fullmatch(r["method"])}
    best = {}  # (seed, level) -> the fastest fixed width's time
    for run in (r for r in results if r["method"] in fixed):
        for level in levels:
            key = (run["seed"], level)
            best[key] = min(best.get(key, float("inf")), time_to(run, level))
    lines = []
    for method in methods_of(results):
        if method in fixed:
            continue
        ratios = []
        for level in levels:
            for run in (r for r in results if r["method"] == method):
                fastest = best.get((run["seed"], level), float("inf"))
                if np.isfinite(fastest):
                    ratios.append(time_to(run, level) / fastest)
        if ratios:
            lines.append(
                f"- {method} against the fastest of {', '.join(sorted(fixed))} per seed and "
                f"target: within 5% in {sum(r <= 1.05 for r in ratios)} of {len(ratios)}, "
                f"median {np.median(ratios):.2f}x, worst {max(ratios):.2f}x")
    return lines


def window_rewards(result, T, alpha, reward_scale):
    """[(smoothed loss, Eq. (2) reward)] of each T-iteration window of a run, as the
    agent would compute them (its smoothing, chained from the first loss, and formula)."""
    losses = trusted_losses(result["loss"])
    costs_ms = 1000.0 * np.diff(np.concatenate([[0.0], result["time_s"]]))
    previous, windows = losses[0], []
    for end in range(1 + T, len(losses) + 1, T):
        window = slice(end - T, end)
        if not np.all(np.isfinite(losses[window])):
            break
        smoothed = mqgrad.smooth_losses(losses[window], previous, alpha)
        previous = smoothed[-1]
        value = mqgrad.reward(smoothed, costs_ms[window].sum(), reward_scale)
        windows.append((smoothed[-1], value))
    return windows


def reward_noise(results, levels, T, alpha, reward_scale):
    """Can the agent's rewards tell two fixed widths apart? A markdown table.

    The fixed-width runs' windows are grouped by the smoothed loss they end at (the
    agent's state). Per group: each width's mean reward and its standard deviation over
    windows, and for adjacent widths the windows of each that a difference of two
    standard errors takes, (2 * sqrt(sd_a^2 + sd_b^2) / (mean_a - mean_b))^2.
    """
    fixed = sorted({r["method"] for r in results if FIXED_BITS.fullmatch(r["method"])},
                   key=lambda m: int(m[4]))
    edges = sorted(levels, reverse=True)
    groups = [(edges[0], np.inf)] + list(zip(edges[1:], edges[:-1]))
    rewards = {(m, g): [] for m in fixed for g in groups}
    for result in results:
        if result["method"] in fixed:
            for loss, value in window_rewards(result, T, alpha, reward_scale):
                for low, high in groups:
                    if low <= loss < high:
                        rewards[(result["method"], (low, high))].append(value)
    pairs = list(zip(fixed, fixed[1:]))
    lines = ["| smoothed loss | " + " | ".join(f"{m} reward, mean +- sd (windows)" for m in fixed)
             + "".join(f" | windows for {a} vs {b}" for a, b in pairs) + " |",
             "|---|" + "---|" * (len(fixed) + len(pairs))]
    for low, high in groups:
        stats = {}  # method -> (mean, sd, windows); no mean or sd for fewer than two
        for m in fixed:
            values = rewards[(m, (low, high))]
            spread = (np.mean(values), np.std(values)) if len(values) > 1 else (np.nan, np.nan)
            stats[m] = (*spread, len(values))
        cells = [f"{mean:.2e} +- {sd:.2e} ({n})" if n > 1 else f"- ({n})"
                 for mean, sd, n in stats.values()]
        for a, b in pairs:
            difference = stats[a][0] - stats[b][0]
            needed = (2 * np.hypot(stats[a][1], stats[b][1]) / difference) ** 2
            cells.append(f"{needed:.0f}" if np.isfinite(needed) else "n/a")
        span = f"[{low:g}, {high:g})" if np.isfinite(high) else f">= {low:g}"
        lines.append(f"| {span} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--limit", type=int, default=20000)
    parser.add_argument("--test-limit", type=int, default=5000)
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="seconds per run (modelled; measured with --link)")
    parser.add_argument("--max-steps", type=int, default=100000)
    parser.add_argument("--bandwidth", type=float, default=10e6, help="bytes/s (paper: 10 MB/s)")
    parser.add_argument("--compute-ms", type=float, default=30.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rho", type=float, default=0.01, help="Adaptive's noise ratio")
    parser.add_argument("--min-elements", type=int, default=50_000,
                        help="quantize only the FC layers, as the paper does")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--methods", nargs="+",
                        help="methods, MQGrad with optional agent arguments: MQGrad:key=value,... "
                             f"(default: {' '.join(METHODS)}; with --combine: only these runs)")
    parser.add_argument("--loss-targets", type=float, nargs="+", default=[1.0, 0.8],
                        help="loss EMA levels whose time to reach the summary reports")
    parser.add_argument("--replicate", type=int, default=0, metavar="K",
                        help="shuffle the data with seed + K instead of the seed (the model "
                             "starts the same); runs are reported as 'METHOD, replicate K'")
    parser.add_argument("--link", metavar="RATE",
                        help="measure time instead of modelling it: train on a loopback "
                             "cluster (1 parameter server, 1 worker) whose links are shaped "
                             "to RATE (tc units, e.g. 10mbit; needs root); one seed and one "
                             "method per process")
    parser.add_argument("--pull-compression", default="threelc:sparsity=1.0",
                        help="with --link: the pulls' codec (every run pulls the same way)")
    parser.add_argument("--out", help="path prefix of the .json and .png written (default: "
                        "results/mqgrad/mqgrad_experiment; with --combine: ./mqgrad_combined, so "
                        "that joining a few runs does not replace the recorded plot)")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="no training: plot and summarize the runs saved in these files")
    args = parser.parse_args(argv)
    for spec in args.methods or ():  # a typo fails now, not after an hour of other runs
        try:
            parse_method(REPLICATE_SUFFIX.sub("", spec) if args.combine else spec)
        except ValueError as error:
            parser.error(str(error))
    if args.link and not args.combine:
        # One ParameterServerStrategy per process: TensorFlow connects a process to one
        # cluster.
        if len(args.seeds) != 1 or len(args.methods or METHODS) != 1:
            parser.error("--link runs one seed and one method per process "
                         "(--seeds S --methods M); --combine joins them")
        try:
            cluster_lib.parse_rate(args.link)
            parse_compression(args.pull_compression)
        except ValueError as error:
            parser.error(str(error))
        reason = cluster_lib.emulation_unavailable()
        if reason:
            parser.error(f"--link: {reason}")
        # Keep the cluster unreachable from other hosts. The private namespace reaches no
        # package registry, so the data is fetched first.
        if not cluster_lib.in_private_network():
            from models import data as data_lib

            data_lib.prefetch(args.dataset)
        cluster_lib.isolate()
    if args.out is None:
        args.out = "mqgrad_combined" if args.combine else RECORDED
    if args.combine:
        results = []
        for path in args.combine:
            with open(path) as f:
                saved = json.load(f)
            results += [r for r in saved["results"]
                        if args.methods is None or r["method"] in args.methods]
            print(saved["dataset"], saved["args"])
        args.seeds = sorted({r["seed"] for r in results})
        args.budget_s = saved["args"]["budget_s"]
        args.bandwidth, args.compute_ms = saved["args"]["bandwidth"], saved["args"]["compute_ms"]
        args.link = saved["args"].get("link")
        plot(results, args, args.out + ".png")
        print(summarize(results, args))
        defaults = mqgrad.MQGradAgent(seed=0).config
        print(f"\nEq. (2) rewards of the fixed widths' windows (the agent's defaults: "
              f"T={defaults['T']}, alpha={defaults['alpha']}):")
        print(reward_noise(results, args.loss_targets, defaults["T"], defaults["alpha"],
                           defaults["reward_scale"]))
        for r in results:
            if r["method"].startswith("MQGrad"):
                print(f"{r['method']} seed {r['seed']}: {r['mdp_steps']} MDP steps, agent "
                      f"{r['agent_us_median']:.0f} us median per MDP step; bits "
                      f"{changes(r)}")
        return
    args.methods = args.methods or list(METHODS)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    median, p90, plain = agent_overhead()
    print(f"agent alone: {median:.0f} us median ({p90:.0f} us p90) per MDP step, "
          f"{plain:.1f} us per other iteration", flush=True)
    data = load(args.dataset, args.limit, args.test_limit)
    print(data[0].describe(), flush=True)
    results = []
    for seed in args.seeds:
        for method in args.methods:
            results.append(run(method, data, args, seed))
    with open(args.out + ".json", "w") as f:
        json.dump({"args": vars(args), "dataset": data[0].describe(), "results": results}, f)
    plot(results, args, args.out + ".png")
    print(summarize(results, args))
    for r in results:
        if r["method"].startswith("MQGrad"):
            print(f"{r['method']} seed {r['seed']}: agent {r['agent_us_median']:.0f} us median "
                  f"({r['agent_us_p90']:.0f} us p90) per MDP step, {r['mdp_steps']} steps; "
                  f"median training step {r['median_step_ms']:.1f} ms wall")


if __name__ == "__main__":
    main()
