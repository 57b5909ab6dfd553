#!/usr/bin/env bash
# The older of the two supported TensorFlow minors: the suite's non-cluster tests and one
# ParameterServerStrategy cluster test, with that TensorFlow and its tf_keras.
#
# The op library is compiled against the TensorFlow it runs with, so this runs on a copy
# of the tracked tree in build/tf<minor>/ with a virtual environment of its own.
#
#   scripts/test_older_tensorflow.sh [minor]      (default 2.20)
set -euo pipefail
MINOR=${1:-2.20}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$ROOT/build/tf$MINOR
VENV=$WORK/venv
PY=$VENV/bin/python

rm -rf "$WORK/src"
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -z | xargs -0 tar -cf -) | tar -xf - -C "$WORK/src"

if [ ! -x "$PY" ]; then
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
fi
"$PY" -m pip install --quiet "tensorflow==$MINOR.*" "tf_keras==$MINOR.*" "setuptools>=68" wheel
cd "$WORK/src"
# The test extra without the documentation and lint tools (their tests run once, with
# the newest TensorFlow).
"$PY" -m pip install --quiet --no-build-isolation -e ".[models]" pytest pytest-xdist hypothesis \
  pyyaml
"$PY" -c "import tensorflow as tf, tf_keras; print('TensorFlow', tf.__version__, 'tf_keras', tf_keras.__version__)"

TF_CPP_MIN_LOG_LEVEL=2 "$PY" -m tfgc.cluster.private "$PY" -m pytest -q -p no:cacheprovider \
  -n 2 -m "not cluster and not slow" \
  --ignore tests/test_docs.py --ignore tests/test_lint.py --ignore tests/test_types.py tests
TF_CPP_MIN_LOG_LEVEL=2 "$PY" -m tfgc.cluster.private "$PY" -m pytest -q -p no:cacheprovider \
  "tests/test_ps_training.py::test_parameter_servers_receive_only_compressed_gradients"
