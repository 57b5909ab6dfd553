"""ThreeLC on a model's tensors: one payload per tensor against one batched payload.

The tensors are ResNet-20's compressed variables (those of `min_elements` = 1024 values
or more, shaped as the model's), filled with normal values. Each way runs inside a
tf.function as a fused wire runs it; times are the mean over 50 calls after a warm-up,
repeated `--rounds` times, interleaved, so both ways see the same machine.

    python -m benchmarks.bench_batched_threelc [--rounds 3]
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

import tfgc
from tfgc.codecs.base import decode_group, encode_group
from models import resnet


def mean_ms(fn, *args, calls=50):
    fn(*args)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    model = resnet.resnet(20, num_classes=10)
    shapes = [tuple(v.shape) for v in model.trainable_variables if v.shape.num_elements() >= 1024]
    xs = [tf.random.normal(s, seed=i) for i, s in enumerate(shapes)]
    codec = tfgc.codecs.ThreeLC(1.0)
    encode_each = tf.function(lambda *t: [codec.encode_and_reconstruct(x) for x in t])
    encode_batch = tf.function(lambda *t: encode_group(codec, list(t)))
    payloads = [p for p, _ in encode_each(*xs)]
    batch_payload = encode_batch(*xs)[0]
    decode_each = tf.function(lambda ps: [codec.decode(p) for p in ps])
    decode_batch = tf.function(lambda p: decode_group(codec, p, shapes))
    print(f"ResNet-20: {len(shapes)} tensors ({sum(x.shape.num_elements() for x in xs):,} values); "
          f"bytes: {sum(int(tfgc.codecs.payload_nbytes(p)) for p in payloads)} in payloads of "
          f"their own, {int(tfgc.codecs.payload_nbytes(batch_payload))} batched")
    print("round | encode each ms | encode batched ms | decode each ms | decode batched ms")
    for round_ in range(args.rounds):
        row = [mean_ms(encode_each, *xs), mean_ms(encode_batch, *xs),
               mean_ms(decode_each, payloads), mean_ms(decode_batch, batch_payload)]
        print(f"{round_ + 1} | " + " | ".join(f"{v:.2f}" for v in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
