"""Random-k sparsification: values at random positions that sender and receiver both
derive from a seed the payload carries."""
import zlib
from typing import Any, Mapping, Optional

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base


class RandomK(base.StochasticCodec):
    """Sends about `fraction` of the values, at random positions, without their indices.

    The n values are cut into k = ceil(fraction * n) strata of equal width (the last
    one shorter; fewer strata when k does not divide n evenly) and one position is drawn
    in each, so no position repeats and the positions cost no bits: the payload carries
    the 64-bit seed they are drawn from (a stateless draw, the same on every machine).
    Every value is sent with probability about `fraction`. As it is, biased: run it
    under error feedback, `tfgc.DistributedOptimizer`'s default, which sends every
    value's accumulated residual in time. With `rescale=True` each sent value is
    multiplied by its stratum's width (the inverse of its chance to be sent, about
    1 / fraction), so E[decode] = x (unbiased, `codec.unbiased`) at a variance of
    (width - 1) x_i^2 per value; it is then meant to run without error feedback
    (`error_feedback=False`), as the rand-k of the analyses. A non-finite input decodes
    to NaN everywhere.

    Under Mirrored/MultiWorkerMirroredStrategy `bind` gives each variable a codec whose
    seed follows a step count every replica keeps alike, so all replicas pick the same
    positions and the wire all-reduces the values alone (32 * fraction bits per value
    on the sockets, summed in the compressed domain).

    Args:
      fraction: the share of values sent, in (0, 1].
      seed: an int for reproducible positions, or None for nondeterministic ones (under
        all-reduce strategies replicas must agree: None there means 0).
      rescale: send each value times its stratum's width (unbiased), else as it is.

    Payload: {"values": in x's dtype, "seed": int64 [2], "shape"}.
    """

    def __init__(self, fraction: float = 0.01, seed: Optional[int] = None,
                 rescale: bool = False) -> None:
        fraction = base.check_real(fraction, "RandomK fraction")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"RandomK fraction must be in (0, 1], got {fraction}")
        if not isinstance(rescale, bool):
            raise TypeError(f"RandomK rescale must be True or False, got {rescale!r}")
        super().__init__(seed=seed, name="random_k")
        self.fraction = fraction
        self.rescale = rescale

    # A class attribute in Codec, a property here: it depends on `rescale`.
    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        """Whether E[decode] = x: with `rescale` only."""
        return self.rescale

    def get_config(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "seed": self.seed, "rescale": self.rescale}

    def bind(self, variable: tf.Variable,
             topology: Optional[base.Topology] = None) -> base.Codec:
        """This codec; under all-reduce strategies a `SharedRandomK` for `variable`."""
        if topology is None or topology.all_reduce_replicas <= 1:
            return self
        name = getattr(variable, "name", "variable").split(":")[0]
        return SharedRandomK(self.fraction, self.seed, salt=zlib.crc32(name.encode()),
                             topology=topology, rescale=self.rescale)

    def next_seed(self) -> tf.Tensor:
        """The seed of one encoding's positions, int64 [2]."""
        return self.draw_seed()

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(x, [-1])
        seed = self.next_seed()
        positions, widths = _positions(tf.size(flat, out_type=tf.int64), self.fraction, seed)
        values = tf.gather(flat, positions)
        if self.rescale:
            values = values * tf.cast(widths, x.dtype)
        values = tf.where(base.all_finite(flat), values, tf.constant(float("nan"), x.dtype))
        payload = {"values": values, "seed": seed, "shape": base.shape_of(x)}
        sent = _expand(positions, values, tf.size(flat, out_type=tf.int64))
        return payload, tf.reshape(sent, tf.shape(x))

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        n = tf.cast(n, tf.int64)
        # The values are counted before the positions are drawn: a payload whose values
        # do not match its shape is refused before anything is allocated for the shape.
        values = base.check_size(fields["values"], _strata(n, self.fraction)[2], self.name,
                                 key="values")
        with tf.control_dependencies([values]):
            n = tf.identity(n)
        positions, _ = _positions(n, self.fraction, fields["seed"])
        return tf.reshape(_expand(positions, values, n), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The decoding in the values' dtype (through a float32 vector, for float32,
        float16 and bfloat16) and, per position drawn (a `fraction` of the elements),
        five int64 vectors while drawing and two copies as it is scattered."""
        dtype = fields["values"].dtype
        dense = (4 + base.extra_bytes(dtype)) if dtype in _THROUGH_FLOAT32 else dtype.size
        return dense + 56 * self.fraction


class SharedRandomK(RandomK):
    """`RandomK` bound to one variable under an all-reduce strategy: its seed is
    (seed, salt, step) with the step a count every replica keeps alike, so the
    replicas' payloads share positions and sum value by value (summable)."""

    summable = True

    def __init__(self, fraction: float, seed: Optional[int], salt: int,
                 topology: base.Topology, rescale: bool = False) -> None:
        # Not RandomK's constructor: its random generator would be state (checkpointed,
        # one per variable) that a shared seed never reads. `fraction` was checked by
        # the RandomK that binds this.
        tf.Module.__init__(self, name="random_k")
        self.fraction, self.seed, self.salt = fraction, seed, int(salt)
        self.rescale = rescale
        with self.name_scope:
            self.step = base.replica_state(tf.constant(0, tf.int64), "step", topology)

    def next_seed(self) -> tf.Tensor:
        step = self.step.read_value()
        with tf.control_dependencies([self.step.assign_add(1)]):
            first = tf.constant((self.seed or 0) * 2**32 + self.salt, tf.int64)
            return tf.stack([first, tf.identity(step)])


