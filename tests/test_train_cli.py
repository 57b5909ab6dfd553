"""The training CLI: compression specs, plots, and tiny bounded runs of every strategy.

Each run is a child process (`python -m models.train`), as users run it: PSS changes the
eager context of the process that creates it, and mwms starts worker processes.
"""
import argparse
import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from models import plots, train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# No --verbose: the default must suit every strategy (tf_keras refuses a progress bar
# under parameter servers).
TINY = ["--model", "resnet8", "--dataset", "digits", "--train-limit", "256",
        "--test-limit", "64", "--batch-size", "16"]


def run_cli(args, tmp_path, timeout):
    out = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-m", "models.train", *TINY, *args, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert (out / "plot.png").stat().st_size > 1000
    return summary, rows, done


def test_parse_compression():
    import tfgc

    codec = train.parse_compression("threelc:sparsity=1.75")
    assert isinstance(codec, tfgc.codecs.ThreeLC) and codec.get_config()["sparsity"] == 1.75
    assert isinstance(train.parse_compression("none"), tfgc.codecs.NoCompression)
    assert isinstance(train.parse_compression("int8"), tfgc.codecs.Int8)
    assert train.parse_compression("quantize:bits=4").get_config()["bits"] == 4
    assert train.parse_compression("fp16").get_config()["dtype"] == "float16"
    assert isinstance(train.parse_compression("Top_K:ratio=0.1"), tfgc.codecs.TopK)
    with pytest.raises(ValueError, match="unknown compression"):
        train.parse_compression("gzip")
    with pytest.raises(ValueError, match="key=value"):
        train.parse_compression("threelc:1.5")
    with pytest.raises(ValueError, match="bad arguments"):
        train.parse_compression("threelc:bits=3")


def test_sgd_momentum_moves_into_a_codec_that_applies_it():
    from models.train_args import default_momentum

    assert default_momentum("threelc:sparsity=1.0") == default_momentum("none") == 0.9
    assert default_momentum("signum:momentum=0.8") == 0.0


@pytest.mark.parametrize("given, lr, lr_final", [
    ([], 0.1, 0.001),
    (["--optimizer", "sgd", "--lr", "0.05"], 0.05, 0.001),
    (["--optimizer", "adam"], 0.001, 1e-5),
    (["--optimizer", "adam", "--lr", "0.002", "--lr-final", "0.0001"], 0.002, 0.0001),
])
def test_optimizer_and_its_learning_rates_default(given, lr, lr_final):
    from models.train_args import build_parser, fill_optimizer_defaults

    args = build_parser().parse_args(given)
    fill_optimizer_defaults(args)
    assert args.optimizer == (given[1] if given else "sgd")
    assert (args.lr, args.lr_final) == (lr, lr_final)


def test_meetings_average_by_default_under_parameter_servers():
    # Nesterov meetings, each worker's an outer step of its own there, did not train
    # ResNet-20 (the local-steps results page); DiLoCo's Nesterov elsewhere.
    from models.train_args import default_outer_optimizer

    assert default_outer_optimizer("ps") == "average"
    assert default_outer_optimizer("mwms") == default_outer_optimizer("local") == "nesterov"
    assert train.parse_compression("signum:momentum=0.8").momentum == 0.8


class _TaskSeenDeadLate:
    """A cluster whose dead task becomes visible only at the `visible_at`-th look, as a
    killed server's parent can reap it only after its sockets have already closed."""

    def __init__(self, visible_at):
        self.visible_at, self.looks = visible_at, 0

    def check_alive(self):
        from tfgc import cluster as cluster_lib

        self.looks += 1
        if self.looks >= self.visible_at:
            raise cluster_lib.ClusterError("/job:ps/task:0 exited with code -9\nlog tail")


def test_a_failed_step_waits_for_a_dying_task_to_become_visible():
    assert train._dead_task(_TaskSeenDeadLate(3), grace_s=5.0) == (
        "/job:ps/task:0 exited with code -9")
    # With every task alive, it gives up after the grace period, having looked again.
    alive = _TaskSeenDeadLate(visible_at=10**9)
    assert train._dead_task(alive, grace_s=0.3) is None and alive.looks >= 2
    assert train._dead_task(None) is None


