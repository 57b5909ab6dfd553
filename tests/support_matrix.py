"""The support matrix's cells for one strategy, run in a process of its own.

    python tests/support_matrix.py STRATEGY OUT_DIR

STRATEGY is "none", "mirrored" or "mwms" (two replicas on two logical CPUs of this
process; collectives as between workers), or "ps" (a LocalCluster of one parameter
server and two workers: `fit`, the tutorial's custom loop with `ClusterCoordinator`,
and Keras 3's `tfgc.fit_on_parameter_servers`; bytes read from the sockets). Every
single-process cell trains a small model for two epochs of two steps with `fit`, with
`tfgc.callbacks.TrafficLogger`, TensorBoard, `ModelCheckpoint` and `CSVLogger` (tf_keras
also `BackupAndRestore`), and reports, as one JSON line, either what the counters saw
and what the callbacks wrote, or the error the cell raised. test_support_matrix.py says what each cell must do.
"""
import contextlib
import json
import os
import sys
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

ROWS, COLS = 256, 128  # the compressed kernel (32k values); plus a bias
# Under parameter servers, where the sockets are read: a 262k-parameter kernel.
PS_ROWS, PS_COLS = 512, 512
FLAVOURS = ("tf_keras", "keras3")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
# How the optimizer is made: its class, and whether the user wraps a LossScaleOptimizer
# in the DistributedOptimizer ("lso_first"; only under mixed_float16, where it is used).
OPTIMIZERS = ("SGD", "Adam", "SGD+lso_first")


def cells():
    for flavour in FLAVOURS:
        for policy in POLICIES:
            for optimizer in OPTIMIZERS:
                if optimizer.endswith("lso_first") and policy != "mixed_float16":
                    continue
                if optimizer == "Adam" and policy == "mixed_bfloat16":
                    continue  # Adam's own cell in the two other policies says enough
                yield flavour, policy, optimizer


def make_strategy(name):
    if name == "none":
        return None
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if name == "mwms":
        return tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(
            ["/cpu:0", "/cpu:1"])
    raise ValueError(name)


def run_cell(strategy, flavour, policy, optimizer_name, out_dir):
    import tfgc

    K = _keras(flavour)
    K.mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, ROWS)).astype("float32")
    y = rng.normal(size=(64, COLS)).astype("float32")
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _model(K, flavour, ROWS, COLS)
        model.compile(_optimizer(K, optimizer_name), "mse")
    checkpoints = os.path.join(out_dir, "checkpoints")
    logs = os.path.join(out_dir, "tensorboard")
    csv_path = os.path.join(out_dir, "log.csv")
    os.makedirs(out_dir, exist_ok=True)
    callbacks = [tfgc.callbacks.TrafficLogger(), K.callbacks.TensorBoard(logs),
                 K.callbacks.ModelCheckpoint(os.path.join(checkpoints, "model.keras")),
                 K.callbacks.CSVLogger(csv_path)]
    if flavour == "tf_keras":  # it removes its backup when training ends well
        callbacks.append(K.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=callbacks)
    compressing = tfgc.optimizer.compressing_optimizer(model.optimizer)
    traffic = {k: int(v) for k, v in compressing.traffic.items()}
    return {
        "outcome": "trained",
        "outer": type(model.optimizer).__name__,
        "traffic": traffic,
        "history_keys": sorted(history.history),
        "loss": history.history["loss"],
        "csv_header": open(csv_path).readline().strip().split(","),
        "tensorboard_files": sum(len(files) for _, _, files in os.walk(logs)),
        "checkpoint_files": sum(len(files) for _, _, files in os.walk(checkpoints)),
        "tfgc_warnings": [str(w.message)[:300] for w in caught if "tfgc" in str(w.message)],
    }


# Parameter servers: (flavour, policy, optimizer, how it trains).
PS_CELLS = (
    ("tf_keras", "float32", "SGD", "fit"),
    ("tf_keras", "float32", "Adam", "fit"),
    ("tf_keras", "mixed_bfloat16", "SGD", "fit"),
    ("tf_keras", "mixed_float16", "SGD", "fit"),
    ("tf_keras", "float32", "SGD+lso_first", "fit"),
    ("tf_keras", "float32", "SGD", "custom_loop"),
    ("keras3", "float32", "SGD", "fit"),
    ("keras3", "float32", "SGD", "fit_on_parameter_servers"),
)


