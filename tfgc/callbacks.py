"""Keras callbacks of tfgc."""
from tfgc.telemetry import TrafficLogger

__all__ = ["TrafficLogger"]
