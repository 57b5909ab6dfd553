"""Who owns compressed pulls: a `CompressedPulls` object per model (or group of variables).

`tfgc.compressed_pulls()` returns one. Inside its scope the trainable variables a
model creates become `PulledVariable`s (tfgc.ps.variables) that it owns; it starts their
pulls, one group (one message per step) per parameter server, and counts what they
carry. A step's pull reads straight down:

    PulledVariable read -> CompressedPulls.pull_in -> tfgc.ps.pull.ParameterServerPull
        -> codecs -> ops; the bytes it sent come back as a value -> TrafficCounters

Which codec pulls them is known when the owner is made, where the owner is explicit:

1. `ParameterServers(...).scope()` (tfgc.ps.servers): the servers' pull settings,
   local steps included; the optimizer is handed the same `ParameterServers`.
2. `compressed_pulls(compression=codec)`: that codec, with tfgc's default small-tensor
   settings. No optimizer needs to know.

A `compressed_pulls()` scope without a codec takes it from an optimizer, which is
deprecated (it warns): the `DistributedOptimizer` built with the variables, or else the
unbuilt ones with `pull_compression` made under the same strategy, when they agree.
Without a codec from anywhere the variables are read from their servers as they are
(fp32). The optimizer that applies gradients to the variables counts their pull bytes
(its `traffic`), whichever way their codec was chosen.
"""
import contextlib
import itertools
import json
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Optional, Protocol, Sequence

import tensorflow as tf

from tfgc import _compat
from tfgc import codecs as codecs_lib
from tfgc.codecs import base
from tfgc.distribute import DEFAULT_MIN_ELEMENTS, is_parameter_server, local_variable
from tfgc.ps import moving_statistics
from tfgc.ps.variables import buffers, creating_buffers, pulled
from tfgc.ps.pull import ParameterServerPull
from tfgc.wire.encoder import (
    DEFAULT_SMALL_COMPRESSION, below_min_codec, compresses, small_codec, topology)

if TYPE_CHECKING:
    from tfgc.ps.servers import ParameterServers
    from tfgc.traffic import TrafficCounters
    from tfgc.ps.variables import PulledVariable

_active = threading.local()  # the stack of CompressedPulls scopes entered in this thread
# Per strategy, the DistributedOptimizers with pull_compression made under it, each with
# when it was made (owners are numbered from the same count): the pull settings a
# scope without a codec takes (deprecated, see the module docstring).
_offers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # strategy -> WeakKeyDictionary(optimizer -> number)
_made = itertools.count()


class PullCodecs(NamedTuple):
    """How a group of variables is pulled.

    Attributes:
      compression: the codec of the deltas of variables with `min_elements` or more.
      small_compression: the codec of smaller ones (None: sent as they are).
      min_elements: the threshold.
      local_steps: a worker pulls at the first of every `local_steps` of its steps
        and trains its copy alone in the others (tfgc.local_steps); 1: every step.
    """

    compression: base.Codec
    small_compression: Optional[base.Codec]
    min_elements: int
    local_steps: int = 1

    def codec_for(self, master: tf.Variable) -> base.Codec:
        """The codec (bound to `master` where it is the main one) of `master`'s deltas."""
        if compresses(master, self.min_elements):
            codec = base.bind_to(self.compression, master, topology())
            if codec.keeps_sender_state:
                raise NotImplementedError(
                    f"{self.compression!r} keeps state on the sending side, which for "
                    "pulls is the parameter server; tfgc does not pull with it yet: use it "
                    "for pushes and another codec (e.g. ThreeLC) for pulls")
            return codec
        return below_min_codec(self.small_compression)

    def key(self) -> str:
        """A string equal for equal settings."""
        return json.dumps([None if c is None else codecs_lib.serialize(c)
                           for c in (self.compression, self.small_compression)]
                          + [self.min_elements, self.local_steps], sort_keys=True, default=str)


