"""The uncompressed baselines: 32-bit (or native) floats and 16-bit casts."""
import tensorflow as tf

from tfgc.codecs import base


class NoCompression(base.Codec):
    """Sends the tensor as it is: the reference every ratio is measured against."""

    summable = True

    def encode(self, x):
        return {"values": base.check_floating(x, self.name)}

    def decode(self, payload):
        return payload["values"]

    def encode_and_reconstruct(self, x):
        payload = self.encode(x)
        return payload, payload["values"]
