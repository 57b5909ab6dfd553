"""Reuters-21578 text from weka's ARFF files: a small ARFF reader and feature hashing.

Used by `models.data.reuters_hashed` (FastSGD's sparse models) and by
benchmarks/fastsgd_keys.py; one implementation of both.
"""
import html
import re
import zlib

import numpy as np


# --- ARFF ---------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "'": "'", '"': '"', "\\": "\\", "%": "%"}


class ArffError(ValueError):
    pass


def _read_value(text, i, lineno, stops):
    """Reads one value starting at text[i]: (value or None for '?', index after it)."""
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] in "'\"":
        quote, i, chars = text[i], i + 1, []
        while True:
            if i >= n:
                raise ArffError(f"line {lineno}: unterminated quoted value")
            c = text[i]
            if c == "\\" and i + 1 < n:
                chars.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
            elif c == quote:
                return "".join(chars), i + 1
            else:
                chars.append(c)
                i += 1
    stop = i
    while stop < n and text[stop] not in stops:
        stop += 1
    token = text[i:stop].strip()
    return (None if token == "?" else token), stop


def _split_values(line, lineno):
    """Splits one ARFF data line into values (quotes and escapes resolved, '?' -> None).

    Returns (values, sparse): for a sparse row `{i v, j w}` the values are (index, value)
    pairs.
    """
    text = line.strip()
    sparse = text.startswith("{")
    if sparse:
        if not text.endswith("}"):
            raise ArffError(f"line {lineno}: sparse row does not end with '}}'")
        text = text[1:-1]
    values, i, n = [], 0, len(text)
    if sparse and not text.strip():
        return values, sparse
    while True:
        if sparse:
            index, i = _read_value(text, i, lineno, " \t,")
            try:
                index = int(index)
            except (TypeError, ValueError):
                raise ArffError(f"line {lineno}: bad sparse index {index!r}") from None
            value, i = _read_value(text, i, lineno, ",")
            values.append((index, value))
        else:
            value, i = _read_value(text, i, lineno, ",")
            values.append(value)
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return values, sparse
        if text[i] != ",":
            raise ArffError(f"line {lineno}: expected ',' at column {i + 1}")
        i += 1


def _attribute(rest, lineno):
    rest = rest.strip()
    if rest[:1] in "'\"":
        end = rest.find(rest[0], 1)
        if end < 0:
            raise ArffError(f"line {lineno}: unterminated attribute name")
        name, kind = rest[1:end], rest[end + 1 :].strip()
    else:
        parts = rest.split(None, 1)
        if len(parts) < 2:
            raise ArffError(f"line {lineno}: @attribute needs a name and a type")
        name, kind = parts
    lowered = kind.lower()
    if kind.startswith("{"):
        kind = ("nominal", [v for v in _split_values(kind.strip()[1:-1], lineno)[0]])
    elif lowered.startswith("string"):
        kind = ("string", None)
    elif lowered.split()[0] in ("numeric", "real", "integer"):
        kind = ("numeric", None)
    else:
        kind = (lowered.split()[0], None)
    return name, kind


def parse_arff(text):
    """Parses ARFF text (dense or sparse rows) into (relation, attributes, rows).

    attributes: list of (name, (kind, nominal values or None)); rows: lists of raw string
    values (None for missing), one per attribute. A row is one line (ARFF strings keep
    their newlines escaped as \\n, which is resolved here).
    """
    relation, attributes, rows, in_data = None, [], [], False
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("%"):
            continue
        if not in_data:
            keyword = stripped.split(None, 1)[0].lower()
            rest = stripped.split(None, 1)[1] if len(stripped.split(None, 1)) > 1 else ""
            if keyword == "@relation":
                relation = rest.strip().strip("'\"")
            elif keyword == "@attribute":
                attributes.append(_attribute(rest, lineno))
            elif keyword == "@data":
                in_data = True
            else:
                raise ArffError(f"line {lineno}: unexpected header line {stripped[:40]!r}")
            continue
        values, sparse = _split_values(line, lineno)
        if sparse:
            row = [None if kind[0] == "string" else "0" for _, kind in attributes]
            for index, value in values:
                if not 0 <= index < len(attributes):
                    raise ArffError(f"line {lineno}: sparse index {index} out of range")
                row[index] = value
        else:
            row = values
            if len(row) != len(attributes):
                raise ArffError(
                    f"line {lineno}: {len(row)} values for {len(attributes)} attributes"
                )
        rows.append(row)
    if not in_data:
        raise ArffError("no @data section")
    return relation, attributes, rows


def load_documents(path):
    """Reads an ARFF file of documents: (relation, texts, labels as 0/1 ints, class name).

    The text is the first string attribute; the label is the last nominal attribute, whose
    second value (e.g. '1') is the positive class.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        relation, attributes, rows = parse_arff(f.read())
    strings = [i for i, (_, kind) in enumerate(attributes) if kind[0] == "string"]
    nominals = [i for i, (_, kind) in enumerate(attributes) if kind[0] == "nominal"]
    if not strings or not nominals:
        raise ArffError(
            f"{path}: expected a string attribute (document text) and a nominal class "
            f"attribute, found {[(n, k[0]) for n, k in attributes]}"
        )
    text_at, label_at = strings[0], nominals[-1]
    classes = attributes[label_at][1][1]
    if len(classes) != 2:
        raise ArffError(f"{path}: class attribute must be binary, has values {classes}")
    texts, labels = [], []
    for row in rows:
        if row[text_at] is None or row[label_at] is None:
            continue
        texts.append(html.unescape(row[text_at]))
        labels.append(classes.index(row[label_at]))
    return relation, texts, np.array(labels, np.float32), attributes[label_at][0]


# --- features -----------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text):
    """Lowercase alphanumeric words."""
    return _WORD.findall(text.lower())


def hash_token(token, dim):
    """Feature index of a word: zlib.crc32 of its UTF-8 bytes modulo dim."""
    return zlib.crc32(token.encode("utf-8")) % dim


def _count_words(texts, dim):
    """Per document, {feature index: word count}."""
    counted = []
    for text in texts:
        counts = {}
        for token in tokenize(text):
            index = hash_token(token, dim)
            counts[index] = counts.get(index, 0) + 1
        counted.append(counts)
    return counted


def featurize(texts, dim, features="tfidf", idf_texts=None):
    """Hashes documents into sparse rows: a list of (sorted int64 indices, float32 values).

    tfidf: (1 + log tf) * (log((1 + N) / (1 + df)) + 1), L2-normalized per document;
    binary: 1.0 for every present feature. Words hashing to one index are merged (their
    counts add up). N and df come from `idf_texts` when given (a training set's, so
    that its test set is weighted the same way), else from `texts`.
    """
    if features not in ("tfidf", "binary"):
        raise ValueError(f"features must be 'tfidf' or 'binary', got {features!r}")
    counted = _count_words(texts, dim)
    reference = counted if idf_texts is None else _count_words(idf_texts, dim)
    df = {}
    for counts in reference:
        for index in counts:
            df[index] = df.get(index, 0) + 1
    n = len(reference)
    rows = []
    for counts in counted:
        indices = np.array(sorted(counts), np.int64)
        if features == "binary":
            values = np.ones(indices.size, np.float32)
        else:
            tf_ = 1.0 + np.log(np.array([counts[i] for i in indices], np.float64))
            idf = np.log((1.0 + n) / (1.0 + np.array([df.get(i, 0) for i in indices], np.float64))) + 1
            values = tf_ * idf
            norm = np.linalg.norm(values)
            values = (values / norm if norm > 0 else values).astype(np.float32)
        rows.append((indices, values))
    return rows
