"""What tfgc's optimizers share, whichever Keras they extend: the Keras side of the
compression (arguments, config, build) around the encoder, the wires and the traffic
counters (see `tfgc.optimizer`)."""
import json
import sys
import warnings
from typing import Any, Callable, Optional, Union

import tensorflow as tf

from tfgc import _compat, codecs, memory
from tfgc.ps import pulls
from tfgc.ps.servers import ParameterServers
from tfgc.distribute import (
    DEFAULT_MIN_ELEMENTS, is_parameter_server, local_variable, require_ops_on, worker_devices,
    zeros_of,
)
from tfgc.local_steps import OuterSGD, as_outer_optimizer, check_local_steps
from tfgc.optimizer import saved_settings, xla
from tfgc.traffic import DIRECTIONS, TrafficCounters, counter_variables
from tfgc.ps.variables import PulledVariable
from tfgc.wire import choose_wire
from tfgc.wire.encoder import DEFAULT_SMALL_COMPRESSION, Encoder, small_codec
from tfgc.wire.wires import DEFAULT_BUCKET_BYTES, Wire

__all__ = ["CompressingBase", "DIRECTIONS", "DEFAULT_SMALL_COMPRESSION", "compressing_optimizer"]


def compressing_subclass(mixin: type["CompressingBase"], optimizer_class: type[Any],
                         cache: dict[type[Any], type[Any]],
                         register: Callable[..., Callable[[type[Any]], type[Any]]]
                         ) -> type[Any]:
    """`Distributed<Name>(mixin, optimizer_class)`, made once per class (in `cache`) and
    registered with Keras serialization as "tfgc>Distributed<Name>" (`register`: a
    `register_keras_serializable`), so saved models load wherever tfgc is imported."""
    if optimizer_class not in cache:
        name = f"Distributed{optimizer_class.__name__}"
        cls = type(name, (mixin, optimizer_class), {"__module__": mixin.__module__})
        cache[optimizer_class] = register(package="tfgc", name=name)(cls)
        # Keras's deserialization, in a process that has not imported tfgc, imports the
        # saved class's module and looks the class up there: it must be an attribute.
        setattr(sys.modules[mixin.__module__], name, cls)
    return cache[optimizer_class]


def _checked_servers(servers, pull_compression, local_steps):
    """`servers` (a `ParameterServers` or None), checked against the optimizer's other
    arguments."""
    if servers is None:
        return None
    if not isinstance(servers, ParameterServers):
        raise TypeError("parameter_servers takes a tfgc.ParameterServers, got "
                        f"{type(servers).__name__}")
    if pull_compression is not None:
        raise ValueError(
            "pass the pull codec to ParameterServers(pull_compression=...) only: the "
            "optimizer takes its pull settings from parameter_servers")
    if servers.local_steps != local_steps:
        raise ValueError(
            f"{servers!r} pulls every {servers.local_steps} step(s) and the optimizer takes "
            f"local_steps={local_steps}: give both the same local_steps")
    return servers


