"""Keras 3 under ParameterServerStrategy: `tfgc.fit_on_parameter_servers` on a real
cluster, gradients pushed compressed by a Keras 3 DistributedOptimizer."""
import pytest
import tensorflow as tf

import cluster_scripts
import tfgc

COORDINATOR = cluster_scripts.script(
    """
    import keras
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).reshape(-1, 64).astype("float32")
    y = digits.target.astype("int64")

    def dataset_fn(context):
        data = tf.data.Dataset.from_tensor_slices((x, y))
        return data.shuffle(2000, seed=context.input_pipeline_id).repeat().batch(32)

    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=300) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                                      keras.layers.Dense(10)])
            opt = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                            compression=tfgc.codecs.ThreeLC(1.0))
            model.compile(optimizer=opt,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        from tensorflow.python.eager import context

        class CountTraces(keras.callbacks.Callback):
            # Traces of the step in the eager context: each is sent to every task.
            def on_epoch_end(self, epoch, logs=None):
                self.traces = sum(name.startswith("__inference_train_step")
                                  for name in context.context().list_function_names())

        traces = CountTraces()
        before = c.traffic_between("worker", "ps")
        history = tfgc.fit_on_parameter_servers(
            model, strategy, dataset_fn, epochs=3, steps_per_epoch=15,
            callbacks=[tfgc.callbacks.TrafficLogger(), traces])
        rows = c.settled_socket_bytes()  # the last step's push may still be crossing
        send_report({
            "history": history,
            "iterations": int(opt.iterations.numpy()),
            "traffic": {k: int(v.numpy()) for k, v in opt.traffic.items()},
            "worker_to_ps": c.traffic_between("worker", "ps", rows=rows) - before,
            "residuals": len(opt._residuals),
            "kernel_device": model.trainable_variables[0].value.device,
            "traces": traces.traces,
        })
    """
)

STEPS = 3 * 15
MODEL_BYTES = (64 * 256 + 256 + 256 * 10 + 10) * 4


@pytest.mark.cluster
@pytest.mark.slow
def test_keras3_model_trains_on_parameter_servers_with_compressed_pushes(run_report):
    report = run_report(COORDINATOR, timeout=400)
    loss = report["history"]["loss"]
    assert len(loss) == 3 and loss[-1] < 0.8 * loss[0], loss
    assert "/job:ps/" in report["kernel_device"]
    assert report["residuals"] == 2  # per-worker error feedback for the two kernels
    # The optimizer is built before the step is traced: one trace (a first trace that
    # made its variables would be traced again, and both sent to every task).
    assert report["traces"] == 1
    # Every step counted once, although two workers step concurrently (Keras 3's own
    # increment is a read and a write).
    assert report["iterations"] == STEPS
    traffic = report["traffic"]
    assert traffic["push_dense_bytes"] == STEPS * MODEL_BYTES
    assert report["history"]["push_dense_bytes"] == [MODEL_BYTES] * 3
    # The wire carries the compressed pushes: well under the fp32 gradients, and at
    # least what the codec counted.
    assert traffic["push_bytes"] <= report["worker_to_ps"] < STEPS * MODEL_BYTES / 5, report


def test_fit_on_parameter_servers_refuses_other_strategies():
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="ParameterServerStrategy"):
        tfgc.fit_on_parameter_servers(model, tf.distribute.get_strategy(), None, 1, 1)


def test_fit_on_parameter_servers_needs_a_compiled_model(monkeypatch):
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    monkeypatch.setattr(tfgc.trainer, "is_parameter_server", lambda strategy: True)
    with pytest.raises(ValueError, match="compile"):
        tfgc.fit_on_parameter_servers(model, None, None, 1, 1)
