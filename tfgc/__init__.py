"""tfgc: communication-efficient distributed training for TensorFlow.

Importing tfgc loads its op library (tfgc_ops), so any process that imports it, a
parameter server included, can run the decode ops.
"""
import tfgc_ops  # noqa: F401  (loads the op library)
from tfgc import callbacks, codecs
from tfgc.memory import ErrorFeedback
from tfgc.optimizer import DistributedOptimizer
from tfgc.variables import compressed_pulls, get_variable

__version__ = "0.1.0"
__all__ = [
    "callbacks", "codecs", "ErrorFeedback", "DistributedOptimizer", "get_variable",
    "compressed_pulls",
]
