"""Datasets for the reference models: real images and real sparse data, all offline-capable.

Images (`load_images`) come back as uint8 NHWC arrays with int64 labels:

* ``cifar10`` / ``cifar100``: the real tensorflow-datasets builders. Nothing is
  downloaded unless asked for (``download=True``): CIFAR is used when it is already
  prepared under ``data_dir`` or when its archive (``cifar-10-binary.tar.gz`` /
  ``cifar-100-binary.tar.gz``) sits in ``manual_dir``.
* ``fashion_mnist``: the real Fashion-MNIST (60k/10k) from Debian's
  ``dataset-fashion-mnist`` package, padded to 32x32 and repeated to 3 channels. The
  package is fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into a
  cache directory (no root needed), unless it is installed system-wide.
* ``digits``: scikit-learn's bundled 8x8 digits (1797 images), upsampled 4x to
  32x32x3, for tiny runs and tests.

A run that asked for CIFAR but got a substitute says so: ``ImageData.substitute_for``
holds the requested name and a line is printed. Synthetic data is only produced by
functions named so (`synthetic_sparse`).

Sparse data (`SparseData`, a CSR matrix + labels): `load_libsvm` reads the libsvm /
svmlight format of KDD10/KDD12/URL/WebSpam; `reuters_hashed` hashes the real Reuters
documents that Debian's ``weka`` package ships; `load_sparse` gives a named dataset's
train and test sets; `synthetic_sparse` generates data of any size for scaling runs.
"""
import dataclasses
import glob
import gzip
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

IMAGE_DATASETS = ("cifar10", "cifar100", "fashion_mnist", "digits")
# What a CIFAR request falls back to when allow_substitute=True.
SUBSTITUTE = "fashion_mnist"
_CIFAR_ARCHIVES = {
    "cifar10": "cifar-10-binary.tar.gz",
    "cifar100": "cifar-100-binary.tar.gz",
}
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
_FASHION_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
_FASHION_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"
_WEKA_EXAMPLES = "usr/share/doc/weka/examples"


class DataUnavailableError(RuntimeError):
    """A dataset is not available offline; the message says how to provide it."""


