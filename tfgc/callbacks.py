"""Keras callbacks of tfgc."""
from tfgc.mqgrad import MQGrad
from tfgc.telemetry import TrafficLogger

__all__ = ["MQGrad", "TrafficLogger"]
