"""The codec protocol: encode a tensor into a payload of tensors and decode it back.

A payload is a flat dict of tensors (tf.nest friendly) holding everything the receiving
side needs; its bytes are exactly what crosses the wire (`payload_nbytes`).

Non-finite policy (every codec): a tensor holding NaN or Inf is not data but a failed
step. It encodes to a payload whose decoding is still non-finite (quantizing codecs send
a NaN scale, so every element decodes to NaN), so a downstream check sees the failure (a
`DistributedOptimizer` skips a step whose decoded gradients are not finite:
tfgc.optimizer.finite_steps); `ErrorFeedback` leaves its residual untouched for that step.

Payloads are checked before they are decoded: see `tfgc.codecs.validation`.
"""
import abc
import inspect
from typing import (
    Any, Callable, Iterable, Mapping, NamedTuple, Optional, Protocol, Sequence, Union,
    runtime_checkable,
)

import tensorflow as tf

from tfgc.ps import server_variables
from tfgc.codecs.validation import (  # noqa: F401  (codecs reach them as base.<name>)
    MAX_ELEMENTS, MAX_DECODED_BYTES, MAX_DECODED_ELEMENTS, MalformedPayloadError,
    decode_expecting, decoded_byte_bound, decoded_element_bound, bytes_per_element,
    extra_bytes, Field, FLOATING, INDEX_DTYPES, SHAPE, BYTES, FLOAT_SCALAR,
    FLOAT_VECTOR, DTYPE_MARKER, check_payload, check_same_dtype, static_dims, checked_shape,
    checked_payload, with_static_shape, check_decoded_field, check_integer, check_real,
    check_floating, check_one_dtype, check_size,
)

# From this many values on, a codec's elementwise passes run as one XLA function (several
# times faster at 16M values); smaller tensors, e.g. the biases of a fused message, skip
# the compile per shape.
JIT_MIN_ELEMENTS = 1 << 16

#: A payload: field name -> tensor, a flat dict (what `encode` returns, `decode` takes).
Payload = Mapping[str, tf.Tensor]
#: A static shape: a `tf.TensorShape` or a sequence of ints.
Shape = Union[tf.TensorShape, Sequence[int]]


class Topology(NamedTuple):
    """Where a bound codec's tensors travel (given to `Codec.bind`).

    Attributes:
      parameter_server: under ParameterServerStrategy: workers encode, a parameter
        server decodes, and per-worker state must be per-worker variables.
      all_reduce_replicas: the replicas that sum the tensors by all-reduce (more than
        one under Mirrored/MultiWorkerMirroredStrategy), each with its own copy of a
        codec's state.
    """

    parameter_server: bool = False
    all_reduce_replicas: int = 1


def bind_to(codec: "Codec", variable: tf.Variable, topology: Topology) -> "Codec":
    """`codec.bind(variable, topology)`; `codec.bind(variable)` for a codec whose `bind`
    takes no topology (one written before `Codec.bind` had it)."""
    try:
        takes_topology = "topology" in inspect.signature(codec.bind).parameters
    except (TypeError, ValueError):
        takes_topology = False
    return codec.bind(variable, topology) if takes_topology else codec.bind(variable)


