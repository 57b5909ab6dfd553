"""`make demo`: a real 1-PS / 2-worker cluster trains a ResNet with and without ThreeLC.

    python -m models.cluster_demo            # about 5 minutes on 2 CPU cores

For each compression (default: none, then ThreeLC with its default sparsity multiplier
1.0, which 3LC finds converges fastest when training is short; as in 3LC, the codec
compresses both gradient pushes and model pulls unless --no-pulls) it runs

    python -m models.train --strategy ps --ps 1 --workers 2 --dataset cifar10 --allow-substitute ...

in a process of its own: `tfgc.cluster.LocalCluster` starts one parameter server and two
workers as separate `tf.distribute.Server` processes on 127.0.0.1 and the run's process
coordinates tf_keras `fit` under ParameterServerStrategy. CIFAR-10 is used when it is
available offline (see `models.data`); otherwise the real Fashion-MNIST, and the table
says so. Then it prints a table (test accuracy, bytes per step worker->PS and PS->worker
from the kernel's per-socket TCP counters, compression ratios, step time), writes it to
<out>/results.md and overlays the runs' loss and accuracy curves in <out>/demo.png.

Where the machine can emulate links (root and iproute2: `tfgc.cluster` puts each task
in a network namespace, shapes what it sends with tc and delays it), every compression
runs once more on each emulated --link (default 10mbit/25ms: 10 Mbit/s, a 50 ms round
trip), and the table adds the time each run took to train and its speedup over fp32 on
the same link. Below the table: each run's step time against its floors (`models.floors`:
the same steps with no communication, measured here, and the busiest link's bytes plus
the unavoidable round trips), and each link's time to a test accuracy (95% of fp32's
final one on loopback; the held-out set is tested every --eval-every epochs, off the
clock). Where the machine cannot emulate links, the demo says why and keeps to loopback
(--link none skips it). Every run's summary and history (the raw output) is written to
<out>/summaries.json, the compute floor to <out>/floors.json.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

from models import floors, held_out

# TensorFlow's C++ start-up logs (hundreds of lines per task) hide the table; the runs and
# their cluster tasks inherit this. A value the user set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT_COMPRESSIONS = ("none", "threelc:sparsity=1.0")


def split_run(entry):
    """(codec, local steps) of a --compressions entry: CODEC, or CODEC@H for H local
    steps (each worker trains its copy H steps, then meets the server)."""
    codec, at, steps = entry.partition("@")
    if not at:
        return codec, 1
    if not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"{entry!r}: the local steps after @ must be a positive integer")
    return codec, int(steps)


def run_training(entry, args, out_dir, link=None):
    """Runs models.train for one --compressions entry (on an emulated `link`, e.g.
    "10mbit", or loopback) in a child process; returns its summary."""
    compression, local_steps = split_run(entry)
    local = ([] if local_steps == 1 else
             ["--local-steps", str(local_steps), "--outer-optimizer", args.outer_optimizer])
    command = [
        sys.executable, "-m", "models.train",
        "--strategy", "ps", "--ps", "1", "--workers", str(args.workers),
        "--model", args.model, "--dataset", args.dataset, "--allow-substitute",
        "--train-limit", str(args.train_limit), "--test-limit", str(args.test_limit),
        "--steps", str(args.steps), "--log-every", str(args.log_every),
        "--optimizer", args.optimizer, "--lr", str(args.lr),
        "--weight-decay-mode", args.weight_decay_mode,
        "--seed", str(args.seed),
        "--compression", compression, "--out", out_dir,
        # 3LC compresses both directions: pushes (gradients) and pulls (model deltas).
        "--pull-compression", pull_compression_of(compression, args),
        "--timeout", str(args.timeout), "--verbose", "2",
        "--eval-every", str(args.eval_every),
    ] + local + (["--link", link] if link else [])
    print(f"\n=== {entry}: {' '.join(command[1:])}", flush=True)
    proc = subprocess.Popen(command, start_new_session=True)
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the run stop its cluster; its servers also exit with their parent.
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        raise RuntimeError(f"the {entry} run did not finish within {args.timeout} s")
    except BaseException:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the {entry} run failed with exit code {proc.returncode}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["link"] = link or "loopback"
    from models import plots

    summary["history"] = plots.read_run(out_dir)[1]
    return summary


def pull_compression_of(compression, args):
    """The pulls' codec of the run whose pushes use `compression`: fp32 for the fp32 run
    and under --no-pulls, else --pull-compression where given, else the push codec."""
    compression = split_run(compression)[0]
    if compression == "none" or not args.pulls:
        return "none"
    return args.pull_compression or compression


def _run_key(summary):
    """What tells a link's runs apart: the push codec and the local steps."""
    steps = summary.get("local_steps", 1)
    return summary["compression"] + ("" if steps == 1 else f"@{steps}")


