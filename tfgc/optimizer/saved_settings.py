"""What a compressing optimizer's checkpoint was saved with, checked when it is restored.

A checkpoint of a `DistributedOptimizer` holds state whose meaning depends on its
settings: the codecs' own state (PowerSGD's factors, per rank), error-feedback residuals
(per codec), and the anchor and outer momentum of local steps (per H). Restored into an
optimizer with other settings, that state would be restored in part (a shape that
differs fails midway), or silently into state that means something else. So the
optimizer saves its settings beside its state as Python state, which TensorFlow
restores before it assigns any variable, and the restore compares them: a checkpoint
saved with other settings is refused with the differences named before anything of it
(the model's weights included) is assigned. A checkpoint saved before
settings were recorded restores as before.
"""
import json
from typing import Any, Callable, Union

import tensorflow as tf

#: The name of the settings record among the optimizer's checkpoint children.
CHILD = "tfgc_settings"


class CheckpointSettingsError(ValueError):
    """A checkpoint was saved by an optimizer with other compression settings."""


class SavedSettings(tf.train.experimental.PythonState):
    """The settings record of one optimizer: Python state, which TensorFlow restores
    eagerly before it assigns any variable of the checkpoint.

    Args:
      describe: returns the optimizer's settings now, a JSON-serializable dict.
    """

    def __init__(self, describe: Callable[[], dict[str, Any]]) -> None:
        self._describe = describe

    def serialize(self) -> str:
        return _to_json(self._describe())

    def deserialize(self, string_value: Union[bytes, str]) -> None:
        check(string_value.decode() if isinstance(string_value, bytes) else string_value,
              self._describe())


def check(saved_json: str, current: dict[str, Any]) -> None:
    """Raises CheckpointSettingsError if the saved settings differ from `current`."""
    saved = json.loads(saved_json)
    current = json.loads(_to_json(current))
    differences = [f"{key}: saved {saved.get(key)!r}, this optimizer {current.get(key)!r}"
                   for key in sorted(set(saved) | set(current))
                   if saved.get(key) != current.get(key)]
    if differences:
        raise CheckpointSettingsError(
            "tfgc: this checkpoint was saved by a DistributedOptimizer with other settings "
            f"({'; '.join(differences)}), whose state (codec state, error-feedback "
            "residuals, local steps' anchor) would not mean the same here; nothing of the "
            "checkpoint was restored. Restore it into an optimizer made with the saved "
            "settings, or take the model's weights alone: restore into a copy of the model "
            "that is never compiled (tf.train.Checkpoint(model=copy).restore(path)"
            ".expect_partial()) and model.set_weights(copy.get_weights()); this optimizer "
            "then starts afresh")


def _to_json(settings):
    return json.dumps(settings, sort_keys=True, default=str)
