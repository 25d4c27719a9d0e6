"""What the sync and the async client share: the RPC table, request builders, chunking with
sha256, and the cursors that let a resumed stream skip what it already delivered."""

from __future__ import annotations

import getpass
import hashlib
import io
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Generic, TypeVar, Union, cast

from google.protobuf.message import Message

from ._pb.cairn.v1 import artifact_store_pb2 as store_pb
from ._pb.cairn.v1 import common_pb2 as common_pb
from ._pb.cairn.v1 import ingest_pb2 as ingest_pb
from ._pb.cairn.v1 import orchestrator_pb2 as orch_pb
from ._pb.cairn.v1 import sandbox_pb2 as sandbox_pb
from ._types import Event, FileInfo, LogChunk, PackSummary, Run, TaskState

CHUNK = 256 * 1024
PathLike = Union[str, "os.PathLike[str]"]
# What `put` takes: bytes, a local file's path, a binary file object, or an iterable of chunks.
Source = Union[bytes, bytearray, memoryview, PathLike, IO[bytes], Iterable[bytes]]
RunRef = Union[str, Run]
Time = Union[str, datetime]


Q = TypeVar("Q", bound=Message)
R = TypeVar("R", bound=Message)


@dataclass(frozen=True)
class Rpc(Generic[Q, R]):
    """One method: the service that serves it, its path and its message types."""

    service: str
    path: str
    request: type[Q]
    response: type[R]


def _rpc(service: str, grpc_service: str, name: str, req: type[Q], resp: type[R]) -> Rpc[Q, R]:
    return Rpc(service, f"/cairn.v1.{grpc_service}/{name}", req, resp)


def _orch(name: str, req: type[Q], resp: type[R]) -> Rpc[Q, R]:
    return _rpc("orchestrator", "Orchestrator", name, req, resp)


def _store(name: str, req: type[Q], resp: type[R]) -> Rpc[Q, R]:
    return _rpc("store", "ArtifactStore", name, req, resp)


def _sandbox(name: str, req: type[Q], resp: type[R]) -> Rpc[Q, R]:
    return _rpc("sandbox", "SandboxRunner", name, req, resp)


def serialize(message: Message) -> bytes:
    return message.SerializeToString()


def who(by: str) -> str:
    """Who a human action is recorded as: `by`, else the local user (a service with a tokens
    file records the token's name whatever is sent)."""
    if by:
        return by
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "python-client"


SUBMIT = _orch("SubmitRun", orch_pb.SubmitRunRequest, orch_pb.RunInfo)
GET_RUN = _orch("GetRun", orch_pb.GetRunRequest, orch_pb.RunInfo)
LIST_RUNS = _orch("ListRuns", orch_pb.ListRunsRequest, orch_pb.ListRunsResponse)
WATCH_RUN = _orch("WatchRun", orch_pb.WatchRunRequest, common_pb.Event)
WATCH_LOGS = _orch("WatchLogs", orch_pb.WatchLogsRequest, orch_pb.LogChunk)
CANCEL = _orch("CancelRun", orch_pb.RunActionRequest, orch_pb.RunInfo)
RESUME = _orch("ResumeRun", orch_pb.RunActionRequest, orch_pb.RunInfo)
APPROVE = _orch("ApproveGate", orch_pb.GateDecisionRequest, orch_pb.RunInfo)
REJECT = _orch("RejectGate", orch_pb.GateDecisionRequest, orch_pb.RunInfo)
ADD_NOTE = _orch("AddNote", orch_pb.AddNoteRequest, orch_pb.AddNoteResponse)
REWORK = _orch("RequestRework", orch_pb.ReworkRequest, orch_pb.RunInfo)
EDIT_CONTEXT = _orch("EditContext", orch_pb.EditContextRequest, orch_pb.EditContextResponse)
WHOAMI = _orch("WhoAmI", orch_pb.WhoAmIRequest, orch_pb.WhoAmIResponse)

CREATE_PROJECT = _store("CreateProject", store_pb.CreateProjectRequest, store_pb.Project)
LIST_PROJECTS = _store("ListProjects", store_pb.ListProjectsRequest, store_pb.ListProjectsResponse)
PUT = _store("Put", store_pb.PutRequest, store_pb.PutResponse)
GET = _store("Get", store_pb.GetRequest, store_pb.GetResponse)
STAT = _store("Stat", store_pb.StatRequest, store_pb.FileInfo)
LIST = _store("List", store_pb.ListRequest, store_pb.ListResponse)
DELETE = _store("Delete", store_pb.DeleteRequest, store_pb.DeleteResponse)
CLAIM_RUN = _store("ClaimRun", store_pb.ClaimRunRequest, store_pb.ClaimRunResponse)
GRANT_CLAIM = _store(
    "GrantIngestClaim", store_pb.GrantIngestClaimRequest, store_pb.GrantIngestClaimResponse
)
READ_EVENTS = _store("ReadEvents", store_pb.ReadEventsRequest, common_pb.Event)

