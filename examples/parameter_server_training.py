"""TensorFlow's "Parameter server training with ParameterServerStrategy" tutorial
(the Keras `Model.fit` section), with tfgc's compressed pushes and pulls.

The lines that differ from the tutorial are marked `# tfgc`. The tutorial's in-process
cluster becomes `tfgc.cluster.LocalCluster` (real server processes that import tfgc),
its random data stays random data (as in the tutorial), and `tf.keras` is tf_keras
(TensorFlow 2.16+ ships Keras 3, which has no ParameterServerStrategy `fit`).

    python examples/parameter_server_training.py [--epochs 5] [--steps-per-epoch 20]
"""
import argparse
import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import tf_keras as keras  # the tutorial's tf.keras

import tfgc  # tfgc
from tfgc import cluster  # tfgc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    args = parser.parse_args(argv)
    cluster.isolate()  # tfgc: the servers stay unreachable from other hosts

    NUM_WORKERS, NUM_PS = 2, 2
    with cluster.LocalCluster(num_ps=NUM_PS, num_workers=NUM_WORKERS) as local:  # tfgc
        variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=(256 << 10), max_shards=NUM_PS)
        strategy = tf.distribute.ParameterServerStrategy(
            local.resolver, variable_partitioner=variable_partitioner)

        global_batch_size = 64
        x = tf.random.uniform((10, 10))
        y = tf.random.uniform((10,))
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
        dataset = dataset.batch(global_batch_size).prefetch(2)

        servers = tfgc.ParameterServers(tfgc.codecs.ThreeLC(1.0), min_elements=1)  # tfgc
        with strategy.scope():
            with servers.scope():  # tfgc: workers pull compressed model deltas
                model = keras.models.Sequential([keras.layers.Dense(10)])
                model.build((None, 10))  # tfgc: the weights, made in this scope
            optimizer = tfgc.DistributedOptimizer(  # tfgc
                keras.optimizers.SGD(learning_rate=0.1),
                compression=tfgc.codecs.ThreeLC(1.0), parameter_servers=servers,
                min_elements=1)  # tfgc: this toy model's tensors are tiny
            model.compile(optimizer, loss="mse", steps_per_execution=10)
        tfgc.build_for_fit(model, dataset)  # tfgc: fit traces its step once, and sends it once

        working_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), "my_working_dir")
        log_dir = os.path.join(working_dir, "log")
        ckpt_filepath = os.path.join(working_dir, "ckpt")
        backup_dir = os.path.join(working_dir, "backup")
        callbacks = [
            keras.callbacks.TensorBoard(log_dir=log_dir),
            keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
            keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
        ]
        history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                            callbacks=[tfgc.callbacks.TrafficLogger(), *callbacks])  # tfgc
        last = {k: v[-1] for k, v in history.history.items()}
        print(f"final loss {last['loss']:.4f}; per step pushed {last['push_bytes']:.0f} B "
              f"for {last['push_dense_bytes']:.0f} B of fp32 gradients, pulled "
              f"{last['pull_bytes']:.0f} B for {last['pull_dense_bytes']:.0f} B")
        print(f"sockets: worker->ps {local.traffic_between('worker', 'ps'):,} B, "
              f"ps->worker {local.traffic_between('ps', 'worker'):,} B")
        # Free the traced functions while the servers still run (TensorFlow unregisters
        # them on every task, and logs an error per task once the servers are gone).
        del model, history, callbacks, optimizer, dataset, strategy
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
