"""A diverged run stops with its own exit code, and the defaults train every model.

The CLI runs are child processes (`python -m models.train`), as users run them.
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from models import divergence, supervise, train_args, workloads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A model and data small enough for a few seconds of training; --lr 1e6 makes the loss
# NaN within a few steps.
TINY = ["--model", "resnet8", "--dataset", "digits", "--train-limit", "256",
        "--test-limit", "64", "--batch-size", "16", "--no-tensorboard"]
HUGE_LR = ["--lr", "1e6", "--no-augment"]


def run_cli(args, out, timeout):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-m", "models.train", *args, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def read_history(out):
    with open(out / "history.csv") as f:
        return [{"step": int(row["step"]), "loss": float(row["loss"])}
                for row in csv.DictReader(f)]


def test_message_names_the_model_step_and_learning_rate():
    message = divergence.describe("mqgrad_cnn", float("nan"), 80, 1, 2, 0.1, 0.2, "mwms")
    assert message.startswith("mqgrad_cnn diverged: the training loss is nan at step 80 ")
    assert "(epoch 2 of 2)" in message and "--strategy mwms" in message
    assert "--lr 0.1 (0.2 after scaling by the replicas)" in message
    assert message.endswith("retry with a lower --lr, e.g. --lr 0.01")
    # Unscaled, the learning rate is given once.
    assert "scaling" not in divergence.describe("svm", math.inf, 5, 0, 1, 0.01, 0.01, "ps")


@pytest.mark.parametrize("per_batch", [True, False])
def test_callback_raises_at_the_first_non_finite_loss(per_batch):
    callback = divergence.stop_on_divergence("resnet20", 10, 3, 0.1, 0.1, "local", per_batch)
    # tf_keras refuses batch hooks under ParameterServerStrategy (per_batch=False).
    assert callback._implements_train_batch_hooks() is per_batch
    callback.on_epoch_begin(1)
    callback.on_train_batch_end(0, {"loss": np.float32(2.5)})
    callback.on_train_batch_end(1, None)
    if per_batch:
        with pytest.raises(divergence.Diverged, match="loss is inf at step 13 "):
            callback.on_train_batch_end(2, {"loss": np.float32(np.inf)})
    callback.on_epoch_end(1, {"loss": 2.5, "accuracy": float("nan")})  # only the loss counts
    with pytest.raises(divergence.Diverged, match=r"loss is nan at step 20 \(epoch 2 of 3\)"):
        callback.on_epoch_end(1, {"loss": float("nan")})


def test_supervisor_does_not_restart_a_diverged_attempt(tmp_path, monkeypatch):
    started = []

    class Attempt:
        def __init__(self, command, **kwargs):
            started.append(command)

        def wait(self):
            return divergence.EXIT_DIVERGED

    monkeypatch.setattr(supervise.subprocess, "Popen", Attempt)
    assert supervise.run_with_restarts(["--strategy", "ps"], str(tmp_path), 3) == (
        divergence.EXIT_DIVERGED)
    assert len(started) == 1
    assert divergence.EXIT_DIVERGED not in (0, 1, 2, supervise.EXIT_TASK_LOST)


def test_exit_codes_are_in_the_help():
    text = " ".join(train_args.build_parser().format_help().split())
    assert f"{divergence.EXIT_DIVERGED} when the training loss became NaN or infinite" in text
    assert f"{supervise.EXIT_TASK_LOST} when a task" in text


def test_default_learning_rates_per_model():
    assert workloads.default_lr("resnet20") == workloads.default_lr("resnet110") == 0.1
    assert workloads.default_lr("mqgrad_cnn") == 0.01
    assert workloads.default_lr("logistic") == workloads.default_lr("svm") == 0.01


@pytest.mark.parametrize("model, first, at_400, last", [
    ("resnet8", 0.1, None, 0.001),
    ("resnet20", 0.1, None, 0.001),
    ("mqgrad_cnn", 0.01, None, 0.001),
    # He et al.'s warm-up: from a tenth, the full rate after 400 steps, then the decay.
    ("resnet32", 0.01, 0.1, 0.001),
    ("resnet110", 0.01, 0.1, 0.001),
])
def test_image_learning_rate_schedules(model, first, at_400, last):
    args = argparse.Namespace(model=model, lr=workloads.default_lr(model), lr_final=0.001,
                              momentum=0.9, optimizer="sgd")
    workload = object.__new__(workloads.ImageWorkload)  # no data needed
    workload.args = args
    # tf_keras keeps the schedule there (`learning_rate` reads its current value).
    schedule = workload.inner_optimizer(args.lr, 1000)._learning_rate
    assert float(schedule(0)) == pytest.approx(first)
    if at_400 is not None:
        assert float(schedule(200)) == pytest.approx((first + at_400) / 2)
        assert float(schedule(400)) == pytest.approx(at_400)
    assert float(schedule(1000)) == pytest.approx(last)


def test_image_models_take_adam_on_the_cosine_schedule():
    args = argparse.Namespace(model="resnet20", lr=0.001, lr_final=1e-5, momentum=0.9,
                              optimizer="adam")
    workload = object.__new__(workloads.ImageWorkload)
    workload.args = args
    optimizer = workload.inner_optimizer(args.lr, 1000)
    assert type(optimizer).__name__ == "Adam"
    assert float(optimizer._learning_rate(0)) == pytest.approx(0.001)
    assert float(optimizer._learning_rate(1000)) == pytest.approx(1e-5)


@pytest.mark.slow
def test_a_diverged_run_stops_with_its_exit_code(tmp_path):
    out = tmp_path / "run"
    done = run_cli([*TINY, *HUGE_LR, "--steps", "40", "--log-every", "10"], out, 300)
    assert done.returncode == divergence.EXIT_DIVERGED, done.stderr[-4000:]
    assert "[models.train] resnet8 diverged: the training loss is " in done.stderr
    assert "with learning rate --lr 1e+06. Stopped; retry with a lower --lr" in done.stderr
    # Stopped at the step whose loss was the first non-finite one, before testing.
    rows = read_history(out)
    assert len(rows) < 40 and not np.isfinite(rows[-1]["loss"])
    assert np.all(np.isfinite([r["loss"] for r in rows[:-1]]))
    assert f"at step {rows[-1]['step']} " in done.stderr
    assert not (out / "summary.json").exists() and "test accuracy" not in done.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_a_diverged_parameter_server_run_is_not_restarted(tmp_path):
    out = tmp_path / "run"
    done = run_cli([*TINY, *HUGE_LR, "--strategy", "ps", "--workers", "1", "--steps", "16",
                    "--log-every", "2", "--compression", "threelc", "--backup-every-s", "0",
                    "--timeout", "200"], out, 240)
    assert done.returncode == divergence.EXIT_DIVERGED, done.stderr[-4000:]
    assert "resnet8 diverged: the training loss is " in done.stderr
    assert "under --strategy ps" in done.stderr
    assert "not restarting" in done.stderr and "restarting the cluster" not in done.stderr
    # Checked at the end of each Keras epoch: the first one whose loss is not finite.
    rows = read_history(out)
    assert len(rows) < 8 and not np.isfinite(rows[-1]["loss"])
    assert f"at step {rows[-1]['step']} " in done.stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_a_diverged_multi_worker_mirrored_run_stops(tmp_path):
    out = tmp_path / "run"
    done = run_cli([*TINY, *HUGE_LR, "--strategy", "mwms", "--workers", "2", "--steps", "40",
                    "--log-every", "10", "--timeout", "200"], out, 240)
    assert done.returncode == divergence.EXIT_DIVERGED, done.stderr[-4000:]
    assert "MWMS worker " in done.stderr and "resnet8 diverged: " in done.stderr
    assert "--lr 1e+06 (2e+06 after scaling by the replicas)" in done.stderr


@pytest.mark.slow
def test_mqgrad_cnn_trains_at_its_default_learning_rate(tmp_path):
    # At 0.1, the default before it had its own, the loss fell only through the L2 term
    # (~22 of the first 24.5) while accuracy stayed at chance.
    out = tmp_path / "run"
    done = run_cli(["--model", "mqgrad_cnn", "--dataset", "digits", "--train-limit", "1024",
                    "--test-limit", "256", "--steps", "60", "--log-every", "10",
                    "--no-tensorboard"], out, 300)
    assert done.returncode == 0, done.stderr[-4000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    assert summary["lr"] == 0.01
    losses = [r["loss"] for r in read_history(out)]
    assert np.all(np.isfinite(losses)) and np.mean(losses[-10:]) < np.mean(losses[:10])
    assert summary["test_accuracy"] > 0.5
