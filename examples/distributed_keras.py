"""TensorFlow's "Distributed training with Keras" tutorial (MirroredStrategy,
`Model.fit`), with tfgc's compressed all-reduce.

The lines that differ from the tutorial are marked `# tfgc`. MNIST becomes scikit-learn's
digits (on disk, no download), and `tf.keras` is tf_keras. The tutorial's replicas are
GPUs; on a CPU-only machine this script makes two logical CPU devices, so two replicas
all-reduce their (compressed) gradients all the same.

    python examples/distributed_keras.py [--epochs 3]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras  # the tutorial's tf.keras
from sklearn.datasets import load_digits

import tfgc  # tfgc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    if not tf.config.list_physical_devices("GPU"):  # two replicas on one CPU
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    split = 1500
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("GPU")]
        or [d.name for d in tf.config.list_logical_devices("CPU")])
    print(f"Number of devices: {strategy.num_replicas_in_sync}")

    BATCH_SIZE = 64 * strategy.num_replicas_in_sync
    train_dataset = tf.data.Dataset.from_tensor_slices((x[:split], y[:split]))
    train_dataset = train_dataset.shuffle(10000).batch(BATCH_SIZE)
    eval_dataset = tf.data.Dataset.from_tensor_slices((x[split:], y[split:])).batch(BATCH_SIZE)

    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Conv2D(32, 3, activation="relu", input_shape=(8, 8, 1)),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=tfgc.DistributedOptimizer(  # tfgc
                          keras.optimizers.Adam(), compression=tfgc.codecs.Int8()),  # tfgc
                      metrics=["accuracy"])
    model.fit(train_dataset, epochs=args.epochs,
              callbacks=[tfgc.callbacks.TrafficLogger()], verbose=2)  # tfgc
    eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
    print(f"Eval loss: {eval_loss:.4f}, Eval accuracy: {eval_acc:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