def test_demo_table_gives_each_first_epoch_against_fp32s():
    from models import cluster_demo

    fp32 = {"link": "loopback", "compression": "none", "test_accuracy": 0.5,
            "final_train_loss": 1.0, "socket_worker_to_ps_bytes_per_step": 1e6,
            "socket_ps_to_worker_bytes_per_step": 1e6, "payload_ratio": 1.0,
            "step_time_s": 0.4, "train_time_s": 50, "first_epoch_s": 8.0}
    threelc = dict(fp32, compression="threelc", first_epoch_s=10.0, pull_payload_ratio=20.0)
    unknown = {k: v for k, v in threelc.items() if k != "first_epoch_s"}  # an older summary
    rows = cluster_demo.results_table([fp32, threelc, unknown]).splitlines()[2:]
    column = rows[0].split(" | ").index("8.0 (1.00x)")
    assert [row.split(" | ")[column] for row in rows] == ["8.0 (1.00x)", "10.0 (1.25x)", "-"]


def test_demo_times_each_link_to_a_test_accuracy_of_fp32s_on_loopback():
    from models import cluster_demo

    def run(link, compression, accuracies, seconds_per_test, final=None):
        tests = [{"step": 10 * (i + 1), "time_s": seconds_per_test * (i + 1),
                  "test_accuracy": a} for i, a in enumerate(accuracies)]
        return {"link": link, "compression": compression, "held_out": tests,
                "test_accuracy": accuracies[-1] if final is None else final}

    runs = [run("loopback", "none", [0.5, 0.8], 1.0),
            run("10mbit", "none", [0.2, 0.5, 0.8, 0.9], 10.0),
            run("10mbit", "threelc", [0.2, 0.7, 0.77, 0.6], 2.0),
            run("10mbit", "threelc@4", [0.2, 0.3], 1.0)]
    # The target is 95% of fp32's final test accuracy on loopback: 0.76. On 10mbit fp32
    # reaches it at its third test (30 s), threelc at its third (6 s); a run that never
    # does says so, and its best is no target.
    target, times = cluster_demo.time_to_test_accuracy(runs)
    assert target == pytest.approx(0.76) and times == [2.0, 30.0, 6.0, None]
    lines = cluster_demo.accuracy_lines(runs)
    assert lines[0].startswith("loopback: time to a test accuracy of 0.760")
    assert lines[1].endswith("none 30 s, threelc 6 s (5.0x sooner), threelc@4 not reached.")


def test_demo_pulls_use_their_own_codec_only_in_compressed_runs():
    from models import cluster_demo

    def pulls(compression, pulls=True, pull_compression=None):
        options = argparse.Namespace(pulls=pulls, pull_compression=pull_compression)
        return cluster_demo.pull_compression_of(compression, options)

    s175, s1 = "threelc:sparsity=1.75", "threelc:sparsity=1.0"
    assert pulls(s175) == s175
    assert pulls(s175, pull_compression=s1) == s1
    assert pulls("none", pull_compression=s1) == "none"
    assert pulls(s175, pulls=False) == "none"
    with pytest.raises(SystemExit):
        cluster_demo.main(["--no-pulls", "--pull-compression", s1])
    row = {"link": "loopback", "compression": s175, "pull_compression": s1,
           "test_accuracy": 0.5, "final_train_loss": 1.0,
           "socket_worker_to_ps_bytes_per_step": 1e6, "socket_ps_to_worker_bytes_per_step": 1e6,
           "payload_ratio": 1.0, "step_time_s": 0.4, "train_time_s": 50}
    label = cluster_demo.results_table([row]).splitlines()[2].split(" | ")[1]
    assert label == f"{s175}, pulls {s1}"