def _label(summary):
    """The compression column: the push codec, the pulls' where they differ, and the
    local steps."""
    pulls = summary.get("pull_compression", "none")
    label = summary["compression"]
    if pulls not in ("none", summary["compression"]):
        label += f", pulls {pulls}"
    steps = summary.get("local_steps", 1)
    if steps > 1:
        outer = summary.get("outer_optimizer") or {}
        label += f", {steps} local steps" + (
            " (averaging)" if outer.get("momentum") == 0 and outer.get("learning_rate") == 1
            else f" (outer lr {outer.get('learning_rate')}, momentum {outer.get('momentum')})")
    return label


def _mb(n):
    return f"{n / 1e6:.3f}"


def _ratio(value):
    return "fp32" if value is None else f"{value:.1f}x"


def _first_epoch(summary, base):
    """The first Keras epoch's time (tracing and graph optimization included), and
    its ratio to the uncompressed run's on the same link."""
    if summary.get("first_epoch_s") is None or not base.get("first_epoch_s"):
        return "-"
    return (f"{summary['first_epoch_s']:.1f} "
            f"({summary['first_epoch_s'] / base['first_epoch_s']:.2f}x)")


def _test_accuracy(summary):
    """The test accuracy; with recomputed batch-norm statistics, also the one with the
    statistics training kept."""
    kept = summary.get("test_accuracy_kept_statistics")
    text = f"{summary['test_accuracy']:.4f}"
    return text if kept is None else f"{text} (kept statistics: {kept:.4f})"