SB_RUN = _sandbox("Run", sandbox_pb.RunRequest, sandbox_pb.RunResult)
SB_OPEN = _sandbox("OpenSession", sandbox_pb.OpenSessionRequest, sandbox_pb.SessionInfo)
SB_EXEC = _sandbox("Exec", sandbox_pb.ExecRequest, sandbox_pb.ExecResult)
SB_READ = _sandbox("ReadFile", sandbox_pb.ReadFileRequest, sandbox_pb.ReadFileResponse)
SB_WRITE = _sandbox("WriteFile", sandbox_pb.WriteFileRequest, sandbox_pb.WriteFileResponse)
SB_GLOB = _sandbox("Glob", sandbox_pb.GlobRequest, sandbox_pb.GlobResponse)
SB_GREP = _sandbox("Grep", sandbox_pb.GrepRequest, sandbox_pb.GrepResponse)
SB_PACK = _sandbox("Pack", sandbox_pb.PackRequest, sandbox_pb.PackResponse)
SB_CLOSE = _sandbox("CloseSession", sandbox_pb.CloseSessionRequest, sandbox_pb.CloseSessionResponse)
SB_TOUCH = _sandbox("TouchSession", sandbox_pb.TouchSessionRequest, sandbox_pb.TouchSessionResponse)
SB_INFO = _sandbox("GetRunnerInfo", sandbox_pb.GetRunnerInfoRequest, sandbox_pb.RunnerInfo)

INGEST = _rpc("ingest", "Ingest", "Ingest", ingest_pb.IngestRequest, ingest_pb.IngestResponse)
PARSE = _rpc("ingest", "Ingest", "Parse", ingest_pb.IngestRequest, ingest_pb.IngestResponse)
SET_ENABLED = _rpc(
    "ingest", "Ingest", "SetEnabled", ingest_pb.SetEnabledRequest, ingest_pb.SetEnabledResponse
)
GET_ENABLED = _rpc(
    "ingest", "Ingest", "GetEnabled", ingest_pb.GetEnabledRequest, ingest_pb.SetEnabledResponse
)


def run_id(run: RunRef) -> str:
    return run.run_id if isinstance(run, Run) else run


def timestamp(t: Time | None) -> str:
    """RFC 3339 in UTC for a datetime (naive = UTC); a string passes as written."""
    if t is None:
        return ""
    if isinstance(t, str):
        return t
    aware = t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def submit_request(
    project: str,
    graph: PathLike | Mapping[str, Any] | None,
    *,
    vars: Mapping[str, str] | None,
    request_id: str | None,
    run_id: str | None,
    title: str,
    mode: str,
    prompt: str,
    llm: str,
    files: Mapping[str, bytes] | None,
    graph_dir: str,
    rerun_of: str = "",
) -> orch_pb.SubmitRunRequest:
    """A SubmitRun. A graph given as a dict is sent as JSON (which is YAML); one given as a path
    is read here. Without run_id and request_id a request_id is made, so that a retry after
    UNAVAILABLE returns the first run instead of starting a second."""
    if graph is None:
        graph_yaml = ""
    elif isinstance(graph, Mapping):
        graph_yaml = json.dumps(graph)
    else:
        graph_yaml = Path(graph).read_text()
    if not run_id and not request_id:
        request_id = f"py-{uuid.uuid4()}"
    return orch_pb.SubmitRunRequest(
        project_id=project,
        graph_yaml=graph_yaml,
        vars=dict(vars or {}),
        run_id=run_id or "",
        request_id=request_id or "",
        title=title,
        mode=mode,
        prompt=prompt,
        llm=llm,
        files=[orch_pb.InputFile(path=p, content=c) for p, c in (files or {}).items()],
        graph_dir=graph_dir,
        rerun_of=rerun_of,
    )


def list_runs_request(
    project: str,
    *,
    states: Iterable[TaskState] | None,
    search: str,
    since: Time | None,
    until: Time | None,
    stalled: bool,
    page_size: int,
    page_token: str,
) -> orch_pb.ListRunsRequest:
    return orch_pb.ListRunsRequest(
        project_id=project,
        states=[f"TASK_STATE_{TaskState(s).name}" for s in states or ()],
        text=search,
        created_after=timestamp(since),
        created_before=timestamp(until),
        stalled=stalled,
        page=common_pb.PageRequest(page_size=page_size, page_token=page_token),
    )


