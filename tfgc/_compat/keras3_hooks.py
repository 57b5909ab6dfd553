"""tfgc._compat's Keras 3 hooks (TensorFlow backend), probed at their first use (Keras 3
is optional)."""
from tfgc._compat._registry import _hook, _internal, _method, _module, missing

# --- Keras 3 (probed at first use) -----------------------------------------------------

# The name of the Keras 3 TensorFlow-backend optimizer method that sums gradients across
# replicas (tfgc's Keras 3 optimizer overrides it); `keras3_tf_optimizer`'s probe checks it.
KERAS3_ALL_REDUCE_SUM_GRADIENTS = "_all_reduce_sum_gradients"


@_hook("keras3_tf_optimizer", "keras",
       "keras.src.backend.tensorflow.optimizer.TFOptimizer with _all_reduce_sum_gradients, "
       "_backend_update_step and _distributed_tf_update_step, "
       "and keras.src.optimizers.base_optimizer.BaseOptimizer's _get_variable_index, "
       "_trainable_variables and _iterations")
def _probe_keras3_tf_optimizer():
    optimizer = _module("keras.src.backend.tensorflow.optimizer").TFOptimizer
    _method(optimizer, KERAS3_ALL_REDUCE_SUM_GRADIENTS)
    # tfgc's Keras 3 optimizer also overrides `_backend_update_step` (the sum, then the
    # update unless a gradient arrived non-finite), which calls the other.
    _method(optimizer, "_backend_update_step")
    _method(optimizer, "_distributed_tf_update_step")
    _method(optimizer, "_get_variable_index")
    return optimizer


def keras3_tf_optimizer():
    """The base class of Keras 3's TensorFlow-backend optimizers.

    Relies on `keras.src.backend.tensorflow.optimizer.TFOptimizer`.

    Raises:
      UnsupportedInternalsError: Keras 3 without it, or without
        `KERAS3_ALL_REDUCE_SUM_GRADIENTS`.
      ImportError: Keras 3 is not installed.
    """
    import keras  # noqa: F401, PLC0415  (not installed: ImportError, not a version error)

    return _internal("keras3_tf_optimizer")


def keras3_update_step(optimizer, grads_and_vars, learning_rate):
    """Updates `optimizer`'s variables with (gradient, variable) pairs already summed
    across replicas, from replica context, as Keras 3's `_backend_update_step` does
    after its sum.

    Relies on `TFOptimizer._distributed_tf_update_step` and the optimizer's
    `_distribution_strategy`.
    """
    from tfgc._compat.tensorflow_hooks import maybe_merge_call  # noqa: PLC0415

    _internal("keras3_tf_optimizer")
    return maybe_merge_call(
        optimizer._distributed_tf_update_step,  # noqa: SLF001
        optimizer._distribution_strategy,  # noqa: SLF001
        grads_and_vars, learning_rate)


def keras3_variable_index(optimizer, variable):
    """`variable`'s position in a built Keras 3 optimizer.

    Relies on `BaseOptimizer._get_variable_index`.

    Raises:
      KeyError: the optimizer was not built for `variable`.
    """
    _internal("keras3_tf_optimizer")
    return optimizer._get_variable_index(variable)  # noqa: SLF001


def keras3_iterations_variable(optimizer):
    """The Keras 3 variable that counts an optimizer's applied steps (its public
    `iterations` divides it by `gradient_accumulation_steps` where that is set).

    Relies on `BaseOptimizer._iterations`.
    """
    _internal("keras3_tf_optimizer")
    try:
        return optimizer._iterations  # noqa: SLF001
    except AttributeError as error:
        raise missing("keras3_tf_optimizer", str(error)) from error


def keras3_num_variables(optimizer):
    """How many trainable variables a Keras 3 optimizer was built for.

    Relies on `BaseOptimizer._trainable_variables`.
    """
    _internal("keras3_tf_optimizer")
    return len(getattr(optimizer, "_trainable_variables", []))


@_hook("keras3_trainer", "keras",
       "keras.src.trainers.trainer.Trainer with compile (compile_from_config compares a "
       "model's compile with it)")
def _probe_keras3_trainer():
    trainer = _module("keras.src.trainers.trainer").Trainer
    _method(trainer, "compile")
    _method(trainer, "compile_from_config")
    return trainer


def keras3_trainer():
    """The class that defines Keras 3 models' `compile`: a wrapper of `compile` goes on
    it, not on `keras.Model`, whose `compile_from_config` skips a model whose class's
    `compile` is not this class's.

    Relies on `keras.src.trainers.trainer.Trainer`.
    """
    return _internal("keras3_trainer")
