"""Scaled sign: one bit per value and one scale per tensor (EF-SignSGD, Karimireddy et
al. 2019)."""
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

import tfgc_ops
from tfgc.codecs import base, bitpack


class ScaledSign(base.ReconstructingCodec):
    """Sends sign(x) packed one bit per value and the scale ||x||_1 / n.

    Every value decodes to +scale or -scale (zero counts as positive), so the decoding
    has x's l1 norm. Biased: under `tfgc.DistributedOptimizer`'s error feedback (the
    default) this is EF-SignSGD; without it, signSGD with a scale. Compared with
    `OneBit`, which dequantizes each side to its own mean, the two sides share one
    magnitude. The bits and the sums come from one C++ pass (`tfgc_ops.sign_bits_encode`,
    sums in double).

    Payload: {"data": sign bits, "scale": in x's dtype, "shape"}.
    """

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        data, sums, _ = tfgc_ops.sign_bits_encode(flat)
        return self._sign_payload(x, flat, data, sums)

    def _sign_payload(self, x, flat, data, sums):
        """The payload and reconstruction of x (float32 values `flat`) from its sign bits
        and side sums (`tfgc_ops.sign_bits_encode`)."""
        n = tf.cast(tf.maximum(tf.size(flat), 1), tf.float64)
        finite = tf.reduce_all(tf.math.is_finite(sums))
        scale = base.nan_unless(finite, tf.cast((sums[0] - sums[1]) / n, tf.float32))
        scale = base.round_to(scale, x.dtype)
        payload = {"data": data, "scale": tf.cast(scale, x.dtype), "shape": base.shape_of(x)}
        values = tf.where(flat >= 0, scale, -scale)
        return payload, tf.cast(tf.reshape(values, tf.shape(x)), x.dtype)

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        fields, dims, n = base.checked_payload(self, payload, _FIELDS, expected_shape)
        data = base.check_size(fields["data"], bitpack.packed_size(n, 1), self.name)
        scale = fields["scale"]
        positive = bitpack.unpack_bits(data, 1, n) > 0
        return tf.reshape(tf.where(positive, scale, -scale), dims)

    def decoded_bytes_per_element(self, fields: Mapping[str, tf.Tensor]) -> float:
        """The unpacked bits (int32, then bool) and the decoding."""
        return 4 + 1 + fields["scale"].dtype.size


_FIELDS = {"data": base.BYTES, "scale": base.FLOAT_SCALAR, "shape": base.SHAPE}


class Signum(base.PerVariableSettings):
    """Signum (Bernstein et al. 2018): the scaled sign of a momentum each sender keeps.

    Per variable the sender keeps m <- beta m + g (the heavy-ball momentum of SGD, so
    that at one learning rate this codec with momentum-free SGD steps as far as SGD with
    momentum beta would) and sends `ScaledSign` of m: sign(m) at one bit a value and the
    scale ||m||_1 / n. The receivers sum the senders' decodings, or with
    `majority_vote` take the paper's majority vote: the sign of the sum of the senders'
    signs, times the sum of their scales (so that senders who agree give what the sum
    would); a tie gives 0, and a NaN scale (a failed step) NaN.

    Wrap an optimizer without momentum of its own (the momentum is here, before the
    compression; `tfgc.DistributedOptimizer` warns otherwise). Signum keeps no residual
    (`supports_error_feedback` is False): what the sign drops is not sent later; for
    that, use `ScaledSign` with error feedback (EF-SignSGD).

    `bind(variable)` (called by `DistributedOptimizer` per compressed variable) returns a
    `SignumLayer`, whose momentum is checkpointed with the optimizer. Under all-reduce
    strategies each replica keeps its own momentum and a checkpoint keeps the first
    replica's: on resume every replica starts from it. Under ParameterServerStrategy
    each worker keeps its own and a resumed or restarted worker starts from zero.

    Args:
      momentum: beta, in [0, 1); 0 makes it `ScaledSign` without error feedback
        (signSGD with a scale).
      majority_vote: combine the senders' signs by majority vote (Bernstein et al.
        2019) under Mirrored/MultiWorkerMirroredStrategy, where every replica gathers
        every replica's payload. Not under ParameterServerStrategy, where a server
        applies each worker's push alone (NotImplementedError at `bind`).
    """

    supports_error_feedback = False
    momentum_on_sender = True
    state = "a momentum per variable"
    layer_class = "SignumLayer"

    def __init__(self, momentum: float = 0.9, majority_vote: bool = False) -> None:
        self.momentum = base.check_real(momentum, "Signum momentum")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"Signum momentum must be in [0, 1), got {momentum!r}")
        if not isinstance(majority_vote, bool):
            raise TypeError(f"Signum majority_vote must be a bool, got {majority_vote!r}")
        self.majority_vote = majority_vote

    def get_config(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "majority_vote": self.majority_vote}

    def bind(self, variable: tf.Variable, topology: Optional[base.Topology] = None,
             name: Optional[str] = None) -> "SignumLayer":
        """The `SignumLayer` that keeps `variable`'s momentum.

        Raises:
          NotImplementedError: majority_vote under ParameterServerStrategy.
        """
        if self.majority_vote and topology is not None and topology.parameter_server:
            raise NotImplementedError(
                "Signum's majority vote needs every worker's signs at once; under "
                "ParameterServerStrategy a server applies each worker's push alone: use "
                "Signum(majority_vote=False) there")
        return SignumLayer(self, variable.shape, name=name or base.layer_name("signum", variable),
                           topology=topology)


