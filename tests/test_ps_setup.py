"""Parameter-server setups that cannot work fail at build, with what to do."""
import textwrap

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

COORDINATOR = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    import tensorflow as tf, tf_keras
    import tfgc
    from tfgc.cluster import processes

    ports = processes.reserve_ports(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
            "worker": [f"127.0.0.1:{ports[2]}"]}
    # A parameter server as a user might start it: TensorFlow only, no `import tfgc`.
    bare = ("import tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec("
            f"{spec!r}), job_name='ps', task_index=0, protocol='grpc').join()")
    servers = [
        subprocess.Popen([sys.executable, "-c", bare], preexec_fn=processes.die_with_parent),
        subprocess.Popen([sys.executable, "-m", "tfgc._server", "--cluster-spec", json.dumps(spec),
                          "--job", "worker", "--index", "0", "--parent-pid", str(os.getpid()),
                          "--timeout", "120"], preexec_fn=processes.die_with_parent),
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(processes.accepts_connections("127.0.0.1", p) for p in ports[1:]):
            assert time.monotonic() < deadline, "servers did not listen"
            time.sleep(0.2)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.layers.Dense(64, input_shape=(32,))])
            optimizer = tfgc.DistributedOptimizer(tf_keras.optimizers.SGD(0.1),
                                                  compression=tfgc.codecs.ThreeLC(1.0))
            try:
                optimizer.build(model.trainable_variables)
                print("BUILT", flush=True)
            except RuntimeError as error:
                print("ERROR " + str(error), flush=True)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_a_parameter_server_without_tfgc_fails_at_build_with_what_to_do(run_python):
    out = run_python(COORDINATOR, timeout=180)
    assert "BUILT" not in out
    assert "/job:ps/replica:0/task:0" in out and "cannot run tfgc's ops" in out
    assert "import tfgc in every parameter server and worker process" in out
