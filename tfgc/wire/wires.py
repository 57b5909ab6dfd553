"""Wires: how one step's gradients get from where they are computed to where they are
applied, compressed on the way.

A wire is chosen once per `apply_gradients` from the strategy in scope and sends all
gradients of the step at once, encoded by the optimizer's `Encoder`
(tfgc.wire.encoder): `payload(gradient, variable)` encodes a gradient (with error
feedback), `codec(variable)` is the codec that decodes it, and `compresses(variable)`
says whether the main codec handles it. Fused wires also ask `batch_key(variable)`:
gradients with one key (a batched codec's, `Codec.batched`) are encoded together into
one payload by `batch_payload(pairs)`, and, for `tf.IndexedSlices` whose indices the
destination already holds (`tfgc.ps.copies`), `values_alone(gradient, variable)`:
whether `values_payload` may send its rows without them. A parameter server's message
also carries the step's other updates for it (`tfgc.ps.riders`). Every wire returns
what it sent; the optimizer counts it.
"""
import abc
import contextlib
import hashlib
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union

import tensorflow as tf

from tfgc.codecs import base
from tfgc.distribute import all_gather_padded, dense_nbytes, is_parameter_server
from tfgc.codecs.rows import distinct_rows, plain_nbytes
from tfgc.traffic import NotAVariable, Sent
from tfgc.ps import riders
from tfgc.ps.copies import copy_on
from tfgc.wire.message import Layout, payload_units, shares_by_position, spread

if TYPE_CHECKING:
    from tfgc.wire.encoder import Encoder

# A step's (gradient, variable) pair, and what a wire says it sent of one (see `Wire.send`).
_Pair = tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]
_Counted = Union[Sent, tuple[NotAVariable, tf.Tensor]]


class Wire(abc.ABC):
    """Sends one step's gradients; see the module doc.

    Args:
      encoder: the `tfgc.wire.encoder.Encoder` of the optimizer whose gradients are sent.
    """

    def __init__(self, encoder: "Encoder") -> None:
        self.encoder = encoder

    @abc.abstractmethod
    def send(self, grads_and_vars: Sequence[_Pair]) -> tuple[list[_Pair], list[_Counted]]:
        """Returns ([(gradient as received, variable)], what was sent: a `Sent` per
        gradient and (`NotAVariable`, bytes) per rider) for one step's (gradient,
        variable) pairs; None gradients pass through."""


