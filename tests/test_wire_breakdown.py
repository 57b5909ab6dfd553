"""The parsers of benchmarks/wire_breakdown.py on hand-made HTTP/2 and strace text."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "wire_breakdown.py")
_spec = importlib.util.spec_from_file_location("wire_breakdown", _PATH)
wire_breakdown = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wire_breakdown)

DEVICE = b"/job:ps/replica:0/task:0/device:CPU:0"


def frame(kind, stream, body, flags=0):
    return len(body).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + body


def grpc(message):
    return b"\0" + len(message).to_bytes(4, "big") + message


def test_messages_are_joined_across_frames_and_streams():
    first, second = b"x" * 40, b"y" * 7
    wire = grpc(first)
    data = (frame(1, 3, b"headers") + frame(0, 3, wire[:20]) + frame(0, 5, grpc(second))
            + frame(8, 0, b"\0\0\0\1") + frame(0, 3, wire[20:], flags=1))
    assert sorted(wire_breakdown.grpc_messages(data)) == sorted([first, second])


def test_a_tensor_response_gives_its_dtype_and_a_request_its_kind():
    uint8_tensor = b"\x18\x85\x03" + b"\n\x06\x08\x04\x12\x00\x22\x00"
    float_tensor = b"\n\x06\x08\x01\x12\x00\x22\x00"
    assert wire_breakdown.tensor_dtype(uint8_tensor) == "uint8"
    assert wire_breakdown.tensor_dtype(float_tensor) == "float32"
    assert wire_breakdown.tensor_dtype(b"\x08\x01") is None
    call = b"__inference_train_function_1_partitioned_2" + (DEVICE + b'"' + DEVICE) * 3
    request = b"\x08\x01" + DEVICE + b";1;/job:worker;edge_12_model/bn/FusedBatchNormV3/ReadVariableOp;0:0"
    kinds, calls, handles = wire_breakdown.classify(
        [call, request, uint8_tensor, float_tensor, b"\x01"], DEVICE)
    assert (calls, handles) == (1, 3)
    assert kinds["function call"] == [1, len(call)]
    assert kinds["tensor requests: batch-norm statistics"] == [1, len(request)]
    assert kinds["tensors sent: uint8 (fused messages)"] == [1, len(uint8_tensor)]
    assert kinds["tensors sent: float32"] == [1, len(float_tensor)]
    assert kinds["other messages"] == [1, 1]
    cut = request[:request.index(b";0:0")]  # the trace ended inside the request's key
    kinds, _, _ = wire_breakdown.classify([cut], DEVICE)
    assert kinds["tensor requests: other"] == [1, len(cut)]


def test_a_partial_write_keeps_only_the_bytes_sent(tmp_path):
    trace = tmp_path / "strace.out"
    trace.write_text(
        '7 sendmsg(9, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="\\x01\\x02", '
        'iov_len=2}, {iov_base="\\x03\\x04", iov_len=2}], msg_iovlen=2, msg_controllen=0, '
        'msg_flags=0}, 0) = 3\n'
        '7 sendmsg(4, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base="\\x05", iov_len=1}], '
        'msg_iovlen=1, msg_controllen=0, msg_flags=0}, 0) = 1\n')
    assert wire_breakdown.sent_bytes(str(trace), {9}) == {9: bytearray(b"\x01\x02\x03")}


def _sendmsg(fd, data):
    iov = "".join(f"\\x{b:02x}" for b in data)
    return (f'sendmsg({fd}, {{msg_name=NULL, msg_namelen=0, msg_iov=[{{iov_base="{iov}", '
            f'iov_len={len(data)}}}], msg_iovlen=1, msg_controllen=0, msg_flags=0}}, '
            f'MSG_NOSIGNAL) = {len(data)}')


def test_a_call_another_thread_interrupted_is_joined(tmp_path):
    # strace -f splits a call that another thread's call overtakes in two lines.
    first, second = frame(0, 1, grpc(b"a" * 30)), frame(0, 3, grpc(b"b" * 5))
    head, _, result = _sendmsg(9, first).rpartition(" = ")
    trace = tmp_path / "strace.out"
    trace.write_text(f"41  {head} <unfinished ...>\n42  {_sendmsg(9, second)}\n"
                     f"41  <... sendmsg resumed>)            = {result}\n")
    assert wire_breakdown.sent_bytes(str(trace), {9}) == {9: bytearray(second + first)}


def test_a_trace_that_begins_inside_a_frame_is_read_from_the_next_whole_one(tmp_path):
    # The first write seen is the tail of a large tensor's frame, which began before
    # the trace did; read from there, its bytes would pass for frame headers.
    tail = b"\xff" * 9 + b"\x00\x10\x00\x00\x00\x00\x00\x00\x07"
    frames = frame(1, 5, b"headers") + frame(0, 5, grpc(b"c" * 12))
    trace = tmp_path / "strace.out"
    trace.write_text(f"7  {_sendmsg(9, tail)}\n7  {_sendmsg(9, frames)}\n")
    streams = wire_breakdown.sent_bytes(str(trace), {9})
    assert streams == {9: bytearray(frames)}
    assert wire_breakdown.grpc_messages(streams[9]) == [b"c" * 12]
