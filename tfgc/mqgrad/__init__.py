"""MQGrad: a SARSA agent that learns how many bits to quantize gradients with.

MQGrad (Cui et al., sections 3.2-3.3) runs a small Markov decision process next to
training. Every T iterations the agent looks at the last T smoothed losses, is rewarded
for how fast the loss fell per millisecond, and decides whether to keep the number of
quantization bits or add one. Its action-value function is a 5 -> 10 -> 7 network
trained online with SARSA.

Three pieces live here:

* `MQGradAgent` (`agent.py`): the MDP and its learner, in numpy (~0.1-0.3 ms per MDP step). Its
  whole state, the network, the smoothed loss, the pending window, the bits and the
  random generator, is saved by `tf.train.Checkpoint` and restores exactly.
* `MQGrad` (`callback.py`, also `tfgc.callbacks.MQGrad`): the tf_keras callback that feeds the agent the batch losses and wall (or
  modelled) times of `model.fit`, and writes the agent's bits into a `Quantize` codec's
  `bits` variable. Under ParameterServerStrategy it runs once, on the coordinator;
  under MultiWorkerMirroredStrategy every worker runs it, and the workers all-reduce
  their losses and times so that their agents stay identical (and check that they do).
* `AdaptiveQuantize` (`tfgc.codecs.adaptive`): the "Adaptive" baseline the paper compares against (Oland & Raj
  2015), which picks the bits of every tensor from the tensor itself.

`TimeModel` charges each iteration compute time plus payload bytes / bandwidth, so that
the trade-off MQGrad targets (fewer bits: faster iterations, noisier gradients) can be
studied on one machine.
"""
from tfgc.codecs.adaptive import AdaptiveQuantize, adaptive_bits
from tfgc.mqgrad.agent import (
    ADD, KEEP, MQGradAgent, TimeModel, loss_slope, reward, smooth_losses,
)

__all__ = [
    "MQGrad", "MQGradAgent", "TimeModel", "AdaptiveQuantize", "smooth_losses",
    "loss_slope", "reward", "adaptive_bits", "KEEP", "ADD",
]


def __getattr__(name):
    # The callback needs tf_keras; Keras 3 users of the agent need not install it.
    if name == "MQGrad":
        from tfgc.mqgrad.callback import MQGrad

        return MQGrad
    raise AttributeError(f"module 'tfgc.mqgrad' has no attribute {name!r}")
