"""FastSGD's workloads: generalized linear models on sparse input, and its MLP.

Linear regression, logistic regression and SVM with the losses of FastSGD's Table III,
trained with Adam (beta1 0.9, beta2 0.999, eps 1e-8) as the paper does (`tfgc.BoundedAdam`:
the same steps, safe when parameter-server workers interleave their updates):

    linear:    (y - w.x)^2             + lambda/2 ||w||^2
    logistic:  log(1 + exp(-y w.x))    + lambda/2 ||w||^2
    svm:       max(0, 1 - y w.x)       + lambda/2 ||w||^2      (labels y in {-1, +1})

The losses are averaged over the batch (the paper sums; only the learning rate's scale
differs). The weight gradient is a `tf.IndexedSlices` over the features present in the
batch, what FastSGD's key encoder compresses. To keep it sparse the L2 penalty is
applied to those features' weights only ("lazy" regularization, the usual choice for
sparse models; with lambda = 0.01 on all of w every gradient would be dense).

`keras_model`, `keras_loss` and `sparse_dataset` are the same models for tf_keras
`fit` (what `python -m models.train --model logistic` trains, on parameter servers
too): a sparse `Input`, one `SparseLinear` layer.

`fastsgd_mlp` is the MLP of section 4.4 (7x7 inputs, two hidden layers of 100, 5
outputs).
"""
import numpy as np
import tensorflow as tf
import tf_keras

from tfgc.ps import lookups
from tfgc.optimizer.bounded_adam import BoundedAdam

LOSSES = ("linear", "logistic", "svm")