class _FusedWire(Wire):
    """Sends the gradients bound for each destination as one fused message."""

    def _destination(self, variable):
        """A device to decode `variable`'s gradient on, or None for here."""
        del variable
        return None

    def send(self, grads_and_vars):
        return self.receive(self.pack(grads_and_vars))

    def pack(self, grads_and_vars, riders_too=True, carried=None):
        """The first half of `send`, made here: every destination's message, encoded.

        Args:
          grads_and_vars: one step's (gradient, variable) pairs.
          riders_too: whether the messages carry the step's riders; False where the
            second half may not run (a branch), so that they go alone.
          carried: {destination: [riders]} that the messages carry as well (riders
            folded over local steps); each destination must have a gradient.

        Returns:
          What `receive` takes.

        Raises:
          ValueError: a destination of `carried` has no gradient to travel with.
        """
        groups = {}
        for position, (gradient, variable) in enumerate(grads_and_vars):
            if gradient is not None:
                groups.setdefault(self._destination(variable), []).append(position)
        carried = dict(carried or {})
        if set(carried) - set(groups):
            raise ValueError(f"riders for {sorted(set(carried) - set(groups))}, where this "
                             "step sends no message")
        messages = []
        for destination, positions in groups.items():
            pairs = [grads_and_vars[p] for p in positions]
            # The step's other updates for this server travel in its message too.
            taken = ([] if destination is None or not riders_too
                     else riders.take(destination))
            taken += carried.get(destination, [])
            units = self._units(pairs)
            # Rows whose indices the destination holds already travel without them.
            held = [self._held_indices(destination, *pairs[unit[0]]) if len(unit) == 1
                    else None for unit in units]
            small = self.encoder.small_compression
            payloads = [self._encode([pairs[i] for i in unit], indices)
                        for unit, indices in zip(units, held)]
            layout, message = Layout.pack(
                payloads + [rider.payload(small) for rider in taken])
            messages.append(_Message(destination, positions, taken, units, held, layout,
                                     message, payloads))
        return grads_and_vars, messages

    @staticmethod
    def payload_tensors(packed):
        """Every tensor of the payloads in `pack`'s result, as encoded here."""
        return [tensor for message in packed[1]
                for tensor in tf.nest.flatten(message.payloads, expand_composites=True)]

    def receive(self, packed):
        """The second half of `send`: each message unpacked and decoded at its
        destination. Returns what `send` does."""
        grads_and_vars, messages = packed
        received = [gradient for gradient, _ in grads_and_vars]
        sent = []
        for message in messages:
            pairs = [grads_and_vars[p] for p in message.positions]
            decoded, nbytes, carried_nbytes = self._receive(message, pairs)
            for position, gradient, (count, plain) in zip(message.positions, decoded, nbytes):
                received[position] = gradient
                sent.append(Sent(grads_and_vars[position][1], count, plain))
            sent += [(NotAVariable(rider.dense_nbytes()), count)
                     for rider, count in zip(message.carried, carried_nbytes)]
        return list(zip(received, (v for _, v in grads_and_vars))), sent

    def _receive(self, message, pairs):
        units, held, layout = message.units, message.held, message.layout
        small = self.encoder.small_compression
        destination = message.destination
        # A sparse gradient sent densified (it keeps a residual): plain TensorFlow would
        # send its distinct rows, counted here, where they are (one scalar crosses).
        densified = [plain_nbytes(distinct_rows(g))
                     if isinstance(g, tf.IndexedSlices) and self.encoder.residual(v, g) is not None
                     else None for g, v in pairs]
        place = contextlib.nullcontext() if destination is None else tf.device(destination)
        with place:
            unpacked = layout.unpack(message.message,
                                     name=f"fused message for {destination or 'here'}")
            # Counted from what arrived, where it arrived: the byte counts then reach
            # the traffic counters (on a server) without crossing the wire themselves.
            counts = layout.payload_nbytes(unpacked)
            nbytes = shares_by_position(units, counts[:len(units)],
                                        [v.shape.num_elements() for _, v in pairs])
            decoded = spread(units, [
                self._decode(payload, [pairs[i] for i in unit], indices)
                for unit, payload, indices in zip(units, unpacked, held)])
            # What plain TensorFlow sends of a sparse gradient: its distinct rows and
            # their ids (None: the dense tensor).
            plain = [plain_nbytes(g) if isinstance(g, tf.IndexedSlices) else rows
                     for g, rows in zip(decoded, densified)]
            for rider, payload in zip(message.carried, unpacked[len(units):]):
                rider.apply(payload, small)
        return decoded, list(zip(nbytes, plain)), counts[len(units):]

    def _held_indices(self, destination, gradient, variable):
        """The destination's copy of `gradient`'s indices (`tfgc.ps.copies`), where
        its rows may travel alone; else None."""
        if destination is None or not self.encoder.values_alone(gradient, variable):
            return None
        return copy_on(gradient.indices, destination)

    def _encode(self, pairs, indices):
        """The payload of (gradient, variable) `pairs` that travel together (`indices`:
        the destination's copy of a lone gradient's indices, if its rows go alone)."""
        if len(pairs) > 1:
            return self.encoder.batch_payload(pairs)
        if indices is None:
            return self.encoder.payload(*pairs[0])
        return self.encoder.values_payload(*pairs[0])

    def _decode(self, payload, pairs, indices):
        """The gradients of (gradient, variable) `pairs` from their payload (`indices`:
        the destination's copy of a lone gradient's indices, if its rows came alone)."""
        variables = [v for _, v in pairs]
        if indices is None:
            codec = self.encoder.wire_codec(*pairs[0])
            return base.decode_group(codec, payload, [v.shape for v in variables])
        codec = self.encoder.codec(variables[0])  # its rows came alone (`values_payload`)
        dense_shape = tf.constant(variables[0].shape.as_list(), tf.int64)  # made here
        return [codec.decode_values(payload, indices, dense_shape)]

    def _units(self, pairs):
        """Positions in `pairs` that travel as one payload (see `payload_units`)."""
        return payload_units([
            None if isinstance(gradient, tf.IndexedSlices) else self.encoder.batch_key(variable)
            for gradient, variable in pairs])


