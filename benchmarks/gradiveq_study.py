"""GradiVeQ's observations and accuracy on ResNet-20 with a real image dataset.

Two training runs of the same ResNet-20 from the same initial weights on the same
batches (one process, tf_keras SGD with momentum):

1. uncompressed: every conv kernel's gradient is recorded at every step;
2. GradiVeQ through `tfgc.DistributedOptimizer(..., error_feedback=False)` with the
   paper's schedule scaled down (warm-up, L_t QSGD 4-bit sampling steps, L_c compressed
   steps).

From run 1's gradients (the paper's section 1 observations):
* per layer: d from Eq. 6 (lambda = 0.01) over the L_t gradients after warm-up, K/d,
  and the relative compression loss ||g_hat - g||^2 / ||g||^2 of the next L_c gradients,
  on the sampled (first) slice and on the layer's other slices (one compressor per
  layer, s = infinity);
* Fig. 5: for one (3, 3, 16, 16) layer, the loss of a compressor computed on the first
  slice when applied to the other slices, as a function of the slice size;
* the PCA refresh time per layer.
From run 2: test accuracy at equal steps, the d each layer used (from QSGD samples), and
the bytes sent (`optimizer.traffic`).

    python -m benchmarks.gradiveq_study --steps 500
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras

import tfgc
from benchmarks.plots import draw_gradiveq_figure5
from tfgc.codecs.gradiveq import GradiVeQ


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist", help="fashion_mnist, digits, cifar10")
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--train-limit", type=int, default=20000)
    parser.add_argument("--test-limit", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--sampling", type=int, default=100, help="L_t")
    parser.add_argument("--compressed", type=int, default=300, help="L_c")
    parser.add_argument("--loss-threshold", type=float, default=0.01, help="lambda")
    parser.add_argument("--sampling-bits", type=int, default=4, help="QSGD bits; 0: fp32 samples")
    parser.add_argument("--error-feedback", action="store_true",
                        help="keep the residual of compression (not in the paper)")
    parser.add_argument("--uncentred", action="store_true",
                        help="PCA without the samples' mean (GradiVeQ(centred=False))")
    parser.add_argument("--slice-multiple", type=int, default=None,
                        help="K = this * F * D (default: the kernel width, the paper's)")
    parser.add_argument("--pool-slices", action="store_true",
                        help="PCA over every slice of each sample (GradiVeQ(pool_slices=True))")
    parser.add_argument("--variant", default=None,
                        help="only the GradiVeQ run, written to gradiveq_study_<variant>.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/gradiveq/500_steps",
                        help="where the JSON and plots go (default: %(default)s)")
    return parser.parse_args(argv)


def load(args):
    from models.data import load_images

    data = load_images(args.dataset, limit=args.train_limit, test_limit=args.test_limit)
    print(data.describe(), flush=True)
    scale = lambda x: x.astype(np.float32) / 255.0 - 0.5  # noqa: E731
    return data, scale(data.x_train), data.y_train, scale(data.x_test), data.y_test


def batches(x, y, args):
    """The same shuffled batch sequence for every run."""
    rng = np.random.default_rng(args.seed)
    order = np.concatenate([rng.permutation(len(x)) for _ in range(args.steps * args.batch // len(x) + 1)])
    for step in range(args.steps):
        index = order[step * args.batch:(step + 1) * args.batch]
        yield x[index], y[index]


def make_model(data, args):
    from models.resnet import resnet

    tf_keras.utils.set_random_seed(args.seed)
    return resnet(args.depth, num_classes=data.num_classes, input_shape=data.input_shape)


def accuracy(model, x, y):
    probabilities = model.predict(x, batch_size=500, verbose=0)
    return float((probabilities.argmax(-1) == y).mean())


def train(model, optimizer, x, y, args, record=None):
    """Custom loop; returns per-step losses (and fills `record` with conv gradients)."""
    convs = [v for v in model.trainable_variables if v.shape.rank == 4]
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True)) + tf.add_n(model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        conv_gradients = [g for g, v in zip(gradients, model.trainable_variables) if v.shape.rank == 4]
        return loss, conv_gradients

    losses, start = [], time.time()
    for t, (images, labels) in enumerate(batches(x, y, args)):
        loss, conv_gradients = step(tf.constant(images), tf.constant(labels))
        losses.append(float(loss))
        if record is not None:
            for v, g in zip(convs, conv_gradients):
                record.setdefault(v.name, []).append(g.numpy())
        if t % 100 == 0 or t == args.steps - 1:
            print(f"  step {t}: loss {losses[-1]:.3f} ({time.time() - start:.0f} s)", flush=True)
    return losses


def relative_loss(layer, gradients):
    """[T, S] relative compression loss per step and slice (one compressor, N = 1)."""
    slices = tf.constant(np.stack([g.reshape(layer.num_slices, layer.slice_size) for g in gradients]))
    decoded = tf.stack([layer.decompress(layer.compress(s)) for s in tf.unstack(slices)])
    error = tf.reduce_sum(tf.square(decoded - slices), -1)
    return (error / tf.maximum(tf.reduce_sum(tf.square(slices), -1), 1e-30)).numpy()


def observations(record, args):
    """d, K/d and compression loss per layer from the uncompressed run's gradients."""
    start, stop = args.warmup, args.warmup + args.sampling
    rows, refresh_times = [], []
    settings = GradiVeQ(loss_threshold=args.loss_threshold, sampling_steps=args.sampling)
    for name, gradients in record.items():
        shape = gradients[0].shape
        layer = settings.bind(tf.Variable(tf.zeros(shape)), name="study")
        layer.samples.assign(np.stack([
            layer._grouped(layer.slices(g))[:, 0].numpy() for g in gradients[start:stop]
        ]))
        refresh = tf.function(layer.refresh)
        refresh()  # trace
        begin = time.perf_counter()
        refresh()
        refresh_times.append(time.perf_counter() - begin)
        d = int(layer.dim.numpy())
        later = gradients[stop:stop + args.compressed]
        losses = relative_loss(layer, later) if later else np.zeros([1, layer.num_slices])
        rows.append({
            "layer": name.split(":")[0], "shape": list(shape), "K": layer.slice_size,
            "slices": layer.num_slices, "d": d, "K/d": layer.slice_size / d,
            "retained_on_samples": float(layer.retained.numpy()[0]),
            "loss_first_slice": float(losses[:, 0].mean()),
            "loss_other_slices": float(losses[:, 1:].mean()) if layer.num_slices > 1 else None,
            "loss_layer": float(losses.mean()),
            "refresh_s": refresh_times[-1],
        })
        print("  {layer:32s} {shape} K={K} S={slices} d={d} K/d={K/d:.1f} "
              "loss first={loss_first_slice:.3f} others={loss_other_slices}".format(**rows[-1]),
              flush=True)
    return rows


