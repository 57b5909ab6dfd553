"""Loss and accuracy against wall-clock time and against steps, for one or more runs.

    python -m models.plots runs/a runs/b -o compare.png

Each run is a directory written by `models.train` (history.csv + summary.json). One
figure overlays all runs, like the papers' training curves: 2x2 panels, training loss
and training accuracy (a moving average over `smooth` steps) against seconds and
against steps.
"""
import argparse
import csv
import json
import os
import sys


def read_run(path):
    """(label, rows) of a run directory; rows are dicts of floats from history.csv."""
    with open(os.path.join(path, "history.csv")) as f:
        rows = [{k: (float(v) if v not in ("", None) else None) for k, v in r.items()}
                for r in csv.DictReader(f)]
    label = os.path.basename(os.path.normpath(path))
    summary_path = os.path.join(path, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        where = summary.get("strategy", "?")
        if summary.get("link") or summary.get("bandwidth"):
            where += f", {summary.get('link') or summary['bandwidth']}"
        label = f"{summary.get('compression', label)} ({where})"
        if summary.get("test_accuracy") is not None:
            label += f", test acc {summary['test_accuracy']:.3f}"
    return label, rows


def moving_average(values, window):
    """Trailing mean over `window` values (over fewer at the start)."""
    out, total, kept = [], 0.0, []
    for v in values:
        kept.append(v)
        total += v
        if len(kept) > window:
            total -= kept.pop(0)
        out.append(total / len(kept))
    return out


def plot_runs(run_dirs, out_png, smooth=20, title=None):
    """Writes a PNG overlaying the runs' loss and accuracy vs time and vs steps.

    Args:
      run_dirs: directories written by `models.train`.
      out_png: output path.
      smooth: moving-average window in steps.
      title: figure title (default: the dataset of the first run).

    Raises:
      ImportError: matplotlib is not installed (pip install matplotlib).
    """
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install matplotlib") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    dataset = None
    for run_dir in run_dirs:
        label, rows = read_run(run_dir)
        if dataset is None and os.path.exists(os.path.join(run_dir, "summary.json")):
            with open(os.path.join(run_dir, "summary.json")) as f:
                s = json.load(f)
            dataset = s.get("dataset")
            if s.get("substitute_for"):
                dataset += f" (substitute for {s['substitute_for']})"
        for row_index, key in enumerate(("loss", "accuracy")):
            points = [(r["step"], r["time_s"], r[key]) for r in rows if r.get(key) is not None]
            if not points:
                continue
            steps, times, values = zip(*points)
            values = moving_average(values, smooth)
            axes[row_index][0].plot(times, values, label=label)
            axes[row_index][1].plot(steps, values, label=label)
    for row_index, key in enumerate(("training loss", "training accuracy")):
        axes[row_index][0].set_xlabel("time (s)")
        axes[row_index][1].set_xlabel("step")
        for ax in axes[row_index]:
            ax.set_ylabel(key)
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8)
    smoothing = f" (moving average over {smooth} points)" if smooth > 1 else ""
    fig.suptitle(title or f"dataset: {dataset or '?'}{smoothing}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m models.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories written by models.train")
    parser.add_argument("-o", "--out", default="runs/compare.png", help="output PNG")
    parser.add_argument("--smooth", type=int, default=20, help="moving-average window (steps)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    print(plot_runs(args.runs, args.out, args.smooth, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
