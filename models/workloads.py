"""What `python -m models.train` trains: a dataset, a model, its loss and metric, the
optimizer its paper trains it with, and the input pipelines.

* `ImageWorkload`: the ResNets (3LC) and MQGrad's CNN on CIFAR-10/100, Fashion-MNIST
  or digits; SGD with momentum and cosine decay.
* `SparseWorkload`: FastSGD's generalized linear models (logistic regression, linear
  SVM, linear regression) on hashed Reuters text or a libsvm file; Adam. The weight
  gradient is a `tf.IndexedSlices` over the batch's features, which FastSGD's key
  encoder compresses and the fp32 baseline sends as TensorFlow does (values and rows).

`for_model(name)` picks the workload of a `--model` name, `default_lr(name)` its
default learning rate.
"""
import numpy as np

from models import data as data_lib
from models import sparse_models

IMAGE_MODELS = "resnet20/32/44/56/110 or mqgrad_cnn"


class ImageWorkload:
    """Image classification with a reference CNN (see the module doc).

    Args:
      args: the parsed `models.train` options.
    """

    default_dataset = "cifar10"
    #: `--lr`'s default, per replica (SGD, momentum 0.9): 3LC's 0.1 for the ResNets.
    default_lr = 0.1
    #: Models that do not train at `default_lr`, and theirs (see `default_lr()`).
    default_lrs = {
        # No batch normalization: at 0.1 it stayed at chance on one process and its
        # loss grew (or became NaN) under parameter servers. 0.01 with momentum 0.9
        # steps like plain SGD at 0.1; the paper's 0.2 is plain SGD.
        "mqgrad_cnn": 0.01,
    }
    #: ResNets deeper than this start at a tenth of the learning rate and reach it
    #: linearly over `warmup_steps`. He et al. (section 4.2) found 0.1 "slightly too
    #: large to start converging" ResNet-110 and warmed it up at 0.01 for ~400
    #: iterations. Here, at 0.1 from the first step, the loss of ResNet-32 to -110
    #: jumped to 8-50 within ten steps and their accuracy was near chance after 60;
    #: ResNet-20 (3LC's and the demo's) trains without.
    warmup_above_depth = 20
    warmup_steps = 400
    #: Error feedback applies (the gradients are dense).
    error_feedback = True

    def __init__(self, args):
        self.args = args
        self.data = data_lib.load_images(
            args.dataset, data_dir=args.data_dir, allow_substitute=args.allow_substitute,
            limit=args.train_limit, manual_dir=args.manual_dir, download=args.download,
            test_limit=args.test_limit,
        )
        x_float = self.data.x_train[:5000].astype(np.float32) / 255.0
        self.mean = x_float.mean(axis=(0, 1, 2)).astype(np.float32)
        self.std = (x_float.std(axis=(0, 1, 2)) + 1e-3).astype(np.float32)

    def describe(self):
        return self.data.describe()

    def summary_fields(self):
        """What the run's summary records of the data."""
        return {"dataset": self.data.name, "substitute_for": self.data.substitute_for,
                "train_examples": int(len(self.data.x_train)),
                "test_examples": int(len(self.data.x_test))}

    def build_model(self, weight_decay):
        """An uncompiled tf_keras model (`weight_decay`: its L2 term on the kernels)."""
        from models import cnn, resnet

        name, data = self.args.model, self.data
        if name.startswith("resnet"):
            return resnet.by_name(name, data.num_classes, data.input_shape, weight_decay)
        if name == "mqgrad_cnn":
            return cnn.mqgrad_cnn(data.num_classes, data.input_shape)
        raise ValueError(f"unknown model {name!r}; use {IMAGE_MODELS}")

    def loss(self):
        import tf_keras

        return tf_keras.losses.SparseCategoricalCrossentropy()

    def metrics(self):
        return ["accuracy"]

    def inner_optimizer(self, lr, steps):
        """SGD with momentum (or Adam: `--optimizer adam`), its learning rate decayed
        from `lr` to `--lr-final` over `steps` along a cosine; ResNets deeper than
        `warmup_above_depth` first warm up linearly from `lr` / 10 over `warmup_steps`,
        and decay over the rest."""
        import tf_keras

        args = self.args
        alpha = args.lr_final / args.lr
        warmup = self.warmup_steps if _resnet_depth(args.model) > self.warmup_above_depth else 0
        if warmup:
            schedule = tf_keras.optimizers.schedules.CosineDecay(
                initial_learning_rate=lr / 10, warmup_target=lr, warmup_steps=warmup,
                decay_steps=max(1, steps - warmup), alpha=alpha)
        else:
            schedule = tf_keras.optimizers.schedules.CosineDecay(
                initial_learning_rate=lr, decay_steps=max(1, steps), alpha=alpha)
        if args.optimizer == "adam":
            return tf_keras.optimizers.Adam(schedule)
        return tf_keras.optimizers.SGD(schedule, momentum=args.momentum)

    def train_dataset(self, batch_size, records_path=None):
        """The training pipeline, shuffled and repeated.

        Args:
          batch_size: images per batch.
          records_path: where to write the training set as fixed-length records for the
            pipeline to read (`write_image_records`), or None to slice the arrays in
            memory. Under ParameterServerStrategy a pipeline made from arrays carries
            them: the coordinator copies the whole training set to every worker before
            the first step (31 MB at 10,000 32x32x3 images: minutes on a slow link),
            where one made from a file reads it on the worker, which must see the path.
        """
        data = self.data
        if records_path is not None:
            write_image_records(records_path, data.x_train, data.y_train)
        return make_image_dataset(data.x_train, data.y_train, batch_size, self.mean, self.std,
                                  self.args.augment, self.args.seed, records_path=records_path)

    def test_dataset(self):
        return make_image_dataset(self.data.x_test, self.data.y_test, 250, self.mean, self.std,
                                  False, self.args.seed, shuffle=False, repeat=False)