def test_demo_runs_local_steps_as_codec_at_h_and_labels_them(capsys):
    from models import cluster_demo

    assert cluster_demo.split_run("threelc:sparsity=1.0@4") == ("threelc:sparsity=1.0", 4)
    assert cluster_demo.split_run("none") == ("none", 1)
    for bad in ("threelc@0", "threelc@x", "threelc@"):
        with pytest.raises(ValueError, match="positive integer"):
            cluster_demo.split_run(bad)
    with pytest.raises(SystemExit):  # local steps need pulls
        cluster_demo.main(["--compressions", "none", "threelc@4", "--no-pulls"])
    assert "need pulls" in capsys.readouterr().err

    def row(local_steps, step_time, outer=None):
        return {"link": "loopback", "compression": "threelc", "local_steps": local_steps,
                "outer_optimizer": outer, "test_accuracy": 0.5, "final_train_loss": 1.0,
                "socket_worker_to_ps_bytes_per_step": 1e5 / local_steps,
                "socket_ps_to_worker_bytes_per_step": 1e5, "payload_ratio": 30.0,
                "step_time_s": step_time, "train_time_s": 50}

    average = {"learning_rate": 1.0, "momentum": 0.0, "nesterov": False}
    lines = cluster_demo.results_table([row(1, 0.4), row(4, 0.2, average)]).splitlines()
    cells = [line.split(" | ") for line in lines[2:]]
    assert cells[1][1] == "threelc, 4 local steps (averaging)"
    # The first run is the base, not the other run of the same codec.
    assert cells[1][6] == "4.0x" and cells[1][-1] == "2.0x |"
    lines = cluster_demo.floor_lines([row(1, 0.4), row(4, 0.2, average)],
                                     compute_floor=0.1, workers=2)
    assert lines[1] == ("loopback, threelc, 4 local steps (averaging): 0.200 s per step; "
                        "floors: compute 0.100 s; 50% of the higher floor.")
    # 1mbit/50ms: the server's link sends 1e5 B per step (0.8 s at 1 Mbit/s), plus
    # 1/(2 workers x 4 local steps) of a 100 ms round trip.
    on_link = [dict(r, link="1mbit/50ms", step_time_s=t)
               for r, t in ((row(1, 0.4), 1.0), (row(4, 0.2, average), 0.9))]
    last = cluster_demo.floor_lines([row(1, 0.4), *on_link], 0.1, 2)[-1]
    assert last == ("1mbit/50ms, threelc, 4 local steps (averaging): 0.900 s per step; "
                    "floors: compute 0.100 s, link 0.812 s (100,000 B per step on the "
                    "busiest link + 0.125 round trips x 100 ms); 90% of the higher floor; "
                    "1.1x faster steps than threelc, of at most 10.0x for a codec that "
                    "sent nothing.")


