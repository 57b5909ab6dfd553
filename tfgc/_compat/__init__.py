"""The one place where tfgc touches TensorFlow's and Keras's private names.

tfgc needs a few things that TensorFlow, tf_keras and Keras 3 do not export: variable
classes to subclass, the hooks their optimizers and batch norm call, attributes that
hold a count or an index. Every such use is a *hook* here: a small named function or
constant whose docstring names the internal it relies on. No other module of tfgc
imports `tensorflow.python`, `keras.src` or `tf_keras.src`, or reads or writes a
private attribute of a TensorFlow or Keras object (tests/test_compat_fence.py checks).

The package holds the registry (`_registry`: `HOOKS`, `check`, the error) and one
module per library: `tensorflow_hooks`, `tf_keras_hooks`, `keras3_hooks`; every hook is re-exported here,
so callers write `_compat.<hook>`.

Each hook is registered in `HOOKS` with a probe that finds its internal. The
TensorFlow hooks are probed when this module is imported (TensorFlow is loaded by
then, so it costs nothing); the tf_keras and Keras 3 ones at their first use (those
packages are optional and slow to import). A probe that fails raises
`UnsupportedInternalsError`, which names the hook, the installed version and the
versions the hooks were verified with (`VERIFIED`, the versions pyproject.toml allows): a
TensorFlow or Keras upgrade that moves an internal fails there, loudly, and not as a
silent change of behaviour.
"""
from tfgc._compat._registry import (
    HOOKS, VERIFIED, Hook, UnsupportedInternalsError, check, missing,
)
from tfgc._compat.keras3_hooks import (
    KERAS3_ALL_REDUCE_SUM_GRADIENTS, keras3_iterations_variable, keras3_num_variables,
    keras3_tf_optimizer, keras3_trainer, keras3_update_step, keras3_variable_index,
)
from tfgc._compat.tensorflow_hooks import (
    RESOURCE_VARIABLE_OVERRIDES, TRACKABLE_CHILDREN, VARIABLE_VALUE_KEY,
    BaseResourceVariable, CachingVariable, ResourceVariable, ShardedVariable, Trackable,
    UnliftedInitializerVariable,
    caching_variable_inner, distribute_strategy_of, eager_context, eager_mode,
    export_to_saved_model_graph, in_save_context, in_xla_context, init_variable_from_handle,
    is_function_graph, is_savedmodel_save, maybe_merge_call, ps_num_workers, resource_handle,
    smart_cond, strategy_supports_no_merge_call,
    name_per_worker_copies, per_worker_variable_of, set_parent_trackable, set_sharded_container, synchronous_executor, trackable_children,
    unwrap_caching_variable, variable_accessed,
)
from tfgc._compat.tf_keras_hooks import (
    TF_KERAS_DEDUPLICATE_SPARSE_GRAD, BatchNormSettings, batch_norm_settings,
    replace_batch_norm_updates, static_training, tf_keras_adam_slots,
    tf_keras_build_compiled_metrics, tf_keras_count_steps_when_they_start,
    tf_keras_keep_steps_per_execution_on_the_coordinator,
    tf_keras_deduplicate_sparse_grad, tf_keras_inference_call, tf_keras_learning_rate_now,
    tf_keras_num_variables, tf_keras_read_metrics_in_one_call, tf_keras_steps_per_execution,
    tf_keras_uses_weight_decay,
    tf_keras_variable_index,
)
