"""The support matrix (docs/guides/mixed-precision.md): every cell trains and
compresses, or fails with a clear error; no cell is silent.

Cells are run by tests/support_matrix.py, one process per strategy (under parameter
servers a 262k-parameter model, elsewhere 33k). A cell that trains
must have compressed (the counters, which only the wire that carried a step updates,
show >= 10x fewer bytes than the dense gradients), reported its traffic through
`TrafficLogger` into `fit`'s history and CSVLogger's file, and let TensorBoard and the
checkpoint callbacks write their files. Under parameter servers the bytes are read from the sockets; the
multi-process all-reduce sockets are checked in test_mwms.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import support_matrix

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
TRAFFIC_KEYS = {"push_bytes", "push_dense_bytes", "compression_ratio", "bits_per_value"}

# Cells that must fail, and with what: (type, words the message must hold). Each is an
# error of tf_keras or Keras itself, whose message names the alternative.
EXPECTED_ERRORS = {
    # tf_keras has no loss scaling under ParameterServerStrategy.
    "tf_keras/ps-fit/mixed_float16/SGD": ("ValueError", "Mixed precision is not supported"),
    "tf_keras/ps-fit/float32/SGD+lso_first": ("ValueError", "Loss scaling is not supported"),
    # Keras 3 has no ParameterServerStrategy fit: tfgc.fit_on_parameter_servers trains.
    "keras3/ps-fit/float32/SGD": ("ValueError", "create_per_worker_dataset"),
}


def run_cells(strategy, tmp_path, wrap=()):
    done = subprocess.run(
        [*wrap, sys.executable, os.path.join(HERE, "support_matrix.py"), strategy, str(tmp_path)],
        capture_output=True, text=True, timeout=900,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-4000:]
    cells = [json.loads(line[len("CELL "):]) for line in done.stdout.splitlines()
             if line.startswith("CELL ")]
    assert cells, done.stderr[-4000:]
    return {cell["cell"]: cell for cell in cells}


def check_trained(name, cell):
    assert cell["outcome"] == "trained", (name, cell.get("message"), cell.get("where"))
    traffic = cell["traffic"]
    assert traffic["push_dense_bytes"] >= 10 * traffic["push_bytes"] > 0, (name, traffic)
    assert TRAFFIC_KEYS <= set(cell["history_keys"]) or "custom_loop" in name, (name, cell)
    assert np.all(np.isfinite(cell["loss"])), (name, cell["loss"])


@pytest.mark.parametrize("strategy", ["none", "mirrored", "mwms"])
def test_every_single_process_cell_trains_compressed(tmp_path, strategy):
    cells = run_cells(strategy, tmp_path)
    expected = {f"{flavour}/{strategy}/{policy}/{optimizer}"
                for flavour, policy, optimizer in support_matrix.cells()}
    assert set(cells) == expected
    for name, cell in cells.items():
        check_trained(name, cell)
        assert cell["tensorboard_files"] >= 1 and cell["checkpoint_files"] >= 1, (name, cell)
        assert TRAFFIC_KEYS <= set(cell["csv_header"]), (name, cell["csv_header"])
        assert not cell["tfgc_warnings"], (name, cell["tfgc_warnings"])
        mixed16 = "/mixed_float16/" in name
        assert ("LossScale" in cell["outer"]) == mixed16, (name, cell["outer"])


@pytest.mark.cluster
def test_every_parameter_server_cell_trains_compressed_or_says_why_not(tmp_path):
    cells = run_cells("ps", tmp_path, wrap=[sys.executable, "-m", "tfgc.cluster.private"])
    assert len(cells) == len(support_matrix.PS_CELLS)
    for name, cell in cells.items():
        if name in EXPECTED_ERRORS:
            kind, words = EXPECTED_ERRORS[name]
            assert cell["outcome"] == "error" and cell["type"] == kind, (name, cell)
            assert words in cell["message"], (name, cell["message"])
            continue
        check_trained(name, cell)
        assert cell["steps"] == 8, (name, cell)
        # On the sockets: at most 0.15x the dense gradients (what fp32 pushes at least),
        # and what the counters say was sent plus a small per-step overhead (the step's
        # function call, variable requests and framing: 1.7-2.7 KB measured; 7.5 KB
        # where each call traces anew), not the fp32 gradient (1 MiB per step).
        traffic = cell["traffic"]
        assert cell["worker_to_ps"] < 0.15 * traffic["push_dense_bytes"], (name, cell)
        overhead = (cell["worker_to_ps"] - traffic["push_bytes"]) / cell["steps"]
        assert 0 <= overhead < (12_000 if "fit_on_parameter_servers" in name else 4_000), (
            name, overhead, cell)
