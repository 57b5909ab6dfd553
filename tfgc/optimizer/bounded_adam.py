"""BoundedAdam: tf_keras's Adam, safe when parameter-server workers interleave updates.

Under ParameterServerStrategy two workers' updates of one variable interleave on its
server, compressed or not: tf_keras's Adam updates m, v and the variable with separate
ops. With sparse gradients a row can be read with m already holding another worker's
gradient and v still 0; it then moves by lr * m / epsilon, ~10^4 normal steps at
epsilon 1e-8. In 400-step runs of the Reuters workload with 2 workers about 1 run in 4
trained visibly worse (`docs/results/fastsgd.md`). `BoundedAdam` takes exactly
Adam's steps when they come one at a time and caps each weight's step at what a
consistent state allows.

This module imports tf_keras: `tfgc.BoundedAdam` loads it on first use.
"""
from typing import Any, Union

import tensorflow as tf
import tf_keras

from tfgc import _compat


def consistent_step_bound(beta_1: Union[float, tf.Tensor],
                          beta_2: Union[float, tf.Tensor]) -> tf.Tensor:
    """The most |m| / sqrt(v) can be when m and v start at 0 and follow Adam's updates.

    m = sum_k (1 - b1) b1^k g_k and v = sum_k (1 - b2) b2^k g_k^2, so by Cauchy-Schwarz
    |m| / sqrt(v) <= (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2)): 7.27 at 0.9 / 0.999.
    Needs b1^2 < b2, as Adam's usual settings have. Floats or tensors.
    """
    return (1 - beta_1) / tf.sqrt((1 - beta_2) * (1 - beta_1**2 / beta_2))


@tf_keras.saving.register_keras_serializable(package="tfgc")
class BoundedAdam(tf_keras.optimizers.Adam):
    """tf_keras's Adam with each weight's step bounded by what a consistent state allows.

    Arguments are `tf_keras.optimizers.Adam`'s. Steps applied one at a time never reach
    the bound (`consistent_step_bound`), so training is Adam's bit for bit; a step read
    between two workers' updates (m from one, v not yet) moves by at most the bound
    times Adam's step size instead of lr * m / epsilon. Use it in place of Adam for
    sparse gradients (embeddings, sparse linear models) on parameter servers.
    amsgrad=True keeps Keras's update as it is.

    Raises:
      ValueError: beta_1^2 >= beta_2 (no finite bound; Adam's usual 0.9 / 0.999 is fine).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        beta_1, beta_2 = self.beta_1, self.beta_2
        numbers = isinstance(beta_1, (int, float)) and isinstance(beta_2, (int, float))
        if not self.amsgrad and numbers and beta_1**2 >= beta_2:
            raise ValueError(
                f"BoundedAdam needs beta_1^2 < beta_2 for a finite step bound, got beta_1="
                f"{beta_1}, beta_2={beta_2}")

    def update_step(self, gradient: Union[tf.Tensor, tf.IndexedSlices],
                    variable: tf.Variable) -> None:
        if self.amsgrad:
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        # The same expressions as Keras's, so that the steps are the same to the bit.
        step = tf.cast(self.iterations + 1, dtype)
        beta_2_power = tf.pow(tf.cast(self.beta_2, dtype), step)
        alpha = (tf.cast(self.learning_rate, dtype) * tf.sqrt(1 - beta_2_power)
                 / (1 - tf.pow(tf.cast(self.beta_1, dtype), step)))
        epsilon = self.epsilon
        if self.adaptive_epsilon:
            epsilon = epsilon * tf.sqrt(1 - beta_2_power)
        m, v = _compat.tf_keras_adam_slots(self, variable)
        beta_1, beta_2 = self.beta_1, self.beta_2
        if isinstance(gradient, tf.IndexedSlices):
            m.assign_add(-m * (1 - beta_1))
            m.scatter_add(tf.IndexedSlices(gradient.values * (1 - beta_1), gradient.indices))
            v.assign_add(-v * (1 - beta_2))
            v.scatter_add(tf.IndexedSlices(tf.square(gradient.values) * (1 - beta_2),
                                           gradient.indices))
        else:
            m.assign_add((gradient - m) * (1 - beta_1))
            v.assign_add((tf.square(gradient) - v) * (1 - beta_2))
        bound = alpha * consistent_step_bound(tf.cast(beta_1, dtype), tf.cast(beta_2, dtype))
        variable.assign_sub(tf.clip_by_value((m * alpha) / (tf.sqrt(v) + epsilon), -bound, bound))


def warns_of_interleaved_adam(optimizer: Any) -> bool:
    """True for a tf_keras Adam (not BoundedAdam, not amsgrad) whose sparse updates can
    be read half-done under ParameterServerStrategy (see the module doc)."""
    return (isinstance(optimizer, tf_keras.optimizers.Adam)
            and not isinstance(optimizer, BoundedAdam) and not optimizer.amsgrad)