class SparseLinearModel(tf.Module):
    """w.x + b over sparse features, with one of FastSGD's Table III losses.

    Args:
      num_features: dimension D of the input.
      loss: "linear", "logistic" or "svm".
      l2: lambda of the L2 penalty (the paper's 0.01), on the batch's features.
    """

    def __init__(self, num_features, loss="logistic", l2=0.01, name=None):
        super().__init__(name=name or f"sparse_{loss}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        self.loss_name = loss
        self.l2 = float(l2)
        self.w = tf.Variable(tf.zeros([num_features]), name="w")
        self.b = tf.Variable(0.0, name="b")

    def margins(self, x):
        """w.x + b for a `tf.SparseTensor` x of shape [N, D]."""
        ids = tf.sparse.SparseTensor(x.indices, x.indices[:, 1], x.dense_shape)
        # One output per row that has a feature (`to_sparse_tensor` ensures all do).
        dot = tf.nn.embedding_lookup_sparse(self.w, ids, x, combiner="sum")
        return dot + self.b

    def loss(self, x, y):
        """Mean Table III loss plus the L2 penalty on the features present in `x`."""
        margin = self.margins(x)
        y = tf.cast(y, margin.dtype)
        if self.loss_name == "linear":
            data = tf.square(y - margin)
        elif self.loss_name == "logistic":
            data = tf.math.softplus(-y * margin)
        else:
            data = tf.nn.relu(1.0 - y * margin)
        present = tf.unique(x.indices[:, 1])[0]
        penalty = 0.5 * self.l2 * tf.reduce_sum(tf.square(tf.gather(self.w, present)))
        return tf.reduce_mean(data) + penalty

    def accuracy(self, x, y):
        """Fraction of sign(w.x + b) equal to y (classification losses)."""
        predicted = tf.where(self.margins(x) >= 0, 1.0, -1.0)
        return tf.reduce_mean(tf.cast(tf.equal(predicted, tf.cast(y, tf.float32)), tf.float32))


def to_sparse_tensor(csr, allow_empty_rows=False):
    """A scipy CSR matrix -> tf.SparseTensor, indices in canonical (row-major) order.

    Args:
      csr: the matrix.
      allow_empty_rows: rows without features are fine (`SparseLinear` gives them the
        bias); `SparseLinearModel` needs a feature in every row.
    """
    coo = csr.tocoo()
    order = np.lexsort((coo.col, coo.row))
    indices = np.stack([coo.row[order], coo.col[order]], axis=1).astype(np.int64)
    if not allow_empty_rows and len(np.unique(coo.row)) != csr.shape[0]:
        raise ValueError("every row needs at least one feature (drop empty rows first)")
    return tf.SparseTensor(indices, coo.data[order].astype(np.float32), csr.shape)


class SparseLinear(tf_keras.layers.Layer):
    """w.x + b for a sparse batch x [N, D], one margin per row; `SparseLinearModel`'s
    model as a Keras layer.

    The weights of the batch's distinct features are read with one `tf.gather`, so
    w's gradient is a `tf.IndexedSlices` with one row per distinct feature. Under
    ParameterServerStrategy the gather runs on the parameter server and only the
    rows come back. The distinct feature ids cross to it packed by FastSGD's key
    encoder (`tfgc.ps.lookups.packed_gather`: sorted, delta, ~9 bits per id on Reuters
    batches instead of 32), unpacked there by the op library, which every tfgc server loads;
    `packed_reads=False` sends them as int32 (int64 from D >= 2^31) ids, as a plain
    `tf.gather` does. With packed reads, a push whose codec can (FastSGD) sends w's
    gradient rows without their ids: the server decodes them against the ids it
    unpacked for the read. The L2 penalty lambda/2 ||w_present||^2 on those rows is added
    with `add_loss`.

    Args:
      num_features: D.
      l2: lambda (0: no penalty).
      packed_reads: pack the ids of reads from a parameter server (elsewhere, e.g. on
        one machine, w is read directly whatever this says).
    """

    def __init__(self, num_features, l2=0.0, packed_reads=True, **kwargs):
        super().__init__(**kwargs)
        self.num_features = int(num_features)
        self.l2 = float(l2)
        self.packed_reads = bool(packed_reads)

    def build(self, input_shape):
        self.w = self.add_weight("w", [self.num_features], initializer="zeros")
        self.b = self.add_weight("b", [], initializer="zeros")
        super().build(input_shape)

    def call(self, x):
        id_type = tf.int32 if self.num_features < 2**31 else tf.int64
        # Each distinct feature is read (and its gradient sent) once per batch.
        present, position = tf.unique(tf.cast(x.indices[:, 1], id_type), out_idx=id_type)
        weights = self._read(present)
        terms = x.values * tf.gather(weights, position)
        rows = tf.cast(x.dense_shape[0], tf.int32)
        # Rows without features (an empty document) get the bias alone.
        margin = tf.math.unsorted_segment_sum(terms, x.indices[:, 0], rows) + self.b
        if self.l2:
            self.add_loss(0.5 * self.l2 * tf.reduce_sum(tf.square(weights)))
        return margin

    def _read(self, ids):
        """w[ids] for distinct ids; from a parameter server, with the ids packed."""
        if not (self.packed_reads and lookups.on_parameter_server(self.w)):
            return tf.gather(self.w, ids)
        return lookups.packed_gather(self.w, ids, rows="float32")

    def get_config(self):
        return {**super().get_config(), "num_features": self.num_features, "l2": self.l2,
                "packed_reads": self.packed_reads}


def keras_model(num_features, l2=0.0, name="sparse_linear", packed_reads=True):
    """A tf_keras model: sparse input [N, num_features] -> margins [N] (`SparseLinear`)."""
    inputs = tf_keras.Input(shape=(num_features,), sparse=True, name="features")
    linear = SparseLinear(num_features, l2, packed_reads=packed_reads, name="linear")
    return tf_keras.Model(inputs, linear(inputs), name=name)


def keras_loss(loss):
    """Table III's loss of `loss` ("linear", "logistic", "svm") as a Keras loss of
    (labels in {-1, +1} [N], margins [N]), averaged over the batch."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")

    def table_iii_loss(y_true, margin):
        margin = tf.reshape(margin, [-1])
        y = tf.reshape(tf.cast(y_true, margin.dtype), [-1])
        if loss == "linear":
            return tf.reduce_mean(tf.square(y - margin))
        if loss == "logistic":
            return tf.reduce_mean(tf.math.softplus(-y * margin))
        return tf.reduce_mean(tf.nn.relu(1.0 - y * margin))

    table_iii_loss.__name__ = f"{loss}_loss"
    return table_iii_loss


def accuracy(y_true, margin):
    """Keras metric: the share of sign(margin) equal to the label in {-1, +1}."""
    margin = tf.reshape(margin, [-1])
    predicted = tf.where(margin >= 0, 1.0, -1.0)
    return tf.reduce_mean(tf.cast(tf.equal(predicted, tf.reshape(tf.cast(y_true, tf.float32), [-1])),
                                  tf.float32))


def sparse_dataset(data, batch_size, seed=0, shuffle=True, repeat=True):
    """A tf.data pipeline of (sparse batch [batch_size, D], labels) from `SparseData`."""
    # tf.data slices canonically ordered indices.
    x = to_sparse_tensor(data.x, allow_empty_rows=True)
    ds = tf.data.Dataset.from_tensor_slices((x, data.y.astype(np.float32)))
    if shuffle:
        ds = ds.shuffle(data.x.shape[0], seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=repeat).prefetch(tf.data.AUTOTUNE)


def adam(learning_rate=0.01):
    """The optimizer FastSGD trains with (its beta and epsilon values), bounded
    against interleaved updates (`tfgc.BoundedAdam`)."""
    return BoundedAdam(learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-8)


def fastsgd_mlp(input_shape=(7, 7), hidden=100, num_classes=5):
    """FastSGD section 4.4's MLP: 7x7 input, two fully connected layers of 100, 5 outputs.

    (The paper's learning rate is 0.02.) Returns a tf_keras Sequential with a softmax
    output.
    """
    return tf_keras.Sequential([
        tf_keras.Input(shape=input_shape),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(hidden, activation="relu", name="fc1"),
        tf_keras.layers.Dense(hidden, activation="relu", name="fc2"),
        tf_keras.layers.Dense(num_classes, activation="softmax", name="out"),
    ], name="fastsgd_mlp")
