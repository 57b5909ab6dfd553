"""Batch-norm statistics riding in the push message (tfgc.ps.riders).

The cluster test trains one fixed batch with a zero learning rate (every step then sends
the same gradients and the same batch statistics) on 1 PS + 1 worker, in a custom loop:
first with the strategy's own `run` (each layer's statistics cross on their own), then
with the `run` tfgc gave the strategy (they ride in the push). What the sockets carried
per step falls by at least the bytes bfloat16 saves on the statistics, the server's
requests for them are gone, and one step updates the statistics as the unridden step
does, to within bfloat16's rounding.
"""
import numpy as np
import pytest
import tensorflow as tf

import cluster_scripts
from tfgc import codecs
from tfgc.ps import moving_statistics
from tfgc.ps.server_variables import NamedServerVariable
from tfgc.ps import riders

CHANNELS = (64, 256)  # a fused (conv) and an unfused (dense) batch norm

COORDINATOR = cluster_scripts.script(
    """
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 8, 8, 4)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, 32))
    steps = 12
    with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=300) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope(), tfgc.compressed_pulls():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([
                tf_keras.layers.Conv2D(64, 3, input_shape=(8, 8, 4)),
                tf_keras.layers.BatchNormalization(momentum=0.5), tf_keras.layers.ReLU(),
                tf_keras.layers.GlobalAveragePooling2D(), tf_keras.layers.Dense(256),
                tf_keras.layers.BatchNormalization(momentum=0.5), tf_keras.layers.ReLU(),
                tf_keras.layers.Dense(10)])
            opt = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.0), compression=tfgc.codecs.ThreeLC(1.0),
                error_feedback=False)
            opt.build(model.trainable_variables)
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
                    y, model(x, training=True), from_logits=True))
            variables = model.trainable_variables
            opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

        alone = tf.function(lambda: type(strategy).run(strategy, replica_step))
        riding = tf.function(lambda: strategy.run(replica_step))
        statistics = [v for v in model.variables if "moving" in v.name]

        def measure(step):
            coordinator.schedule(step)  # traced, and the model pulled, before counting
            coordinator.join()
            rows = c.settled_socket_bytes()
            pushed = c.traffic_between("worker", "ps", rows=rows)
            pulled = c.traffic_between("ps", "worker", rows=rows)
            counted = opt.traffic["push_bytes"].numpy()
            for _ in range(steps):
                coordinator.schedule(step)
                coordinator.join()
            rows = c.settled_socket_bytes()
            return {"worker_to_ps": (c.traffic_between("worker", "ps", rows=rows) - pushed) / steps,
                    "ps_to_worker": (c.traffic_between("ps", "worker", rows=rows) - pulled) / steps,
                    "counted": float(opt.traffic["push_bytes"].numpy() - counted) / steps}

        def one_step(step, start):
            for variable, value in zip(statistics, start):
                variable.assign(value)
            coordinator.schedule(step)
            coordinator.join()
            return [v.numpy().tolist() for v in statistics]

        report = {"alone": measure(alone), "riding": measure(riding)}
        start = [v.numpy() + 1.0 for v in statistics]
        report["after_alone"] = one_step(alone, start)
        report["after_riding"] = one_step(riding, start)
        report["start"] = [v.tolist() for v in start]
        report["other_column"] = opt.traffic_by_variable().get(
            "(variables built later; batch-norm statistics)")
    send_report(report)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_batch_norm_statistics_ride_in_the_push_message(run_report):
    report = run_report(COORDINATOR, timeout=400)
    alone, riding = report["alone"], report["riding"]
    statistic_bytes = 2 * sum(CHANNELS) * 4  # a mean and a variance per channel, float32
    # The statistics crossed as bfloat16 inside the message, not as float32 tensors of
    # their own (one per fused layer, one per statistic of the unfused one: 3 a step).
    assert alone["worker_to_ps"] - riding["worker_to_ps"] >= statistic_bytes / 2, report
    # The server no longer asks the worker for them: one request per tensor was >= 80 B.
    assert alone["ps_to_worker"] - riding["ps_to_worker"] >= 3 * 80, report
    # The counters saw the statistics ride: bfloat16 values plus the exact rates.
    assert riding["counted"] - alone["counted"] >= statistic_bytes / 2, report
    assert report["other_column"]["push_dense_bytes"] >= statistic_bytes, report
    # One step updates them as the unridden step does, but for bfloat16's rounding of
    # the batch's statistics (8 significant bits), scaled by the decay (1 - 0.5).
    start = [np.array(s) for s in report["start"]]
    for before, expected, got in zip(start, report["after_alone"], report["after_riding"]):
        expected, got = np.array(expected), np.array(got)
        assert not np.allclose(expected, before)
        batch = 2 * expected - before  # v - (v - b) * 0.5 = (v + b) / 2
        # (float32's own rounding of the arithmetic on top: 1% of the bound)
        bound = 0.5 * 2 ** -8 * np.abs(batch).max() * 1.01
        np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def _statistic(values, device="/device:CPU:0"):
    with tf.device(device):
        return NamedServerVariable(tf.Variable(values))


@pytest.mark.parametrize("small_compression, exact", [(None, True), (codecs.Cast("float16"), False)])
def test_a_statistics_update_sends_float32_exactly_or_bfloat16(small_compression, exact):
    variable = _statistic([1.0, 2.0, 3.0])
    batch = tf.constant([1.0 / 3.0, 70000.0, -5.0])  # beyond float16's range: no saturation
    update = moving_statistics.StatisticsUpdate(
        variable.device or "/device:CPU:0", [(variable, batch)], tf.constant([0.5, 1.0]))
    payload = update.payload(small_compression)
    assert payload["rates"].dtype == tf.float32  # the decay and flag always exact
    update.apply(payload, small_compression)
    expected = np.array([1.0, 2.0, 3.0]) - (np.array([1.0, 2.0, 3.0]) - batch.numpy()) * 0.5
    if exact:
        np.testing.assert_array_equal(variable.numpy(), expected.astype(np.float32))
    else:
        np.testing.assert_allclose(variable.numpy(), expected, rtol=2 ** -8)
        assert not np.array_equal(variable.numpy(), expected.astype(np.float32))
    assert update.dense_nbytes() == 12


@pytest.mark.parametrize("small_compression, exact", [(None, True), (codecs.Cast("float16"), False)])
def test_a_run_of_statistics_updates_folds_into_one(small_compression, exact):
    # Two statistics of one server, four steps (one with an empty batch, which changes
    # nothing), folded on the worker and made at once on the server.
    rng = np.random.default_rng(0)
    start = [rng.normal(size=3).astype("float32"), rng.uniform(1, 2, size=2).astype("float32")]
    one_by_one, folded = [_statistic(v) for v in start], [_statistic(v) for v in start]
    state = tf.zeros([6])
    for step, applies in enumerate([1.0, 1.0, 0.0, 1.0]):
        batch = [tf.constant(rng.normal(size=3), tf.float32),
                 tf.constant(rng.uniform(0, 3, size=2), tf.float32)]
        rates = tf.constant([0.1 * (step + 1), applies])
        update = moving_statistics.StatisticsUpdate(
            "/device:CPU:0", list(zip(one_by_one, batch)), rates)
        update.apply(update.payload(None), None)
        waiting = moving_statistics.StatisticsUpdate(
            "/device:CPU:0", list(zip(folded, batch)), rates)
        state = waiting.fold(state)
    assert waiting.folds and waiting.state_size() == 6
    rider = waiting.folded(state)
    payload = rider.payload(small_compression)
    assert payload["stepped"].dtype == tf.float32  # the decay's product always exact
    rider.apply(payload, small_compression)
    for got, expected in zip(folded, one_by_one):
        if exact:
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
        else:  # the sum of the run's terms in bfloat16
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=2 ** -8, atol=1e-2)
    assert rider.dense_nbytes() == 20


def test_updates_ride_only_in_a_collecting_step_of_their_graph():
    variable = _statistic([1.0, 2.0])
    rates = tf.constant([0.5, 1.0])

    @tf.function
    def step(take):
        update = moving_statistics.StatisticsUpdate(
            "/device:CPU:0", [(variable, tf.constant([3.0, 4.0]))], rates)
        rode = riders.ride(update)
        taken = riders.take("/device:CPU:0") if take else []
        for rider in taken:
            rider.apply(rider.payload(None), None)
        return tf.constant([rode, bool(taken)])

    assert step(True).numpy().tolist() == [False, False]  # no step collects: at once
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])  # the caller's to make
    collected = tf.function(lambda take: _collect(step, take))
    assert collected(True).numpy().tolist() == [True, True]
    np.testing.assert_array_equal(variable.numpy(), [2.0, 3.0])  # the push applied it
    assert collected(False).numpy().tolist() == [True, False]
    np.testing.assert_array_equal(variable.numpy(), [2.5, 3.5])  # sent alone at the end


def _collect(step, take):
    with riders.collecting():
        return step.python_function(take)


def test_collect_in_steps_wraps_one_strategy_object_once():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    other = tf.distribute.OneDeviceStrategy("/cpu:0")
    riders.collect_in_steps(strategy)
    wrapped = strategy.run
    riders.collect_in_steps(strategy)
    assert strategy.run is wrapped and other.run != wrapped
    assert strategy.run(lambda: tf.constant(3)).numpy() == 3
