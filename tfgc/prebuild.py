"""Building before `fit` what tf_keras builds inside the first trace of its step.

tf_keras makes the variables of the metrics given to `compile` (their `total` and
`count`), and of an optimizer not yet built, inside the first trace of the train step.
A `tf.function` whose first trace makes variables traces again without making them,
and under ParameterServerStrategy the coordinator sends every trace to every worker and
parameter server: ResNet-20's step with ThreeLC is a 0.74 MB function, sent twice to
each task before the first step ends. Built beforehand, they leave one trace to send.
"""
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import tensorflow as tf

from tfgc import _compat
from tfgc.distribute import is_parameter_server

if TYPE_CHECKING:
    import tf_keras


def build_for_fit(model: "tf_keras.Model",
                  labels: Union[tf.data.Dataset, tf.TensorSpec, Sequence[Any], Mapping[str, Any]]
                  ) -> None:
    """Builds a compiled model's metrics and optimizer, so that `fit` traces its step once.

    Call it after `compile` and before `fit`, in or out of the strategy's scope. It
    builds the optimizer for the model's trainable variables (first tracing, without
    running, the model's gradients, so that variables with sparse gradients, an
    embedding's, get no dense residual), and the metrics for one
    example of zeros (labels as `labels` describes, predictions shaped as the model's
    outputs), without updating them. What is built already is left as it is.

    The labels' shapes matter: tf_keras picks the function of "accuracy" (sparse,
    categorical or binary) from the shapes of the first labels and predictions it sees.

    Args:
      model: a compiled tf_keras model whose outputs are known: a functional model, or
        a Sequential one given its input shape.
      labels: what `fit` will get as labels: a `tf.data.Dataset` of (inputs, labels) or
        (inputs, labels, sample weights), or the labels' `tf.TensorSpec` (or a nested
        structure of them) with the batch dimension first.

    Raises:
      TypeError: `model` is not a tf_keras model, or `labels` is neither a dataset nor
        `tf.TensorSpec`s.
      ValueError: the model is not compiled, its outputs are unknown, or `labels` is a
        dataset whose elements are not (inputs, labels[, sample weights]).
    """
    import tf_keras  # only tf_keras models have this fit

    if not isinstance(model, tf_keras.Model):
        raise TypeError(f"build_for_fit takes a tf_keras model, got {type(model).__name__}")
    if getattr(model, "optimizer", None) is None:
        raise ValueError("build_for_fit needs a compiled model: call model.compile(...) "
                         "first")
    label_specs, output_specs = _label_specs(labels), _output_specs(model)
    with model.distribute_strategy.scope():
        _note_sparse_gradients(model)
        # A tf_keras optimizer builds once (every step asks it to).
        model.optimizer.build(model.trainable_variables)
        _compat.tf_keras_build_compiled_metrics(
            model, tf.nest.map_structure(_one_example, label_specs),
            tf.nest.map_structure(_one_example, output_specs))


def _note_sparse_gradients(model):
    """Tells the model's tfgc optimizer (if any, and not built) which variables have
    sparse gradients, from a trace of the gradients of its outputs' sum (never run)."""
    from tfgc.optimizer.base import compressing_optimizer  # noqa: PLC0415 (a cycle)

    optimizer = compressing_optimizer(model.optimizer)
    if optimizer is None or optimizer.built_compression:
        return
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in model.inputs]

    def gradients(*inputs):
        with tf.GradientTape() as tape:
            outputs = model(list(inputs) if len(inputs) > 1 else inputs[0], training=True)
            total = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32))
                              for o in tf.nest.flatten(outputs)])
        return tape.gradient(total, model.trainable_variables)

    strategy = model.distribute_strategy
    if not is_parameter_server(strategy) and strategy.num_replicas_in_sync > 1:
        # Mirrored variables are read in a replica: one replica's gradients tell.
        def replica_gradients(*inputs):
            return strategy.experimental_local_results(
                strategy.run(gradients, args=inputs))[0]
    else:
        replica_gradients = gradients
    traced = tf.function(replica_gradients, autograph=False).get_concrete_function(*specs)
    optimizer.encoder.note_gradients(
        zip(traced.structured_outputs, model.trainable_variables))


def _label_specs(labels):
    if isinstance(labels, tf.data.Dataset):
        element = labels.element_spec
        if not isinstance(element, tuple) or len(element) not in (2, 3):
            raise ValueError(
                "build_for_fit reads the labels of a dataset of (inputs, labels) "
                f"or (inputs, labels, sample weights); its elements are {element}")
        labels = element[1]
    for spec in tf.nest.flatten(labels):
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError("labels must be a tf.data.Dataset or tf.TensorSpecs of the "
                            f"labels, got {type(spec).__name__}")
    return labels


def _output_specs(model):
    outputs = getattr(model, "outputs", None)
    if not outputs:
        raise ValueError(
            f"build_for_fit needs {model.name}'s outputs, which only functional "
            "models and Sequential models given their input shape have")
    specs = [tf.TensorSpec(output.shape, output.dtype) for output in outputs]
    return specs[0] if len(specs) == 1 else specs


def _one_example(spec):
    """Zeros of `spec` with a batch of one."""
    if spec.shape.rank is None or spec.shape.rank == 0:
        raise ValueError(f"a batch of labels or predictions has a batch dimension first; "
                         f"got shape {spec.shape}")
    shape = [1] + [1 if d is None else d for d in spec.shape.as_list()[1:]]
    return tf.zeros(shape, spec.dtype)
