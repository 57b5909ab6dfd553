"""TensorFlow's "Multi-worker training with Keras" tutorial
(MultiWorkerMirroredStrategy, `Model.fit`), with tfgc's compressed all-reduce.

The lines that differ from the tutorial are marked `# tfgc`. MNIST becomes scikit-learn's
digits (8x8 images, on disk with scikit-learn: no download), and `tf.keras` is
tf_keras. Every worker runs this script with its own `TF_CONFIG`; on one machine:

    python -m tfgc.cluster --workers 2 --mwms -- examples/multi_worker_with_keras.py
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras as keras  # the tutorial's tf.keras
from sklearn.datasets import load_digits

import tfgc  # tfgc


def mnist_dataset(batch_size):
    digits = load_digits()  # the tutorial's MNIST, smaller
    x_train = (digits.images / 16.0).astype(np.float32)[..., None]
    y_train = digits.target.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2000).repeat().batch(
        batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(input_shape=(8, 8)),
        keras.layers.Reshape(target_shape=(8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tfgc.DistributedOptimizer(  # tfgc
            keras.optimizers.SGD(learning_rate=0.1),
            compression=tfgc.codecs.ThreeLC(1.0)),  # tfgc
        metrics=["accuracy"])
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=70)
    args = parser.parse_args(argv)

    per_worker_batch_size = 64
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)
    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()
    history = multi_worker_model.fit(
        multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
        callbacks=[tfgc.callbacks.TrafficLogger()], verbose=2)  # tfgc
    last = {k: v[-1] for k, v in history.history.items()}
    print(f"worker {tf_config['task']['index']}: loss {last['loss']:.4f}, accuracy "
          f"{last['accuracy']:.3f}; per step the workers sent {last['push_bytes']:.0f} B "
          f"for {last['push_dense_bytes']:.0f} B of fp32 gradients")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
