"""Re-derives every headline number of docs/results/ from the data committed in results/.

    python -m benchmarks.headlines

prints one line per headline: its id, its value, and the files it was computed from.
Two kinds of source: raw output (JSON written by the benchmark itself, in results/) and
recorded tables (CSV in results/recorded/, transcribed from what a command printed
when its raw output was not kept; each CSV says so in its header). The values are the
strings docs/results/index.md shows; tests/test_headlines.py checks that they agree.

Only numpy and the standard library: no TensorFlow, so it runs in a second.
"""
import csv
import dataclasses
import glob
import json
import os
import sys

import numpy as np

from benchmarks.series import ema
from models.cluster_demo import steady_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Emulated link rates of models.cluster_demo, in bytes per second (tc tbf on what each task
# sends: the parameter server's pulls to both workers share its one egress).
LINK_BYTES_PER_S = {"100mbit": 100e6 / 8, "10mbit": 10e6 / 8}
# Targets set for the demo's step-time speedup over fp32 on each link, and for the entropy
# coder's bytes against zero-run encoding at s = 1.75.
SPEEDUP_TARGETS = {"100mbit": 3.0, "10mbit": 15.0}
ENTROPY_TARGET_AT_175 = 3.0
THREELC = "threelc:sparsity=1.0"
THREELC_175 = "threelc:sparsity=1.75,coder=entropy"


@dataclasses.dataclass
class Headline:
    """One headline number: `value` is the string docs/results/index.md shows."""

    id: str
    value: str
    sources: list
    raw: bool  # True: raw output; False: a recorded table (raw output not kept)


def _path(relative):
    return os.path.join(ROOT, relative)


def read_csv(relative):
    """Rows of a CSV in the repository, skipping its leading '#' comment lines."""
    with open(_path(relative), newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def read_json(relative):
    with open(_path(relative)) as f:
        return json.load(f)


def _x(value):
    return f"{value:.1f}x"


def _span(values, fmt=_x):
    """'a-b' of the smallest and largest value, or one value."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low[:-1] if low.endswith('x') else low}-{high}"


def _percent(share):
    return f"{100 * share:.0f}%"


def _points(value):
    return f"{value:+.2f}".replace("+0.00", "0.00")


def _verdict(measured, target):
    return "met" if measured >= target else "missed"


# --- the demo on emulated links (recorded) ---------------------------------------------

DEMO = "results/recorded/demo_links.csv"


def _demo_runs(series):
    """{run: {(link, compression): row}} of one series of demo_links.csv."""
    runs = {}
    for row in read_csv(DEMO):
        if row["series"] == series:
            runs.setdefault(row["run"], {})[(row["link"], row["compression"])] = row
    return runs


def link_ratios(rows, link):
    """Speedup, fp32's link step over its loopback step, the server-egress ratio and
    ThreeLC's egress use.

    The speedup is fp32's mean step on the link over ThreeLC's. fp32's link step over its
    own step on loopback was once read as what a free link would give; runs beat it, so
    it is no floor. The egress ratio: every worker step pulls `pull_mb_per_step` through
    the parameter server's one shaped egress, so the cluster cannot step faster than those
    bytes take at the link's rate; fp32's step over that time is the most the pulls allow.
    The step times are the cluster's (all workers' steps together), as are the pulled
    bytes per step.
    """
    fp32, ours = rows[(link, "none")], rows[(link, THREELC)]
    fp32_loopback = rows[("loopback", "none")]
    rate = LINK_BYTES_PER_S[link]
    pull_bytes = float(ours["pull_mb_per_step"]) * 1e6
    egress_step = pull_bytes / rate
    return {
        "speedup": float(fp32["step_s"]) / float(ours["step_s"]),
        "link_over_loopback": float(fp32["step_s"]) / float(fp32_loopback["step_s"]),
        "egress_ratio": float(fp32["step_s"]) / egress_step,
        "egress_use": pull_bytes / float(ours["step_s"]) / rate,
    }



def _speedup_headline(name, runs, link, target):
    """The step-time speedups of `runs` on `link`, the target's verdict, fp32's link step
    over its loopback step."""
    ratios = [link_ratios(runs[run], link) for run in sorted(runs)]
    speedups = [b["speedup"] for b in ratios]
    return Headline(
        name,
        f"{' and '.join(_x(s) for s in speedups)}; target {target} "
        f"{_verdict(max(speedups), SPEEDUP_TARGETS[link])}; fp32's link step / its loopback "
        f"step {' and '.join(_x(b['link_over_loopback']) for b in ratios)} (not a floor)",
        [DEMO], False)

def demo_headlines():
    heads = []
    runs = _demo_runs("600-100mbit")
    push = [float(r[(link, THREELC)]["push_socket_ratio"]) for r in runs.values()
            for link in ("loopback", "100mbit")]
    pull = [float(r[(link, THREELC)]["pull_socket_ratio"]) for r in runs.values()
            for link in ("loopback", "100mbit")]
    heads.append(Headline("demo-sockets", f"{_span(push)} push, {_span(pull)} pull",
                          [DEMO], False))
    heads.append(_speedup_headline("demo-100mbit", runs, "100mbit", "3x"))
    runs = _demo_runs("120-10mbit")
    heads.append(_speedup_headline("demo-10mbit", runs, "10mbit", "15x"))
    ratios = [link_ratios(runs[run], "10mbit") for run in sorted(runs)]
    heads.append(Headline(
        "demo-10mbit-link",
        f"{' and '.join(_x(b['egress_ratio']) for b in ratios)}; ThreeLC used "
        f"{' and '.join(_percent(b['egress_use']) for b in ratios)} of the server's egress",
        [DEMO], False))
    return heads


DEMO_LINKS = "results/demo_links/summaries.json"


def time_to_training_accuracy(summaries, window=3):
    """When each run first reached a training accuracy that every run on its link reaches.

    The older demo runs recorded no tests during training: their times to accuracy are
    to a training accuracy, which the headlines say. New runs test on the held-out set
    (`models.train --eval-every`; `models.cluster_demo.time_to_test_accuracy`).

    The accuracy is Keras's training accuracy per epoch (the mean over its --log-every
    steps), smoothed over `window` epochs; the target on a link is the lowest of its runs'
    best smoothed accuracies, so each run reaches it; the time counts from the start of
    `fit` (tracing included).

    Args:
      summaries: run summaries, each with its "link" and "history" rows.
      window: epochs averaged.

    Returns:
      A list parallel to `summaries` of (target, seconds), or None for a run without
      recorded accuracy.
    """
    from models import plots

    curves = []
    for s in summaries:
        rows = [r for r in s.get("history", []) if r.get("accuracy") is not None]
        curves.append(list(zip([r["time_s"] for r in rows],
                               plots.moving_average([r["accuracy"] for r in rows], window))))
    targets = {}
    for s, curve in zip(summaries, curves):
        if curve:
            best = max(accuracy for _, accuracy in curve)
            targets[s["link"]] = min(targets.get(s["link"], best), best)
    return [(targets[s["link"]], next(t for t, a in curve if a >= targets[s["link"]]))
            if curve else None for s, curve in zip(summaries, curves)]


def demo_links_headline():
    """The demo on 10 and 100 Mbit/s in one run (raw): ThreeLC's speedup over fp32, fp32's
    step on the link over its loopback step (what it was once compared with as a bound;
    runs beat it, so it is not a floor), and how much sooner it reached a training
    accuracy every run on the link reached."""
    summaries = read_json(DEMO_LINKS)
    step = {(s["link"], s["compression"]): s["step_time_s"] for s in summaries}
    reached = {(s["link"], s["compression"]): r[1]
               for s, r in zip(summaries, time_to_training_accuracy(summaries)) if r}
    parts = []
    for link, label in (("10mbit", "10 Mbit/s"), ("100mbit", "100 Mbit/s")):
        speedup = step[(link, "none")] / step[(link, THREELC)]
        link_over_loopback = step[(link, "none")] / step[("loopback", "none")]
        sooner = reached[(link, "none")] / reached[(link, THREELC)]
        target = SPEEDUP_TARGETS[link]
        parts.append(f"{label} {_x(speedup)}, target {target:g}x {_verdict(speedup, target)} "
                     f"(fp32's link step / its loopback step {_x(link_over_loopback)}), {_x(sooner)} sooner "
                     "to a training accuracy (not a test accuracy)")
    return Headline("demo-links", "; ".join(parts), [DEMO_LINKS], True)


def demo_links_sockets_headline():
    """Socket bytes of the same run on loopback: fp32's over ThreeLC(1.0)'s, each way."""
    loopback = {s["compression"]: s for s in read_json(DEMO_LINKS) if s["link"] == "loopback"}
    fp32, ours = loopback["none"], loopback[THREELC]
    push = fp32["socket_worker_to_ps_bytes_per_step"] / ours["socket_worker_to_ps_bytes_per_step"]
    pull = fp32["socket_ps_to_worker_bytes_per_step"] / ours["socket_ps_to_worker_bytes_per_step"]
    return Headline("demo-links-sockets",
                    f"{_x(push)} fewer bytes to the server, {_x(pull)} fewer back "
                    f"({ours['steps']} steps, seed {ours['seed']})", [DEMO_LINKS], True)


SPARSE_EMBEDDINGS = "results/sparse_embeddings/token_regressor.json"


def sparse_embeddings_headline():
    """An Embedding(50000, 64) model under parameter servers against its plain twin."""
    runs = read_json(SPARSE_EMBEDDINGS)["results"]
    none, lookups = runs["none"], runs["fastsgd_lookups"]
    return Headline(
        "sparse-embeddings",
        f"NoCompression {none['worker_to_ps_vs_plain']:.2f}x and "
        f"{none['ps_to_worker_vs_plain']:.2f}x plain's bytes; FastSGD with "
        f"CompressedEmbedding {_x(1 / lookups['worker_to_ps_vs_plain'])} fewer to the server "
        f"and {_x(1 / lookups['ps_to_worker_vs_plain'])} fewer back",
        [SPARSE_EMBEDDINGS], True)


LOCAL_STEPS = "results/local_steps/mwms_{}.json"
LOCAL_STEPS_SEEDS = ("loopback", "loopback_seed1", "loopback_seed2")


def _local_steps_runs(key):
    """{configuration: summary} of one local-steps benchmark output."""
    return {r["config"]: r for r in read_json(LOCAL_STEPS.format(key))}


def local_steps_headlines():
    """Local steps under MWMS (raw): bytes against synchronous ThreeLC (seed 0) and test
    accuracy against fp32 (mean of 3 seeds) on loopback; step-time speedups at 10 Mbit/s."""
    heads = []
    seeds = [_local_steps_runs(key) for key in LOCAL_STEPS_SEEDS]
    sent = {k: r["socket_worker0_sent_bytes_per_step"] for k, r in seeds[0].items()}
    parts = []
    for name in ("threelc H=4 average", "threelc H=8 average"):
        points = [100 * (runs[name]["test_accuracy"] - runs["fp32"]["test_accuracy"])
                  for runs in seeds]
        parts.append(f"{name.split()[1]}: {_x(sent['threelc'] / sent[name])} fewer bytes than "
                     f"synchronous ThreeLC, {_points(np.mean(points))} points (mean of "
                     f"{len(points)} seeds)")
    heads.append(Headline(
        "local-steps-mwms", "; ".join(parts),
        [LOCAL_STEPS.format(key) for key in LOCAL_STEPS_SEEDS], True))
    step = {k: r["step_time_s"] for k, r in _local_steps_runs("10mbit").items()}
    heads.append(Headline(
        "local-steps-10mbit", f"H=4 {_x(step['fp32'] / step['threelc H=4 average'])}, H=8 "
        f"{_x(step['fp32'] / step['threelc H=8 average'])}, synchronous ThreeLC "
        f"{_x(step['fp32'] / step['threelc'])} faster steps than fp32",
        [LOCAL_STEPS.format("10mbit")], True))
    heads.append(local_steps_ps_headline())
    heads.append(local_steps_ps_bytes_headline())
    heads.append(local_steps_ps_accuracy_headline())
    heads.append(local_steps_ps_1mbit_headline())
    return heads


# The demo at 10 Mbit/s with fp32 and every H, after `fit` traced its step once.
LOCAL_STEPS_PS = "results/local_steps/ps_10mbit_240_steps/summaries.json"
LOCAL_STEPS_PS_BYTES = LOCAL_STEPS_PS
LOCAL_STEPS_PS_RECOMPUTED = "results/local_steps/ps_recomputed_statistics/{}summaries.json"
LOCAL_STEPS_PS_SEEDS = ("", "seed1/", "seed2/")


def local_steps_ps_accuracy_headline():
    """Local steps under parameter servers on loopback (raw, models.cluster_demo, 3
    seeds): test accuracy against fp32 with batch-norm statistics recomputed, and with
    those training kept."""
    runs = [{(s["compression"], s.get("local_steps", 1)): s
             for s in read_json(LOCAL_STEPS_PS_RECOMPUTED.format(key)) if s["link"] == "loopback"}
            for key in LOCAL_STEPS_PS_SEEDS]
    parts = []
    for steps in (4, 8, 16):
        points = {key: np.mean([100 * (seed[(THREELC, steps)][key]
                                       - seed[("none", 1)]["test_accuracy"]) for seed in runs])
                  for key in ("test_accuracy", "test_accuracy_kept_statistics")}
        parts.append(f"H={steps} {_points(points['test_accuracy'])} "
                     f"({_points(points['test_accuracy_kept_statistics'])} kept)")
    return Headline(
        "local-steps-ps-accuracy", ", ".join(parts) + f" points against fp32 (mean of "
        f"{len(runs)} seeds, statistics recomputed; kept: as training left them)",
        [LOCAL_STEPS_PS_RECOMPUTED.format(key) for key in LOCAL_STEPS_PS_SEEDS], True)


def local_steps_ps_headline():
    """Local steps under parameter servers at 10 Mbit/s (raw, models.cluster_demo): each
    run's step-time speedup over fp32, and fp32's step on the link over its loopback step,
    which these runs beat: it is not a floor."""
    step = {(s["link"], s["compression"], s.get("local_steps", 1)): s["step_time_s"]
            for s in read_json(LOCAL_STEPS_PS)}
    fp32 = step[("10mbit", "none", 1)]
    link_over_loopback = fp32 / step[("loopback", "none", 1)]
    runs = (("H=4", 4), ("H=8", 8), ("synchronous ThreeLC", 1))
    speedups = [fp32 / step[("10mbit", THREELC, steps)] for _, steps in runs]
    shares = [speedup / link_over_loopback for speedup in speedups]
    return Headline(
        "local-steps-ps-10mbit",
        ", ".join(f"{name} {_x(speedup)}" for (name, _), speedup in zip(runs, speedups))
        + f" faster steps than fp32; fp32's link step / its loopback step {_x(link_over_loopback)}, "
        f"which {', '.join(_percent(share) for share in shares)} of it shows is not a floor",
        [LOCAL_STEPS_PS], True)


def local_steps_ps_bytes_headline():
    """Local steps under parameter servers at 10 Mbit/s (raw, models.cluster_demo): socket
    bytes per step after the first epoch against synchronous ThreeLC's, each way, and
    what share of H that is (the target: about H fewer)."""
    steady = {s.get("local_steps", 1): steady_bytes(s) for s in read_json(LOCAL_STEPS_PS_BYTES)
              if s["link"] == "10mbit" and s["compression"] == THREELC}
    synchronous, parts, shares = steady.pop(1), [], ([], [])
    for h, (up, down) in sorted(steady.items()):
        fewer = (synchronous[0] / up, synchronous[1] / down)
        parts.append(f"H={h} {_x(fewer[0])} and {_x(fewer[1])}")
        for share, ratio in zip(shares, fewer):
            share.append(ratio / h)
    return Headline(
        "local-steps-ps-bytes", ", ".join(parts) + " fewer bytes per step to the servers "
        "and back than synchronous ThreeLC (after the first epoch); target about H: "
        f"{_span(shares[0], _percent)} of H to the servers, {_span(shares[1], _percent)} "
        "back", [LOCAL_STEPS_PS_BYTES], True)


LOCAL_STEPS_PS_1MBIT = "results/local_steps/ps_1mbit_960_steps/{}summaries.json"
# fp32 makes no per-worker variables and no pulls, what changed since this run.
LOCAL_STEPS_PS_1MBIT_FP32 = "results/local_steps/ps_1mbit_160_steps/fp32_40_steps_summary.json"
SOONER_THAN_FP32_TARGET, SOONER_THAN_THREELC_TARGET = 50.0, 3.0


def local_steps_ps_1mbit_headline():
    """Local steps under parameter servers at 1 Mbit/s (raw, models.cluster_demo's 960
    steps and fp32's 40 through models.train): how much sooner the best local-steps run
    reaches a training accuracy than fp32 (one that fp32's 40 steps reach too; seed 0)
    and than synchronous ThreeLC (one that every compressed run reaches; seed 0, and the
    ratio of total times over seeds 0-2)."""
    seeds = [[s for s in read_json(LOCAL_STEPS_PS_1MBIT.format(key)) if s["link"] == "1mbit"]
             for key in LOCAL_STEPS_PS_SEEDS]
    fp32 = read_json(LOCAL_STEPS_PS_1MBIT_FP32)

    def by_local_steps(summaries, reached):
        return {s.get("local_steps", 1): r for s, r in zip(summaries, reached)}

    # Each seed to an accuracy its runs all reach; seed 0 also to one fp32 reaches.
    per_seed = [by_local_steps(runs, time_to_training_accuracy(runs)) for runs in seeds]
    (target_fp32, fp32_s), *to_fp32_target = time_to_training_accuracy([fp32, *seeds[0]])
    with_fp32, alone = by_local_steps(seeds[0], to_fp32_target), per_seed[0]
    local = [h for h in alone if h > 1]
    than_fp32 = max(fp32_s / with_fp32[h][1] for h in local)
    than_threelc = max(alone[1][1] / alone[h][1] for h in local)
    # Over the seeds: the ratio of their total times.
    totals = {h: sum(seed[h][1] for seed in per_seed) for h in alone}
    over_seeds = max(totals[1] / totals[h] for h in local)
    return Headline(
        "local-steps-ps-1mbit",
        f"best local steps {_x(than_fp32)} sooner than fp32 to a training accuracy of "
        f"{target_fp32:.3f} (near chance, not a test accuracy; target 50x "
        f"{_verdict(than_fp32, SOONER_THAN_FP32_TARGET)}), "
        f"{_x(than_threelc)} sooner than synchronous ThreeLC to {alone[1][0]:.3f} (seed 0; "
        f"{_x(over_seeds)} over {len(seeds)} seeds; target 3x "
        f"{_verdict(over_seeds, SOONER_THAN_THREELC_TARGET)})",
        [LOCAL_STEPS_PS_1MBIT.format(key) for key in LOCAL_STEPS_PS_SEEDS]
        + [LOCAL_STEPS_PS_1MBIT_FP32], True)


POWERSGD = "results/peer_codecs/powersgd_mwms_loopback{}.json"
POWERSGD_SEEDS = ("", "_seed1", "_seed2")
POWERSGD_SOCKET_TARGET = 20.0


def powersgd_headline():
    """PowerSGD under MWMS (raw): socket bytes against fp32 (seed 0) and test accuracy
    against fp32 (mean of 3 seeds) for each rank."""
    seeds = [{r["config"]: r for r in read_json(POWERSGD.format(key))} for key in POWERSGD_SEEDS]
    sent = {k: r["socket_worker0_sent_bytes_per_step"] for k, r in seeds[0].items()}
    parts, ratios = [], []
    for rank in (1, 2, 4):
        name = f"powersgd:rank={rank}"
        points = [100 * (runs[name]["test_accuracy"] - runs["fp32"]["test_accuracy"])
                  for runs in seeds]
        ratios.append(sent["fp32"] / sent[name])
        parts.append(f"rank {rank}: {_x(ratios[-1])} fewer bytes, {_points(np.mean(points))} "
                     f"points")
    return Headline(
        "powersgd-mwms", "; ".join(parts) + f" (mean of {len(seeds)} seeds); target "
        f"{POWERSGD_SOCKET_TARGET:g}x {_verdict(min(ratios), POWERSGD_SOCKET_TARGET)}",
        [POWERSGD.format(key) for key in POWERSGD_SEEDS], True)


POWERSGD_LONG = "results/peer_codecs/powersgd_1800_mwms_loopback_seed{}.json"
POWERSGD_LONG_RANK1 = "results/peer_codecs/powersgd_rank1_1800_mwms_loopback_seed{}.json"
POWERSGD_LONG_SEEDS = 3
POWERSGD_ACCURACY_POINTS = -1.0


def powersgd_long_headline():
    """PowerSGD under MWMS over 1,800 steps (raw): socket bytes against fp32 (seed 0) and
    test accuracy against fp32 (mean of 3 seeds) for each rank; whether a rank met both
    targets (>= 20x fewer bytes, within 1 point)."""
    seeds = []
    for seed in range(POWERSGD_LONG_SEEDS):
        runs = {r["config"]: r for r in read_json(POWERSGD_LONG.format(seed))}
        runs.update({r["config"]: r for r in read_json(POWERSGD_LONG_RANK1.format(seed))})
        seeds.append(runs)
    sent = {k: r["socket_worker0_sent_bytes_per_step"] for k, r in seeds[0].items()}
    parts, both = [], []
    for rank in (1, 2, 4):
        name = f"powersgd:rank={rank}"
        points = np.mean([100 * (runs[name]["test_accuracy"] - runs["fp32"]["test_accuracy"])
                          for runs in seeds])
        ratio = sent["fp32"] / sent[name]
        parts.append(f"rank {rank}: {_x(ratio)} fewer bytes, {_points(points)} points")
        if ratio >= POWERSGD_SOCKET_TARGET and points >= POWERSGD_ACCURACY_POINTS:
            both.append(f"rank {rank}")
    verdict = f"both targets met at {', '.join(both)}" if both else "no rank met both targets"
    return Headline(
        "powersgd-mwms-1800", "; ".join(parts) + f" (1,800 steps, mean of {len(seeds)} "
        f"seeds); {verdict}",
        [POWERSGD_LONG.format(seed) for seed in range(POWERSGD_LONG_SEEDS)]
        + [POWERSGD_LONG_RANK1.format(seed) for seed in range(POWERSGD_LONG_SEEDS)], True)


POWERSGD_BFLOAT16 = "results/peer_codecs/powersgd_bfloat16_1800_mwms_loopback_seed{}.json"
POWERSGD_BFLOAT16_CONFIG = "powersgd:rank=3,factors_dtype=bfloat16"


def powersgd_bfloat16_headline():
    """PowerSGD rank 3 with bfloat16 factors under MWMS over 1,800 steps (raw): socket
    bytes against the same run's fp32 (seed 0), test accuracy against it (mean of 3
    seeds), and whether both targets were met."""
    seeds = [{r["config"]: r for r in read_json(POWERSGD_BFLOAT16.format(seed))}
             for seed in range(POWERSGD_LONG_SEEDS)]
    fp32, bf16 = seeds[0]["fp32"], seeds[0][POWERSGD_BFLOAT16_CONFIG]
    ratio = fp32["socket_worker0_sent_bytes_per_step"] / bf16["socket_worker0_sent_bytes_per_step"]
    points = np.mean([100 * (runs[POWERSGD_BFLOAT16_CONFIG]["test_accuracy"]
                             - runs["fp32"]["test_accuracy"]) for runs in seeds])
    met = ratio >= POWERSGD_SOCKET_TARGET and points >= POWERSGD_ACCURACY_POINTS
    return Headline(
        "powersgd-bfloat16-mwms-1800",
        f"rank 3, bfloat16 P and Q: {_x(ratio)} fewer bytes, {_points(points)} points (1,800 "
        f"steps, mean of {len(seeds)} seeds); both targets {'met' if met else 'not met'}",
        [POWERSGD_BFLOAT16.format(seed) for seed in range(POWERSGD_LONG_SEEDS)], True)


SIGNUM = "results/peer_codecs/signum_mwms_loopback_seed{}.json"
SIGNUM_VOTE = "results/peer_codecs/signum_vote_mwms_loopback_seed{}.json"


def signum_headline(key="signum-mwms", files=SIGNUM):
    """Signum under MWMS (raw): socket bytes against PowerSGD's fp32 run (seed 0) and test
    accuracy against fp32's (mean of the 3 seeds of each)."""
    fp32 = [{r["config"]: r for r in read_json(POWERSGD.format(suffix))}["fp32"]
            for suffix in POWERSGD_SEEDS]
    signum = [read_json(files.format(seed))[0] for seed in range(len(fp32))]
    points = 100 * (np.mean([r["test_accuracy"] for r in signum])
                    - np.mean([r["test_accuracy"] for r in fp32]))
    ratio = (fp32[0]["socket_worker0_sent_bytes_per_step"]
             / signum[0]["socket_worker0_sent_bytes_per_step"])
    return Headline(
        key, f"{_x(ratio)} fewer bytes, {_points(points)} points (mean of "
        f"{len(signum)} seeds)",
        [POWERSGD.format(suffix) for suffix in POWERSGD_SEEDS]
        + [files.format(seed) for seed in range(len(fp32))], True)


# --- accuracy of longer runs (recorded) ------------------------------------------------

LONG = "results/recorded/long_runs.csv"


def accuracy_gaps(epochs, compression, pulls):
    """{seed: points against fp32 of the same seed and length}."""
    rows = read_csv(LONG)
    fp32 = {r["seed"]: float(r["test_acc"]) for r in rows
            if r["epochs"] == str(epochs) and r["compression"] == "none"}
    return {r["seed"]: 100 * (float(r["test_acc"]) - fp32[r["seed"]]) for r in rows
            if r["epochs"] == str(epochs) and r["compression"] == compression
            and r["pulls"] == pulls}


def _mean_gap(epochs, compression, pulls):
    gaps = accuracy_gaps(epochs, compression, pulls)
    return f"{_points(np.mean(list(gaps.values())))} ({len(gaps)} seed{'s' * (len(gaps) > 1)})"


def accuracy_headlines():
    return [
        Headline("accuracy-s1", f"{_mean_gap(2, THREELC, 'threelc')} both ways; "
                 f"{_mean_gap(2, THREELC, 'fp32')} pushes only", [LONG], False),
        Headline("accuracy-s175",
                 f"{_mean_gap(2, THREELC_175, 'threelc')} at 2 epochs, "
                 f"{_mean_gap(6, THREELC_175, 'threelc')} at 6, "
                 f"{_mean_gap(12, THREELC_175, 'threelc')} at 12; "
                 f"{_mean_gap(2, THREELC_175, 'fp32')} pushes only at 2", [LONG], False),
    ]


# --- what crosses per step (raw: benchmarks/wire_breakdown.py's output) -------------------

BREAKDOWN = "results/wire_breakdown"
FUSED = "tensors sent: uint8 (fused messages)"
DIRECTIONS = {"push": "worker 0 -> PS", "pull": "PS -> worker 0"}
# Targets: 3LC's Table 2 ratios for ResNet-110 (s = 1.0 and 1.75), and the bytes a step
# may send outside its fused message each way.
WIRE_TARGETS = {THREELC: 39.4, THREELC_175: 107.0}
OUTSIDE_TARGET = 1024


# The two sets of runs, by the code they measured: the batch-norm statistics sent as
# float32 tensors of their own, or riding in the push message (the wire as it is).
APART, IN_PUSH = "statistics_as_tensors", "statistics_in_push"


def breakdown_file(label, model, spec):
    """The output file of one wire_breakdown run (`label`: APART or IN_PUSH)."""
    name = spec.replace(":", "_").replace(",", "_").replace("=", "_")
    return f"{BREAKDOWN}/{label}/{model}_{name}.txt"


def breakdown(label, model, spec):
    """{"push"/"pull": (bytes per step, of them outside the fused message)} of one run,
    from the JSON summary its output ends with."""
    with open(_path(breakdown_file(label, model, spec))) as f:
        summary = json.loads([line for line in f if line.startswith("{")][-1])
    return {d: (summary[key]["bytes_per_step"],
                summary[key]["bytes_per_step"] - summary[key]["kinds"].get(FUSED, 0.0))
            for d, key in DIRECTIONS.items()}


def _against(model, spec, baseline="none"):
    """{direction: fp32 (or `baseline`) bytes per step / `spec`'s}, same model."""
    base, ours = breakdown(IN_PUSH, model, baseline), breakdown(IN_PUSH, model, spec)
    return {d: base[d][0] / ours[d][0] for d in DIRECTIONS}


def _met(ratios, target):
    missed = [d for d in DIRECTIONS if ratios[d] < target]
    return f"target {target:g}x {'met' if not missed else 'missed (' + ', '.join(missed) + ')'}"


def wire_headlines():
    heads = []
    for model in ("resnet20", "resnet56", "resnet110"):
        for spec, tag in ((THREELC, ""), (THREELC_175, "-s175")):
            ratios = _against(model, spec)
            value = f"{_x(ratios['push'])} push, {_x(ratios['pull'])} pull; "
            if model == "resnet20" and spec == THREELC:
                fp16 = _against(model, spec, "fp16")
                value += f"against fp16 {_x(fp16['push'])}, {_x(fp16['pull'])}; "
            heads.append(Headline(
                f"wire-{model}{tag}", value + _met(ratios, WIRE_TARGETS[spec]),
                [breakdown_file(IN_PUSH, model, s) for s in ("none", spec)], True))
    before, after = (breakdown(label, "resnet20", THREELC_175) for label in (APART, IN_PUSH))
    outside = {d: after[d][1] for d in DIRECTIONS}
    heads.append(Headline(
        "wire-outside", f"{outside['push']:,.0f} B push, {outside['pull']:,.0f} B pull (were "
        f"{before['push'][1]:,.0f} and {before['pull'][1]:,.0f}); target "
        f"{OUTSIDE_TARGET:,} B {'met' if max(outside.values()) <= OUTSIDE_TARGET else 'missed'}",
        [breakdown_file(label, "resnet20", THREELC_175) for label in (APART, IN_PUSH)], True))
    return heads


WIRE_SPECS = ("none", "fp16", THREELC, "threelc:sparsity=1.75", THREELC_175,
              "threelc:sparsity=1.9", "threelc:sparsity=1.9,coder=entropy")
# The batch-norm statistics a push carries in its fused message: bfloat16 means and
# variances of the model's batch-norm channels (688, 2,032 and 4,048).
STATISTICS_BYTES = {"resnet20": 2 * 2 * 688, "resnet56": 2 * 2 * 2032, "resnet110": 2 * 2 * 4048}


def _ran(model, spec):
    """Whether a finished IN_PUSH run of `spec` on `model` is committed."""
    path = _path(breakdown_file(IN_PUSH, model, spec))
    return os.path.exists(path) and any(line.startswith("{") for line in open(path))


def wire_table():
    """The socket-ratio table of docs/results/wire.md, in Markdown, from the runs found."""
    lines = ["| model | compression | worker -> PS B/step | PS -> worker B/step | "
             "against fp32 | against fp16 |", "|---|---|---|---|---|---|"]
    for model in ("resnet20", "resnet56", "resnet110"):
        for spec in WIRE_SPECS:
            if not _ran(model, spec):
                continue
            ours = breakdown(IN_PUSH, model, spec)
            cells = []
            for baseline in ("none", "fp16"):
                if spec in ("none", "fp16") or not _ran(model, baseline):
                    cells.append("")
                    continue
                ratios = _against(model, spec, baseline)
                cells.append(f"{_x(ratios['push'])} / {_x(ratios['pull'])}")
            lines.append(f"| {model} | `{spec}` | {ours['push'][0]:,.0f} | "
                         f"{ours['pull'][0]:,.0f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def payload_table():
    """The ratios the sockets would show were the gradients' payload all that crossed:
    fp32's socket bytes per step against the fused message less its statistics (pushes)
    and against the pull message (pulls)."""
    lines = ["| model | compression | worker -> PS, the gradients' payload alone "
             "| PS -> worker, the pull payload alone |", "|---|---|---|---|"]
    for model in ("resnet20", "resnet56", "resnet110"):
        if not _ran(model, "none"):
            continue
        fp32 = breakdown(IN_PUSH, model, "none")
        for spec in WIRE_SPECS[2:]:
            if not _ran(model, spec):
                continue
            ours = breakdown(IN_PUSH, model, spec)
            push = ours["push"][0] - ours["push"][1] - STATISTICS_BYTES[model]
            pull = ours["pull"][0] - ours["pull"][1]
            lines.append(f"| {model} | `{spec}` | {_x(fp32['push'][0] / push)} "
                         f"| {_x(fp32['pull'][0] / pull)} |")
    return "\n".join(lines)


# --- the entropy coder -------------------------------------------------------------------

ENTROPY_RAW = "results/entropy_coder/entropy_coder.json"
ENTROPY_RECORDED = "results/recorded/entropy_coder.csv"


def entropy_ratios():
    """{sparsity: (ratio of total bytes, mean of per-message ratios or None)} and sources."""
    if os.path.exists(_path(ENTROPY_RAW)):
        data = read_json(ENTROPY_RAW)
        out = {}
        for row in data["bytes"]:
            zre, ent = np.array(row["zero_run_bytes"]), np.array(row["entropy_bytes"])
            out[row["sparsity"]] = (zre.sum() / ent.sum(), float(np.mean(zre / ent)))
        return out, [ENTROPY_RAW], True
    # Equal message counts per row: the ratio of the mean bytes is the ratio of the totals.
    return ({float(r["sparsity"]): (float(r["zero_run_bytes"]) / float(r["entropy_bytes"]),
                                    float(r["recorded_mean_of_ratios"]))
             for r in read_csv(ENTROPY_RECORDED)}, [ENTROPY_RECORDED], False)


def entropy_headlines():
    heads = []
    recorded = {float(r["sparsity"]): float(r["zero_run_bytes"]) / float(r["entropy_bytes"])
                for r in read_csv(ENTROPY_RECORDED)}
    heads.append(Headline(
        "entropy-coder-2026-11-25",
        f"{recorded[1.0]:.2f}x (s=1.0), {recorded[1.75]:.2f}x (s=1.75); target 3x at s=1.75 "
        f"{_verdict(recorded[1.75], ENTROPY_TARGET_AT_175)}", [ENTROPY_RECORDED], False))
    if os.path.exists(_path(ENTROPY_RAW)):
        ratios, sources, raw = entropy_ratios()
        heads.append(Headline(
            "entropy-coder",
            f"{ratios[1.0][0]:.2f}x (s=1.0), {ratios[1.75][0]:.2f}x (s=1.75); target 3x at "
            f"s=1.75 {_verdict(ratios[1.75][0], ENTROPY_TARGET_AT_175)}", sources, raw))
    return heads


CODEC_DEMO = "results/codec_demo/codec_demo.csv"


def codec_demo_headline():
    rows = {r["codec"]: r for r in read_csv(CODEC_DEMO)}
    ours = rows["3LC s=1.00"]
    return Headline("codec-demo-3lc", f"{float(ours['bits_per_value']):.3f} bits/value "
                    f"({float(ours['ratio']):.1f}x), error under feedback "
                    f"{float(ours['feedback_error']):.3f}", [CODEC_DEMO], True)


BENCH_CODECS = "results/codec_speed/every_codec_wall_time.json"


def bench_codecs_headline():
    data = read_json(BENCH_CODECS)
    rows = data["rows"]
    met = [r for r in rows if r["target_met"] == "yes"]
    return Headline("bench-codecs", f"{len(met)} of {len(rows)} codecs met the target "
                    f"(probe {data['probe_gbps']:.2f} GB/s)", [BENCH_CODECS], True)


CODEC_SPEED = "results/codec_speed/run{}.json"
CODEC_SPEED_RUNS = 5


def _codec_speed_rows():
    """[(codec, [its row in each of the five consecutive bench_codecs runs])], in the
    runs' order, and the runs' probes (GB/s)."""
    runs = [read_json(CODEC_SPEED.format(i)) for i in range(1, CODEC_SPEED_RUNS + 1)]
    rows = [(first["codec"], [run["rows"][i] for run in runs])
            for i, first in enumerate(runs[0]["rows"])]
    return rows, [run["probe_gbps"] for run in runs]


def _times_met(rows):
    return sum(row["target_met"] == "yes" for row in rows)


def codec_speed_headline():
    """Codecs that met the speed target in every one of five consecutive runs (raw)."""
    codecs, _ = _codec_speed_rows()
    runs = CODEC_SPEED_RUNS
    short = [f"{name} {_times_met(rows)} of {runs}" for name, rows in codecs
             if _times_met(rows) < runs]
    return Headline(
        "codec-speed-runs", f"{len(codecs) - len(short)} of {len(codecs)} codecs met the "
        f"target in {runs} of {runs} runs" + (f"; missed: {', '.join(short)}" if short else ""),
        [CODEC_SPEED.format(i) for i in range(1, runs + 1)], True)


def codec_speed_table():
    """Markdown: each codec's lowest encode and decode ratio to the probe over the five
    runs, and in how many it met the target."""
    codecs, probes = _codec_speed_rows()
    lines = ["| codec | lowest enc/probe | lowest dec/probe | lowest enc GB/s | lowest dec GB/s "
             "| runs meeting the target |", "|---|---|---|---|---|---|"]
    for name, rows in codecs:
        low = {key: min(r[key] for r in rows) for key in
               ("encode_over_probe", "decode_over_probe", "encode_gbps", "decode_gbps")}
        lines.append(f"| {name} | {low['encode_over_probe']:.2f} | "
                     f"{low['decode_over_probe']:.2f} | {low['encode_gbps']:.2f} | "
                     f"{low['decode_gbps']:.2f} | {_times_met(rows)} of {len(rows)} |")
    shown = ", ".join(f"{probe:.2f}" for probe in probes)
    return "\n".join(lines) + f"\n\nProbe, runs 1-{len(probes)}: {shown} GB/s."


# --- raw outputs of the studies -----------------------------------------------------------

PULL_LAG = "results/pull_lag/resnet20_400_steps.json"
FASTSGD_KEYS = "results/fastsgd_keys/reuters_corn.json"
FASTSGD_PS = "results/recorded/fastsgd_ps.csv"
MQGRAD = "results/mqgrad/measured_10mbit"
GRADIVEQ = "results/gradiveq/2000_steps"
FUZZ = "results/recorded/fuzz.csv"


def pull_lag_headline():
    runs = {r["sparsity"]: r for r in read_json(PULL_LAG)["runs"]}
    return Headline("pull-lag", f"{runs[1.0]['mean_lag_second_half']:.1f} steps (s=1.0) to "
                    f"{runs[1.75]['mean_lag_second_half']:.1f} (s=1.75)", [PULL_LAG], True)


def fastsgd_headlines():
    rows = {r["flag_bits"]: r for r in read_json(FASTSGD_KEYS)["summary"]["rows"]}
    ps = {r["push"]: r for r in read_csv(FASTSGD_PS)}
    ratio = (int(ps["fp32 plain reads"]["worker_to_ps_bytes_per_step"])
             / int(ps["fastsgd:threshold=100"]["worker_to_ps_bytes_per_step"]))
    return [Headline("fastsgd-keys", f"{rows[2]['bits_per_key']:.2f} bits/key at l=2",
                     [FASTSGD_KEYS], True),
            Headline("fastsgd-ps", f"{ratio:.2f}x fewer worker->PS bytes", [FASTSGD_PS], False)]


def _time_to(run, level):
    """Measured time at which the run's loss EMA first reaches `level` (inf if never), as
    benchmarks/mqgrad_experiment.py computes it (losses after a divergence do not count)."""
    losses = np.array(run["loss"], np.float64)
    bad = np.nonzero(~np.isfinite(losses) | (losses < 0) | (losses > 1e6))[0]
    if bad.size:
        losses[bad[0]:] = np.nan
    below = np.nonzero(ema(losses) <= level)[0]
    return run["time_s"][below[0]] if below.size else float("inf")


def mqgrad_headline():
    files = sorted(glob.glob(os.path.join(_path(MQGRAD), "*.json")))
    runs = [r for f in files for r in json.load(open(f))["results"]]
    levels = read_json(os.path.relpath(files[0], ROOT))["args"]["loss_targets"]
    first, pairs = {}, 0
    for level in levels:
        for seed in sorted({r["seed"] for r in runs}):
            times = {r["method"]: _time_to(r, level) for r in runs if r["seed"] == seed}
            if np.isfinite(min(times.values())):
                pairs += 1
                winner = min(times, key=times.get)
                first[winner] = first.get(winner, 0) + 1
    best = max(first, key=first.get)
    bits = np.mean([np.mean(r["bits"]) for r in runs if r["method"] == "MQGrad"])
    return Headline("mqgrad-10mbit", f"{best} first in {first[best]} of {pairs} seed-target "
                    f"pairs; MQGrad averaged {bits:.2f} bits", [MQGRAD + "/"], True)


def _gradiveq_runs(pattern):
    """{seed: (GradiVeQ accuracy, bytes ratio)} of the 2,000-step runs matching `pattern`,
    and {seed: the uncompressed run's accuracy} from whichever file holds it."""
    ours, uncompressed = {}, {}
    for path in sorted(glob.glob(os.path.join(_path(GRADIVEQ), "*.json"))):
        data = json.load(open(path))
        seed, accuracy = data["args"]["seed"], data["accuracy"]
        if isinstance(accuracy, dict):
            uncompressed[seed] = accuracy["uncompressed"]
        if os.path.basename(path).startswith(pattern):
            traffic = data["traffic"]
            ours[seed] = (accuracy["gradiveq"] if isinstance(accuracy, dict) else accuracy,
                          traffic["push_dense_bytes"] / traffic["push_bytes"])
    return ours, uncompressed


def gradiveq_headlines():
    heads = []
    for name, pattern in (("gradiveq-uncentred", "uncentred_lc100_"), ("gradiveq-pooled", "pooled_s")):
        ours, uncompressed = _gradiveq_runs(pattern)
        gaps = [100 * (ours[s][0] - uncompressed[s]) for s in sorted(ours)]
        ratios = [ours[s][1] for s in ours]
        heads.append(Headline(
            name, f"{_span(ratios, lambda v: f'{v:.2f}x')} fewer bytes; {_points(np.mean(gaps))} "
            f"points mean, {_points(np.median(gaps))} median ({len(gaps)} seeds)",
            [GRADIVEQ + "/"], True))
    return heads


def fuzz_headline():
    rows = read_csv(FUZZ)
    execs = sum(int(r["execs"]) for r in rows)
    crashes = sum(int(r["crashes"]) for r in rows)
    return Headline("fuzz", f"{len(rows)} targets, {execs / 1e6:.1f}M executions, "
                    f"{crashes} crashes", [FUZZ], False)


ROUND_TRIPS = ("results/round_trips/ps.json", "results/round_trips/mwms.json",
               "results/round_trips/steps_per_execution.json")
# Round trips a step may pay: synchronous compressed steps, and local steps (per H).
ROUND_TRIPS_TARGET, ROUND_TRIPS_PER_H_TARGET = 1.5, 1.5
ROUND_TRIPS_NAMES = {"fp32": "fp32", "threelc": "ThreeLC", "threelc-h4": "H=4",
                     "threelc-h16": "H=16", "threelc-spe4": "ThreeLC with 4 steps per call",
                     "threelc-h16-spe16": "H=16 with 16 steps per call"}


def round_trips_headlines():
    """Round trips per step under each strategy (raw, benchmarks.round_trips): the slope of
    step time against RTT, and the targets' verdicts on the compressed configurations."""
    return [head for path in ROUND_TRIPS for head in _round_trips_headlines(path)]


def _round_trips_headlines(path):
    from benchmarks.link_configs import local_steps
    from benchmarks.round_trips import fit

    results = read_json(path)
    rows = [r for r in results["rows"] if "error" not in r]
    heads = []
    for strategy in results["strategies"]:
        parts, met, inside = [], [], []
        for config in results["configs"]:
            mine = [r for r in rows if (r["strategy"], r["config"]) == (strategy, config)]
            if len(mine) < 2:
                continue
            slope = fit(mine)[0]
            parts.append(f"{ROUND_TRIPS_NAMES.get(config, config)} {slope:.2f}")
            if all(r.get("in_epoch_step_time_s") is not None for r in mine):
                inside.append(f"{fit(mine, 'in_epoch_step_time_s')[0]:.2f}")
            if config != "fp32":
                h = local_steps(config)
                target = ROUND_TRIPS_TARGET if h == 1 else ROUND_TRIPS_PER_H_TARGET / h
                met.append(slope <= target)
        verdict = ("met" if all(met) else "missed" if not any(met)
                   else f"met by {sum(met)} of {len(met)}")
        within = (f" ({', '.join(inside)} inside Keras epochs, the time between epochs "
                  "left out)" if len(inside) == len(parts) else "")
        stem = os.path.splitext(os.path.basename(path))[0]
        name = f"round-trips-{strategy}" + ("" if stem == strategy else f"-{stem}".replace("_", "-"))
        heads.append(Headline(
            name, ", ".join(parts) + " round trips per step" + within
            + "; target "
            f"<= 1.5 (synchronous), <= 1.5/H (local steps) {verdict}", [path], True))
    return heads


TIME_TO_ACCURACY = "results/time_to_accuracy/ps_10mbit_50ms_rtt.json"
TIME_TO_ACCURACY_LINK = ("10mbit/25ms", "10 Mbit/s + 50 ms RTT")
# The targets at that link: times sooner than fp32 and than bf16.
TIME_TO_ACCURACY_TARGETS = {"fp32": 10.0, "bf16": 5.0}


def time_to_accuracy_headline():
    """The best configuration's time to the held-out target against fp32 and bf16 on
    10 Mbit/s + 50 ms RTT under parameter servers (raw, benchmarks.time_to_accuracy)."""
    from benchmarks.time_to_accuracy import summarize

    results = read_json(TIME_TO_ACCURACY)
    summary = summarize(results, with_floors=False)
    link, said = TIME_TO_ACCURACY_LINK
    on_link = [s for s in summary["speedups"] if s["link"] == link]
    seeds = ",".join(map(str, results["seeds"]))
    if not any(s["against"] == "fp32" for s in on_link):
        value = f"no tfgc configuration reached test accuracy {summary['target']:.3f} on {said}"
    else:
        best = max((s for s in on_link if s["against"] == "fp32"),
                   key=lambda s: s["ratio_of_totals"])
        parts = []
        for s in on_link:
            if s["config"] != best["config"]:
                continue
            note = [n for n, on in (("against an estimate", s["against_estimated"]),
                                    ("which did not reach it", s["at_least"])) if on]
            target = TIME_TO_ACCURACY_TARGETS[s["against"]]
            parts.append(f"{'>= ' if s['at_least'] else ''}{_x(s['ratio_of_totals'])} sooner "
                         f"than {s['against']}" + (f" ({', '.join(note)})" if note else "")
                         + f", target {target:g}x {_verdict(s['ratio_of_totals'], target)}")
        value = (f"{best['config']} to test accuracy {summary['target']:.3f} on {said}: "
                 f"{'; '.join(parts)}; seeds {','.join(map(str, best['seeds']))} of {seeds}, "
                 f"{results['rows'][0]['steps']} steps")
    return Headline("time-to-accuracy-ps", value, [TIME_TO_ACCURACY], True)


def compute():
    """Every headline, in the order of docs/results/index.md."""
    return (demo_headlines() + [demo_links_headline(), demo_links_sockets_headline(),
                                 sparse_embeddings_headline()] + round_trips_headlines()
            + [time_to_accuracy_headline()]
            + local_steps_headlines()
            + [powersgd_headline(), powersgd_long_headline(), powersgd_bfloat16_headline(),
               signum_headline(),
               signum_headline("signum-vote-mwms", SIGNUM_VOTE)]
            + accuracy_headlines() + wire_headlines() + entropy_headlines()
            + [codec_demo_headline(), bench_codecs_headline(), codec_speed_headline(),
               pull_lag_headline()] + fastsgd_headlines() + [mqgrad_headline()]
            + gradiveq_headlines() + [fuzz_headline()])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--wire-table" in argv:
        print(wire_table() + "\n\n" + payload_table())
        return 0
    if "--codec-speed-table" in argv:
        print(codec_speed_table())
        return 0
    for head in compute():
        kind = "raw output" if head.raw else "recorded table, raw output not kept"
        print(f"{head.id}: {head.value}\n    from {', '.join(head.sources)} ({kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
