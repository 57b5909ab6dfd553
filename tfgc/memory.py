"""Error feedback: residual accumulation around any codec (3LC Figure 3, steps 1, 2, a, b).

Each tensor stream (a key, usually a variable's name) owns a residual buffer r:
    total = x + r             (1) accumulate the input into the buffer
    payload = encode(total)   (2) compress the sum
    sent = decode(payload)    (a) what the receiver will see
    r = total - sent          (b) keep what was not sent for the next step
so over any number of steps, sum(sent) + r == sum(x).

Non-finite policy: the residual stays finite whatever the input. When `total - sent`
is not finite, because the gradient held NaN or Inf, or because a finite input
overflowed inside the codec (ThreeLC's M = s * max|x| beyond the dtype's range, a
float16 wire format) and decoded non-finite, the step is handled like a non-finite
gradient: the payload still carries the failure (see tfgc.codecs.base), so a
downstream check sees it, and r is left as it was, so one bad step never poisons
later ones.
"""
import warnings
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, TypeVar, Union

import tensorflow as tf

from tfgc.codecs import base

_Sent = TypeVar("_Sent", covariant=True)
_Rule = TypeVar("_Rule", bound="ResidualFeedback")


class _EncodesFlat(Protocol[_Sent]):
    """What error feedback calls of a codec: a `base.Codec`, or several codecs that act
    as one batched codec (`tfgc.wire.encoder`), whose "payload" is what they send."""

    def encode_and_reconstruct_flat(self, flat: tf.Tensor, shapes: Sequence[base.Shape]
                                    ) -> tuple[_Sent, tf.Tensor]: ...


class ErrorFeedback(tf.Module, base.Codec):
    """Wraps a codec with per-tensor residual accumulation.

    Args:
      codec: any `tfgc.codecs.Codec`.
      name: module name (variables are created under it).

    Residuals are tf.Variables, created on a tensor's first `encode` (or by `residual`
    ahead of time, e.g. outside a tf.function), tracked by this module and so saved by
    `tf.train.Checkpoint`.
    """

    def __init__(self, codec: base.Codec, name: str = "error_feedback") -> None:
        tf.Module.__init__(self, name=name)
        if not isinstance(codec, base.Codec):
            raise TypeError(f"ErrorFeedback wraps a tfgc Codec, got {type(codec).__name__}")
        if codec.unbiased:
            warnings.warn(
                f"ErrorFeedback around {type(codec).__name__}, an unbiased codec: its "
                "errors average out on their own, and a residual only adds a buffer per "
                "tensor (and, for stochastic rounding, variance); use the codec as it is",
                stacklevel=2)
        self.codec = codec
        self.residuals: dict[str, tf.Variable] = {}

    @property
    def summable(self) -> bool:  # type: ignore[override]  # Codec's class attribute
        return self.codec.summable

    def get_config(self) -> dict[str, Any]:
        return {"codec": self.codec}

    def residual(self, key: object, shape: base.Shape, dtype: tf.DType = tf.float32
                 ) -> tf.Variable:
        """The residual variable of stream `key`, created as zeros on first use."""
        key = str(key)
        variable = self.residuals.get(key)
        if variable is None:
            with self.name_scope:
                variable = tf.Variable(
                    tf.zeros(shape, dtype), trainable=False, name=f"residual_{len(self.residuals)}"
                )
            self.residuals[key] = variable
        elif not variable.shape.is_compatible_with(shape) or variable.dtype != dtype:
            raise ValueError(
                f"ErrorFeedback stream {key!r} holds {variable.dtype.name}{variable.shape}, "
                f"got {tf.as_dtype(dtype).name}{tf.TensorShape(shape)}; use one key per tensor"
            )
        return variable

    def encode(self, x: tf.Tensor, key: object = "default") -> base.Payload:
        return self.encode_and_reconstruct(x, key)[0]

    def encode_and_reconstruct(self, x: tf.Tensor, key: object = "default"
                               ) -> tuple[base.Payload, tf.Tensor]:
        """Steps 1, 2, a, b for stream `key`; returns (payload, what the receiver decodes)."""
        x = tf.convert_to_tensor(x)
        return feedback_step(self.codec, x, self.residual(key, x.shape, x.dtype))

    def decode(self, payload: base.Payload, expected_shape: Optional[base.Shape] = None
               ) -> tf.Tensor:
        return self.codec.decode(payload, expected_shape=expected_shape)

    def __repr__(self):
        return f"ErrorFeedback({self.codec!r})"