def test_demo_counts_bytes_per_step_after_the_first_epoch():
    from models import cluster_demo

    def run(compression, local_steps, first_epoch, per_step):
        # 3 epochs of 10 steps; the first also carries what a run sends once.
        totals = [0, first_epoch, first_epoch + 10 * per_step, first_epoch + 20 * per_step]
        return {"link": "loopback", "compression": compression, "local_steps": local_steps,
                "outer_optimizer": {"learning_rate": 1.0, "momentum": 0.0},
                "socket_bytes": [{"step": 10 * i, "worker_to_ps": t, "ps_to_worker": t // 2}
                                 for i, t in enumerate(totals)]}

    runs = [run("none", 1, 10**6, 8000), run("threelc", 1, 10**6, 4000),
            run("threelc", 4, 2 * 10**6, 1000)]
    # The coordinator's calls, recorded by newer runs: 9,000 B per step after 3 MB.
    for row, total in zip(runs[2]["socket_bytes"], [0, 3 * 10**6, 3 * 10**6 + 90000,
                                                      3 * 10**6 + 180000]):
        row["chief_to_worker"] = total
    assert cluster_demo.steady_coordinator_bytes(runs[2]) == 9000.0
    assert cluster_demo.steady_coordinator_bytes(runs[1]) is None
    assert cluster_demo.steady_bytes(runs[2]) == (1000.0, 500.0)
    assert cluster_demo.steady_bytes({"socket_bytes": runs[2]["socket_bytes"][:2]}) is None
    lines = cluster_demo.steady_bytes_lines(runs)
    assert lines[0] == "loopback, none: after the first epoch 8,000 B per step to the servers, 4,000 B back."
    assert lines[2] == (
        "loopback, threelc, 4 local steps (averaging): after the first epoch 1,000 B per step "
        "to the servers, 500 B back (8.0x and 8.0x fewer than the first run; 4.0x and 4.0x "
        "fewer than synchronous); 9,000 B per step from the coordinator to the workers.")


def test_backups_are_saved_once_the_interval_has_passed(tmp_path):
    from models import supervise

    now = [0.0]
    restore, save = supervise.backup_callbacks(str(tmp_path), every_s=60.0,
                                               clock=lambda: now[0])
    saved = []
    restore.save = lambda epoch, logs: saved.append(epoch)
    save.on_train_begin()
    for epoch, ends_at in enumerate([10, 59, 60, 100, 119, 121, 200]):
        now[0] = ends_at
        save.on_epoch_end(epoch)
    # The first epoch ending >= 60 s after the start, then >= 60 s after each save.
    assert saved == [2, 5, 6]
    paused = []
    every = supervise.backup_callbacks(str(tmp_path), every_s=0.0, clock=lambda: now[0],
                                       pause=lambda began, seconds: paused.append((began, seconds)))
    saved = []

    def save_taking_2_s(epoch, logs):
        saved.append(epoch)
        now[0] += 2

    every[0].save = save_taking_2_s
    every[1].on_train_begin()
    for epoch in range(3):
        every[1].on_epoch_end(epoch)
    assert saved == [0, 1, 2]
    # Each save is told, to be taken off the run's clock.
    assert paused == [(200, 2), (202, 2), (204, 2)]
    with pytest.raises(ValueError, match="every_s"):
        supervise.backup_callbacks(str(tmp_path), every_s=-1)


def test_parser_rejects_bad_compression(capsys):
    with pytest.raises(SystemExit):
        train.main(["--compression", "nope"])
    assert "unknown compression" in capsys.readouterr().err


def test_parser_rejects_what_a_model_cannot_do(capsys):
    with pytest.raises(SystemExit):
        train.main(["--model", "resnet7x"])
    assert "unknown model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--model", "logistic", "--pull-compression", "threelc"])
    assert "--pull-compression applies to the image models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--model", "logistic", "--optimizer", "adam"])
    assert "--optimizer applies to the image models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--strategy", "ps", "--local-steps", "4"])
    assert "caches of compressed pulls: give --pull-compression" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--local-steps", "4", "--pull-compression", "threelc"])
    assert "in one process is not built yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--strategy", "mwms", "--steps-per-execution", "4"])
    assert "--steps-per-execution > 1 is built for --strategy ps only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--strategy", "ps", "--steps-per-execution", "0"])
    assert "--steps-per-execution must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("arguments, message", [
    (["--compression", "threelc", "--mqgrad"], "picks the bits of a Quantize codec"),
    (["--compression", "quantize", "--mqgrad", "seed=3"], "seed from --seed"),
    (["--compression", "quantize", "--mqgrad", "initial_bits=9"], "bad --mqgrad arguments"),
    (["--compression", "quantize", "--mqgrad", "T"], "is not key=value"),
])
def test_parser_rejects_bad_mqgrad_use(arguments, message, capsys):
    with pytest.raises(SystemExit):
        train.main(arguments)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_mqgrad_local_run(tmp_path):
    # T=2 and epsilon=0.5: the bits change within 12 steps. One step per Keras epoch, so
    # that each history row holds one step's push.
    summary, rows, _ = run_cli(["--strategy", "local", "--steps", "12", "--log-every", "1",
                                "--compression", "quantize", "--mqgrad", "T=2,epsilon=0.5"],
                               tmp_path, 300)
    report = summary["mqgrad"]
    assert report["agent"]["T"] == 2 and report["mdp_steps"] == 6
    changes = report["bits_changes"]
    assert changes[0] == [0, 2] and len(changes) > 1
    assert summary["codec"] == {"class_name": "Quantize", "config": {"bits": 2}}
    bits = [bits for (start, bits), (end, _) in zip(changes, changes[1:] + [[12, None]])
            for _ in range(start, end)]
    assert len(bits) == 12 and report["mean_bits"] == pytest.approx(np.mean(bits))
    # Each step pushed the payload of the bits the agent had chosen before it.
    pushed = {}
    for used, row in zip(bits, rows):
        pushed.setdefault(used, set()).add(float(row["push_bytes"]))
    assert all(len(sizes) == 1 for sizes in pushed.values())
    by_bits = [pushed[b].pop() for b in sorted(pushed)]
    assert by_bits == sorted(by_bits) and len(set(by_bits)) == len(by_bits)


