"""The parameter-server machinery: everything tfgc does only under ParameterServerStrategy.

A worker's step under parameter servers reads the model from the servers, computes its
gradients and writes them back. tfgc compresses both directions and keeps the servers'
share of a step on the servers:

- `servers`: `ParameterServers`, the explicit owner users make: the pull settings and
  local steps of a model, fixed when it is made; its `scope()` makes the model.
- `pulls`: `CompressedPulls`, the owner of a model's pulled variables, their pull
  groups and their counts (`tfgc.compressed_pulls`, `tfgc.get_variable`).
- `variables`: `PulledVariable`, a model variable read on workers from a cache that
  compressed deltas keep up to date (3LC's model pulls).
- `pull`: the pull wire, one fused delta message per server, worker and step.
- `riders`: a step's other writes to a server (batch-norm statistics, local steps'
  counters) carried in its fused push message.
- `moving_statistics`: tf_keras batch-norm statistics updated on their server.
- `server_variables`: variables a traced step reaches by name on their server, not by a
  handle that crosses the wire.
- `copies`: tensors with an identical copy on a server, which a wire need not send.
- `lookups`: embedding lookups that cross the wire compressed (`CompressedEmbedding`).
- `local_steps`: workers that train their own copies and meet the servers every H steps.

The push wire (`tfgc.wire.ParameterServerPush`) and the optimizer use it through these
modules; nothing in here imports an optimizer: what the pulls need of one is the
protocol `pulls.PullingOptimizer`. The package imports nothing on its own,
so that a module of tfgc may import one of its modules without loading the others.
"""