def figure5(record, args):
    """Loss of a first-slice compressor on the other slices vs the slice size."""
    name = next((n for n, g in record.items() if tuple(g[0].shape) == (3, 3, 16, 16)), None)
    if name is None:
        return None
    start, stop = args.warmup, args.warmup + args.sampling
    flat = np.stack([g.reshape(-1) for g in record[name]])
    results = []
    for size in range(32, 769, 32):
        count = flat.shape[1] // size
        samples = flat[start:stop, :size]
        mean = samples.mean(0)
        u, s, vt = np.linalg.svd(samples - mean, full_matrices=False)
        kept = np.cumsum(s ** 2) / max((s ** 2).sum(), 1e-30)
        d = int(np.argmax(kept >= 1 - args.loss_threshold)) + 1
        basis = vt[:d].T
        later = flat[stop:stop + args.compressed, : count * size].reshape(-1, count, size)
        decoded = (later - mean) @ basis @ basis.T + mean
        loss = ((decoded - later) ** 2).sum(-1) / np.maximum((later ** 2).sum(-1), 1e-30)
        results.append({"slice_size": size, "d": d, "loss_first": float(loss[:, 0].mean()),
                        "loss_others": float(loss[:, 1:].mean())})
    return {"layer": name.split(":")[0], "points": results}


def run_gradiveq(args, data, x, y, x_test, y_test, base_lr):
    model = make_model(data, args)
    codec = GradiVeQ(loss_threshold=args.loss_threshold, warmup_steps=args.warmup,
                     sampling_steps=args.sampling, compressed_steps=args.compressed,
                     sampling_bits=args.sampling_bits or None, seed=args.seed,
                     centred=not args.uncentred, slice_multiple=args.slice_multiple,
                     pool_slices=args.pool_slices)
    optimizer = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD.from_config(base_lr.get_config()), compression=codec,
        error_feedback=args.error_feedback)
    begin = time.time()
    losses = train(model, optimizer, x, y, args)
    seconds = time.time() - begin
    test_accuracy = accuracy(model, x_test, y_test)
    print(f"  test accuracy {test_accuracy:.4f}", flush=True)
    used = []
    for v in model.trainable_variables:
        if optimizer.compresses(v) and v.shape.rank == 4:
            layer = optimizer.codec_for(v)
            used.append({"layer": v.name.split(":")[0], "d": int(layer.dim.numpy()),
                         "K": layer.slice_size, "refreshes": int(layer.refreshes.numpy()),
                         "retained": float(layer.retained.numpy()[0])})
    return losses, seconds, test_accuracy, optimizer, used


