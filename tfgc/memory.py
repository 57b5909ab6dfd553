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

import tensorflow as tf

from tfgc.codecs import base


class ErrorFeedback(tf.Module, base.Codec):
    """Wraps a codec with per-tensor residual accumulation.

    Args:
      codec: any `tfgc.codecs.Codec`.
      name: module name (variables are created under it).

    Residuals are tf.Variables, created on a tensor's first `encode` (or by `residual`
    ahead of time, e.g. outside a tf.function), tracked by this module and so saved by
    `tf.train.Checkpoint`.
    """

    def __init__(self, codec, name="error_feedback"):
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
        self.residuals = {}

    @property
    def summable(self):
        return self.codec.summable

    def get_config(self):
        return {"codec": self.codec}

    def residual(self, key, shape, dtype=tf.float32):
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

    def encode(self, x, key="default"):
        return self.encode_and_reconstruct(x, key)[0]

    def encode_and_reconstruct(self, x, key="default"):
        """Steps 1, 2, a, b for stream `key`; returns (payload, what the receiver decodes)."""
        x = tf.convert_to_tensor(x)
        return feedback_step(self.codec, x, self.residual(key, x.shape, x.dtype))

    def decode(self, payload, expected_shape=None):
        return self.codec.decode(payload, expected_shape=expected_shape)

    def __repr__(self):
        return f"ErrorFeedback({self.codec!r})"


def feedback_step(codec, x, residual):
    """Steps 1, 2, a, b with `residual` (a variable of x's shape); returns (payload, sent)."""
    total = x + residual
    payload, sent = codec.encode_and_reconstruct(total)
    _keep_unsent(total, sent, residual)
    return payload, sent


def feedback_batch_step(codec, xs, residuals):
    """`feedback_step` for a list of tensors encoded into one payload by a batched
    codec (`codec.batched`), each with its own residual; returns (payload, [sent])."""
    payload, sent = feedback_flat_step(codec, xs, residuals)
    return payload, base.split_flat(sent, [x.shape for x in xs])


def feedback_flat_step(codec, xs, residuals):
    """`feedback_batch_step` with what was sent laid end to end: (payload, sent).

    The tensors are summed, encoded and kept as one vector (`encode_and_reconstruct_flat`),
    so a traced step takes a few ops per tensor (its reshapes, residual read and assign)
    rather than a dozen; each residual still follows the non-finite policy on its own.
    """
    shapes = [tf.TensorShape(x.shape) for x in xs]
    olds = base.concat_flat([residual.read_value() for residual in residuals])
    totals = base.concat_flat(xs) + olds
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
