"""The analysis helpers of benchmarks/mqgrad_experiment.py, on made-up runs."""
import importlib.util
import os

import numpy as np
import pytest

from tfgc import mqgrad

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "mqgrad_experiment.py")
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