class CompressingBase:
    """What tfgc's optimizer subclasses share, whichever Keras they extend: the
    compression arguments and config, and the build of the encoder's codecs and
    residuals and of the traffic counters. A step's gradients go over the wire its
    strategy calls for (`_send_all`); the wire encodes them with `encoder` and returns
    what it sent, which the counters add up.

    It comes before the Keras optimizer class in the subclass's bases: its `__init__`
    takes the compression arguments and passes the rest on. Subclasses call
    `_build_compression` from `build` and define `_variable_index`.
    """

    runs_local_steps = False  # whether the Keras flavour has local steps (tfgc.local_steps)

    def __init__(self, *args: Any, compression: Union[codecs.Codec, dict[str, Any]],
                 pull_compression: Union[codecs.Codec, dict[str, Any], None] = None,
                 min_elements: int = DEFAULT_MIN_ELEMENTS,
                 error_feedback: Union[bool, memory.ResidualFeedback, dict[str, Any],
                                       None] = True,
                 small_compression: Union[str, codecs.Codec, dict[str, Any],
                                          None] = DEFAULT_SMALL_COMPRESSION,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, local_steps: int = 1,
                 outer_optimizer: Union[OuterSGD, dict[str, Any], None] = None,
                 sparse_error_feedback: bool = False,
                 parameter_servers: Optional[ParameterServers] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parameter_servers = _checked_servers(parameter_servers, pull_compression,
                                                  local_steps)
        if parameter_servers is not None and parameter_servers.pull_codecs is not None:
            # Saved in the config as the codec it is; a reloaded optimizer has no servers.
            pull_compression = parameter_servers.pull_codecs.compression
        self._init_compression(compression, pull_compression, min_elements, error_feedback,
                               small_compression, bucket_bytes, sparse_error_feedback)
        self.local_steps = check_local_steps(local_steps)
        # With local steps (more than one, or an outer optimizer given): the optimizer of
        # the replicas' meetings (tfgc.local_steps); None: every step is synchronous.
        self.outer_optimizer = (
            as_outer_optimizer(outer_optimizer)
            if self.local_steps > 1 or outer_optimizer is not None else None)
        if self.outer_optimizer is not None and not self.runs_local_steps:
            raise NotImplementedError(
                f"local_steps with {type(self).__name__} is not built yet: local steps need a "
                "tf_keras optimizer")

    def _trackable_children(self, save_type="checkpoint", **kwargs):  # see _compat
        children = _compat.trackable_children(super(), save_type, **kwargs)
        if _compat.is_savedmodel_save(save_type):
            # Error-feedback residuals are per-worker buffers under ParameterServerStrategy,
            # which a SavedModel cannot hold; an exported model needs none of them.
            # Checkpoints (BackupAndRestore, tf.train.Checkpoint) keep them.
            children.pop("_residuals", None)
            return children
        children[saved_settings.CHILD] = self._saved_settings
        return children

    def checkpoint_settings(self) -> dict[str, Any]:
        """The settings that give this optimizer's checkpointed state its meaning: codecs,
        error feedback, local steps (what a restore compares; see
        `tfgc.optimizer.saved_settings`)."""
        config = self._compression_config({})
        del config["bucket_bytes"]  # how payloads are grouped, not what state means
        outer = config.pop("outer_optimizer")
        # The outer learning rate may change between runs; momentum makes state.
        config["outer_optimizer"] = None if outer is None else {
            "momentum": bool(outer["momentum"]), "nesterov": bool(outer["nesterov"])}
        return config

    def _init_compression(self, compression, pull_compression, min_elements, error_feedback,
                          small_compression, bucket_bytes, sparse_error_feedback):
        compression, pull_compression, small_compression = (
            codecs.deserialize(c) if isinstance(c, dict) else c
            for c in (compression, pull_compression, small_codec(small_compression)))
        self.compression = compression
        self.pull_compression = pull_compression
        self.small_compression = small_compression
        self.min_elements = int(min_elements)
        self.feedback = memory.feedback_rule(error_feedback)
        self.error_feedback = self.feedback is not None
        if int(bucket_bytes) <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self._settings = None  # see wire_settings
        # Set without Keras's attribute tracking: `_trackable_children` adds it.
        object.__setattr__(self, "_saved_settings",
                           saved_settings.SavedSettings(self.checkpoint_settings))
        # Saved with the optimizer (read back: Keras wraps a dict it tracks).
        self._codecs = {}  # the codec bound to each compressed variable, by position
        self._residuals = {}
        self.encoder = Encoder(compression, small_compression, min_elements, self.feedback,
                               position=self._variable_index, codecs=self._codecs,
                               residuals=self._residuals, settings=None,
                               sparse_error_feedback=sparse_error_feedback)
        # {direction: counter} (tfgc.traffic), made at the first build and saved with
        # the optimizer; `_counters` adds to them.
        self._traffic = None
        self._counters = None
        self._saw_pulled = False  # whether it was given a PulledVariable
        self._pull_owners = set()  # the CompressedPulls whose pulls it counts
        if pull_compression is not None and self.parameter_servers is None:
            pulls.offer(self)

    @property
    def built_compression(self) -> bool:
        """Whether the codecs and counters of this optimizer's variables exist: once they
        do, its variables are fixed."""
        return self._traffic is not None

    def _variable_index(self, variable):
        """The variable's position in the optimizer (as for its slots)."""
        raise NotImplementedError

    def _unknown_variable(self, variable, known):
        """The error for a variable this optimizer was not built with."""
        return ValueError(
            f"{type(self).__name__} does not know variable {variable.name}: it was built "
            f"for {known} other variable(s) (another model's, or this model's made before "
            "it was rebuilt or outside the strategy's scope). A DistributedOptimizer keeps "
            "codecs, residuals and slots per variable: make one per model, inside the "
            "strategy's scope if there is one, or call `optimizer.build(model."
            "trainable_variables)` once before applying gradients to parts of a model")

    def _compression_config(self, config):
        config.update(
            compression=codecs.serialize(self.compression),
            pull_compression=(
                None if self.pull_compression is None else codecs.serialize(self.pull_compression)
            ),
            min_elements=self.min_elements,
            error_feedback=memory.serialize_feedback(self.feedback),
            small_compression=(
                None if self.small_compression is None
                else codecs.serialize(self.small_compression)
            ),
            bucket_bytes=self.bucket_bytes,
            sparse_error_feedback=self.encoder.sparse_error_feedback,
            local_steps=self.local_steps,
            outer_optimizer=(None if self.outer_optimizer is None
                             else self.outer_optimizer.get_config()),
        )
        return config

    def wire_settings(self) -> str:
        """What every replica must agree on for compressed updates to stay in step (a
        JSON string, read when the optimizer is built)."""
        if self._settings is None:
            self._settings = json.dumps(self._compression_config({}), sort_keys=True,
                                        default=str)
        return self._settings

    def compresses(self, variable: tf.Variable) -> bool:
        """True when `variable`'s gradients are compressed by `compression`."""
        return self.encoder.compresses(variable)

    def _build_compression(self, var_list):
        """Creates the traffic counters, bound codecs and residuals of `var_list`."""
        # Eagerly: a codec's config may read a variable.
        self.encoder.settings = self.wire_settings()
        if self._traffic is None:
            if var_list and not any(self.compresses(v) for v in var_list):
                warnings.warn(
                    f"no variable has min_elements={self.min_elements} elements or more: "
                    f"{self.compression.name} compresses nothing (the largest has "
                    f"{max(v.shape.num_elements() or 0 for v in var_list)}); lower "
                    "min_elements to compress them", stacklevel=3)
            strategy = tf.distribute.get_strategy()
            if is_parameter_server(strategy) and tf.executing_eagerly():
                require_ops_on([v.device for v in var_list] + worker_devices(strategy))
            if self.pull_compression is not None and not self._saw_pulled:
                warnings.warn(
                    "pull_compression is set but no variable was created under "
                    "tfgc.compressed_pulls(): the model is pulled as it is (fp32). Build the "
                    "model inside that scope (a Keras model without an input shape makes "
                    "its weights at its first call: `model.build(input_shape)` there)",
                    stacklevel=3)
            self._traffic = counter_variables(len(var_list))
            self._counters = TrafficCounters(self._traffic, [v.name for v in var_list],
                                             self._variable_index)
        self.encoder.build(var_list, residual_variable)

    def pull_codecs(self) -> Optional[pulls.PullCodecs]:
        """How this optimizer pulls a model (a `tfgc.ps.pulls.PullCodecs`), or None
        without `pull_compression`."""
        if self.parameter_servers is not None:
            return self.parameter_servers.pull_codecs
        if self.pull_compression is None:
            return None
        return pulls.PullCodecs(
            self.pull_compression, self.small_compression, self.min_elements,
            self.local_steps if self.outer_optimizer is not None else 1)

    def _masters(self, variables):
        """The variables updates go to: the master of each `PulledVariable`."""
        if any(isinstance(v, PulledVariable) for v in variables):
            self._saw_pulled = True
        return [v.master if isinstance(v, PulledVariable) else v for v in variables]

    def _take_pulls(self, variables):
        """Has the owners of the `PulledVariable`s among `variables` start their pulls if
        nothing has, and count them (see `tfgc.ps.pulls.CompressedPulls.attach`); counts
        the pulls of the current step traced before this optimizer's counters existed."""
        owners = {id(v.owner): v.owner for v in variables if isinstance(v, PulledVariable)}
        for owner in owners.values():
            if owner in self._pull_owners:
                continue
            if owner.attach(self):
                self._pull_owners.add(owner)
            elif not getattr(self, "_warned_uncompressed_pulls", False):
                self._warned_uncompressed_pulls = True
                warnings.warn(
                    f"{len(owner.variables)} variable(s) were created under "
                    "tfgc.compressed_pulls(), but neither it nor this DistributedOptimizer "
                    "has a pull codec: they are pulled as they are (fp32); pass "
                    "pull_compression=... to compress them", stacklevel=3)
        if not tf.executing_eagerly():
            for owner in self._pull_owners:
                owner.count_pending()

    @property
    def traffic_counters(self) -> Optional[TrafficCounters]:
        """The `tfgc.traffic.TrafficCounters` its wires and pulls add to (None until
        built)."""
        return self._counters

    @property
    def traffic(self) -> Optional[dict[str, tf.Tensor]]:
        """Cumulative bytes as scalar tensors: `push_bytes`, `push_plain_bytes`,
        `push_dense_bytes` (the gradients pushed: compressed, as plain TensorFlow sends
        them, and as dense tensors), and the same `pull_` keys (model pulls); None until
        built."""
        return None if self._counters is None else self._counters.totals()

    def read_traffic(self) -> Optional[dict[str, int]]:
        """`traffic` as Python ints, read in one call (eager; None until built): the
        counters may live on a parameter server, a round trip away."""
        return None if self._counters is None else self._counters.read()

    def traffic_by_variable(self) -> dict[str, dict[str, int]]:
        """{variable name: {"push_bytes", "push_plain_bytes", "push_dense_bytes", and
        the same for "pull"}} as Python ints, cumulative (eager only)."""
        return {} if self._counters is None else self._counters.by_variable()

    def codec_for(self, variable: tf.Variable) -> codecs.Codec:
        """The codec bound to `variable` (see `Codec.bind`)."""
        return self.encoder.bound_codec(variable)

    def wire_codec(self, variable: tf.Variable) -> codecs.Codec:
        """The codec `variable`'s gradients travel with: its bound codec, or the
        small-tensor codec below `min_elements`."""
        return self.encoder.codec(variable)

    def wire_for(self, strategy: tf.distribute.Strategy, aggregate: bool) -> Wire:
        """The wire this optimizer's gradients take under `strategy` (`aggregate`: summed
        across its replicas)."""
        return choose_wire(self.encoder, strategy, aggregate, self.bucket_bytes)

    def _send_all(self, strategy, grads_and_vars, aggregate):
        """Sends every gradient over the wire `strategy` calls for and counts the bytes;
        returns the (gradient as received, variable) pairs."""
        wire = self.wire_for(strategy, aggregate)
        xla.refuse_compiled_step(self, wire)
        pairs, sent = wire.send(grads_and_vars)
        self._counters.record("push", sent)
        return pairs


def compressing_optimizer(optimizer: Any) -> Optional[CompressingBase]:
    """The tfgc optimizer in `optimizer` (itself, or the one a loss-scale optimizer or
    another wrapper with `inner_optimizer` holds), or None."""
    for _ in range(8):  # wrappers do not nest deeper
        if isinstance(optimizer, CompressingBase):
            return optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)
        if optimizer is None:
            return None
    return None


def residual_variable(variable: tf.Variable) -> tf.Variable:
    """A zero residual of `variable`'s shape kept where its gradients are produced."""
    # Under PSS one copy per worker: a residual on the parameter server would be pulled
    # in fp32. Under all-reduce strategies a checkpoint keeps each worker's first
    # replica's residual, read where it is: a sum would all-reduce every residual at
    # every save (BackupAndRestore's every few steps).
    return local_variable(zeros_of(variable.shape, variable.dtype),
                          f"residual/{variable.name.split(':')[0]}", per_worker=True,
                          saved_alone=True)
