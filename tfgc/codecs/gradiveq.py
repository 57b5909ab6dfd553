"""GradiVeQ (Yu et al., NeurIPS 2018): PCA vector quantization summed in the compressed domain.

A convolution kernel's gradient, shape (H, W, D, F), is flattened as the paper's
Fig. 3(a): the F gradients at one (h, w, d) are adjacent, then depth, then width, then
height, which is exactly the row-major order of the (H, W, D, F) array. The flat
gradient is cut into S slices of K adjacent values, K a multiple of F * D. Every slice
m is compressed with a linear map learned by PCA (Eq. 3 and 5):

    encode:  g'_n = U_d^T (g_n - mu / N)       (d numbers per K values)
    decode:  g_hat = U_d (sum_n g'_n) + mu

Because the map is affine with the mean split N ways, the sum of the N workers'
encodings is the encoding of the summed gradient (Eq. 4): the all-reduce adds d-vectors
and one decode follows. U_d (K x d) and mu (K) come from L_t samples of the *aggregated*
slice: mu is their mean, U_d the d leading eigenvectors of their covariance, d the
smallest with retained variance >= 1 - lambda (Eq. 6). With reuse factor s, slices
are grouped s at a time and each group uses the compressor of its first slice (the
paper's s = infinity, one compressor per layer, is the default).

Training follows the paper's schedule per layer: `warmup_steps` uncompressed steps, then
cycles of `sampling_steps` (L_t) steps aggregated with 4-bit QSGD whose decoded sums are
the PCA samples, and `compressed_steps` (L_c) steps of GradiVeQ. Optionally a
compressed phase ends early when a majority of workers see a local relative compression
loss (Eq. 7) above `early_stop_loss`.

Under ParameterServerStrategy (asynchronous) the state lives on a parameter server:
each worker encodes its own gradient (N = 1), the parameter server decodes it and
advances the schedule once per push (so warm-up and L_t, L_c count pushes, and the
samples are single workers' gradients), and each worker keeps a copy of U and mu that it
pulls once per refresh. A compressed push still in flight across a whole sampling phase
would be decoded with the new compressor; with L_t pushes in between this needs a
worker that stalls for L_t of its peers' steps. The parameter server advances the
schedule one push at a time (a `tf.CriticalSection` around each decode's update of the
counters), so two pushes decoded at the same moment cannot both end a sampling phase;
a push encoded in an earlier phase is not a sample (that sampling phase runs longer).

`GradiVeQ(...)` holds the settings; `bind(variable)` (called by `DistributedOptimizer`
for each compressed variable) returns the per-layer `GradiVeQLayer`, a `tf.Module`
whose state (U_d, mu, d, phase, counters, samples) lives in tf.Variables that every
replica updates identically from the same aggregated values (every worker sums the
same payloads in the same order and runs the same PCA; this assumes the same
TensorFlow build on every worker, and the cluster test checks the states match), so it
is checkpointed with the optimizer. Variables that are not 4-D pass through
uncompressed, as in the paper.

Static shapes: d changes at every PCA refresh, but the payload is sliced to the current
d at run time (`U[:, :d]`, d read from a variable), so nothing is retraced and the wire
carries exactly S * d floats. U is stored padded to d_max = min(K, L_t) columns, the
most PCA over L_t samples can use. The all-reduce face is in
tfgc.codecs.gradiveq_all_reduce.
"""
import functools
from typing import Any, Optional, Sequence

import tensorflow as tf

from tfgc.codecs import base, identity
from tfgc.codecs.gradiveq_all_reduce import AllReduceFace
from tfgc.codecs.gradiveq_schedule import (  # noqa: F401  (PHASES: public)
    COMPRESSED, PHASES, SAMPLING, WARMUP, Schedule, plain_python,
)
from tfgc.codecs.stochastic import QSGD, SeededQSGD


