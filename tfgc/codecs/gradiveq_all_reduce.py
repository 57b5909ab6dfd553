"""GradiVeQ's all-reduce face: the sum of every replica's gradient under
Mirrored/MultiWorkerMirroredStrategy, as the layer's phase says (see tfgc.codecs.gradiveq).

Collectives cannot sit inside `tf.cond` under MultiWorkerMirroredStrategy
(`ReplicaContext.all_reduce` is a merge call there), so every step issues the same two
collectives, one all-reduce (float32) and one all-gather (int32) whose lengths depend on
the phase; the one a phase does not need carries a single word, since TensorFlow's
collectives crash on empty tensors.
"""
from typing import TYPE_CHECKING, Protocol

import tensorflow as tf

from tfgc.codecs import base
from tfgc.codecs.gradiveq_schedule import COMPRESSED, plain_python

if TYPE_CHECKING:
    class _Layer(Protocol):
        """What `AllReduceFace.all_reduce` reads of the `GradiVeQLayer` it is part of
        (the mixin's self, as mypy sees it)."""

        kernel_shape: list[int]
        phase: tf.Variable

        @property
        def name(self) -> str: ...

        def _check_shape(self, x: tf.Tensor) -> None: ...

        def _qsgd_data_bytes(self) -> int: ...

        def _advance(self, phase: tf.Tensor, total: tf.Tensor, votes: tf.Tensor,
                     num_workers: int, is_sample: bool = True) -> tf.Operation: ...


class AllReduceFace:
    """`all_reduce` of a `GradiVeQLayer` (a mixin: it uses the layer's compressor,
    sampler and schedule)."""

    @plain_python
    def all_reduce(self: "_Layer", gradient: tf.Tensor,
                   replica_context: tf.distribute.ReplicaContext
                   ) -> tuple[tf.Tensor, tf.Tensor]:
        """Sums every replica's `gradient` as the current phase says; advances the schedule.

        Returns:
          (the decoded sum, in gradient's shape and dtype, bytes this replica sent as
          payload: its all-reduce and all-gather inputs).
        """
        gradient = base.check_floating(gradient, self.name)
        self._check_shape(gradient)
        ctx = replica_context
        n = ctx.num_replicas_in_sync
        flat = tf.reshape(tf.cast(gradient, tf.float32), [-1])
        phase = self.phase.read_value()
        one_float, one_word = tf.zeros([1]), tf.zeros([1], tf.int32)
        data_bytes = self._qsgd_data_bytes()

        def warm():
            return flat, one_word

        def sample():
            if self.sampler is None:
                return warm()
            data, norms = self._qsgd_encode(flat, ctx.replica_id_in_sync_group)
            data = tf.pad(data, [[0, -data_bytes % 4]])
            words = tf.bitcast(tf.reshape(data, [-1, 4]), tf.int32)
            return one_float, tf.concat([words, tf.bitcast(norms, tf.int32)], 0)

        def compressed():
            coefficients, vote = self._compress_and_vote(flat, n)
            return tf.concat([tf.reshape(coefficients, [-1]), vote], 0), one_word

        # Collectives stay outside tf.cond (see the module doc); only their sizes change.
        send_floats, send_words = tf.switch_case(phase, [warm, sample, compressed])
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, send_floats)
        gathered = ctx.all_gather(send_words, axis=0)

        def warm_sum():
            return summed

        def sample_sum():
            if self.sampler is None:
                return summed
            rows = tf.reshape(gathered, [n, -1])
            words = (data_bytes + 3) // 4
            total = tf.zeros([self.num_elements])
            for r in range(n):  # the same order on every replica: identical sums
                data = tf.reshape(tf.bitcast(rows[r, :words], tf.uint8), [-1])[:data_bytes]
                norms = tf.bitcast(rows[r, words:], tf.float32)
                total += self.sampler.decode_parts(data, norms, self.num_elements)
            return total

        def compressed_sum():
            coefficients = tf.reshape(summed[:-1], [self.num_slices, -1])
            return tf.reshape(self.decompress(coefficients), [-1])

        total = tf.switch_case(phase, [warm_sum, sample_sum, compressed_sum])
        votes = tf.where(phase == COMPRESSED, summed[-1], 0.0)
        with tf.control_dependencies([self._advance(phase, total, votes, n)]):
            total = tf.identity(tf.cast(tf.reshape(total, self.kernel_shape), gradient.dtype))
        nbytes = 4 * (tf.size(send_floats, out_type=tf.int64)
                      + tf.size(send_words, out_type=tf.int64))
        return total, nbytes
