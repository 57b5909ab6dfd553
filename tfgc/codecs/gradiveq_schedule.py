"""GradiVeQ's schedule and PCA (Yu et al., section 4): the per-layer state that moves
through warm-up, sampling and compressed phases, and the refresh that turns the
sampling phase's gradients into the compressor U_d, mu, d (Eq. 6)."""
from typing import TYPE_CHECKING, Protocol

import tensorflow as tf

from tfgc.codecs import base

if TYPE_CHECKING:
    from tfgc.codecs.gradiveq import GradiVeQ

    class _Layer(Protocol):
        """What `Schedule.refresh` reads of the `GradiVeQLayer` it is part of (the
        mixin's self, as mypy sees it)."""

        settings: GradiVeQ
        max_dim: int
        samples: tf.Variable
        mean: tf.Variable
        basis: tf.Variable
        dim: tf.Variable
        retained: tf.Variable
        refreshes: tf.Variable

WARMUP, SAMPLING, COMPRESSED = 0, 1, 2
PHASES = ("warmup", "sampling", "compressed")
# Python control flow here only ever tests Python values; converting it with autograph
# would only slow tracing down.
plain_python = tf.autograph.experimental.do_not_convert


class Schedule:
    """The schedule and PCA refresh of `GradiVeQLayer` (a mixin: it reads the layer's
    settings, state variables and slicing)."""

    def _advance(self, phase, total, votes, num_workers, is_sample=True):
        """Moves the schedule one step on, storing `total` as a sample when sampling."""
        settings = self.settings
        step = self.phase_step.read_value()
        total = tf.cast(total, tf.float32)
        finite = base.all_finite(total)

        def warm():
            done = step + 1 >= settings.warmup_steps
            return tf.where(done, SAMPLING, WARMUP), tf.where(done, 0, step + 1)

        def sample():
            def store():
                # The first slice of each group, or all of them with pool_slices.
                n = self.pooled_slices
                grouped = self._grouped(tf.reshape(total, [self.num_slices, self.slice_size]))
                rows = tf.transpose(grouped[:, :n], [1, 0, 2])  # [n, G, K]
                places = (step * n + tf.range(n))[:, None]
                self.samples.assign(tf.tensor_scatter_nd_update(self.samples, places, rows))
                return step + 1

            # A non-finite sum is a failed step, not a sample.
            taken = tf.cond(finite & is_sample, store, lambda: step)
            done = taken >= settings.sampling_steps
            refreshed = tf.cond(done, self.refresh, lambda: tf.constant(False))
            with tf.control_dependencies([refreshed]):
                return tf.where(done, COMPRESSED, SAMPLING), tf.where(done, 0, taken)

        def compressed():
            stop = 2.0 * votes > float(num_workers)
            done = step + 1 >= settings.compressed_steps
            self.early_stops.assign_add(tf.cast(stop & ~done, tf.int64))
            return tf.where(stop | done, SAMPLING, COMPRESSED), tf.where(stop | done, 0, step + 1)

        next_phase, next_step = tf.switch_case(phase, [warm, sample, compressed])
        return tf.group(
            self.phase.assign(next_phase),
            self.phase_step.assign(next_step),
            self.step.assign_add(1),
        )

    @plain_python
    def refresh(self: "_Layer") -> tf.Tensor:
        """PCA over the stored samples: sets mu, U_d and d (Eq. 6). Returns True.

        The covariance's eigenvectors are the right singular vectors of the centred
        [L, K] sample matrix (L = L_t, or s * L_t with pool_slices); they are computed
        from its L x L Gram matrix in float64, which costs O(L^2 K) instead of an SVD
        of the K x K covariance.
        """
        samples = tf.cast(tf.transpose(self.samples, [1, 0, 2]), tf.float64)  # [G, L, K]
        if self.settings.centred:
            mean = tf.reduce_mean(samples, axis=1)
        else:  # see GradiVeQ's `centred`
            mean = tf.zeros_like(samples[:, 0])
        centred = samples - mean[:, None, :]
        gram = tf.matmul(centred, centred, transpose_b=True)  # [G, L, L]
        eigenvalues, eigenvectors = tf.linalg.eigh(gram)  # ascending
        eigenvalues = tf.reverse(tf.maximum(eigenvalues, 0.0), [-1])[:, : self.max_dim]
        eigenvectors = tf.reverse(eigenvectors, [-1])[:, :, : self.max_dim]
        singular = tf.sqrt(eigenvalues)
        usable = singular > 1e-9 * tf.maximum(singular[:, :1], 1e-300)
        basis = tf.matmul(centred, eigenvectors, transpose_a=True)  # [G, K, d_max]
        scale = tf.where(usable, singular, 1.0)[:, None, :]
        basis = tf.where(usable[:, None, :], basis / scale, 0.0)
        energy = tf.reduce_sum(tf.square(centred), axis=[1, 2])
        kept = tf.cumsum(eigenvalues, axis=-1) / tf.maximum(energy, 1e-300)[:, None]
        # Eq. 6 per group; the layer uses the largest d so all slices share one length.
        short = tf.cast(kept < 1.0 - self.settings.loss_threshold, tf.int32)
        dims = 1 + tf.reduce_sum(short, axis=-1)
        dim = tf.minimum(tf.reduce_max(dims), self.max_dim)
        retained = tf.where(energy > 0, tf.gather(kept, dim - 1, axis=-1), 1.0)
        updates = [
            self.mean.assign(tf.cast(mean, tf.float32)),
            self.basis.assign(tf.cast(basis, tf.float32)),
            self.dim.assign(dim),
            self.retained.assign(tf.cast(retained, tf.float32)),
            self.refreshes.assign_add(1),
        ]
        with tf.control_dependencies(updates):
            return tf.constant(True)

