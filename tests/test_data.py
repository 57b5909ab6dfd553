"""Data loaders on small files in the real formats, through the real loaders.

CIFAR goes through tensorflow-datasets' own cifar10/cifar100 builders, with only the
download replaced by a directory of files in CIFAR's binary format.
"""
import gzip
import os
import struct

import numpy as np
import pytest

from models import data


def write_cifar_tree(root, cifar100=False, train_per_file=6, test=5, seed=0):
    """Writes cifar-10-batches-bin/ (or cifar-100-binary/) with real-format records."""
    rng = np.random.default_rng(seed)
    prefix = "cifar-100-binary" if cifar100 else "cifar-10-batches-bin"
    folder = os.path.join(root, prefix)
    os.makedirs(folder)
    files = {"train.bin": 3 * train_per_file, "test.bin": test} if cifar100 else dict(
        [(f"data_batch_{i}.bin", train_per_file) for i in range(1, 6)] + [("test_batch.bin", test)])
    written = {}
    for name, count in files.items():
        images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, 100 if cifar100 else 10, size=count)
        coarse = rng.integers(0, 20, size=count) if cifar100 else None
        data.write_cifar_binary(os.path.join(folder, name), images, labels, coarse)
        written[name] = (images, labels)
    if cifar100:
        with open(os.path.join(folder, "coarse_label_names.txt"), "w") as f:
            f.write("\n".join(f"coarse{i}" for i in range(20)) + "\n")
        with open(os.path.join(folder, "fine_label_names.txt"), "w") as f:
            f.write("\n".join(f"fine{i}" for i in range(100)) + "\n")
    else:
        with open(os.path.join(folder, "batches.meta.txt"), "w") as f:
            f.write("\n".join(["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                               "horse", "ship", "truck"]) + "\n\n")
    return written


@pytest.fixture
def fake_download(monkeypatch, tmp_path):
    """Makes tfds's DownloadManager return a local directory instead of downloading."""
    import tensorflow_datasets as tfds

    extracted = tmp_path / "extracted"
    extracted.mkdir()
    calls = []

    def download_and_extract(self, url_or_urls):
        calls.append(url_or_urls)
        return str(extracted)

    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", download_and_extract)
    return extracted, calls


def _sorted_pairs(images, labels):
    order = np.lexsort((labels, images.reshape(len(images), -1).sum(axis=1)))
    return images[order], labels[order]


@pytest.mark.parametrize("cifar100", [False, True], ids=["cifar10", "cifar100"])
def test_cifar_through_the_real_tfds_builder(fake_download, tmp_path, cifar100):
    extracted, calls = fake_download
    written = write_cifar_tree(str(extracted), cifar100=cifar100)
    name = "cifar100" if cifar100 else "cifar10"
    loaded = data.load_images(name, data_dir=str(tmp_path / "tfds"), download=True)
    assert calls and "cs.toronto.edu" in str(calls[0])
    assert loaded.name == name and loaded.substitute_for is None
    assert loaded.num_classes == (100 if cifar100 else 10)
    train_files = ["train.bin"] if cifar100 else [f"data_batch_{i}.bin" for i in range(1, 6)]
    want_x = np.concatenate([written[f][0] for f in train_files])
    want_y = np.concatenate([written[f][1] for f in train_files])
    assert loaded.x_train.dtype == np.uint8 and loaded.y_train.dtype == np.int64
    assert loaded.x_train.shape == want_x.shape
    # tfds shuffles the examples: compare as sets of (image, label) pairs.
    got = {(x.tobytes(), int(y)) for x, y in zip(loaded.x_train, loaded.y_train)}
    assert got == {(x.tobytes(), int(y)) for x, y in zip(want_x, want_y)}
    test_name = "test.bin" if cifar100 else "test_batch.bin"
    assert len(loaded.x_test) == len(written[test_name][0])
    # Prepared once: a second load reads the prepared files, no download.
    calls.clear()
    again = data.load_images(name, data_dir=str(tmp_path / "tfds"), limit=3)
    assert not calls and len(again.x_train) == 3 and len(again.x_test) == 3


def test_write_cifar_binary_layout(tmp_path):
    image = np.zeros((1, 32, 32, 3), np.uint8)
    image[0, 0, 1] = (10, 20, 30)  # row 0, column 1: R, G, B
    path = tmp_path / "one.bin"
    data.write_cifar_binary(str(path), image, [7])
    raw = path.read_bytes()
    assert len(raw) == 1 + 3072 and raw[0] == 7
    assert (raw[1 + 1], raw[1 + 1024 + 1], raw[1 + 2048 + 1]) == (10, 20, 30)


def test_missing_cifar_says_how_to_provide_it(tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    def no_network(*args, **kwargs):
        raise AssertionError("must not download")

    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", no_network)
    with pytest.raises(data.DataUnavailableError) as error:
        data.load_images("cifar10", data_dir=str(tmp_path))
    message = str(error.value)
    assert "cifar-10-binary.tar.gz" in message and "manual" in message
    assert "--allow-substitute" in message and str(tmp_path) in message


def write_idx(path, array):
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


@pytest.fixture
def fashion_dir(tmp_path, monkeypatch):
    """Small Fashion-MNIST files in the real IDX format, found by the real loader."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "fashion"
    folder.mkdir()
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (12, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, 12),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (4, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, 4),
    }
    for name, array in arrays.items():
        write_idx(str(folder / name), array)
    monkeypatch.setattr(data, "fashion_mnist_dir", lambda root=None: str(folder))
    return arrays


def test_fashion_mnist_padded_to_32x32x3(fashion_dir):
    loaded = data.load_images("fashion_mnist")
    assert loaded.x_train.shape == (12, 32, 32, 3) and loaded.x_test.shape == (4, 32, 32, 3)
    source = fashion_dir["train-images-idx3-ubyte.gz"].astype(np.uint8)
    np.testing.assert_array_equal(loaded.x_train[:, 2:30, 2:30, 1], source)
    assert loaded.x_train[:, :2].max() == 0 and loaded.x_train[:, 30:].max() == 0
    np.testing.assert_array_equal(loaded.y_test, fashion_dir["t10k-labels-idx1-ubyte.gz"])


def test_substitute_is_recorded_and_printed(fashion_dir, tmp_path, capsys):
    loaded = data.load_images("cifar10", data_dir=str(tmp_path / "none"), allow_substitute=True)
    assert loaded.name == "fashion_mnist" and loaded.substitute_for == "cifar10"
    assert "SUBSTITUTE" in loaded.describe()
    assert "SUBSTITUTE" in capsys.readouterr().err


def test_read_idx_rejects_garbage(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="IDX"):
        data.read_idx(str(path))


def test_digits_upsampled():
    loaded = data.load_images("digits", limit=50)
    assert loaded.x_train.shape == (50, 32, 32, 3) and loaded.x_train.dtype == np.uint8
    assert loaded.x_train.max() == 255
    # 4x4 blocks of one value (nearest-neighbour upsampling of 8x8).
    block = loaded.x_train[0, :4, 4:8, 0]
    assert (block == block[0, 0]).all()
    full = data.load_images("digits")
    assert len(full.x_train) + len(full.x_test) == 1797


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown image dataset"):
        data.load_images("imagenet")


def test_load_libsvm(tmp_path):
    path = tmp_path / "tiny.libsvm"
    path.write_text("1 1:0.5 4:2\n0 2:1\n1 3:1.5 4:1\n")
    loaded = data.load_libsvm(str(path), num_features=6)
    assert loaded.x.shape == (3, 6)
    assert loaded.y.tolist() == [1.0, -1.0, 1.0]  # {0, 1} -> {-1, +1}
    np.testing.assert_allclose(loaded.x.toarray()[0], [0.5, 0, 0, 2, 0, 0])  # 1-based


def test_reuters_hashed_from_arff(tmp_path):
    path = tmp_path / "tiny.arff"
    path.write_text("@relation r\n@attribute Text string\n@attribute class {0,1}\n@data\n"
                    "'corn corn wheat',1\n'oil prices',0\n")
    loaded = data.reuters_hashed(dim=1024, path=str(path))
    assert loaded.x.shape == (2, 1024) and loaded.y.tolist() == [1.0, -1.0]
    assert loaded.x[0].nnz == 2 and loaded.x[1].nnz == 2
    np.testing.assert_allclose(np.linalg.norm(loaded.x.toarray(), axis=1), 1.0, rtol=1e-5)


def test_synthetic_sparse_is_named_so():
    loaded = data.synthetic_sparse(num_examples=100, num_features=1000, nnz_per_example=5)
    assert loaded.name == "synthetic_sparse"
    assert loaded.x.shape == (100, 1000) and set(np.unique(loaded.y)) <= {-1.0, 1.0}
    train, test = loaded.split(0.7)
    assert train.x.shape[0] == 70 and test.x.shape[0] == 30


def test_debian_package_dir_is_cached(tmp_path, monkeypatch):
    target = tmp_path / "debian" / "somepkg"
    target.mkdir(parents=True)
    (target / ".unpacked").write_text("")

    def fail(*args, **kwargs):
        raise AssertionError("must not fetch again")

    monkeypatch.setattr(data.subprocess, "run", fail)
    assert data.debian_package_dir("somepkg", root=str(tmp_path)) == str(target)


def test_debian_packages_for_each_dataset(monkeypatch):
    monkeypatch.setattr(data, "_FASHION_SYSTEM_DIR", "/nonexistent")
    assert data.debian_packages_for("reuters_corn") == ["weka"]
    assert data.debian_packages_for("fashion_mnist") == ["dataset-fashion-mnist"]
    assert data.debian_packages_for("cifar10", allow_substitute=True) == ["dataset-fashion-mnist"]
    assert data.debian_packages_for("cifar10") == []
    assert data.debian_packages_for("digits") == []
    assert data.debian_packages_for("libsvm:/some/file") == []


def test_prefetch_fetches_and_only_reports_a_failure(monkeypatch, capsys):
    fetched = []

    def fetch(package, root=None):
        fetched.append(package)
        raise data.DataUnavailableError(f"no registry for {package}")

    monkeypatch.setattr(data, "debian_package_dir", fetch)
    data.prefetch("reuters_grain")  # loading reports the failure later, as it would anyway
    assert fetched == ["weka"]
    assert "no registry for weka" in capsys.readouterr().err


def test_fetch_command_unpacks_into_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "debian_package_dir", lambda package: f"{tmp_path}/{package}")
    data.main(["fetch", "weka", "dataset-fashion-mnist"])
    assert capsys.readouterr().out.split() == [
        "weka:", f"{tmp_path}/weka", "dataset-fashion-mnist:", f"{tmp_path}/dataset-fashion-mnist"]


def test_substitute_falls_back_to_digits_without_fashion_mnist(tmp_path, monkeypatch):
    def unavailable(root=None):
        raise data.DataUnavailableError("no apt here")

    monkeypatch.setattr(data, "fashion_mnist_dir", unavailable)
    loaded = data.load_images("cifar100", data_dir=str(tmp_path), allow_substitute=True, limit=10)
    assert loaded.name == "digits" and loaded.substitute_for == "cifar100"


def test_image_records_read_back_as_the_arrays_in_order(tmp_path):
    from models import workloads

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 4, 3, 2), dtype=np.uint8)
    labels = np.array([0, 255, 3, 9, 1, 2, 7])
    path = str(tmp_path / "train.records")
    workloads.write_image_records(path, images, labels)
    assert os.path.getsize(path) == 7 * (1 + 4 * 3 * 2)
    read = list(workloads.image_records_dataset(path, images.shape[1:]).as_numpy_iterator())
    assert len(read) == 7
    for (image, label), want_image, want_label in zip(read, images, labels):
        np.testing.assert_array_equal(image, want_image)
        assert label == want_label and label.dtype == np.int64
    # The training pipeline gives the same shuffled batches from the file.
    def batches(records_path):
        pipeline = workloads.make_image_dataset(images, labels, 2, 0.0, 1.0, False, 3,
                                                records_path=records_path)
        return list(pipeline.take(5).as_numpy_iterator())

    for (image, label), (want_image, want_label) in zip(batches(path), batches(None)):
        np.testing.assert_array_equal(image, want_image)
        np.testing.assert_array_equal(label, want_label)


def test_image_records_refuse_labels_beyond_a_byte(tmp_path):
    from models import workloads

    with pytest.raises(ValueError, match="0..255"):
        workloads.write_image_records(str(tmp_path / "r"), np.zeros((1, 2, 2, 1), np.uint8), [256])