def replica_state(initial_value: Union[tf.Tensor, Callable[[], tf.Tensor]], name: str,
                  topology: Topology) -> tf.Variable:
    """A bound codec's state variable that every replica updates on its own copy.

    Every replica applies the same update to the same aggregated values, so the copies
    stay equal without communication; checkpoints keep the first replica's copy. Under
    ParameterServerStrategy it is one variable on a parameter server.
    """
    if topology.all_reduce_replicas > 1:
        return tf.Variable(
            initial_value, trainable=False, name=name,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
    return tf.Variable(initial_value, trainable=False, name=name)


def sender_state(initial_value: Union[tf.Tensor, Callable[[], tf.Tensor]], name: str,
                 topology: Topology) -> tf.Variable:
    """A bound codec's state that only the sending side reads and writes: one copy per
    worker under ParameterServerStrategy (a resumed or restarted worker starts it from
    `initial_value`), else as `replica_state`.

    A per-worker variable is read and written outside `tf.cond` branches only: a worker
    function does not resolve it inside them.
    """
    if topology.parameter_server:
        # Made from inside a traced step (an optimizer builds at its first step): it
        # must skip tf.function's initializer lifting, as tfgc.distribute's are.
        return server_variables.per_worker_by_name(tf.Variable(
            initial_value, trainable=False, name=name, per_worker_variable=True,
            experimental_enable_variable_lifting=False))
    return replica_state(initial_value, name, topology)


# Capabilities that one codec family has: the encoder and wires dispatch on them with
# isinstance, so the Codec contract itself stays the same for every codec.


@runtime_checkable
class SendsValuesAlone(Protocol):
    """A codec that sends the rows of `tf.IndexedSlices` without their indices, for a
    receiver that holds the indices already (FastSGD: a fused wire uses it where the
    indices were computed on the receiving server)."""

    def encode_values(self, values: tf.Tensor) -> Payload:
        """Compresses the rows (the slices' `values`; the indices are distinct)."""

    def decode_values(self, payload: Payload, indices: tf.Tensor,
                      dense_shape: tf.Tensor) -> tf.IndexedSlices:
        """Inverse of `encode_values`: the `tf.IndexedSlices` at the receiver's `indices`."""


@runtime_checkable
class AllReducing(Protocol):
    """A bound codec that aggregates across replicas itself (GradiVeQ, whose collectives
    depend on its phase; PowerSGD, whose second collective depends on the first's sum):
    under all-reduce strategies its `all_reduce` replaces the wire's generic one.

    One that `supports_error_feedback` also has a class-level
    `all_reduce_group(codecs, gradients, replica_context)` -> ([sums], [this replica's
    own share of each], [bytes sent for each]), for several variables bound to codecs of
    its class at once: the wire calls it with the residuals added, and each residual
    keeps `gradient - own share`.
    """

    def all_reduce(self, gradient: tf.Tensor,
                   replica_context: tf.distribute.ReplicaContext) -> tuple[tf.Tensor, tf.Tensor]:
        """(the sum of every replica's `gradient`, decoded; the bytes this replica sent)."""


class Codec(abc.ABC):
    """Base class of tfgc's codecs.

    A codec encodes a group of tensors into one payload. The group form, on the
    tensors laid end to end (`encode_and_reconstruct_flat`, `decode_flat`), is the one
    the wires, error feedback and pulls call; a group of one tensor is the one-tensor
    form (`encode`, `encode_and_reconstruct`, `decode`), which is all most codecs write.

    Subclasses implement `encode` and `decode`, and may override `encode_and_reconstruct`
    when the sender can rebuild what the receiver will decode more cheaply than by
    decoding (error feedback needs it every step). A `batched` codec also overrides the
    flat pair for groups of several tensors, leaving a group of one to this class.
    """

    #: True when payloads may be summed element-wise before a single decode, so that
    #: decode(sum of payloads) == sum of decodes (all-reduce in the compressed domain).
    summable = False

    #: False for codecs that error feedback harms (GradiVeQ: what lies outside the
    #: compressor's span is never sent, so a residual would only grow);
    #: `DistributedOptimizer` then keeps no residual for them.
    supports_error_feedback = True

    #: True for a codec that applies momentum to the gradient before compressing it
    #: (Signum): the optimizer it feeds should have none of its own.
    momentum_on_sender = False

    #: True when E[decode(encode(x))] = x (stochastic rounding): such a codec needs no
    #: error feedback, and `ErrorFeedback` around it warns.
    unbiased = False

    #: True when `encode` takes `tf.IndexedSlices` as they are (sparse gradients);
    #: other codecs get them as dense tensors.
    accepts_indexed_slices = False

    #: True when the flat pair takes groups of several same-dtype tensors (a fused wire
    #: sends each such group as one payload); other codecs' tensors travel as one
    #: payload each.
    batched = False

    #: True for a bound codec whose sender keeps state of its own in per-worker
    #: variables under ParameterServerStrategy (PowerSGD's warm start, GradiVeQ's copy
    #: of its compressor); local steps there, which encode in a branch, refuse it.
    keeps_sender_state = False

    #: True when `encode` and `decode` are made of TensorFlow's own ops, which XLA
    #: compiles, so a step compiled with `jit_compile=True` can run them; False for a
    #: codec built on tfgc's C++ ops, which have no XLA kernels.
    compiles_with_xla = False

    #: The most bytes `decode` allocates (its output and its intermediates) when called
    #: without `expected_shape`; None: `tfgc.codecs.MAX_DECODED_BYTES` (read when
    #: decoding). A payload declaring a larger decoding is refused before anything is
    #: allocated for it.
    max_decoded_bytes = None

    #: Deprecated (the byte bound, `max_decoded_bytes`, is the limit): a further bound on
    #: the elements `decode` returns without `expected_shape`; None:
    #: `tfgc.codecs.MAX_DECODED_ELEMENTS`.
    max_decoded_elements = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """What `decode` allocates per element of the shape a payload declares, in bytes:
        its output and every intermediate it makes, for the payload's (checked) `fields`
        (their dtypes: a float64 decoding takes 8 bytes per element for its output).
        Without `expected_shape`, the declared element count times this must be at most
        `max_decoded_bytes`. Default: one float32 per element."""
        del fields
        return 4

    def combine(self, decodings: Sequence[tf.Tensor]) -> tf.Tensor:
        """What the replicas' decodings of an all-gathered payload add up to (every
        replica decodes every replica's payload, in replica order): their sum, as an
        all-reduce of the gradients would give. A codec that aggregates otherwise
        (Signum's majority vote) overrides it."""
        total = decodings[0]
        for decoded in decodings[1:]:
            total = total + decoded
        return total

    @abc.abstractmethod
    def encode(self, x: tf.Tensor) -> Payload:
        """Compresses `x` into a payload (flat dict of tensors)."""

    @abc.abstractmethod
    def decode(self, payload: Payload,
               expected_shape: Optional[Shape] = None) -> tf.Tensor:
        """Rebuilds a tensor of the encoded tensor's shape and dtype from `payload`.

        Args:
          payload: a flat dict of tensors from `encode` (checked, see the module doc).
          expected_shape: the shape the decoding must have, when the caller knows it
            (a fully defined shape); None bounds what the decoding allocates by
            `max_decoded_bytes` instead.

        Raises:
          MalformedPayloadError: the payload is not one this codec decodes to the
            expected shape, as far as can be seen while the decode is built.
          tf.errors.InvalidArgumentError: the same, found when the decode runs.
        """

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[Payload, tf.Tensor]:
        """Returns (payload, decode(payload)), possibly without running the decoder."""
        payload = self.encode(x)
        return payload, self.decode(payload)

    def encode_and_reconstruct_flat(self, flat: tf.Tensor, shapes: Sequence[Shape]
                                    ) -> tuple[Payload, tf.Tensor]:
        """Encodes a group of tensors into one payload.

        Args:
          flat: the tensors, of the static `shapes`, laid end to end in one vector.
          shapes: their shapes (the receiver knows them: a group's payload need not
            carry them). More than one only for `batched` codecs.

        Returns:
          (payload, the receiver's decodings laid end to end). A group of one tensor
          is `encode_and_reconstruct` of that tensor.
        """
        shape = _only_shape(self, shapes)
        payload, sent = self.encode_and_reconstruct(tf.reshape(flat, shape))
        return payload, tf.reshape(sent, [-1])

    def decode_flat(self, payload: Payload, shapes: Sequence[Shape]) -> tf.Tensor:
        """Inverse of `encode_and_reconstruct_flat`: the decodings laid end to end."""
        return tf.reshape(decode_expecting(self, payload, _only_shape(self, shapes)), [-1])

    def bind(self, variable: tf.Variable, topology: Optional["Topology"] = None) -> "Codec":
        """The codec to use for `variable`'s gradients (default: this one).

        `DistributedOptimizer.build` calls it once per compressed variable, inside the
        strategy's scope, so a codec that keeps per-variable state (tf.Variables, such as
        GradiVeQ's compressors) creates it here. A bound codec that is `AllReducing`
        has its `all_reduce` called under all-reduce strategies.

        Args:
          variable: the variable whose tensors it will encode.
          topology: where the tensors travel (None: one process). Codecs learn the
            cluster from it, never from the strategy.
        """
        del variable, topology
        return self

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments, for serialization with `from_config`."""
        return {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Codec":
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _only_shape(codec, shapes):
    """The one shape of a group a codec that is not `batched` encodes."""
    if len(shapes) != 1:
        raise NotImplementedError(
            f"{codec.name} encodes one tensor per payload (batched=False), got a group "
            f"of {len(shapes)}")
    return tf.TensorShape(shapes[0])


def group_sizes(flat: tf.Tensor, shapes: Sequence[Shape], codec_name: str) -> list[int]:
    """The element counts of a batched group's static `shapes`, checked against the
    floating vector `flat` they lie in (for `batched` codecs' flat pair)."""
    static = [tf.TensorShape(shape) for shape in shapes]
    if not all(shape.is_fully_defined() for shape in static):
        raise ValueError(f"{codec_name} batches tensors of static shapes, got {static}")
    sizes = [shape.num_elements() for shape in static]
    if flat.shape.rank != 1 or (flat.shape[0] is not None and flat.shape[0] != sum(sizes)):
        raise ValueError(
            f"{codec_name}: a group of {len(sizes)} tensors ({sum(sizes)} values) must "
            f"lie in a vector of as many values, got shape {flat.shape}")
    return sizes


def encode_group(codec: Codec, tensors: Sequence[tf.Tensor]
                 ) -> tuple[Payload, list[tf.Tensor]]:
    """(payload, [the receiver's decoding of each tensor]) of `tensors` as one group:
    `codec.encode_and_reconstruct_flat` on the tensors laid end to end."""
    tensors = [tf.convert_to_tensor(x) for x in tensors]
    check_one_dtype(tensors, codec.name)
    shapes = [tf.TensorShape(x.shape) for x in tensors]
    if len(tensors) == 1:
        payload, sent = codec.encode_and_reconstruct(tensors[0])
        return payload, [sent]
    payload, sent = codec.encode_and_reconstruct_flat(concat_flat(tensors), shapes)
    return payload, split_flat(sent, shapes)


def decode_group(codec: Codec, payload: Payload, shapes: Sequence[Shape]) -> list[tf.Tensor]:
    """Inverse of `encode_group`, given the tensors' static shapes (a lone tensor is
    decoded as `decode` returns it, e.g. `tf.IndexedSlices` for a sparse codec)."""
    if len(shapes) == 1:
        return [decode_expecting(codec, payload, shapes[0])]
    return split_flat(codec.decode_flat(payload, shapes), shapes)


class PerVariableSettings(Codec):
    """A codec's settings whose compressor keeps state per variable: `bind(variable)`
    makes that compressor, and the settings themselves neither encode nor decode.

    Subclasses set `state` (what each compressor keeps, for the error) and
    `layer_class` (the name of the class `bind` returns).
    """

    state = "state"
    layer_class = "layer"

    def encode(self, x: tf.Tensor) -> Payload:
        raise self._unbound()

    def decode(self, payload: Payload, expected_shape: Optional[Shape] = None) -> tf.Tensor:
        raise self._unbound()

    def _unbound(self) -> RuntimeError:
        return RuntimeError(
            f"{self.name} keeps {self.state}: call codec.bind(variable) and use the "
            f"returned {self.layer_class} (tfgc.DistributedOptimizer does this for you)")


def layer_name(prefix: str, variable: Any, unnamed: str = "variable") -> str:
    """A module name for `variable`'s compressor: `prefix`, "_", and the variable's
    name (`unnamed` for an object without one) without its ":0", other characters than
    letters and digits as "_"."""
    variable_name = getattr(variable, "name", unnamed).split(":")[0]
    return f"{prefix}_" + "".join(c if c.isalnum() else "_" for c in variable_name)


class ReconstructingCodec(Codec):
    """A codec whose encoder computes the receiver's decoding as a by-product.

    Subclasses implement `encode_and_reconstruct` and `decode`; `encode` drops the
    reconstruction.
    """

    def encode(self, x: tf.Tensor) -> Payload:
        return self.encode_and_reconstruct(x)[0]

    @abc.abstractmethod
    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[Payload, tf.Tensor]:
        """Returns (payload, decode(payload))."""


class CompiledForLarge:
    """Calls `fn(x, *args)` compiled by XLA when `x` has JIT_MIN_ELEMENTS values or more
    (known at trace time), and as it is otherwise.

    Make one per codec instance, as ThreeLC does: a function cached by an earlier cluster
    connection is not sent to a new cluster's workers.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._compiled = tf.function(fn, jit_compile=True)

    def __call__(self, x, *args):
        size = x.shape.num_elements()
        large = size is not None and size >= JIT_MIN_ELEMENTS
        return (self._compiled if large else self._fn)(x, *args)


def payload_nbytes(payload: Payload) -> tf.Tensor:
    """Bytes a payload puts on the wire, as an int64 scalar tensor."""
    total = tf.constant(0, tf.int64)
    for tensor in tf.nest.flatten(payload):
        tensor = tf.convert_to_tensor(tensor)
        total += tf.size(tensor, out_type=tf.int64) * tensor.dtype.size
    return total


def concat_flat(tensors: Iterable[tf.Tensor]) -> tf.Tensor:
    """`tensors` flattened and concatenated into one vector.

    A traced step builds this for many tensors at once: one shape constant serves them
    all (a plain `tf.reshape(t, [-1])` adds one per tensor).
    """
    flat = tf.constant([-1])
    return tf.concat([tf.reshape(t, flat) for t in tensors], axis=0)


def split_flat(flat: tf.Tensor, shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
    """Inverse of `concat_flat`: the vector `flat` cut into tensors of the static
    `shapes`, in order, with one shape constant per distinct shape."""
    shapes = [tf.TensorShape(shape) for shape in shapes]
    sizes = [shape.num_elements() for shape in shapes]
    parts = tf.split(flat, sizes) if len(shapes) > 1 else [flat]
    constants = {}
    for shape in shapes:
        key = tuple(shape.as_list())
        if key not in constants:
            constants[key] = tf.constant(key, tf.int32, shape=[len(key)])
    return [tf.reshape(part, constants[tuple(shape.as_list())])
            for part, shape in zip(parts, shapes)]


def shape_of(x: tf.Tensor) -> tf.Tensor:
    """The shape of `x` as an int32 tensor for a payload."""
    return tf.shape(x, out_type=tf.int32)


def all_finite(x: tf.Tensor) -> tf.Tensor:
    """Scalar bool: every element of `x` is finite (True for an empty tensor)."""
    return tf.reduce_all(tf.math.is_finite(x))


def largest_magnitude(flat: tf.Tensor) -> tf.Tensor:
    """max|x| over the finite elements of 1-D float32 `flat`; 0 when there are none."""
    magnitude = tf.abs(tf.where(tf.math.is_finite(flat), flat, 0.0))
    return tf.where(tf.size(flat) > 0, tf.reduce_max(magnitude), 0.0)


def nan_unless(finite: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """`scale`, or NaN when the input was not finite (the non-finite policy)."""
    return tf.where(finite, scale, tf.constant(float("nan"), scale.dtype))


def round_to(value: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """A float32 `value` rounded to `dtype` and back: what the receiver will read."""
    return tf.cast(tf.cast(value, dtype), tf.float32)


class StochasticCodec(tf.Module, ReconstructingCodec):
    """A codec that draws random numbers from its own checkpointable generator.

    Args:
      seed: an int for reproducible draws, or None for a nondeterministic seed.
    """

    def __init__(self, seed: Optional[int] = None, name: Optional[str] = None) -> None:
        tf.Module.__init__(self, name=name)
        self.seed = seed
        if seed is None:
            self.generator = tf.random.Generator.from_non_deterministic_state()
        else:
            self.generator = tf.random.Generator.from_seed(seed)

    def draw_seed(self) -> tf.Tensor:
        """A fresh int64 pair from the generator: the seed of one encoding's draws
        (the C++ ops draw each value's from it and the value's index)."""
        return self.generator.make_seeds(1)[:, 0]