class GradiVeQ(base.PerVariableSettings):
    """GradiVeQ settings; `bind(variable)` makes the per-layer compressor.

    Args:
      loss_threshold: lambda of Eq. 6: d is the smallest dimension that keeps at least
        1 - lambda of the samples' variance.
      slice_multiple: K = slice_multiple * F * D values per slice; must divide H * W.
        None: the kernel width W (the paper's 768 = 3 * 16 * 16 for (3, 3, 16, 16)).
      reuse: compressor reuse factor s: consecutive slices sharing one compressor,
        computed from the first of them. None: one per layer (s = infinity).
      warmup_steps: uncompressed steps before the first sampling phase (paper: 2500).
      sampling_steps: L_t, QSGD-aggregated steps whose sums are the PCA samples
        (paper: 100); at least 2. d can be at most min(K, L_t).
      compressed_steps: L_c, GradiVeQ steps between two sampling phases (paper: 400).
      early_stop_loss: None, or a relative loss ||g - g_hat||^2 / ||g||^2 (Eq. 7,
        computed by each worker on its own gradient) above which a worker votes to end
        the compressed phase; a majority of votes ends it after this step.
      sampling_bits: QSGD bits during sampling (paper: 4); None aggregates the samples
        uncompressed (fp32), as in the paper's section 2.
      sampling_bucket_size: QSGD bucket size during sampling.
      seed: seed for QSGD's stochastic rounding (None: nondeterministic).
      centred: PCA of the centred samples with mu their mean, as the paper (True), or
        of the samples as they are with mu = 0 (False): U_d then spans the samples'
        leading directions including their mean, and no mean is added back. The
        paper's decode adds the sampling phase's mean gradient to every compressed
        step's; that mean goes stale over L_c steps, and its part outside U_d's span
        is a constant push in a past direction. Without it ResNet-20 trained
        markedly better at 2,000 steps (`docs/results/gradiveq.md`).
      pool_slices: PCA over every slice of a group at each sampling step (s * L_t
        samples) instead of the group's first slice only (the paper's, False). The
        slices share one compressor (the paper's spatial consistency, Fig. 5); pooling
        them lets d grow to min(K, s * L_t), so U_d spans more of later gradients, for
        more floats per compressed step. Needs s to divide the layer's S slices.

    Use with `tfgc.DistributedOptimizer(..., error_feedback=False)`: under error
    feedback the part of each gradient outside U_d's span is never sent, so the residual
    grows without bound and training diverged in `docs/results/gradiveq.md`
    (under Mirrored/MultiWorkerMirroredStrategy the codec owns the aggregation and error
    feedback is not applied anyway).
    """

    summable = True
    #: Error feedback makes GradiVeQ diverge (see above); optimizers may skip it.
    supports_error_feedback = False
    state = "a compressor per layer"
    layer_class = "GradiVeQLayer"

    def __init__(
        self,
        loss_threshold: float = 0.01,
        slice_multiple: Optional[int] = None,
        reuse: Optional[int] = None,
        warmup_steps: int = 2500,
        sampling_steps: int = 100,
        compressed_steps: int = 400,
        early_stop_loss: Optional[float] = None,
        sampling_bits: Optional[int] = 4,
        sampling_bucket_size: int = 512,
        seed: Optional[int] = None,
        centred: bool = True,
        pool_slices: bool = False,
    ) -> None:
        check = base.check_integer
        loss_threshold = base.check_real(loss_threshold, "GradiVeQ loss_threshold")
        if not 0.0 <= loss_threshold < 1.0:
            raise ValueError(f"GradiVeQ loss_threshold must be in [0, 1), got {loss_threshold}")
        if slice_multiple is not None:
            slice_multiple = check(slice_multiple, "GradiVeQ slice_multiple", low=1)
        if reuse is not None:
            reuse = check(reuse, "GradiVeQ reuse (or None)", low=1)
        warmup_steps = check(warmup_steps, "GradiVeQ warmup_steps", low=0)
        sampling_steps = check(sampling_steps, "GradiVeQ sampling_steps (L_t)", low=2)
        compressed_steps = check(compressed_steps, "GradiVeQ compressed_steps (L_c)", low=1)
        if early_stop_loss is not None:
            early_stop_loss = base.check_real(early_stop_loss, "GradiVeQ early_stop_loss")
            if early_stop_loss <= 0:
                raise ValueError(
                    f"GradiVeQ early_stop_loss must be > 0 or None, got {early_stop_loss}")
        sampling_bucket_size = check(sampling_bucket_size, "GradiVeQ sampling_bucket_size",
                                     low=1)
        if sampling_bits is not None:
            QSGD(bits=sampling_bits, bucket_size=sampling_bucket_size, seed=0)  # validates them
            sampling_bits = int(sampling_bits)
        self.loss_threshold = loss_threshold
        self.slice_multiple = slice_multiple
        self.reuse = reuse
        self.warmup_steps = warmup_steps
        self.sampling_steps = sampling_steps
        self.compressed_steps = compressed_steps
        self.early_stop_loss = early_stop_loss
        self.sampling_bits = sampling_bits
        self.sampling_bucket_size = sampling_bucket_size
        self.seed = seed
        self.centred = bool(centred)
        self.pool_slices = bool(pool_slices)

    def get_config(self) -> dict[str, Any]:
        return {
            "loss_threshold": self.loss_threshold,
            "slice_multiple": self.slice_multiple,
            "reuse": self.reuse,
            "warmup_steps": self.warmup_steps,
            "sampling_steps": self.sampling_steps,
            "compressed_steps": self.compressed_steps,
            "early_stop_loss": self.early_stop_loss,
            "sampling_bits": self.sampling_bits,
            "sampling_bucket_size": self.sampling_bucket_size,
            "seed": self.seed,
            "centred": self.centred,
            "pool_slices": self.pool_slices,
        }

    def bind(self, variable: tf.Variable, topology: Optional[base.Topology] = None,
             name: Optional[str] = None) -> base.Codec:
        """The compressor for `variable`: a `GradiVeQLayer` for 4-D (conv) kernels,
        `NoCompression()` for anything else (the paper compresses conv layers only)."""
        shape = tf.TensorShape(variable.shape)
        if shape.rank != 4 or not shape.is_fully_defined():
            return identity.NoCompression()
        name = name or base.layer_name("gradiveq", variable, unnamed="kernel")
        return GradiVeQLayer(self, shape, name=name, topology=topology)


