"""benchmarks.step_anatomy reads a step's exchanges from a worker's TensorFlow log."""
from benchmarks.step_anatomy import report, steps_in_log

_FUNCTION = "__inference_train_function_647"
_LOG = f"""\
I0000 00:00:100.000000   11 execute.cc:2268] Entering eager executing local operation '{_FUNCTION}' on device 'w'
I0000 00:00:100.100000   12 base_rendezvous_mgr.cc:342] RemoteRendezvous Finished Remote Recv 0x7f /job:ps/replica:0/task:0/device:CPU:0;84b6;/job:worker/replica:0/task:0/device:CPU:0;edge_75_sequential/dense/BiasAdd/ReadVariableOp;0:0
I0000 00:00:100.200000   12 base_rendezvous_mgr.cc:342] RemoteRendezvous Finished Remote Recv 0x7f /job:ps/replica:0/task:0/device:CPU:0;84b6;/job:worker/replica:0/task:0/device:CPU:0;edge_211_GroupCrossDeviceControlEdges_0/Identity_5;0:0
I0000 00:00:100.300000   11 execute.cc:2272] Exiting eager executing local operation '{_FUNCTION}' on device 'w', status code is OK
I0000 00:00:100.400000   11 execute.cc:2268] Entering eager executing local operation '{_FUNCTION}' on device 'w'
I0000 00:00:100.500000   11 execute.cc:2272] Exiting eager executing local operation '{_FUNCTION}' on device 'w', status code is OK
"""


def test_steps_are_timed_in_round_trips_from_their_start(tmp_path):
    path = tmp_path / "worker-0.log"
    path.write_text("I0000 00:00:99.000000   11 execute.cc:2268] before the epoch\n" + _LOG)
    steps = steps_in_log(str(path), since=99.5, rtt_s=0.1)
    assert len(steps) == 2
    first = steps[0]
    assert [a[0] for a in first["arrived"]] == [1.0, 2.0]
    assert first["arrived"][1][1] == "GroupCrossDeviceControlEdges_0/Identity_5"
    assert (first["returned"], first["next_call"]) == (3.0, 4.0)
    assert "next_call" not in steps[1]  # the epoch's last step: no call after it here
    table = report({"configs": ["x"], "steps": {"x": steps}})
    assert "| x | 2.00 | 3.00 | 4.00 |" in table