def test_plot_overlays_runs(tmp_path):
    for name, loss in (("a", 2.0), ("b", 1.5)):
        run = tmp_path / name
        run.mkdir()
        with open(run / "history.csv", "w") as f:
            f.write("step,time_s,loss,accuracy,push_bytes,push_dense_bytes\n")
            for step in range(1, 6):
                f.write(f"{step},{step * 0.5},{loss / step},{0.1 * step},10,100\n")
        (run / "summary.json").write_text(json.dumps(
            {"compression": name, "strategy": "local", "test_accuracy": 0.5,
             "dataset": "fashion_mnist", "substitute_for": "cifar10"}))
    png = plots.plot_runs([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "c.png"))
    assert os.path.getsize(png) > 1000
    label, rows = plots.read_run(str(tmp_path / "a"))
    assert label.startswith("a (local)") and rows[-1]["step"] == 5.0


@pytest.mark.slow
def test_local_run(tmp_path):
    summary, rows, _ = run_cli(["--strategy", "local", "--steps", "4", "--log-every", "2",
                                "--compression", "threelc:sparsity=1.75"], tmp_path, 300)
    assert summary["dataset"] == "digits" and summary["substitute_for"] is None
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert summary["payload_ratio"] > 10
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert os.listdir(tmp_path / "run" / "tensorboard")


@pytest.mark.slow
def test_local_steps_run_pushes_at_meetings(tmp_path):
    summary, rows, _ = run_cli(["--strategy", "local", "--steps", "8", "--log-every", "4",
                                "--compression", "threelc", "--local-steps", "4",
                                "--outer-optimizer", "average"], tmp_path, 300)
    assert summary["local_steps"] == 4 and summary["outer_optimizer"]["momentum"] == 0.0
    # Each epoch of 4 steps ends with a meeting, which sends the pseudo-gradients of the
    # whole model: per step, a quarter of the model's fp32 bytes, compressed.
    ends = [r for r in rows if r["push_bytes"] != ""]
    assert [int(r["step"]) for r in ends] == [4, 8]
    for row in ends:
        dense = float(row["push_dense_bytes"])
        # 4 fp32 bytes per parameter over 4 steps (the batch-norm statistics, 0.6% of
        # the parameters, are not trained).
        assert dense == pytest.approx(summary["parameters"], rel=0.01)
        assert 0 < float(row["push_bytes"]) < dense / 10
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    # Tested with batch-norm statistics recomputed for the averaged weights, and with
    # those training kept.
    assert summary["recomputed_statistics_batches"] == 10
    assert 0.0 <= summary["test_accuracy_kept_statistics"] <= 1.0