# -- streams that resume ------------------------------------------------------------------------


class EventCursor:
    """Where a resumed WatchRun / ReadEvents picks up: after the last event delivered. Events at
    or below it (a replay after a reconnect) are dropped, so nothing is delivered twice."""

    def __init__(self, from_seq: int) -> None:
        self.last = max(from_seq, 1) - 1

    def accept(self, m: common_pb.Event) -> Event | None:
        if m.seq <= self.last:
            return None
        self.last = m.seq
        return Event._from(m)

    @property
    def next_seq(self) -> int:
        return self.last + 1


class LogCursor:
    """Where a resumed WatchLogs picks up: per node and attempt, the last chunk delivered."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], int] = {}

    def accept(self, m: orch_pb.LogChunk) -> LogChunk | None:
        key = (m.node_id, m.attempt)
        if m.seq <= self.seen.get(key, 0):
            return None
        self.seen[key] = m.seq
        return LogChunk._from(m)

    def request(self, project: str, run: str, node: str, follow: bool) -> orch_pb.WatchLogsRequest:
        after_attempt, after_seq = 0, 0
        if node:
            mine = [(a, s) for (n, a), s in self.seen.items() if n == node]
            if mine:
                # Skips through (after_attempt, after_seq): later chunks and later attempts.
                after_attempt, after_seq = max(mine)
        return orch_pb.WatchLogsRequest(
            project_id=project,
            run_id=run,
            node_id=node,
            follow=follow,
            after_attempt=after_attempt,
            after_seq=after_seq,
        )


def state_may_change(event: Event) -> bool:
    """Events after which a waiter asks for the run's state again."""
    return event.type.startswith(("task.", "gate.", "run."))


# -- store transfers ----------------------------------------------------------------------------


class Upload:
    """The chunks of a Put, with their sha256. Bytes and files are hashed before the header
    goes out (the store then checks the digest and publishes nothing on a mismatch); an
    iterable is hashed as it is sent and checked against the store's answer."""

    def __init__(self, source: Source, chunk_size: int = CHUNK) -> None:
        self.chunk_size = chunk_size
        self._bytes: memoryview | None = None
        self._path: Path | None = None
        self._file: IO[bytes] | None = None
        self._iter: Iterable[bytes] | None = None
        self._start = 0
        self.sha256 = ""
        self.size: int | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._bytes = memoryview(source).cast("B")
            self.sha256 = hashlib.sha256(self._bytes).hexdigest()
            self.size = len(self._bytes)
        elif isinstance(source, (str, os.PathLike)):
            self._path = Path(source)
            self.sha256, self.size = _hash_file(self._path, chunk_size)
        elif isinstance(source, io.IOBase) or hasattr(source, "read"):
            f = cast(IO[bytes], source)
            self._file = f
            if f.seekable():
                self._start = f.tell()
                h = hashlib.sha256()
                size = 0
                for block in iter(lambda: f.read(chunk_size), b""):
                    h.update(block)
                    size += len(block)
                f.seek(self._start)
                self.sha256, self.size = h.hexdigest(), size
        else:
            self._iter = source
        self.sent = hashlib.sha256()
        self.sent_bytes = 0

    @property
    def replayable(self) -> bool:
        """Whether the upload can be sent again (a retry after UNAVAILABLE)."""
        return self._iter is None and (self._file is None or bool(self.sha256))

    def requests(self, header: store_pb.PutHeader) -> Iterator[store_pb.PutRequest]:
        header.expected_sha256 = self.sha256
        if self.size is not None:
            header.expected_size = self.size
        self.sent = hashlib.sha256()
        self.sent_bytes = 0
        yield store_pb.PutRequest(header=header)
        for chunk in self._chunks():
            self.sent.update(chunk)
            self.sent_bytes += len(chunk)
            yield store_pb.PutRequest(chunk=chunk)

    def _chunks(self) -> Iterator[bytes]:
        n = self.chunk_size
        if self._bytes is not None:
            for i in range(0, len(self._bytes), n):
                yield bytes(self._bytes[i : i + n])
        elif self._path is not None:
            with open(self._path, "rb") as f:
                yield from iter(lambda: f.read(n), b"")
        elif self._file is not None:
            fo = self._file
            if self.sha256:
                fo.seek(self._start)
            yield from iter(lambda: fo.read(n), b"")
        elif self._iter is not None:
            for chunk in self._iter:
                # Cut big pieces so that no message nears the gRPC size limit.
                for i in range(0, len(chunk), n):
                    yield bytes(chunk[i : i + n])

    def check(self, digest_sha256: str) -> None:
        if self.sha256 == "" and digest_sha256 != self.sent.hexdigest():
            raise ValueError(
                f"the store holds sha256 {digest_sha256} but {self.sent.hexdigest()} "
                "was sent: the upload was altered in transit; put it again"
            )