class _Message(NamedTuple):
    """One destination's fused message, packed (`_FusedWire.pack`)."""

    destination: Optional[str]
    positions: list  # of its gradients in the step's pairs
    carried: list  # the riders it carries
    units: list  # positions (in its pairs) that share a payload
    held: list  # per unit, the destination's copy of its indices, or None
    layout: Layout
    message: tf.Tensor
    payloads: list  # its gradients' payloads, as encoded here (before packing)


class LocalWire(_FusedWire):
    """Encodes and decodes in this process, through one fused message per step."""


class ParameterServerPush(_FusedWire):
    """One fused message per parameter-server task and step, unpacked and decoded on
    that task: its graph partition receives the message and nothing else."""

    def _destination(self, variable):
        return variable.device

    def send_riders(self, destination: str) -> list[_Counted]:
        """Sends the step's riders for `destination` in one message of their own (a
        step that pushes nothing there: local steps between meetings) rather than one
        transfer each; returns what was sent, as `send` does."""
        carried = riders.take(destination)
        if not carried:
            return []
        small = self.encoder.small_compression
        layout, message = Layout.pack([rider.payload(small) for rider in carried])
        return self.receive(([], [_Message(destination, [], carried, [], [], layout,
                                           message, [])]))[1]


#: Bytes per collective (PyTorch DDP's default bucket is 25 MB, Horovod fuses 64 MB).
DEFAULT_BUCKET_BYTES = 25 * 2**20


