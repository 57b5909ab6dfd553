"""The wires gradients cross, chosen once per strategy, and the fused message layout.

Gradients are encoded by an optimizer's `Encoder` (per-variable codecs, error
feedback, batching); `choose_wire(encoder, strategy, aggregate)` picks the wire that
sends them:

* `ParameterServerPush`: one fused message per parameter-server task and step, decoded
  on that task (ParameterServerStrategy).
* `AllReduceWire`: payloads summed (summable codecs) or gathered across replicas
  (Mirrored / MultiWorkerMirroredStrategy).
* `LocalWire`: encoded and decoded in this process, through the same fused message
  (one replica: the effect of compression on accuracy, on one machine).

Model pulls go the other way: `tfgc.ps.pull.ParameterServerPull` sends each worker one fused delta
message per parameter server and step for 3LC's compressed pulls (tfgc.ps.variables).
"""
from tfgc.wire.encoder import Encoder
from tfgc.wire.message import Entry, Layout
from tfgc.wire.wires import AllReduceWire, LocalWire, ParameterServerPush, Wire, choose_wire

__all__ = [
    "Encoder", "Entry", "Layout", "Wire", "ParameterServerPush", "AllReduceWire",
    "LocalWire", "choose_wire",
]
