"""DistributedOptimizer for Keras 3 optimizers (TensorFlow backend).

Keras 3 sums gradients across replicas in one private method,
`TFOptimizer._all_reduce_sum_gradients` (keras/src/backend/tensorflow/optimizer.py);
the subclass made here overrides it, the narrowest hook there is, so every other step
of `apply` (loss scaling, gradient accumulation, EMA, constraints, `iterations`) stays
Keras's own. Being private, the hook is checked when an optimizer is wrapped; the
keras versions it was verified with are pinned in the `keras` extra (pyproject.toml).

Supported: single-process use (encode and decode locally), all-reduce strategies
(Mirrored, MultiWorkerMirrored) and compressed pushes under ParameterServerStrategy,
which has no Keras 3 `fit` (keras-team/keras#18624): `tfgc.fit_on_parameter_servers`
trains there. Compressed pulls need tf_keras.
"""
from typing import Any

import tensorflow as tf

from tfgc import _compat
from tfgc.distribute import is_parameter_server
from tfgc.optimizer import compiled, finite_steps, xla
from tfgc.optimizer.base import CompressingBase, compressing_subclass

HOOK = _compat.KERAS3_ALL_REDUCE_SUM_GRADIENTS
_LOADING_NOTE = "to_load"
_CLASSES: dict = {}


def keras3_distributed_class(optimizer_class: type[Any]) -> type[Any]:
    """The compressing subclass of a Keras 3 optimizer class (made once per class)."""
    try:
        tf_optimizer = _compat.keras3_tf_optimizer()
    except _compat.UnsupportedInternalsError as error:
        raise NotImplementedError(
            f"{optimizer_class.__name__}: {error}; or use tf_keras") from error
    if not issubclass(optimizer_class, tf_optimizer):
        raise NotImplementedError(
            f"{optimizer_class.__name__} is not a Keras 3 optimizer of the TensorFlow "
            f"backend with `{HOOK}`; set KERAS_BACKEND=tensorflow and use a keras version "
            "from tfgc's `keras` extra, or use tf_keras"
        )
    import keras  # noqa: PLC0415

    return compressing_subclass(_Keras3Mixin, optimizer_class, _CLASSES,
                                keras.saving.register_keras_serializable)


def register_keras_optimizers() -> None:
    """Makes every Keras 3 built-in optimizer's compressing class known to Keras's
    deserialization (`keras.saving.load_model`), and keeps models whose tfgc optimizer
    XLA cannot compile out of XLA (`tfgc.optimizer.compiled`); `import tfgc` calls
    it. A no-op without Keras 3 or with another backend."""
    try:
        import keras  # noqa: PLC0415

        tf_optimizer = _compat.keras3_tf_optimizer()
        trainer = _compat.keras3_trainer()
    except (ImportError, _compat.UnsupportedInternalsError):
        return
    compiled.adapt_after_compile(trainer, xla.turn_xla_off_for_tfgc)
    for value in vars(keras.optimizers).values():
        if (isinstance(value, type) and issubclass(value, tf_optimizer)
                and value.__name__ in vars(keras.optimizers)):
            keras3_distributed_class(value)


class _Keras3Mixin(CompressingBase):
    """Keras 3: overrides `build` (codecs, buffers) and the replicas' gradient sum."""

    def __init__(self, *args, pull_compression=None, **kwargs):
        kwargs.pop(_LOADING_NOTE, None)
        servers = kwargs.get("parameter_servers")
        # Anything but a ParameterServers is refused with a TypeError by the base class.
        if pull_compression is not None or getattr(servers, "pull_codecs", None) is not None:
            raise NotImplementedError(
                "pull_compression with Keras 3: compressed pulls wrap the tf.Variables a "
                "model creates under tfgc.compressed_pulls(), and Keras 3 variables are "
                "not made that way; use a tf_keras optimizer and model for pulls")
        super().__init__(*args, **kwargs)

    def __repr__(self):
        # What tf_keras prints when a tf_keras model is compiled with this optimizer.
        inner = next(c for c in type(self).__mro__ if not c.__module__.startswith("tfgc"))
        return (f"<tfgc {type(self).__name__}, a Keras 3 optimizer: compile a Keras 3 model "
                f"with it; for a tf_keras model wrap tf_keras.optimizers.{inner.__name__}(...)>")

    def get_config(self):
        config = self._compression_config(super().get_config())
        # Keras 3 imports no module outside Keras to find a saved class: its error in a
        # process without tfgc prints the config, this note first, in the error's one
        # line and before the rest of the config.
        return {_LOADING_NOTE: "import tfgc before keras.saving.load_model", **config}

    def _variable_index(self, variable):
        try:
            return _compat.keras3_variable_index(self, variable)
        except KeyError:
            raise self._unknown_variable(
                variable, _compat.keras3_num_variables(self)) from None

    def build(self, variables):
        super().build(variables)
        # Keras variables wrap tf.Variables; the hook receives the latter.
        with tf.init_scope():
            self._build_compression([getattr(v, "value", v) for v in variables])
            if is_parameter_server(tf.distribute.get_strategy()):
                _count_steps_atomically(_compat.keras3_iterations_variable(self))

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is not None:  # before `build` makes residuals
            self.encoder.note_gradients(zip(grads, trainable_variables))
        return super().apply(grads, trainable_variables)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # Under parameter servers: one worker's own gradients, pushed compressed.
        return self._send_all(tf.distribute.get_strategy(), grads_and_vars, aggregate=True)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Keras's (keras/src/backend/tensorflow/optimizer.py), with the gradient sum
        # replaced as `_all_reduce_sum_gradients` replaces it, and the update skipped
        # when a gradient arrives non-finite (tfgc.optimizer.finite_steps); Keras's
        # `apply` counts the step either way.
        import keras  # noqa: PLC0415

        variables = [v.value if isinstance(v, keras.Variable) else v
                     for v in trainable_variables]
        strategy = tf.distribute.get_strategy()
        pairs, finite = finite_steps.send_checked(
            self, strategy, list(zip(grads, variables)), aggregate=True)
        variables = [v for _, v in pairs]

        def update(received):
            _compat.keras3_update_step(self, list(zip(received, variables)), learning_rate)

        finite_steps.apply_unless_not_finite(finite, [g for g, _ in pairs], update,
                                             lambda: None)


def _count_steps_atomically(iterations):
    """Makes `iterations.assign_add` one atomic update of its tf.Variable.

    Keras 3 adds to a variable by reading it and assigning the sum; the workers of a
    parameter-server cluster step concurrently, so steps went uncounted (35 of 45 with
    two workers), and the per-step traffic figures with them.
    """
    variable = iterations.value
    iterations.assign_add = lambda value: variable.assign_add(tf.cast(value, variable.dtype))