@pytest.mark.slow
def test_sparse_model_local_run(tmp_path):
    # FastSGD's logistic regression on hashed Reuters text, Adam at its 0.01.
    summary, rows, _ = run_cli(["--model", "logistic", "--dataset", "reuters_corn",
                                "--strategy", "local", "--steps", "20", "--log-every", "10",
                                "--batch-size", "128", "--compression", "fastsgd"],
                               tmp_path, 300)
    assert summary["dataset"] == "ReutersCorn-train.arff"
    assert summary["parameters"] == 2**20 + 1 and summary["num_features"] == 2**20
    assert summary["lr"] == 0.01 and summary["error_feedback"] is False
    # The sparse gradient's keys and values, not the dense [2^20] tensor.
    assert summary["payload_ratio"] > 100
    losses = [float(r["loss"]) for r in rows]
    assert len(losses) == 20 and np.mean(losses[-5:]) < np.mean(losses[:5])
    assert 0.5 <= summary["test_accuracy"] <= 1.0


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_run(tmp_path):
    # All of digits' training set (1,437 images of 32x32x3: 4.4 MB).
    summary, rows, _ = run_cli(["--strategy", "ps", "--workers", "2", "--steps", "4",
                                "--log-every", "2", "--compression", "threelc",
                                "--train-limit", "1437", "--timeout", "280",
                                "--eval-every", "1"], tmp_path, 300)
    assert [int(r["step"]) for r in rows] == [2, 4]  # one row per Keras epoch under PSS
    # Tested during fit on the coordinator (not as closures on the workers), at the
    # epochs' ends of the training clock; the last test is the final one's weights.
    tests = summary["held_out"]
    assert [t["step"] for t in tests] == [2, 4] and summary["held_out_statistics"] == "kept"
    assert [t["time_s"] for t in tests] == [float(r["time_s"]) for r in rows]
    assert tests[-1]["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    # Real sockets: the workers pushed and pulled; pulls are fp32, pushes compressed.
    up, down = summary["socket_worker_to_ps_bytes_per_step"], summary["socket_ps_to_worker_bytes_per_step"]
    assert up > summary["push_bytes_per_step"] > 0
    assert down > summary["push_dense_bytes_per_step"] > up
    assert summary["workers"] == 2 and summary["ps"] == 1
    # The workers read the images from a file: the coordinator sent them the step's
    # functions (1.6 MB) but not the training set, which made it 10.4 MB (a copy each).
    assert summary["socket_chief_to_worker_bytes"] < 1437 * 32 * 32 * 3
    assert not (tmp_path / "run" / "train.records").exists()
    # Training time ends with the last step; fit's teardown after it is kept apart.
    assert float(rows[-1]["time_s"]) <= summary["train_time_s"] and summary["fit_teardown_s"] >= 0


@pytest.mark.cluster
@pytest.mark.slow
def test_multi_worker_mirrored_run(tmp_path):
    summary, rows, done = run_cli(["--strategy", "mwms", "--workers", "2", "--steps", "2",
                                   "--log-every", "2", "--compression", "none",
                                   "--recompute-statistics", "3", "--timeout", "280",
                                   "--eval-every", "1"],
                                  tmp_path, 300)
    assert [t["step"] for t in summary["held_out"]] == [2]
    assert summary["held_out_statistics"] == "recomputed"
    assert summary["strategy"] == "mwms" and summary["lr_scaled"] == pytest.approx(0.2)
    assert [int(r["step"]) for r in rows] == [1, 2]
    # Tested on a copy of the weights, with the statistics training kept and recomputed.
    assert summary["recomputed_statistics_batches"] == 3
    assert 0.0 <= summary["test_accuracy_kept_statistics"] <= 1.0
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert "MultiWorkerMirroredStrategy workers" in done.stderr


def _servers_of_job(job, ancestor):
    """Pids of the `tfgc._server --job <job>` processes that descend from `ancestor`."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue

    def descends(pid):
        while pid in parents and pid > 1:
            pid = parents[pid]
            if pid == ancestor:
                return True
        return False

    return [pid for pid, argv in commands.items()
            if b"tfgc._server" in argv and b"--job" in argv
            and argv[argv.index(b"--job") + 1] == job.encode() and descends(pid)]


def _backup_written(backup_dir):
    """Whether a finished checkpoint index lies under `backup_dir`.

    The checkpoint writer renames its `*_temp` directories while this looks, so the
    walk skips directories that vanish (os.walk ignores scandir errors) and counts
    only indexes outside them.
    """
    for dirpath, _, filenames in os.walk(backup_dir):
        if not any(part.endswith("_temp") for part in pathlib.Path(dirpath).parts):
            if any(name.endswith(".index") for name in filenames):
                return True
    return False


def _train_and_kill(out, args, ready, job, expected):
    """Runs `models.train` with `args` (output in `out`), SIGKILLs one server of `job`
    (of `expected`) once `ready()`, and returns the run's (return code, stderr)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "models.train", *TINY, "--strategy", "ps", *args,
         "--timeout", "280", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not ready():
            assert proc.poll() is None, proc.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the run was never ready to be hit"
            time.sleep(0.2)
        victims = _servers_of_job(job, proc.pid)
        assert len(victims) == expected, victims
        os.kill(victims[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=280)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, stderr


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_run_resumes_after_the_ps_dies(tmp_path):
    # The parameter server is killed (SIGKILL) once a backup exists; the run restarts
    # its cluster, resumes from the backup and completes every requested step.
    out = tmp_path / "run"
    returncode, stderr = _train_and_kill(
        out, ["--workers", "1", "--steps", "24", "--log-every", "4", "--compression",
              "threelc", "--pull-compression", "threelc", "--backup-every-s", "0"],
        lambda: _backup_written(out / "backup"), "ps", 1)
    assert returncode == 0, stderr[-4000:]
    assert "resuming from the last backup (restart 1 of 3)" in stderr
    with open(out / "summary.json") as f:
        summary = json.load(f)
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert summary["steps"] == 24 and summary["test_accuracy"] is not None
    # One row per Keras epoch, each written once, across both attempts.
    assert [int(r["step"]) for r in rows] == [4, 8, 12, 16, 20, 24]
    assert all(np.isfinite(float(r["loss"])) for r in rows)
    # The byte counters were restored with the model: each of the 24 steps counted once.
    assert summary["push_dense_bytes_per_step"] == pytest.approx(float(rows[0]["push_dense_bytes"]))
    assert not (out / "backup").exists()  # removed once the run completed


def _rows_written(out):
    """How many history rows the run's attempt has written so far."""
    try:
        with open(out / "history-attempts.jsonl") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


@pytest.mark.cluster
@pytest.mark.slow
def test_a_lost_worker_is_said_aloud_and_recorded(tmp_path):
    # ParameterServerStrategy finishes on the other worker; the run says which it lost.
    out = tmp_path / "run"
    returncode, stderr = _train_and_kill(
        out, ["--workers", "2", "--steps", "48", "--log-every", "4"],
        lambda: _rows_written(out) >= 1, "worker", 2)
    assert returncode == 0, stderr[-4000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    assert summary["workers"] == 2 and summary["workers_finished"] == 1, summary
    [lost] = summary["workers_lost"]
    assert lost["exit_code"] == -signal.SIGKILL, lost
    index = lost["task"].split(":")[1]
    assert f"worker {index} exited with code -9" in stderr, stderr[-4000:]
    assert "training goes on with 1 worker" in stderr
    assert summary["steps"] == 48 and summary["test_accuracy"] is not None


def test_the_recorder_tells_epochs_from_the_time_between_them():
    from models.recorder import recorder_classes

    now = [0.0]
    recorder = recorder_classes()[1](None, steps_per_epoch=4, per_batch=True,
                                     clock=lambda: now[0])
    recorder.start = 0.0
    # Epochs of 2 s, 3 s and 4 s; 1 s between them, and a 5 s pause (a test of the
    # held-out set) after the second, which the clock leaves out.
    for epoch, (begins, ends) in enumerate([(0, 2), (3, 6), (12, 16)]):
        now[0] = begins
        recorder.on_epoch_begin(epoch)
        now[0] = ends
        recorder.on_epoch_end(epoch)
        if epoch == 1:
            recorder.pause(7.0, 5.0)
    assert recorder.epoch_seconds == [2, 3, 4]
    assert recorder.between_epochs_seconds == [1, 1]
    assert recorder.paused_before(7.0) == 0 and recorder.paused_before(7.5) == 5
    assert [row["time_s"] for row in recorder.rows] == []  # rows come from batches
    recorder.on_train_batch_end(0)
    assert recorder.rows[-1]["time_s"] == 16 - 5
