"""What the check of a non-finite step costs a parameter-server step on a link with delay.

    python -m tfgc.cluster.private python -m benchmarks.finite_check_latency

Under ParameterServerStrategy the worker checks what it sends (its payloads and
residuals) and the servers skip a step it flags (`tfgc.optimizer.finite_steps`). This
times one step (four 64x64 variables, ThreeLC, two servers and one worker on links of
25 ms one-way delay: 50 ms round trips) with the check and without it (the optimizer's
unchecked send, run in the same process for the baseline), each a median of 15 steps
after 3 warm-up steps, the two alternating over `--rounds` rounds. Raw output:
`results/finite_check/latency.json`.
"""
import argparse
import json
import os
import statistics
import time

import tensorflow as tf
import tf_keras

import tfgc
from tfgc import cluster, codecs
from tfgc.optimizer import finite_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "finite_check", "latency.json")


def unchecked_send(optimizer, strategy, grads_and_vars, aggregate):
    """The send without the check: what `send_checked` adds is what is measured."""
    return optimizer._send_all(strategy, grads_and_vars, aggregate), None  # noqa: SLF001


def step_times(strategy, coordinator, steps, warmup):
    """Seconds per step (median of `steps`) of a fresh optimizer's compressed step."""
    with strategy.scope():
        variables = [tf.Variable(tf.random.normal([64, 64]), name=f"v{i}") for i in range(4)]
        optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.01),
                                              compression=codecs.ThreeLC(1.0))
        optimizer.build(variables)

    @tf.function
    def step():
        def replica_fn():
            grads = [tf.random.normal([64, 64]) for _ in variables]
            optimizer.apply_gradients(list(zip(grads, variables)))
        strategy.run(replica_fn)

    times = []
    for index in range(warmup + steps):
        started = time.perf_counter()
        coordinator.schedule(step)
        coordinator.join()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", default="25ms", help="each link's one-way delay")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    checked_send = finite_steps.send_checked
    rows = []
    with cluster.LocalCluster(num_ps=2, num_workers=1, delay=args.delay, timeout_s=600) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        for round_ in range(args.rounds):
            for check, send in (("none", unchecked_send), ("worker", checked_send)):
                finite_steps.send_checked = send
                median = step_times(strategy, coordinator, args.steps, warmup=3)
                rows.append({"round": round_, "check": check, "median_step_s": median})
                print(f"round {round_}: check {check:6s} {median * 1e3:7.1f} ms per step",
                      flush=True)
    finite_steps.send_checked = checked_send
    totals = {check: sum(r["median_step_s"] for r in rows if r["check"] == check)
              for check in ("none", "worker")}
    result = {"delay": args.delay, "servers": 2, "workers": 1, "rows": rows,
              "checked_over_unchecked": totals["worker"] / totals["none"]}
    print(f"checked / unchecked step time: {result['checked_over_unchecked']:.3f}")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