class ResidualFeedback:
    """The error-feedback rule a `DistributedOptimizer` applies around its codec.

    `DistributedOptimizer(error_feedback=True)` uses `ResidualFeedback()`: 3LC's error
    accumulation as the module docstring gives it. Pass an instance to change the rule:
    `decay` < 1 forgets old error geometrically (step 1 becomes x + decay * r), and a
    subclass may override `accumulate` (register it with `register_feedback` so that
    optimizer configs naming it load). The non-finite policy and step (b) stay.

    Args:
      decay: the factor on the residual in step 1, in (0, 1].
    """

    def __init__(self, decay: float = 1.0) -> None:
        if not 0.0 < float(decay) <= 1.0:
            raise ValueError(f"ResidualFeedback decay must be in (0, 1], got {decay}")
        self.decay = float(decay)

    def get_config(self) -> dict[str, Any]:
        return {"decay": self.decay}

    def accumulate(self, x: tf.Tensor, residual: tf.Tensor) -> tf.Tensor:
        """Step 1: what the codec is given, from the gradient and the residual's value."""
        return x + residual if self.decay == 1.0 else x + self.decay * residual

    def step(self, codec: base.Codec, x: tf.Tensor, residual: Union[tf.Variable, "StagedResidual"]
             ) -> tuple[base.Payload, tf.Tensor]:
        """Steps 1, 2, a, b for one tensor and its residual variable: (payload, sent)."""
        return feedback_step(codec, x, residual, self.accumulate)

    def flat_step(self, codec: _EncodesFlat[_Sent], xs: Sequence[tf.Tensor],
                  residuals: Sequence[Union[tf.Variable, "StagedResidual"]]) -> tuple[_Sent, tf.Tensor]:
        """The same for tensors one batched payload carries: (payload, sent, laid end
        to end)."""
        return feedback_flat_step(codec, xs, residuals, self.accumulate)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


_FEEDBACK_CLASSES = {"ResidualFeedback": ResidualFeedback}


def register_feedback(cls: type[_Rule]) -> type[_Rule]:
    """Makes a `ResidualFeedback` subclass loadable from an optimizer's config."""
    if not (isinstance(cls, type) and issubclass(cls, ResidualFeedback)):
        raise TypeError(f"register_feedback takes a ResidualFeedback subclass, got {cls!r}")
    _FEEDBACK_CLASSES[cls.__name__] = cls
    return cls


def feedback_rule(spec: Union[bool, None, ResidualFeedback, Mapping[str, Any]]
                  ) -> Optional[ResidualFeedback]:
    """The `ResidualFeedback` that `spec` names (an optimizer's `error_feedback`: True,
    False or None, an instance, or its config as `serialize_feedback` gives it), or None
    for no error feedback."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return ResidualFeedback()
    if isinstance(spec, ResidualFeedback):
        return spec
    if isinstance(spec, dict) and spec.get("class_name") in _FEEDBACK_CLASSES:
        return _FEEDBACK_CLASSES[spec["class_name"]](**spec.get("config", {}))
    raise TypeError(
        "error_feedback is True, False, a tfgc.memory.ResidualFeedback or its config (of "
        f"a class registered with register_feedback); got {spec!r}")


def serialize_feedback(rule: Optional[ResidualFeedback]) -> Union[bool, dict[str, Any]]:
    """`error_feedback` for an optimizer's config: a bool for the default rule or none."""
    if rule is None or rule == ResidualFeedback():
        return rule is not None
    return {"class_name": type(rule).__name__, "config": rule.get_config()}


