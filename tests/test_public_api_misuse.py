"""Ordinary mistakes through the public API get errors that say what to do."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfgc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dense_model(tf_keras):
    return tf_keras.Sequential([tf_keras.layers.Dense(32, input_shape=(64,))])


def test_one_optimizer_shared_by_two_models_says_to_make_one_per_model():
    import tf_keras

    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=tfgc.codecs.ThreeLC(1.0))
    x, y = np.ones((8, 64), "float32"), np.ones((8, 32), "float32")
    first = _dense_model(tf_keras)
    first.compile(optimizer, "mse")
    first.fit(x, y, verbose=0)
    second = _dense_model(tf_keras)
    second.compile(optimizer, "mse")
    with pytest.raises(ValueError, match="does not know variable .*make one per model"):
        second.fit(x, y, verbose=0)


def test_keras3_optimizer_shared_by_two_models_says_to_make_one_per_model():
    import keras

    optimizer = tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                          compression=tfgc.codecs.ThreeLC(1.0))
    x, y = np.ones((8, 64), "float32"), np.ones((8, 32), "float32")
    for attempt in range(2):
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32)])
        model.compile(optimizer, "mse")
        if attempt == 0:
            model.fit(x, y, verbose=0)
        else:
            # Keras 3 itself refuses first, or tfgc does: either names the problem.
            with pytest.raises((ValueError, KeyError), match="(?i)variable"):
                model.fit(x, y, verbose=0)


@pytest.mark.parametrize("flavour", ["tf_keras", "keras"])
def test_parameter_servers_of_the_wrong_type_are_a_type_error(flavour):
    keras = pytest.importorskip(flavour)
    with pytest.raises(TypeError, match="parameter_servers takes a tfgc.ParameterServers"):
        tfgc.DistributedOptimizer(keras.optimizers.SGD(0.1), tfgc.codecs.ThreeLC(1.0),
                                  parameter_servers=object())


def test_a_gradient_for_an_integer_variable_names_the_variable():
    import tf_keras

    counter = tf.Variable(3, name="my_counter")
    weights = tf.Variable(tf.zeros([64, 32]), name="w")
    optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                          compression=tfgc.codecs.ThreeLC(1.0))
    optimizer.build([weights, counter])
    with pytest.raises(TypeError, match="my_counter.*int32.*floating-point variables only"):
        optimizer.apply_gradients([(tf.ones([64, 32]), weights), (tf.constant(1), counter)])


def _fresh_pythons(sources):
    """Runs each source in a fresh Python process, all at once; returns their
    CompletedProcess-like results (returncode, stdout, stderr) in order."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(source)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for source in sources]
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _fresh_python(source):
    return _fresh_pythons([source])[0]


def test_a_log_path_before_start_says_the_cluster_has_not_started(tmp_path):
    from tfgc.cluster import LocalCluster

    # Made, not started: no process, no namespace, no log directory yet.
    cluster = LocalCluster(num_ps=1, num_workers=1)
    with pytest.raises(RuntimeError, match="not started"):
        cluster.log_path("ps", 0)
    assert cluster.log_dir is None and not cluster._procs and cluster._net is None
    # A directory given up front names the path already.
    named = LocalCluster(num_ps=1, num_workers=1, log_dir=str(tmp_path))
    assert named.log_path("worker", 1) == str(tmp_path / "worker-1.log")


@pytest.mark.slow
def test_subpackages_are_attributes_of_tfgc():
    done = _fresh_python("""
        import tfgc
        print(tfgc.cluster.isolate.__name__, tfgc.mqgrad.__name__)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["isolate", "tfgc.mqgrad"]


@pytest.mark.slow
def test_loading_a_saved_model_in_a_process_without_tfgc(tmp_path):
    paths = {flavour: tmp_path / f"{flavour}.keras" for flavour in ("tf_keras", "keras")}
    saved = _fresh_python(f"""
        import numpy as np, tf_keras, keras, tfgc
        for K, path, layers in ((tf_keras, "{paths['tf_keras']}", []),
                                (keras, "{paths['keras']}", [keras.Input((8,))])):
            model = K.Sequential(layers + [K.layers.Dense(4, input_shape=(8,))])
            model.compile(tfgc.DistributedOptimizer(K.optimizers.SGD(0.1),
                                                    tfgc.codecs.ThreeLC(1.0)), "mse")
            model.fit(np.ones((8, 8)), np.ones((8, 4)), verbose=0)
            model.save(path)
    """)
    assert saved.returncode == 0, saved.stderr[-2000:]
    # One fresh process per Keras (each must not have imported tfgc), side by side.
    loaded = dict(zip(paths, _fresh_pythons([f"""
        import {flavour} as K
        model = K.models.load_model("{path}")
        print("LOADED", type(model.optimizer).__name__)
    """ for flavour, path in paths.items()])))
    # tf_keras's first call succeeds: it imports the class's module (and so tfgc).
    assert loaded["tf_keras"].returncode == 0, loaded["tf_keras"].stderr[-2000:]
    assert "LOADED DistributedSGD" in loaded["tf_keras"].stdout
    # Keras 3 imports no module outside Keras: its error shows what to do.
    assert loaded["keras"].returncode != 0
    error = next(line for line in loaded["keras"].stderr.splitlines()
                 if line.startswith("TypeError: Could not locate class"))
    # The note is the first key of the optimizer's config: early in the error's line.
    assert "import tfgc before keras.saving.load_model" in error[:500], error[:1000]
