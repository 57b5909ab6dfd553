"""The fence around TensorFlow's and Keras's internals (tfgc._compat).

Only tfgc/_compat/ may import `tensorflow.python`, `keras.src` or `tf_keras.src`, or
touch the private attributes of TensorFlow and Keras objects that tfgc relies on; the
sources are read (with `ast`, so comments and docstrings do not count) to check it.
Each hook's probe must find its internal in the installed versions, and a missing
internal must fail with an error that names the hook, the installed version and the
verified ones.
"""
import ast
import pathlib

import pytest
import tensorflow as tf

from tfgc import _compat
from tfgc._compat import _registry, tensorflow_hooks

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = "tfgc/_compat/"


INTERNAL_MODULES = ("tensorflow.python", "keras.src", "tf_keras.src")

# Private attributes of TensorFlow and Keras objects that tfgc relies on (read, written
# or called; defining an override of the same name is not a use).
PRIVATE_NAMES = frozenset({
    # TensorFlow
    "_num_workers", "_distribute_strategy", "_parent_trackable", "_sharded_container",
    "_export_to_saved_model_graph", "_handle", "_v", "_trackable_children",
    "__internal__",
    # tf_keras
    "_fused_batch_norm", "_assign_moving_average", "_param_shape", "_param_dtype",
    "_data_format", "_bessels_correction_test_only", "_support_zero_size_input",
    "_index_dict", "_var_key", "_deduplicate_sparse_grad", "_momentums", "_velocities",
    "_steps_per_execution",
    # Keras 3
    "_all_reduce_sum_gradients", "_get_variable_index", "_trainable_variables",
    "_iterations", "_distributed_tf_update_step", "_distribution_strategy",
})


