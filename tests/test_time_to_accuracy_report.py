"""The time-to-accuracy benchmark's summary of its committed raw output."""
import copy
import json
import os

import pytest

from benchmarks import time_to_accuracy

FOLDER = os.path.join(os.path.dirname(__file__), os.pardir, "results", "time_to_accuracy")
# One seed at learning rate 0.05 on loopback and 100 Mbit/s + 20 ms RTT, where fp32 and
# bf16 did not reach the target: every case the summary handles.
RAW = os.path.join(FOLDER, "learning_rate", "ps_100mbit_20ms_rtt_lr_0.05.json")


def _results():
    with open(RAW) as f:
        return json.load(f)


def _speedup(summary, link, config, against):
    return next(s for s in summary["speedups"]
                if (s["link"], s["config"], s["against"]) == (link, config, against))


def test_a_baseline_that_never_reached_the_target_gives_an_at_least_ratio():
    results = _results()
    summary = time_to_accuracy.summarize(results, with_floors=False)
    rows = {(r["link"], r["config"]): r for r in results["rows"]}
    fp32, h4 = rows[("100mbit/10ms", "fp32")], rows[("100mbit/10ms", "threelc-h4")]
    assert fp32["time_to_target_s"] is None
    speedup = _speedup(summary, "100mbit/10ms", "threelc-h4", "fp32")
    assert speedup["at_least"]
    assert speedup["ratio_of_totals"] == fp32["held_out"][-1]["time_s"] / h4["time_to_target_s"]
    assert ">= 2.03x (fp32 did not reach the target: at least)" in time_to_accuracy.report(
        _results())


def test_a_baseline_that_reached_the_target_gives_a_plain_ratio():
    results = _results()
    summary = time_to_accuracy.summarize(results, with_floors=False)
    speedup = _speedup(summary, "loopback", "threelc", "fp32")
    assert not speedup["at_least"]
    rows = {(r["link"], r["config"]): r for r in results["rows"]}
    assert speedup["ratio_of_totals"] == (rows[("loopback", "fp32")]["time_to_target_s"]
                                          / rows[("loopback", "threelc")]["time_to_target_s"])


def test_a_configuration_that_never_reached_the_target_has_no_ratio():
    summary = time_to_accuracy.summarize(_results(), with_floors=False)
    assert not [s for s in summary["speedups"] if s["config"] == "threelc-h16"]


def test_the_floors_are_never_beaten_by_the_committed_runs():
    results = copy.deepcopy(_results())
    time_to_accuracy.summarize(results)
    for row in results["rows"]:
        assert 0 < row["share_of_floor"] <= 1, (row["link"], row["config"])


def test_a_run_without_out_is_named_by_its_strategy_and_links():
    # The committed run's name, and the others' beside it in the same folder.
    assert os.path.samefile(time_to_accuracy.default_out("ps", ["loopback", "10mbit/25ms"]),
                            os.path.join(FOLDER, "ps_10mbit_50ms_rtt.json"))
    assert os.path.basename(time_to_accuracy.default_out("ps", ["loopback", "10mbit/25ms"])) \
        == "ps_10mbit_50ms_rtt.json"


def test_a_probed_run_is_estimated_from_its_own_configuration_s_loopback_run():
    results = _results()
    rows = {(r["link"], r["config"]): r for r in results["rows"]}
    probe = copy.deepcopy(rows[("100mbit/10ms", "bf16")])
    probe.update(link_probe=True, held_out=[])
    results["rows"] = [r for r in results["rows"]
                       if (r["link"], r["config"]) != ("100mbit/10ms", "bf16")] + [probe]
    summary = time_to_accuracy.summarize(results, with_floors=False)
    bf16_loopback = rows[("loopback", "bf16")]
    steps_to = next(h["step"] for h in bf16_loopback["held_out"]
                    if h["test_accuracy"] >= summary["target"])
    assert probe["estimated"] and probe["estimate_from"]["loopback_steps_to_target"] == steps_to
    assert probe["time_to_target_s"] == probe["first_epoch_s"] + (
        steps_to - results["log_every"]) * probe["step_time_s"]
    assert _speedup(summary, "100mbit/10ms", "threelc", "bf16")["against_estimated"]


def test_loopback_runs_are_reused_only_where_the_earlier_file_has_them():
    reused = time_to_accuracy._loopback_from(RAW, ["fp32", "threelc"], [0])
    assert [r["config"] for r in reused["rows"][0]] == ["fp32", "threelc"]
    assert all(r["link"] == "loopback" for r in reused["rows"][0])
    assert reused["floors"][0]["seed"] == 0
    with pytest.raises(SystemExit, match="no loopback run of seed 1"):
        time_to_accuracy._loopback_from(RAW, ["fp32"], [0, 1])
    with pytest.raises(SystemExit, match="powersgd"):
        time_to_accuracy._loopback_from(RAW, ["fp32", "powersgd"], [0])


def test_the_baselines_are_compared_with_tfgc_s_configurations_not_with_each_other():
    summary = time_to_accuracy.summarize(_results(), with_floors=False)
    assert summary["speedups"]
    assert not [s for s in summary["speedups"] if s["config"] in time_to_accuracy.BASELINES]


def test_a_probe_without_an_estimate_is_no_lower_limit():
    results = _results()
    rows = {(r["link"], r["config"]): r for r in results["rows"]}
    # bf16's loopback run never reaching the target leaves its probe without an estimate.
    rows[("loopback", "bf16")]["held_out"] = [
        dict(h, test_accuracy=0.1) for h in rows[("loopback", "bf16")]["held_out"]]
    rows[("100mbit/10ms", "bf16")]["link_probe"] = True
    summary = time_to_accuracy.summarize(results, with_floors=False)
    assert rows[("100mbit/10ms", "bf16")]["time_to_target_s"] is None
    assert not [s for s in summary["speedups"]
                if s["link"] == "100mbit/10ms" and s["against"] == "bf16"]
