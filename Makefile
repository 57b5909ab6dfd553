# `make demo` and `make test` bootstrap .venv on a fresh machine (Python 3.11 + gcc).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tfgc-installed
# TensorFlow first: the op library is compiled against it (no build isolation).
BUILD_DEPS := "tensorflow==2.21.*" "setuptools>=68" wheel
EXTRAS := .[test,data,bench,models]

.PHONY: install apt-index demo codec-demo test-data test test-fast fuzz bench clean

$(STAMP): setup.py pyproject.toml $(wildcard tfgc_ops/cc/*.cc tfgc_ops/cc/*.h)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(BUILD_DEPS)
	$(PY) -m pip install --quiet --no-build-isolation -e "$(EXTRAS)"
	@touch $(STAMP)

install: $(STAMP)

# Real datasets come from Debian packages (`apt-get download`, no install); a fresh
# machine may have no package index yet, which only root can fetch.
apt-index:
	@apt-cache show dataset-fashion-mnist >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq || echo "note: no apt package index; real datasets from Debian packages will be unavailable"; }

# The main job: a 1-PS/2-worker cluster on 127.0.0.1 trains ResNet-20 without and with
# ThreeLC (a few minutes on 2 cores); table and plot in runs/demo. TensorFlow's C++
# start-up logs are quiet unless TF_CPP_MIN_LOG_LEVEL is set.
demo: install apt-index
	TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL-2} $(PY) -m models.cluster_demo --out runs/demo

codec-demo: install apt-index
	TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL-2} $(PY) -m models.codec_demo

# Debian packages the suite reads (the Reuters documents in weka), fetched into the
# cache while the package registry can still be reached.
test-data: install apt-index
	@$(PY) -m models.data fetch weka || echo "note: could not fetch weka; the sparse-model tests will fail"

# The suite starts real clusters: it runs in a private network namespace (loopback
# only), so no task it starts can be reached from another host, nor any registry. Two
# pytest-xdist workers share the machine (see tests/conftest.py for what runs alone).
TEST_WORKERS ?= 2
test: install apt-index test-data
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m tfgc.cluster.private $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-fast: install
	$(PY) -m pytest -q -m "not cluster and not slow"

fuzz:
	bash tfgc_ops/fuzz/run.sh

bench: install
	$(PY) -m benchmarks.bench_throughput
	$(PY) benchmarks/bench_codecs.py

clean:
	rm -rf $(VENV) build *.egg-info tfgc_ops/*.so tfgc_ops/build_info.json