def _docstrings(tree):
    """The string constants that are docstrings (module, class, function)."""
    nodes = [tree, *(n for n in ast.walk(tree)
                     if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    return {id(node.body[0].value) for node in nodes
            if node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def uses_of_internals(source):
    """[(line, what)] for each use of an internal module or private name in `source`."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            modules = [node.value]  # importlib.import_module("tensorflow.python...")
            if node.value in PRIVATE_NAMES:  # getattr(x, "_index_dict"), hasattr, setattr
                found.append((node.lineno, repr(node.value)))
        else:
            modules = []
        found += [(node.lineno, module) for module in modules
                  if module.startswith(INTERNAL_MODULES)]
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            found.append((node.lineno, f".{node.attr}"))
    return sorted(found)


def _tfgc_sources():
    return sorted((ROOT / "tfgc").rglob("*.py"))


def test_the_scan_sees_each_kind_of_use():
    source = '''
"""A docstring may name tensorflow.python.ops and layer._fused_batch_norm."""
from tensorflow.python.ops import resource_variable_ops
import keras.src.backend
x = importlib.import_module("tf_keras.src.utils")
n = strategy._num_workers  # a comment: tensorflow.python
super()._deduplicate_sparse_grad(grads)
getattr(optimizer, "_index_dict", {})
class A(tf.__internal__.tracking.Trackable):
    def _trackable_children(self):
        """An override is defined, not used."""
'''
    assert [what for _, what in uses_of_internals(source)] == [
        "tensorflow.python.ops", "keras.src.backend", "tf_keras.src.utils", "._num_workers",
        "._deduplicate_sparse_grad", "'_index_dict'", ".__internal__"]


def test_internals_are_used_only_behind_the_fence():
    outside = {}
    for path in _tfgc_sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(FENCE):
            continue
        uses = uses_of_internals(path.read_text())
        if uses:
            outside[relative] = uses
    assert outside == {}, f"TensorFlow/Keras internals outside {FENCE}: {outside}"


def test_the_scan_finds_the_fences_own_uses():
    uses = {what for path in (ROOT / FENCE).glob("*.py")
            for _, what in uses_of_internals(path.read_text())}
    assert {"._num_workers", "'_index_dict'", "tensorflow.python.ops.resource_variable_ops",
            "keras.src.backend.tensorflow.optimizer"} <= uses, uses


def test_every_hook_finds_its_internal_in_the_installed_versions():
    for name in _compat.HOOKS:
        _compat.check(name)
    minor = ".".join(tf.__version__.split(".")[:2])
    assert minor in _compat.VERIFIED["tensorflow"].split(" and "), tf.__version__


def test_a_missing_internal_names_the_hook_and_the_versions(monkeypatch):
    import tf_keras
    from tf_keras.src.layers.normalization import batch_normalization

    monkeypatch.setattr(tf_keras, "__version__", "2.99.0")
    monkeypatch.delattr(batch_normalization.BatchNormalizationBase, "_fused_batch_norm")
    monkeypatch.delitem(_registry._resolved, "tf_keras_batch_norm", raising=False)  # first use again
    with pytest.raises(_compat.UnsupportedInternalsError) as error:
        _compat.replace_batch_norm_updates(None, None)
    message = str(error.value)
    assert "`tf_keras_batch_norm`" in message, message
    assert "_fused_batch_norm" in message, message
    assert "tf_keras 2.99.0 (installed)" in message, message
    for library, version in _compat.VERIFIED.items():
        assert f"{library} {version}" in message, message


def test_a_missing_tensorflow_internal_fails_at_import(monkeypatch):
    from tensorflow.python.ops import resource_variable_ops

    monkeypatch.delattr(resource_variable_ops.BaseResourceVariable, "_dense_var_to_tensor")
    monkeypatch.setattr(_registry, "_resolved", dict(_registry._resolved))
    with pytest.raises(_compat.UnsupportedInternalsError) as error:
        tensorflow_hooks._check_tensorflow_hooks()  # what importing tfgc._compat runs
    message = str(error.value)
    assert "`BaseResourceVariable`" in message and "_dense_var_to_tensor" in message, message
    assert f"tensorflow {tf.__version__} (installed)" in message, message


def test_a_missing_instance_attribute_names_the_hook():
    with pytest.raises(_compat.UnsupportedInternalsError, match="`ps_num_workers`.*_num_workers"):
        _compat.ps_num_workers(object())
    with pytest.raises(_compat.UnsupportedInternalsError,
                       match="`distribute_strategy_of`.*tensorflow"):
        _compat.distribute_strategy_of(object())


def test_an_unbuilt_tf_keras_optimizer_knows_no_variable():
    import tf_keras

    optimizer = tf_keras.optimizers.SGD(0.1)
    variable = tf.Variable([1.0])
    assert _compat.tf_keras_num_variables(optimizer) == 0
    with pytest.raises(KeyError):
        _compat.tf_keras_variable_index(optimizer, variable)
    optimizer.build([tf.Variable([2.0]), variable])
    assert _compat.tf_keras_variable_index(optimizer, variable) == 1
    assert _compat.tf_keras_num_variables(optimizer) == 2


def test_the_hooks_for_the_optimizers_read_what_keras_holds():
    # What the optimizer package reads through the fence.
    import keras
    import tf_keras

    first, second = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    adam = tf_keras.optimizers.Adam(0.1)
    adam.build([first, second])
    m, v = _compat.tf_keras_adam_slots(adam, second)
    assert m.shape == v.shape == second.shape and m is not v
    grads = [tf.IndexedSlices(tf.constant([1.0, 2.0]), tf.constant([0, 0]), tf.constant([1]))]
    summed, = _compat.tf_keras_deduplicate_sparse_grad(adam, grads)
    assert summed.values.numpy().tolist() == [3.0] and summed.indices.numpy().tolist() == [0]
    children = _compat.trackable_children(adam, "checkpoint")
    assert isinstance(children, dict) and children, children
    assert _compat.is_savedmodel_save("savedmodel") and not _compat.is_savedmodel_save(
        "checkpoint")

    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    assert _compat.tf_keras_steps_per_execution(model) is None
    model.compile("sgd", "mse", steps_per_execution=3)
    assert int(_compat.tf_keras_steps_per_execution(model).numpy()) == 3

    sgd = keras.optimizers.SGD(0.1)
    assert isinstance(sgd, _compat.keras3_tf_optimizer())
    assert hasattr(_compat.keras3_tf_optimizer(), _compat.KERAS3_ALL_REDUCE_SUM_GRADIENTS)
    kfirst, ksecond = keras.Variable([1.0, 2.0]), keras.Variable([3.0])
    sgd.build([kfirst, ksecond])
    assert _compat.keras3_variable_index(sgd, ksecond) == 1
    assert _compat.keras3_num_variables(sgd) == 2
    assert _compat.keras3_iterations_variable(sgd) is sgd.iterations  # no accumulation


def test_a_synchronous_executor_leaves_no_wrapper_of_the_threads_executor(monkeypatch):
    # A Python Executor waits on its executor when collected: a wrapper of the thread's
    # (asynchronous, under ParameterServerStrategy) executor would raise at exit once
    # the cluster's servers are gone. Only the synchronous executor itself is made.
    from tensorflow.python.eager import executor

    made = []

    class Counted(executor.Executor):
        def __init__(self, handle):
            made.append(handle)
            super().__init__(handle)

    monkeypatch.setattr(executor, "Executor", Counted)
    before = tf.constant(1.0) + 1.0
    with _compat.synchronous_executor():
        inside = tf.constant(2.0) * 3.0
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.debugging.check_numerics(tf.constant(float("nan")), "raised here")
    after = tf.constant(3.0) - 1.0
    assert len(made) == 1
    assert (float(before), float(inside), float(after)) == (2.0, 6.0, 2.0)
