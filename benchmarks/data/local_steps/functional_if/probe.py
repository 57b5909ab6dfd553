"""What a step that may touch a parameter server costs when it does not: one worker
adds to a server variable in a `tf.cond` branch taken every PERIOD steps, the `If` op
lowered to switches (TensorFlow's default) or kept functional; per step, the bytes
the worker and the server sent each other over 64 steps (kernel socket counters).

    python -m tfgc.cluster.private python probe.py {lowered,functional,no-branch} PERIOD
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import attr_value_pb2  # noqa: E402

from tfgc import cluster, server_variables  # noqa: E402
from tfgc.distribute import local_variable  # noqa: E402

MODE, PERIOD, STEPS = sys.argv[1], int(sys.argv[2]), 64

with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=120) as c:
    strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        total = server_variables.by_name(tf.Variable(tf.zeros([1000])))
        counter = local_variable(tf.zeros([], tf.int64), "counter", per_worker=True)

    @tf.function
    def step():
        due = tf.equal(counter.assign_add(1) % PERIOD, 0)
        values = tf.random.normal([1000])

        def add():
            total.assign_add(values)
            return tf.constant(1)

        if MODE == "no-branch":
            return tf.constant(0)
        taken = tf.cond(due, add, lambda: tf.constant(0))
        for op in tf.compat.v1.get_default_graph().get_operations():
            if op.type in ("If", "StatelessIf"):
                op._set_attr("_lower_using_switch_merge",  # noqa: SLF001
                             attr_value_pb2.AttrValue(b=MODE == "lowered"))
        return taken

    for _ in range(8):  # traced, registered, warm
        coordinator.schedule(step)
    coordinator.join()
    rows = c.settled_socket_bytes()
    up, down = (c.traffic_between(*pair, rows=rows) for pair in [("worker", "ps"), ("ps", "worker")])
    calls = [coordinator.schedule(step) for _ in range(STEPS)]
    coordinator.join()
    rows = c.settled_socket_bytes()
    print(json.dumps({
        "mode": MODE, "period": PERIOD, "steps": STEPS,
        "branches_taken": int(sum(call.fetch() for call in calls)),
        "worker_to_ps_bytes_per_step": (c.traffic_between("worker", "ps", rows=rows) - up) / STEPS,
        "ps_to_worker_bytes_per_step": (c.traffic_between("ps", "worker", rows=rows) - down) / STEPS,
    }), flush=True)