@dataclasses.dataclass
class ImageData:
    """An image classification dataset held in memory.

    Attributes:
      x_train, x_test: uint8 arrays [N, H, W, C].
      y_train, y_test: int64 label arrays [N].
      num_classes: number of classes.
      name: the dataset actually loaded.
      substitute_for: the dataset that was requested when `name` is a substitute for
        it, else None.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    substitute_for: str = None

    @property
    def input_shape(self):
        return tuple(self.x_train.shape[1:])

    def describe(self):
        """One line: what was loaded, its sizes, and any substitution."""
        text = (
            f"dataset {self.name}: {len(self.x_train)} train / {len(self.x_test)} test images "
            f"{'x'.join(map(str, self.input_shape))}, {self.num_classes} classes"
        )
        if self.substitute_for:
            text += f" (SUBSTITUTE for {self.substitute_for}, which is not available offline)"
        return text


def cache_dir():
    """Where fetched data is kept: $TFGC_DATA_DIR, else ~/.cache/tfgc."""
    path = os.environ.get("TFGC_DATA_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfgc"
    )
    os.makedirs(path, exist_ok=True)
    return path


def debian_package_dir(package, root=None):
    """Fetches a Debian package's files without installing it; returns where they are.

    Runs ``apt-get download <package>`` (the package archive only, no root needed) and
    ``dpkg-deb -x`` into ``<root>/debian/<package>``, once: later calls reuse it.

    Args:
      package: Debian package name, e.g. "dataset-fashion-mnist" or "weka".
      root: cache directory (default `cache_dir()`).

    Returns:
      The directory the package was unpacked into (its files under usr/...).

    Raises:
      DataUnavailableError: apt-get or dpkg-deb is missing or failed.
    """
    root = root or cache_dir()
    target = os.path.join(root, "debian", package)
    done = os.path.join(target, ".unpacked")
    if os.path.exists(done):
        return target
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DataUnavailableError(
                f"`{tool}` is needed to fetch the Debian package {package!r}; on a "
                f"non-Debian system download it by hand and unpack it into {target}"
            )
    with tempfile.TemporaryDirectory(dir=root) as work:
        print(f"[models.data] fetching Debian package {package} into {target}", file=sys.stderr)
        try:
            subprocess.run(
                ["apt-get", "download", "-q", package], cwd=work, check=True,
                capture_output=True, text=True, timeout=600,
            )
            (deb,) = glob.glob(os.path.join(work, "*.deb"))
            unpacked = os.path.join(work, "unpacked")
            subprocess.run(["dpkg-deb", "-x", deb, unpacked], check=True,
                           capture_output=True, text=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as error:
            detail = getattr(error, "stderr", "") or error
            raise DataUnavailableError(
                f"could not fetch Debian package {package!r} (`apt-get download {package}` "
                f"in a Debian/Ubuntu with the package index, then `dpkg-deb -x`): {detail}"
            ) from error
        # Move into place only when complete, so an interrupted fetch is retried.
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(unpacked, target)
    open(done, "w").close()
    return target


# --- images -----------------------------------------------------------------------------


def load_images(name, data_dir=None, allow_substitute=False, limit=None, *,
                manual_dir=None, download=False, test_limit=None):
    """Loads an image classification dataset as uint8 NHWC arrays.

    Args:
      name: "cifar10", "cifar100", "fashion_mnist" or "digits".
      data_dir: tensorflow-datasets data directory for CIFAR (default: tfds's,
        ~/tensorflow_datasets).
      allow_substitute: when CIFAR is not available, load Fashion-MNIST instead (and
        say so) rather than raising; scikit-learn's digits if Fashion-MNIST cannot be
        fetched either.
      limit: keep at most this many training examples (and test examples, unless
        `test_limit` is given); the first ones, so runs are reproducible.
      manual_dir: directory holding the CIFAR archive as downloaded from
        https://www.cs.toronto.edu/~kriz/ (default: <data_dir>/downloads/manual).
      download: let tensorflow-datasets download CIFAR from the internet.
      test_limit: keep at most this many test examples.

    Returns:
      An `ImageData`.

    Raises:
      DataUnavailableError: the dataset cannot be had offline (the message says how
        to provide it) and no substitute was allowed.
      ValueError: unknown name.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; known: {', '.join(IMAGE_DATASETS)}")
    if name in _CIFAR_ARCHIVES:
        try:
            data = _load_cifar(name, data_dir, manual_dir, download)
        except DataUnavailableError as error:
            if not allow_substitute:
                raise
            print(f"[models.data] {error}", file=sys.stderr)
            try:
                data = _load_fashion_mnist()
            except DataUnavailableError as fashion_error:
                # Still real data, bundled with scikit-learn: the run goes on, and says so.
                print(f"[models.data] {fashion_error}", file=sys.stderr)
                data = _load_digits()
            data.substitute_for = name
            print(f"[models.data] {name} is not available: using the real {data.name} "
                  "dataset as a SUBSTITUTE (resized to 32x32x3)", file=sys.stderr)
    elif name == "fashion_mnist":
        data = _load_fashion_mnist()
    else:
        data = _load_digits()
    test_limit = limit if test_limit is None else test_limit
    if limit is not None:
        data.x_train, data.y_train = data.x_train[:limit], data.y_train[:limit]
    if test_limit is not None:
        data.x_test, data.y_test = data.x_test[:test_limit], data.y_test[:test_limit]
    return data


def cifar_instructions(name, data_dir=None, manual_dir=None):
    """How to make CIFAR available offline (used in error messages)."""
    archive = _CIFAR_ARCHIVES[name]
    default_data_dir = data_dir or "~/tensorflow_datasets"
    manual = manual_dir or os.path.join(default_data_dir, "downloads", "manual")
    return (
        f"{name} is not prepared in {default_data_dir} and {archive} is not in {manual}. "
        f"To provide it: download {_CIFAR_URL}{archive} on a machine with internet access "
        f"and copy it to {manual} (or pass manual_dir= / --manual-dir), or copy an already "
        f"prepared tensorflow-datasets directory ({name}/3.0.2) into {default_data_dir} "
        f"(data_dir= / --data-dir), or allow the download (download=True / --download). "
        f"For an offline run use allow_substitute=True / --allow-substitute (real "
        f"Fashion-MNIST, recorded as a substitute)."
    )


