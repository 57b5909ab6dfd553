"""What really crosses the wire under ParameterServerStrategy with tf_keras `model.fit`.

Two independent checks on a real cluster (1 ps, 1 worker, plus the coordinator):

* Placement, from TensorFlow's own runtime graph dumps (`TF_DUMP_GRAPH_PREFIX`): in the
  parameter server's partition of the train function, the update of a compressed
  variable is fed by ONE `_Recv`, of uint8: the fused message (tfgc.wire), which the
  parameter server unpacks and decodes itself. No float32 gradient, no shape and no
  separate scale crosses.
* Bytes, from the kernel's per-socket TCP counters (`ss`): what the worker sent to the
  parameter server equals the optimizer's payload count (`traffic["push_bytes"]`)
  within 1%, once the RPC overhead per step, measured in the same run with a tiny
  model, is subtracted.
"""
import collections
import math
import os
import re
import subprocess
import sys

import pytest

import cluster_scripts

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

UNITS = 1024  # the compressed kernel: 1024 x 1024 floats, 4 MiB per fp32 push
STEPS = 4

COORDINATOR = cluster_scripts.script(
    """
    dump_dir, units, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(0)

    class EpochLosses(tf_keras.callbacks.Callback):
        # Epoch-level: tf_keras rejects batch-level callbacks under PSS.
        def __init__(self):
            super().__init__()
            self.losses = []
        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(float(logs["loss"]))

    def codec(name):
        return {"fp32": tfgc.codecs.NoCompression(), "int8": tfgc.codecs.Int8(),
                "threelc": tfgc.codecs.ThreeLC(1.0)}[name]

    runs = [("tiny", "threelc", 8), ("fp32", "fp32", units), ("int8", "int8", units),
            ("threelc", "threelc", units)]
    env = {"TF_DUMP_GRAPH_PREFIX": os.path.join(dump_dir, "{job}{index}"),
           "TF_DUMP_GRAPH_NAME_FILTER": "*"}
    report = {}
    with cluster.LocalCluster(num_ps=1, num_workers=1, env=env, timeout_s=400) as c:
        strategy = tf.distribute.experimental.ParameterServerStrategy(c.resolver)
        for run, name, n in runs:
            x = rng.normal(size=(256, n)).astype("float32")
            y = x @ rng.normal(size=(n, n)).astype("float32") / n ** 0.5
            data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
            with strategy.scope():
                model = tf_keras.Sequential(
                    [tf_keras.layers.Dense(n, use_bias=False, input_shape=(n,))])
                opt = tfgc.DistributedOptimizer(
                    tf_keras.optimizers.SGD(0.05), compression=codec(name), min_elements=1)
                opt.build(model.trainable_variables)
                model.compile(opt, "mse")
            payload = opt.compression.encode(tf.zeros([n, n]))
            dtypes = sorted(t.dtype.name for t in payload.values() if t.shape.num_elements())
            # The first fit traces the step and sets up the connections; measure a second.
            seen = set(os.listdir(dump_dir + "/worker0")) if os.path.isdir(dump_dir + "/worker0") else set()
            model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
            new = sorted(set(os.listdir(dump_dir + "/worker0")) - seen)
            callback = EpochLosses()
            rows0 = c.settled_socket_bytes()  # the first fit's last bytes have crossed
            pushed0 = int(opt.traffic["push_bytes"].numpy())
            traffic = tfgc.callbacks.TrafficLogger()
            history = model.fit(data, epochs=steps, steps_per_epoch=1, verbose=0,
                                callbacks=[callback, traffic])
            rows1 = c.settled_socket_bytes()
            report[run] = {
                "sent": c.traffic_between("worker", "ps", rows=rows1)
                        - c.traffic_between("worker", "ps", rows=rows0),
                "payload": int(opt.traffic["push_bytes"].numpy()) - pushed0,
                "dense": steps * n * n * 4,
                "losses": callback.losses,
                "logged_push_bytes": history.history.get("push_bytes"),
                "payload_dtypes": dtypes,
                "dumps": new,
                "kernel": model.trainable_variables[0].name.split(":")[0],
            }
    send_report(report)
    """
)

_NODE = re.compile(r"\nnode \{")


def parse_graph(path):
    """{name: {"op", "inputs" (data inputs, without ':k'), "type"}} from a GraphDef pbtxt."""
    nodes = {}
    for text in _NODE.split(open(path).read())[1:]:
        name = re.search(r'\bname: "([^"]+)"', text).group(1)
        dtype = re.search(r'key: "tensor_type"\s*value \{\s*type: (\w+)', text)
        nodes[name] = {
            "op": re.search(r'\bop: "([^"]+)"', text).group(1),
            "inputs": [i.split(":")[0] for i in re.findall(r'\binput: "([^"^][^"]*)"', text)],
            "type": dtype.group(1) if dtype else None,
        }
    return nodes


