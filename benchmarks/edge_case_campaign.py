"""Error feedback under edge-case gradients: does any residual ever stop being finite?

Every codec that supports error feedback runs under `tfgc.ErrorFeedback` for float16,
float32 and float64 gradients (where the codec takes that dtype), each step's gradient
drawn from a mix of edge cases: ordinary values, values at the dtype's largest finite
magnitude, subnormals, exact zeros, wildly mixed scales, and (on some steps) NaN or Inf.
The policy under test (docs/guides/mixed-precision.md, "Non-finite values"): the residual
stays finite whatever the input; a step whose decoding is not finite keeps the previous
residual.

Per codec and dtype it counts: steps, steps whose residual was not finite (must be 0),
and steps whose codec input (gradient plus residual) was finite but whose decoding was
not: the codec's wire format overflowed, and the policy above drops the step (the
residual keeps its value); they are counted so that they are visible.

    python -m benchmarks.edge_case_campaign [--steps 10000] [--seed 0]

Exits with status 1 if any residual was ever not finite.
"""
import argparse
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tfgc

C = tfgc.codecs
SHAPE = [512]


def codecs():
    """Every codec with error feedback, fresh (each run binds its own state)."""
    return [
        C.NoCompression(), C.Cast("float16"), C.Cast("bfloat16"), C.Int8(), C.ThreeLC(1.0),
        C.ThreeLC(1.75), C.ThreeLC(1.9), C.StochasticTernary(seed=0), C.OneBit(),
        C.Sparsify(0.05), C.TopK(0.05), C.LogQuant(), C.FastSGD(), C.Quantize(4),
        C.Quantize(8), C.QSGD(bits=4, seed=0), C.AdaptiveQuantize(),
    ]


def edge_gradient(rng, dtype):
    """One gradient of SHAPE mixing the edge cases of `dtype`."""
    info = np.finfo(dtype)
    kind = rng.integers(7)
    x = rng.normal(size=SHAPE)
    if kind == 1:  # some values at the largest finite magnitude, both signs
        where = rng.integers(0, x.size, rng.integers(1, 8))
        x[where] = info.max * rng.choice([-1.0, 1.0], where.size)
    elif kind == 2:  # all subnormal or tiny
        x = x * float(info.smallest_subnormal) * rng.integers(1, 100)
    elif kind == 3:  # mostly zeros
        x[rng.random(x.size) < 0.95] = 0.0
    elif kind == 4:  # scales from the smallest normal to near the largest
        exponents = rng.uniform(np.log10(float(info.tiny)), np.log10(float(info.max)) - 0.5,
                                x.size)
        x = np.sign(x) * 10.0 ** exponents
    elif kind == 5:  # the whole tensor near the largest magnitude
        x = np.sign(x) * float(info.max) * rng.uniform(0.5, 1.0, x.size)
    elif kind == 6:  # a non-finite value among ordinary ones
        x[rng.integers(x.size)] = rng.choice([np.nan, np.inf, -np.inf])
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def run(codec, dtype, steps, rng):
    """(steps, non-finite residuals, codec overflows) or None when the codec does not
    take `dtype`."""
    ef = tfgc.ErrorFeedback(codec)

    @tf.function
    def step(x):
        # What the codec is given: the gradient plus the unsent residual.
        total_finite = tf.reduce_all(tf.math.is_finite(x + ef.residuals["w"]))
        with tf.control_dependencies([total_finite]):
            _, sent = ef.encode_and_reconstruct(x, key="w")
        residual_finite = tf.reduce_all(tf.math.is_finite(ef.residuals["w"]))
        return residual_finite, total_finite, tf.reduce_all(tf.math.is_finite(sent))

    try:
        ef.residual("w", SHAPE, tf.as_dtype(dtype))
        step(tf.zeros(SHAPE, dtype))
    except (TypeError, ValueError, tf.errors.InvalidArgumentError):
        return None
    bad_residuals = overflowed = 0
    for _ in range(steps):
        x = edge_gradient(rng, dtype)
        residual_finite, total_finite, sent_finite = step(tf.constant(x))
        bad_residuals += not bool(residual_finite)
        overflowed += bool(total_finite) and not bool(sent_finite)
    return steps, bad_residuals, overflowed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps over all runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="ErrorFeedback around")  # unbiased on purpose
    rng = np.random.default_rng(args.seed)
    dtypes = [np.float16, np.float32, np.float64]
    runs = [(codec, dtype) for dtype in dtypes for codec in codecs()
            if codec.supports_error_feedback]
    per_run = -(-args.steps // len(runs))
    print(f"{len(runs)} codec/dtype runs x {per_run} steps of {SHAPE[0]} values")
    print(f"{'codec':<28} {'dtype':<8} {'steps':>6} {'residual not finite':>20} "
          f"{'codec overflowed':>17}")
    total_steps = total_bad = total_overflowed = 0
    for codec, dtype in runs:
        name = repr(codec)[:28]
        result = run(codec, dtype, per_run, rng)
        if result is None:
            print(f"{name:<28} {np.dtype(dtype).name:<8} {'(dtype not taken)':>6}")
            continue
        steps, bad, overflowed = result
        total_steps, total_bad = total_steps + steps, total_bad + bad
        total_overflowed += overflowed
        print(f"{name:<28} {np.dtype(dtype).name:<8} {steps:>6} {bad:>20} {overflowed:>17}",
              flush=True)
    print(f"total: {total_steps} steps, residual not finite after {total_bad} "
          f"({100.0 * total_bad / max(total_steps, 1):.3f}%); the codec overflowed a finite "
          f"input on {total_overflowed} (dropped by the policy, residual kept)")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
