"""Smoothing of training-loss series, shared by the runs that record them and the
headlines that are derived from their raw output (no TensorFlow needed)."""
import numpy as np


def ema(values, alpha=0.05):
    """The exponential moving average of `values` (started at the first value)."""
    out, last = [], values[0]
    for v in values:
        last = alpha * v + (1 - alpha) * last
        out.append(last)
    return np.array(out)