_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def recvs_feeding(nodes, resource):
    """Dtypes of the receives whose values flow into the writes of `resource`.

    Follows data inputs backwards and, through a ReadVariableOp, into the writes of
    the variable it reads (the optimizer's own temporaries live on the ps too).
    """
    def origin(name):
        # A resource reaches a write in a branch (the skip of a non-finite step)
        # through the branch's Switch and Identity ops.
        while name in nodes and nodes[name]["op"] in ("Switch", "Identity") \
                and nodes[name]["inputs"]:
            name = nodes[name]["inputs"][0]
        return name

    writes = collections.defaultdict(list)
    for name, node in nodes.items():
        if node["op"] in _WRITES or node["op"].startswith("ResourceApply"):
            if node["inputs"]:
                writes[origin(node["inputs"][0])].append(name)
    todo, seen, found = list(writes[resource]), set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        if node["op"] in ("_Recv", "_HostRecv"):  # (host memory: a flag)
            found.append(node["type"])
            continue
        if node["op"] == "ReadVariableOp" and node["inputs"]:
            todo.extend(writes[origin(node["inputs"][0])])
        todo.extend(node["inputs"])
    return sorted(found)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    # One cluster run serves every test of this module. The coordinator runs in a
    # process of its own: ParameterServerStrategy rewires its process's eager context.
    tmp_path = tmp_path_factory.mktemp("wire")
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(UNITS), str(STEPS)],
        capture_output=True, text=True, timeout=480,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = cluster_scripts.read_report(done.stdout, done.stderr)
    result["dump_dir"] = str(tmp_path)
    return result


def ps_partition(report, run):
    """Path of the ps partition of `run`'s train function, as the worker dumped it."""
    names = [n for n in report[run]["dumps"]
             if n.startswith("__inference_train_function_") and "_partition__job:ps_" in n
             and n.endswith("after_partition_passes.pbtxt") and "_partitioned_" not in n]
    assert len(names) == 1, report[run]["dumps"]
    return os.path.join(report["dump_dir"], "worker0", names[0])


@pytest.mark.parametrize("run", ["fp32", "int8", "threelc"])
def test_ps_receives_only_the_codec_dtypes(report, run):
    nodes = parse_graph(ps_partition(report, run))
    # The kernel's resource is an argument of the ps partition; its name derives from
    # the layer's read op ("sequential_dense_matmul_readvariableop_resource").
    resources = [n for n, node in nodes.items()
                 if node["op"] == "_Arg" and "matmul_readvariableop_resource" in n]
    assert len(resources) == 1, sorted(n for n in nodes if nodes[n]["op"] == "_Arg")
    received = recvs_feeding(nodes, resources[0])
    # Every codec's payload (the fp32 run's NoCompression too) arrives as the bytes of
    # one fused message; the payload's own dtypes never cross on their own. Beside it
    # crosses the worker's flag that the step is finite (tfgc.optimizer.finite_steps).
    assert received == ["DT_BOOL", "DT_UINT8"], (run, received,
                                                 report[run]["payload_dtypes"])


def test_worker_to_ps_bytes_equal_payload_bytes(report):
    tiny = report["tiny"]
    # Per-step RPC overhead: what the tiny model's worker sent beyond its payload
    # (same graph structure and payload tensors, 64 floats of gradient).
    overhead = (tiny["sent"] - tiny["payload"]) / STEPS
    assert 0 < overhead < 20_000, tiny
    for run in ("fp32", "int8", "threelc"):
        r = report[run]
        wire = r["sent"] - overhead * STEPS
        assert abs(wire - r["payload"]) <= 0.01 * r["payload"], (run, wire, r["payload"], overhead)
        assert all(math.isfinite(loss) for loss in r["losses"]), (run, r["losses"])
        # TrafficLogger put the same payload bytes into the Keras logs, per step.
        assert sum(r["logged_push_bytes"]) == pytest.approx(r["payload"]), r
    fp32 = report["fp32"]["sent"]
    assert report["fp32"]["payload"] == report["fp32"]["dense"]
    assert 0.24 < report["int8"]["sent"] / fp32 < 0.26
    assert report["threelc"]["sent"] / fp32 < 0.05
    print({run: {k: report[run][k] for k in ("sent", "payload", "dense")} for run in report
           if run != "dump_dir"}, f"overhead/step={overhead:.0f}")
