"""The encoder: how each variable's gradients are encoded for the wire.

An optimizer's `Encoder` holds every per-variable decision a wire needs: whether the main
codec compresses a variable (`min_elements`, floating dtype), the codec bound to it (or
the small-tensor codec), its error-feedback residual, which gradients a batched codec
encodes together, and whether a sparse gradient's rows may travel without their
indices. Wires call it and nothing else of the optimizer, so one step's push reads
straight down: optimizer -> wire -> encoder -> error feedback -> codec -> ops.

The codecs and residuals it uses are kept in dicts the optimizer owns (they are saved
with the optimizer's checkpoints), keyed by the variable's position in the optimizer,
which is stable across processes.
"""
import copy
import warnings
from typing import (
    TYPE_CHECKING, Any, Callable, Iterable, Mapping, MutableMapping, Optional, Sequence, Union,
    overload,
)

import tensorflow as tf

from tfgc.codecs.base import (
    Codec, Payload, SendsValuesAlone, Topology, bind_to, concat_flat, encode_group, split_flat,
)
from tfgc.codecs.identity import Cast, NoCompression
from tfgc.codecs.rows import SparseRows, distinct_rows
from tfgc.distribute import is_parameter_server

if TYPE_CHECKING:
    from tfgc.memory import ResidualFeedback, StagedResidual

DEFAULT_SMALL_COMPRESSION = "float16"


@overload
def small_codec(spec: Union[str, Codec, None]) -> Optional[Codec]: ...


@overload
def small_codec(spec: Mapping[str, Any]) -> Mapping[str, Any]: ...


def small_codec(spec: Union[str, Codec, Mapping[str, Any], None]
                ) -> Union[Codec, Mapping[str, Any], None]:
    """The small-tensor codec named by `spec` ("float16", a codec, its config, None)."""
    if isinstance(spec, str):
        if spec != DEFAULT_SMALL_COMPRESSION:
            raise ValueError(
                f'small_compression is "{DEFAULT_SMALL_COMPRESSION}", a tfgc codec or None; '
                f"got {spec!r}")
        return Cast("float16")
    return spec


def below_min_codec(small_compression: Optional[Codec]) -> Codec:
    """The codec of tensors a main codec does not compress: `small_compression`, or
    `NoCompression` where it is None."""
    return NoCompression() if small_compression is None else small_compression


def topology() -> Topology:
    """The `Topology` codecs bound under the current strategy are told about."""
    strategy = tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        return Topology(parameter_server=True)
    return Topology(all_reduce_replicas=strategy.num_replicas_in_sync)


def compresses(variable: tf.Variable, min_elements: int) -> bool:
    """Whether a main codec compresses `variable`'s tensors: floating, with a known
    number of elements, `min_elements` or more."""
    return (
        variable.dtype.is_floating
        and variable.shape.num_elements() is not None
        and variable.shape.num_elements() >= min_elements
    )