def _load_cifar(name, data_dir, manual_dir, download):
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        manual = manual_dir or os.path.join(
            os.path.expanduser(data_dir or "~/tensorflow_datasets"), "downloads", "manual"
        )
        has_archive = os.path.exists(os.path.join(os.path.expanduser(manual), _CIFAR_ARCHIVES[name]))
        # Never reach for the internet unless asked: without the archive, fail clearly.
        if not (download or has_archive):
            raise DataUnavailableError(cifar_instructions(name, data_dir, manual_dir))
        config = tfds.download.DownloadConfig(manual_dir=os.path.expanduser(manual))
        builder.download_and_prepare(download_config=config)
    arrays = {}
    for split in ("train", "test"):
        images, labels = tfds.as_numpy(
            builder.as_dataset(split=split, batch_size=-1, as_supervised=True)
        )
        arrays[split] = (np.asarray(images, np.uint8), np.asarray(labels, np.int64))
    return ImageData(
        arrays["train"][0], arrays["train"][1], arrays["test"][0], arrays["test"][1],
        num_classes=builder.info.features["label"].num_classes, name=name,
    )


def read_idx(path):
    """Reads an IDX file (MNIST format, optionally gzipped) into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in dtypes:
        raise ValueError(f"{path}: unknown IDX type code {data[2]:#x}")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtypes[data[2]], offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {array.size} values for shape {shape}")
    return array.reshape(shape)


def _fashion_mnist_installed():
    """Whether Fashion-MNIST's files are installed system-wide (Debian's package)."""
    return all(os.path.exists(os.path.join(_FASHION_SYSTEM_DIR, f))
               for f in _FASHION_FILES.values())


def fashion_mnist_dir(root=None):
    """Directory with Fashion-MNIST's four .gz files (fetched from Debian if needed)."""
    if _fashion_mnist_installed():
        return _FASHION_SYSTEM_DIR
    package = debian_package_dir("dataset-fashion-mnist", root)
    return os.path.join(package, _FASHION_SYSTEM_DIR.lstrip("/"))


def to_rgb32(images):
    """[N, h, w] grayscale (h, w <= 32) -> [N, 32, 32, 3] uint8, centred with zero padding."""
    images = np.asarray(images, np.uint8)
    n, h, w = images.shape
    top, left = (32 - h) // 2, (32 - w) // 2
    out = np.zeros((n, 32, 32), np.uint8)
    out[:, top:top + h, left:left + w] = images
    return np.repeat(out[..., None], 3, axis=-1)


def _load_fashion_mnist(directory=None):
    directory = directory or fashion_mnist_dir()
    arrays = {k: read_idx(os.path.join(directory, f)) for k, f in _FASHION_FILES.items()}
    return ImageData(
        to_rgb32(arrays["x_train"]), arrays["y_train"].astype(np.int64),
        to_rgb32(arrays["x_test"]), arrays["y_test"].astype(np.int64),
        num_classes=10, name="fashion_mnist",
    )


def _load_digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    # 0..16 -> 0..255, each pixel repeated 4x4 (8x8 -> 32x32).
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    images = images.repeat(4, axis=1).repeat(4, axis=2)
    images = np.repeat(images[..., None], 3, axis=-1)
    labels = digits.target.astype(np.int64)
    # sklearn ships no test split: a fixed shuffle, 80% / 20%.
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return ImageData(images[train], labels[train], images[test], labels[test],
                     num_classes=10, name="digits")


def write_cifar_binary(path, images, labels, coarse_labels=None):
    """Writes images in CIFAR's binary format (the files of cifar-10-batches-bin).

    Each record: the label byte(s) (CIFAR-100: coarse, then fine) then 3072 bytes, the
    red, green and blue 32x32 planes. Used to build real-format test fixtures.

    Args:
      path: output file.
      images: uint8 [N, 32, 32, 3].
      labels: int [N] (CIFAR-10 label, or CIFAR-100 fine label).
      coarse_labels: int [N] for CIFAR-100 files, else None.
    """
    images = np.asarray(images, np.uint8)
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    columns = [np.asarray(labels, np.uint8)[:, None]]
    if coarse_labels is not None:
        columns.insert(0, np.asarray(coarse_labels, np.uint8)[:, None])
    with open(path, "wb") as f:
        f.write(np.concatenate(columns + [planes], axis=1).tobytes())


