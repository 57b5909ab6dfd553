"""tf_keras batch-norm moving statistics updated on their server (tfgc.ps.moving_statistics).

Locally, a layer whose moving statistics are `NamedServerVariable`s, switched on with
`tfgc.batch_norm_on_server`, must train as
the same layer with plain ones does (outputs equal, moving statistics equal up to
float rounding, on the fused and the other path), and in its traced step every read
of a moving statistic must be used on the statistic's own device only: under
ParameterServerStrategy that is the server, so no statistic crosses to the worker;
statistics on two servers are each updated on their own. The switch is per model: a
layer switched off (or never switched on) updates as Keras does, beside one that is on.
The cluster side (equal training, named or passed, and the bytes) is in
test_server_variables.py and benchmarks/wire_breakdown.py.
"""
import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc.ps import moving_statistics
from tfgc.ps.server_variables import NamedServerVariable


def _layer(input_shape, named, on_server=True):
    tf_keras.utils.set_random_seed(0)
    layer = tf_keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    layer.build(input_shape)
    if named:
        layer.moving_mean = NamedServerVariable(layer.moving_mean)
        layer.moving_variance = NamedServerVariable(layer.moving_variance)
        assert tfgc.batch_norm_on_server(layer, on_server) == 1
    return layer


def _updated_on_server(layer, input_shape):
    """Whether `layer`'s traced training step packs its statistics for the server (the
    split of the packed tensor is tfgc's; Keras's updates have none)."""
    step = tf.function(lambda x: layer(x, training=True))
    graph = step.get_concrete_function(tf.TensorSpec(input_shape)).graph
    return any(op.type == "SplitV" for op in graph.get_operations())


@pytest.mark.parametrize("input_shape", [(8, 4, 4, 3), (8, 5)], ids=["fused", "dense"])
def test_named_statistics_update_as_keras_updates_plain_ones(input_shape):
    rng = np.random.default_rng(0)
    batches = [rng.normal(2.0, 3.0, size=input_shape).astype("float32") for _ in range(4)]
    results = {}
    for named in (False, True):
        layer = _layer(input_shape, named)
        step = tf.function(lambda x, layer=layer: layer(x, training=True))
        outputs = [step(x).numpy() for x in batches]
        results[named] = outputs, layer.moving_mean.numpy(), layer.moving_variance.numpy()
    assert layer.fused == (len(input_shape) == 4)
    for plain, named in zip(results[False][0], results[True][0]):
        np.testing.assert_array_equal(named, plain)
    # Keras's fused op computes (1 - f) v + f b where this computes v - (v - b) f:
    # float rounding apart, the same statistics.
    np.testing.assert_allclose(results[True][1], results[False][1], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(results[True][2], results[False][2], rtol=1e-6)
    assert not np.allclose(results[True][1], 0.0)  # the statistics moved


@pytest.mark.parametrize("input_shape", [(8, 4, 4, 3), (8, 5)], ids=["fused", "dense"])
def test_reads_of_named_statistics_stay_on_their_device(input_shape):
    layer = _layer(input_shape, named=True)
    statistics = [layer.moving_mean, layer.moving_variance]

    @tf.function
    def step(x):
        with tf.device("/device:CPU:0"):  # the step's device, as a worker's
            return layer(x, training=True)

    graph = step.get_concrete_function(tf.TensorSpec(input_shape)).graph
    names = {v._resource_name for v in statistics}  # pylint: disable=protected-access
    handles = [op.outputs[0] for op in graph.get_operations()
               if op.type == "VarHandleOp" and op.get_attr("shared_name").decode() in names]
    assert len(handles) == 2, handles
    reads = [consumer for handle in handles for consumer in handle.consumers()
             if consumer.type == "ReadVariableOp"]
    assert reads, "the update reads the statistics"
    for read in reads:
        for consumer in read.outputs[0].consumers():
            assert consumer.device == statistics[0].device, (consumer.type, consumer.device)


@pytest.mark.parametrize("input_shape", [(8, 4, 4, 3), (8, 5)], ids=["fused", "dense"])
def test_the_switch_is_per_model(input_shape):
    on = _layer(input_shape, named=True)
    off = _layer(input_shape, named=True, on_server=False)
    assert _updated_on_server(on, input_shape)
    assert not _updated_on_server(off, input_shape)
    # Switched back, each model's next traced step follows.
    assert tfgc.batch_norm_on_server(tf_keras.Sequential([off]), True) == 1
    assert tfgc.batch_norm_on_server(on, enabled=False) == 1
    assert _updated_on_server(off, input_shape)
    assert not _updated_on_server(on, input_shape)
    # Statistics that are plain variables cannot be updated on a server: left alone.
    assert tfgc.batch_norm_on_server(_layer(input_shape, named=False)) == 0


def test_an_empty_batch_leaves_the_statistics_as_they_are():
    variable = NamedServerVariable(tf.Variable([1.0, 2.0]))
    update = tf.function(lambda value, size: moving_statistics.update_on_server(
        [(variable, value)], 0.9, size))
    update(tf.constant([np.nan, np.nan]), tf.constant(0))
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])
    update(tf.constant([11.0, 12.0]), tf.constant(4))
    np.testing.assert_allclose(variable.numpy(), [2.0, 3.0], rtol=1e-6)


