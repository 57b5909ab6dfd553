"""Keras (tf_keras) callbacks of tfgc; imported on first use, as they need tf_keras."""
from tfgc.mqgrad.callback import MQGrad
from tfgc.telemetry import TrafficLogger

__all__ = ["MQGrad", "TrafficLogger"]
