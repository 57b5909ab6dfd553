"""benchmarks/mqgrad_experiment.py: its analysis helpers on made-up runs, its clock and
input file, and the options of measured runs."""
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tfgc import cluster, mqgrad

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PATH = os.path.join(REPO, "benchmarks", "mqgrad_experiment.py")
_spec = importlib.util.spec_from_file_location("mqgrad_experiment", _PATH)
experiment = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(experiment)


def made_up_run(method, steps, seed, fall_per_ms=1e-4):
    """A run dict as `run` writes it: noisy falling losses, varying iteration times."""
    rng = np.random.default_rng(seed)
    costs_ms = rng.uniform(50.0, 150.0, steps)
    time_s = np.cumsum(costs_ms) / 1000.0
    losses = 2.0 - fall_per_ms * 1000.0 * time_s + rng.normal(0.0, 0.05, steps)
    return {"method": method, "seed": seed, "time_s": time_s.tolist(), "loss": losses.tolist()}


def test_window_rewards_are_the_agents_own():
    run = made_up_run("Fix(4)", steps=101, seed=0)
    agent = mqgrad.MQGradAgent(T=5, reward_normalization="none", seed=0)
    costs_ms = 1000.0 * np.diff(np.concatenate([[0.0], run["time_s"]]))
    agents = []
    for loss, cost in zip(run["loss"], costs_ms):
        t = agent.t
        agent.observe(loss, cost)
        if agent.t > t and agent.last_step["reward"] is not None:
            agents.append((agent.smoothed, agent.last_step["reward"]))
    ours = experiment.window_rewards(run, T=5, alpha=agent.config["alpha"],
                                     reward_scale=agent.config["reward_scale"])
    assert len(ours) == len(agents) == 20
    np.testing.assert_allclose(ours, agents, rtol=1e-12)


def test_window_rewards_stop_at_a_divergence():
    run = made_up_run("Fix(2)", steps=101, seed=1)
    run["loss"][33] = float("nan")
    assert len(experiment.window_rewards(run, T=5, alpha=0.01, reward_scale=300.0)) == 6


def test_reward_noise_counts_the_windows_a_difference_needs():
    # Fix(4) lowers the loss three times as fast per millisecond as Fix(8): distinct
    # mean rewards, and a finite number of windows to tell them apart.
    runs = [made_up_run("Fix(4)", 400, seed, 1.5e-5) for seed in range(2)]
    runs += [made_up_run("Fix(8)", 400, seed, 0.5e-5) for seed in range(2)]
    runs.append({"method": "MQGrad", "seed": 0, "time_s": [1.0], "loss": [2.0]})  # ignored
    table = experiment.reward_noise(runs, [1.9, 1.5], T=5, alpha=0.01, reward_scale=300.0)
    lines = table.splitlines()
    assert lines[0].startswith("| smoothed loss | Fix(4) reward")
    assert "windows for Fix(4) vs Fix(8)" in lines[0] and "MQGrad" not in table
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines[2:]}
    assert set(rows) == {"| >= 1.9", "| [1.5, 1.9)"}
    fix4_mean = float(rows["| [1.5, 1.9)"][1].split(" +- ")[0])
    fix8_mean = float(rows["| [1.5, 1.9)"][2].split(" +- ")[0])
    assert fix4_mean > 2 * fix8_mean > 0
    assert int(rows["| [1.5, 1.9)"][3].rstrip(" |")) >= 0


@pytest.mark.parametrize("spec", ["Fix(3)", "Fix(7)", "MQGrad:T=10"])
def test_any_fixed_width_is_a_method(spec):
    assert experiment.parse_method(spec)[0] == spec.split(":")[0]


@pytest.mark.parametrize("spec", ["Fix(1)", "Fix(9)", "Fix(4):T=3", "Fix"])
def test_other_methods_are_refused(spec):
    with pytest.raises(ValueError):
        experiment.parse_method(spec)


def test_record_file_dataset_gives_back_the_images_and_labels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (7, 4, 4, 1)).astype(np.float32) / 255.0
    y = rng.integers(0, 10, 7).astype(np.int64)
    dataset = experiment.record_file_dataset(x, y, str(tmp_path / "train.bin"))
    pairs = [(image.numpy(), label.numpy()) for image, label in dataset]
    assert len(pairs) == 7
    np.testing.assert_array_equal(np.stack([p[0] for p in pairs]), x)
    np.testing.assert_array_equal([p[1] for p in pairs], y)
    assert pairs[0][1].dtype == np.int64