def results_table(summaries):
    """A Markdown table of the runs; ratios against the first run (fp32 in `make demo`) on
    the same link."""
    base = {s["link"]: s for s in summaries if _run_key(s) == _run_key(summaries[0])}
    lines = [
        "| link | compression | test acc | train loss | worker->PS MB/step | PS->worker MB/step "
        "| worker->PS ratio (socket) | PS->worker ratio (socket) | push payload ratio "
        "| pull payload ratio | step time (s) | first epoch (s) | train time (s) | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        b = base[s["link"]]
        up, down = s["socket_worker_to_ps_bytes_per_step"], s["socket_ps_to_worker_bytes_per_step"]
        lines.append(
            f"| {s['link']} | {_label(s)} | {_test_accuracy(s)} "
            f"| {s['final_train_loss']:.3f} | {_mb(up)} | {_mb(down)} "
            f"| {b['socket_worker_to_ps_bytes_per_step'] / up:.1f}x "
            f"| {b['socket_ps_to_worker_bytes_per_step'] / down:.1f}x "
            f"| {s['payload_ratio']:.1f}x | {_ratio(s.get('pull_payload_ratio'))} "
            f"| {s['step_time_s']:.3f} | {_first_epoch(s, b)} | {s['train_time_s']:.0f} "
            f"| {b['step_time_s'] / s['step_time_s']:.1f}x |"
        )
    return "\n".join(lines)


def floor_lines(summaries, compute_floor, workers):
    """Lines giving each run's step time against its floors (`models.floors`).

    Args:
      summaries: run summaries, each with its "link".
      compute_floor: the measured compute floor of a step (seconds), or None.
      workers: the runs' workers.
    """
    first = _run_key(summaries[0])
    name = "fp32" if first == "none" else _label(summaries[0])
    lines = []
    for s in summaries:
        link = floors.link_floor(s, s["link"], workers, s.get("local_steps", 1))
        known = [f for f in (compute_floor, link and link["floor_step_s"]) if f]
        if not known:
            continue
        floor = max(known)
        text = (f"{s['link']}, {_label(s)}: {s['step_time_s']:.3f} s per step; floors: "
                f"compute {'-' if compute_floor is None else format(compute_floor, '.3f')} s")
        if link is not None:
            text += (f", link {link['floor_step_s']:.3f} s "
                     f"({link['busiest_link_bytes_per_step']:,.0f} B per step on the busiest "
                     f"link + {link['round_trips']:g} round trips x "
                     f"{link['rtt_s'] * 1e3:g} ms)")
        text += f"; {floor / s['step_time_s']:.0%} of the higher floor"
        base = next(b for b in summaries if b["link"] == s["link"] and _run_key(b) == first)
        if s is not base and link is not None:
            # With no bytes at all a step still pays its compute and its round trips.
            least = max(compute_floor or 0, link["round_trips"] * link["rtt_s"])
            text += (f"; {base['step_time_s'] / s['step_time_s']:.1f}x faster steps than "
                     f"{name}, of at most {base['step_time_s'] / least:.1f}x for a codec "
                     "that sent nothing" if least else "")
        lines.append(text + ".")
    return lines


def time_to_test_accuracy(summaries, fraction=0.95):
    """When each run's held-out test first reached `fraction` of the first run's final
    test accuracy on loopback (fp32's in `make demo`).

    Args:
      summaries: run summaries, each with its "link" and its "held_out" tests
        (`models.train --eval-every`).
      fraction: of the first run's test accuracy.

    Returns:
      (target, [seconds of training, or None where the run never reached it]).
    """
    base = next((s for s in summaries if s["link"] == "loopback"), summaries[0])
    target = fraction * base["test_accuracy"]
    return target, [held_out.time_to(s.get("held_out") or [], target) for s in summaries]


def accuracy_lines(summaries, fraction=0.95):
    """Lines giving each link's time to a test accuracy, against the first run's."""
    target, reached = time_to_test_accuracy(summaries, fraction)
    first = _run_key(summaries[0])
    lines = []
    for link in dict.fromkeys(s["link"] for s in summaries):
        runs = [(s, t) for s, t in zip(summaries, reached) if s["link"] == link]
        base = next((t for s, t in runs if _run_key(s) == first), None)
        parts = []
        for s, seconds in runs:
            if seconds is None:
                parts.append(f"{_label(s)} not reached")
                continue
            parts.append(f"{_label(s)} {seconds:.0f} s" + (
                f" ({base / seconds:.1f}x sooner)" if base and _run_key(s) != first else ""))
        lines.append(f"{link}: time to a test accuracy of {target:.3f} ({fraction:.0%} of "
                     f"{_label(summaries[0])}'s final test accuracy on loopback; tests on "
                     "the held-out set, off the training clock): " + ", ".join(parts) + ".")
    return lines


def steady_bytes(summary):
    """(worker->PS, PS->worker) socket bytes per step after the run's first Keras epoch,
    or None where fewer than two epochs were recorded. The first epoch also carries what
    a run sends once (the step's functions registered on the servers, the first full
    pulls): about 1 MB each way for ResNet-20, 4-5 KB per step over 240 steps."""
    return _per_step_after_first_epoch(summary, ("worker_to_ps", "ps_to_worker"))


def steady_coordinator_bytes(summary):
    """The bytes per step the coordinator sent the workers after the run's first Keras
    epoch (its calls of the steps), or None where they were not recorded."""
    per_step = _per_step_after_first_epoch(summary, ("chief_to_worker",))
    return None if per_step is None else per_step[0]


def _per_step_after_first_epoch(summary, keys):
    """The socket rows' `keys`, per step from the end of the first Keras epoch to the
    last, or None where fewer than two epochs (or the keys) were recorded."""
    rows = summary.get("socket_bytes") or []
    if len(rows) < 3 or any(key not in rows[0] for key in keys):
        return None
    start, end = rows[1], rows[-1]
    steps = end["step"] - start["step"]
    return tuple((end[key] - start[key]) / steps for key in keys)


def steady_bytes_lines(summaries):
    """Lines giving each run's socket bytes per step after its first epoch, against the
    first run's on its link (as `results_table`) and, for local steps, against the same
    codec's synchronous run there."""
    by_key = {(s["link"], _run_key(s)): s for s in summaries}
    first = _run_key(summaries[0])
    lines = []
    for s in summaries:
        steady = steady_bytes(s)
        if steady is None:
            continue
        bases = [("the first run", by_key[(s["link"], first)])]
        synchronous = by_key.get((s["link"], s["compression"]))  # its key without "@H"
        if s.get("local_steps", 1) > 1 and synchronous is not None:
            bases.append(("synchronous", synchronous))
        against = []
        for name, base in bases:
            base_steady = steady_bytes(base)
            if base is not s and base_steady is not None:
                against.append(f"{base_steady[0] / steady[0]:.1f}x and "
                               f"{base_steady[1] / steady[1]:.1f}x fewer than {name}")
        calls = steady_coordinator_bytes(s)
        lines.append(f"{s['link']}, {_label(s)}: after the first epoch {steady[0]:,.0f} B "
                     f"per step to the servers, {steady[1]:,.0f} B back"
                     + (f" ({'; '.join(against)})" if against else "")
                     + ("" if calls is None else
                        f"; {calls:,.0f} B per step from the coordinator to the workers")
                     + ".")
    return lines


def describe_dataset(summary):
    text = f"{summary['dataset']} ({summary['train_examples']} training / " \
           f"{summary['test_examples']} test images)"
    if summary.get("substitute_for"):
        text += (f", a real-data SUBSTITUTE for {summary['substitute_for']}, which is not "
                 "available offline")
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m models.cluster_demo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--dataset", default="cifar10",
                        help="cifar10 if available offline, else Fashion-MNIST (recorded)")
    parser.add_argument("--compressions", nargs="+", default=list(DEFAULT_COMPRESSIONS),
                        help="the runs: codecs (models.train --compression), each with "
                             "@H for H local steps, e.g. threelc:sparsity=1.0@4")
    parser.add_argument("--outer-optimizer", choices=("average", "nesterov"),
                        default="average",
                        help="the meetings of the @H runs (models.train --outer-optimizer)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-pulls", dest="pulls", action="store_false",
                        help="compress pushes only (model pulls stay fp32)")
    parser.add_argument("--pull-compression",
                        help="the pulls' codec in every compressed run, e.g. "
                             "threelc:sparsity=1.0 under pushes at sparsity=1.75 "
                             "(default: the run's push codec; the fp32 run stays fp32)")
    parser.add_argument("--steps", type=int, default=120, help="worker steps per run")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=2,
                        help="Keras epochs between tests on the held-out set (the time to "
                             "a test accuracy reads them)")
    parser.add_argument("--no-compute-floor", dest="compute_floor", action="store_false",
                        help="skip measuring the compute floor (the steps with no "
                             "communication: --workers local processes side by side)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="models.train --optimizer: sgd (momentum 0.9) or adam (AdamW "
                             "with the default --weight-decay-mode)")
    parser.add_argument("--lr", type=float, default=None,
                        help="initial learning rate (default: 0.05 for sgd, 0.001 for adam)")
    parser.add_argument("--seed", type=int, default=0,
                        help="initial weights and data order of every run")
    parser.add_argument(
        "--weight-decay-mode", choices=("loss", "optimizer"), default="optimizer",
        help="optimizer (default): decay applied on the PS; loss: an L2 term, which under "
             "PSS pulls every kernel twice per step")
    parser.add_argument("--train-limit", type=int, default=10000)
    parser.add_argument("--test-limit", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=480, help="seconds per run")
    parser.add_argument("--link", default="10mbit/25ms",
                        help="also run every compression on these emulated links, "
                             "comma-separated, each a rate with an optional one-way delay "
                             "(10mbit,100mbit/10ms,1mbit/50ms) where the machine allows "
                             "it; none: loopback only")
    parser.add_argument("--out", default="runs/demo")
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = 0.001 if args.optimizer == "adam" else 0.05
    if args.pull_compression and not args.pulls:
        parser.error("--pull-compression and --no-pulls contradict each other")
    if args.link and args.link != "none":
        from tfgc.cluster import netem

        for link in args.link.split(","):
            try:
                netem.parse_link(link)
            except ValueError as error:
                parser.error(str(error))
    for entry in args.compressions:
        try:
            codec, local_steps = split_run(entry)
        except ValueError as error:
            parser.error(str(error))
        if local_steps > 1 and pull_compression_of(codec, args) == "none":
            parser.error(f"{entry}: local steps train each worker's copy of the model, its "
                         "caches of compressed pulls; they need pulls (not --no-pulls, "
                         "not the fp32 run)")

    from tfgc import cluster

    links = [None]
    link_note = ""
    if args.link and args.link != "none":
        reason = cluster.emulation_unavailable()
        if reason is None:
            links += args.link.split(",")
        else:
            link_note = f"No emulated {args.link} link on this machine: {reason}."
            print(f"[demo] {link_note} Loopback only.", flush=True)
    started = time.monotonic()
    summaries, run_dirs = [], []
    for link in links:
        for entry in args.compressions:
            compression, local_steps = split_run(entry)
            pulls = pull_compression_of(compression, args)
            name = compression + ("" if pulls in ("none", compression) else "_pulls_" + pulls)
            name += "" if local_steps == 1 else f"_h{local_steps}"
            name = name.replace(":", "_").replace("=", "").replace(",", "_")
            run_dirs.append(os.path.join(args.out, name + (f"_{link}" if link else "")))
            summaries.append(run_training(entry, args, run_dirs[-1], link))
    compute_floor = None
    if args.compute_floor:
        print("\n=== compute floor: the same steps with no communication, "
              f"{args.workers} local processes side by side", flush=True)
        compute_floor = floors.compute_floor(
            ["--model", args.model, "--dataset", args.dataset, "--allow-substitute",
             "--train-limit", str(args.train_limit), "--test-limit", str(args.test_limit),
             "--steps", str(args.steps), "--log-every", str(args.log_every),
             "--optimizer", args.optimizer, "--lr", str(args.lr), "--seed", str(args.seed)],
            args.workers, all_reduce=False, timeout_s=args.timeout)["floor_step_s"]
    from models import plots

    png = plots.plot_runs(run_dirs, os.path.join(args.out, "demo.png"), smooth=1)
    first = summaries[0]
    header = (
        f"{first['model']} ({first['parameters']:,d} parameters), 1 parameter server + "
        f"{args.workers} workers on 127.0.0.1, {first['steps']} worker steps of batch "
        f"{first['batch_size']} per run.\nDataset: {describe_dataset(first)}.\n"
        "Bytes per step: kernel TCP counters of the sockets between the processes (ss -tinp), "
        "over the steps of fit, divided by the steps.\nGradient payload ratio: dense fp32 "
        "gradient bytes / encoded bytes, from the optimizer's counters (pull: the same for "
        "model deltas).\nOptimizer: "
        f"{args.optimizer} from learning rate {args.lr}; weight decay: "
        f"{args.weight_decay_mode} (see models.train --weight-decay-mode).\n"
        "Links: loopback, and emulated links (tc token buckets on what each task sends, "
        "and its one-way delay, tfgc.cluster); speedup = fp32's step time / this run's on the same link; first "
        "epoch = the first Keras epoch's wall time, tracing and graph optimization "
        "included (against fp32's on the same link); train time = wall time of the run's "
        "training." + (f"\n{link_note}" if link_note else "")
    )
    table = results_table(summaries)
    limits = (floor_lines(summaries, compute_floor, args.workers) + accuracy_lines(summaries)
              + steady_bytes_lines(summaries))
    text = f"{header}\n\n{table}\n" + "".join(f"\n{line}" for line in limits) + (
        "\n" if limits else "")
    print("\n" + text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "summaries.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    with open(os.path.join(args.out, "floors.json"), "w") as f:
        json.dump({"compute_floor_step_s": compute_floor, "workers": args.workers}, f)
    print(f"plot: {png}\ntable: {os.path.join(args.out, 'results.md')}\n"
          f"total time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
