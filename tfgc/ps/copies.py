"""Tensors that have an identical copy on another task, so that a wire need not send them.

A layer that sends a tensor to a parameter server and rebuilds it there (the distinct
ids of a sparse read, packed on the worker and unpacked on the server) notes the pair
with `note_copy`. A fused wire whose gradient's indices are such a tensor, bound for the
task that holds the copy, then sends the gradient's rows alone and decodes them against
the copy (`tfgc.codecs.base.SendsValuesAlone`): the indices cross once per step, not twice.
"""
import weakref
from typing import Optional

import tensorflow as tf

_copies: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()  # graph -> {tensor's ref: its copy}


def note_copy(tensor: tf.Tensor, copy: tf.Tensor) -> None:
    """Records that `copy` (computed on another device) holds `tensor`'s values.

    Only traced tensors are recorded (an eager step has no wire to spare a send).
    """
    graph = getattr(tensor, "graph", None)
    if graph is not None and not tf.executing_eagerly():
        _copies.setdefault(graph, {})[tensor.ref()] = copy


def copy_on(tensor: tf.Tensor, device: str) -> Optional[tf.Tensor]:
    """`tensor`'s recorded copy if it was computed on `device`'s task, else None."""
    graph = getattr(tensor, "graph", None)
    copy = _copies.get(graph, {}).get(tensor.ref()) if graph is not None else None
    if copy is None or not _same_task(copy.device, device):
        return None
    return copy


def _same_task(a, b):
    a, b = _task(a), _task(b)
    return a[0] is not None and a == b


def _task(device):
    """(job, replica, task) of a device string; replica and task default to 0."""
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.job, spec.replica or 0, spec.task or 0
