"""Local steps (tfgc.local_steps) in one process: the meetings' arithmetic, the
refusal of a step past H, configs, checkpoints and the `fit` callback."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import cluster_scripts

import tfgc
from tfgc import cluster, codecs

LR = 0.5  # a power of two: the inner SGD adds no rounding of its own


def linear_problem(seed=0, rows=128, cols=8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, rows)).astype("float32")
    teacher = rng.normal(size=(rows, cols)).astype("float32")
    return x, x @ teacher


def model_and_optimizer(optimizer, rows=128, cols=8):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(cols, use_bias=False,
                                                       input_shape=(rows,))])
    model.compile(optimizer, "mse")
    return model


def gradient(kernel, x, y):
    """The mean-squared-error gradient of y ~ x @ kernel, as Keras takes it."""
    return 2 * x.T @ (x @ kernel - y) / y.size


def test_one_local_step_with_averaging_is_the_synchronous_step():
    x, y = linear_problem()
    plain = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.NoCompression()))
    local = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.NoCompression(),
        outer_optimizer=tfgc.OuterSGD.averaging()))
    for _ in range(5):
        plain.train_on_batch(x, y)
        local.train_on_batch(x, y)
        assert local.optimizer.maybe_synchronize()
    a, b = plain.get_weights()[0], local.get_weights()[0]
    # anchor - (anchor - w) is w to within its rounding: one ulp of the weights.
    np.testing.assert_allclose(b, a, rtol=0, atol=4 * np.spacing(np.abs(a).max()))
    assert not np.array_equal(a, model_and_optimizer("sgd").get_weights()[0])


def test_meetings_apply_nesterov_momentum_to_the_pseudo_gradient():
    x, y = linear_problem()
    outer = tfgc.OuterSGD(learning_rate=0.7, momentum=0.9, nesterov=True)
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.NoCompression(), local_steps=3,
        outer_optimizer=outer))
    w = anchor = model.get_weights()[0].astype("float64")
    momentum = np.zeros_like(w)
    for step in range(1, 10):
        model.train_on_batch(x, y)
        w = w - LR * gradient(w, x, y)
        met = model.optimizer.maybe_synchronize()
        assert met == (step % 3 == 0)
        if met:
            delta = anchor - w
            momentum = 0.9 * momentum + delta
            w = anchor = anchor - 0.7 * (delta + 0.9 * momentum)
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-4, atol=1e-5)
    assert model.optimizer.local_steps_since_meeting() == 0


def test_a_step_past_h_without_a_meeting_fails_saying_how_to_meet():
    x, y = linear_problem()
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.ThreeLC(1.0), local_steps=2))
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    before = model.get_weights()[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="OuterSteps"):
        model.train_on_batch(x, y)
    assert model.optimizer.maybe_synchronize()
    model.train_on_batch(x, y)  # met: steps again
    assert not np.array_equal(before, model.get_weights()[0])


def test_pushes_are_counted_at_meetings_only():
    x, y = linear_problem(rows=256, cols=64)
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.ThreeLC(1.0), local_steps=4),
        rows=256, cols=64)
    totals = []
    for _ in range(8):
        model.train_on_batch(x, y)
        model.optimizer.maybe_synchronize()
        totals.append(int(model.optimizer.traffic["push_bytes"].numpy()))
    # Steps 1-3 send nothing, the meeting after step 4 one ThreeLC payload, and so on.
    assert totals[:3] == [0, 0, 0] and totals[3] > 0
    assert totals[4:7] == [totals[3]] * 3 and totals[7] > totals[3]
    dense = int(model.optimizer.traffic["push_dense_bytes"].numpy())
    assert dense == 2 * 256 * 64 * 4 and totals[7] < dense / 10


def test_fit_meets_every_h_steps_and_at_the_end():
    x, y = linear_problem()
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.01), compression=codecs.NoCompression(), local_steps=4,
        outer_optimizer=tfgc.OuterSGD.averaging()))
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                        callbacks=[tfgc.callbacks.OuterSteps()])
    assert history.history["loss"][1] < history.history["loss"][0]
    # 2 epochs x 4 batches: meetings after steps 4 and 8 (the last one's: none left).
    assert int(model.optimizer.iterations.numpy()) == 8
    assert model.optimizer.local_steps_since_meeting() == 0
    # 3 more steps: the end of training meets over them.
    model.fit(x[:24], y[:24], batch_size=8, epochs=1, verbose=0,
              callbacks=[tfgc.callbacks.OuterSteps()])
    assert model.optimizer.local_steps_since_meeting() == 0


def test_outer_steps_refuses_a_model_without_local_steps():
    x, y = linear_problem()
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.NoCompression()))
    with pytest.raises(ValueError, match="local_steps=H"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[tfgc.callbacks.OuterSteps()])
    with pytest.raises(ValueError, match="synchronize\\(\\) is for local steps"):
        model.optimizer.synchronize()
    unbuilt = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(LR),
                                        compression=codecs.ThreeLC(), local_steps=2)
    assert not unbuilt.maybe_synchronize() and unbuilt.local_steps_since_meeting() == 0
    with pytest.raises(ValueError, match="before the optimizer is built"):
        unbuilt.synchronize()


def test_config_round_trips_and_anchors_are_checkpointed(tmp_path):
    x, y = linear_problem()
    outer = tfgc.OuterSGD(0.5, momentum=0.8, nesterov=False)
    model = model_and_optimizer(tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(LR), compression=codecs.ThreeLC(1.0), local_steps=3,
        outer_optimizer=outer))
    config = model.optimizer.get_config()
    assert config["local_steps"] == 3 and config["outer_optimizer"] == outer.get_config()
    again = type(model.optimizer).from_config(config)
    assert again.local_steps == 3 and again.outer_optimizer == outer
    for _ in range(3):
        model.train_on_batch(x, y)
    model.optimizer.maybe_synchronize()
    model.train_on_batch(x, y)  # a copy away from its anchor
    meetings = model.optimizer._meetings  # noqa: SLF001 (the state under test)
    saved = [v.numpy() for v in meetings.anchors + meetings.momenta]
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(tmp_path / "ck")
    restored = model_and_optimizer(type(model.optimizer).from_config(config))
    restored.optimizer.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=restored.optimizer).restore(
        path).assert_consumed()
    meetings = restored.optimizer._meetings  # noqa: SLF001
    for a, b in zip(saved, [v.numpy() for v in meetings.anchors + meetings.momenta]):
        np.testing.assert_array_equal(a, b)
    assert restored.optimizer.local_steps_since_meeting() == 1


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_local_steps_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="local_steps must be a positive integer"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(LR), compression=codecs.ThreeLC(),
                                  local_steps=bad)


def test_outer_sgd_checks_its_arguments():
    with pytest.raises(ValueError, match="learning rate"):
        tfgc.OuterSGD(0.0)
    with pytest.raises(ValueError, match="momentum"):
        tfgc.OuterSGD(momentum=1.0)
    with pytest.raises(TypeError, match="OuterSGD"):
        tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(LR), compression=codecs.ThreeLC(),
                                  local_steps=2, outer_optimizer="nesterov")


def test_local_steps_with_loss_scaling_is_not_built_yet():
    with pytest.raises(NotImplementedError, match="LossScaleOptimizer"):
        tfgc.DistributedOptimizer(
            tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(LR)),
            compression=codecs.ThreeLC(), local_steps=2)


@pytest.mark.parametrize("inner, message", [
    (lambda: tf_keras.optimizers.RMSprop(LR), "not yet for RMSprop"),
    (lambda: tf_keras.optimizers.Adam(LR, amsgrad=True), "AMSGrad"),
    (lambda: tf_keras.optimizers.AdamW(LR, clipnorm=1.0), "without clipnorm"),
])
def test_parameter_server_local_steps_refuse_inner_steps_tfgc_does_not_run(inner, message):
    # Under ParameterServerStrategy tfgc runs the inner step on the worker itself.
    from tfgc.ps import local_steps as local_steps_ps

    with pytest.raises(NotImplementedError, match=message):
        local_steps_ps.check_inner_optimizer(inner())
    for accepted in (tf_keras.optimizers.SGD(LR, momentum=0.9, nesterov=True),
                     tf_keras.optimizers.Adam(LR), tf_keras.optimizers.AdamW(LR)):
        local_steps_ps.check_inner_optimizer(accepted)


MWMS_WORKER = cluster_scripts.script(
    """
    out_dir, names, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    RING = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=RING))
    index = strategy.cluster_resolver.task_id
    rows, cols = 512, 512  # 1 MiB of fp32 kernel
    # Each worker has its own batch: the replicas' copies move apart between meetings.
    rng = np.random.default_rng(100 + index)
    teacher = np.random.default_rng(7).normal(size=(rows, cols)).astype("float32") / rows ** 0.5
    x = rng.normal(size=(64, rows)).astype("float32")
    y = x @ teacher
    data = tf_keras.utils.experimental.DatasetCreator(
        lambda context: tf.data.Dataset.from_tensors((x, y)).repeat())
    settings = {  # name: (codec, local steps, outer optimizer)
        "fp32": (tfgc.codecs.NoCompression(), 1, None),
        "fp32_average_h1": (tfgc.codecs.NoCompression(), 1, tfgc.OuterSGD.averaging()),
        "threelc": (tfgc.codecs.ThreeLC(1.0), 1, None),
        "threelc_h4": (tfgc.codecs.ThreeLC(1.0), 4, None),
    }
    report = {"index": index}
    for name in names:
        codec, local_steps, outer = settings[name]
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([tf_keras.layers.Dense(cols, use_bias=False,
                                                               input_shape=(rows,))])
            model.compile(tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.05), compression=codec, local_steps=local_steps,
                outer_optimizer=outer), "mse")
        callbacks = [tfgc.callbacks.OuterSteps()] if model.optimizer.outer_optimizer else []
        # A first epoch of one meeting's steps (tracing, collective set-up), then the
        # measured steps.
        model.fit(data, epochs=1, steps_per_epoch=local_steps, verbose=0, callbacks=callbacks)
        before = cluster.task_traffic()
        history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0,
                            callbacks=callbacks)
        after = cluster.task_traffic()
        peer = ("worker", 1 - index)
        np.save(os.path.join(out_dir, f"{name}_{index}.npy"), model.get_weights()[0])
        report[name] = {"sent": after[peer]["sent"] - before.get(peer, {"sent": 0})["sent"],
                        "loss": history.history["loss"]}
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)  # a barrier
    send_report(report)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_mwms_replicas_meet_every_h_steps_compressed(tmp_path):
    steps = 8
    names = ["fp32", "fp32_average_h1", "threelc", "threelc_h4"]
    script = tmp_path / "worker.py"
    script.write_text(MWMS_WORKER)
    local = cluster.LocalCluster(num_ps=0, num_workers=2, log_dir=tmp_path / "logs")
    try:
        results = local.run_workers([str(script), str(tmp_path), ",".join(names), str(steps)],
                                    timeout_s=300, check=True)
    finally:
        local.stop()
    reports = [cluster_scripts.read_report(r.stdout, r.stderr) for r in results]
    weights = {name: [np.load(tmp_path / f"{name}_{i}.npy") for i in range(2)]
               for name in names}
    # After the meeting that ends fit, every replica holds the same model.
    for name in names:
        np.testing.assert_array_equal(weights[name][0], weights[name][1], err_msg=name)
    # One local step with plain averaging is the synchronous step (the replicas'
    # gradients scaled back from Keras's 1/replicas), to within float rounding.
    plain, averaged = weights["fp32"][0], weights["fp32_average_h1"][0]
    np.testing.assert_allclose(averaged, plain, rtol=0,
                               atol=16 * np.spacing(np.abs(plain).max()))
    # Local steps send one meeting's payload per 4 steps: about a quarter of ThreeLC's
    # bytes per step (the meeting's payload is larger than one gradient's: 4 steps of
    # movement, fewer zeros).
    for report in reports:
        every_step, every_fourth = report["threelc"]["sent"], report["threelc_h4"]["sent"]
        assert every_fourth < 0.5 * every_step, report
        for name in names:
            loss = report[name]["loss"]
            assert np.isfinite(loss).all(), (name, loss)


MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tf_keras, tfgc
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    var = tf.Variable(tf.ones([32, 32]))
    opt = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.5), compression=tfgc.codecs.NoCompression(), min_elements=1,
        local_steps=2, outer_optimizer=tfgc.OuterSGD.averaging())
    opt.build([var])

@tf.function
def step(g):
    def fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(tf.gather(g, r), var)])
    strategy.run(fn)

# Powers of two: every product and sum below is exact.
g = [(np.full([2, 32, 32], 2.0 ** -k) * [[[1.0]], [[3.0]]]).astype(np.float32) for k in (3, 4)]
step(tf.constant(g[0]))
copies = [v.numpy() for v in strategy.experimental_local_results(var)]
# Each replica steps alone, on its gradient times the 2 replicas (Keras's 1/2 undone).
assert [c[0, 0] for c in copies] == [1 - 0.5 * 2 * 0.125, 1 - 0.5 * 2 * 0.375], copies
step(tf.constant(g[1]))
assert opt.maybe_synchronize(strategy)
copies = [v.numpy() for v in strategy.experimental_local_results(var)]
# The mean of the copies: w - lr * (the replicas' gradients summed), as synchronous SGD.
expected = 1 - 0.5 * (g[0].sum(0) + g[1].sum(0))
assert all(np.array_equal(c, expected) for c in copies), (copies, expected)
print("ok")
"""


@pytest.mark.slow
def test_mirrored_replicas_step_alone_and_meet_at_their_mean(run_python):
    assert "ok" in run_python(MIRRORED_SCRIPT, timeout=300)


def test_local_steps_with_a_keras3_optimizer_is_not_built_yet():
    keras = pytest.importorskip("keras")
    with pytest.raises(NotImplementedError, match="tf_keras optimizer"):
        tfgc.DistributedOptimizer(keras.optimizers.SGD(LR), compression=codecs.ThreeLC(),
                                  local_steps=2)


PS_COORDINATOR = cluster_scripts.script(
    """
    from sklearn.datasets import load_digits

    name, workers, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    y = data.target
    three = tfgc.codecs.ThreeLC(1.0)
    settings = {  # name: (codec of pushes, of pulls, local steps, outer optimizer)
        "fp32": (tfgc.codecs.NoCompression(),) * 2 + (1, None),
        "fp32_average_h1": (tfgc.codecs.NoCompression(),) * 2 + (1, tfgc.OuterSGD.averaging()),
        "fp32_average_h4": (tfgc.codecs.NoCompression(),) * 2 + (4, tfgc.OuterSGD.averaging()),
        "threelc_h4": (three, three, 4, tfgc.OuterSGD.averaging()),
        "powersgd_h4": (tfgc.codecs.PowerSGD(1), three, 4, tfgc.OuterSGD.averaging()),
        "fp32_nesterov_h4": (tfgc.codecs.NoCompression(),) * 2 + (4, tfgc.OuterSGD()),
    }
    # DiLoCo's inner optimizer for the runs named adamw..., else SGD with momentum.
    # Adam's epsilon at 1e-3: the biases before a batch norm have gradients that are 0
    # but for float rounding, which a smaller epsilon would turn into steps of ~lr in a
    # direction the rounding picks (different in two runs that round differently).
    inner = (lambda: tf_keras.optimizers.AdamW(0.01, weight_decay=0.004, epsilon=1e-3)) \
        if name.startswith("adamw") else (lambda: tf_keras.optimizers.SGD(0.05, momentum=0.9))
    name = name.removeprefix("adamw_")
    codec, pull_codec, local_steps, outer = settings[name]
    with cluster.LocalCluster(num_ps=1, num_workers=workers, timeout_s=240) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        with strategy.scope(), tfgc.compressed_pulls():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([  # the first batch norm's statistics: the data's
                tf_keras.layers.BatchNormalization(input_shape=(64,)),
                tf_keras.layers.Dense(128),
                tf_keras.layers.BatchNormalization(), tf_keras.layers.ReLU(),
                tf_keras.layers.Dense(10)])
        # fp32 runs send the batch-norm statistics in float32 too.
        small = {"small_compression": None} if name.startswith("fp32") else {}
        with strategy.scope():
            opt = tfgc.DistributedOptimizer(
                inner(), compression=codec,
                pull_compression=pull_codec, local_steps=local_steps, outer_optimizer=outer,
                **small)
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # In order, so that two runs with one worker see the same batches.
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
        callbacks = [tfgc.callbacks.OuterSteps()] if outer else []
        # A first epoch (tracing, the functions sent to the workers, the first full
        # pulls), then the measured one.
        import warnings
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                          callbacks=callbacks)
        except NotImplementedError as error:
            send_report({"refused": str(error)})
            sys.exit(0)
        outer_warnings = [str(w.message) for w in caught if "outer momentum" in str(w.message)]
        rows = c.settled_socket_bytes()
        up = c.traffic_between("worker", "ps", rows=rows)
        down = c.traffic_between("ps", "worker", rows=rows)
        pushed = int(opt.traffic["push_bytes"].numpy())
        pulled = int(opt.traffic["pull_bytes"].numpy())
        history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                            callbacks=callbacks)
        rows = c.settled_socket_bytes()
        result = {
            "loss": history.history["loss"],
            "worker_to_ps": c.traffic_between("worker", "ps", rows=rows) - up,
            "ps_to_worker": c.traffic_between("ps", "worker", rows=rows) - down,
            "pushed": int(opt.traffic["push_bytes"].numpy()) - pushed,
            "pulled": int(opt.traffic["pull_bytes"].numpy()) - pulled,
            "traffic": {k: int(v.numpy()) for k, v in opt.traffic.items()},
            "iterations": int(opt.iterations.numpy()),
            "weights": [w.tolist() for w in model.get_weights()],
            "outer_warnings": outer_warnings,
        }
        if local_steps > 1:
            pulls = model.trainable_variables[0].owner
            result["worker_steps"] = [int(v.numpy()) for v in pulls.local_step.read_all()]
            # Evaluated on the workers, which read the master (a worker's cache holds its
            # own steps since it last met the server).
            model.compile(opt, tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
            result["eval_accuracy"] = model.evaluate(
                tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(256), steps=4,
                verbose=0, return_dict=True)["accuracy"]
            # Statistics recomputed on the coordinator, from the servers' weights, into
            # the servers' variables.
            result["recomputed"] = tfgc.recompute_statistics(model, dataset, batches=2)
            result["statistics"] = [w.tolist() for w in model.get_weights()[2:4]]
    send_report(result)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_workers_train_their_copies_and_meet_every_h_steps(run_report):
    runs = {name: run_report(PS_COORDINATOR, timeout=400, args=[name, str(workers), str(steps)])
            for name, workers, steps in [("fp32", 1, 8), ("fp32_average_h1", 1, 8),
                                         ("fp32_average_h4", 1, 8), ("threelc_h4", 2, 24)]}
    # One worker that meets with plain averaging takes the steps it would without local
    # steps (SGD with momentum, each step's pushed and applied to the master), whether
    # it meets every step or every 4 (16 steps, fp32 both ways), to within float
    # rounding: (copy + step) - anchor is the step to an ulp of the weight, which later
    # gradients carry on. A lost momentum or step would be off by ~1e-3. The servers'
    # batch-norm statistics, updated every step or folded over 4 and sent at the
    # meeting, agree too.
    for name in ("fp32_average_h1", "fp32_average_h4"):
        for plain, local in zip(runs["fp32"]["weights"], runs[name]["weights"]):
            np.testing.assert_allclose(local, plain, rtol=0, atol=1e-4, err_msg=name)
    # The first batch norm's statistics are the data's, every step's batch (each fit
    # reads the batches from the first): folded over 4 steps, none is lost or repeated.
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype(np.float64)
    mean, variance = np.zeros(64), np.ones(64)
    for b in list(range(8)) * 2:
        batch = x[32 * b:32 * (b + 1)]
        mean = 0.99 * mean + 0.01 * batch.mean(0)
        variance = 0.99 * variance + 0.01 * batch.var(0)
    for name in ("fp32", "fp32_average_h4"):
        moving_mean, moving_variance = runs[name]["weights"][2:4]
        np.testing.assert_allclose(moving_mean, mean, rtol=0, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(moving_variance, variance, rtol=0, atol=1e-5, err_msg=name)
    # What the meetings pushed crossed once: 81 KB of fp32 deltas and 21 KB of the
    # steps' requests here; the message would be read twice by a server whose branch
    # and condition each received it (183 KB).
    h4 = runs["fp32_average_h4"]
    assert h4["pushed"] <= h4["worker_to_ps"] < 1.5 * h4["pushed"], h4
    # With H = 4 each worker pulls at the first and pushes at the last of every 4 of
    # its steps: the counters count the meetings' and the pulls' dense bytes only.
    local = runs["threelc_h4"]
    model_bytes = (2 * 64 + 64 * 128 + 128 + 2 * 128 + 128 * 10 + 10) * 4
    statistics_bytes = 2 * (64 + 128) * 4
    worker_steps = local["worker_steps"]
    assert sum(worker_steps) == local["iterations"] == 48
    meetings, pulls = sum(s // 4 for s in worker_steps), sum(-(-s // 4) for s in worker_steps)
    # The statistics travel at meetings only (they would count at every step).
    assert local["traffic"]["push_dense_bytes"] == meetings * (model_bytes + statistics_bytes)
    assert local["traffic"]["pull_dense_bytes"] == pulls * model_bytes
    # What the second epoch counted crossed in its sockets.
    assert 0 < local["pushed"] <= local["worker_to_ps"], local
    assert 0 < local["pulled"] <= local["ps_to_worker"], local
    # ThreeLC's pseudo-gradients of the kernels: at most ~2 bits a value (zero-run
    # encoding of the quartic bytes); the small tensors and statistics 16 bits each.
    kernel_values = 64 * 128 + 128 * 10
    small_values = (model_bytes + statistics_bytes) // 4 - kernel_values
    assert local["traffic"]["push_bytes"] < meetings * (kernel_values / 4 + 2 * small_values)
    # And the workers learn.
    assert local["loss"][-1] < 1.5, local["loss"]
    # recompute_statistics on the coordinator: the first batch norm's statistics are the
    # mean of the first two batches' (batch variances without Bessel's correction).
    assert local["recomputed"] == 2
    np.testing.assert_allclose(local["statistics"][0], x[:64].reshape(2, 32, 64).mean(1).mean(0),
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(local["statistics"][1], x[:64].reshape(2, 32, 64).var(1).mean(0),
                               rtol=0, atol=1e-5)
    assert local["eval_accuracy"] > 0.5, local  # of 10 classes


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_workers_take_adamw_steps_of_their_own(run_report):
    # AdamW as the inner optimizer (DiLoCo's): one worker that meets with plain averaging
    # every 4 steps takes the steps synchronous AdamW takes on the server, its moments
    # per-worker variables and its bias correction counted in its own steps (here the
    # optimizer's). A lost moment, a step counted from 0 or the decay applied twice
    # would be off by ~1e-3 within these 16 steps.
    runs = {name: run_report(PS_COORDINATOR, timeout=400, args=[name, "1", "8"])
            for name in ("adamw_fp32", "adamw_fp32_average_h4")}
    for plain, local in zip(runs["adamw_fp32"]["weights"],
                            runs["adamw_fp32_average_h4"]["weights"]):
        np.testing.assert_allclose(local, plain, rtol=0, atol=1e-4)
    assert runs["adamw_fp32_average_h4"]["worker_steps"] == [16]


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_local_steps_warn_of_an_outer_momentum(run_report):
    # Each worker's meeting is an outer step of its own there: Nesterov meetings did not
    # train ResNet-20 where averaging did (the results page), so they warn; averaging
    # does not (the runs of the tests above report no such warning).
    report = run_report(PS_COORDINATOR, timeout=400, args=["fp32_nesterov_h4", "1", "4"])
    assert len(report["outer_warnings"]) == 1, report["outer_warnings"]
    assert "OuterSGD.averaging()" in report["outer_warnings"][0]
    averaged = run_report(PS_COORDINATOR, timeout=400, args=["fp32_average_h4", "1", "4"])
    assert averaged["outer_warnings"] == []


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_local_steps_refuse_a_codec_with_per_worker_state(run_report):
    # PowerSGD's warm start is a per-worker variable, which a meeting's branch cannot read.
    report = run_report(PS_COORDINATOR, timeout=400, args=["powersgd_h4", "1", "4"])
    assert "cannot be read yet" in report["refused"] and "PowerSGD" in report["refused"]


PS_CUSTOM_LOOP = cluster_scripts.script(
    """
    from sklearn.datasets import load_digits

    local_steps = int(sys.argv[1])
    data = load_digits()
    x = (data.images / 16.0).reshape(-1, 64).astype("float32")
    y = data.target
    with cluster.LocalCluster(num_ps=1, num_workers=1, timeout_s=240) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        with strategy.scope(), tfgc.compressed_pulls():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([
                tf_keras.layers.BatchNormalization(input_shape=(64,)),
                tf_keras.layers.Dense(128),
                tf_keras.layers.BatchNormalization(), tf_keras.layers.ReLU(),
                tf_keras.layers.Dense(10)])
        with strategy.scope():
            fp32 = tfgc.codecs.NoCompression()
            opt = tfgc.DistributedOptimizer(
                tf_keras.optimizers.SGD(0.05, momentum=0.9), compression=fp32,
                pull_compression=fp32, small_compression=None, local_steps=local_steps,
                outer_optimizer=tfgc.OuterSGD.averaging() if local_steps > 1 else None)
            opt.build(model.trainable_variables)  # the pulls start here, before a step
        loss_of = tf_keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf_keras.losses.Reduction.NONE)
        batches = coordinator.create_per_worker_dataset(
            lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32))

        @tf.function
        def train_step(iterator):
            def replica_step(features, labels):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(loss_of(labels, model(features, training=True)))
                gradients = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(gradients, model.trainable_variables))
                return loss

            return strategy.run(replica_step, args=next(iterator))

        iterator = iter(batches)
        losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(16)]
        coordinator.join()
        report = {"losses": [float(loss.fetch()) for loss in losses],
                  "weights": [w.tolist() for w in model.get_weights()],
                  "traffic": {k: int(v.numpy()) for k, v in opt.traffic.items()}}
        if local_steps > 1:
            report["worker_steps"] = [
                int(v.numpy()) for v in model.trainable_variables[0].owner.local_step.read_all()]
        send_report(report)
    """
)


@pytest.mark.cluster
@pytest.mark.slow
def test_parameter_server_local_steps_train_a_custom_loop(run_report):
    # A ClusterCoordinator loop of the user's own (strategy.run, apply_gradients): one
    # worker meeting with averaging every 4 steps trains the model the same loop trains
    # without local steps, statistics included, and pushes at its meetings only.
    plain, local = (run_report(PS_CUSTOM_LOOP, timeout=400, args=[h]) for h in ("1", "4"))
    for before, after in zip(plain["weights"], local["weights"]):
        np.testing.assert_allclose(after, before, rtol=0, atol=1e-4)
    assert local["worker_steps"] == [16]
    np.testing.assert_allclose(local["losses"], plain["losses"], rtol=0, atol=1e-4)
    # 16 steps' dense bytes pushed without local steps, 4 meetings' with them.
    assert plain["traffic"]["push_dense_bytes"] == 4 * local["traffic"]["push_dense_bytes"] > 0
