"""The one home of what tfgc knows about distribution strategies.

Everything above the codecs (wires, optimizers, pulled variables, callbacks) asks here
whether the strategy has parameter servers, makes its per-replica or per-worker
variables here, and gathers tensors of unequal length across replicas with the word
packing here. Of tfgc it imports only the op library, the version fence and the
servers' variable naming (tfgc.ps.server_variables, which imports no other tfgc module),
so any module may import it.
"""
import contextlib
import functools
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import tensorflow as tf

import tfgc_ops
from tfgc import _compat
from tfgc.ps import server_variables

#: Variables with fewer elements are not compressed by the main codec (3LC sends them
#: as they are; tfgc sends them with the small-tensor codec).
DEFAULT_MIN_ELEMENTS = 1024


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    """True for ParameterServerStrategy (variables on servers, asynchronous workers)."""
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def require_ops_on(devices: Iterable[str]) -> None:
    """Raises unless every device in `devices` can run tfgc's ops.

    A parameter server or worker started without `import tfgc` lacks the op library;
    without this check its first step would fail with "Op type not registered" deep
    inside `fit`. One tiny op runs on each device.

    Raises:
      RuntimeError: a device's process lacks the ops (the message says what to do).
    """
    for device in sorted(set(devices)):
        try:
            with tf.device(device):
                tfgc_ops.zero_run_decode(tf.zeros([1], tf.uint8)).numpy()
        except tf.errors.OpError as error:
            if "registered" not in str(error):  # "not registered", "neither ... registered"
                raise
            raise RuntimeError(
                f"{device} cannot run tfgc's ops: import tfgc in every parameter server "
                "and worker process before it serves (`import tfgc` before "
                "tf.distribute.Server(...); tfgc.cluster's servers do)") from None


def worker_devices(strategy: tf.distribute.Strategy) -> list[str]:
    """The CPU device of every worker task under ParameterServerStrategy."""
    return [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(num_workers(strategy))]


def dense_nbytes(variable: tf.Variable) -> int:
    """Bytes of `variable` as a dense tensor: what sending it uncompressed costs."""
    return variable.shape.num_elements() * variable.dtype.size


def zeros_of(shape: Union[tf.TensorShape, Sequence[int]], dtype: tf.DType) -> Callable[[], tf.Tensor]:
    """A callable initial value of zeros, made where the variable is (see `local_variable`)."""
    return functools.partial(tf.zeros, shape, dtype)


def local_variable(initial_value: Union[tf.Tensor, Callable[[], tf.Tensor]], name: str,
                   per_worker: bool, saved_alone: bool = False) -> tf.Variable:
    """A variable each replica updates on its own copy of; reading it sums the copies
    (or, with `saved_alone`, gives this worker's first copy).

    Under ParameterServerStrategy it is one copy per worker if `per_worker`, else one
    variable on a parameter server that every worker adds to. The strategy's variable
    creator is active here (as for an optimizer's slots).

    Args:
      initial_value: a tensor, or a callable that makes one. Give a large per-worker
        variable a callable (`zeros_of(shape, dtype)`): it runs on each worker, where
        a tensor is copied from the coordinator to every worker over the network.
      name: the variable's name.
      per_worker: under ParameterServerStrategy, one copy per worker.
      saved_alone: under all-reduce strategies, a read outside the replicas (a
        checkpoint's save, `BackupAndRestore`'s every few steps) gives this worker's
        first replica's copy, where a sum would be one all-reduce across the workers per
        save; a restore gives every replica that copy.
    """
    strategy = tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        # A per-worker variable may be made from inside a traced step (the optimizer
        # builds at its first `apply_gradients`, under `tf.init_scope`): it must skip
        # tf.function's initializer lifting, which builds a variable that
        # ParameterServerStrategy cannot copy to each worker.
        variable = tf.Variable(initial_value, trainable=False, name=name,
                               per_worker_variable=per_worker,
                               experimental_enable_variable_lifting=not per_worker)
        if per_worker:
            return server_variables.per_worker_by_name(variable)
        return server_variables.by_name(variable)
    if strategy.num_replicas_in_sync > 1:
        return tf.Variable(
            initial_value, trainable=False, name=name,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=(tf.VariableAggregation.ONLY_FIRST_REPLICA if saved_alone
                         else tf.VariableAggregation.SUM),
        )
    return tf.Variable(initial_value, trainable=False, name=name)


def num_workers(strategy: Optional[tf.distribute.Strategy] = None) -> int:
    """Worker tasks under ParameterServerStrategy (each has its own pull state), else 1."""
    strategy = strategy or tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        return _compat.ps_num_workers(strategy)
    return 1


@contextlib.contextmanager
def colocated_with(variable: tf.Variable) -> Iterator[None]:
    """Variables created inside go where `variable` is (its parameter server)."""
    strategy = tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        with strategy.extended.colocate_vars_with(variable):
            yield
    else:
        yield


def worker_index() -> tf.Tensor:
    """This worker's index as an int32 scalar under ParameterServerStrategy, else 0."""
    if is_parameter_server(tf.distribute.get_strategy()):
        return tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int32)
    return tf.constant(0, tf.int32)


# dtypes TensorFlow's all-gather takes; others travel as their bytes packed in int32.
_GATHERABLE = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def to_words(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` flattened into something all-gather takes: itself, or its bytes as int32."""
    flat = tf.reshape(tensor, [-1])
    if tensor.dtype in _GATHERABLE:
        return flat
    data = tf.reshape(tf.bitcast(flat, tf.uint8), [-1])
    data = tf.pad(data, [[0, -tf.size(data) % 4]])
    return tf.bitcast(tf.reshape(data, [-1, 4]), tf.int32)


def from_words(words: tf.Tensor, dtype: tf.DType, shape: Union[tf.Tensor, Sequence[int]]
               ) -> tf.Tensor:
    """Inverse of `to_words` for a tensor of `dtype` and `shape`."""
    if dtype in _GATHERABLE:
        return tf.reshape(words, shape)
    data = tf.reshape(tf.bitcast(words, tf.uint8), [-1])[: tf.reduce_prod(shape) * dtype.size]
    if dtype.size > 1:
        data = tf.reshape(data, [-1, dtype.size])
    return tf.reshape(tf.bitcast(data, dtype), shape)


def all_gather_padded(context: tf.distribute.ReplicaContext, tensor: tf.Tensor
                      ) -> list[tf.Tensor]:
    """Every replica's `tensor`, whose length may differ by replica, as a list."""
    # Nothing gathered may be empty: TF 2.21's collective all-gather of a tensor with
    # no elements crashes the process (ring, CPU). Rows get at least one word, and
    # the shapes of scalars (known statically) are not gathered.
    words = to_words(tensor)
    size = tf.size(words)
    sizes = context.all_gather(tf.reshape(size, [1]), axis=0)
    longest = tf.maximum(tf.reduce_max(sizes), 1)
    padded = tf.pad(words, [[0, longest - size]])
    if tensor.shape.rank == 0:
        shapes = [tf.zeros([0], tf.int32)] * context.num_replicas_in_sync
    else:
        shapes = context.all_gather(tf.shape(tensor)[None], axis=0)
    rows = tf.reshape(context.all_gather(padded, axis=0), [-1, longest])
    return [
        from_words(rows[r, : sizes[r]], tensor.dtype, shapes[r])
        for r in range(context.num_replicas_in_sync)
    ]
