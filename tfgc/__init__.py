"""tfgc: communication-efficient distributed training for TensorFlow.

Importing tfgc loads its op library (tfgc_ops), so any process that imports it, a
parameter server included, can run the decode ops.
"""
# First: in a `tfgc-server` process this takes its signals, checks its configuration and
# quiets TensorFlow's start-up log before TensorFlow loads; elsewhere it does nothing.
from tfgc import server as _server  # noqa: F401
import tfgc_ops  # noqa: F401  (loads the op library)
from tfgc import _moved, codecs
from tfgc._version import __version__ as __version__  # the one version source
from tfgc.local_steps import OuterSGD, recompute_statistics
from tfgc.memory import ErrorFeedback, ResidualFeedback
from tfgc.optimizer import (
    DistributedOptimizer, register_keras_optimizers, register_tf_keras_optimizers,
)
from tfgc.ps.moving_statistics import batch_norm_on_server
from tfgc.trainer import fit_across_workers, fit_on_parameter_servers
from tfgc.prebuild import build_for_fit
from tfgc.ps.pulls import compressed_pulls, get_variable
from tfgc.ps.servers import ParameterServers

_moved.install()  # the old paths of moved modules, for one release
# Saved models compiled with a DistributedOptimizer load wherever tfgc is imported.
register_tf_keras_optimizers()
register_keras_optimizers()

__all__ = [
    "callbacks", "codecs", "ErrorFeedback", "ResidualFeedback", "DistributedOptimizer",
    "ParameterServers", "get_variable", "compressed_pulls", "batch_norm_on_server", "recompute_statistics",
    "fit_on_parameter_servers", "fit_across_workers", "build_for_fit",
    "BoundedAdam", "CompressedEmbedding", "OuterSGD", "cluster", "mqgrad",
]


# Subpackages reachable as attributes of `tfgc`, imported on first use.
_SUBPACKAGES = ("cluster", "mqgrad")

# Imported on first use, because they need tf_keras, which Keras 3 users need not
# install: name -> (module, its attribute or None for the module itself, what it is).
_NEED_TF_KERAS = {
    "callbacks": ("tfgc.callbacks", None, "holds tf_keras callbacks"),
    "telemetry": ("tfgc.telemetry", None, "holds tf_keras callbacks (moved to tfgc.callbacks)"),
    "BoundedAdam": ("tfgc.optimizer.bounded_adam", "BoundedAdam", "is a tf_keras optimizer"),
    "CompressedEmbedding": ("tfgc.ps.lookups", "CompressedEmbedding", "is a tf_keras layer"),
}


def __getattr__(name):
    import importlib

    if name in _SUBPACKAGES:  # `import tfgc; tfgc.cluster.isolate()` as after `import tfgc.cluster`
        return importlib.import_module(f"tfgc.{name}")
    if name not in _NEED_TF_KERAS:
        raise AttributeError(f"module 'tfgc' has no attribute {name!r}")
    module, attribute, what = _NEED_TF_KERAS[name]
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"tfgc.{name} {what} and needs tf_keras "
            "(pip install 'tfgc[keras]', or the tf_keras of your TensorFlow's minor version)") from error
    return loaded if attribute is None else getattr(loaded, attribute)
