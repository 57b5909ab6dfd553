"""Train a reference model with compressed gradients, locally or on a local TF cluster.

    python -m models.train --model resnet20 --dataset cifar10 \\
        --compression threelc:sparsity=1.75 --strategy ps --workers 2 --steps 1000

Strategies:

* ``local``: one process, no tf.distribute strategy; gradients still go through the
  codec (encode + decode), to study accuracy.
* ``ps``: a real parameter-server cluster on 127.0.0.1 (`tfgc.cluster.LocalCluster`,
  ``--ps`` servers and ``--workers`` workers, one process each); this process is the
  coordinator and runs tf_keras ``fit`` under ParameterServerStrategy. Workers push
  encoded gradients; bytes per direction are read from the kernel's per-socket
  counters. ``--steps`` counts worker steps (each one batch of ``--batch-size`` from one
  worker, applied asynchronously). The workers read the training images from a file
  written in ``--out`` (removed after training), not from this process over the link
  (the sparse models' data is still sent from this process).
* ``mwms``: MultiWorkerMirroredStrategy with ``--workers`` processes on 127.0.0.1 (one
  TF_CONFIG each); ``--steps`` counts synchronous steps of a global batch of
  ``--batch-size`` x ``--workers``.

Real clusters (``--tf-config``; guide: docs/deployment.md): every task gets its own
``TF_CONFIG``. For ``ps``, the parameter servers and workers run a server that has
loaded tfgc's ops::

    python -m tfgc.server      # or the console script tfgc-server

and the chief task runs ``python -m models.train --strategy ps --tf-config ...``, which
sends the training set to every worker before the first step (tf.data's copy of the
arrays: minutes on a slow link). For
``mwms`` every worker task runs ``python -m models.train --strategy mwms --tf-config ...``
(worker 0 writes the outputs). On a GPU machine ``--strategy local`` trains on the GPU
as it is. 3LC's full CIFAR-10 run is ResNet-110 with batch 32
per worker on 10 workers (163.84 epochs, 25,600 synchronous steps): ``--model resnet110
--strategy mwms --workers 10 --steps 25600 --dataset cifar10 --manual-dir DIR``.

Outputs under ``--out`` (default runs/<name>): ``history.csv`` (per step: time, loss,
accuracy, push bytes), ``summary.json`` (the run's settings, dataset actually used,
test accuracy, bytes per step, step time), ``tensorboard/`` and ``plot.png`` (loss and
accuracy against time and steps; overlay runs with ``python -m models.plots``).

Sparse models (FastSGD): ``--model logistic|svm|linear --dataset reuters_corn`` (or
``reuters_grain``, ``libsvm:PATH``) trains a linear model on sparse input with Adam
(``models.workloads.SparseWorkload``); its weight gradient is a ``tf.IndexedSlices``.

Compression specs: ``none``, ``fp16``, ``bf16``, ``int8``, ``threelc:sparsity=1.75``,
``quantize:bits=4``, ``ternary``, ``onebit``, ``sparsify:fraction=0.25``,
``topk:ratio=0.01``, ``logquant:bits=4``, ``fastsgd:base=1.1``, ``qsgd:bits=4`` (any
`tfgc.codecs` class name works, with its constructor arguments after the colon).

Exit status: 0 when the run completed; 1 for other errors; 2 for bad options;
``divergence.EXIT_DIVERGED`` (3) when the training loss became NaN or infinite: the run
stops at the first such loss it sees (after that step; under ``ps`` at the end of that
Keras epoch), prints which model diverged at which step and learning rate, keeps
``history.csv`` up to there and is not restarted (retry with a lower ``--lr``);
``supervise.EXIT_TASK_LOST`` (75) when a task of a local ``ps`` cluster died more than
``--max-restarts`` times.

The recipe follows 3LC for ResNets: SGD with momentum 0.9, weight decay 1e-4, cosine
decay of the learning rate from --lr to --lr-final over the run, the learning rate
scaled by the number of synchronous replicas, per-worker batch 32, random crop (4-pixel
padding) and horizontal flip. ``--lr`` defaults per model (`workloads.default_lr`): 0.1
for the ResNets, 0.01 for mqgrad_cnn (which stays at chance at 0.1), 0.01 (Adam) for
the sparse models. ResNets deeper than ResNet-20 warm up linearly from a tenth of it
over their first 400 steps, as He et al. did for ResNet-110.
"""
import contextlib
import csv
import json
import os
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from models import data as data_lib
from models import divergence, held_out, lost_workers, supervise, workloads
from models.recorder import HISTORY_FIELDS, recorder_classes
from models.train_args import (
    build_parser, default_momentum, default_outer_optimizer, fill_optimizer_defaults,
    parse_agent_arguments,
    parse_compression)

