"""Put, get, list and stat through stubs generated from proto/ by grpcio-tools, against `cairn up`."""
import hashlib
import sys
import time

import grpc
from cairn.v1 import artifact_store_pb2 as pb
from cairn.v1 import artifact_store_pb2_grpc as rpc

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
    assert e.code() == grpc.StatusCode.ALREADY_EXISTS, e
    reasons = dict(e.trailing_metadata() or ())
    assert reasons.get("cairn-reason") == "exists", reasons

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

print("python grpcio client: put/get/list/stat against cairn up OK")