# --- sparse data ------------------------------------------------------------------------


@dataclasses.dataclass
class SparseData:
    """A sparse binary-classification or regression dataset.

    Attributes:
      x: scipy.sparse CSR matrix [N, num_features], float32.
      y: float32 labels [N] (in {-1, +1} for classification).
      name: what was loaded (a file, a named corpus, or "synthetic_sparse").
    """

    x: object
    y: np.ndarray
    name: str

    @property
    def num_features(self):
        return self.x.shape[1]

    def split(self, train_fraction=0.7, seed=0):
        """(train, test) after a fixed shuffle; FastSGD splits 70% / 30%."""
        order = np.random.default_rng(seed).permutation(self.x.shape[0])
        cut = int(train_fraction * len(order))
        return (
            SparseData(self.x[order[:cut]], self.y[order[:cut]], self.name + "/train"),
            SparseData(self.x[order[cut:]], self.y[order[cut:]], self.name + "/test"),
        )


def load_libsvm(path, num_features=None, zero_based=False):
    """Reads a libsvm / svmlight file ("label index:value ..." lines, 1-based indices).

    This is the distribution format of KDD10, KDD12, URL and WebSpam (LIBSVM's
    dataset page); .bz2/.gz files are read as they are.

    Args:
      path: the file.
      num_features: the feature count (default: the largest index seen).
      zero_based: indices start at 0 (LIBSVM's own files start at 1).

    Returns:
      `SparseData`; labels {0, 1} are mapped to {-1, +1}.
    """
    from sklearn.datasets import load_svmlight_file

    x, y = load_svmlight_file(path, n_features=num_features, dtype=np.float32,
                              zero_based=zero_based)
    y = y.astype(np.float32)
    if set(np.unique(y)) <= {0.0, 1.0}:
        y = 2.0 * y - 1.0
    return SparseData(x.tocsr(), y, os.path.basename(path))


def reuters_arff_path(name="ReutersCorn-train", root=None):
    """Path of one of the Reuters-21578 ARFF files of Debian's `weka` package.

    Names: ReutersCorn-train, ReutersCorn-test, ReutersGrain-train, ReutersGrain-test.
    The package is fetched (not installed) on first use, see `debian_package_dir`.
    """
    path = os.path.join(debian_package_dir("weka", root), _WEKA_EXAMPLES, name + ".arff")
    if not os.path.exists(path):
        raise DataUnavailableError(f"{path} is not in the weka package")
    return path


def reuters_hashed(name="ReutersCorn-train", dim=2**20, features="tfidf", path=None,
                   idf_path=None):
    """Real hashed text: a Reuters-21578 ARFF file as sparse feature-hashed rows.

    Words are hashed (crc32 modulo `dim`) with tf-idf or binary values exactly as
    benchmarks/fastsgd_keys.py does; labels are {-1, +1}.

    Args:
      name: which weka ARFF file (see `reuters_arff_path`).
      dim: number of hashed features.
      features: "tfidf" or "binary".
      path: an ARFF file to read instead of the weka one.
      idf_path: an ARFF file whose documents give the idf weights (a training set's,
        for its test set); default: the file itself.
    """
    import scipy.sparse

    from models import arff

    path = path or reuters_arff_path(name)
    _, texts, labels, _ = arff.load_documents(path)
    idf_texts = arff.load_documents(idf_path)[1] if idf_path else None
    rows = arff.featurize(texts, dim, features, idf_texts=idf_texts)
    indptr = np.cumsum([0] + [len(i) for i, _ in rows])
    indices = np.concatenate([i for i, _ in rows]) if rows else np.zeros(0, np.int64)
    values = np.concatenate([v for _, v in rows]) if rows else np.zeros(0, np.float32)
    x = scipy.sparse.csr_matrix((values.astype(np.float32), indices, indptr), shape=(len(rows), dim))
    return SparseData(x, (2.0 * labels - 1.0).astype(np.float32), os.path.basename(path))


#: Sparse datasets `load_sparse` knows by name (plus "libsvm:PATH").
SPARSE_DATASETS = ("reuters_corn", "reuters_grain")