_ACTIVE_CLUSTERS = []  # LocalClusters left running until main() ends


def make_optimizer(args, workload, replicas, codec, servers=None):
    """The workload's optimizer (its learning rate scaled by `replicas`), wrapped in a
    tfgc.DistributedOptimizer (handed `servers`, a tfgc.ParameterServers, if any)."""
    import tfgc

    inner = workload.inner_optimizer(args.lr * replicas, args.steps)
    # Unbiased codecs gain nothing from error feedback (RandomK draws at random but is
    # biased: it needs it); the identity has no error.
    feedback = args.error_feedback and workload.error_feedback and not codec.unbiased
    uncompressed = isinstance(codec, tfgc.codecs.NoCompression)
    if uncompressed:
        feedback = False
    return tfgc.DistributedOptimizer(
        inner, compression=codec, min_elements=args.min_elements, error_feedback=feedback,
        small_compression=_small_compression(codec), local_steps=args.local_steps,
        outer_optimizer=outer_optimizer(args), parameter_servers=servers,
    )


def _small_compression(codec):
    """The fp32 baseline sends everything in fp32, its small tensors too."""
    import tfgc

    return None if isinstance(codec, tfgc.codecs.NoCompression) else "float16"


def parameter_servers(args, codec, pull_codec):
    """The tfgc.ParameterServers of --pull-compression (the push codec `codec` decides
    the small tensors' codec, as for pushes), or None without compressed pulls."""
    import tfgc

    if pull_codec is None:
        return None
    return tfgc.ParameterServers(pull_codec, small_compression=_small_compression(codec),
                                 min_elements=args.min_elements, local_steps=args.local_steps)


def outer_optimizer(args):
    """The `tfgc.OuterSGD` of --local-steps, or None without local steps."""
    import tfgc

    if args.local_steps == 1:
        return None
    if args.outer_optimizer == "average":
        return tfgc.OuterSGD.averaging()
    return tfgc.OuterSGD(args.outer_lr, momentum=args.outer_momentum, nesterov=True)


# --- callbacks ----------------------------------------------------------------------------


def mqgrad_summary(callback):
    """What an MQGrad callback did, for summary.json: its agent's options, MDP steps,
    mean bits and [step, bits] wherever the bits changed (steps of this attempt)."""
    used = [entry["bits"] for entry in callback.trace]
    changes = [[step, bits] for step, bits in enumerate(used)
               if step == 0 or bits != used[step - 1]]
    return {"agent": dict(callback.agent.config), "mdp_steps": callback.agent.t,
            "mean_bits": float(np.mean(used)) if used else None, "bits_changes": changes}


# --- the run ------------------------------------------------------------------------------


def _log(message):
    print(f"[models.train] {message}", file=sys.stderr, flush=True)


def _has_tensorboard():
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        _log("no TensorBoard logs: the tensorboard package is not installed")
        return False
    return True


def _link_kwargs(args):
    """LocalCluster's bandwidth, delay and loss arguments for --link (or --bandwidth)."""
    from tfgc.cluster import netem

    spec = args.link or args.bandwidth
    if not spec:
        return {}
    return {key: value for key, value in netem.parse_link(spec).items() if value is not None}


