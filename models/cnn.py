"""MQGrad's 5-layer CNN for CIFAR-10 (Cui et al., "MQGrad", section 4.1).

Two 5x5 convolutions with 64 filters, each followed by 3x3/2 max-pooling and local
response normalization; fully connected layers 3136 -> 2304 and 2304 -> 3840; a softmax
layer 3840 -> 10. Cross entropy plus an L2 penalty on the two hidden fully connected
layers. Batch 32, learning rate 0.2. The paper quantizes only those two layers
(~99.2% of the parameters); `MQGRAD_MIN_ELEMENTS` passed as
`tfgc.DistributedOptimizer(min_elements=...)` selects exactly them.

The flattened size 3136 = 7 x 7 x 64 follows from 32x32 inputs, "same" convolutions and
3x3 stride-2 "valid" pooling (32 -> 15 -> 7), the TensorFlow CIFAR-10 tutorial's
layers; its LRN constants are used (the paper gives none).
"""
import tensorflow as tf
import tf_keras
from tf_keras import layers

# FC3 (7.2M) and FC4 (8.8M) are above it; the convolutions (102k) and softmax (38k) are not.
MQGRAD_MIN_ELEMENTS = 1_000_000
BATCH_SIZE = 32
LEARNING_RATE = 0.2


def _lrn(x):
    return tf.nn.local_response_normalization(x, depth_radius=4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)


def mqgrad_cnn(num_classes=10, input_shape=(32, 32, 3), l2=0.004):
    """Builds MQGrad's 5-layer CNN as a tf_keras Sequential model.

    Args:
      num_classes: size of the softmax layer (10 for CIFAR-10).
      input_shape: 32x32 images give the paper's flattened size of 3136.
      l2: L2 coefficient on the kernels of the two hidden fully connected layers
        (the paper does not give its value; 0.004 is the TF CIFAR-10 tutorial's).

    Returns:
      A `tf_keras.Sequential` mapping images to class probabilities.
    """
    regularizer = tf_keras.regularizers.L2(l2) if l2 else None
    return tf_keras.Sequential(
        [
            tf_keras.Input(shape=input_shape, name="images"),
            layers.Conv2D(64, 5, padding="same", activation="relu", name="conv1"),
            layers.MaxPooling2D(3, strides=2, padding="valid", name="pool1"),
            layers.Lambda(_lrn, name="norm1"),
            layers.Conv2D(64, 5, padding="same", activation="relu", name="conv2"),
            layers.MaxPooling2D(3, strides=2, padding="valid", name="pool2"),
            layers.Lambda(_lrn, name="norm2"),
            layers.Flatten(name="flatten"),
            layers.Dense(2304, activation="relu", kernel_regularizer=regularizer, name="fc3"),
            layers.Dense(3840, activation="relu", kernel_regularizer=regularizer, name="fc4"),
            layers.Dense(num_classes, activation="softmax", name="softmax"),
        ],
        name="mqgrad_cnn",
    )