def load_sparse(name, dim=2**20, features="tfidf"):
    """A sparse binary classification dataset as (train, test) `SparseData`.

    Args:
      name: "reuters_corn" / "reuters_grain": the Reuters-21578 ModApte documents of
        Debian's weka package (1554 train / 604 test) labelled corn / grain or not,
        hashed into `dim` features (idf from the training documents);
        "libsvm:PATH": a libsvm / svmlight file, split 70% / 30% as FastSGD does.
      dim: hashed feature count (Reuters only; a libsvm file has its own).
      features: "tfidf" or "binary" (Reuters only).

    Raises:
      DataUnavailableError: the weka package cannot be fetched.
      ValueError: unknown name.
    """
    if name.startswith("libsvm:"):
        return load_libsvm(name[len("libsvm:"):]).split(0.7)
    if name not in SPARSE_DATASETS:
        raise ValueError(f"unknown sparse dataset {name!r}; known: "
                         f"{', '.join(SPARSE_DATASETS)} or libsvm:PATH")
    topic = name[len("reuters_"):].capitalize()
    train_path = reuters_arff_path(f"Reuters{topic}-train")
    train = reuters_hashed(dim=dim, features=features, path=train_path)
    test = reuters_hashed(dim=dim, features=features, path=reuters_arff_path(f"Reuters{topic}-test"),
                          idf_path=train_path)
    return train, test


def synthetic_sparse(num_examples=10000, num_features=2**20, nnz_per_example=50, seed=0,
                     noise=0.1):
    """SYNTHETIC sparse data for scaling runs (not a substitute for a real dataset).

    Feature indices are Zipf-distributed (a few frequent features, a long tail, like
    hashed text); values are 1.0; labels are the sign of a hidden sparse linear model
    plus Gaussian noise.

    Args:
      num_examples, num_features, nnz_per_example: the shape of the data.
      seed: random seed.
      noise: standard deviation of the label noise relative to the margin's.
    """
    import scipy.sparse

    rng = np.random.default_rng(seed)
    ranks = rng.zipf(1.3, size=(num_examples, nnz_per_example)) - 1
    # A fixed random permutation spreads the frequent features over the index range.
    perm = rng.permutation(num_features)
    indices = perm[np.minimum(ranks, num_features - 1)]
    rows = np.repeat(np.arange(num_examples), nnz_per_example)
    x = scipy.sparse.csr_matrix(
        (np.ones(rows.size, np.float32), (rows, indices.reshape(-1))),
        shape=(num_examples, num_features),
    )
    x.sum_duplicates()
    x.data[:] = 1.0
    w = rng.normal(size=num_features).astype(np.float32)
    margin = x @ w
    margin = margin + noise * margin.std() * rng.normal(size=num_examples)
    y = np.where(margin >= 0, 1.0, -1.0).astype(np.float32)
    return SparseData(x, y, "synthetic_sparse")


def debian_packages_for(name, allow_substitute=False):
    """The Debian packages that loading dataset `name` may fetch."""
    if name in SPARSE_DATASETS:
        return ["weka"]
    if not _fashion_mnist_installed() and (
            name == "fashion_mnist" or (name in _CIFAR_ARCHIVES and allow_substitute)):
        return ["dataset-fashion-mnist"]
    return []


def prefetch(name, allow_substitute=False):
    """Fetches the Debian packages dataset `name` may need into the cache, now.

    For a process about to enter a private network namespace (`tfgc.cluster.isolate`),
    where no package registry can be reached. A package that cannot be fetched is only
    reported here: loading the dataset later raises (or substitutes) as it would anyway.
    """
    for package in debian_packages_for(name, allow_substitute):
        try:
            debian_package_dir(package)
        except DataUnavailableError as error:
            print(f"[models.data] {error}", file=sys.stderr)


def main(argv=None):
    """``python -m models.data fetch PACKAGE...``: fetches Debian packages into the cache.

    `make test` runs it before the suite enters its private network namespace, from
    which no package registry can be reached.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m models.data",
                                     description=main.__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch Debian packages into the cache")
    fetch.add_argument("packages", nargs="+", help='e.g. "weka" (the Reuters documents)')
    args = parser.parse_args(argv)
    for package in args.packages:
        print(f"{package}: {debian_package_dir(package)}")


if __name__ == "__main__":
    main()