class GradiVeQLayer(AllReduceFace, Schedule, tf.Module, base.Codec):
    """GradiVeQ's compressor and schedule for one (H, W, D, F) convolution kernel.

    Made by `GradiVeQ.bind`. Under Mirrored/MultiWorkerMirroredStrategy the optimizer
    calls `all_reduce` (the codec owns the aggregation). Elsewhere (one process, or
    ParameterServerStrategy) it is used as a codec: `encode` on the sender, `decode` on
    the receiver; `decode` is where the schedule advances (one call is one step) and
    where the sampling phase's decoded gradients become PCA samples, since the receiver
    is the one that sees what was aggregated. Payloads are
    {"phase", "dense", "coefficients", "qsgd_data", "qsgd_norms"} (+ "votes" with early
    stopping); the tensors a phase does not use are empty.

    Attributes (Python ints): kernel_shape, slice_size (K), num_slices (S), reuse (s),
    num_groups (G = ceil(S / s), compressors per layer), pooled_slices (n), max_dim
    (d_max = min(K, n * L_t)).
    State (tf.Variables): step, phase, phase_step, dim (d), basis (U, [G, K, d_max]),
    mean (mu, [G, K]), samples ([L_t * n, G, K], n = s with pool_slices, else 1: row
    t * n + i holds slice i of each group at sampling step t), retained ([G], variance
    kept by d at the last refresh), refreshes, early_stops.
    """

    summable = True
    keeps_sender_state = True
    supports_error_feedback = False

    def __init__(self, settings: GradiVeQ, kernel_shape: Sequence[int],
                 name: str = "gradiveq", topology: Optional[base.Topology] = None) -> None:
        tf.Module.__init__(self, name=name)
        topology = topology or base.Topology()
        self.settings = settings
        self.kernel_shape = [int(n) for n in kernel_shape]
        h, w, depth, filters = self.kernel_shape
        multiple = settings.slice_multiple or w
        if (h * w) % multiple:
            raise ValueError(
                f"GradiVeQ slice_multiple={multiple} must divide H * W = {h * w} for kernel "
                f"{tuple(self.kernel_shape)} (K = slice_multiple * F * D)"
            )
        self.num_elements = h * w * depth * filters
        self.slice_size = multiple * filters * depth
        self.num_slices = self.num_elements // self.slice_size
        self.reuse = min(settings.reuse or self.num_slices, self.num_slices)
        self.num_groups = -(-self.num_slices // self.reuse)
        self.pooled_slices = self.reuse if settings.pool_slices else 1
        if settings.pool_slices and self.num_slices % self.reuse:
            raise ValueError(
                f"GradiVeQ pool_slices needs reuse={self.reuse} to divide the "
                f"{self.num_slices} slices of kernel {tuple(self.kernel_shape)}")
        self.max_dim = min(self.slice_size, settings.sampling_steps * self.pooled_slices)
        self.sampler = None
        if settings.sampling_bits is not None:
            self.sampler = SeededQSGD(settings.sampling_bits, settings.sampling_bucket_size)
        self._seed = settings.seed
        g, k = self.num_groups, self.slice_size
        first = WARMUP if settings.warmup_steps > 0 else SAMPLING
        with self.name_scope:
            def state(initial_value, name):
                return base.replica_state(initial_value, name, topology)

            self.step = state(tf.constant(0, tf.int64), "step")
            self.phase = state(tf.constant(first, tf.int32), "phase")
            self.phase_step = state(tf.constant(0, tf.int32), "phase_step")
            self.dim = state(tf.constant(self.max_dim, tf.int32), "dim")
            self.basis = state(tf.zeros([g, k, self.max_dim]), "basis")
            self.mean = state(tf.zeros([g, k]), "mean")
            self.samples = state(
                tf.zeros([settings.sampling_steps * self.pooled_slices, g, k]), "samples")
            self.retained = state(tf.zeros([g]), "retained")
            self.refreshes = state(tf.constant(0, tf.int64), "refreshes")
            self.early_stops = state(tf.constant(0, tf.int64), "early_stops")
            # Under ParameterServerStrategy the state lives on a parameter server; each
            # worker keeps a copy of U and mu that it refreshes once per PCA refresh,
            # so a compressed push does not first pull K x d_max floats.
            self._worker_copy = None
            if topology.parameter_server:
                # Zeros made on each worker, not copied to it from the coordinator.
                self._worker_copy = {
                    "basis": base.sender_state(functools.partial(tf.zeros, [g, k, self.max_dim]),
                                               "worker_basis", topology),
                    "mean": base.sender_state(functools.partial(tf.zeros, [g, k]),
                                              "worker_mean", topology),
                    "version": base.sender_state(tf.constant(0, tf.int64), "worker_version",
                                                 topology),
                }
            # Pushes that the parameter server decodes at the same moment advance the
            # schedule one at a time (else two could both end a sampling phase).
            self._schedule_lock = None
            if topology.parameter_server:
                with tf.device(self.phase.device):
                    self._schedule_lock = tf.CriticalSection(name="schedule_lock")

    def get_config(self) -> dict[str, Any]:
        return self.settings.get_config()

    # --- slicing and the linear map (Eq. 3, 5) -------------------------------------------

    def slices(self, x: tf.Tensor) -> tf.Tensor:
        """[H, W, D, F] -> [S, K] float32: row-major order is Fig. 3(a)'s flattening."""
        return tf.reshape(tf.cast(x, tf.float32), [self.num_slices, self.slice_size])

    def _grouped(self, rows):
        """[S, c] -> [G, s, c], zero rows padding the last group."""
        pad = self.num_groups * self.reuse - self.num_slices
        rows = tf.pad(rows, [[0, pad], [0, 0]])
        return tf.reshape(rows, [self.num_groups, self.reuse, -1])

    def _ungrouped(self, grouped):
        return tf.reshape(grouped, [self.num_groups * self.reuse, -1])[: self.num_slices]

    def compress(self, slices: tf.Tensor, num_workers: int = 1,
                 compressor: Optional[tuple[tf.Tensor, tf.Tensor]] = None) -> tf.Tensor:
        """Eq. 3: [S, K] slices -> [S, d] coefficients U_d^T (g - mu / N), with
        `compressor` = (U, mu) (default: the state's)."""
        basis, mean = compressor or (self.basis, self.mean)
        basis = basis[:, :, : self.dim.read_value()]
        centered = self._grouped(slices) - mean[:, None, :] / tf.cast(num_workers, tf.float32)
        return self._ungrouped(tf.einsum("gsk,gkd->gsd", centered, basis))

    def _sender_compressor(self):
        """(U, mu) as the sender reads them: under PSS the worker's copy, brought up to
        date first; else None (the state itself)."""
        if self._worker_copy is None:
            return None
        copy = self._worker_copy
        # Per-worker variables are only touched here, outside tf.cond: a worker function
        # does not resolve them inside nested branch functions.
        version = self.refreshes.read_value()
        stale = tf.not_equal(copy["version"].read_value(), version)
        local = (copy["basis"].read_value(), copy["mean"].read_value())
        basis, mean = tf.cond(stale, lambda: (tf.identity(self.basis), tf.identity(self.mean)),
                              lambda: local)
        with tf.control_dependencies([copy["basis"].assign(basis), copy["mean"].assign(mean),
                                      copy["version"].assign(version)]):
            return tf.identity(basis), tf.identity(mean)

    def decompress(self, coefficients: tf.Tensor, num_workers: int = 1,
                   compressor: Optional[tuple[tf.Tensor, tf.Tensor]] = None) -> tf.Tensor:
        """Eq. 5 (Eq. 7's local form for num_workers > 1): [S, d] -> [S, K] slices
        U_d g' + mu / num_workers, with `compressor` = (U, mu) (default: the state's)."""
        basis, mean = compressor or (self.basis, self.mean)
        basis = basis[:, :, : tf.shape(coefficients)[1]]
        grouped = tf.einsum("gsd,gkd->gsk", self._grouped(coefficients), basis)
        return self._ungrouped(grouped + mean[:, None, :] / tf.cast(num_workers, tf.float32))

    # --- the codec face (one process, ParameterServerStrategy) ---------------------------

    @plain_python
    def encode(self, x: tf.Tensor) -> base.Payload:
        return self._encode(x, num_workers=1)

    @plain_python
    def encode_and_reconstruct(self, x: tf.Tensor) -> tuple[base.Payload, tf.Tensor]:
        payload = self._encode(x, num_workers=1)
        return payload, self._reconstruct(payload)

    @plain_python
    def decode(self, payload: base.Payload,
               expected_shape: Optional[base.Shape] = None) -> tf.Tensor:
        """Decodes `payload` and advances the schedule by one step (see the class doc).

        The decoding has the bound kernel's shape; `expected_shape`, if given, must be it.
        """
        if expected_shape is not None:
            expected = base.static_dims(expected_shape, self.name)
            if expected != self.kernel_shape:
                raise base.MalformedPayloadError(
                    f"{self.name}: decodes kernels of shape {self.kernel_shape}, expected "
                    f"{expected}")
        payload = self._checked_coefficients(
            base.check_payload(payload, self.name, self._payload_fields()))
        total = self._reconstruct(payload)
        votes = payload.get("votes")
        votes = tf.reduce_sum(votes) if votes is not None else tf.constant(0.0)
        is_sample = tf.equal(payload["phase"], SAMPLING)

        def advance():
            # The schedule moves on from the state's phase: under ParameterServerStrategy
            # another worker's push may have moved it since this payload was encoded,
            # and only a payload encoded while sampling is a sample.
            with tf.control_dependencies(
                    [self._advance(self.phase.read_value(), total, votes, 1, is_sample)]):
                return self.step.read_value()

        if self._schedule_lock is None:
            advanced = advance()
        else:
            advanced = self._schedule_lock.execute(advance, exclusive_resource_access=False)
        with tf.control_dependencies([advanced]):
            return tf.identity(total)

    def _checked_coefficients(self, payload):
        """`payload` once a compressed one is checked to carry S * d coefficients, d the
        current dimension (fewer or more would decode to other values, not fail): at
        once where the phase and the sizes are known (eagerly), else when it runs."""
        coefficients = payload["coefficients"]
        phase = tf.get_static_value(payload["phase"])
        count = coefficients.shape.num_elements()
        if tf.executing_eagerly() and phase is not None and count is not None:
            expected = self.num_slices * int(self.dim.numpy())
            if int(phase) == COMPRESSED and count != expected:
                raise base.MalformedPayloadError(
                    f"{self.name} payload: {count} coefficients, expected {expected} "
                    f"({self.num_slices} slices of dimension {expected // self.num_slices})")
            return payload
        expected = self.num_slices * self.dim.read_value()
        size = tf.size(coefficients)
        check = tf.debugging.Assert(
            tf.logical_or(tf.not_equal(payload["phase"], COMPRESSED), tf.equal(size, expected)),
            [f"{self.name} payload: coefficients", size, "expected", expected,
             f"({self.num_slices} slices of the current dimension)"])
        with tf.control_dependencies([check]):
            return dict(payload, coefficients=tf.identity(coefficients))

    def _payload_fields(self):
        """What `decode` accepts: `_encode`'s keys and dtypes."""
        fields = {
            "phase": base.Field((tf.int32,), rank=0),
            "dense": base.FLOAT_VECTOR,
            "coefficients": base.Field((tf.float32,), rank=1),
            "qsgd_data": base.BYTES,
            "qsgd_norms": base.Field((tf.float32,), rank=1),
        }
        if self.settings.early_stop_loss is not None:
            fields["votes"] = base.Field((tf.float32,), rank=1)
        return fields

    def _encode(self, x, num_workers):
        x = base.check_floating(x, self.name)
        self._check_shape(x)
        flat = tf.reshape(tf.cast(x, tf.float32), [-1])
        phase = self.phase.read_value()
        compressor = self._sender_compressor()
        empty_f, empty_u8 = tf.zeros([0]), tf.zeros([0], tf.uint8)

        def warm():
            return flat, empty_f, empty_u8, empty_f, empty_f

        def sample():
            if self.sampler is None:
                return warm()
            data, norms = self._qsgd_encode(flat)
            return empty_f, empty_f, data, norms, empty_f

        def compressed():
            coefficients, vote = self._compress_and_vote(flat, num_workers, compressor)
            return empty_f, tf.reshape(coefficients, [-1]), empty_u8, empty_f, vote

        dense, coefficients, data, norms, votes = tf.switch_case(phase, [warm, sample, compressed])
        payload = {
            "phase": phase,
            "dense": tf.cast(dense, x.dtype),
            "coefficients": coefficients,
            "qsgd_data": data,
            "qsgd_norms": norms,
        }
        if self.settings.early_stop_loss is not None:
            payload["votes"] = votes
        return payload

    def _reconstruct(self, payload):
        """What `decode` returns for `payload`, without advancing the schedule."""
        dtype = payload["dense"].dtype

        def warm():
            return tf.cast(payload["dense"], tf.float32)

        def sample():
            if self.sampler is None:
                return warm()
            return self.sampler.decode_parts(payload["qsgd_data"], payload["qsgd_norms"],
                                             self.num_elements)

        def compressed():
            coefficients = tf.reshape(payload["coefficients"], [self.num_slices, -1])
            return tf.reshape(self.decompress(coefficients), [-1])

        # switch_case runs its last branch for any index out of range: a payload whose
        # phase is not one of the three is malformed, not "compressed".
        phase = tf.convert_to_tensor(payload["phase"])
        valid = tf.debugging.assert_equal(
            tf.logical_and(phase >= WARMUP, phase <= COMPRESSED), True,
            message=f"{self.name} payload: phase is not 0, 1 or 2")
        with tf.control_dependencies([valid]):
            phase = tf.identity(phase)
        flat = tf.switch_case(phase, [warm, sample, compressed])
        return tf.cast(tf.reshape(flat, self.kernel_shape), dtype)

    # --- schedule and PCA -----------------------------------------------------------------

    def _compress_and_vote(self, flat, num_workers, compressor=None):
        """Coefficients of this worker's gradient and its early-stop vote ([1] float)."""
        slices = tf.reshape(flat, [self.num_slices, self.slice_size])
        coefficients = self.compress(slices, num_workers, compressor)
        if self.settings.early_stop_loss is None:
            return coefficients, tf.zeros([1])
        # Eq. 7 relative to the gradient's energy: what this worker alone would lose.
        error = slices - self.decompress(coefficients, num_workers, compressor)
        loss = tf.reduce_sum(tf.square(error)) / tf.maximum(tf.reduce_sum(tf.square(slices)), 1e-30)
        vote = tf.reshape(loss > self.settings.early_stop_loss, [1])
        return coefficients, tf.cast(vote, tf.float32)

    # --- helpers ------------------------------------------------------------------------

    def _check_shape(self, x):
        if not x.shape.is_compatible_with(self.kernel_shape):
            raise ValueError(
                f"{self.name} was bound to a kernel of shape {self.kernel_shape}, got {x.shape}"
            )

    def _qsgd_encode(self, flat, replica=0):
        seed = tf.stack([tf.cast(self.step.read_value(), tf.int64), tf.cast(replica, tf.int64)])
        if self._seed is not None:
            seed = tf.stack([seed[0] * 7919 + int(self._seed), seed[1]])
        else:
            seed = tf.stack([seed[0], seed[1] + tf.random.uniform([], 0, 2**31 - 1, tf.int64)])
        return self.sampler.encode_parts(flat, seed)

    def _qsgd_data_bytes(self):
        return (self.num_elements * (self.settings.sampling_bits or 0) + 7) // 8

