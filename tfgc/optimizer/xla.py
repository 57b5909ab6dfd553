"""What a compressing optimizer does in a train step that XLA compiles.

Keras compiles the whole train step with XLA when a model is compiled with
`jit_compile=True`, and Keras 3 does so by default (`jit_compile="auto"`) on a machine
with a GPU when no strategy is used. Codecs built on tfgc's C++ ops cannot run there:
those ops have no XLA kernels. Codecs made of TensorFlow's own ops
(`Codec.compiles_with_xla`) can, on the one-replica (local) wire.

A step that XLA compiles and that would run anything else raises NotImplementedError
while it is traced, before any op is made, naming the codecs and the fix: never a raw
XLA error from deep inside the compiler. (A plain NotImplementedError: autograph
re-raises the builtin types as they are, and a subclass as its own StagingError.) Keras gives an optimizer no say in how its
model's step is compiled before that trace, so tfgc cannot turn XLA off for the user.
"""
import tensorflow as tf

from tfgc import _compat
from tfgc.wire.wires import LocalWire

#: The codecs whose steps XLA compiles (without a strategy); tests/test_xla.py checks it
#: against `Codec.compiles_with_xla`.
XLA_CODECS = ("NoCompression", "Cast", "Int8", "PowerSGD")


def outside_xla(optimizer, wire):
    """What keeps `optimizer`'s step on `wire` from compiling with XLA: the names of
    its codecs without `compiles_with_xla`, and the wire when it is not local (the
    parameter-server and all-reduce wires pack payloads with tfgc's ops)."""
    names = sorted({codec.name for codec in optimizer.encoder.codecs_in_use()
                    if not codec.compiles_with_xla})
    if not isinstance(wire, LocalWire):
        strategy = type(tf.distribute.get_strategy()).__name__
        names.append(f"the {strategy} wire")
    return names


def refuse_compiled_step(optimizer, wire):
    """Raises NotImplementedError if XLA compiles the step being traced now and
    `optimizer`'s step on `wire` cannot run there."""
    if not _compat.in_xla_context(tf.compat.v1.get_default_graph()):
        return
    names = outside_xla(optimizer, wire)
    if names:
        raise NotImplementedError(
            "tfgc: this train step is compiled with XLA, which cannot compile the C++ "
            f"ops of tfgc that {' and '.join(names)} {'uses' if len(names) == 1 else 'use'}. "
            "Compile the model with "
            "jit_compile=False (Keras 3 turns XLA on by default on a machine with a GPU "
            "when no strategy is used), or call the optimizer outside "
            "tf.function(jit_compile=True). Without a strategy, "
            f"{', '.join(XLA_CODECS)} compile with XLA; a tf_keras optimizer's own "
            "jit_compile=True (its update alone) works with every codec")
