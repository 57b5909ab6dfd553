"""What the server's part of a parameter-server step waits for from the worker.

Inside a step, TensorFlow's receiver asks for each tensor that crosses between
processes, and the server's part of the step asks only once it has started: any tensor
the server needs from the worker costs one more round trip before the server can use
it (`docs/results/round-trips.md`). So the compressed pull's server side reads each
worker's pull state from a copy of it on the server: this checks, in the traced graph
of a step's reads on a real cluster, that no op the server runs for the pull depends on
an op of the worker's. tf_keras's step counter (on a server) waits for the step's loss,
and `fit` reads `steps_per_execution` (on a server) before it schedules each step,
and at each epoch's ends resets and reads the metrics (on a server) one variable at a
time, unless the model was compiled with a tfgc optimizer: that the counter still
counts, where the variable lives and that the metrics read true are checked here, what
they save is measured by `benchmarks.round_trips`.
"""
import pytest

import cluster_scripts

COORDINATOR = cluster_scripts.script(
    """
    def on_server(op):
        return "/job:ps" in op.device

    def worker_ops_before(op):
        # The ops of the worker (or placed nowhere yet) that `op` waits for, directly or
        # through other ops; a function's arguments (the handles) are not waited for.
        seen, stack, found = set(), [op], []
        while stack:
            current = stack.pop()
            for before in [t.op for t in current.inputs] + list(current.control_inputs):
                # (A constant is placed with the op that takes it.)
                if before.name in seen or before.type in ("Placeholder", "Const"):
                    continue
                seen.add(before.name)
                if not on_server(before):
                    found.append(f"{before.type} {before.name}")
                stack.append(before)
        return found

    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=240) as c:
        strategy = tf.distribute.ParameterServerStrategy(c.resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        servers = tfgc.ParameterServers(tfgc.codecs.ThreeLC(1.0))
        with strategy.scope():
            with servers.scope():
                model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                                             tf_keras.layers.Dense(1)])
                model.build((None, 16))
            plain = tf_keras.Sequential([tf_keras.layers.Dense(1)])
            plain.build((None, 16))
            optimizer = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.01), compression=tfgc.codecs.ThreeLC(1.0),
                parameter_servers=servers)
            model.compile(optimizer, loss="mse", metrics=["mae"])
            plain.compile(tf_keras.optimizers.SGD(0.01), loss="mse")

        @tf.function
        def forward(x):  # a step's reads: in a replica, where the pulls happen
            return strategy.run(lambda x: tf.reduce_sum(model(x)), args=(x,))

        with strategy.scope():  # as fit and the strategy's `run` trace a step
            graph = forward.get_concrete_function(tf.TensorSpec([8, 16], tf.float32)).graph
        pull_ops = [op for op in graph.get_operations() if on_server(op)]
        waits = sorted({w for op in pull_ops for w in worker_ops_before(op)})
        result = {"pull_ops_on_server": len(pull_ops), "pull_waits_for": waits}

        x = tf.random.normal((64, 16))
        data = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1))).repeat().batch(8)

        # Pulls started by a read traced outside the strategy's scope and its `run`
        # are still the strategy's: one snapshot row per worker, and both workers step.
        late = tfgc.ParameterServers(tfgc.codecs.ThreeLC(1.0))
        with strategy.scope():
            with late.scope():
                traced_outside = tf_keras.Sequential([tf_keras.layers.Dense(1)])
                traced_outside.build((None, 16))
            traced_outside.compile(tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.01), compression=tfgc.codecs.ThreeLC(1.0),
                parameter_servers=late), loss="mse")
        tf.function(traced_outside).get_concrete_function(tf.TensorSpec([8, 16], tf.float32))
        traced_outside.fit(data, epochs=2, steps_per_epoch=6, verbose=0)
        result["traced_outside_snapshot_rows"] = int(
            traced_outside.layers[0].kernel._group.snapshots.shape[0])
        result["traced_outside_counted"] = int(traced_outside._train_counter.numpy())

        model.fit(data, epochs=2, steps_per_epoch=5, verbose=0)
        plain.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
        result["counted"] = int(model._train_counter.numpy())
        result["plain_counted"] = int(plain._train_counter.numpy())
        result["counter_changed"] = type(model._train_counter) is not type(plain._train_counter)
        result["steps_per_execution_on"] = [m._steps_per_execution.device for m in (model, plain)]
        result["weights"] = [len(m.get_weights()) for m in (model, plain)]
        # The metrics (on the server) read and reset in one call each.
        result["metrics_in_one_call"] = [
            bool(getattr(m, "_tfgc_metrics_in_one_call", False)) for m in (model, plain)]
        result["metrics_read"] = {k: float(v) for k, v in model.get_metrics_result().items()}
        result["metrics_each"] = {m.name: float(m.result()) for m in model.metrics}
        model.reset_metrics()
        result["metrics_after_reset"] = [float(v) for v in model.get_metrics_result().values()]
    send_report(result)
    """
)


@pytest.mark.cluster
def test_the_server_waits_for_nothing_of_the_worker_s_to_pull(run_report):
    report = run_report(COORDINATOR, timeout=300)
    # The pull's server side: the state, the encoding, the snapshots' update.
    assert report["pull_ops_on_server"] > 10, report
    assert report["pull_waits_for"] == [], report["pull_waits_for"]
    # The step counter of a model compiled with a tfgc optimizer is tfgc's (its increment
    # does not wait for the loss; round_trips measures what that saves) and counts every
    # step; a plain model's is tf_keras's.
    assert report["counter_changed"], report
    assert report["counted"] == 10, report
    assert report["plain_counted"] == 2, report
    # `fit` reads steps_per_execution before it schedules each step: a tfgc model's is
    # the coordinator's own, a plain model's is on the server.
    ours, plain = report["steps_per_execution_on"]
    assert "/job:ps" not in ours and "/job:ps" in plain, report
    assert report["weights"] == [4, 2], report  # the model's weights alone, as tf_keras's
    # Pulls whose first read was traced outside the strategy's scope: sized for both
    # workers, and both workers' steps ran.
    assert report["traced_outside_snapshot_rows"] == 2, report
    assert report["traced_outside_counted"] == 12, report
    # At an epoch's ends `fit` resets and reads the metrics: one call each for a tfgc
    # model, with what reading each metric alone gives.
    assert report["metrics_in_one_call"] == [True, False], report
    assert set(report["metrics_read"]) == {"loss", "mae"}, report
    assert report["metrics_read"]["mae"] > 0, report
    assert report["metrics_read"] == pytest.approx(report["metrics_each"], rel=1e-6), report
    assert report["metrics_after_reset"] == [0.0, 0.0], report