def test_a_measured_clock_starts_after_the_first_step_and_stops_at_the_budget():
    import tensorflow as tf
    import tf_keras

    import tfgc

    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    optimizer = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.1), tfgc.codecs.Quantize(bits=4), min_elements=1)
    model.compile(optimizer, "mse")

    class SlowSteps(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.05)

    clock = experiment.StepClock(optimizer, None, budget_s=0.3, dense_fraction_bytes=(0, 8))
    data = tf.data.Dataset.from_tensors((tf.ones((4, 3)), tf.zeros((4, 2)))).repeat()
    model.fit(data, steps_per_epoch=100, verbose=0, callbacks=[SlowSteps(), clock])
    times = [row[0] for row in clock.rows]
    assert times[0] == 0.0  # the first step (tracing) is not timed
    assert np.all(np.diff(times) > 0.04)  # each later step's real time
    assert times[-1] >= 0.3 > times[-2]  # stopped at the first step past the budget
    assert all(row[2] > 0 for row in clock.rows)  # bytes pushed every step


@pytest.mark.parametrize("argv, message", [
    (["--link", "10mbit", "--seeds", "0", "1", "--methods", "Fix(3)"], "one seed and one method"),
    (["--link", "10mbit", "--seeds", "0", "--methods", "Fix(3)", "Fix(4)"],
     "one seed and one method"),
    (["--link", "10 mbit", "--seeds", "0", "--methods", "Fix(3)"], "bandwidth must look like"),
])
def test_measured_runs_refuse_what_they_cannot_run(argv, message, capsys):
    with pytest.raises(SystemExit):
        experiment.main(argv)
    assert message in capsys.readouterr().err


def test_a_replicate_of_a_fixed_width_is_measured_against_the_fixed_widths():
    assert experiment.replicate_label("Fix(3)", 0) == "Fix(3)"
    label = experiment.replicate_label("Fix(3)", 1)
    assert label == "Fix(3), replicate 1"
    runs = [made_up_run("Fix(3)", 300, seed=0, fall_per_ms=4e-5),
            made_up_run("Fix(4)", 300, seed=1, fall_per_ms=2e-5),
            made_up_run(label, 300, seed=2, fall_per_ms=3e-5)]
    for run in runs:
        run["seed"] = 0
    lines = experiment.against_best_fixed(runs, [1.5])
    assert len(lines) == 1 and lines[0].startswith(f"- {label} against the fastest of Fix(3), Fix(4)")
    assert "within 5% in 0 of 1" in lines[0]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.skipif(cluster.emulation_unavailable() is not None,
                    reason=str(cluster.emulation_unavailable()))
def test_a_measured_run_trains_on_a_shaped_cluster(tmp_path):
    # A child process: ParameterServerStrategy changes the eager context of its process.
    out = tmp_path / "fix3"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.mqgrad_experiment", "--link", "100mbit",
         "--budget-s", "4", "--dataset", "digits",
         "--limit", "512", "--test-limit", "64", "--seeds", "0", "--methods", "Fix(3)",
         "--loss-targets", "2.0", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-4000:]
    with open(f"{out}.json") as f:
        saved = json.load(f)
    assert saved["args"]["link"] == "100mbit"
    result = saved["results"][0]
    times = result["time_s"]
    assert times[0] == 0.0 and times[-1] >= 4.0 > times[-2] and result["steps"] >= 5
    np.testing.assert_allclose(result["bits"], 3.0, atol=0.01)  # what crossed: 3 bits
    # Pulls compressed (3LC): under a byte per value of the quantized layers, where fp32
    # pulls would take four, plus the small tensors in float16 as the pushes send them.
    assert 0 < result["pull_bytes_per_step"] < (
        result["compressed_values"] + 1.1 * result["uncompressed_bytes"])


def test_combining_runs_writes_beside_them_not_over_the_recorded_plot(tmp_path, monkeypatch):
    run = made_up_run("Fix(4)", 200, seed=0)
    run.update(steps=200, bits=[4.0] * 200, test_accuracy=0.5)
    saved = tmp_path / "runs.json"
    saved.write_text(json.dumps({
        "dataset": "made up", "results": [run],
        "args": {"budget_s": 20.0, "bandwidth": 1e7, "compute_ms": 30.0}}))
    recorded = experiment.RECORDED + ".png"

    def stamp():
        return os.stat(recorded).st_mtime_ns if os.path.exists(recorded) else None

    before = stamp()
    monkeypatch.chdir(tmp_path)
    experiment.main(["--combine", str(saved), "--loss-targets", "1.5"])
    assert (tmp_path / "mqgrad_combined.png").stat().st_size > 1000
    assert stamp() == before
