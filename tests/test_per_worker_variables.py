"""tfgc's per-worker variables on a real parameter-server cluster: each worker's copy is
a resource that a traced function finds by name on the worker running it, so a call
from the coordinator carries no handle for it, however many such variables the step
touches and however often."""
import pytest

import cluster_scripts

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ACCESSES = 40  # reads and writes of the first variable in each step
VARIABLES = 20  # per-worker variables the step touches
CALLS = 50

COORDINATOR = cluster_scripts.script(
    f"""
    import gc

    from tfgc.distribute import local_variable

    tfgc_made = sys.argv[1] == "tfgc"
    workers = [f"/job:worker/replica:0/task:{{w}}" for w in range(2)]

    def make(name):
        if tfgc_made:  # as tfgc makes its residuals, caches and local-steps state
            return local_variable(tf.zeros([4]), name, per_worker=True)
        return tf.Variable(tf.zeros([4]), per_worker_variable=True)  # TensorFlow's own

    def resource_exists(name, worker):
        with tf.device(worker):
            handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4], shared_name=name)
            return bool(tf.raw_ops.VarIsInitializedOp(resource=handle).numpy())

    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=120) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            counters = [make(f"counter{{i}}") for i in range({VARIABLES})]

        def update():
            seen = []
            for _ in range({ACCESSES}):
                counters[0].assign_add(tf.ones([4]))
                seen.append(counters[0].read_value()[0])
            for counter in counters[1:]:
                counter.assign_add(tf.ones([4]))
            return tf.stack(seen)

        step = tf.function(update)

        @tf.function
        def tagged_step():  # which worker ran it, and its count after
            return (tf.distribute.coordinator.experimental_get_current_worker_index(),
                    update()[-1])

        first = coordinator.schedule(step)
        coordinator.join()
        rows = c.settled_socket_bytes()
        before = c.traffic_between("chief", "worker", rows=rows)
        calls = [coordinator.schedule(step) for _ in range({CALLS})]
        coordinator.join()
        rows = c.settled_socket_bytes()
        sent = c.traffic_between("chief", "worker", rows=rows) - before
        report = {{"bytes_per_call": sent / {CALLS}, "first": first.fetch().tolist(),
                   "last": calls[-1].fetch().tolist(),
                   "before_tagged": [float(v.numpy()[0]) for v in counters[0].read_all()]}}
        tagged = [coordinator.schedule(tagged_step) for _ in range({CALLS})]
        coordinator.join()
        report["tagged"] = [[int(worker), float(count)]
                            for worker, count in (call.fetch() for call in tagged)]
        report["per_worker"] = [[float(v.numpy()[0]) for v in counter.read_all()]
                                for counter in counters]
        if tfgc_made:
            # Each worker's copy is a named resource, destroyed with its variable.
            name = counters[0]._tfgc_graph_handle._resource_name
            report["exists"] = [resource_exists(name, w) for w in workers]
            del counters, step, tagged_step, first, calls, tagged
            gc.collect()
            report["exists_after_del"] = [resource_exists(name, w) for w in workers]
        send_report(report)
    """
)


def test_a_step_passes_no_handle_for_per_worker_variables(run_report):
    plain, made = (run_report(COORDINATOR, timeout=240, args=[kind])
                   for kind in ("plain", "tfgc"))
    # TensorFlow passes a handle at each of the step's 99 accesses, and the coordinator
    # sends every one with every call (over 20 KB a call); passing one handle per
    # variable would still send about 1.8 KB. tfgc's call carries none: under 1 KB.
    assert made["bytes_per_call"] < 1024 < 20 * 1024 < plain["bytes_per_call"]
    # One resource tensor per variable also orders its accesses: each read sees the
    # write before it (the first call runs on a worker whose copy is fresh).
    assert made["first"] == [float(i) for i in range(1, ACCESSES + 1)]
    last = made["last"]
    assert last == [last[0] + i for i in range(ACCESSES)] and last[0] % ACCESSES == 1
    # Each worker updates its own copies: every variable's copy on a worker counts that
    # worker's calls (the first variable ACCESSES a call, the others one), and the
    # counts add up to the calls.
    for result in (plain, made):
        calls_on = [count / ACCESSES for count in result["per_worker"][0]]
        assert sum(calls_on) == 1 + 2 * CALLS
        assert all(copies == calls_on for copies in result["per_worker"][1:])
    # And the calls a worker ran (tagged with its index) counted on from its copy's
    # count, one after the other, to its copy's count at the end. (TensorFlow's own
    # per-worker variables do not order a read after the write before it.)
    for worker in range(2):
        start = made["before_tagged"][worker]
        ends = sorted(count for index, count in made["tagged"] if index == worker)
        assert ends == [start + ACCESSES * (i + 1) for i in range(len(ends))]
        assert made["per_worker"][0][worker] == start + ACCESSES * len(ends)
    assert made["exists"] == [True, True]
    assert made["exists_after_del"] == [False, False]