def _add(x, residual):
    return x + residual


def feedback_step(codec: base.Codec, x: tf.Tensor, residual: Union[tf.Variable, "StagedResidual"],
                  accumulate: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] = _add
                  ) -> tuple[base.Payload, tf.Tensor]:
    """Steps 1, 2, a, b with `residual` (a variable of x's shape); returns (payload, sent).
    `accumulate(x, residual value)` is step 1."""
    total = accumulate(x, residual.read_value())
    payload, sent = codec.encode_and_reconstruct(total)
    _keep_unsent(total, sent, residual)
    return payload, sent


def feedback_batch_step(codec: base.Codec, xs: Sequence[tf.Tensor], residuals: Sequence[Union[tf.Variable, "StagedResidual"]]
                        ) -> tuple[base.Payload, list[tf.Tensor]]:
    """`feedback_step` for a list of tensors encoded into one payload by a batched
    codec (`codec.batched`), each with its own residual; returns (payload, [sent])."""
    payload, sent = feedback_flat_step(codec, xs, residuals)
    return payload, base.split_flat(sent, [x.shape for x in xs])


def feedback_flat_step(codec: _EncodesFlat[_Sent], xs: Sequence[tf.Tensor],
                       residuals: Sequence[Union[tf.Variable, "StagedResidual"]],
                       accumulate: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] = _add
                       ) -> tuple[_Sent, tf.Tensor]:
    """`feedback_batch_step` with what was sent laid end to end: (payload, sent).

    The tensors are summed, encoded and kept as one vector (`encode_and_reconstruct_flat`),
    so a traced step takes a few ops per tensor (its reshapes, residual read and assign)
    rather than a dozen; each residual still follows the non-finite policy on its own.
    """
    shapes = [tf.TensorShape(x.shape) for x in xs]
    olds = base.concat_flat([residual.read_value() for residual in residuals])
    totals = accumulate(base.concat_flat(xs), olds)
    payload, sent = codec.encode_and_reconstruct_flat(totals, shapes)
    unsent = totals - sent
    # One finite check per tensor (a non-finite element anywhere in it keeps its whole
    # residual), spread back over its elements.
    sizes = [shape.num_elements() for shape in shapes]
    owner = tf.repeat(tf.range(len(sizes)), sizes)
    kept = tf.math.unsorted_segment_min(tf.cast(tf.math.is_finite(unsent), tf.int32), owner,
                                        num_segments=len(sizes)) > 0
    news = tf.where(tf.gather(kept, owner), unsent, olds)
    for residual, new in zip(residuals, base.split_flat(news, shapes)):
        residual.assign(new)
    return payload, sent


def _keep_unsent(total, sent, residual):
    """Steps a, b: the residual becomes what was not sent, or keeps its value when that
    is not finite."""
    # One check covers a non-finite input, a non-finite decoding and their difference
    # overflowing (inf - x and NaN - x are not finite).
    unsent = total - sent
    residual.assign(tf.where(base.all_finite(unsent), unsent, residual))


class StagedResidual:
    """A residual's value read now, whose new value is held rather than written.

    Error feedback reads a residual and assigns it; where that happens in a branch of a
    step that must not touch the variable (a per-worker variable is not reachable from a
    branch's function under ParameterServerStrategy), the branch is given this instead,
    returns `value`, and the caller writes it.

    Args:
      value: the residual's current value (a tensor).
    """

    def __init__(self, value: tf.Tensor) -> None:
        self.value = tf.convert_to_tensor(value)

    @property
    def shape(self) -> tf.TensorShape:
        return self.value.shape

    @property
    def dtype(self) -> tf.DType:
        return self.value.dtype

    def read_value(self) -> tf.Tensor:
        return self.value

    def assign(self, value: tf.Tensor) -> None:
        self.value = tf.convert_to_tensor(value)


tf.register_tensor_conversion_function(
    StagedResidual, lambda staged, dtype=None, name=None, as_ref=False: staged.value)