def run_ps_cell(c, strategy, flavour, policy, optimizer_name, how, out_dir):
    import tfgc

    K = _keras(flavour)
    K.mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, PS_ROWS)).astype("float32")
    y = rng.normal(size=(64, PS_COLS)).astype("float32")

    def dataset_fn(context=None):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

    with strategy.scope():
        model = _model(K, flavour, PS_ROWS, PS_COLS)
        optimizer = _optimizer(K, optimizer_name)
        model.compile(optimizer, "mse")
    compressing = tfgc.optimizer.compressing_optimizer(model.optimizer)
    steps, warm_up = 8, 2

    def counters():
        # Once training has made them (the optimizer builds at its first step).
        traffic = compressing.traffic or {}
        return ({k: int(v) for k, v in traffic.items()}, int(compressing.iterations.numpy()))

    if how == "fit":
        logs = os.path.join(out_dir, "tensorboard")
        callbacks = [tfgc.callbacks.TrafficLogger(), K.callbacks.TensorBoard(logs)]
        data = dataset_fn()
        # The first fit traces the step and sends its graphs to the tasks: not counted.
        model.fit(data, epochs=1, steps_per_epoch=warm_up, verbose=0)
        start = counters()
        before = c.traffic_between("worker", "ps")
        history = model.fit(data, epochs=2, steps_per_epoch=steps // 2, verbose=0,
                            callbacks=callbacks).history
    elif how == "fit_on_parameter_servers":
        start = counters()  # each call traces anew: the graphs' bytes are counted too
        before = c.traffic_between("worker", "ps")
        history = tfgc.fit_on_parameter_servers(
            model, strategy, dataset_fn, epochs=2, steps_per_epoch=steps // 2, verbose=0,
            callbacks=[tfgc.callbacks.TrafficLogger()])
    else:
        loop = _custom_loop(strategy, model, optimizer, dataset_fn)
        loop(warm_up)
        start = counters()
        before = c.traffic_between("worker", "ps")
        history = loop(steps)
    rows = c.settled_socket_bytes()
    end = counters()
    return {
        "outcome": "trained",
        "outer": type(model.optimizer).__name__,
        "traffic": {k: end[0][k] - start[0].get(k, 0) for k in end[0]},
        "history_keys": sorted(history),
        "loss": [float(v) for v in history["loss"]],
        "worker_to_ps": c.traffic_between("worker", "ps", rows=rows) - before,
        "steps": end[1] - start[1],
    }


def _custom_loop(strategy, model, optimizer, dataset_fn):
    """The ParameterServerStrategy tutorial's custom training loop, as a function
    that runs it for some steps."""
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def step(iterator):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica_fn, args=(next(iterator),))

    def run(steps):
        losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps)]
        coordinator.join()
        return {"loss": [float(losses[0].fetch()), float(losses[-1].fetch())]}

    return run


def _keras(flavour):
    if flavour == "tf_keras":
        import tf_keras
        return tf_keras
    import keras
    return keras


def _model(K, flavour, rows, cols):
    if flavour == "tf_keras":
        layers = [K.layers.Dense(cols, input_shape=(rows,))]
    else:
        layers = [K.Input((rows,)), K.layers.Dense(cols)]
    return K.Sequential(layers + [K.layers.Activation("linear", dtype="float32")])


def _optimizer(K, optimizer_name):
    import tfgc

    name, _, order = optimizer_name.partition("+")
    inner = getattr(K.optimizers, name)(0.01)
    if order == "lso_first":
        inner = K.mixed_precision.LossScaleOptimizer(inner)
    return tfgc.DistributedOptimizer(inner, compression=tfgc.codecs.ThreeLC(1.0))


def main_ps(out_dir):
    from tfgc import cluster

    with cluster.LocalCluster(num_ps=1, num_workers=2, timeout_s=600) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        for flavour, policy, optimizer, how in PS_CELLS:
            cell = f"{flavour}/ps-{how}/{policy}/{optimizer}"
            report(cell, lambda: run_ps_cell(c, strategy, flavour, policy, optimizer, how,
                                             os.path.join(out_dir, cell.replace("/", "-"))))


def report(cell, run):
    try:
        result = run()
    except Exception as error:  # the cell's outcome is its error
        result = {"outcome": "error", "type": type(error).__name__,
                  "message": str(error)[-1500:], "where": traceback.format_exc()[-3000:]}
    result["cell"] = cell
    print("CELL " + json.dumps(result), flush=True)


def main():
    strategy_name, out_dir = sys.argv[1], sys.argv[2]
    if strategy_name == "ps":
        return main_ps(out_dir)
    strategy = make_strategy(strategy_name)
    for flavour, policy, optimizer in cells():
        cell = f"{flavour}/{strategy_name}/{policy}/{optimizer}"
        cell_dir = os.path.join(out_dir, cell.replace("/", "-"))
        report(cell, lambda: run_cell(strategy, flavour, policy, optimizer, cell_dir))


if __name__ == "__main__":
    main()