class AllReduceWire(Wire):
    """Mirrored / MultiWorkerMirroredStrategy, in buckets of about `bucket_bytes`.

    A summable codec's floating payload tensors, and the gradients below
    `min_elements` as they are, are all-reduced in the compressed domain, packed by
    dtype into one collective per bucket (TensorFlow concatenates each pack), and
    decoded once. Other codecs' payloads are packed into one fused message per bucket
    (tfgc.wire.Layout), all-gathered (padded to the longest replica's), and every
    replica unpacks, decodes and sums all of them. A codec with its own `all_reduce`
    (`tfgc.codecs.base.AllReducing`) does its variable's whole aggregation, and codecs
    of a class with an `all_reduce_group` (PowerSGD) do their variables' together.

    Args:
      encoder: the `tfgc.wire.encoder.Encoder` of the optimizer whose gradients are sent.
      bucket_bytes: about how many bytes one collective carries.
    """

    def __init__(self, encoder: "Encoder", bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__(encoder)
        self.bucket_bytes = int(bucket_bytes)
        self.settings = encoder.settings
        self._fingerprint = _fingerprint(self.settings)

    def send(self, grads_and_vars: Sequence[_Pair]) -> tuple[list[_Pair], list[_Counted]]:
        context = tf.distribute.get_replica_context()
        received = [gradient for gradient, _ in grads_and_vars]
        nbytes, plain = {}, {}
        fingerprint = {"values": tf.constant(self._fingerprint, tf.float32)}
        summed: list[tuple[Any, base.Payload]]  # the position: None for the fingerprint
        gathered: list[tuple[int, base.Payload]]
        summed, gathered = [(None, fingerprint)], []  # (position, payload)
        # reduce group key: positions summed by one all_reduce_group
        together: dict[tuple[type[base.Codec], tf.DType, bool], list[int]] = {}
        for position, (gradient, variable) in enumerate(grads_and_vars):
            if gradient is None:
                continue
            if not self.encoder.compresses(variable):
                summed.append((position, {"values": tf.convert_to_tensor(gradient)}))
                nbytes[position] = dense_nbytes(variable)
                continue
            codec = self.encoder.codec(variable)
            if isinstance(codec, base.AllReducing):
                key = self.encoder.reduce_group_key(variable)
                if key is not None:
                    together.setdefault(key, []).append(position)
                else:
                    received[position], nbytes[position] = self.encoder.all_reduce(
                        gradient, variable, context)
                continue
            if isinstance(gradient, tf.IndexedSlices):
                # TensorFlow all-gathers every row of each replica's slices.
                plain[position] = plain_nbytes(gradient)
                if self.encoder.residual(variable, gradient) is None:
                    # Replicas' slices have their own rows and lengths: each replica's
                    # are gathered, as TensorFlow gathers them.
                    gathered.append((position, self.encoder.payload(gradient, variable)))
                    continue
                if codec.summable:  # kept a residual: summed dense
                    gradient = tf.convert_to_tensor(gradient)
            payload = self.encoder.payload(gradient, variable)
            if codec.summable:
                summed.append((position, payload))
                nbytes[position] = base.payload_nbytes(_summed_entries(payload))
            else:
                gathered.append((position, payload))
        for positions in together.values():
            totals, counts = self.encoder.all_reduce_group(
                [grads_and_vars[p] for p in positions], context)
            for position, total, count in zip(positions, totals, counts):
                received[position], nbytes[position] = total, count
        (_, fingerprints), *summed = self._all_reduce(context, summed)
        check = self._check_agreement(context, fingerprints["values"])
        for position, payload in summed:
            variable = grads_and_vars[position][1]
            codec = self.encoder.codec(variable)
            received[position] = (
                payload["values"] if not self.encoder.compresses(variable)
                else base.decode_expecting(codec, payload, variable.shape))
        for bucket in self._buckets(gathered, grads_and_vars):
            for position, total, count in self._all_gather(context, bucket, grads_and_vars):
                received[position], nbytes[position] = total, count
        with tf.control_dependencies([check]):
            received = [g if g is None else tf.identity(g) for g in received]
        pairs = list(zip(received, (v for _, v in grads_and_vars)))
        return pairs, [Sent(grads_and_vars[p][1], nbytes[p], plain.get(p))
                       for p in sorted(nbytes)]

    def _check_agreement(self, context, summed):
        """An op failing unless every replica's settings fingerprint is this one's."""
        mean = summed / context.num_replicas_in_sync
        own = tf.constant(self._fingerprint, tf.float32)
        # Distinct fingerprints differ by >= 2**-12, so some replica's differs from the
        # mean by >= 2**-12 / replicas; float32 sums of equal ones are exact.
        return tf.debugging.Assert(
            tf.reduce_all(tf.abs(mean - own) < 2.0**-20),
            [f"replicas disagree on their compression settings; this one's are "
             f"{self.settings}: give every worker the same DistributedOptimizer"])

    def _all_reduce(self, context, summed):
        """Sums the floating entries of `summed`'s payloads across replicas, one
        collective per dtype and bucket; returns [(position, summed payload)]."""
        by_dtype = {}
        for index, (_, payload) in enumerate(summed):
            for key, tensor in _summed_entries(payload).items():
                by_dtype.setdefault(tensor.dtype, []).append((index, key))
        results = [dict(payload) for _, payload in summed]
        options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=self.bucket_bytes)
        for places in by_dtype.values():
            tensors = [summed[i][1][key] for i, key in places]
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, tensors, options=options)
            for (i, key), tensor in zip(places, reduced):
                results[i][key] = tensor
        return [(position, result) for (position, _), result in zip(summed, results)]

    def _buckets(self, gathered, grads_and_vars):
        """`gathered` cut into runs of about `bucket_bytes` of dense gradient."""
        buckets, size = [], 0
        for item in gathered:
            if not buckets or size >= self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(item)
            size += dense_nbytes(grads_and_vars[item[0]][1])
        return buckets

    def _all_gather(self, context, bucket, grads_and_vars):
        """One fused message per replica for `bucket`, gathered; returns [(position,
        every replica's decoding combined (`Codec.combine`: their sum, or a codec's own
        rule), this replica's share of its message)]."""
        layout, message = Layout.pack([payload for _, payload in bucket])
        shares = layout.payload_nbytes([payload for _, payload in bucket])
        messages = all_gather_padded(context, message)
        decodings = [[] for _ in bucket]
        for replica_message in messages:
            unpacked = layout.unpack(replica_message, name="all-gathered fused message")
            for i, ((position, _), payload) in enumerate(zip(bucket, unpacked)):
                gradient, variable = grads_and_vars[position]
                decoded = base.decode_expecting(self.encoder.wire_codec(gradient, variable),
                                                payload, variable.shape)
                if (isinstance(decoded, tf.IndexedSlices)
                        and not isinstance(gradient, tf.IndexedSlices)):
                    decoded = tf.convert_to_tensor(decoded)  # a dense gradient's (FastSGD)
                decodings[i].append(decoded)
        results = []
        for (position, _), decoded, share in zip(bucket, decodings, shares):
            if isinstance(decoded[0], tf.IndexedSlices):
                # The replicas' rows, one after the other: their sum once applied.
                total = tf.IndexedSlices(tf.concat([d.values for d in decoded], 0),
                                         tf.concat([d.indices for d in decoded], 0),
                                         decoded[0].dense_shape)
                results.append((position, total, share))
                continue
            codec = self.encoder.codec(grads_and_vars[position][1])
            # A codec written without tfgc's base class sums.
            combine = getattr(codec, "combine", None)
            total = combine(decoded) if combine else base.Codec.combine(codec, decoded)
            results.append((position, total, share))
        return results