class PullingOptimizer(Protocol):
    """What an owner of pulls asks of the optimizer that trains its variables (a
    `DistributedOptimizer`): its pull settings and the counters that add up the pulls."""

    @property
    def parameter_servers(self) -> Optional["ParameterServers"]:
        """The servers it was handed, or None."""

    @property
    def built_compression(self) -> bool:
        """Whether its codecs and counters exist."""

    @property
    def traffic_counters(self) -> Optional["TrafficCounters"]:
        """The counters the pulls' bytes go to (None until built)."""

    def pull_codecs(self) -> Optional["PullCodecs"]:
        """Its pull settings, or None."""


def default_pull_codecs(compression: base.Codec) -> PullCodecs:
    """`compression` for the deltas, with tfgc's default small-tensor settings."""
    return PullCodecs(compression, small_codec(DEFAULT_SMALL_COMPRESSION), DEFAULT_MIN_ELEMENTS)


def offer(optimizer: "PullingOptimizer") -> None:
    """Lets the pulls that start under the current strategy without a codec of their own
    use `optimizer.pull_codecs()` (deprecated, see the module docstring)."""
    offers = _offers.setdefault(tf.distribute.get_strategy(), weakref.WeakKeyDictionary())
    offers[optimizer] = next(_made)


class CompressedPulls:
    """Owns the `PulledVariable`s made in its scope, their pull groups and their counts.

    Use it through `ParameterServers.scope()` or `tfgc.compressed_pulls()`.

    Attributes:
      variables: the `PulledVariable`s it owns, in creation order.
      codecs: the `PullCodecs` their pulls use; None until the pulls start.
      local_step: with local steps, per worker the steps it has taken (an int64
        per-worker variable its pulls read and its optimizer advances); else None.
      servers: the `ParameterServers` whose scope it is, or None.
    """

    def __init__(self, compression: Optional[base.Codec] = None, min_elements: int = 0,
                 batch_norm_on_server: bool = True,
                 servers: Optional["ParameterServers"] = None) -> None:
        if compression is not None and not isinstance(compression, base.Codec):
            raise TypeError("compressed_pulls(compression=...) takes a tfgc codec, got "
                            f"{type(compression).__name__}")
        self.compression = compression
        self.servers = servers
        self.min_elements = int(min_elements)
        self.batch_norm_on_server = bool(batch_norm_on_server)
        self.variables: list["PulledVariable"] = []
        self.codecs: Optional[PullCodecs] = None
        self.local_step: Optional[tf.Variable] = None
        self._strategy = tf.distribute.get_strategy()
        # The TrafficCounters of the optimizer that applies them.
        self._counters: Optional["TrafficCounters"] = None
        # [(graph, counted, happened)] traced before there were counters
        self._pending: list[tuple[tf.Graph, list[tuple[tf.Variable, tf.Tensor]],
                                  Optional[tf.Tensor]]] = []
        # graph -> {group: its pull op}
        self._pulls: weakref.WeakKeyDictionary[
            tf.Graph, dict[ParameterServerPull, Optional[tf.Operation]]
        ] = weakref.WeakKeyDictionary()
        self._scope = None
        self._number = next(_made)

    # --- the scope --------------------------------------------------------------------

    def __enter__(self):
        strategy = tf.distribute.get_strategy()
        if tf.distribute.has_strategy() and not is_parameter_server(strategy):
            warnings.warn(
                "tfgc.compressed_pulls() changes nothing under an all-reduce strategy "
                f"(every replica of {type(strategy).__name__} holds the model; nothing is "
                "pulled); it applies to ParameterServerStrategy and to single-process "
                "training", stacklevel=3)

        def creator(next_creator, **kwargs):
            variable = next_creator(**kwargs)
            if creating_buffers():
                return variable
            return self.adopt(variable)

        if self.batch_norm_on_server and is_parameter_server(strategy):
            # The statistics made in the scope are updated on their servers: tfgc's
            # batch-norm route and the riders of the push, installed here, explicitly.
            moving_statistics.enable(strategy)
        self._scope = tf.variable_creator_scope(creator)
        self._scope.__enter__()
        _scopes().append(self)
        return self

    def __exit__(self, *exc_info):
        _scopes().remove(self)
        scope, self._scope = self._scope, None
        return scope.__exit__(*exc_info)

    def adopt(self, master: tf.Variable, min_elements: Optional[int] = None) -> tf.Variable:
        """`master` as this owner makes it: a `PulledVariable` it owns where pulled
        (`min_elements` overrides the scope's)."""
        if min_elements is None:
            min_elements = self.min_elements
        return pulled(master, min_elements, self.batch_norm_on_server, owner=self)

    def add(self, variable: "PulledVariable") -> None:
        """Takes ownership of a new `PulledVariable` (called by the variable)."""
        if self.codecs is not None:
            raise RuntimeError(
                f"{variable.master.name} was created in a compressed_pulls() scope whose "
                "pulls have started: create a model's variables before its first step")
        self.variables.append(variable)

    # --- starting -----------------------------------------------------------------------

    def start(self, pull_codecs: PullCodecs) -> None:
        """Starts the pulls with `pull_codecs`: one group per parameter server (and dtype:
        a group's snapshots are one buffer)."""
        self.codecs = pull_codecs
        groups: dict[tuple[str, tf.DType], list["PulledVariable"]] = {}
        for variable in self.variables:
            groups.setdefault((variable.master.device, variable.master.dtype),
                              []).append(variable)
        # The groups' buffers are not part of a traced step, and are the masters'
        # strategy's: a first read traced outside its scope and its `run` (a
        # `tf.function` over `model(x)`) would size them for the default strategy.
        with tf.init_scope(), _in_scope_of(self.variables[0].master):
            if pull_codecs.local_steps > 1:
                self.local_step = local_variable(tf.constant(0, tf.int64), "local_step",
                                                 per_worker=True)
            for members in groups.values():
                member_codecs = [pull_codecs.codec_for(v.master) for v in members]
                group = ParameterServerPull(members, member_codecs,
                                            pull_codecs.local_steps, self.local_step)
                for variable, codec in zip(members, member_codecs):
                    variable.enable_compressed_pulls(codec, group)

    def start_at_first_read(self) -> bool:
        """Starts the pulls at the first traced read when their codec is known; returns
        whether they run. Reads while the scope is open (Keras traces a model as it
        makes it) go to the masters."""
        if self.codecs is None and self._scope is None:
            pull_codecs = self._codecs_without_an_optimizer()
            if pull_codecs is not None:
                self.start(pull_codecs)
        return self.codecs is not None

    def _own_codecs(self) -> Optional[PullCodecs]:
        """The pull settings this owner was made with (None: none of its own)."""
        if self.servers is not None:
            return self.servers.pull_codecs
        if self.compression is not None:
            return default_pull_codecs(self.compression)
        return None

    def _codecs_without_an_optimizer(self):
        if self.servers is not None or self.compression is not None:
            return self._own_codecs()
        unbuilt = [(number, optimizer) for optimizer, number
                   in list(_offers.get(self._strategy, {}).items())
                   if not optimizer.built_compression]
        # Those made after this owner's model, if any: an optimizer made earlier and
        # never built (a notebook's previous cell) has nothing to do with this model.
        later = [optimizer for number, optimizer in unbuilt if number > self._number]
        offered = {}
        for optimizer in later or [optimizer for _, optimizer in unbuilt]:
            settings = optimizer.pull_codecs()
            offered.setdefault(settings.key(), settings)
        if len(offered) > 1:
            raise RuntimeError(
                f"{len(offered)} DistributedOptimizers with different pull settings were "
                "made under this strategy and none has been built, so which one pulls this "
                "model is not known at its first step: " + _EXPLICIT)
        if offered:
            _warn_inferred()
        return next(iter(offered.values()), None)

    def attach(self, optimizer: "PullingOptimizer") -> bool:
        """Called by the optimizer built with (some of) these variables: starts the pulls
        with its settings if nothing started them, and has it count them.

        Raises:
          RuntimeError: the pulls should have started in a step traced already.
          ValueError: they started with settings other than the optimizer's.
        """
        if self.servers is not None:
            return self._attach_to_servers(optimizer)
        own = optimizer.pull_codecs()
        if self.codecs is None:
            if own is None and self.compression is None:
                return False
            if not tf.executing_eagerly() and not tf.distribute.in_cross_replica_context():
                # The step reading these variables was traced with uncompressed pulls.
                raise RuntimeError(
                    "compressed pulls start at a model's first step, and this one was "
                    "traced before its optimizer was built: call `optimizer.build("
                    "model.trainable_variables)` (inside strategy.scope() if there is a "
                    "strategy) before training, or pass the codec to the scope "
                    "(`tfgc.compressed_pulls(compression=...)`)")
            if self.compression is None:
                _warn_inferred()
            # `own` is None only with a compression of the scope's (returned above otherwise).
            self.start(self._own_codecs() or own)  # type: ignore[arg-type, unused-ignore]
        elif own is not None and self.compression is None and own.key() != self.codecs.key():
            raise ValueError(
                f"{type(optimizer).__name__} pulls with {own.compression.name} but this "
                f"model's pulls started with {self.codecs.compression.name} (another "
                "optimizer's settings): build the optimizer that trains the model before "
                "its first step")
        self._counters = optimizer.traffic_counters
        return True

    def _attach_to_servers(self, optimizer: "PullingOptimizer") -> bool:
        """`attach` for an owner made by `ParameterServers.scope()`: the optimizer must
        have been handed the same servers; it counts the pulls."""
        if optimizer.parameter_servers is not self.servers:
            raise ValueError(
                f"this model's variables were made in the scope of {self.servers!r}; hand "
                f"the same object to the optimizer: DistributedOptimizer(..., "
                "parameter_servers=servers)")
        own = self._own_codecs()
        if self.codecs is None and own is not None:
            self.start(own)
        self._counters = optimizer.traffic_counters
        return self.codecs is not None

    # --- a step's pull ------------------------------------------------------------------

    def pull_in(self, graph: tf.Graph, group: ParameterServerPull) -> Optional[tf.Operation]:
        """The op that pulls `group` in `graph`, added (and its bytes counted) on first use."""
        pulls = self._pulls.setdefault(graph, {})
        if group not in pulls:
            pulls[group] = None  # a read while adding the pull: no pull
            done, counted, happened = group.pull([v.cache.handle for v in group.variables])
            pulls[group] = done
            self._count(graph, counted, happened)
        return pulls[group]

    def _count(self, graph, counted, happened):
        if self._counters is None:
            self._pending.append((graph, counted, happened))
        else:
            self._counters.record("pull", counted, happened)

    def count_pending(self) -> None:
        """Counts the pulls of the current graph traced before the counters existed (the
        optimizer calls it from the step that built it)."""
        if self._counters is None:
            return
        graph = tf.compat.v1.get_default_graph()
        pending, self._pending = self._pending, []
        for traced_in, counted, happened in pending:
            if traced_in is graph:
                self._counters.record("pull", counted, happened)
            else:
                self._pending.append((traced_in, counted, happened))


