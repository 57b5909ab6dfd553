"""Moved to `tfgc.optimizer.keras3`; this name stays for code that imports it."""
from tfgc.optimizer.keras3 import HOOK, keras3_distributed_class, register_keras_optimizers

__all__ = ["HOOK", "keras3_distributed_class", "register_keras_optimizers"]
