"""Put, get, list and stat through stubs generated from proto/ by grpcio-tools, against `cairn up`;
refusals read as google.rpc.Status with an ErrorInfo; idempotent SubmitRun; gzip requests."""
import hashlib
import sys
import time

import grpc
from cairn.v1 import artifact_store_pb2 as pb
from cairn.v1 import artifact_store_pb2_grpc as rpc
from cairn.v1 import orchestrator_pb2 as opb
from cairn.v1 import orchestrator_pb2_grpc as orpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

addr = sys.argv[1]
channel = grpc.insecure_channel(addr)
deadline = time.time() + 30
while True:
    try:
        grpc.channel_ready_future(channel).result(timeout=1)
        break
    except grpc.FutureTimeoutError:
        if time.time() > deadline:
            sys.exit(f"cairn up did not answer on {addr}")
store = rpc.ArtifactStoreStub(channel)
orchestrator = orpc.OrchestratorStub(channel)


def error_info(e, code, reason):
    """The ErrorInfo of a refusal, checked against its code and `cairn-reason`."""
    assert e.code() == code, e
    assert dict(e.trailing_metadata() or ()).get("cairn-reason") == reason, e.trailing_metadata()
    status = rpc_status.from_call(e)
    assert status is not None, f"no grpc-status-details-bin: {e}"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.reason == reason and info.domain == "cairn", info
            return info
    sys.exit(f"no ErrorInfo among the details of {e}")

body = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: several chunks
digest = hashlib.sha256(body).hexdigest()

def put(path, data, overwrite=False):
    def requests():
        yield pb.PutRequest(header=pb.PutHeader(project_id="py", path=path, create_project=True,
                                                overwrite=overwrite, expected_sha256=hashlib.sha256(data).hexdigest()))
        for i in range(0, len(data), 256 * 1024):
            yield pb.PutRequest(chunk=data[i:i + 256 * 1024])
    return store.Put(requests())

r = put("docs/py/data.bin", body)
assert r.path == "docs/py/data.bin", r
assert r.digest.sha256 == digest and r.digest.size_bytes == len(body), r
assert r.outcome == pb.WRITE_OUTCOME_CREATED, r
assert put("docs/py/data.bin", body).outcome == pb.WRITE_OUTCOME_UNCHANGED

try:
    put("docs/py/data.bin", b"other bytes")
    sys.exit("overwrite without overwrite=true was accepted")
except grpc.RpcError as e:
    info = error_info(e, grpc.StatusCode.ALREADY_EXISTS, "exists")
    assert info.metadata["path"] == "docs/py/data.bin" and info.metadata["project"] == "py", info

try:
    put("../escape.txt", b"x")
    sys.exit("traversal accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert dict(e.trailing_metadata() or ()).get("cairn-reason") == "traversal"

got = b""
info = None
for msg in store.Get(pb.GetRequest(project_id="py", path="docs/py/data.bin")):
    if msg.HasField("info"):
        info = msg.info
    else:
        got += msg.chunk
assert got == body, (len(got), len(body))
assert info.sha256 == digest and info.size_bytes == len(body), info

ranged = b"".join(m.chunk for m in store.Get(pb.GetRequest(project_id="py", path="docs/py/data.bin", offset=10, length=5)) if not m.HasField("info"))
assert ranged == body[10:15], ranged

put("docs/py/b.txt", b"b")
listing = store.List(pb.ListRequest(project_id="py", prefix="docs/py", recursive=True))
paths = [e.path for e in listing.entries]
assert paths == ["docs/py/b.txt", "docs/py/data.bin"], paths

st = store.Stat(pb.StatRequest(project_id="py", path="docs/py/data.bin", include_sha256=True))
assert st.sha256 == digest and st.size_bytes == len(body), st

# gzip-compressed requests are accepted (replies stay uncompressed).
st = store.Stat(pb.StatRequest(project_id="py", path="docs/py/b.txt"), compression=grpc.Compression.Gzip)
assert st.size_bytes == 1, st

# An enum number the protos do not declare is refused, not read as the default.
try:
    store.Put(iter([pb.PutRequest(header=pb.PutHeader(project_id="py", path="docs/py/e.txt", durability=9))]))
    sys.exit("durability=9 was accepted")
except grpc.RpcError as e:
    info = error_info(e, grpc.StatusCode.INVALID_ARGUMENT, "unknown_enum")
    assert info.metadata["field"] == "durability", info

# Bytes that are not the request message: INVALID_ARGUMENT `malformed`, not INTERNAL.
raw_stat = channel.unary_unary("/cairn.v1.ArtifactStore/Stat")
try:
    raw_stat(b"\x0a\x03\xff\xfe\xfd")  # field 1 (project_id) is not UTF-8
    sys.exit("a malformed request was accepted")
except grpc.RpcError as e:
    error_info(e, grpc.StatusCode.INVALID_ARGUMENT, "malformed")

# SubmitRun with a request_id: a retry returns the first run; re-using a run id names it.
graph = "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n"
first = orchestrator.SubmitRun(opb.SubmitRunRequest(project_id="py", graph_yaml=graph, request_id="py-retry-1"))
again = orchestrator.SubmitRun(opb.SubmitRunRequest(project_id="py", graph_yaml=graph, request_id="py-retry-1"))
assert first.run_id == again.run_id, (first.run_id, again.run_id)
try:
    orchestrator.SubmitRun(opb.SubmitRunRequest(project_id="py", graph_yaml=graph, run_id=first.run_id))
    sys.exit("a second run with the same id was accepted")
except grpc.RpcError as e:
    info = error_info(e, grpc.StatusCode.ALREADY_EXISTS, "exists")
    assert info.metadata["run_id"] == first.run_id, info

print("python grpcio client: put/get/list/stat, ErrorInfo details, gzip, idempotent SubmitRun against cairn up OK")
