"""Reference models: shapes and parameter counts against the papers."""
import numpy as np
import pytest

from models import cnn, resnet


def trainable(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


@pytest.mark.parametrize("depth, published", [(20, 0.27e6), (110, 1.7e6)])
def test_resnet_parameter_counts_match_he_et_al(depth, published):
    model = resnet.resnet(depth)
    # He et al. 2015, section 4.2 / Table 6 (option A shortcuts add no parameters).
    assert abs(trainable(model) - published) / published < 0.02
    weighted = [layer for layer in model.layers if layer.name.startswith(("conv", "stage", "fc"))
                and layer.weights and "bn" not in layer.name]
    assert len(weighted) == depth  # 6n + 1 convolutions + 1 fully connected layer


def test_resnet20_exact_count_and_output():
    model = resnet.resnet(20, num_classes=10)
    assert trainable(model) == 269_722  # 16*27 + stages + 64*10+10, with BN gamma/beta
    out = model(np.zeros((2, 32, 32, 3), np.float32), training=False)
    assert out.shape == (2, 10)
    np.testing.assert_allclose(out.numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert model.get_layer("stage3_block3_conv2").output.shape[1:] == (8, 8, 64)
    assert len(model.losses) == 20  # weight decay on every conv and the fc kernel


def test_resnet_rejects_bad_depth_and_names():
    with pytest.raises(ValueError, match="6n\\+2"):
        resnet.resnet(21)
    with pytest.raises(ValueError):
        resnet.by_name("resnetX")
    assert resnet.by_name("resnet8", num_classes=100).output_shape == (None, 100)


def test_mqgrad_cnn_matches_section_4_1():
    model = cnn.mqgrad_cnn()
    kernels = [tuple(v.shape) for v in model.trainable_variables if len(v.shape) > 1]
    assert kernels == [(5, 5, 3, 64), (5, 5, 64, 64), (3136, 2304), (2304, 3840), (3840, 10)]
    fc = sum(int(np.prod(v.shape)) for v in model.trainable_variables
             if v.name.startswith(("fc3", "fc4")))
    assert fc / trainable(model) > 0.99  # "about 99.2% of the network parameters"
    # The min_elements that quantizes exactly the two hidden fully connected layers.
    selected = [v.name for v in model.trainable_variables
                if int(np.prod(v.shape)) >= cnn.MQGRAD_MIN_ELEMENTS]
    assert [name.split("/")[0] for name in selected] == ["fc3", "fc4"]
    assert len(model.losses) == 2  # L2 on fc3 and fc4 only
    assert model(np.zeros((1, 32, 32, 3), np.float32)).shape == (1, 10)


@pytest.mark.parametrize("loss", ["linear", "logistic", "svm"])
def test_sparse_linear_models_table_iii_losses(loss):
    import scipy.sparse
    import tensorflow as tf

    from models import sparse_models

    x = scipy.sparse.csr_matrix(np.array([[1.0, 0, 2.0, 0], [0, 0.5, 0, 0]], np.float32))
    y = np.array([1.0, -1.0], np.float32)
    model = sparse_models.SparseLinearModel(4, loss=loss, l2=0.01)
    w = np.array([0.3, -0.2, 0.1, 5.0], np.float32)
    model.w.assign(w)
    model.b.assign(0.05)
    xs = sparse_models.to_sparse_tensor(x)
    with tf.GradientTape() as tape:
        value = model.loss(xs, y)
    margin = x @ w + 0.05
    data_loss = {"linear": (y - margin) ** 2, "logistic": np.log1p(np.exp(-y * margin)),
                 "svm": np.maximum(0, 1 - y * margin)}[loss].mean()
    penalty = 0.005 * (w[[0, 1, 2]] ** 2).sum()  # only the features in the batch
    np.testing.assert_allclose(value.numpy(), data_loss + penalty, rtol=1e-5)
    grad = tape.gradient(value, model.w)
    assert isinstance(grad, tf.IndexedSlices)  # sparse: what FastSGD's keys encode
    assert set(grad.indices.numpy().tolist()) <= {0, 1, 2}
    assert 0.0 <= model.accuracy(xs, y).numpy() <= 1.0


@pytest.mark.parametrize("loss", ["linear", "logistic", "svm"])
def test_sparse_keras_model_matches_the_module(loss):
    # The tf_keras model models.train trains: the same margins, loss (its L2 penalty
    # through add_loss) and gradient as SparseLinearModel, the gradient sparse with one
    # row per distinct feature; a row without features gets the bias alone.
    import scipy.sparse
    import tensorflow as tf

    from models import sparse_models

    x = scipy.sparse.csr_matrix(np.array(
        [[1.0, 0, 2.0, 0], [0, 0.5, 2.0, 0], [0, 0, 0, 0]], np.float32))
    y = np.array([1.0, -1.0, 1.0], np.float32)
    w = np.array([0.3, -0.2, 0.1, 5.0], np.float32)
    module = sparse_models.SparseLinearModel(4, loss=loss, l2=0.01)
    model = sparse_models.keras_model(4, l2=0.01)
    module.w.assign(w)
    module.b.assign(0.05)
    model.set_weights([w, np.float32(0.05)])
    coo = x.tocoo()
    margin = model(tf.SparseTensor(np.stack([coo.row, coo.col], 1).astype(np.int64), coo.data,
                                   x.shape))
    np.testing.assert_allclose(margin.numpy(), x @ w + 0.05, rtol=1e-6)
    assert sparse_models.accuracy(y, margin).numpy() == pytest.approx(2 / 3)  # row 1 wrong

    rows = sparse_models.to_sparse_tensor(x[:2])  # the module needs a feature per row
    with tf.GradientTape() as tape:
        value = sparse_models.keras_loss(loss)(y[:2], model(rows)) + tf.add_n(model.losses)
    with tf.GradientTape() as module_tape:
        expected = module.loss(rows, y[:2])
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5)
    grad = tape.gradient(value, model.trainable_variables[0])
    assert isinstance(grad, tf.IndexedSlices)
    assert sorted(grad.indices.numpy().tolist()) == [0, 1, 2]  # each feature once
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                               tf.convert_to_tensor(module_tape.gradient(expected, module.w)).numpy(),
                               rtol=1e-5, atol=1e-7)


def test_fastsgd_mlp_shape():
    from models import sparse_models

    model = sparse_models.fastsgd_mlp()
    assert model.output_shape == (None, 5)
    assert [tuple(v.shape) for v in model.trainable_variables if len(v.shape) == 2] == [
        (49, 100), (100, 100), (100, 5)]