def make_image_dataset(x, y, batch_size, mean, std, augment, seed, shuffle=True, repeat=True,
                       records_path=None):
    """A tf.data pipeline: uint8 images -> normalized float32 (+ crop and flip).

    With `records_path` (the file `write_image_records` wrote of `x` and `y`) the
    pipeline reads that file instead of holding the arrays; the elements and their
    order are the same.
    """
    import tensorflow as tf

    height, width = x.shape[1], x.shape[2]
    if records_path is None:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
    else:
        ds = image_records_dataset(records_path, x.shape[1:])
    if shuffle:
        ds = ds.shuffle(min(len(x), 20000), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    def prepare(image, label):
        image = (tf.cast(image, tf.float32) / 255.0 - mean) / std
        if augment:
            image = tf.image.resize_with_crop_or_pad(image, height + 8, width + 8)
            image = tf.image.random_crop(image, [height, width, x.shape[3]])
            image = tf.image.random_flip_left_right(image)
        return image, label

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=repeat).prefetch(tf.data.AUTOTUNE)


class SparseWorkload:
    """A sparse generalized linear model of FastSGD's Table III (see the module doc).

    `--model` is the loss ("logistic", "svm" or "linear"), `--weight-decay` its L2
    lambda on the batch's features, `--hash-dim` the feature count of hashed text.
    There is no error feedback: a residual would make every gradient dense.

    Args:
      args: the parsed `models.train` options.
    """

    default_dataset = "reuters_corn"
    default_lr = 0.01  # FastSGD's Adam
    default_lrs = {}
    error_feedback = False

    def __init__(self, args):
        self.args = args
        self.train, self.test = data_lib.load_sparse(args.dataset, dim=args.hash_dim)

    def describe(self):
        x = self.train.x
        return (f"dataset {self.train.name.split('/')[0]}: {x.shape[0]} train / "
                f"{self.test.x.shape[0]} test examples, {x.shape[1]:,d} sparse features, "
                f"{x.nnz / max(1, x.shape[0]):.1f} non-zero per example, "
                f"{float(np.mean(self.train.y > 0)):.1%} positive")

    def summary_fields(self):
        return {"dataset": self.train.name, "substitute_for": None,
                "train_examples": int(self.train.x.shape[0]),
                "test_examples": int(self.test.x.shape[0]),
                "num_features": int(self.train.num_features),
                "packed_reads": bool(self.args.packed_reads)}

    def build_model(self, weight_decay):
        return sparse_models.keras_model(self.train.num_features, weight_decay,
                                         name=f"sparse_{self.args.model}",
                                         packed_reads=self.args.packed_reads)

    def loss(self):
        return sparse_models.keras_loss(self.args.model)

    def metrics(self):
        return [sparse_models.accuracy]

    def inner_optimizer(self, lr, steps):
        """Adam with FastSGD's betas and epsilon, constant learning rate `lr`."""
        del steps
        return sparse_models.adam(lr)

    def train_dataset(self, batch_size):
        return sparse_models.sparse_dataset(self.train, batch_size, self.args.seed)

    def test_dataset(self):
        return sparse_models.sparse_dataset(self.test, 256, shuffle=False, repeat=False)


def write_image_records(path, images, labels):
    """Writes uint8 images [N, H, W, C] and their labels as N records of 1 + H*W*C bytes
    (the label, then the image's bytes in HWC order), for `image_records_dataset`.

    Raises:
      ValueError: a label does not fit in a byte.
    """
    labels = np.asarray(labels)
    if labels.size and not 0 <= labels.min() <= labels.max() <= 255:
        raise ValueError(f"labels must lie in 0..255 to be written as records; they span "
                         f"{labels.min()}..{labels.max()}")
    images = np.asarray(images, np.uint8)
    rows = np.concatenate([labels.astype(np.uint8)[:, None], images.reshape(len(images), -1)],
                          axis=1)
    with open(path, "wb") as f:
        f.write(rows.tobytes())


def image_records_dataset(path, image_shape):
    """(uint8 image, int64 label) pairs read from a file `write_image_records` wrote."""
    import tensorflow as tf

    image_shape = [int(d) for d in image_shape]

    def parse(record):
        values = tf.io.decode_raw(record, tf.uint8)
        return tf.reshape(values[1:], image_shape), tf.cast(values[0], tf.int64)

    record_bytes = 1 + int(np.prod(image_shape))
    return tf.data.FixedLengthRecordDataset(path, record_bytes).map(parse)


def _resnet_depth(name):
    """The depth of a "resnetN" model name, 0 for other models."""
    suffix = name[len("resnet"):]
    return int(suffix) if name.startswith("resnet") and suffix.isdigit() else 0


def default_lr(name):
    """`--lr`'s default for a `--model` name: the initial learning rate per replica
    (`models.train` scales it by the synchronous replicas)."""
    workload = for_model(name)
    return workload.default_lrs.get(name, workload.default_lr)


def for_model(name):
    """The workload class of a `--model` name."""
    if name in sparse_models.LOSSES:
        return SparseWorkload
    if name == "mqgrad_cnn" or _resnet_depth(name):
        return ImageWorkload
    raise ValueError(f"unknown model {name!r}; use {IMAGE_MODELS}, or a sparse linear "
                     f"model: {', '.join(sparse_models.LOSSES)}")
