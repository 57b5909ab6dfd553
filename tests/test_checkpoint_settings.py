"""A checkpoint restores only into an optimizer with the settings it was saved with:
otherwise it is refused, naming the differences, before anything is assigned."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import tfgc  # noqa: E402
from tfgc.optimizer.saved_settings import CheckpointSettingsError  # noqa: E402

C = tfgc.codecs
X = np.random.default_rng(0).normal(size=(64, 64)).astype("float32")
Y = X[:, :1]


def _trained(codec, local_steps=1, outer_lr=1.0, K=tf_keras, seed=0):
    K.utils.set_random_seed(seed)
    if K is tf_keras:
        model = K.Sequential([K.layers.Dense(64, input_shape=(64,)), K.layers.Dense(1)])
    else:
        model = K.Sequential([K.Input((64,)), K.layers.Dense(64), K.layers.Dense(1)])
    extra = ({"local_steps": local_steps,
              "outer_optimizer": tfgc.OuterSGD(outer_lr, momentum=0.0, nesterov=False)}
             if local_steps > 1 else {})
    optimizer = tfgc.DistributedOptimizer(K.optimizers.SGD(0.05, momentum=0.9),
                                          compression=codec, min_elements=1, **extra)
    model.compile(optimizer, "mse")
    callbacks = [tfgc.callbacks.OuterSteps()] if local_steps > 1 else []
    model.fit(X, Y, epochs=1, batch_size=8 if seed == 0 else 64, verbose=0,
              callbacks=callbacks)
    return model, optimizer


def _save(tmp_path, model, optimizer):
    return tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))


def _state(model, optimizer):
    return [v.numpy().copy() for v in model.variables + list(optimizer.variables)]


def _refused(path, model, optimizer):
    """Restores, expecting a refusal; checks that nothing was assigned."""
    before = _state(model, optimizer)
    with pytest.raises(CheckpointSettingsError) as refusal:
        tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path)
    after = _state(model, optimizer)
    assert all(np.array_equal(b, a) for b, a in zip(before, after))
    return str(refusal.value)


def test_the_same_settings_restore_everything(tmp_path):
    model, optimizer = _trained(C.PowerSGD(rank=2))
    path = _save(tmp_path, model, optimizer)
    saved = _state(model, optimizer)
    model2, optimizer2 = _trained(C.PowerSGD(rank=2), seed=1)
    tf.train.Checkpoint(model=model2, optimizer=optimizer2).restore(path).assert_consumed()
    assert int(optimizer2.iterations) == int(optimizer.iterations) == 8
    for a, b in zip(saved, _state(model2, optimizer2)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("saved, here, named", [
    (C.PowerSGD(rank=2), C.PowerSGD(rank=4), "'rank': 4"),
    (C.PowerSGD(rank=2), C.ThreeLC(1.0), "ThreeLC"),
    (C.ThreeLC(1.0), C.ThreeLC(1.75), "'sparsity': 1.75"),
])
def test_another_codec_is_refused_before_anything_is_assigned(tmp_path, saved, here, named):
    path = _save(tmp_path, *_trained(saved))
    message = _refused(path, *_trained(here, seed=1))
    assert message.startswith("tfgc: this checkpoint was saved by a DistributedOptimizer "
                              "with other settings (compression: saved"), message
    assert named in message and "take the model's weights alone" in message


@pytest.mark.parametrize("saved_h, here_h", [(4, 8), (4, 1), (1, 4)])
def test_another_number_of_local_steps_is_refused(tmp_path, saved_h, here_h):
    path = _save(tmp_path, *_trained(C.ThreeLC(1.0), local_steps=saved_h))
    message = _refused(path, *_trained(C.ThreeLC(1.0), local_steps=here_h, seed=1))
    assert f"local_steps: saved {saved_h}, this optimizer {here_h}" in message


def test_another_outer_learning_rate_restores(tmp_path):
    # A schedule may change the outer rate between runs: it makes no state.
    path = _save(tmp_path, *_trained(C.ThreeLC(1.0), local_steps=4, outer_lr=1.0))
    model, optimizer = _trained(C.ThreeLC(1.0), local_steps=4, outer_lr=0.5, seed=1)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path).assert_consumed()
    assert int(optimizer.iterations) == 8


def test_a_keras3_optimizer_refuses_another_codec(tmp_path):
    path = _save(tmp_path, *_trained(C.PowerSGD(rank=2), K=keras))
    message = _refused(path, *_trained(C.PowerSGD(rank=1), K=keras, seed=1))
    assert "'rank': 1" in message


def test_the_weights_alone_restore_from_a_refused_checkpoint(tmp_path):
    # As the refusal says: into a copy never compiled (a compiled model's optimizer would
    # take the checkpoint's optimizer state, refused), then copied.
    model, optimizer = _trained(C.PowerSGD(rank=2))
    path = _save(tmp_path, model, optimizer)
    copy = tf_keras.Sequential([tf_keras.layers.Dense(64, input_shape=(64,)),
                                tf_keras.layers.Dense(1)])
    tf.train.Checkpoint(model=copy).restore(path).expect_partial()
    fresh, _ = _trained(C.ThreeLC(1.0), seed=1)
    fresh.set_weights(copy.get_weights())
    for a, b in zip(model.variables, fresh.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    fresh.fit(X, Y, epochs=1, batch_size=8, verbose=0)
    assert int(fresh.optimizer.iterations) == 1 + 8


def test_the_settings_check_raises_or_returns_nothing():
    from tfgc.optimizer.saved_settings import check

    assert check('{"codec": "ThreeLC", "h": 1}', {"h": 1, "codec": "ThreeLC"}) is None
    with pytest.raises(CheckpointSettingsError, match="h: saved 1, this optimizer 2"):
        check('{"codec": "ThreeLC", "h": 1}', {"h": 2, "codec": "ThreeLC"})
