"""Codecs: encode(x) -> payload (flat dict of tensors), decode(payload) -> x_hat.

| codec          | paper        | bits/value            | summable |
|----------------|--------------|-----------------------|----------|
| NoCompression  | baseline     | 32 (the dtype's bits) | yes      |
| ThreeLC(s)     | 3LC          | <= 1.6, less with ZRE | no       |
"""
from tfgc.codecs.base import Codec, payload_nbytes
from tfgc.codecs.identity import NoCompression
from tfgc.codecs.threelc import ThreeLC

__all__ = ["Codec", "payload_nbytes", "NoCompression", "ThreeLC"]
