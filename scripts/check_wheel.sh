#!/usr/bin/env bash
# Builds tfgc's sdist and wheel, installs the wheel into a fresh virtual environment and
# runs a smoke test there (import tfgc, one codec round trip, one op, the tfgc-server
# entry point). Not part of `make test`: building compiles the op library (minutes).
#
#   scripts/check_wheel.sh [PYTHON]
#
# PYTHON (default: python3) must have TensorFlow 2.21, setuptools and `build` installed:
# the op library is compiled against that TensorFlow (no build isolation). The fresh
# environment gets its TensorFlow from pip's index or cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m build --no-isolation --outdir "$WORK/dist" .
ls -l "$WORK/dist"
BASE=$("$PYTHON" -c 'import sys; print(sys.base_prefix)')/bin/python3
"$BASE" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet "$WORK"/dist/tfgc-*.whl
cd "$WORK"  # away from the source tree, so that the installed package is imported
TF_CPP_MIN_LOG_LEVEL=2 "$WORK/venv/bin/python" - <<'PY'
import tensorflow as tf

import tfgc
import tfgc_ops

assert tfgc.__file__.startswith(__import__("sys").prefix), tfgc.__file__
x = tf.constant([0.0, 1.0, -2.0, 0.5, 0.0, 0.0, 3.0, -0.1] * 100)
codec = tfgc.codecs.ThreeLC(1.0)
y = codec.decode(codec.encode(x))
assert y.shape == x.shape
runs = tfgc_ops.zero_run_encode(tf.constant([121] * 50 + [3, 7], tf.uint8))
assert tfgc_ops.zero_run_decode(runs).numpy().tolist() == [121] * 50 + [3, 7]
print(f"tfgc {tfgc.__version__}: ThreeLC round trip and zero-run ops ok")
PY
test -x "$WORK/venv/bin/tfgc-server"
echo "wheel ok"
