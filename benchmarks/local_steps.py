"""Local steps against synchronous steps under MultiWorkerMirroredStrategy.

    python -m tfgc.cluster.private python -m benchmarks.local_steps
    python -m tfgc.cluster.private python -m benchmarks.local_steps --steps 600 \\
        --out results/local_steps/mwms_loopback.json

Each configuration is one `python -m models.train --strategy mwms --workers 2` run
(two worker processes of a `tfgc.cluster.LocalCluster` on loopback, tf_keras `fit`,
ring all-reduce), the same model, data, seed and number of steps: fp32 and ThreeLC(1.0)
synchronous steps, then ThreeLC on the pseudo-gradients of local steps (H steps between
meetings, plain averaging and DiLoCo's Nesterov outer step), on loopback or on emulated
links (`--bandwidth`). A configuration named by a compression spec instead (e.g.
`powersgd:rank=1`) is that codec's synchronous steps. Per run: test accuracy after the
same number of samples, the bytes worker 0 sent to the other worker per step (its socket
counters, `ss`), and the step time (after the first Keras epoch). Prints a table with
the ratios against fp32 and against ThreeLC's synchronous steps, from this run, and
writes every run's summary as JSON (`--out`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from models.train_args import parse_compression  # noqa: E402

# name: the models.train arguments of the configuration.
CONFIGS = {
    "fp32": ["--compression", "none"],
    "threelc": ["--compression", "threelc:sparsity=1.0"],
    "threelc H=4 average": ["--compression", "threelc:sparsity=1.0", "--local-steps", "4",
                            "--outer-optimizer", "average"],
    "threelc H=4 nesterov": ["--compression", "threelc:sparsity=1.0", "--local-steps", "4"],
    "threelc H=8 average": ["--compression", "threelc:sparsity=1.0", "--local-steps", "8",
                            "--outer-optimizer", "average"],
}


def train_arguments(name):
    """The models.train arguments of configuration `name`: a named one, or synchronous
    steps with the compression spec `name`."""
    return CONFIGS.get(name, ["--compression", name])


def configuration_names(text):
    """The configurations of a --configs value: named ones and compression specs, split
    at commas, except that a "key=value" item continues the spec before it
    ("fp32,powersgd:rank=1,start_step=60" holds two)."""
    names = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        continues_spec = names and ":" in names[-1] and "=" in item and ":" not in item
        if continues_spec and item not in CONFIGS:
            names[-1] += "," + item
        else:
            names.append(item)
    return names


def run(name, args, out_dir):
    """One models.train run; returns its summary."""
    run_dir = os.path.join(out_dir, "".join(c if c.isalnum() else "_" for c in name))
    command = [sys.executable, "-m", "models.train", "--strategy", "mwms", "--workers", "2",
               "--model", args.model, "--dataset", args.dataset, "--train-limit",
               str(args.train_limit), "--test-limit", str(args.test_limit), "--steps",
               str(args.steps), "--log-every", str(args.log_every), "--lr", str(args.lr),
               "--weight-decay-mode", "optimizer", "--seed", str(args.seed), "--verbose", "0",
               "--no-tensorboard", "--timeout", str(args.timeout), "--out", run_dir,
               *train_arguments(name)] + (["--bandwidth", args.bandwidth] if args.bandwidth else [])
    print(f"[local_steps] {name}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=REPO, check=True, timeout=args.timeout + 120)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["config"] = name
    return summary


def _ratio(value):
    return f"{value:.1f}x" if value >= 1 else f"{value:.2f}x"


def table(summaries):
    """Markdown rows: accuracy, bytes per step and step time, with their ratios."""
    base = {s["config"]: s for s in summaries}
    fp32, threelc = base.get("fp32"), base.get("threelc")
    lines = ["| configuration | test acc | worker 0 sent B/step | fewer bytes than fp32 "
             "| than ThreeLC | step s | faster than fp32 | than ThreeLC |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        sent, step = s["socket_worker0_sent_bytes_per_step"], s["step_time_s"]
        ratios = [_ratio(b["socket_worker0_sent_bytes_per_step"] / sent) if b else "-"
                  for b in (fp32, threelc)]
        speedups = [f"{b['step_time_s'] / step:.2f}x" if b else "-" for b in (fp32, threelc)]
        lines.append(f"| {s['config']} | {s['test_accuracy']:.4f} | {sent:,.0f} | "
                     f"{ratios[0]} | {ratios[1]} | {step:.3f} | {speedups[0]} | "
                     f"{speedups[1]} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma-separated names among: " + ", ".join(CONFIGS)
                        + "; or compression specs of one argument (e.g. powersgd:rank=1)")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--train-limit", type=int, default=10000)
    parser.add_argument("--test-limit", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.05,
                        help="per replica (synchronous runs scale it by the replicas)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth", default=None,
                        help="emulated links between the workers, e.g. 10mbit (root)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    parser.add_argument("--out", default=None, help="JSON of every run's summary")
    args = parser.parse_args(argv)
    names = configuration_names(args.configs)
    for name in names:
        if name not in CONFIGS:
            try:
                parse_compression(name)
            except ValueError as error:
                parser.error(f"configuration {name!r} is neither one of {list(CONFIGS)} nor "
                             f"a compression spec: {error}")
    with tempfile.TemporaryDirectory(prefix="local_steps_") as out_dir:
        summaries = [run(name, args, out_dir) for name in names]
    text = table(summaries)
    print("\n" + text)
    if args.out:
        keep = ("config", "command", "test_accuracy", "final_train_loss", "step_time_s",
                "train_time_s", "socket_worker0_sent_bytes_per_step",
                "socket_worker0_received_bytes_per_step", "push_bytes_per_step",
                "push_dense_bytes_per_step", "lr_scaled", "momentum", "local_steps",
                "outer_optimizer", "dataset", "substitute_for", "parameters", "steps",
                "bandwidth")
        with open(args.out, "w") as f:
            json.dump([{k: s.get(k) for k in keep} for s in summaries], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
