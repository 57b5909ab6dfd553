"""Wires: how one step's gradients get from where they are computed to where they are
applied, compressed on the way.

A wire is chosen once per `apply_gradients` from the strategy in scope and sends all
gradients of the step at once. It asks the optimizer that owns it (the `sender`) for
three things: `wire_payload(gradient, variable)` encodes a gradient (with error
feedback), `wire_codec(variable)` is the codec that decodes it, and
`compresses(variable)` says whether the main codec handles it.
"""
import abc
import contextlib

import tensorflow as tf

from tfgc.codecs import base
from tfgc.distribute import all_gather_padded, dense_nbytes, is_parameter_server
from tfgc.wire.message import Layout


class Wire(abc.ABC):
    """Sends one step's gradients; see the module doc.

    Args:
      sender: the optimizer whose gradients are sent.
    """

    def __init__(self, sender):
        self.sender = sender

    @abc.abstractmethod
    def send(self, grads_and_vars):
        """Returns ([(gradient as received, variable)], [(variable, payload bytes)])
        for one step's (gradient, variable) pairs; None gradients pass through."""


class _FusedWire(Wire):
    """Sends the gradients bound for each destination as one fused message."""

    def _destination(self, variable):
        """A device to decode `variable`'s gradient on, or None for here."""
        del variable
        return None

    def send(self, grads_and_vars):
        groups = {}
        for position, (gradient, variable) in enumerate(grads_and_vars):
            if gradient is not None:
                groups.setdefault(self._destination(variable), []).append(position)
        received = [gradient for gradient, _ in grads_and_vars]
        sent = []
        for destination, positions in groups.items():
            pairs = [grads_and_vars[p] for p in positions]
            decoded, nbytes = self._send_message(destination, pairs)
            for position, gradient, count in zip(positions, decoded, nbytes):
                received[position] = gradient
                sent.append((grads_and_vars[position][1], count))
        return list(zip(received, (v for _, v in grads_and_vars))), sent

    def _send_message(self, destination, pairs):
        payloads = [self.sender.wire_payload(g, v) for g, v in pairs]
        layout, message = Layout.pack(payloads)
        nbytes = layout.payload_nbytes(payloads)
        place = contextlib.nullcontext() if destination is None else tf.device(destination)
        with place:
            unpacked = layout.unpack(message, name=f"fused message for {destination or 'here'}")
            decoded = [self.sender.wire_codec(v).decode(p) for p, (_, v) in zip(unpacked, pairs)]
        return decoded, nbytes


class LocalWire(_FusedWire):
    """Encodes and decodes in this process, through one fused message per step."""


class ParameterServerPush(_FusedWire):
    """One fused message per parameter-server task and step, unpacked and decoded on
    that task: its graph partition receives the message and nothing else."""

    def _destination(self, variable):
        return variable.device


class AllReduceWire(Wire):
    """Mirrored / MultiWorkerMirroredStrategy: a summable codec's floating payload
    tensors are all-reduced in the compressed domain and decoded once; other codecs'
    payloads are all-gathered (padded to the longest) and every replica decodes and
    sums all of them. A codec with its own `all_reduce` does the whole aggregation.
    Gradients below `min_elements` are all-reduced as they are."""

    def send(self, grads_and_vars):
        context = tf.distribute.get_replica_context()
        pairs, sent = [], []
        for gradient, variable in grads_and_vars:
            if gradient is not None:
                gradient, nbytes = self._send_one(context, gradient, variable)
                sent.append((variable, nbytes))
            pairs.append((gradient, variable))
        return pairs, sent

    def _send_one(self, context, gradient, variable):
        if not self.sender.compresses(variable):
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, gradient)
            return summed, dense_nbytes(variable)
        codec = self.sender.wire_codec(variable)
        if codec.owns_all_reduce:
            return codec.all_reduce(tf.convert_to_tensor(gradient), context)
        payload = self.sender.wire_payload(gradient, variable)
        nbytes = base.payload_nbytes(payload)
        if codec.summable:
            summed = {
                k: context.all_reduce(tf.distribute.ReduceOp.SUM, t) if t.dtype.is_floating else t
                for k, t in payload.items()
            }
            return codec.decode(summed), nbytes
        gathered = [all_gather_padded(context, t) for t in payload.values()]
        total = None
        for replica in range(context.num_replicas_in_sync):
            decoded = codec.decode({k: pieces[replica] for k, pieces in zip(payload, gathered)})
            total = decoded if total is None else total + decoded
        return total, nbytes


def choose_wire(sender, strategy, aggregate):
    """The wire for `strategy`: PS push, all-reduce (when gradients are to be
    aggregated across replicas) or local."""
    if is_parameter_server(strategy):
        return ParameterServerPush(sender)
    if strategy.num_replicas_in_sync > 1 and aggregate:
        return AllReduceWire(sender)
    return LocalWire(sender)