class Encoder:
    """Encodes gradients for the wire, with error feedback where kept.

    Args:
      compression: the main codec (unbound; bound per variable by `build`).
      small_compression: the codec of gradients the main codec does not compress, or
        None to send them as they are.
      min_elements: variables with fewer elements are not compressed by `compression`.
      feedback: the error-feedback rule (a `tfgc.memory.ResidualFeedback`) applied with
        a residual per compressed variable (where its codec allows), or None.
      position: a function giving a variable's position in its optimizer.
      codecs: the dict (owned by the optimizer) of bound codecs, filled by `build`.
      residuals: the dict (owned by the optimizer) of residuals, filled by `build`.
      settings: what every replica must agree on (a string; see AllReduceWire).
      sparse_error_feedback: whether a variable whose gradients are sparse
        (`tf.IndexedSlices`: an embedding's) keeps a dense residual too, its gradients
        then sent densified; by default they travel as their distinct rows
        (`tfgc.codecs.rows`), without error feedback.
    """

    def __init__(self, compression: Codec, small_compression: Optional[Codec],
                 min_elements: int, feedback: Optional["ResidualFeedback"],
                 position: Callable[[tf.Variable], int], codecs: MutableMapping[str, Codec],
                 residuals: MutableMapping[str, Union[tf.Variable, "StagedResidual"]], settings: Optional[str],
                 sparse_error_feedback: bool = False) -> None:
        self.compression = compression
        self.small_compression = small_compression
        self.min_elements = int(min_elements)
        self.feedback = feedback
        self.sparse_error_feedback = bool(sparse_error_feedback)
        # The variables seen with sparse gradients (`note_gradients`), by reference.
        self._sparse: set[Any] = set()
        self._warned_unused_residual: set[int] = set()
        self.settings = settings
        self._position = position
        self._codecs = codecs
        self._residuals = residuals
        self._below_min = below_min_codec(small_compression)

    def with_residuals(self, residuals: MutableMapping[str, Union[tf.Variable, "StagedResidual"]]) -> "Encoder":
        """This encoder with other residuals (a dict by the same keys as `residual`'s,
        e.g. `tfgc.memory.StagedResidual`s), sharing its codecs and decisions."""
        staged = copy.copy(self)
        staged._residuals = residuals  # noqa: SLF001 (a copy of this class)
        return staged

    def residuals_by_key(self, variables: Iterable[tf.Variable]) -> dict[str, Union[tf.Variable, "StagedResidual"]]:
        """{key: residual} of the `variables` that keep one (keys as `with_residuals`
        takes them)."""
        residuals = {self._residual_key(v): self.residual(v) for v in variables}
        return {key: residual for key, residual in residuals.items() if residual is not None}

    # --- per-variable decisions ---------------------------------------------------

    def compresses(self, variable: tf.Variable) -> bool:
        """True when `variable`'s gradients are compressed by the main codec."""
        return compresses(variable, self.min_elements)

    def note_gradients(self, grads_and_vars: Iterable[tuple[Optional[Union[tf.Tensor, tf.IndexedSlices]], tf.Variable]]
                       ) -> None:
        """Notes which variables' gradients are sparse (`tf.IndexedSlices`), before
        `build` decides their residuals."""
        for gradient, variable in grads_and_vars:
            if isinstance(gradient, tf.IndexedSlices):
                self._sparse.add(_key(variable))

    def is_sparse(self, variable: tf.Variable) -> bool:
        """Whether `variable` was seen with a sparse gradient (`note_gradients`)."""
        return _key(variable) in self._sparse

    def build(self, variables: Iterable[tf.Variable],
              make_residual: Callable[[tf.Variable], tf.Variable]) -> None:
        """Binds the main codec to each compressed variable of `variables` not bound
        yet, and makes its residual with `make_residual(variable)` where kept (for a
        variable with sparse gradients only with `sparse_error_feedback`)."""
        for variable in variables:
            if not self.compresses(variable) or self._codec_key(variable) in self._codecs:
                continue
            codec = bind_to(self.compression, variable, topology())
            self._codecs[self._codec_key(variable)] = codec
            if self.feedback is None or not codec.supports_error_feedback:
                continue
            if self.is_sparse(variable):
                if not self.sparse_error_feedback:
                    continue
                warnings.warn(
                    f"sparse_error_feedback=True: {variable.name}'s gradients are sparse, "
                    f"and a dense residual of {_megabytes(variable):.1f} MB is kept for it "
                    "on every worker; its gradients are sent densified", stacklevel=4)
            self._residuals[self._residual_key(variable)] = make_residual(variable)

    def codecs_in_use(self) -> list[Codec]:
        """The bound codecs of the variables built so far, and the small-tensor codec."""
        return [*self._codecs.values(), self._below_min]

    def bound_codec(self, variable: tf.Variable) -> Codec:
        """The main codec bound to `variable` (see `Codec.bind`)."""
        return self._codecs[self._codec_key(variable)]

    def codec(self, variable: tf.Variable) -> Codec:
        """The codec `variable`'s gradients travel with: its bound codec, or the
        small-tensor codec below `min_elements`.

        Raises:
          TypeError: `variable` is not floating-point.
        """
        if self.compresses(variable):
            return self.bound_codec(variable)
        if not variable.dtype.is_floating:
            raise TypeError(
                f"a gradient was applied to {variable.name}, a {variable.dtype.name} "
                "variable: tfgc sends gradients of floating-point variables only (make it "
                "trainable=False, or leave it out of the (gradient, variable) pairs)")
        return self._below_min

    def residual(self, variable: tf.Variable, gradient: Optional[Union[tf.Tensor, tf.IndexedSlices]] = None
                 ) -> Optional[Union[tf.Variable, "StagedResidual"]]:
        """`variable`'s error-feedback residual, or None where none is kept (or where
        `gradient`, if given, is sparse and travels as its rows)."""
        if not self.compresses(variable):
            return None  # the small-tensor codec keeps none
        residual = self._residuals.get(self._residual_key(variable))
        if (residual is not None and isinstance(gradient, tf.IndexedSlices)
                and not self.sparse_error_feedback):
            self._warn_unused_residual(variable)
            return None
        return residual

    def _warn_unused_residual(self, variable):
        """Warns once per variable of a residual made before its gradients showed sparse."""
        if self._position(variable) in self._warned_unused_residual:
            return
        self._warned_unused_residual.add(self._position(variable))
        warnings.warn(
            f"{variable.name}'s gradient is sparse, but a dense residual of "
            f"{_megabytes(variable):.1f} MB was made for it when the optimizer was built "
            "before its first step: its gradients travel as their rows, and the residual "
            "stays unused. Let the first step build the optimizer, or build it with "
            "tfgc.build_for_fit (which finds the sparse gradients first); "
            "sparse_error_feedback=True uses the residual", stacklevel=5)

    def wire_codec(self, gradient: Union[tf.Tensor, tf.IndexedSlices], variable: tf.Variable) -> Codec:
        """The codec that sends `gradient` of `variable`: `codec(variable)`, or for a
        sparse gradient without a residual one that sends its rows (`SparseRows`, for
        every codec but one with a slices payload of its own: NoCompression's)."""
        codec = self.codec(variable)
        if (not isinstance(gradient, tf.IndexedSlices)
                or self.residual(variable, gradient) is not None):
            return codec
        # A codec that sends rows alone (FastSGD) goes through SparseRows directly: its
        # own `encode` of slices would sum the rows `payload` has summed already.
        if codec.accepts_indexed_slices and not isinstance(codec, SendsValuesAlone):
            return codec
        return SparseRows(codec)

    def _codec_key(self, variable):
        return f"codec_{self._position(variable)}"

    def _residual_key(self, variable):
        return f"residual_{self._position(variable)}"

    # --- encoding -----------------------------------------------------------------

    def payload(self, gradient: Union[tf.Tensor, tf.IndexedSlices], variable: tf.Variable) -> Payload:
        """Encodes one gradient for the wire (with error feedback where kept); a sparse
        one as its distinct rows (`tfgc.codecs.rows`)."""
        residual = self.residual(variable, gradient)
        if residual is not None:
            codec = self.codec(variable)
            return self.feedback.step(codec, tf.convert_to_tensor(gradient), residual)[0]  # type: ignore[union-attr]  # a residual means a feedback rule (build)
        if isinstance(gradient, tf.IndexedSlices):
            gradient = distinct_rows(gradient)  # as tf_keras sums them before it applies
        return self.wire_codec(gradient, variable).encode(gradient)

    def all_reduce(self, gradient: Union[tf.Tensor, tf.IndexedSlices], variable: tf.Variable,
                   replica_context: tf.distribute.ReplicaContext) -> tuple[tf.Tensor, tf.Tensor]:
        """Sums `gradient` across replicas with `variable`'s codec, one that aggregates
        itself (`tfgc.codecs.base.AllReducing`) and keeps no residual.

        Returns:
          (the decoded sum, the bytes this replica sent).
        """
        codec = self.codec(variable)
        if self.residual(variable) is not None:
            raise NotImplementedError(
                f"{codec.name} aggregates across replicas itself and keeps a residual: it "
                "needs a class-level all_reduce_group, which applies error feedback "
                "(see tfgc.codecs.base.AllReducing)")
        return codec.all_reduce(tf.convert_to_tensor(gradient), replica_context)  # type: ignore[attr-defined]  # AllReducing (the wire checks)

    def reduce_group_key(self, variable: tf.Variable
                         ) -> Optional[tuple[type[Codec], tf.DType, bool]]:
        """Variables with one key are summed together by their codecs' class-level
        `all_reduce_group` (one set of collectives, PowerSGD's); None: `variable`'s
        codec has none (it is summed alone, by `all_reduce`)."""
        codec = self.codec(variable)
        if getattr(type(codec), "all_reduce_group", None) is None:
            return None
        return type(codec), variable.dtype, self.residual(variable) is not None

    def all_reduce_group(self, pairs: Sequence[tuple[Union[tf.Tensor, tf.IndexedSlices], tf.Variable]],
                         replica_context: tf.distribute.ReplicaContext
                         ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """`all_reduce` of (gradient, variable) `pairs` that share a `reduce_group_key`:
        ([decoded sums], [bytes this replica sent for each])."""
        codecs = [self.codec(v) for _, v in pairs]
        gradients = [tf.convert_to_tensor(g) for g, _ in pairs]
        residuals = [self.residual(v) for _, v in pairs]
        group = type(codecs[0]).all_reduce_group  # type: ignore[attr-defined]  # reduce_group_key found it
        if residuals[0] is None:
            totals, _, nbytes = group(codecs, gradients, replica_context)
            return totals, nbytes
        (totals, nbytes), _ = self.feedback.flat_step(  # type: ignore[union-attr]  # a residual means a feedback rule (build)
            _ReplicaSumGroup(group, codecs, replica_context), gradients, residuals)
        return totals, nbytes

    def values_alone(self, gradient: Union[tf.Tensor, tf.IndexedSlices], variable: tf.Variable) -> bool:
        """Whether `gradient`, IndexedSlices, may travel as its rows alone to a receiver
        that holds its indices: its codec sends them so and keeps no residual for it."""
        return (isinstance(gradient, tf.IndexedSlices)
                and isinstance(self.codec(variable), SendsValuesAlone)
                and self.residual(variable, gradient) is None)

    def values_payload(self, gradient: tf.IndexedSlices, variable: tf.Variable) -> Payload:
        """Encodes the rows of `gradient` (see `values_alone`) without its indices."""
        return self.codec(variable).encode_values(gradient.values)  # type: ignore[attr-defined]  # SendsValuesAlone (values_alone)

    def batch_key(self, variable: tf.Variable) -> Optional[tuple[int, tf.DType, bool]]:
        """Gradients with one key travel as one payload of a batched codec
        (`Codec.batched`) on fused wires; None: `variable`'s travels on its own."""
        codec = self.codec(variable)
        if not codec.batched:
            return None
        return id(codec), variable.dtype, self.residual(variable) is not None

    def batch_payload(self, pairs: Sequence[tuple[Union[tf.Tensor, tf.IndexedSlices], tf.Variable]]) -> Payload:
        """Encodes the gradients of (gradient, variable) `pairs` that share a
        `batch_key` into one payload (with error feedback where kept)."""
        codec = self.codec(pairs[0][1])
        gradients = [tf.convert_to_tensor(g) for g, _ in pairs]
        residuals = [self.residual(v) for _, v in pairs]
        if residuals[0] is None:
            return encode_group(codec, gradients)[0]
        return self.feedback.flat_step(codec, gradients, residuals)[0]  # type: ignore[union-attr]  # a residual means a feedback rule (build)


def _key(variable):
    """A key of a (Keras 3 or tf) variable, by identity."""
    if not isinstance(variable, tf.Variable):
        variable = variable.value  # a Keras 3 variable's tf.Variable
    return variable.ref()


def _megabytes(variable):
    return variable.shape.num_elements() * variable.dtype.size / 1e6


class _ReplicaSumGroup:
    """The codecs of several variables summed by one `all_reduce_group`, seen by an
    error-feedback rule as one batched codec (tensors laid end to end): its "payload" is
    the replicas' sums and its reconstruction this replica's own share of them, so each
    residual keeps what this replica's gradient lost."""

    def __init__(self, group, codecs, replica_context):
        self._group = group
        self._codecs = codecs
        self._context = replica_context

    def encode_and_reconstruct_flat(self, flat, shapes):
        totals, owns, nbytes = self._group(self._codecs, split_flat(flat, shapes),
                                           self._context)
        return (totals, nbytes), concat_flat(owns)
