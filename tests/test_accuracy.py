"""Accuracy sanity: compressed training reaches uncompressed accuracy at equal steps."""
import warnings

import numpy as np
import tf_keras
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tfgc
from tfgc import codecs as C


def _train_and_test(push, pull, steps=600):
    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, data.target, test_size=0.3, random_state=0, stratify=data.target
    )
    tf_keras.utils.set_random_seed(0)
    # The same model construction for every run; push-only runs pull it as it is.
    warnings.filterwarnings("ignore", message=".*created under tfgc.compressed_pulls")
    with tfgc.compressed_pulls():
        model = tf_keras.Sequential([
            tf_keras.layers.Dense(256, activation="relu", input_shape=(64,)),
            tf_keras.layers.Dense(10),
        ])
    opt = tf_keras.optimizers.SGD(0.05, momentum=0.9)
    if push is not None:
        opt = tfgc.DistributedOptimizer(opt, compression=push, pull_compression=pull)
        opt.build(model.trainable_variables)
    model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    batches = len(x_train) // 32
    model.fit(x_train, y_train, batch_size=32, epochs=int(np.ceil(steps / batches)),
              steps_per_epoch=batches, verbose=0, shuffle=True)
    return model.evaluate(x_test, y_test, verbose=0)[1]


def test_threelc_with_error_feedback_is_within_one_point_of_fp32():
    baseline = _train_and_test(None, None)
    pushes = _train_and_test(C.ThreeLC(1.0), None)
    pushes_and_pulls = _train_and_test(C.ThreeLC(1.0), C.ThreeLC(1.0))
    print(f"test accuracy: fp32 {baseline:.4f}, 3LC pushes {pushes:.4f}, "
          f"3LC pushes+pulls {pushes_and_pulls:.4f}")
    assert baseline > 0.95
    assert pushes >= baseline - 0.01
    assert pushes_and_pulls >= baseline - 0.01
