"""ResNet for CIFAR (He, Zhang, Ren, Sun 2015, "Deep Residual Learning", section 4.2).

6n+2 layers: a 3x3 convolution with 16 filters, three stages of n basic blocks (two 3x3
convolutions each) with 16, 32 and 64 filters on 32x32, 16x16 and 8x8 maps, global
average pooling and a fully connected softmax layer. Shortcuts are identities; where
the map shrinks and the width doubles they subsample with stride 2 and pad the new
channels with zeros (the paper's option A, which adds no parameters). Batch
normalization follows every convolution, before the ReLU.

ResNet-20/32/44/56/110 have 0.27M/0.46M/0.66M/0.85M/1.7M parameters (the paper's
Table 6); these are the 3LC (ResNet-110) and GradiVeQ workloads.
"""
import tf_keras
from tf_keras import layers

DEPTHS = (20, 32, 44, 56, 110)


def resnet(depth=20, num_classes=10, input_shape=(32, 32, 3), weight_decay=1e-4):
    """Builds a CIFAR ResNet of `depth` = 6n + 2 layers as a tf_keras functional Model.

    Args:
      depth: 6n + 2 (20, 32, 44, 56, 110, ...).
      num_classes: size of the softmax layer.
      input_shape: (height, width, channels) of the input images (floats; scale and
        normalize them in the input pipeline).
      weight_decay: SGD weight decay on convolution and dense kernels (as in the
        paper, 1e-4), added to the loss as (weight_decay / 2) * ||w||^2 so that its
        gradient is weight_decay * w.

    Returns:
      A `tf_keras.Model` mapping images to class probabilities (softmax).

    Raises:
      ValueError: `depth` is not 6n + 2 with n >= 1.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1 (20, 32, 56, 110), got {depth}")
    blocks = (depth - 2) // 6
    regularizer = tf_keras.regularizers.L2(weight_decay / 2.0) if weight_decay else None

    def conv(x, filters, strides, name):
        return layers.Conv2D(
            filters, 3, strides=strides, padding="same", use_bias=False,
            kernel_initializer="he_normal", kernel_regularizer=regularizer, name=name,
        )(x)

    def bn(x, name):
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)(x)

    inputs = tf_keras.Input(shape=input_shape, name="images")
    x = conv(inputs, 16, 1, "conv1")
    x = layers.ReLU(name="relu1")(bn(x, "bn1"))
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(blocks):
            prefix = f"stage{stage}_block{block + 1}"
            strides = 2 if stage > 1 and block == 0 else 1
            shortcut = x
            y = conv(x, filters, strides, prefix + "_conv1")
            y = layers.ReLU(name=prefix + "_relu1")(bn(y, prefix + "_bn1"))
            y = conv(y, filters, 1, prefix + "_conv2")
            y = bn(y, prefix + "_bn2")
            if strides != 1 or shortcut.shape[-1] != filters:
                shortcut = _option_a_shortcut(shortcut, filters, strides, prefix + "_shortcut")
            x = layers.ReLU(name=prefix + "_relu2")(layers.Add(name=prefix + "_add")([y, shortcut]))
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(
        num_classes, activation="softmax", kernel_initializer="he_normal",
        kernel_regularizer=regularizer, name="fc",
    )(x)
    return tf_keras.Model(inputs, outputs, name=f"resnet{depth}")


def _option_a_shortcut(x, filters, strides, name):
    """Identity shortcut that subsamples by `strides` and zero-pads the channels."""
    extra = filters - x.shape[-1]
    before = extra // 2

    def shortcut(t):
        import tensorflow as tf

        t = t[:, ::strides, ::strides, :]
        return tf.pad(t, [[0, 0], [0, 0], [0, 0], [before, extra - before]])

    return layers.Lambda(shortcut, name=name)(x)


def by_name(name, num_classes=10, input_shape=(32, 32, 3), weight_decay=1e-4):
    """"resnet20", "resnet110", ... -> `resnet(depth, ...)`."""
    if not name.startswith("resnet") or not name[len("resnet"):].isdigit():
        raise ValueError(f"expected a name like 'resnet20', got {name!r}")
    return resnet(int(name[len("resnet"):]), num_classes, input_shape, weight_decay)