class SignumLayer(tf.Module, ScaledSign):
    """Signum's compressor for one variable (made by `Signum.bind`): its payload and
    decoding are `ScaledSign`'s, of the momentum rather than the gradient.

    Non-finite policy: a step whose momentum would not be finite keeps the old one and
    sends a NaN scale (the payload carries the failure, as every codec's does).
    """

    supports_error_feedback = False
    keeps_sender_state = True
    momentum_on_sender = True

    def __init__(self, settings: Signum, shape: base.Shape, name: str = "signum",
                 topology: Optional[base.Topology] = None) -> None:
        tf.Module.__init__(self, name=name)
        self.settings = settings
        self.shape = tf.TensorShape(shape)
        if not self.shape.is_fully_defined():
            raise ValueError(f"Signum binds to variables of a known shape, got {self.shape}")
        with self.name_scope:
            self.momentum = base.sender_state(tf.zeros(self.shape, tf.float32), "momentum",
                                              topology or base.Topology())

    def get_config(self) -> dict[str, Any]:
        return self.settings.get_config()

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        x = base.check_floating(x, self.name)
        if not x.shape.is_compatible_with(self.shape):
            raise ValueError(f"{self.name} was bound to a tensor of shape {self.shape}, "
                             f"got {x.shape}")
        old = self.momentum.read_value()
        if x.dtype == tf.float32:
            # One C++ pass: the new momentum, its sign bits and side sums (the floats,
            # bits and sums of the TensorFlow ops below, which took 3-4 passes more).
            new, data, sums, _ = tfgc_ops.momentum_sign_bits_encode(
                tf.reshape(old, [-1]), tf.reshape(x, [-1]), self.settings.momentum)
            finite = tf.reduce_all(tf.math.is_finite(sums))  # every new value is finite
            kept = tf.cond(finite, lambda: self._keep(tf.reshape(new, self.shape)),
                           lambda: tf.constant(False))
            with tf.control_dependencies([kept]):
                return self._sign_payload(x, new, data, sums)
        new = self.settings.momentum * old + tf.cast(x, tf.float32)
        kept = self.momentum.assign(tf.where(base.all_finite(new), new, old))
        with tf.control_dependencies([kept]):
            payload, sent = ScaledSign.encode_and_reconstruct(self, tf.cast(new, x.dtype))
        return payload, sent

    def _keep(self, momentum):
        """Assigns the new momentum; True once it is assigned."""
        with tf.control_dependencies([self.momentum.assign(momentum, read_value=False)]):
            return tf.constant(True)

    def combine(self, decodings: Sequence[tf.Tensor]) -> tf.Tensor:
        """The senders' decodings summed, or with `majority_vote` the sign of the sum of
        their signs times the sum of their scales (each decoding is +-its scale)."""
        if not self.settings.majority_vote:
            return ScaledSign.combine(self, decodings)
        votes = tf.add_n([tf.sign(decoded) for decoded in decodings])
        scales = tf.add_n([tf.reduce_max(tf.abs(decoded)) for decoded in decodings])
        return tf.sign(votes) * scales
