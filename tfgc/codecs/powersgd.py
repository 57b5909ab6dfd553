"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r approximation by one step of power
iteration, warm-started, summed in the compressed domain.

A gradient is viewed as a matrix M of [rows, columns] = [product of all dimensions but
the last, the last] (a convolution kernel [kh, kw, cin, cout] is [kh * kw * cin, cout],
as PyTorch's hook shapes it). With Q [columns, r] kept from the previous step:

    P = M Q;  P <- orthonormal columns of P (Gram-Schmidt);  Q = M^T P;  M ~ P Q^T.

Under Mirrored/MultiWorkerMirroredStrategy each replica's P is all-reduced before the
orthogonalisation and each Q after it (two collectives a variable), so the result is
P Q_sum^T = P P^T (sum of the replicas' M): the projection of the summed gradient on a
subspace every replica shares. Error feedback keeps, per replica, what its own M lost
(M - P P^T M, the paper's Algorithm 2); the summed Q is the next step's warm start, the
same on every replica. Under ParameterServerStrategy and in one process the payload
carries P and Q, the receiver multiplies them, and the warm start stays with the sender
(per worker).

P and Q travel as float32, or as bfloat16 with `factors_dtype="bfloat16"` (half the
bytes, as PyTorch's fp16 wrapper around its PowerSGD hook): the rounding of each
sender's own Q is part of what it sent, so error feedback keeps it; the shared P is
rounded before it is made orthonormal, which tilts the subspace every replica shares.

`PowerSGD(...)` holds the settings; `bind(variable)` (called by `DistributedOptimizer`
per compressed variable) returns a `PowerSGDLayer` (a `tf.Module`: Q and the step count
are checkpointed with the optimizer), or, for a variable of rank < 2 or one that rank r
would not shrink by `min_compression_rate`, `NoCompression()` (`Cast("bfloat16")` with
bfloat16 factors, as PyTorch's bf16 wrapper sends the tensors its hook leaves alone).
"""
import zlib
from typing import Any, Optional, Sequence

import tensorflow as tf

from tfgc.codecs import base, identity

#: The dtypes P and Q may travel in.
FACTORS_DTYPES = (tf.float32, tf.bfloat16)

class PowerSGD(base.PerVariableSettings):
    """PowerSGD settings; `bind(variable)` makes the per-variable compressor.

    Args:
      rank: r, the columns of P and Q (PyTorch's default: 1).
      min_compression_rate: a variable is compressed only if rows * columns >=
        min_compression_rate * r * (rows + columns) (PyTorch's default: 2).
      start_step: steps sent uncompressed (all-reduced as they are) before the first
        compressed one; PyTorch suggests about 10% of training.
      seed: seeds Q's first value (the same on every replica, which the all-reduce
        needs).
      factors_dtype: the dtype P and Q (and the gradient before `start_step`) travel
        in: "float32" or "bfloat16" (float32's range, 8 bits of precision, half the
        bytes). float16 is not offered: P = M Q grows with the gradient's square and
        would overflow its range.

    Use with error feedback (`tfgc.DistributedOptimizer`'s default): without it the
    part of each gradient outside the shared subspace is lost for good.
    """

    compiles_with_xla = True

    summable = True
    state = "a warm start per variable"
    layer_class = "PowerSGDLayer"

    def __init__(self, rank: int = 1, min_compression_rate: float = 2.0,
                 start_step: int = 0, seed: int = 0, factors_dtype: str = "float32") -> None:
        self.rank = base.check_integer(rank, "PowerSGD rank", low=1)
        self.min_compression_rate = base.check_real(
            min_compression_rate, "PowerSGD min_compression_rate")
        self.start_step = base.check_integer(start_step, "PowerSGD start_step", low=0)
        self.seed = base.check_integer(seed, "PowerSGD seed", low=0, high=2**31 - 1)
        self.factors_dtype = tf.as_dtype(factors_dtype)
        if self.factors_dtype not in FACTORS_DTYPES:
            raise ValueError(
                "PowerSGD factors_dtype is float32 or bfloat16 (float16's range does not "
                f"hold P = M Q of large gradients), got {self.factors_dtype.name}")

    def get_config(self) -> dict[str, Any]:
        return {"rank": self.rank, "min_compression_rate": self.min_compression_rate,
                "start_step": self.start_step, "seed": self.seed,
                "factors_dtype": self.factors_dtype.name}

    def matrix_shape(self, shape: base.Shape) -> Optional[tuple[int, int]]:
        """(rows, columns) of a gradient of `shape`, or None where it is not compressed
        (rank < 2, unknown dimensions, or less than `min_compression_rate` saved)."""
        shape = tf.TensorShape(shape)
        if shape.rank is None or shape.rank < 2 or not shape.is_fully_defined():
            return None
        columns = shape[-1]
        rows = shape.num_elements() // max(columns, 1)
        if rows * columns < self.min_compression_rate * self.rank * (rows + columns):
            return None
        return rows, columns

    def bind(self, variable: tf.Variable, topology: Optional[base.Topology] = None,
             name: Optional[str] = None) -> base.Codec:
        """A `PowerSGDLayer` for `variable`, or, for one it does not compress, the codec
        that sends it in `factors_dtype` (see the module doc)."""
        if self.matrix_shape(variable.shape) is None:
            # As PyTorch's bfloat16 wrapper, which casts the whole bucket (the tensors
            # the hook sends as they are included) before the hook runs.
            if self.factors_dtype == tf.bfloat16:
                return identity.Cast("bfloat16")
            return identity.NoCompression()
        variable_name = getattr(variable, "name", "variable").split(":")[0]
        return PowerSGDLayer(self, variable.shape,
                             name=name or base.layer_name("powersgd", variable),
                             topology=topology, salt=zlib.crc32(variable_name.encode()))


class PowerSGDLayer(tf.Module, base.Codec):
    """PowerSGD's compressor for one variable (made by `PowerSGD.bind`).

    Under Mirrored/MultiWorkerMirroredStrategy the wire calls `all_reduce_group` for
    all PowerSGD variables of a step (the codec owns the aggregation, error feedback
    around it). Elsewhere it is a codec: `encode` on the sender, `decode` on the
    receiver.

    Payload: {"p": [rows * r], "q": [columns * r], "dense": [0]}, or before `start_step`
    {"p": [0], "q": [0], "dense": the gradient, flat}; all in the settings'
    `factors_dtype`.

    State: q (the warm start, [columns, r]) and step (encodings so far); the sender's
    own, per worker under ParameterServerStrategy.
    """

    compiles_with_xla = True

    summable = True
    keeps_sender_state = True

    def __init__(self, settings: PowerSGD, shape: base.Shape, name: str = "powersgd",
                 topology: Optional[base.Topology] = None, salt: int = 0) -> None:
        tf.Module.__init__(self, name=name)
        topology = topology or base.Topology()
        self.settings = settings
        self.shape = [int(d) for d in tf.TensorShape(shape)]
        matrix = settings.matrix_shape(shape)
        if matrix is None:
            raise ValueError(f"PowerSGD does not compress a variable of shape {self.shape}")
        self.rows, self.columns = matrix
        self.rank = settings.rank
        self.factors_dtype = settings.factors_dtype
        self._fields = {key: base.Field((self.factors_dtype,), rank=1)
                        for key in ("p", "q", "dense")}
        self._salt = salt % 2**31
        with self.name_scope:
            self.q = base.sender_state(self._first_q, "q", topology)
            self.step = base.sender_state(tf.constant(0, tf.int64), "step", topology)

    def get_config(self) -> dict[str, Any]:
        return self.settings.get_config()

    # --- the codec face (one process, ParameterServerStrategy) ---------------------------

    def encode(self, x: tf.Tensor) -> base.Payload:
        return self.encode_and_reconstruct(x)[0]

    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        # The all-reduce's power step, with this sender's own tensors as the sums.
        # P travels too: what was sent is the product of both as the receiver has them.
        first, kept = self._first(x)
        second, computed = self._second(first, kept, p_travels=True)
        sent, _ = self._finish(first, second, kept, computed, x.dtype)
        (p, q), started = computed, kept[2]
        wire = self.factors_dtype
        dense = self._when_started(started, lambda: tf.zeros([0], wire), lambda: first)
        return {"p": _flat(p, started, wire), "q": _flat(q, started, wire), "dense": dense}, sent

    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        """P Q^T (or the dense gradient before `start_step`) in the bound shape."""
        if expected_shape is not None and base.static_dims(expected_shape, self.name) != self.shape:
            raise base.MalformedPayloadError(
                f"{self.name}: decodes tensors of shape {self.shape}, expected "
                f"{base.static_dims(expected_shape, self.name)}")
        fields = base.check_payload(payload, self.name, self._fields)
        p, q, flat = (tf.cast(fields[key], tf.float32) for key in ("p", "q", "dense"))
        rows, columns, rank = self.rows, self.columns, self.rank
        low_rank_sizes, full_sizes = [rows * rank, columns * rank, 0], [0, 0, rows * columns]

        static = [t.shape.num_elements() for t in (p, q, flat)]
        if None not in static:  # a fused message's fields have their sizes in the graph
            if static not in (low_rank_sizes, full_sizes):
                raise base.MalformedPayloadError(
                    f"{self.name} payload: sizes of p, q and dense are {static}, expected "
                    f"{low_rank_sizes} or {full_sizes}")
        else:
            sizes = tf.stack([tf.size(p), tf.size(q), tf.size(flat)])
            check = tf.debugging.Assert(
                tf.logical_or(tf.reduce_all(tf.equal(sizes, low_rank_sizes)),
                              tf.reduce_all(tf.equal(sizes, full_sizes))),
                [f"{self.name} payload: sizes of p, q and dense are", sizes,
                 f"expected {low_rank_sizes} or {full_sizes}"])
            with tf.control_dependencies([check]):
                # Both forms at once, the absent one zeros: a tf.cond whose branch
                # reshaped a vector of unknown length to a static shape would let
                # Grappler take that length as given, for the check above too.
                p, q, flat = (_zero_padded(t, size)
                              for t, size in zip((p, q, flat), (rows * rank, columns * rank,
                                                                rows * columns)))
                static = [rows * rank, columns * rank, rows * columns]
        decoded = 0.0
        if static[0]:
            decoded += tf.matmul(tf.reshape(p, [rows, rank]), tf.reshape(q, [columns, rank]),
                                 transpose_b=True)
        if static[2]:
            decoded += tf.reshape(flat, [rows, columns])
        return tf.reshape(decoded, self.shape)

    # --- the all-reduce face (Mirrored, MultiWorkerMirroredStrategy) ----------------------

    def all_reduce(self, gradient: tf.Tensor, replica_context: tf.distribute.ReplicaContext
                   ) -> tuple[tf.Tensor, tf.Tensor]:
        """`all_reduce_group` of this layer alone, without error feedback: (the
        replicas' summed gradient, approximated; bytes this replica sent)."""
        (total,), _, (nbytes,) = all_reduce_group([self], [gradient], replica_context)
        return total, nbytes

    @staticmethod
    def all_reduce_group(layers: Sequence["PowerSGDLayer"], gradients: Sequence[tf.Tensor],
                         replica_context: tf.distribute.ReplicaContext
                         ) -> tuple[list[tf.Tensor], list[tf.Tensor], list[tf.Tensor]]:
        """The module's `all_reduce_group`: several layers' sums in one set of
        collectives (the wire groups the variables whose codecs offer it)."""
        return all_reduce_group(layers, gradients, replica_context)

    def _first(self, gradient):
        """What this layer puts into the first all-reduce (P = M Q, or M before
        `start_step`, in `factors_dtype`), and what it keeps for the second: (flat
        tensor, (M, Q, started))."""
        gradient = self._checked(gradient)
        matrix = tf.reshape(tf.cast(gradient, tf.float32), [self.rows, self.columns])
        q, started = self._read_state()
        first = self._when_started(started, lambda: tf.reshape(tf.matmul(matrix, q), [-1]),
                                   lambda: tf.reshape(matrix, [-1]))
        return tf.cast(first, self.factors_dtype), (matrix, q, started)

    def _second(self, first_sum, kept, p_travels=False):
        """What it puts into the second all-reduce (in `factors_dtype`), from its part of
        the first's sum, and (P, this replica's Q as sent) in float32; with `p_travels`
        (the codec face) P as sent too."""
        matrix, q, started = kept

        def own_q():
            p = orthonormal(tf.reshape(tf.cast(first_sum, tf.float32), [self.rows, self.rank]))
            if p_travels:
                p = base.round_to(p, self.factors_dtype)
            return p, base.round_to(tf.matmul(matrix, p, transpose_a=True),
                                     self.factors_dtype)

        def no_q():
            return tf.zeros([self.rows, self.rank]), q

        p, local_q = self._when_started(started, own_q, no_q)
        second = self._when_started(started, lambda: tf.reshape(local_q, [-1]),
                                    lambda: tf.zeros([1]))
        return tf.cast(second, self.factors_dtype), (p, local_q)

    def _finish(self, first_sum, second_sum, kept, computed, dtype):
        """(the summed gradient, this replica's share) from both sums; advances the state."""
        matrix, q, started = kept
        p, local_q = computed
        first_sum, second_sum = tf.cast(first_sum, tf.float32), tf.cast(second_sum, tf.float32)
        new_q = self._when_started(
            started, lambda: tf.reshape(second_sum, [self.columns, self.rank]), lambda: q)
        total = self._when_started(started, lambda: tf.matmul(p, new_q, transpose_b=True),
                                   lambda: tf.reshape(first_sum, [self.rows, self.columns]))
        own = self._when_started(started, lambda: tf.matmul(p, local_q, transpose_b=True),
                                 lambda: base.round_to(matrix, self.factors_dtype))
        with tf.control_dependencies(self._advance(new_q, started)):
            total = tf.identity(total)
        return (tf.cast(tf.reshape(total, self.shape), dtype),
                tf.cast(tf.reshape(own, self.shape), dtype))

    # --- state ---------------------------------------------------------------------------

    def _read_state(self):
        """(Q, whether this step compresses), read outside any branch (see
        `base.sender_state`)."""
        started = None
        if self.settings.start_step > 0:
            started = self.step.read_value() >= self.settings.start_step
        return self.q.read_value(), started

    def _when_started(self, started, compressed, dense):
        """`compressed()` from `start_step` on, `dense()` before it (no branch when
        every step compresses)."""
        if started is None:
            return compressed()
        return tf.cond(started, compressed, dense)

    def _first_q(self):
        """Q's first value, and the value of a column that became zero (a zero gradient
        would otherwise keep P = M Q zero for good): the same on every replica, made
        where it is needed (a stateless draw, not a tensor kept from elsewhere)."""
        return tf.random.stateless_normal([self.columns, self.rank],
                                          seed=[self.settings.seed, self._salt])

    def _advance(self, new_q, started):
        """Keeps `new_q` as the next warm start (unless it is not finite: a failed step
        keeps the old one), a zero column replaced by its first value; counts a step."""
        finite = base.all_finite(new_q)
        if started is not None:
            finite = tf.logical_and(finite, started)
        alive = tf.reduce_any(tf.not_equal(new_q, 0.0), axis=0, keepdims=True)
        kept = tf.where(finite, tf.where(alive, new_q, self._first_q()), self.q.read_value())
        return [self.q.assign(kept), self.step.assign_add(1)]

    def _checked(self, x):
        x = base.check_floating(x, self.name)
        if not x.shape.is_compatible_with(self.shape):
            raise ValueError(f"{self.name} was bound to a tensor of shape {self.shape}, "
                             f"got {x.shape}")
        return x


def all_reduce_group(layers: Sequence[PowerSGDLayer], gradients: Sequence[tf.Tensor],
                     replica_context: tf.distribute.ReplicaContext
                     ) -> tuple[list[tf.Tensor], list[tf.Tensor], list[tf.Tensor]]:
    """Sums every replica's `gradients`, one per layer of `layers`, with two all-reduces
    for all of them (PyTorch's batched hook does the same): every layer's P laid end to
    end, then every Q.

    Collectives cannot sit inside tf.cond under MultiWorkerMirroredStrategy, so before
    `start_step` the same two run: the first carries the gradients as they are, the
    second a word per layer.

    Returns:
      ([P Q_sum^T per layer], [this replica's own share P P^T M per layer], [bytes this
      replica sent per layer]), the first two in each gradient's shape and dtype.
    """
    if len({layer.factors_dtype for layer in layers}) > 1:
        raise ValueError("layers summed together send P and Q in one factors_dtype, got "
                         f"{sorted({layer.factors_dtype.name for layer in layers})}")
    sum_ = tf.distribute.ReduceOp.SUM
    firsts, kept = zip(*(layer._first(g) for layer, g in zip(layers, gradients)))
    first_sums = _split_like(replica_context.all_reduce(sum_, base.concat_flat(firsts)), firsts)
    seconds, computed = zip(*(layer._second(part, k)
                              for layer, part, k in zip(layers, first_sums, kept)))
    second_sums = _split_like(replica_context.all_reduce(sum_, base.concat_flat(seconds)),
                              seconds)
    results = [layer._finish(a, b, k, c, tf.convert_to_tensor(g).dtype)
               for layer, a, b, k, c, g in zip(layers, first_sums, second_sums, kept, computed,
                                               gradients)]
    nbytes = [layers[0].factors_dtype.size * (tf.size(a, out_type=tf.int64)
                                              + tf.size(b, out_type=tf.int64))
              for a, b in zip(firsts, seconds)]
    return [total for total, _ in results], [own for _, own in results], nbytes


def _split_like(flat, parts):
    """`flat` cut into pieces as long as `parts` (their lengths known statically or not)."""
    if len(parts) == 1:
        return [flat]
    return tf.split(flat, tf.stack([tf.size(part) for part in parts]))


def orthonormal(matrix: tf.Tensor) -> tf.Tensor:
    """The columns of `matrix` [n, r] made orthonormal by Gram-Schmidt, in order; a
    zero column stays zero.

    Each column is projected off the ones before it twice: once, a column (nearly) in
    their span keeps rounding error along them, which normalising would blow up into a
    column far from orthogonal.
    """
    columns: list[tf.Tensor] = []
    for i in range(matrix.shape[1]):
        column = matrix[:, i]
        for _ in range(2 if columns else 0):
            column = _normalised(column)
            for done in columns:
                column -= tf.reduce_sum(done * column) * done
        columns.append(_normalised(column))
    return tf.stack(columns, axis=1)


def _normalised(column):
    """`column` over its norm; a zero column stays zero. No epsilon is added to the norm
    (PyTorch's hook adds none by default): P = M Q scales with the gradient's square,
    and an epsilon would leave the columns of small gradients (norms near 1e-3 and
    below) unnormalised, their error depending on the gradient's scale.

    The column is divided by its largest magnitude first: the norm of a finite column
    can overflow (a gradient near float32's limit), and a column over an infinite norm
    is zero, which would send a zero product and keep the whole gradient in the
    residual, step after step."""
    scaled = tf.math.divide_no_nan(column, tf.reduce_max(tf.abs(column)))
    return tf.math.divide_no_nan(scaled, tf.norm(scaled))


def _zero_padded(vector, size):
    """`vector` (at most `size` long, checked) with zeros after it up to `size`."""
    return tf.concat([vector, tf.zeros([size])], 0)[:size]


def _flat(matrix, started, dtype):
    """`matrix` flat in `dtype` for the payload, or empty before `start_step`."""
    flat = tf.cast(tf.reshape(matrix, [-1]), dtype)
    if started is None:
        return flat
    return tf.cond(started, lambda: flat, lambda: tf.zeros([0], dtype))