def train(args):
    """Runs one training job in this process (for mwms: this worker's part).

    Returns:
      The summary dict (also written to <out>/summary.json by the chief).
    """

    import tensorflow as tf
    import tf_keras

    import tfgc

    tf_keras.utils.set_random_seed(args.seed)
    workload = workloads.for_model(args.model)(args)
    _log(workload.describe())
    if args.strategy == "mwms":
        # Before any codec: one with a random generator (QSGD, RandomK, GradiVeQ's
        # sampler) starts TensorFlow's context, after which collectives cannot be set up.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    codec = parse_compression(args.compression)
    steps_per_epoch = min(args.log_every, args.steps)
    epochs = max(1, -(-args.steps // steps_per_epoch))
    outer = outer_optimizer(args)
    summary = {
        "name": args.name, "model": args.model, "dataset_requested": args.dataset,
        **workload.summary_fields(),
        "compression": args.compression, "codec": tfgc.codecs.serialize(codec),
        "pull_compression": args.pull_compression,
        "strategy": args.strategy, "workers": args.workers if args.strategy != "local" else 1,
        "ps": args.ps if args.strategy == "ps" else 0, "steps": steps_per_epoch * epochs,
        "batch_size": args.batch_size, "optimizer": args.optimizer, "lr": args.lr,
        "seed": args.seed,
        "weight_decay": args.weight_decay, "weight_decay_mode": args.weight_decay_mode,
        "bandwidth": _link_kwargs(args).get("bandwidth"), "link": args.link or args.bandwidth,
        "local_steps": args.local_steps,
        "outer_optimizer": None if outer is None else outer.get_config(),
        "command": "python -m models.train " + " ".join(args.argv),
    }
    is_chief, cluster = True, None
    if args.strategy == "ps" and args.tf_config:
        # A real cluster described by $TF_CONFIG; this process is its chief.
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        if resolver.task_type != "chief":
            raise ValueError("with --strategy ps --tf-config, run models.train as the chief "
                             f"task (TF_CONFIG task type is {resolver.task_type!r}); ps and "
                             "worker tasks run `python -m tfgc.server`")
        spec = resolver.cluster_spec().as_dict()
        summary.update(workers=len(spec.get("worker", [])), ps=len(spec.get("ps", [])))
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    elif args.strategy == "ps":
        from tfgc import cluster as cluster_lib

        cluster = cluster_lib.LocalCluster(
            num_ps=args.ps, num_workers=args.workers, timeout_s=args.timeout,
            **_link_kwargs(args),
        ).start()
        strategy = tf.distribute.experimental.ParameterServerStrategy(cluster.resolver)
    elif args.strategy == "mwms":
        tf_config = json.loads(os.environ["TF_CONFIG"])
        is_chief = tf_config["task"]["index"] == 0
        summary["workers"] = len(tf_config["cluster"]["worker"])
    else:
        strategy = tf.distribute.get_strategy()
    out = args.out if is_chief else tempfile.mkdtemp(prefix="tfgc-train-worker-")
    os.makedirs(out, exist_ok=True)
    try:
        rows = _fit_and_evaluate(args, workload, codec, strategy, cluster, out, summary,
                                 steps_per_epoch, epochs)
    except BaseException as error:
        if cluster is not None:
            cluster.stop(remove_logs=False)
        if isinstance(error, divergence.Diverged) and is_chief:
            # No summary (there is no trained model to test), but the curve up to the
            # bad loss shows how it diverged.
            _write_history(out, getattr(error, "rows", []))
        raise
    # The servers keep running until main() is done: TensorFlow unregisters every
    # cluster function on every task when it is freed, and logs an error for each one
    # whose server is gone.
    _ACTIVE_CLUSTERS.extend([cluster] if cluster is not None else [])

    if is_chief:
        _write_history(out, rows)
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        try:
            from models import plots

            plots.plot_runs([out], os.path.join(out, "plot.png"))
        except ImportError as error:
            _log(f"no plot: {error}")
        _log(f"test accuracy {summary['test_accuracy']:.4f} on {summary['dataset']}"
             + (f" (SUBSTITUTE for {summary['substitute_for']})" if summary["substitute_for"]
                else "")
             + f"; outputs in {out}")
    return summary


def _write_history(out, rows):
    with open(os.path.join(out, "history.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def _fit_and_evaluate(args, workload, codec, strategy, cluster, out, summary,
                      steps_per_epoch, epochs):
    """Builds, trains and tests the workload's model under `strategy`; fills `summary`.

    Returns the per-step (per-epoch under PSS) history rows.
    """
    import tensorflow as tf
    import tf_keras

    import tfgc

    # Synchronous replicas scale the learning rate; a PS update is one worker's batch, and
    # so is a local step.
    replicas = strategy.num_replicas_in_sync if args.strategy == "mwms" else 1
    lr_scale = replicas if args.local_steps == 1 else 1
    pull_codec = None if args.pull_compression == "none" else parse_compression(args.pull_compression)
    with strategy.scope():
        if args.mqgrad is not None:
            # MQGrad assigns the codec's bits variable. Made here, under PSS it lives on a
            # parameter server, where every worker reads it at its next step.
            codec = parse_compression(args.compression)
        in_loss = args.weight_decay_mode == "loss"
        # Weights created in the servers' scope are read on workers from caches that the
        # parameter servers update with compressed deltas (3LC's pulls).
        servers = parameter_servers(args, codec, pull_codec)
        with servers.scope() if servers is not None else contextlib.nullcontext():
            model = workload.build_model(args.weight_decay if in_loss else 0.0)
        optimizer = make_optimizer(args, workload, lr_scale, codec, servers)
        if not in_loss and args.weight_decay:
            # Decoupled decay, applied where the variable lives, on kernels only (as the
            # L2 term); no gradient term, so nothing extra is pulled or compressed.
            optimizer.weight_decay = args.weight_decay
            optimizer.exclude_from_weight_decay(
                var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
        optimizer.build(model.trainable_variables)  # compressed pulls start at build
        model.compile(optimizer, workload.loss(), metrics=workload.metrics(),
                      steps_per_execution=args.steps_per_execution)
    summary["steps_per_execution"] = args.steps_per_execution
    summary["parameters"] = int(model.count_params())
    summary["lr_scaled"] = args.lr * lr_scale
    summary["momentum"] = optimizer.get_config().get("momentum")  # SGD's (None: not SGD)
    summary["error_feedback"] = bool(optimizer.error_feedback)
    # The local cluster's workers read the training set from a file in `out` rather than
    # receive it from this process over the (possibly emulated, slow) link.
    records_path = None
    if cluster is not None and isinstance(workload, workloads.ImageWorkload):
        records_path = os.path.join(out, "train.records")
        train_ds = workload.train_dataset(args.batch_size * replicas, records_path)
    else:
        train_ds = workload.train_dataset(args.batch_size * replicas)
    options = tf.data.Options()
    if args.strategy == "mwms":
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.DATA)
        train_ds = train_ds.with_options(options)
    # Otherwise tf_keras traces the first step twice, and under PSS sends both to each task.
    tfgc.build_for_fit(model, train_ds)

    # The test set is evaluated on a copy of the trained weights: under parameter servers
    # on the coordinator; under MultiWorkerMirrored by every worker alone, as the
    # statistics are recomputed there from the same first training batches; and by
    # --eval-every's tests. Made here, outside the strategy's scope.
    tests_a_copy = args.strategy == "ps" or (
        args.strategy == "mwms" and args.recompute_statistics)
    copy_for_tests = None
    if tests_a_copy or args.eval_every:
        copy_for_tests = workload.build_model(0.0)
        copy_for_tests.compile("sgd", workload.loss(), metrics=workload.metrics())
    test_ds = workload.test_dataset()
    if args.strategy == "mwms":
        test_ds = test_ds.with_options(options)
    if args.eval_every:
        # The copy's metrics are made here, outside any strategy: made in a callback of
        # `fit` they would be the strategy's (MultiWorkerMirrored's sync-on-read sums).
        held_out.evaluate_in_fit(copy_for_tests, test_ds.take(1))

    def test(tested, in_fit=False):
        """[loss, accuracy] of `tested` on the test set: batch-norm statistics recomputed
        at the workers' batch size where --recompute-statistics says so (the batch size
        their batch statistics were taken at), else kept."""
        if args.recompute_statistics:
            summary["recomputed_statistics_batches"] = tfgc.recompute_statistics(
                tested, workload.train_dataset(args.batch_size), args.recompute_statistics)
        if in_fit:
            return held_out.evaluate_in_fit(tested, test_ds)
        return tested.evaluate(test_ds, verbose=0)

    def test_during_fit(trained):
        copy_for_tests.set_weights(trained.get_weights())
        return test(copy_for_tests, in_fit=True)[1]

    per_batch = args.strategy != "ps"
    recorder = recorder_classes()[per_batch](
        optimizer, steps_per_epoch, per_batch, "task" if args.strategy == "mwms" else cluster,
        rows_path=supervise.rows_path(out) if args._attempt else None)
    callbacks = [tfgc.callbacks.TrafficLogger()] if per_batch else []
    if optimizer.outer_optimizer is not None:
        callbacks.insert(0, tfgc.callbacks.OuterSteps())  # the meetings of local steps
    callbacks.append(recorder)
    lost = None
    if cluster is not None:
        lost = lost_workers.watcher(cluster, _log)
        callbacks.append(lost)
    evaluator = None
    if args.eval_every:
        evaluator = held_out.evaluator_class()(
            recorder, test_during_fit, args.eval_every, epochs)
        callbacks.append(evaluator)
    # After the recorder (the bad loss gets its row), before the backup's save (a
    # diverged epoch is never saved, so no restart could resume from it).
    callbacks.append(divergence.stop_on_divergence(
        args.model, steps_per_epoch, epochs, args.lr, summary["lr_scaled"], args.strategy,
        per_batch))
    mqgrad = None
    if args.mqgrad is not None:
        # After a restart (--max-restarts) a new agent starts over from its initial bits.
        mqgrad = tfgc.callbacks.MQGrad(optimizer, seed=args.seed,
                                       **parse_agent_arguments(args.mqgrad))
        callbacks.insert(0, mqgrad)
        # The agent sets the codec's bits when training begins; record where they start.
        summary["codec"]["config"]["bits"] = mqgrad.agent.config["initial_bits"]
    if args.tensorboard and _has_tensorboard():
        callbacks.append(tf_keras.callbacks.TensorBoard(
            os.path.join(out, "tensorboard"), update_freq="epoch", profile_batch=0,
            write_graph=False))
    _log(f"training {args.model} ({summary['parameters']:,d} parameters) with "
         f"{args.compression} under {args.strategy} for {summary['steps']} steps")
    if args._attempt and args.max_restarts > 0:
        # Saved after the recorder's row, every --backup-every-s; a later attempt resumes
        # from it (models.supervise), restored before the recorder starts.
        restore, save = supervise.backup_callbacks(out, args.backup_every_s,
                                                   pause=recorder.pause)
        callbacks = [restore, *callbacks, save]
    started = time.monotonic()
    try:
        model.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                  callbacks=callbacks,
                  verbose=args.verbose if args.verbose == "auto" else int(args.verbose))
    except divergence.Diverged as diverged:
        diverged.rows = recorder.rows  # the history up to the bad loss, for history.csv
        raise
    except tf.errors.OpError as error:
        dead = _dead_task(cluster)
        if dead is None:
            raise
        raise supervise.TaskLost(f"{dead} ({type(error).__name__})") from error
    finally:
        if records_path is not None:
            os.remove(records_path)  # the workers' open readers keep what they use
    returned = time.monotonic()
    if lost is not None:
        # The workers that trained to the end, and those lost on the way.
        summary["workers_finished"] = lost.finished
        summary["workers_lost"] = lost.lost
    # Up to the end of the last epoch. What follows inside `fit` is TensorFlow freeing the
    # per-worker input pipelines; under PSS removing their remote functions has taken
    # from 0.3 s to over 30 s, varying from run to run for every codec, fp32 included.
    trained = recorder.last_epoch_end or returned
    summary["train_time_s"] = trained - started - recorder.paused_before(trained)
    summary["fit_teardown_s"] = returned - trained
    if mqgrad is not None:
        summary["mqgrad"] = mqgrad_summary(mqgrad)

    rows = recorder.rows
    steps_done = summary["steps"]
    # Step time: wall time per step of this attempt after its first Keras epoch
    # (tracing, warm-up).
    attempt_rows = rows[recorder.resumed_rows:]
    if per_batch:
        first_row = rows[min(len(rows), steps_per_epoch) - 1]
    else:
        first_row = attempt_rows[0]
    later = steps_done - first_row["step"]
    summary["step_time_s"] = (
        (rows[-1]["time_s"] - first_row["time_s"]) / later if later > 0
        else rows[-1]["time_s"] / steps_done)
    # This attempt's first Keras epoch: its steps plus tracing and graph optimization.
    summary["first_epoch_s"] = first_row["time_s"]
    # Where the time after the first epoch went: the epochs themselves (their steps,
    # the wait for the last of them, Keras reading the metrics), per step; and the work
    # between one epoch's end and the next one's start (callbacks, set-up), per gap.
    later_epochs = recorder.epoch_seconds[1:]
    summary["in_epoch_step_time_s"] = (
        sum(later_epochs) / (len(later_epochs) * steps_per_epoch) if later_epochs else None)
    gaps = recorder.between_epochs_seconds
    summary["between_epochs_s"] = sum(gaps) / len(gaps) if gaps else None
    for key in ("loss", "accuracy"):
        tail = [r[key] for r in rows if r[key] is not None and r["step"] > steps_done - steps_per_epoch]
        summary["final_train_" + key] = float(np.mean(tail)) if tail else None
    counters = optimizer.read_traffic()
    summary["push_bytes_per_step"] = counters["push_bytes"] / steps_done
    summary["push_dense_bytes_per_step"] = counters["push_dense_bytes"] / steps_done
    summary["payload_ratio"] = (
        counters["push_dense_bytes"] / counters["push_bytes"] if counters["push_bytes"] else None)
    summary["pull_bytes_per_step"] = counters["pull_bytes"] / steps_done
    summary["pull_payload_ratio"] = (
        counters["pull_dense_bytes"] / counters["pull_bytes"] if counters["pull_bytes"] else None)
    if cluster is not None:
        # This attempt's cluster: its sockets saw only its own steps.
        before, after = recorder.socket_rows[0], recorder.socket_rows[-1]
        for key in ("worker_to_ps", "ps_to_worker"):
            summary[f"socket_{key}_bytes_per_step"] = (
                (after[key] - before[key]) / (after["step"] - before["step"]))
        summary["socket_bytes"] = recorder.socket_rows
        # Everything this process sent the workers (functions, closures, any input data).
        summary["socket_chief_to_worker_bytes"] = cluster.traffic_between("chief", "worker")
    elif args.strategy == "mwms":
        before, after = recorder.socket_rows[0], recorder.socket_rows[-1]
        # Worker 0's view: what it sent to and received from the other workers.
        for key in ("sent", "received"):
            summary[f"socket_worker0_{key}_bytes_per_step"] = (after[key] - before[key]) / steps_done
        summary["socket_bytes"] = recorder.socket_rows

    test_model = model
    if tests_a_copy:
        test_model = copy_for_tests
        test_model.set_weights(model.get_weights())
    if args.recompute_statistics:
        # Tested with the statistics training kept too, for the record.
        summary["test_accuracy_kept_statistics"] = float(
            test_model.evaluate(test_ds, verbose=0)[1])
    test_loss, test_accuracy = test(test_model)
    summary["test_loss"], summary["test_accuracy"] = float(test_loss), float(test_accuracy)
    if evaluator is not None:
        summary["held_out"] = evaluator.rows
        summary["held_out_statistics"] = "recomputed" if args.recompute_statistics else "kept"
    return rows


# How long a failed step waits for a task's death to become visible. A killed server's
# sockets close (and the coordinator's call fails) before the kernel lets its parent
# reap it, so `poll()` can still see it running for a moment, longer on a busy machine.
DEAD_TASK_GRACE_S = 10.0


def _dead_task(cluster, grace_s=DEAD_TASK_GRACE_S):
    """A sentence naming a dead task of `cluster` (a LocalCluster or None), or None.

    Called after a step failed: looks again for up to `grace_s` seconds before it
    concludes that every task is alive (only a failure that no dead task explains
    waits that long).
    """
    from tfgc import cluster as cluster_lib

    if cluster is None:
        return None
    deadline = time.monotonic() + grace_s
    while True:
        try:
            cluster.check_alive()
        except cluster_lib.ClusterError as error:
            return str(error).splitlines()[0]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


# --- multi-worker launcher --------------------------------------------------------------


def launch_workers(args, argv):
    """Runs one process per MWMS worker on 127.0.0.1; returns the chief's summary.

    Uses `tfgc.cluster.LocalCluster(num_ps=0).run_workers`: each worker reruns this
    command with the TF_CONFIG of its task; all are killed (by pid) when one fails or on
    timeout. Worker 0's output is shown afterwards; every worker's is in the cluster's
    log directory.
    """
    from tfgc import cluster as cluster_lib

    with cluster_lib.LocalCluster(num_ps=0, num_workers=args.workers, timeout_s=args.timeout,
                                  log_dir=os.path.join(args.out, "worker-logs"),
                                  **_link_kwargs(args)) as c:
        _log(f"running {args.workers} MultiWorkerMirroredStrategy workers on "
             f"{', '.join(c.addresses['worker'])}; logs in {c.log_dir}")
        results = c.run_workers(["-m", "models.train", *argv, "--_worker"],
                                timeout_s=args.timeout)
    for result in results[:1]:
        for path in (result.stdout_path, result.stderr_path):
            with open(path, errors="replace") as f:
                text = "".join(line for line in f if not line.startswith(("WARNING", "I0000", "E0000", "W0000")))
            sys.stderr.write(text[-6000:])
    failed = [r for r in results if r.returncode != 0]
    diverged = [r for r in failed if r.returncode == divergence.EXIT_DIVERGED]
    if diverged:
        # The other workers were stopped because this one left; say why it did.
        with open(diverged[0].stderr_path, errors="replace") as f:
            said = [line.strip().removeprefix("[models.train] ") for line in f
                    if " diverged: " in line]
        raise divergence.Diverged(
            f"MWMS worker {diverged[0].index}: "
            + (said[-1] if said else f"the loss diverged; see {diverged[0].stderr_path}"))
    if failed:
        r = failed[0]
        raise RuntimeError(
            f"MWMS worker {r.index} exited with code {r.returncode}"
            f"{' (timed out)' if r.timed_out else ''}; see {r.stderr_path}")
    with open(os.path.join(args.out, "summary.json")) as f:
        return json.load(f)


# --- command line -------------------------------------------------------------------------


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = [a for a in argv if a not in ("--_worker", "--_attempt")]
    if args.steps < 1 or args.workers < 1 or args.ps < 1 or args.batch_size < 1:
        parser.error("--steps, --workers, --ps and --batch-size must be positive")
    if args.max_restarts < 0:
        parser.error("--max-restarts must be >= 0")
    if args.backup_every_s < 0:
        parser.error("--backup-every-s must be >= 0")
    # A process that makes a MultiWorkerMirroredStrategy must not build a codec first
    # (see train); its launcher checked the specs.
    makes_mwms = args.strategy == "mwms" and (args._worker or args.tf_config)
    try:
        codec = None if makes_mwms else parse_compression(args.compression)
        if args.pull_compression != "none" and not makes_mwms:
            parse_compression(args.pull_compression)
    except ValueError as error:
        parser.error(str(error))
    if args.mqgrad is not None:
        from tfgc.codecs import Quantize

        try:
            parse_agent_arguments(args.mqgrad)
        except ValueError as error:
            parser.error(str(error))
        # Not AdaptiveQuantize, which picks its own bits (checked by the launcher).
        if codec is not None and type(codec) is not Quantize:
            parser.error("--mqgrad picks the bits of a Quantize codec: use --compression "
                         f"quantize, not {args.compression!r}")
    if args.local_steps < 1:
        parser.error("--local-steps must be positive")
    if args.steps_per_execution < 1:
        parser.error("--steps-per-execution must be positive")
    if args.steps_per_execution > 1 and args.strategy != "ps":
        # The per-step records (loss, bytes, time per step) of the other strategies are
        # written by batch callbacks, which would run once per execution.
        parser.error("--steps-per-execution > 1 is built for --strategy ps only")
    if args.local_steps > 1 and args.strategy == "ps" and args.pull_compression == "none":
        parser.error("--local-steps under --strategy ps trains each worker's copy of the "
                     "model, its caches of compressed pulls: give --pull-compression")
    if args.local_steps > 1 and args.strategy == "local" and args.pull_compression != "none":
        parser.error("--local-steps with --pull-compression in one process is not built "
                     "yet (it runs under --strategy ps)")
    if args.pull_compression != "none" and args.strategy == "mwms":
        parser.error("--pull-compression needs parameter servers (--strategy ps) or local")
    try:
        workload = workloads.for_model(args.model)
    except ValueError as error:
        parser.error(str(error))
    if workload is workloads.SparseWorkload and args.pull_compression != "none":
        parser.error("--pull-compression applies to the image models (a sparse model's "
                     "workers read only the rows of their batch)")
    if workload is workloads.SparseWorkload and args.optimizer is not None:
        parser.error("--optimizer applies to the image models (the sparse models train "
                     "with FastSGD's Adam)")
    args.dataset = args.dataset or workload.default_dataset
    fill_optimizer_defaults(args)
    if args.momentum is None:
        args.momentum = default_momentum(args.compression)
    if args.outer_optimizer is None:
        args.outer_optimizer = default_outer_optimizer(args.strategy)
    if args.recompute_statistics is None:
        args.recompute_statistics = 10 if args.local_steps > 1 else 0
    if args.recompute_statistics < 0:
        parser.error("--recompute-statistics must be >= 0")
    if args.eval_every < 0:
        parser.error("--eval-every must be >= 0")
    if args.name is None:
        dataset = os.path.basename(args.dataset.rpartition(":")[2])
        args.name = "-".join([args.model, dataset, args.compression.replace(":", "_")
                              .replace("=", "").replace(",", "_"), args.strategy])
    args.out = os.path.abspath(args.out or os.path.join("runs", args.name))
    if args.link and args.bandwidth:
        parser.error("--bandwidth R is --link R: give one of them")
    if (args.link or args.bandwidth) and args.strategy not in ("ps", "mwms"):
        parser.error("--link and --bandwidth apply to --strategy ps or mwms")
    if args.link or args.bandwidth:
        from tfgc.cluster import netem

        try:
            netem.parse_link(args.link or args.bandwidth)
        except ValueError as error:
            parser.error(str(error))
    if args.strategy != "local" and not args.tf_config and not args._worker:
        # This process starts a local cluster: keep it unreachable from other hosts. The
        # namespace reaches no package registry, so the data is fetched first.
        from tfgc import cluster

        if not cluster.in_private_network():
            data_lib.prefetch(args.dataset, getattr(args, "allow_substitute", False))
        cluster.isolate()
    # A SIGTERM becomes a normal exit, so clusters and workers are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.tf_config:
        if "TF_CONFIG" not in os.environ:
            parser.error("--tf-config needs the TF_CONFIG environment variable")
        if args.strategy == "local":
            parser.error("--tf-config applies to --strategy ps or mwms")
        if args.strategy == "mwms":
            args._worker = True
    if args.strategy == "ps" and not args.tf_config and not args._attempt:
        # Each attempt in a process of its own, so that one can resume after a dead task.
        return supervise.run_with_restarts(args.argv, args.out, args.max_restarts)
    try:
        if args.strategy == "mwms" and not args._worker:
            os.makedirs(args.out, exist_ok=True)
            summary = launch_workers(args, args.argv)
        else:
            try:
                summary = train(args)
            except supervise.TaskLost as lost:
                _log(f"{lost}; this attempt stops (its last backup is in "
                     f"{supervise.backup_dir(args.out)})")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(supervise.EXIT_TASK_LOST)
    except divergence.Diverged as diverged:
        history = os.path.join(args.out, "history.csv")
        _log(f"{diverged} (history up to there: {history})"
             if not args._worker and os.path.exists(history) else str(diverged))
        if args.strategy == "local" or (args.strategy == "mwms" and not args._worker):
            return divergence.EXIT_DIVERGED
        # A parameter-server attempt or an MWMS worker: leave without freeing cluster
        # functions whose servers are gone (see train()) or waiting on collectives.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(divergence.EXIT_DIVERGED)
    if not args._worker or summary.get("test_accuracy") is not None and args.tf_config:
        print(json.dumps({k: summary.get(k) for k in (
            "name", "dataset", "substitute_for", "test_accuracy", "step_time_s",
            "push_bytes_per_step", "payload_ratio", "socket_worker_to_ps_bytes_per_step",
            "socket_ps_to_worker_bytes_per_step", "socket_worker0_sent_bytes_per_step",
            "socket_worker0_received_bytes_per_step") if k in summary}))
    if _ACTIVE_CLUSTERS:
        # Every output is written. Stop the servers and leave without freeing the
        # cluster functions (see train()): a normal exit would log an error for each.
        sys.stdout.flush()
        sys.stderr.flush()
        for cluster in _ACTIVE_CLUSTERS:
            cluster.stop(remove_logs=True)
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