def run_variant(args, data, x, y, x_test, y_test, base_lr):
    print(f"GradiVeQ variant {args.variant}", flush=True)
    losses, seconds, test_accuracy, optimizer, used = run_gradiveq(
        args, data, x, y, x_test, y_test, base_lr)
    summary = {"args": vars(args), "dataset": data.describe(), "accuracy": test_accuracy,
               "final_loss": float(np.mean(losses[-50:])), "train_seconds": seconds,
               "traffic": optimizer.read_traffic(),
               "gradiveq_run_layers": used, "losses": losses}
    with open(os.path.join(args.out, f"gradiveq_study_{args.variant}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("accuracy", "final_loss", "traffic")}, indent=1))


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    data, x, y, x_test, y_test = load(args)
    base_lr = tf_keras.optimizers.SGD(args.lr, momentum=0.9)

    if args.variant:
        run_variant(args, data, x, y, x_test, y_test, base_lr)
        return
    print("run 1: uncompressed", flush=True)
    model = make_model(data, args)
    record = {}
    begin = time.time()
    plain_losses = train(model, tf_keras.optimizers.SGD.from_config(base_lr.get_config()), x, y, args, record)
    plain_time = time.time() - begin
    plain_accuracy = accuracy(model, x_test, y_test)
    print(f"  test accuracy {plain_accuracy:.4f}", flush=True)

    print("run 2: GradiVeQ", flush=True)
    gradiveq_losses, gradiveq_time, gradiveq_accuracy, optimizer, used = run_gradiveq(
        args, data, x, y, x_test, y_test, base_lr)

    print("observations on run 1's gradients", flush=True)
    rows = observations(record, args)
    fig5 = figure5(record, args)
    summary = {
        "args": vars(args), "dataset": data.describe(),
        "accuracy": {"uncompressed": plain_accuracy, "gradiveq": gradiveq_accuracy},
        "train_seconds": {"uncompressed": plain_time, "gradiveq": gradiveq_time},
        "final_loss": {"uncompressed": float(np.mean(plain_losses[-50:])),
                       "gradiveq": float(np.mean(gradiveq_losses[-50:]))},
        "traffic": optimizer.read_traffic(),
        "layers": rows, "gradiveq_run_layers": used, "figure5": fig5,
        "mean_K_over_d": float(np.mean([r["K/d"] for r in rows])),
        "refresh_seconds_total": float(sum(r["refresh_s"] for r in rows)),
        "losses": {"uncompressed": plain_losses, "gradiveq": gradiveq_losses},
    }
    with open(os.path.join(args.out, "gradiveq_study.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(summary, args)
    print(json.dumps({k: summary[k] for k in ("accuracy", "final_loss", "traffic", "mean_K_over_d",
                                              "refresh_seconds_total", "train_seconds")}, indent=1))


def plot(summary, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if summary["figure5"]:
        draw_gradiveq_figure5(summary["figure5"], os.path.join(args.out, "gradiveq_fig5.png"))
    plt.figure(figsize=(6, 3.5))
    for key in ("uncompressed", "gradiveq"):
        losses = np.convolve(summary["losses"][key], np.ones(20) / 20, mode="valid")
        plt.plot(losses, label=key)
    edge = args.warmup
    plt.axvspan(edge, edge + args.sampling, color="orange", alpha=0.15, label="QSGD sampling")
    plt.axvspan(edge + args.sampling, min(args.steps, edge + args.sampling + args.compressed),
                color="green", alpha=0.1, label="GradiVeQ")
    plt.xlabel("step")
    plt.ylabel("training loss (20-step mean)")
    plt.legend()
    plt.tight_layout()
    plt.savefig(os.path.join(args.out, "gradiveq_loss.png"), dpi=100)
    plt.close()


if __name__ == "__main__":
    main()
