"""Time to a held-out test accuracy on emulated links, with each run's floors beside it.

    python -m benchmarks.time_to_accuracy --strategy ps --links 10mbit/25ms
    python -m benchmarks.time_to_accuracy --strategy mwms --links 100mbit/10ms,1mbit/50ms \
        --configs fp32,bf16,threelc,powersgd --seeds 0,1,2
    python -m benchmarks.time_to_accuracy --report results/time_to_accuracy/ps_10mbit_50ms_rtt.json

Every run is `models.train` (ResNet-20 on --dataset, 1 PS + 2 workers or 2 MWMS
workers) with `--eval-every`: the held-out test set is evaluated every few Keras epochs,
alike for every run (batch-norm statistics recomputed for all runs or kept for all, by
--recompute-statistics), off the training clock. The target is --target-fraction of
fp32's mean final test accuracy on loopback over the seeds; a run's time to it is the
training time of its first test at or above it. Speedups are ratios of total times over
the seeds that every compared run reached.

fp32 and bf16 on a slow link may not finish within --timeout: a configuration named in
--estimate runs only --estimate-link-steps steps there, and its time to the target is
estimated as its measured first epoch + (its loopback steps to the target - one epoch) x
its measured link step time, labelled as an estimate, with the measured parts beside it.

Floors (`models.floors`), measured in the same run of this benchmark: each run's
compute floor (the same step with no communication, --workers local processes side
by side) and link floor (the busiest link's bytes per step / its rate + the round trips
no implementation avoids x RTT). "Share of the floor" = the larger floor / the measured
step time, never above 100% unless a floor was wrong.

--loopback-from takes the loopback runs and compute floors of an earlier result file
(same code, configurations and seeds) instead of running them again, so that runs on
several links share one target; the file's command is recorded beside this one's.

Raw output goes to --out (JSON; by default results/time_to_accuracy/, named by the strategy
and each emulated link, e.g. ps_10mbit_50ms_rtt.json); --report prints its tables.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results", "time_to_accuracy")

from benchmarks.link_configs import CONFIGS, local_steps, train_args  # noqa: E402
from models import floors, held_out  # noqa: E402

BASELINES = ("fp32", "bf16")  # what tfgc's configurations are compared against

KEPT = ("step_time_s", "first_epoch_s", "train_time_s", "test_accuracy", "held_out",
        "held_out_statistics", "socket_worker_to_ps_bytes_per_step",
        "socket_ps_to_worker_bytes_per_step", "socket_worker0_sent_bytes_per_step",
        "socket_worker0_received_bytes_per_step", "steps", "command")


def _common(args, seed, steps):
    return ["--model", "resnet20", "--dataset", args.dataset, "--allow-substitute",
            "--train-limit", str(args.train_limit), "--test-limit", str(args.test_limit),
            "--steps", str(steps), "--log-every", str(args.log_every),
            "--batch-size", str(args.batch_size), "--seed", str(seed), "--verbose", "0",
            "--recompute-statistics", str(args.recompute_statistics)] + (
                [] if args.lr is None else ["--lr", str(args.lr)])


def _train(command, timeout_s):
    """Runs models.train; returns its summary (with "wall_s"), or {"error": ...}."""
    with tempfile.TemporaryDirectory(prefix="tfgc-tta-") as out:
        started = time.monotonic()
        try:
            done = subprocess.run([*command, "--out", out], capture_output=True, text=True,
                                  timeout=timeout_s + 120)
        except subprocess.TimeoutExpired:
            return {"error": f"no summary within {timeout_s + 120} s"}
        if done.returncode != 0:
            return {"error": done.stderr.strip()[-1500:]}
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    row = {key: summary.get(key) for key in KEPT}
    row["wall_s"] = time.monotonic() - started
    return row


def run_config(args, config, seed, link, steps):
    command = [sys.executable, "-m", "models.train", "--strategy", args.strategy,
               "--workers", str(args.workers), "--eval-every", str(args.eval_every),
               "--timeout", str(args.timeout), *_common(args, seed, steps),
               *train_args(config, args.strategy)]
    if args.strategy == "ps":
        command += ["--ps", "1"]
    if link != "loopback":
        command += ["--link", link]
    row = _train(command, args.timeout)
    row.update(config=config, seed=seed, link=link)
    return row


def compute_floor(args, seed):
    """The compute floor of a step (`models.floors`), for this seed's data and model."""
    floor = floors.compute_floor(_common(args, seed, args.floor_steps), args.workers,
                                 all_reduce=args.strategy == "mwms", timeout_s=args.timeout)
    return {"seed": seed, **floor}


