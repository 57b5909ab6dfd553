"""The wires gradients cross, chosen once per strategy, and the fused message layout.

`choose_wire(strategy, aggregate)` picks one of:

* `ParameterServerPush`: one fused message per parameter-server task and step, decoded
  on that task (ParameterServerStrategy).
* `AllReduceWire`: payloads summed (summable codecs) or gathered across replicas
  (Mirrored / MultiWorkerMirroredStrategy).
* `LocalWire`: encoded and decoded in this process, through the same fused message
  (one replica: the effect of compression on accuracy, on one machine).
"""
from tfgc.wire.message import Entry, Layout
from tfgc.wire.wires import AllReduceWire, LocalWire, ParameterServerPush, Wire, choose_wire

__all__ = [
    "Entry", "Layout", "Wire", "ParameterServerPush", "AllReduceWire", "LocalWire", "choose_wire",
]