def _summed_entries(payload):
    """The entries of a summable codec's payload that the all-reduce sums: the floating
    ones. The others (a shape, RandomK's seed) are the same on every replica and stay
    where they are, as do empty ones (a dtype marker)."""
    return {key: tensor for key, tensor in payload.items()
            if tensor.dtype.is_floating and tensor.shape.num_elements() != 0}


def _fingerprint(settings):
    """Two 12-bit hashes of `settings` (a string) as floats in [0, 1)."""
    digest = hashlib.sha256(settings.encode()).digest()
    return [int.from_bytes(digest[i:i + 2], "little") % 4096 / 4096 for i in (0, 2)]


def sends_locally(strategy: tf.distribute.Strategy, aggregate: bool) -> bool:
    """Whether `choose_wire` takes the local wire under `strategy`: no parameter servers,
    and one replica or nothing to aggregate."""
    return not is_parameter_server(strategy) and not (
        strategy.num_replicas_in_sync > 1 and aggregate)


def choose_wire(encoder: "Encoder", strategy: tf.distribute.Strategy, aggregate: bool,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Wire:
    """The wire for `strategy`, sending what `encoder` encodes: PS push, all-reduce
    (when gradients are to be aggregated across replicas, in buckets of about
    `bucket_bytes`) or local."""
    if sends_locally(strategy, aggregate):
        return LocalWire(encoder)
    if is_parameter_server(strategy):
        return ParameterServerPush(encoder)
    return AllReduceWire(encoder, bucket_bytes)
