"""Codecs: encode(x) -> payload (flat dict of tensors), decode(payload) -> x_hat.

| codec                 | from          | float32 bits/value          | summable | stochastic |
|-----------------------|---------------|-----------------------------|----------|------------|
| NoCompression         | baseline      | 32                          | yes      | no         |
| Cast("float16"/"bf16")| baseline      | 16                          | yes      | no         |
| Int8                  | 3LC Table 1   | 8                           | no       | no         |
| ThreeLC(s)            | 3LC           | <= 1.6, less after zero-run | no       | no         |
| StochasticTernary     | 3LC Table 1   | 1.6                         | no       | yes        |
| OneBit                | 3LC Table 1   | 1                           | no       | no         |
| Sparsify(fraction)    | 3LC Table 1   | 1 + 32 * fraction           | no       | no         |
| TopK(ratio)           | FastSGD       | 64 * ratio                  | no       | no         |
| ChunkedTopK(d, chunk) | SparseLoCo    | ~d * (log2(chunk) + 2)      | no       | no         |
| LogQuant(bits)        | FastSGD       | bits                        | no       | no         |
| FastSGD(b, tau, l)    | FastSGD       | 8 per kept value + key bits | no       | no         |
| Quantize(bits)        | MQGrad        | bits (2..8, run-time)       | no       | no         |
| AdaptiveQuantize(rho) | MQGrad (base) | bits chosen per tensor      | no       | no         |
| QSGD(bits)            | GradiVeQ      | bits                        | no       | yes        |
| GradiVeQ(lambda, ...) | GradiVeQ      | 32 d / K (conv kernels)     | yes      | no         |
| PowerSGD(rank)        | peer baseline | 32 r (rows + cols) / size   | yes      | no         |
| RandomK(fraction)     | peer baseline | 32 * fraction               | yes*     | yes        |
| ScaledSign            | peer baseline | 1                           | no       | no         |
| Signum(momentum)      | peer baseline | 1                           | no       | no         |

*RandomK sums in the compressed domain under all-reduce strategies, where replicas
share its positions.
"""
from typing import Any, Mapping

from tfgc.codecs.adaptive import AdaptiveQuantize
from tfgc.codecs.base import (
    MAX_DECODED_BYTES, MAX_DECODED_ELEMENTS, Codec, MalformedPayloadError, StochasticCodec,
    payload_nbytes,
)
from tfgc.codecs.chunked_top_k import ChunkedTopK
from tfgc.codecs.fastsgd import FastSGD
from tfgc.codecs.gradiveq import GradiVeQ
from tfgc.codecs.identity import Cast, NoCompression
from tfgc.codecs.logquant import LogQuant
from tfgc.codecs.onebit import OneBit
from tfgc.codecs.powersgd import PowerSGD
from tfgc.codecs.quantize import Int8, Quantize
from tfgc.codecs.random_k import RandomK
from tfgc.codecs.sign import ScaledSign, Signum
from tfgc.codecs.sparsify import Sparsify, TopK
from tfgc.codecs.stochastic import QSGD, StochasticTernary
from tfgc.codecs.threelc import ThreeLC

_CODECS: dict[str, type[Codec]] = {
    cls.__name__: cls
    for cls in (NoCompression, Cast, Int8, ThreeLC, StochasticTernary, OneBit, Sparsify, TopK,
                LogQuant, FastSGD, Quantize, AdaptiveQuantize, QSGD, GradiVeQ, PowerSGD, RandomK,
                ScaledSign, Signum, ChunkedTopK)
}


def register(cls: type[Codec]) -> type[Codec]:
    """Makes a codec class known to `deserialize` (for codecs defined outside this
    package); returns it, so it can decorate."""
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        raise TypeError(f"register takes a Codec subclass, got {cls!r}")
    _CODECS[cls.__name__] = cls
    return cls


def names() -> list[str]:
    """The class names `lookup` and `deserialize` know, sorted."""
    return sorted(_CODECS)


def lookup(name: str) -> type[Codec]:
    """The codec class called `name` (e.g. "ThreeLC"), registered ones included.

    Raises:
      ValueError: no such codec (the message lists the known ones).
    """
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {names()}") from None


def serialize(codec: Codec) -> dict[str, Any]:
    """{"class_name", "config"} of a codec, for optimizer configs."""
    return {"class_name": type(codec).__name__, "config": codec.get_config()}


def deserialize(spec: Mapping[str, Any]) -> Codec:
    """Inverse of `serialize`."""
    return lookup(str(spec.get("class_name"))).from_config(spec["config"])


__all__ = [
    "Codec", "StochasticCodec", "payload_nbytes", "register", "serialize", "deserialize",
    "lookup", "names", "NoCompression", "Cast", "Int8", "ThreeLC", "StochasticTernary",
    "OneBit", "Sparsify", "TopK", "LogQuant", "FastSGD", "Quantize", "AdaptiveQuantize",
    "QSGD", "GradiVeQ", "PowerSGD", "RandomK", "ScaledSign", "Signum", "ChunkedTopK",
    "MalformedPayloadError",
    "MAX_DECODED_BYTES", "MAX_DECODED_ELEMENTS",
]
