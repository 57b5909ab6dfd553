"""TensorFlow's "Mixed precision" guide (`mixed_float16`, `Model.fit` and a custom
training loop with `LossScaleOptimizer`), with tfgc's compressed gradients.

The lines that differ from the guide are marked `# tfgc`: `import tfgc`, the guide's
RMSprop wrapped in a `DistributedOptimizer` for `compile` (under `mixed_float16`,
`compile` puts it inside a `LossScaleOptimizer`), the custom loop's
`LossScaleOptimizer` wrapped in one (which returns
`LossScaleOptimizer(DistributedOptimizer(RMSprop))` with the same loss-scale settings,
so `get_scaled_loss` and `get_unscaled_gradients` work as in the guide), the
`TrafficLogger` callback, and a print of the custom loop's bytes. MNIST becomes
scikit-learn's digits (8x8 = 64 inputs instead of 784, on disk: no download), with a
batch of 128 instead of 8192 so that an epoch has more than one step, and `tf.keras` is
tf_keras. With no strategy the gradients are encoded, fused, unpacked and decoded in
this process, and counted as they would be sent.

    python examples/mixed_precision.py [--epochs 5] [--batch-size 128]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import tf_keras as keras  # the guide's tf.keras
from sklearn.datasets import load_digits
from tf_keras import layers
from tf_keras import mixed_precision

import tfgc  # tfgc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args(argv)

    policy = mixed_precision.Policy('mixed_float16')
    mixed_precision.set_global_policy(policy)
    print('Compute dtype: %s' % policy.compute_dtype)
    print('Variable dtype: %s' % policy.variable_dtype)

    inputs = keras.Input(shape=(64,), name='digits')
    if tf.config.list_physical_devices('GPU'):
        print('The model will run with 4096 units on a GPU')
        num_units = 4096
    else:
        # Use fewer units on CPUs so the model finishes in a reasonable amount of time
        print('The model will run with 64 units on a CPU')
        num_units = 64
    dense1 = layers.Dense(num_units, activation='relu', name='dense_1')
    x = dense1(inputs)
    dense2 = layers.Dense(num_units, activation='relu', name='dense_2')
    x = dense2(x)
    print(dense1.dtype_policy)
    print('x.dtype: %s' % x.dtype.name)
    # 'kernel' is dense1's variable
    print('dense1.kernel.dtype: %s' % dense1.kernel.dtype.name)

    # CORRECT: softmax and model output are float32
    x = layers.Dense(10, name='dense_logits')(x)
    outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)
    print('Outputs dtype: %s' % outputs.dtype.name)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(loss='sparse_categorical_crossentropy',
                  optimizer=tfgc.DistributedOptimizer(  # tfgc
                      keras.optimizers.RMSprop(), compression=tfgc.codecs.ThreeLC(1.0)),  # tfgc
                  metrics=['accuracy'])
    digits = load_digits()  # the guide's MNIST, smaller
    x_all = digits.data.astype('float32') / 16
    y_all = digits.target.astype('int64')
    (x_train, y_train), (x_test, y_test) = (x_all[:1437], y_all[:1437]), (x_all[1437:], y_all[1437:])

    initial_weights = model.get_weights()

    history = model.fit(x_train, y_train,
                        batch_size=args.batch_size,
                        epochs=args.epochs,
                        validation_split=0.2,
                        callbacks=[tfgc.callbacks.TrafficLogger()])  # tfgc
    test_scores = model.evaluate(x_test, y_test, verbose=2)
    print('Test loss:', test_scores[0])
    print('Test accuracy:', test_scores[1])

    optimizer = keras.optimizers.RMSprop()
    optimizer = mixed_precision.LossScaleOptimizer(optimizer)
    optimizer = tfgc.DistributedOptimizer(optimizer, compression=tfgc.codecs.ThreeLC(1.0))  # tfgc

    loss_object = keras.losses.SparseCategoricalCrossentropy()
    train_dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                     .shuffle(10000).batch(args.batch_size))
    test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x)
            loss = loss_object(y, predictions)
            scaled_loss = optimizer.get_scaled_loss(loss)
        scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
        gradients = optimizer.get_unscaled_gradients(scaled_gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def test_step(x):
        return model(x, training=False)

    model.set_weights(initial_weights)

    for epoch in range(args.epochs):
        epoch_loss_avg = keras.metrics.Mean()
        test_accuracy = keras.metrics.SparseCategoricalAccuracy(
            name='test_accuracy')
        for x, y in train_dataset:
            loss = train_step(x, y)
            epoch_loss_avg(loss)
        for x, y in test_dataset:
            predictions = test_step(x)
            test_accuracy.update_state(y, predictions)
        print('Epoch {}: loss={}, test accuracy={}'.format(
            epoch, epoch_loss_avg.result(), test_accuracy.result()))

    print('{}({}): pushed {} B for {} B of fp32 gradients'.format(  # tfgc
        type(optimizer).__name__, type(optimizer.inner_optimizer).__name__,
        *(int(optimizer.inner_optimizer.traffic[k]) for k in ('push_bytes', 'push_dense_bytes'))))
    return history


if __name__ == "__main__":
    main()
