"""What `import tfgc` changes in a Keras model compiled with a tfgc optimizer.

Keras gives an optimizer no say in how its model's train step is built, so `import
tfgc` wraps `Model.compile` (tf_keras's `Model`, Keras 3's `Trainer`) once, and after
the model's own `compile` the wrapper hands the model to each adapter: XLA turned off
where the optimizer's step cannot run under it (`tfgc.optimizer.xla`); with tf_keras
under ParameterServerStrategy, steps that `fit` schedules and counts without waiting on
a parameter server, and metrics it resets and reads in one call each
(`tfgc.optimizer.tfkeras.schedule_steps_without_waiting`). An
adapter does nothing to a model whose optimizer is not tfgc's.
"""
import functools
from typing import Any, Callable

_WRAPPED = "_tfgc_adapts_compiled_models"


def adapt_after_compile(model_class: type[Any], *adapters: Callable[[Any], None]) -> None:
    """Wraps `model_class.compile` (once) so that each of `adapters` gets the model after
    its `compile`."""
    compile_method = model_class.compile
    if getattr(compile_method, _WRAPPED, False):
        return

    @functools.wraps(compile_method)
    def compile(self, *args, **kwargs):
        compile_method(self, *args, **kwargs)
        for adapt in adapters:
            adapt(self)

    setattr(compile, _WRAPPED, True)
    model_class.compile = compile
