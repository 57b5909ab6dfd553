"""Draws the plots of docs/results/ from the raw output committed in results/.

    python -m benchmarks.plots [--out DIR]

Writes docs/results/plots/ (or --out). Only numpy and matplotlib: no TensorFlow. The
plots there whose runs' data was not kept (the ResNet-20 training curves
threelc_ps_*.png, MQGrad's modelled-time studies mqgrad_long.png and
mqgrad_variants.png) are not redrawn; the results pages say so where they show them.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

from benchmarks.series import ema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOTS = os.path.join(ROOT, "docs", "results", "plots")
MQGRAD = os.path.join(ROOT, "results", "mqgrad", "measured_10mbit")
GRADIVEQ = os.path.join(ROOT, "results", "gradiveq")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _runs_on_grid(runs, grid):
    """The loss EMA of each run at the measured times `grid` (NaN past a run's end)."""
    curves = []
    for run in runs:
        losses = np.array(run["loss"], np.float64)
        bad = np.nonzero(~np.isfinite(losses) | (losses < 0) | (losses > 1e6))[0]
        if bad.size:
            losses[bad[0]:] = np.nan
        values = np.interp(grid, run["time_s"], ema(losses))
        values[grid > run["time_s"][-1]] = np.nan
        curves.append(values)
    return np.array(curves)


def mqgrad_measured(out):
    """Loss against measured time on a 10 Mbit/s link (median of the seeds), and the bits
    MQGrad and Adaptive sent over time in the first seed."""
    plt = _pyplot()
    files = sorted(glob.glob(os.path.join(MQGRAD, "*.json")))
    runs = [r for f in files for r in json.load(open(f))["results"]]
    budget = json.load(open(files[0]))["args"]["budget_s"]
    methods = list(dict.fromkeys(sorted((r["method"] for r in runs), key=_method_order)))
    first_seed = min(r["seed"] for r in runs)
    grid = np.linspace(0, budget, 200)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in methods:
        curves = _runs_on_grid([r for r in runs if r["method"] == method], grid)
        left.plot(grid, np.nanmedian(curves, axis=0), label=method)
    left.set_xlabel("measured time (s): 1 PS + 1 worker, links shaped to 10 Mbit/s")
    left.set_ylabel("training loss (EMA)")
    left.set_title(f"loss vs measured time (median of {len({r['seed'] for r in runs})} seeds)")
    left.set_ylim(0.2, 1.5)
    left.legend(fontsize=8)
    for run in runs:
        if run["seed"] == first_seed and run["method"] in ("MQGrad", "Adaptive"):
            right.plot(run["time_s"], run["bits"], label=run["method"], alpha=0.8)
    right.set_xlabel("measured time (s)")
    right.set_ylabel("bits per value (quantized layers)")
    right.set_title(f"bits over time (seed {first_seed})")
    right.set_ylim(1.5, 8.5)
    right.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "mqgrad_measured.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _method_order(method):
    return (not method.startswith("Fix"), len(method), method)


def gradiveq_loss(json_path, png_path, title):
    """Training loss (20-step mean) of the uncompressed and the GradiVeQ run of one study,
    with GradiVeQ's sampling and compressed phases shaded."""
    plt = _pyplot()
    data = json.load(open(json_path))
    args = data["args"]
    fig = plt.figure(figsize=(6, 3.5))
    for key in ("uncompressed", "gradiveq"):
        losses = np.convolve(data["losses"][key], np.ones(20) / 20, mode="valid")
        plt.plot(losses, label=key)
    start, cycle = args["warmup"], args["sampling"] + args["compressed"]
    for begin in range(start, args["steps"], cycle):
        plt.axvspan(begin, min(args["steps"], begin + args["sampling"]), color="orange",
                    alpha=0.15, label="QSGD sampling" if begin == start else None)
        plt.axvspan(begin + args["sampling"], min(args["steps"], begin + cycle), color="green",
                    alpha=0.1, label="GradiVeQ" if begin == start else None)
    plt.xlabel("step")
    plt.ylabel("training loss (20-step mean)")
    plt.title(title, fontsize=9)
    plt.legend(fontsize=8)
    plt.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def gradiveq_figure5(json_path, png_path):
    """Relative compression loss of a first-slice compressor against the slice size K."""
    return draw_gradiveq_figure5(json.load(open(json_path))["figure5"], png_path)


def draw_gradiveq_figure5(fig5, png_path):
    """`gradiveq_figure5` from the study's "figure5" record."""
    plt = _pyplot()
    points = fig5["points"]
    fig = plt.figure(figsize=(6, 3.5))
    plt.plot([p["slice_size"] for p in points], [p["loss_others"] for p in points], "o-",
             label="other slices")
    plt.plot([p["slice_size"] for p in points], [p["loss_first"] for p in points], "s--",
             label="first (sampled) slice")
    for x in (256, 512, 768):
        plt.axvline(x, color="grey", lw=0.5)
    plt.xlabel("slice size K")
    plt.ylabel("relative compression loss")
    plt.title(f"{fig5['layer']} (3,3,16,16): first-slice compressor")
    plt.legend()
    plt.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=PLOTS, help="write the plots here (default: %(default)s)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    def target(name):
        return os.path.join(args.out, name)

    study = os.path.join(GRADIVEQ, "500_steps", "gradiveq_study.json")
    written = [
        mqgrad_measured(args.out),
        gradiveq_loss(study, target("gradiveq_loss.png"),
                      "ResNet-20, 500 steps, GradiVeQ with the paper's settings (seed 0)"),
        gradiveq_figure5(study, target("gradiveq_fig5.png")),
        gradiveq_loss(os.path.join(GRADIVEQ, "2000_steps", "paper_s0.json"),
                      target("gradiveq_2000_loss_paper_s0.png"),
                      "ResNet-20, 2,000 steps, the paper's settings (L_c = 400, seed 0)"),
        gradiveq_loss(os.path.join(GRADIVEQ, "2000_steps", "uncentred_lc100_s2.json"),
                      target("gradiveq_2000_loss_uncentred_lc100_s2.png"),
                      "ResNet-20, 2,000 steps, without the mean, L_c = 100 (seed 2)"),
    ]
    for path in written:
        print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