def add_floors(r, results, compute):
    """Set run `r`'s compute floor, link floor and share of the floor."""
    floor = floors.link_floor(r, r["link"], results["workers"], local_steps(r["config"]))
    r["link_floor"] = floor
    r["compute_floor_step_s"] = compute.get(r["seed"])
    known = [f for f in (r["compute_floor_step_s"], floor and floor["floor_step_s"]) if f]
    r["floor_step_s"] = max(known) if known else None
    r["share_of_floor"] = (r["floor_step_s"] / r["step_time_s"]
                           if r["floor_step_s"] else None)


def _probe(row):
    """Whether `row` ran only a few steps on its link, for an estimate."""
    return bool(row.get("link_probe", row.get("fp32_link_probe")))


def summarize(results, with_floors=True):
    """Targets, times to them, ratios of totals and floors; the report's numbers.

    Args:
      results: the benchmark's raw output.
      with_floors: add each run's floors (imports tfgc for its link parser); without
        them the summary needs numpy only, as the headlines do.
    """
    rows = [r for r in results["rows"] if "error" not in r]
    fp32_loopback = [r for r in rows if r["config"] == "fp32" and r["link"] == "loopback"]
    if not fp32_loopback:
        return {"error": "no fp32 run on loopback: no target"}
    target = results["target_fraction"] * (
        sum(r["test_accuracy"] for r in fp32_loopback) / len(fp32_loopback))
    compute = {f["seed"]: f["floor_step_s"] for f in results["compute_floors"]}
    lines = []
    for r in rows:
        r["time_to_target_s"] = held_out.time_to(r["held_out"] or [], target)
        r["estimated"] = False
        if _probe(r):
            base = next((b for b in rows if b["link"] == "loopback"
                         and b["config"] == r["config"] and b["seed"] == r["seed"]), None)
            steps_to = next((h["step"] for h in base["held_out"]
                             if h["test_accuracy"] >= target), None) if base else None
            if steps_to is not None:
                first = results["log_every"]
                r["time_to_target_s"] = r["first_epoch_s"] + max(0, steps_to - first) * r[
                    "step_time_s"]
                r["estimated"] = True
                r["estimate_from"] = {"first_epoch_s": r["first_epoch_s"],
                                      "loopback_steps_to_target": steps_to,
                                      "link_step_s": r["step_time_s"]}
        if with_floors:
            add_floors(r, results, compute)
    for link in results["links"]:
        on_link = [r for r in rows if r["link"] == link]
        configs = list(dict.fromkeys(r["config"] for r in on_link))
        reached = {c: {r["seed"]: r["time_to_target_s"] for r in on_link
                       if r["config"] == c and r["time_to_target_s"] is not None}
                   for c in configs}
        # A baseline that never reached the target took longer than its last evaluation:
        # against that time a ratio is a measured lower limit, said as "at least". A
        # probe stopped short by design says nothing of the kind: without an estimate
        # (its loopback run did not reach the target) it is left out.
        unreached = {c: {r["seed"]: r["held_out"][-1]["time_s"] for r in on_link
                         if r["config"] == c and r["time_to_target_s"] is None
                         and r["held_out"] and not _probe(r)}
                     for c in configs}
        for c in configs:
            for base in BASELINES:
                if c in BASELINES or base not in configs:
                    continue
                base_times = {**unreached[base], **reached[base]}
                seeds = sorted(set(reached[c]) & set(base_times))
                if not seeds:
                    continue
                ratio = (sum(base_times[s] for s in seeds) /
                         sum(reached[c][s] for s in seeds))
                lines.append({"link": link, "config": c, "against": base, "seeds": seeds,
                              "ratio_of_totals": ratio,
                              "at_least": any(s in unreached[base] for s in seeds),
                              "against_estimated": any(
                                  r["estimated"] for r in on_link
                                  if r["config"] == base and r["seed"] in seeds)})
    return {"target": target, "speedups": lines}


