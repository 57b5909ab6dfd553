"""The support matrix's cells for one strategy, run in a process of its own.

    python tests/support_matrix.py STRATEGY OUT_DIR

STRATEGY is "none", "mirrored" or "mwms" (two replicas on two logical CPUs of this
process; collectives as between workers), or "ps" (a LocalCluster of one parameter
server and two workers: `fit`, the tutorial's custom loop with `ClusterCoordinator`,
and Keras 3's `tfgc.fit_on_parameter_servers`; bytes read from the sockets each way).
Every cell trains a small model for 20 steps on a fixed linear teacher's data with tfgc
(single-process cells with `tfgc.callbacks.TrafficLogger`, TensorBoard,
`ModelCheckpoint` and `CSVLogger`, tf_keras also `BackupAndRestore`), then its plain
twin (the same model, seed, data and inner optimizer, not wrapped), and reports, as one
JSON line, both losses, what the counters saw and what the callbacks wrote, or the
error the cell raised. test_support_matrix.py says what each cell must do.
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
# Rows beside the policies': 4 local steps (tf_keras; OuterSteps runs the meetings,
# averaging), and, without a strategy, the step compiled by XLA (`compile(jit_compile=
# True)`, with a codec XLA compiles: Int8). Under Mirrored on two logical CPUs XLA fails
# without tfgc too (a variable on the other device).
EXTRA_CELLS = (("tf_keras", "float32", "SGD+local_steps"),)
XLA_CELLS = (("tf_keras", "float32", "SGD+xla"), ("keras3", "float32", "SGD+xla"))
# SGD's rate grows with the outputs the mean squared error averages over (COLS): about
# 1 - 2 * rate / cols of the error goes per step, stable for the batches used here.
LEARNING_RATES = {"SGD": 2.0, "Adam": 0.01}
PS_LEARNING_RATES = {"SGD": 1.0, "Adam": 0.002}
# Training: 4 epochs of 5 steps (batch 32) on a fixed linear teacher's data, so that
# every working optimizer's loss falls.
EPOCHS, STEPS_PER_EPOCH, BATCH = 4, 5, 32


def cells(strategy_name):
    for flavour in FLAVOURS:
        for policy in POLICIES:
            for optimizer in OPTIMIZERS:
                if optimizer.endswith("lso_first") and policy != "mixed_float16":
                    continue
                if optimizer == "Adam" and policy == "mixed_bfloat16":
                    continue  # Adam's own cell in the two other policies says enough
                yield flavour, policy, optimizer
    yield from EXTRA_CELLS
    if strategy_name == "none":
        yield from XLA_CELLS


def teacher_data(rows, cols, samples):
    """(x, y) of a fixed linear teacher: y = x @ W, W of unit-variance outputs."""
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(rows, cols)).astype("float32") / rows ** 0.5
    x = rng.normal(size=(samples, rows)).astype("float32")
    return x, x @ teacher


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
    """Trains the cell's model with tfgc and with its plain twin (the same model, seed,
    data and inner optimizer, not wrapped), and reports both."""
    import tfgc

    K = _keras(flavour)
    K.mixed_precision.set_global_policy(policy)
    x, y = teacher_data(ROWS, COLS, STEPS_PER_EPOCH * BATCH)
    name, _, variant = optimizer_name.partition("+")
    jit = variant == "xla"

    def train(wrapped, callbacks=()):
        K.utils.set_random_seed(0)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = _model(K, flavour, ROWS, COLS)
            optimizer = _optimizer(K, optimizer_name) if wrapped else _inner(K, name, variant)
            model.compile(optimizer, "mse", **({"jit_compile": True} if jit else {}))
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False,
                            callbacks=list(callbacks))
        return model, history.history

    checkpoints = os.path.join(out_dir, "checkpoints")
    logs = os.path.join(out_dir, "tensorboard")
    csv_path = os.path.join(out_dir, "log.csv")
    os.makedirs(out_dir, exist_ok=True)
    callbacks = [tfgc.callbacks.TrafficLogger(), K.callbacks.TensorBoard(logs),
                 K.callbacks.ModelCheckpoint(os.path.join(checkpoints, "model.keras")),
                 K.callbacks.CSVLogger(csv_path)]
    if flavour == "tf_keras":  # it removes its backup when training ends well
        callbacks.append(K.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")))
    if variant == "local_steps":
        callbacks.insert(0, tfgc.callbacks.OuterSteps())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history = train(True, callbacks)
    _, twin = train(False)
    compressing = tfgc.optimizer.compressing_optimizer(model.optimizer)
    traffic = {k: int(v) for k, v in compressing.traffic.items()}
    return {
        "outcome": "trained",
        "outer": type(model.optimizer).__name__,
        "traffic": traffic,
        "history_keys": sorted(history),
        "loss": history["loss"],
        "twin_loss": twin["loss"],
        "steps": EPOCHS * STEPS_PER_EPOCH,
        "csv_header": open(csv_path).readline().strip().split(","),
        "tensorboard_files": sum(len(files) for _, _, files in os.walk(logs)),
        "checkpoint_files": sum(len(files) for _, _, files in os.walk(checkpoints)),
        "tfgc_warnings": [str(w.message)[:300] for w in caught if "tfgc" in str(w.message)],
    }


# Parameter servers: (flavour, policy, optimizer, how it trains). "+pulls": the model
# is made in the scope of a `tfgc.ParameterServers` and pulled in ThreeLC too;
# "+local_steps": 4 local steps, averaging, with compressed pulls.
PS_CELLS = (
    ("tf_keras", "float32", "SGD", "fit"),
    ("tf_keras", "float32", "Adam", "fit"),
    ("tf_keras", "mixed_bfloat16", "SGD", "fit"),
    ("tf_keras", "mixed_float16", "SGD", "fit"),
    ("tf_keras", "float32", "SGD+lso_first", "fit"),
    ("tf_keras", "float32", "SGD", "custom_loop"),
    ("tf_keras", "float32", "SGD+pulls", "fit"),
    ("tf_keras", "float32", "SGD+local_steps", "fit"),
    ("keras3", "float32", "SGD", "fit"),
    ("keras3", "float32", "SGD", "fit_on_parameter_servers"),
)
PS_STEPS, PS_WARM_UP = 20, 2


def run_ps_cell(c, strategy, flavour, policy, optimizer_name, how, out_dir):
    """Trains the cell's model with tfgc and with its plain twin (the same model, seed,
    data and inner optimizer, not wrapped) on the same cluster; reports both, and
    what crossed the sockets each way while tfgc trained."""
    import tfgc

    K = _keras(flavour)
    K.mixed_precision.set_global_policy(policy)
    x, y = teacher_data(PS_ROWS, PS_COLS, 64)
    name, _, variant = optimizer_name.partition("+")
    pulled = variant in ("pulls", "local_steps")

    def dataset_fn(context=None):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

    def make(wrapped):
        K.utils.set_random_seed(0)
        servers = _ps_servers(variant) if wrapped and pulled else None
        with strategy.scope():
            with servers.scope() if servers is not None else contextlib.nullcontext():
                model = _model(K, flavour, PS_ROWS, PS_COLS)
            optimizer = _ps_optimizer(K, optimizer_name, servers) if wrapped else _inner(
                K, name, variant, PS_LEARNING_RATES)
            model.compile(optimizer, "mse")
        return model, optimizer

    def train(model, optimizer, callbacks, counted):
        """Warm-up steps (they trace the step and send its graphs to the tasks), then
        PS_STEPS steps in EPOCHS epochs; `counted()` is read before the second part."""
        if how == "fit":
            data = dataset_fn()
            model.fit(data, epochs=1, steps_per_epoch=PS_WARM_UP, verbose=0)
            start = counted()
            history = model.fit(data, epochs=EPOCHS, steps_per_epoch=PS_STEPS // EPOCHS,
                                verbose=0, callbacks=callbacks).history
        elif how == "fit_on_parameter_servers":
            start = counted()  # each call traces anew: the graphs' bytes are counted too
            history = tfgc.fit_on_parameter_servers(
                model, strategy, dataset_fn, epochs=EPOCHS, steps_per_epoch=PS_STEPS // EPOCHS,
                verbose=0, callbacks=callbacks)
        else:
            loop = _custom_loop(strategy, model, optimizer, dataset_fn)
            loop(PS_WARM_UP)
            start = counted()
            history = loop(PS_STEPS)
        return start, history

    model, optimizer = make(True)
    compressing = tfgc.optimizer.compressing_optimizer(model.optimizer)

    def counted():
        # Once training has made them (the optimizer builds at its first step).
        traffic = compressing.traffic or {}
        rows = c.settled_socket_bytes()
        return ({k: int(v) for k, v in traffic.items()}, int(compressing.iterations.numpy()),
                c.traffic_between("worker", "ps", rows=rows),
                c.traffic_between("ps", "worker", rows=rows))

    callbacks = [tfgc.callbacks.TrafficLogger()]
    if how == "fit":
        callbacks.append(K.callbacks.TensorBoard(os.path.join(out_dir, "tensorboard")))
    start, history = train(model, optimizer, callbacks, counted)
    end = counted()
    twin_model, twin_optimizer = make(False)
    _, twin = train(twin_model, twin_optimizer, [], lambda: None)
    return {
        "outcome": "trained",
        "outer": type(model.optimizer).__name__,
        "traffic": {k: end[0][k] - start[0].get(k, 0) for k in end[0]},
        "history_keys": sorted(history),
        "loss": [float(v) for v in history["loss"]],
        "twin_loss": [float(v) for v in twin["loss"]],
        "worker_to_ps": end[2] - start[2],
        "ps_to_worker": end[3] - start[3],
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
        # As `fit`'s epochs: the mean loss of each EPOCHS-th part.
        values = [float(loss.fetch()) for loss in losses]
        return {"loss": [float(np.mean(part)) for part in np.array_split(values, EPOCHS)]}

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


def _inner(K, name, variant="", rates=LEARNING_RATES):
    """The optimizer the cell wraps (and its twin trains with, unwrapped)."""
    inner = getattr(K.optimizers, name)(rates[name])
    if variant == "lso_first":
        inner = K.mixed_precision.LossScaleOptimizer(inner)
    return inner


def _optimizer(K, optimizer_name):
    import tfgc

    name, _, variant = optimizer_name.partition("+")
    inner = _inner(K, name, variant)
    if variant == "xla":
        return tfgc.DistributedOptimizer(inner, compression=tfgc.codecs.Int8())
    if variant == "local_steps":
        return tfgc.DistributedOptimizer(inner, compression=tfgc.codecs.ThreeLC(1.0),
                                         local_steps=4,
                                         outer_optimizer=tfgc.OuterSGD.averaging())
    return tfgc.DistributedOptimizer(inner, compression=tfgc.codecs.ThreeLC(1.0))


def _ps_servers(variant):
    """The `tfgc.ParameterServers` of a cell whose model is pulled in ThreeLC."""
    import tfgc

    return tfgc.ParameterServers(tfgc.codecs.ThreeLC(1.0),
                                 local_steps=4 if variant == "local_steps" else 1)


def _ps_optimizer(K, optimizer_name, servers=None):
    import tfgc

    name, _, variant = optimizer_name.partition("+")
    inner = _inner(K, name, variant, PS_LEARNING_RATES)
    codec = tfgc.codecs.ThreeLC(1.0)
    if variant == "local_steps":
        return tfgc.DistributedOptimizer(inner, compression=codec, local_steps=4,
                                         outer_optimizer=tfgc.OuterSGD.averaging(),
                                         parameter_servers=servers)
    return tfgc.DistributedOptimizer(inner, compression=codec, parameter_servers=servers)


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
    for flavour, policy, optimizer in cells(strategy_name):
        cell = f"{flavour}/{strategy_name}/{policy}/{optimizer}"
        cell_dir = os.path.join(out_dir, cell.replace("/", "-"))
        report(cell, lambda: run_cell(strategy, flavour, policy, optimizer, cell_dir))


if __name__ == "__main__":
    main()
