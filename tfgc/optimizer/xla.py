"""What a compressing optimizer does in a train step that XLA compiles.

Keras compiles the whole train step with XLA when a model is compiled with
`jit_compile=True`, and Keras 3 does so by default (`jit_compile="auto"`) on a machine
with a GPU when no strategy is used. Codecs built on tfgc's C++ ops cannot run there:
those ops have no XLA kernels. Codecs made of TensorFlow's own ops
(`Codec.compiles_with_xla`) can, on the one-replica (local) wire.

A model compiled (tf_keras or Keras 3 `Model.compile`) with XLA on and a tfgc optimizer
whose step cannot run there has XLA turned off, with one warning naming the codecs: `import
tfgc` wraps both `compile` methods (`tfgc.optimizer.compiled`), since Keras gives an
optimizer no other say in how its model's step is compiled. Any other step that XLA
compiles and that would run tfgc's ops (a custom loop's `tf.function(jit_compile=True)`)
raises NotImplementedError while it is traced, before any op is made, naming the codecs
and the fix: never a raw XLA error from deep inside the compiler. (A plain
NotImplementedError: autograph re-raises the builtin types as they are, and a subclass as
its own StagingError.)
"""
import warnings
from typing import TYPE_CHECKING, Any, Optional

import tensorflow as tf

from tfgc import _compat
from tfgc.wire.wires import LocalWire, Wire, sends_locally

if TYPE_CHECKING:
    from tfgc.optimizer.base import CompressingBase

#: The codecs whose steps XLA compiles (without a strategy); tests/test_xla.py checks it
#: against `Codec.compiles_with_xla`.
XLA_CODECS = ("NoCompression", "Cast", "Int8", "PowerSGD")


def _outside_xla(codecs, strategy, local):
    """The names of `codecs` without `compiles_with_xla`, and `strategy`'s wire when it
    is not `local` (the parameter-server and all-reduce wires pack payloads with tfgc's
    ops)."""
    names = sorted({codec.name for codec in codecs if not codec.compiles_with_xla})
    if not local:
        names.append(f"the {type(strategy).__name__} wire")
    return names


def _used_by(names):
    """"A and B use" / "A uses": what the C++ ops of tfgc are used by."""
    return f"{' and '.join(names)} {'uses' if len(names) == 1 else 'use'}"


def outside_xla(optimizer: "CompressingBase", wire: Wire) -> list[str]:
    """What keeps `optimizer`'s step on `wire` from compiling with XLA: the names of
    its codecs without `compiles_with_xla`, and the wire when it is not local."""
    return _outside_xla(optimizer.encoder.codecs_in_use(), tf.distribute.get_strategy(),
                        isinstance(wire, LocalWire))


def refuse_compiled_step(optimizer: "CompressingBase", wire: Wire) -> None:
    """Raises NotImplementedError if XLA compiles the step being traced now and
    `optimizer`'s step on `wire` cannot run there."""
    if not _compat.in_xla_context(tf.compat.v1.get_default_graph()):
        return
    names = outside_xla(optimizer, wire)
    if names:
        raise NotImplementedError(
            "tfgc: this train step is compiled with XLA, which cannot compile the C++ "
            f"ops of tfgc that {_used_by(names)}. "
            "Compile the model with "
            "jit_compile=False (Keras 3 turns XLA on by default on a machine with a GPU "
            "when no strategy is used), or call the optimizer outside "
            "tf.function(jit_compile=True). Without a strategy, "
            f"{', '.join(XLA_CODECS)} compile with XLA; a tf_keras optimizer's own "
            "jit_compile=True (its update alone) works with every codec")


def configured_outside_xla(optimizer: "CompressingBase",
                           strategy: Optional[tf.distribute.Strategy]) -> list[str]:
    """What would keep `optimizer`'s step under `strategy` (None: none) from compiling
    with XLA, from its settings, built or not."""
    local = strategy is None or sends_locally(strategy, aggregate=True)
    return _outside_xla([optimizer.compression, *optimizer.encoder.codecs_in_use()],
                        strategy, local)


def turn_xla_off_for_tfgc(model: Any) -> None:
    """Turns `model`'s XLA compilation off, with one warning saying why, where it is on
    and its tfgc optimizer's step cannot run under XLA."""
    from tfgc.optimizer.base import compressing_optimizer  # noqa: PLC0415 (cycle)

    optimizer = compressing_optimizer(getattr(model, "optimizer", None))
    if optimizer is None or not model.jit_compile:
        return
    names = configured_outside_xla(optimizer, getattr(model, "distribute_strategy", None))
    if not names:
        return
    warnings.warn(
        f"tfgc: jit_compile is turned off for model {model.name!r}: XLA cannot compile the "
        f"C++ ops of tfgc that {_used_by(names)}, "
        "so its train step runs without XLA. To keep XLA, use a codec that compiles with "
        f"it ({', '.join(XLA_CODECS)}, without a strategy)", stacklevel=3)
    model.jit_compile = False