def report(results):
    summary = summarize(results)
    if "error" in summary:
        return summary["error"]
    out = [f"Target: test accuracy {summary['target']:.4f} "
           f"({results['target_fraction']:.0%} of fp32's mean final test accuracy on "
           f"loopback; statistics {results['statistics']}).", "",
           "| link | configuration | seed | test acc (end) | time to target (s) | "
           "step (s) | compute floor (s) | link floor (s) | share of the floor |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        if "error" in r:
            out.append(f"| {r['link']} | {r['config']} | {r['seed']} | failed: "
                       f"{r['error'].splitlines()[-1][:80]} | | | | | |")
            continue
        tt = r["time_to_target_s"]
        tt = "not reached" if tt is None else f"{tt:.1f}" + (" (estimate)" if r["estimated"]
                                                             else "")
        lf = r["link_floor"]
        out.append(
            f"| {r['link']} | {r['config']} | {r['seed']} | {r['test_accuracy']:.4f} | {tt} "
            f"| {r['step_time_s']:.3f} | {r['compute_floor_step_s'] or 0:.3f} "
            f"| {'-' if lf is None else format(lf['floor_step_s'], '.3f')} "
            f"| {'-' if r['share_of_floor'] is None else format(r['share_of_floor'], '.0%')} |")
    out += ["", "| link | configuration | against | seeds | time to target, ratio of totals |",
            "|---|---|---|---|---|"]
    for s in summary["speedups"]:
        note = " (against an estimate)" if s["against_estimated"] else ""
        if s["at_least"]:
            note += f" ({s['against']} did not reach the target: at least)"
        out.append(f"| {s['link']} | {s['config']} | {s['against']} | "
                   f"{','.join(map(str, s['seeds']))} | "
                   f"{'>= ' if s['at_least'] else ''}{s['ratio_of_totals']:.2f}x{note} |")
    return "\n".join(out)


def default_out(strategy, links):
    """The raw output's path without --out: results/time_to_accuracy/, named by the
    strategy and each emulated link's rate and round-trip time (its one-way delay twice),
    e.g. ps_10mbit_50ms_rtt.json for `--strategy ps --links 10mbit/25ms`."""
    from tfgc.cluster.netem import parse_delay, parse_link

    parts = [strategy]
    for link in links:
        if link == "loopback":
            continue
        parsed = parse_link(link)
        parts.append(parsed["bandwidth"] or "unshaped")
        if parsed["delay"]:
            parts.append(f"{2e3 * parse_delay(parsed['delay']):g}ms_rtt")
    return os.path.join(RESULTS, "_".join(parts) + ".json")


def _loopback_from(path, configs, seeds):
    """The loopback rows and compute floors of the result file at `path`, per seed.

    Raises:
      SystemExit: the file lacks a configuration or seed that this run needs.
    """
    with open(path) as f:
        earlier = json.load(f)
    rows, floors_by_seed = {}, {f["seed"]: f for f in earlier["compute_floors"]}
    for seed in seeds:
        rows[seed] = [r for r in earlier["rows"] if r["link"] == "loopback"
                      and r["seed"] == seed and r["config"] in configs]
        missing = set(configs) - {r["config"] for r in rows[seed]}
        if missing or seed not in floors_by_seed:
            sys.exit(f"--loopback-from {path} has no loopback run of seed {seed} for "
                     f"{', '.join(sorted(missing)) or 'its compute floor'}")
    return {"rows": rows, "floors": floors_by_seed, "command": earlier["command"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("ps", "mwms"), default="ps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--links", default="10mbit/25ms",
                        help="emulated links beside loopback, comma-separated")
    parser.add_argument("--configs", default="fp32,bf16,threelc,threelc-h4",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--train-limit", type=int, default=1500)
    parser.add_argument("--test-limit", type=int, default=297)
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--log-every", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02,
                        help="models.train --lr for every run. Under parameter servers "
                             "ResNet-20 at 0.1 and 0.05 diverged early in some runs and "
                             "never recovered (bf16 at 0.05: loss 5.2 at step 16, test "
                             "accuracy 0.23 after 384 steps); at 0.02 every configuration "
                             "tried trained (results/time_to_accuracy/learning_rate/)")
    parser.add_argument("--recompute-statistics", type=int, default=0,
                        help="batches to recompute batch-norm statistics with before "
                             "every test, for every run alike (0: kept statistics)")
    parser.add_argument("--target-fraction", type=float, default=0.95)
    parser.add_argument("--estimate", default="",
                        help="comma-separated configurations (fp32, bf16) that on emulated "
                             "links run --estimate-link-steps only, their time to the "
                             "target estimated from their loopback run")
    parser.add_argument("--estimate-link-steps", type=int, default=48)
    parser.add_argument("--floor-steps", type=int, default=64)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--loopback-from", metavar="JSON", default=None,
                        help="reuse this result file's loopback runs and compute floors")
    parser.add_argument("--out", default=None)
    parser.add_argument("--report", metavar="JSON", help="print the tables of a result file")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return 0
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "fp32" not in configs:
        parser.error(f"--configs needs fp32 (the target's run) and knows {', '.join(CONFIGS)}")
    estimated = [c for c in args.estimate.split(",") if c]
    if any(c not in configs for c in estimated):
        parser.error("--estimate names configurations of --configs only")
    links = ["loopback"] + [link for link in args.links.split(",") if link]
    out = args.out or default_out(args.strategy, links)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {"strategy": args.strategy, "workers": args.workers, "links": links,
               "configs": configs, "seeds": seeds, "dataset": args.dataset,
               "log_every": args.log_every, "target_fraction": args.target_fraction,
               "statistics": ("recomputed" if args.recompute_statistics else "kept"),
               "command": "python -m benchmarks.time_to_accuracy "
                          + " ".join(argv if argv is not None else sys.argv[1:]),
               "compute_floors": [], "rows": []}

    def save():
        with open(out, "w") as f:
            json.dump(results, f, indent=1)

    reused = _loopback_from(args.loopback_from, configs, seeds) if args.loopback_from else None
    if reused is not None:
        results["loopback_from"] = {"file": args.loopback_from, "command": reused["command"]}
    for seed in seeds:
        if reused is None:
            results["compute_floors"].append(compute_floor(args, seed))
        else:
            results["compute_floors"].append(reused["floors"][seed])
            results["rows"] += reused["rows"][seed]
        print(f"[tta] compute floor, seed {seed}: "
              f"{results['compute_floors'][-1]['floor_step_s']:.3f} s/step", flush=True)
        save()
        for link in links:
            if link == "loopback" and reused is not None:
                continue
            for config in configs:
                probe = config in estimated and link != "loopback"
                row = run_config(args, config, seed, link,
                                 args.estimate_link_steps if probe else args.steps)
                row["link_probe"] = probe
                results["rows"].append(row)
                got = ("failed" if "error" in row else
                       f"test {row['test_accuracy']:.3f}, {row['step_time_s']:.3f} s/step")
                print(f"[tta] seed {seed} {link} {config}: {got}", flush=True)
                save()
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
