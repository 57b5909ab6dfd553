"""TensorFlow's "Parameter server training with ParameterServerStrategy" tutorial
(the custom training loop section: `ClusterCoordinator`), with tfgc's compressed pushes.

The lines that differ from the tutorial for tfgc are marked `# tfgc`: 4 for tfgc itself
(`import tfgc`, the tutorial's RMSprop wrapped in a `DistributedOptimizer` on two
lines, and the optimizer's byte counts returned for printing) and 4 for the cluster
(the tutorial's in-process cluster becomes `tfgc.cluster.LocalCluster`, real server
processes that import tfgc, after `isolate()`, and the traced functions are freed
before the servers stop). tfgc wraps tf_keras's current optimizers, so
`optimizers.legacy.RMSprop` is `optimizers.RMSprop` with the same arguments, and
`tf.keras` is tf_keras; the toy data stays the tutorial's. Not marked: the tutorial's
code runs in a function (so its traced functions can be freed), each epoch's losses
are kept to print their mean next to the tutorial's accuracy (2 lines), the socket
bytes are printed (3 lines), and `--fp32` runs the tutorial's optimizer as it is, for
comparison (1 line).

    python examples/parameter_server_custom_loop.py [--num-epochs 4] [--steps-per-epoch 5]
"""
import argparse
import gc
import os
import random

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras  # the tutorial's tf.keras

import tfgc  # tfgc
from tfgc import cluster  # tfgc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=3)
    parser.add_argument("--fp32", action="store_true",
                        help="the tutorial's optimizer as it is, uncompressed")
    args = parser.parse_args(argv)
    cluster.isolate()  # tfgc: the servers stay unreachable from other hosts

    NUM_WORKERS = args.num_workers
    NUM_PS = 2
    with cluster.LocalCluster(num_ps=NUM_PS, num_workers=NUM_WORKERS) as local:  # tfgc
        counted = tutorial(local.resolver, NUM_PS, args)
        # The tutorial's traced functions are freed now, while the servers still run
        # (TensorFlow unregisters them on every task, and logs an error per task once
        # the servers are gone).
        gc.collect()  # tfgc
        # What crossed the wire: the kernel's socket counters, and what the optimizer
        # counted (its fused messages, and the fp32 gradients they stand for).
        rows = local.settled_socket_bytes()
        print(f"steps {args.num_epochs * args.steps_per_epoch + 1}: sockets worker->ps "
              f"{local.traffic_between('worker', 'ps', rows=rows)} B{counted}")
    return 0


def tutorial(cluster_resolver, NUM_PS, args):  # the tutorial's name
    """The tutorial's custom training loop, from its strategy on.

    Returns:
      The optimizer's counted bytes as text for the summary line ("" with `--fp32`).
    """
    variable_partitioner = (
        tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=(256 << 10),
            max_shards=NUM_PS))

    strategy = tf.distribute.ParameterServerStrategy(
        cluster_resolver,
        variable_partitioner=variable_partitioner)

    feature_vocab = [
        "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
    ]
    label_vocab = ["yes", "no"]

    with strategy.scope():
        feature_lookup_layer = tf_keras.layers.StringLookup(
            vocabulary=feature_vocab,
            mask_token=None)
        label_lookup_layer = tf_keras.layers.StringLookup(
            vocabulary=label_vocab,
            num_oov_indices=0,
            mask_token=None)

        raw_feature_input = tf_keras.layers.Input(
            shape=(3,),
            dtype=tf.string,
            name="feature")
        feature_id_input = feature_lookup_layer(raw_feature_input)
        feature_preprocess_stage = tf_keras.Model(
            {"features": raw_feature_input},
            feature_id_input)

        raw_label_input = tf_keras.layers.Input(
            shape=(1,),
            dtype=tf.string,
            name="label")
        label_id_input = label_lookup_layer(raw_label_input)

        label_preprocess_stage = tf_keras.Model(
            {"label": raw_label_input},
            label_id_input)

    def feature_and_label_gen(num_examples=200):
        examples = {"features": [], "label": []}
        for _ in range(num_examples):
            features = random.sample(feature_vocab, 3)
            label = ["yes"] if "avenger" in features else ["no"]
            examples["features"].append(features)
            examples["label"].append(label)
        return examples

    examples = feature_and_label_gen()

    def dataset_fn(_):
        raw_dataset = tf.data.Dataset.from_tensor_slices(examples)

        train_dataset = raw_dataset.map(
            lambda x: (
                {"features": feature_preprocess_stage(x["features"])},
                label_preprocess_stage(x["label"])
            )).shuffle(200).batch(32).repeat()
        return train_dataset

    # These variables created under the `Strategy.scope` will be placed on parameter
    # servers in a round-robin fashion.
    with strategy.scope():
        # Create the model. The input needs to be compatible with Keras processing layers.
        model_input = tf_keras.layers.Input(
            shape=(3,), dtype=tf.int64, name="model_input")

        emb_layer = tf_keras.layers.Embedding(
            input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
        emb_output = tf.reduce_mean(emb_layer(model_input), axis=1)
        dense_output = tf_keras.layers.Dense(
            units=1, activation="sigmoid",
            kernel_regularizer=tf_keras.regularizers.L2(1e-4),
        )(emb_output)
        model = tf_keras.Model({"features": model_input}, dense_output)

        optimizer = tf_keras.optimizers.RMSprop(learning_rate=0.1)
        if not args.fp32:  # (the comparison run keeps the tutorial's optimizer)
            optimizer = tfgc.DistributedOptimizer(  # tfgc
                optimizer, compression=tfgc.codecs.ThreeLC(1.0))  # tfgc
        accuracy = tf_keras.metrics.Accuracy()

    assert len(emb_layer.weights) == 2
    assert emb_layer.weights[0].shape == (4, 16384)
    assert emb_layer.weights[1].shape == (4, 16384)

    print(emb_layer.weights[0].device)
    print(emb_layer.weights[1].device)

    @tf.function
    def step_fn(iterator):

        def replica_fn(batch_data, labels):
            with tf.GradientTape() as tape:
                pred = model(batch_data, training=True)
                per_example_loss = tf_keras.losses.BinaryCrossentropy(
                    reduction=tf_keras.losses.Reduction.NONE)(labels, pred)
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            gradients = tape.gradient(loss, model.trainable_variables)

            optimizer.apply_gradients(zip(gradients, model.trainable_variables))

            actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
            accuracy.update_state(labels, actual_pred)
            return loss

        batch_data, labels = next(iterator)
        losses = strategy.run(replica_fn, args=(batch_data, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    num_epochs = args.num_epochs
    steps_per_epoch = args.steps_per_epoch
    for i in range(num_epochs):
        accuracy.reset_states()
        losses = [coordinator.schedule(step_fn, args=(per_worker_iterator,))
                  for _ in range(steps_per_epoch)]
        # Wait at epoch boundaries.
        coordinator.join()
        print("Finished epoch %d, accuracy is %f, mean loss is %f." % (
            i, accuracy.result().numpy(), np.mean([loss.fetch() for loss in losses])))

    loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
    print("Final loss is %f" % loss.fetch())

    if args.fp32:
        return ""
    return "; counted pushes %d B for %d B of fp32 gradients" % tuple(  # tfgc
        int(optimizer.traffic[k]) for k in ("push_bytes", "push_dense_bytes"))


if __name__ == "__main__":
    raise SystemExit(main())
