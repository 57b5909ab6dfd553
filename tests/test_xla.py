"""Train steps that XLA compiles: the codecs made of TensorFlow's own ops train there,
the others stop with tfgc's error while the step is traced, never a raw XLA error."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfgc
from tfgc import codecs as C
from tfgc.optimizer.xla import XLA_CODECS, configured_outside_xla

SETTINGS = {
    "NoCompression": C.NoCompression(), "Cast": C.Cast("bfloat16"), "Int8": C.Int8(),
    "ThreeLC": C.ThreeLC(1.0), "StochasticTernary": C.StochasticTernary(),
    "OneBit": C.OneBit(), "Sparsify": C.Sparsify(0.1), "TopK": C.TopK(0.1),
    "LogQuant": C.LogQuant(4), "FastSGD": C.FastSGD(), "Quantize": C.Quantize(4),
    "AdaptiveQuantize": C.AdaptiveQuantize(), "QSGD": C.QSGD(4), "GradiVeQ": C.GradiVeQ(),
    "PowerSGD": C.PowerSGD(2), "RandomK": C.RandomK(0.1), "ScaledSign": C.ScaledSign(),
    "Signum": C.Signum(), "ChunkedTopK": C.ChunkedTopK(),
}
# A dense kernel and a conv kernel, both above the default min_elements.
SHAPES = ([64, 64], [3, 3, 16, 16])


def test_every_codec_is_listed():
    assert sorted(SETTINGS) == sorted(C._CODECS)  # noqa: SLF001


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_compiles_with_xla_says_what_xla_does(name):
    """Of each codec bound to each shape (GradiVeQ binds NoCompression to what is not a
    conv kernel), and of the settings: every binding compiles."""
    every_binding = True
    for shape in SHAPES:
        codec = SETTINGS[name].bind(tf.Variable(tf.zeros(shape)))

        @tf.function(jit_compile=True)
        def round_trip(x, codec=codec):
            return codec.decode(codec.encode(x))

        try:
            round_trip(tf.random.normal(shape))
            compiled = True
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
            compiled = False
        assert codec.compiles_with_xla == compiled, (name, shape)
        every_binding = every_binding and compiled
    assert SETTINGS[name].compiles_with_xla == every_binding
    assert (name in XLA_CODECS) == every_binding


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype("float32")
    return x, x.sum(1, keepdims=True)


def _keras3_model(codec, jit_compile):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(256),
                              keras.layers.Dense(1)])
    optimizer = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.02), compression=codec)
    model.compile(optimizer, loss="mse", jit_compile=jit_compile)
    return model, optimizer


@pytest.mark.parametrize("codec", [C.Cast("bfloat16"), C.PowerSGD(2)], ids=repr)
def test_keras3_step_compiled_with_xla_trains_and_compresses(codec):
    model, optimizer = _keras3_model(codec, jit_compile=True)
    history = model.fit(*_data(), epochs=3, batch_size=16, verbose=0)
    assert model.jit_compile
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    traffic = {k: int(v) for k, v in optimizer.traffic.items()}
    assert 0 < traffic["push_bytes"] < traffic["push_dense_bytes"] / 1.9


def _trains_compressed(model, optimizer, fewer):
    history = model.fit(*_data(), epochs=3, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert int(optimizer.traffic["push_bytes"]) < int(optimizer.traffic["push_dense_bytes"]) / fewer


@pytest.mark.parametrize("jit_compile", ["auto", True])
def test_keras3_turns_xla_off_with_one_warning_where_a_codec_cannot_compile(
        monkeypatch, jit_compile):
    """"auto" as a GPU machine resolves it (XLA on, no strategy), and XLA asked for."""
    from keras.src.trainers import trainer

    monkeypatch.setattr(trainer.Trainer, "_resolve_auto_jit_compile", lambda self: True)
    with pytest.warns(UserWarning, match=r"tfgc: jit_compile is turned off for model .*: "
                                         r"XLA cannot compile the C\+\+ ops of tfgc that "
                                         r"ThreeLC uses") as caught:
        model, optimizer = _keras3_model(C.ThreeLC(1.0), jit_compile=jit_compile)
    assert len([w for w in caught if "tfgc" in str(w.message)]) == 1
    assert not model.jit_compile
    _trains_compressed(model, optimizer, 5)


def _tf_keras_model(codec, model_jit, optimizer_jit):
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(256, input_shape=(8,)),
                                 tf_keras.layers.Dense(1)])
    optimizer = tfgc.DistributedOptimizer(
        tf_keras.optimizers.SGD(0.02, jit_compile=optimizer_jit), compression=codec)
    model.compile(optimizer, loss="mse", jit_compile=model_jit)
    return model, optimizer


def test_tf_keras_turns_xla_off_where_a_codec_cannot_compile_and_keeps_it_where_it_can():
    with pytest.warns(UserWarning, match="XLA cannot compile the C\\+\\+ ops of tfgc that "
                                         "TopK uses"):
        model, optimizer = _tf_keras_model(C.TopK(0.1), model_jit=True, optimizer_jit=False)
    assert not model.jit_compile
    _trains_compressed(model, optimizer, 3)
    model, optimizer = _tf_keras_model(C.Int8(), model_jit=True, optimizer_jit=False)
    assert model.jit_compile
    _trains_compressed(model, optimizer, 3)


def test_tf_keras_optimizers_own_xla_update_works_with_every_codec():
    model, optimizer = _tf_keras_model(C.ThreeLC(1.0), model_jit=False, optimizer_jit=True)
    history = model.fit(*_data(), epochs=3, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert int(optimizer.traffic["push_bytes"]) < int(optimizer.traffic["push_dense_bytes"]) / 5


def test_custom_loop_compiled_with_xla_stops_with_tfgcs_error():
    variable = tf.Variable(tf.zeros([64, 64]))
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=C.FastSGD())
    optimizer.build([variable])

    @tf.function(jit_compile=True)
    def step(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    with pytest.raises(NotImplementedError, match="FastSGD use"):
        step(tf.ones([64, 64]))


def test_a_strategy_of_several_replicas_keeps_the_step_out_of_xla():
    # Its wire packs payloads with tfgc's ops, whatever the codec.
    class TwoReplicas:
        num_replicas_in_sync = 2

    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1), compression=C.Int8())
    assert configured_outside_xla(optimizer, TwoReplicas()) == ["the TwoReplicas wire"]
    assert configured_outside_xla(optimizer, tf.distribute.get_strategy()) == []
    threelc = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                        compression=C.ThreeLC(1.0))
    assert configured_outside_xla(threelc, None) == ["ThreeLC"]
