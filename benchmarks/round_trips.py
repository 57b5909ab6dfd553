"""Round trips per step: each configuration's step time against the links' round-trip time.

    python -m benchmarks.round_trips                      # all of it, about 30 minutes
    python -m benchmarks.round_trips --strategies ps --rtts 0,50 --configs fp32,threelc

For every configuration and round-trip time (RTT) it runs `models.train` (ResNet-20 on
scikit-learn's digits, 1 PS + 2 workers or 2 MWMS workers) on emulated links of one
rate whose one-way delay is RTT / 2 (`tfgc.cluster` links: `--link RATE/DELAY`), and
reads the run's step time (after its first Keras epoch). The least-squares slope of
step time against RTT is the number of sequential round trips a step pays; its
intercept is the step at zero RTT. Local steps divide by nothing: a step of H=16 is one
sixteenth of a meeting plus one inner step, so the slope is per step, as measured.

A step's time is also split in two, each with its own slope: the time inside Keras
epochs per step (the steps, the wait for the last of an epoch's steps, Keras reading
the metrics), and the time between one epoch's end and the next one's start (the
callbacks at its end: the traffic counters, TensorBoard; the next one's set-up), per
gap. The second is paid once per epoch: `--log-every` steps here, a pass over the data
in most training.

Raw output (every run's summary fields used here) goes to
`results/round_trips/<strategies>.json` (`ps.json`, `mwms.json`); the tables of
`docs/results/round-trips.md` are `python -m benchmarks.round_trips --report --out FILE`.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.link_configs import CONFIGS, train_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "round_trips")

KEPT = ("step_time_s", "in_epoch_step_time_s", "between_epochs_s", "first_epoch_s",
        "train_time_s", "socket_worker_to_ps_bytes_per_step",
        "socket_ps_to_worker_bytes_per_step", "final_train_loss", "command")


def run_one(config, strategy, rate, rtt_ms, steps, log_every, timeout_s):
    """Trains one configuration on links of `rate` with RTT `rtt_ms`; returns its row."""
    delay = f"{rtt_ms / 2:g}ms"
    with tempfile.TemporaryDirectory(prefix="tfgc-rtt-") as out:
        command = [
            sys.executable, "-m", "models.train", "--strategy", strategy, "--workers", "2",
            "--model", "resnet20", "--dataset", "digits", "--train-limit", "2000",
            "--test-limit", "200", "--steps", str(steps), "--log-every", str(log_every),
            "--link", f"{rate}/{delay}", "--timeout", str(timeout_s), "--verbose", "0",
            "--recompute-statistics", "0", "--out", out,
            *train_args(config, strategy),
        ] + (["--ps", "1"] if strategy == "ps" else [])
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 60)
        row = {"config": config, "strategy": strategy, "rate": rate, "rtt_ms": rtt_ms,
               "wall_s": time.monotonic() - started}
        if done.returncode != 0:
            row["error"] = done.stderr[-2000:]
            return row
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    row.update({key: summary.get(key) for key in KEPT})
    return row


def fit(rows, key="step_time_s"):
    """Least squares of `key` (s; by default the step time) on RTT (s): (round trips,
    value at 0 RTT)."""
    xs = [r["rtt_ms"] / 1e3 for r in rows]
    ys = [r[key] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def report(results):
    """The results page's table: one row per strategy and configuration."""
    rows = [r for r in results["rows"] if "error" not in r]
    split = all(r.get("in_epoch_step_time_s") is not None
                and r.get("between_epochs_s") is not None for r in rows)
    lines = [
        "| strategy | configuration | round trips per step (slope) | fitted step at 0 RTT (s) | "
        + " | ".join(f"step at {rtt:g} ms (s)" for rtt in results["rtts_ms"])
        + (" | round trips per step inside epochs | round trips between epochs |"
           if split else " |"),
        "|---|---|---|---|" + "---|" * len(results["rtts_ms"]) + ("---|---|" if split else ""),
    ]
    for strategy in results["strategies"]:
        for config in results["configs"]:
            mine = [r for r in rows if (r["strategy"], r["config"]) == (strategy, config)]
            if len(mine) < 2:
                continue
            slope, intercept = fit(mine)
            by_rtt = {r["rtt_ms"]: r["step_time_s"] for r in mine}
            cells = [f"{by_rtt[rtt]:.3f}" if rtt in by_rtt else "-" for rtt in results["rtts_ms"]]
            if split:
                cells += [f"{fit(mine, 'in_epoch_step_time_s')[0]:.2f}",
                          f"{fit(mine, 'between_epochs_s')[0]:.1f}"]
            lines.append(f"| {strategy} | {config} | {slope:.2f} | {intercept:.3f} | "
                         + " | ".join(cells) + " |")
    failed = [r for r in results["rows"] if "error" in r]
    for r in failed:
        lines.append(f"\n{r['strategy']} {r['config']} at {r['rtt_ms']} ms failed: "
                     f"{r['error'].strip().splitlines()[-1]}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default="ps,mwms")
    parser.add_argument("--configs", default="fp32,threelc,threelc-h4,threelc-h16",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--rtts", default="0,20,50,100", help="round-trip times in ms")
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--log-every", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--out", help="default: results/round_trips/<strategies>.json")
    parser.add_argument("--report", action="store_true",
                        help="print the table of the results in --out; run nothing")
    args = parser.parse_args(argv)
    args.out = args.out or os.path.join(RESULTS, args.strategies.replace(",", "-") + ".json")
    if args.report:
        with open(args.out) as f:
            print(report(json.load(f)))
        return 0
    from tfgc import cluster

    reason = cluster.emulation_unavailable()
    if reason:
        print(f"round trips need emulated links: {reason}", file=sys.stderr)
        return 2
    results = {"rate": args.rate, "steps": args.steps, "log_every": args.log_every,
               "strategies": args.strategies.split(","), "configs": args.configs.split(","),
               "rtts_ms": [float(x) for x in args.rtts.split(",")], "rows": [],
               "command": "python -m benchmarks.round_trips " + " ".join(argv or sys.argv[1:])}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for strategy in results["strategies"]:
        for config in results["configs"]:
            for rtt in results["rtts_ms"]:
                row = run_one(config, strategy, args.rate, rtt, args.steps, args.log_every,
                              args.timeout)
                results["rows"].append(row)
                shown = row.get("step_time_s")
                print(f"[round trips] {strategy} {config} RTT {rtt:g} ms: "
                      + (f"{shown:.3f} s/step" if shown else "failed")
                      + f" ({row['wall_s']:.0f} s)", flush=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