def _expand(positions, values, n):
    """`values` at `positions` (ascending, within n) and zeros elsewhere, as a vector of
    n; NaN everywhere when a value is not finite (a failed step)."""
    def expanded():
        if values.dtype in _THROUGH_FLOAT32:
            # One pass in C++: tf.scatter_nd ran at 0.2x a one-pass XLA op at 1%.
            dense = tfgc_ops.positions_expand(tf.cast(positions, tf.int32),
                                              tf.cast(values, tf.float32), n)
            return tf.cast(dense, values.dtype)
        return tf.scatter_nd(positions[:, None], values, tf.reshape(n, [1]))

    def failed():
        return tf.fill(tf.reshape(n, [1]), tf.constant(float("nan"), values.dtype))

    return tf.cond(base.all_finite(values), expanded, failed)


def _strata(n, fraction):
    """(the strata's width, their count asked for, their count): range(n) cut into
    ceil(fraction * n) parts of equal width, fewer where that does not divide n (int64
    scalars; no op larger than a scalar)."""
    count = tf.maximum(tf.cast(tf.math.ceil(fraction * tf.cast(n, tf.float64)), tf.int64), 1)
    width = tf.maximum((n + count - 1) // count, 1)
    return width, count, (n + width - 1) // width


def _positions(n, fraction, seed):
    """int64 positions, ascending and distinct: one drawn in each of the strata that cut
    range(n) into ceil(fraction * n) parts of equal width (the last one shorter); and
    the width of each one's stratum."""
    width, _, _ = _strata(n, fraction)
    starts = tf.range(0, n, width, dtype=tf.int64)
    lengths = tf.minimum(width, n - starts)
    draws = tf.random.stateless_uniform(tf.shape(starts), seed, minval=None, maxval=None,
                                        dtype=tf.int64)
    return starts + tf.math.floormod(draws, lengths), lengths


_THROUGH_FLOAT32 = (tf.float32, tf.float16, tf.bfloat16)
_FIELDS = {
    "values": base.FLOAT_VECTOR,
    "seed": base.Field((tf.int64,), rank=1, size=2),
    "shape": base.SHAPE,
}
