"""Is a model's test accuracy held back by its batch-norm moving statistics?

Runs `models.train` in this process with the arguments given (its `--_attempt` form:
no supervisor, so the model stays here) and, after each `evaluate` it makes, evaluates
the same weights again with batch statistics (the layers in training mode, on the
first test batches), which needs no moving statistics. A large gap says the weights
are fine and the statistics do not fit them: under local steps the servers' statistics
come from the workers' copies, which drift from the masters they are averaged into.

    python -m tfgc.cluster.private python -m benchmarks.batch_norm_check --strategy ps \\
        --ps 1 --workers 2 --model resnet20 --dataset cifar10 --allow-substitute \\
        --steps 160 --local-steps 16 --outer-optimizer average ...

Batch statistics of test batches are not a way to evaluate a model (they see the test
data's statistics); they only tell the weights apart from the statistics. Keras updates
the moving statistics in those calls, so the check comes after the run's own evaluation.
"""
import sys

import numpy as np
import tf_keras

from models import train

BATCHES = 4


def _with_batch_statistics(model, dataset):
    """(accuracy, examples) of `model` on the first batches of `dataset`, its batch
    norms in training mode (eager, on the coordinator: nothing is trained)."""
    correct = total = 0
    for images, labels in dataset.take(BATCHES):
        predicted = np.argmax(model(images, training=True).numpy(), axis=-1)
        correct += int(np.sum(predicted == labels.numpy().reshape(-1)))
        total += int(labels.shape[0])
    return correct / total, total


def main(argv):
    evaluate = tf_keras.Model.evaluate

    def evaluate_twice(model, x=None, *args, **kwargs):
        result = evaluate(model, x, *args, **kwargs)
        accuracy, examples = _with_batch_statistics(model, x)
        print(f"[batch_norm_check] moving statistics: {result}; batch statistics: "
              f"accuracy {accuracy:.4f} on {examples} test examples", flush=True)
        return result

    tf_keras.Model.evaluate = evaluate_twice
    train.main(["--_attempt", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
