"""The target verdicts of benchmarks/bench_throughput.py."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_throughput.py")
_spec = importlib.util.spec_from_file_location("bench_throughput", _PATH)
bench_throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_throughput)
judge = bench_throughput.judge


def test_a_rate_at_or_above_its_target_passes():
    assert judge("zre_enc", 1.5, 1.5, {"zre_ratio": 2.0}, 10.0) == "PASS"
    assert judge("tlc_dec", 4.9, 5.0, {"zre_ratio": 2.0}, 10.0) == "MISS"


def test_sparse_decoding_is_judged_against_what_memcpy_allows():
    # Ratio 14 at memcpy 15 GB/s: at most 15 / 14 = 1.07 GB/s of input can be decoded.
    sparse = {"zre_ratio": 14.0}
    assert judge("zre_dec", 1.0, 3.0, sparse, 15.0) == "AT LIMIT"  # 93% of the limit
    assert judge("zre_dec", 0.9, 3.0, sparse, 15.0) == "MISS"  # 84%
    # The decoded-byte row has no such excuse, nor do other rows.
    assert judge("zre_dec_out", 1.0, 3.0, sparse, 15.0) == "MISS"
    assert judge("zre_enc", 1.0, 3.0, sparse, 15.0) == "MISS"


def test_dense_decoding_below_its_target_misses():
    # Ratio 1.75: the limit, 8.6 GB/s, lies above the target, which must be reached.
    assert judge("zre_dec", 2.9, 3.0, {"zre_ratio": 1.75}, 15.0) == "MISS"
    assert judge("zre_dec", 3.4, 3.0, {"zre_ratio": 1.75}, 15.0) == "PASS"