_EXPLICIT = (
    "make the owner explicit: `servers = tfgc.ParameterServers(pull_compression=...)`, "
    "`with servers.scope():` around the model, and `DistributedOptimizer(..., "
    "parameter_servers=servers)`; or pass the codec to the scope "
    "(`tfgc.compressed_pulls(compression=...)`)")


def _warn_inferred():
    warnings.warn(
        "a compressed_pulls() scope without a codec took its pull settings from a "
        "DistributedOptimizer; this is deprecated and goes in the next release: "
        + _EXPLICIT, DeprecationWarning, stacklevel=4)


def _scopes():
    if not hasattr(_active, "stack"):
        _active.stack = []
    return _active.stack


def compressed_pulls(compression: Optional[base.Codec] = None, min_elements: int = 0,
                     batch_norm_on_server: bool = True) -> CompressedPulls:
    """A scope whose trainable variables are pulled compressed (a `CompressedPulls`).

    Enter it inside `strategy.scope()` around model construction:

        with strategy.scope(), tfgc.compressed_pulls(tfgc.codecs.ThreeLC(1.0)):
            model = make_model()

    With a codec its variables are pulled as in `tfgc.ParameterServers(compression).
    scope()`, and no optimizer needs to be handed anything; for local steps, or other
    settings for small tensors, make the `ParameterServers` and hand it to the optimizer.

    Args:
      compression: the codec of the model deltas pulled. Without one the scope takes the
        `pull_compression` of a `DistributedOptimizer` (see tfgc.ps.pulls for how that
        one is found), which is deprecated.
      min_elements: smaller variables stay plain variables, read from their server as
        they are on every step. By default every trainable floating variable is
        pulled, in one message per server and step: those the codec compresses, the
        small ones (biases, batch norm) with the small-tensor codec (float16).
      batch_norm_on_server: under ParameterServerStrategy, update the moving statistics
        of the tf_keras batch-norm layers made in this scope on their server, where
        only the batch's statistics cross (tfgc.ps.moving_statistics); False leaves them
        to Keras, which reads them to the worker and writes them back on every step.
        `tfgc.batch_norm_on_server(model, enabled)` switches it for a built model.

    Returns:
      The `CompressedPulls` that owns the variables (`with ... as pulls`).
    """
    return CompressedPulls(compression, min_elements, batch_norm_on_server)


