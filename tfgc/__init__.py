"""tfgc: communication-efficient distributed training for TensorFlow.

Importing tfgc loads its op library (tfgc_ops), so any process that imports it, a
parameter server included, can run the decode ops.
"""
import tfgc_ops  # noqa: F401  (loads the op library)
from tfgc import codecs
from tfgc.memory import ErrorFeedback
from tfgc.optimizer import (
    DistributedOptimizer, register_keras_optimizers, register_tf_keras_optimizers,
)
from tfgc.trainer import fit_on_parameter_servers
from tfgc.variables import compressed_pulls, get_variable

# Saved models compiled with a DistributedOptimizer load wherever tfgc is imported.
register_tf_keras_optimizers()
register_keras_optimizers()

__version__ = "0.1.0"
__all__ = [
    "callbacks", "codecs", "ErrorFeedback", "DistributedOptimizer", "get_variable",
    "compressed_pulls", "fit_on_parameter_servers", "BoundedAdam",
]


def __getattr__(name):
    # Imported on first use: the callbacks (and telemetry) and BoundedAdam need tf_keras,
    # which Keras 3 users need not install.
    import importlib

    if name == "mqgrad":
        return importlib.import_module("tfgc.mqgrad")
    if name == "BoundedAdam":
        try:
            return importlib.import_module("tfgc.optimizer.bounded_adam").BoundedAdam
        except ImportError as error:
            raise ImportError(
                "tfgc.BoundedAdam is a tf_keras optimizer and needs tf_keras "
                "(pip install 'tfgc[keras]', or tf_keras==2.21.*)") from error
    if name in ("callbacks", "telemetry"):
        try:
            return importlib.import_module(f"tfgc.{name}")
        except ImportError as error:
            raise ImportError(
                f"tfgc.{name} holds tf_keras callbacks and needs tf_keras "
                "(pip install 'tfgc[keras]', or tf_keras==2.21.*)") from error
    raise AttributeError(f"module 'tfgc' has no attribute {name!r}")
