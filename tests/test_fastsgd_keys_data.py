"""Offline checks of benchmarks/fastsgd_keys.py's data path (ARFF parsing, hashing, key
baselines) on tiny inline ARFF text; no weka file and no TensorFlow op runs here."""
import importlib.util
import math
import os
import zlib

import numpy as np
import pytest

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "fastsgd_keys.py")


@pytest.fixture(scope="module")
def fk():
    spec = importlib.util.spec_from_file_location("fastsgd_keys", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = r"""% a comment
@relation 'Tiny Reuters-like'

@attribute Text string
@attribute class-att {0,1}

@data

'CORN crop\nup 5 pct, farmers\'s view',1
'Wheat &lt;WHT> exports',0
% another comment
"no quotes 'inside' here",0
{0 'sparse row text', 1 1}
"""


def test_parse_arff_dense_and_sparse_rows(fk):
    relation, attributes, rows = fk.parse_arff(TINY)
    assert relation == "Tiny Reuters-like"
    assert [name for name, _ in attributes] == ["Text", "class-att"]
    assert attributes[0][1][0] == "string"
    assert attributes[1][1] == ("nominal", ["0", "1"])
    assert rows == [
        ["CORN crop\nup 5 pct, farmers's view", "1"],
        ["Wheat &lt;WHT> exports", "0"],
        ["no quotes 'inside' here", "0"],
        ["sparse row text", "1"],
    ]


def test_load_documents_labels_and_unescaping(fk, tmp_path):
    path = tmp_path / "tiny.arff"
    path.write_text(TINY)
    relation, texts, labels, class_name = fk.load_documents(str(path))
    assert class_name == "class-att"
    assert labels.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert texts[1] == "Wheat <WHT> exports"  # HTML entities resolved


def test_parse_arff_errors(fk):
    with pytest.raises(fk.ArffError, match="unterminated"):
        fk.parse_arff("@relation r\n@attribute t string\n@data\n'open\n")
    with pytest.raises(fk.ArffError, match="values for"):
        fk.parse_arff("@relation r\n@attribute t string\n@attribute c {0,1}\n@data\n'x'\n")
    with pytest.raises(fk.ArffError, match="no @data"):
        fk.parse_arff("@relation r\n@attribute t string\n")


def test_load_documents_needs_text_and_class(fk, tmp_path):
    path = tmp_path / "numeric.arff"
    path.write_text("@relation r\n@attribute x numeric\n@attribute y numeric\n@data\n1,2\n")
    with pytest.raises(fk.ArffError, match="string attribute"):
        fk.load_documents(str(path))


def test_tokenize_and_hash(fk):
    assert fk.tokenize("CORN crop\nup 5.5 pct, farmers's") == [
        "corn", "crop", "up", "5", "5", "pct", "farmers", "s"]
    dim = 2**20
    assert fk.hash_token("corn", dim) == zlib.crc32(b"corn") % dim
    assert 0 <= fk.hash_token("wheat", 16) < 16


def test_featurize_tfidf_and_binary(fk):
    texts = ["corn corn wheat", "wheat", "rice"]
    dim = 2**20
    rows = fk.featurize(texts, dim, "tfidf")
    assert len(rows) == 3
    for indices, values in rows:
        assert indices.dtype == np.int64 and np.all(np.diff(indices) > 0)
        assert np.all(indices < dim)
        np.testing.assert_allclose(np.linalg.norm(values), 1.0, rtol=1e-6)
    corn, wheat = fk.hash_token("corn", dim), fk.hash_token("wheat", dim)
    first = dict(zip(rows[0][0].tolist(), rows[0][1].tolist()))
    assert set(first) == {corn, wheat}
    # corn: tf 2, df 1 -> (1 + ln 2)(ln(4/2) + 1); wheat: tf 1, df 2 -> ln(4/3) + 1
    ratio = (1 + math.log(2)) * (math.log(2) + 1) / (math.log(4 / 3) + 1)
    assert first[corn] / first[wheat] == pytest.approx(ratio, rel=1e-5)
    binary = fk.featurize(texts, dim, "binary")
    assert binary[0][1].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError):
        fk.featurize(texts, dim, "counts")


def test_key_baselines(fk):
    keys = [3, 4, 300, 70000]  # deltas 3, 1, 296, 69700 -> 1, 1, 2, 3 bytes
    assert fk.deltas_of(keys).tolist() == [3, 1, 296, 69700]
    assert fk.byte_granular_bits(keys) == pytest.approx(8 * 7 / 4)
    assert fk.paper_prediction(2**20, 2**14, 2) == 8
    # all D keys: log2 C(D, D) / D = 0; one key of 2: 1 bit
    assert fk.subset_entropy_bits(1024, 1024) == pytest.approx(0.0, abs=1e-9)
    assert fk.subset_entropy_bits(2, 1) == pytest.approx(1.0)


def test_dim_and_flag_parsing(fk):
    assert fk.parse_dim("2**20") == 2**20
    assert fk.parse_dim("2^16") == 2**16
    assert fk.parse_dim("1000") == 1000
    assert fk.parse_flag_bits(["1,2", "5"]) == [1, 2, 5]
    with pytest.raises(SystemExit):
        fk.parse_flag_bits(["6"])


def test_missing_arff_says_how_to_get_it(fk, tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        fk.main(["--arff", str(tmp_path / "ReutersCorn-train.arff")])
    message = str(error.value)
    assert "not found" in message
    assert "apt-get download weka" in message and "dpkg-deb -x" in message