def _hash_file(path: Path, chunk_size: int) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk_size), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


class Download:
    """Receives a Get's messages into a sink, checking the size and sha256 the store announced."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.info: FileInfo | None = None
        self.hash = hashlib.sha256()
        self.size = 0

    def take(self, m: store_pb.GetResponse) -> None:
        if m.HasField("info"):
            self.info = FileInfo._from(m.info)
        else:
            self.hash.update(m.chunk)
            self.size += len(m.chunk)
            self.sink.write(m.chunk)

    def finish(self, whole: bool) -> FileInfo:
        if self.info is None:
            raise ValueError(
                "the store's answer carried no file information; is the address a "
                "cairn artifact-store?"
            )
        if whole and self.info.sha256 and self.hash.hexdigest() != self.info.sha256:
            raise ValueError(
                f"received {self.size} bytes with sha256 {self.hash.hexdigest()}, "
                f"the store announced {self.info.sha256}: get it again"
            )
        return self.info


class FileSink:
    """Writes a download to `path` through a temporary file renamed into place at the end."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.part")
        self.file: IO[bytes] = open(self.tmp, "wb")

    def commit(self) -> None:
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


# -- sandbox ------------------------------------------------------------------------------------


def _content(v: bytes | str | PathLike) -> bytes:
    """Bytes as given, a str as its UTF-8 text, a path object's file read."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return Path(v).read_bytes()


def sandbox_request(
    code: str,
    language: str,
    *,
    inputs: Mapping[str, bytes | str] | None,
    code_file: str,
    env: Mapping[str, str] | None,
    image: str,
    network: bool,
    timeout: float | None,
    memory_bytes: int,
    run: str,
    node: str,
) -> sandbox_pb.RunRequest:
    limits = sandbox_pb.Limits(
        timeout_ms=int(timeout * 1000) if timeout else 0, memory_bytes=memory_bytes
    )
    return sandbox_pb.RunRequest(
        language=language,
        code=code,
        code_file=code_file,
        input_files=[
            common_pb.FileContent(path=p, content=_content(c)) for p, c in (inputs or {}).items()
        ],
        limits=limits,
        env=dict(env or {}),
        image=image,
        network=network,
        run_id=run,
        node_id=node,
    )


def write_outputs(outputs: Mapping[str, bytes], directory: PathLike) -> None:
    """Writes a run's /output files below `directory`, refusing paths that would leave it."""
    root = Path(directory).resolve()
    for rel, content in outputs.items():
        target = (root / rel).resolve()
        if root != target and root not in target.parents:
            raise ValueError(f"the sandbox output {rel!r} would leave {root}; not written")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def ingest_request(
    project: str,
    document: bytes | str | PathLike,
    *,
    run: str,
    node: str,
    doc_path: str,
    mode: str,
    overwrite: bool,
    claim: str,
) -> ingest_pb.IngestRequest:
    """A str document is its text; a path (pathlib.Path, os.PathLike) is read."""
    content = _content(document)
    return ingest_pb.IngestRequest(
        project_id=project,
        run_id=run,
        node_id=node,
        mode=mode,
        doc_path=doc_path,
        content=content,
        overwrite=overwrite,
        claim=claim,
    )


def blocked_gate(run: Run) -> str:
    """The id of the run's one blocked gate, for approve/reject without a gate id."""
    blocked = [g.id for g in run.blocked_gates]
    if len(blocked) != 1:
        what = "no gate is blocked" if not blocked else f"gates {', '.join(blocked)} are blocked"
        raise ValueError(f"run {run.run_id}: {what}; name the gate with gate=")
    return blocked[0]


def pack_summary(summaries: list[sandbox_pb.PackSummary]) -> PackSummary:
    if not summaries:
        raise ValueError(
            "the runner's Pack stream ended without its summary: the archive is "
            "incomplete; pack again"
        )
    s = summaries[-1]
    return PackSummary(
        s.archive_name,
        s.digest.sha256,
        s.digest.size_bytes,
        s.entries,
        s.excluded,
        tuple((r.path, r.reason) for r in s.refused),
    )
