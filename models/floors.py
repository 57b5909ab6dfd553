"""The least time a distributed step can take: its compute floor and its link floor.

A floor is a time no implementation can beat in the same setup, so a run's "share of
the floor" (floor / measured step time) is at most 100%:

- compute floor: the same step with no communication at all. `workers` processes of
  `models.train --strategy local` (variables local, the same model and batch) train
  side by side on the same machine. Under parameter servers a step is one worker's
  (the workers' steps overlap), so the floor is 1 / (the sum of their step rates);
  under all-reduce a step is every worker's, so it is their slowest step time.
- link floor: the bytes the busiest link carries per step (measured on the sockets) /
  the link's rate, plus the round trips no implementation can avoid x the RTT. Under
  parameter servers a worker's step must push and then pull before its next one: one
  round trip, and the workers' steps overlap, so 1 / workers per step. Under all-reduce
  a step's payloads must cross once: half a round trip. H local steps share both (/ H).

The floor of a step is the larger of the two.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def compute_floor(train_args, workers, all_reduce, timeout_s=1800):
    """Measures the compute floor of a step (seconds).

    Args:
      train_args: `models.train` arguments of the model, data and batch (no
        --strategy, --out or --compression).
      workers: processes that train side by side, one per worker of the real run.
      all_reduce: True when a step is every worker's (MWMS), False when it is one
        worker's (parameter servers).
      timeout_s: how long the processes may take.

    Returns:
      {"worker_step_s": [each process's step time], "floor_step_s": the floor}.

    Raises:
      RuntimeError: a process failed (the message ends with its stderr).
    """
    outs = [tempfile.mkdtemp(prefix="tfgc-floor-") for _ in range(workers)]
    try:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "models.train", "--strategy", "local", *train_args,
             "--compression", "none", "--verbose", "0", "--out", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for out in outs]
        steps = []
        for proc, out in zip(procs, outs):
            _, err = proc.communicate(timeout=timeout_s)
            if proc.returncode != 0:
                raise RuntimeError(f"a compute-floor run failed: {err[-1500:]}")
            with open(os.path.join(out, "summary.json")) as f:
                steps.append(json.load(f)["step_time_s"])
    finally:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    floor = max(steps) if all_reduce else 1 / sum(1 / s for s in steps)
    return {"worker_step_s": steps, "floor_step_s": floor}


def link_floor(summary, link, workers, local_steps=1):
    """The link floor of a step (seconds) of a `models.train` summary, or None.

    Args:
      summary: the run's summary: its socket bytes per step.
      link: the emulated link ("10mbit/25ms"; see `tfgc.cluster.netem.parse_link`), or
        None / "loopback" (no floor: the rate is not known).
      workers: the run's workers.
      local_steps: H, the steps between meetings (1: synchronous).

    Returns:
      {"busiest_link_bytes_per_step", "round_trips", "rtt_s", "floor_step_s"}, or None.
    """
    from tfgc.cluster import netem

    if link in (None, "loopback"):
        return None
    parts = netem.parse_link(link)
    rtt = 2 * netem.parse_delay(parts["delay"] or "0ms")
    if summary.get("socket_ps_to_worker_bytes_per_step") is not None:
        # Each task's rate shapes what it sends: the server's link carries every pull,
        # each worker's link its own pushes.
        busiest = max(summary["socket_ps_to_worker_bytes_per_step"] or 0,
                      (summary["socket_worker_to_ps_bytes_per_step"] or 0) / workers)
        round_trips = 1 / (workers * local_steps)
    else:
        busiest = summary.get("socket_worker0_sent_bytes_per_step") or 0
        round_trips = 0.5 / local_steps
    rate = netem.parse_rate(parts["bandwidth"]) if parts["bandwidth"] else float("inf")
    return {"busiest_link_bytes_per_step": busiest, "round_trips": round_trips, "rtt_s": rtt,
            "floor_step_s": busiest * 8 / rate + round_trips * rtt}
