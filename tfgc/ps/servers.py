"""`ParameterServers`: one object that says how a model meets its parameter servers.

    servers = tfgc.ParameterServers(pull_compression=tfgc.codecs.ThreeLC(1.0))
    with strategy.scope():
        with servers.scope():                 # the weights made here: pulled compressed
            model = make_model()
        optimizer = tfgc.DistributedOptimizer(
            tf_keras.optimizers.SGD(0.05), compression=tfgc.codecs.ThreeLC(1.0),
            parameter_servers=servers)

Its settings are fixed when it is made, so a model's pulls start with them at its first
step, in whatever order the model and its optimizer were made or built; nothing is
inferred from other objects. The optimizer handed it counts the pulls' bytes and, with
local steps, meets the servers every `local_steps` of a worker's steps.

`tfgc.compressed_pulls(compression=...)` is the same with one codec and tfgc's default
small-tensor settings, for a model whose optimizer has no local steps.
"""
from typing import Optional, Union

from tfgc.codecs import base
from tfgc.distribute import DEFAULT_MIN_ELEMENTS
from tfgc.local_steps import check_local_steps
from tfgc.ps.pulls import CompressedPulls, PullCodecs
from tfgc.wire.encoder import DEFAULT_SMALL_COMPRESSION, small_codec


class ParameterServers:
    """How a model's variables are pulled from their parameter servers, and who owns them.

    Args:
      pull_compression: the codec of the model deltas a worker pulls (3LC's compressed
        pulls), or None to read the variables from their servers as they are (fp32).
      small_compression: the codec of variables with fewer than `min_elements`
        elements: "float16" (the default, `Cast("float16")`), a codec, or None (sent as
        they are), as `DistributedOptimizer`'s for pushes.
      min_elements: the threshold between the two codecs.
      local_steps: H > 1: a worker pulls at the first of every H of its steps and trains
        its own copy in the others; the `DistributedOptimizer` handed these servers
        must take the same `local_steps`.
      batch_norm_on_server: update the moving statistics of the tf_keras batch-norm
        layers made in a scope on their server, where only the batch's statistics cross
        (tfgc.ps.moving_statistics).

    Attributes:
      pull_codecs: the `PullCodecs` every scope's pulls start with (None: fp32 reads).
      owners: the `CompressedPulls` of the scopes made so far.

    Raises:
      TypeError: a codec that is not a tfgc codec.
      ValueError: `local_steps` not a positive integer, or local steps without a pull
        codec.
    """

    def __init__(self, pull_compression: Optional[base.Codec] = None, *,
                 small_compression: Union[str, base.Codec, None] = DEFAULT_SMALL_COMPRESSION,
                 min_elements: int = DEFAULT_MIN_ELEMENTS, local_steps: int = 1,
                 batch_norm_on_server: bool = True) -> None:
        small = small_codec(small_compression)
        for what, codec in (("pull_compression", pull_compression),
                            ("small_compression", small)):
            if codec is not None and not isinstance(codec, base.Codec):
                raise TypeError(f"ParameterServers({what}=...) takes a tfgc codec, got "
                                f"{type(codec).__name__}")
        self.local_steps = check_local_steps(local_steps)
        if self.local_steps > 1 and pull_compression is None:
            raise ValueError(
                "local steps under parameter servers train each worker's copy of the model, "
                "its caches of compressed pulls: give a pull_compression (NoCompression() "
                "pulls the deltas as they are)")
        self.batch_norm_on_server = bool(batch_norm_on_server)
        self.pull_codecs: Optional[PullCodecs] = (
            None if pull_compression is None
            else PullCodecs(pull_compression, small, int(min_elements), self.local_steps))
        self.owners: list[CompressedPulls] = []

    def scope(self, min_elements: int = 0) -> CompressedPulls:
        """A scope whose trainable variables are these servers' pulled variables.

        Enter it inside `strategy.scope()` around model construction. `get_variable(...,
        pulls=scope)` adds a variable of one's own to it.

        Args:
          min_elements: smaller variables stay plain variables, read from their server
            as they are on every step (by default every trainable floating variable is
            pulled, the small ones with `small_compression`).

        Returns:
          The `CompressedPulls` that owns the variables made in it.
        """
        owner = CompressedPulls(min_elements=min_elements,
                                batch_norm_on_server=self.batch_norm_on_server,
                                servers=self)
        self.owners.append(owner)
        return owner

    def __repr__(self) -> str:
        codec = "fp32" if self.pull_codecs is None else self.pull_codecs.compression.name
        return f"<ParameterServers pulls={codec} local_steps={self.local_steps}>"