def test_statistics_on_two_servers_are_updated_each_on_its_own(run_python):
    # Round-robin placement may put a layer's mean and variance on two servers: each
    # gets its own packed tensor, and its update is computed where it lives.
    out = run_python("""
import json

import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
from tfgc.ps import moving_statistics
from tfgc.ps.server_variables import NamedServerVariable

variables = []
for i, start in ((1, [1.0, 2.0]), (2, [10.0])):
    with tf.device(f"/device:CPU:{i}"):
        variables.append(NamedServerVariable(tf.Variable(start)))

@tf.function
def step(a, b):
    with tf.device("/device:CPU:0"):
        return moving_statistics.update_on_server(
            [(variables[0], a), (variables[1], b)], 0.5)

step(tf.constant([3.0, 4.0]), tf.constant([20.0]))
graph = step.get_concrete_function(tf.TensorSpec([2]), tf.TensorSpec([1])).graph
updates = [op for op in graph.get_operations() if op.type == "AssignSubVariableOp"]
print(json.dumps({
    "values": [v.numpy().tolist() for v in variables],
    "devices": [v.device for v in variables],
    "update_devices": sorted(op.inputs[1].op.device for op in updates),
    "packed": len([op for op in graph.get_operations() if op.type == "ConcatV2"]),
}))
""", timeout=120)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["values"] == [[2.0, 3.0], [15.0]], report
    assert report["update_devices"] == sorted(report["devices"]), report
    assert report["devices"][0] != report["devices"][1], report
    assert report["packed"] == 2, report


def test_an_update_of_no_statistics_is_refused():
    # Every caller updates a layer's one or two statistics: none is a caller's mistake,
    # which a silent no-op would turn into statistics that never move.
    rates = tf.constant([0.5, 1.0])
    with pytest.raises(ValueError, match="no statistics"):
        moving_statistics.update_on_server([], 0.9)
    with pytest.raises(ValueError, match="no statistics"):
        moving_statistics.StatisticsUpdate("/device:CPU:0", [], rates)
    with pytest.raises(ValueError, match="no statistics"):
        moving_statistics.FoldedStatistics("/device:CPU:0", [], tf.zeros([1]))


def test_marking_a_statistic_installs_nothing_enabling_does(run_python):
    # tfgc's batch-norm route is installed where a user asks for it (a pulls scope under
    # parameter servers, the switch), never as a side effect of making a variable.
    out = run_python("""
import json

import tf_keras

import tfgc
from tfgc.ps import moving_statistics
from tfgc.ps.server_variables import NamedServerVariable


def routed():
    method = tf_keras.layers.BatchNormalization._fused_batch_norm
    return method.__module__.startswith("tfgc")


layer = tf_keras.layers.BatchNormalization()
layer.build((2, 3))
marked = moving_statistics.mark(NamedServerVariable(layer.moving_mean))
after_mark = routed()
moving_statistics.enable()
print(json.dumps([marked, after_mark, routed()]))
""", timeout=120)
    assert json.loads(out.strip().splitlines()[-1]) == [True, False, True]