def get_variable(name: str, shape: Sequence[int], dtype: tf.DType = tf.float32,
                 initializer: Any = "glorot_uniform", trainable: bool = True,
                 pulls: Optional[CompressedPulls] = None) -> tf.Variable:
    """Creates a model variable whose pulls from its parameter server can be compressed.

    Same arguments as `Layer.add_weight`. Call it inside `strategy.scope()`: the master
    is placed on a parameter server as any variable, and its per-worker snapshots on
    the same server, its cache on each worker. Trainable floating variables get these
    buffers whatever their size; others are returned as plain variables.

    Args:
      name: variable name.
      shape: fully defined shape.
      dtype: variable dtype.
      initializer: a Keras initializer, its name, or a callable (shape, dtype) -> tensor.
      trainable: whether gradients update it.
      pulls: the `CompressedPulls` that owns it: variables of one owner are pulled in
        one message per server and step. By default the innermost `compressed_pulls()`
        scope entered, or else an owner of its own.

    Returns:
      A `PulledVariable` (usable wherever a tf.Variable is), or a tf.Variable when the
      variable is not trainable, not floating, or the strategy has no pulls.
    """
    import tf_keras  # noqa: PLC0415  (tfgc's pulls need tf_keras)

    static = tf.TensorShape(shape)
    if not static.is_fully_defined():
        raise ValueError(f"get_variable needs a fully defined shape, got {static}")
    if pulls is None:
        pulls = _scopes()[-1] if _scopes() else CompressedPulls()
    init = tf_keras.initializers.get(initializer)
    with buffers():  # made as it is here, and adopted by `pulls` below
        master = tf.Variable(lambda: init(static, dtype), dtype=dtype, name=name,
                             trainable=trainable)
    return pulls.adopt(master, min_elements=0)


@contextlib.contextmanager
def _in_scope_of(master: tf.Variable) -> Iterator[None]:
    """Enters the scope of the strategy `master` was made under, unless a strategy's is
    open already (that one's variables are made, as TensorFlow would)."""
    strategy = _compat.distribute_strategy_of(master)
    if strategy is None or tf.distribute.has_strategy():
        yield
        return
    with strategy.scope():
        yield
