"""What the client returns: frozen dataclasses and enums made from the services' messages
(proto/cairn/v1), so that callers never handle protobuf objects."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from ._pb.cairn.v1 import artifact_store_pb2 as store_pb
from ._pb.cairn.v1 import common_pb2 as common_pb
from ._pb.cairn.v1 import ingest_pb2 as ingest_pb
from ._pb.cairn.v1 import orchestrator_pb2 as orch_pb
from ._pb.cairn.v1 import sandbox_pb2 as sandbox_pb


class TaskState(enum.IntEnum):
    """State of a run."""

    UNSPECIFIED = 0
    CREATED = 1
    WORKING = 2
    INPUT_REQUIRED = 3
    COMPLETED = 4
    FAILED = 5
    CANCELED = 6

    @property
    def final(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED)


FINAL_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED})


class NodeState(enum.IntEnum):
    UNSPECIFIED = 0
    PENDING = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    SKIPPED = 5
    CANCELED = 6
    BLOCKED = 7


class GateState(enum.IntEnum):
    UNSPECIFIED = 0
    OPEN = 1
    BLOCKED = 2
    APPROVED = 3
    REJECTED = 4
    CANCELED = 5


class Level(enum.IntEnum):
    UNSPECIFIED = 0
    DEBUG = 1
    INFO = 2
    WARNING = 3
    ERROR = 4


class WriteOutcome(enum.IntEnum):
    UNSPECIFIED = 0
    CREATED = 1
    UNCHANGED = 2
    OVERWRITTEN = 3


class EntryKind(enum.IntEnum):
    UNSPECIFIED = 0
    FILE = 1
    DIRECTORY = 2
    OTHER = 3


class LogStream(enum.IntEnum):
    UNSPECIFIED = 0
    STDOUT = 1
    STDERR = 2
    STEP = 3


class BlockStatus(enum.IntEnum):
    UNSPECIFIED = 0
    WRITTEN = 1
    SKIPPED = 2
    REJECTED = 3


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def _enum(kind: type[enum.IntEnum], value: int) -> Any:
    try:
        return kind(value)
    except ValueError:  # a newer service's value: keep the number
        return kind(0)


@dataclass(frozen=True)
class Node:
    id: str
    type: str
    state: NodeState
    attempts: int
    started_at: str
    finished_at: str
    error: str
    outputs: dict[str, Any]

    @classmethod
    def _from(cls, m: orch_pb.NodeInfo) -> Node:
        return cls(
            m.id,
            m.type,
            _enum(NodeState, m.state),
            m.attempts,
            m.started_at,
            m.finished_at,
            m.error,
            _json(m.outputs_json),
        )


@dataclass(frozen=True)
class Gate:
    id: str
    state: GateState
    reason: str
    decided_by: str
    note: str
    decided_at: str

    @classmethod
    def _from(cls, m: orch_pb.GateInfo) -> Gate:
        return cls(m.id, _enum(GateState, m.state), m.reason, m.decided_by, m.note, m.decided_at)


@dataclass(frozen=True)
class Run:
    """A run as the orchestrator reports it (GetRun)."""

    run_id: str
    project: str
    title: str
    state: TaskState
    created_at: str
    updated_at: str
    nodes: tuple[Node, ...]
    gates: tuple[Gate, ...]
    run_dir: str
    error: str
    blocks_not_written: int
    goal: str
    rerun_of: str
    stalled_since: str

    @classmethod
    def _from(cls, m: orch_pb.RunInfo) -> Run:
        return cls(
            m.run_id,
            m.project_id,
            m.title,
            _enum(TaskState, m.state),
            m.created_at,
            m.updated_at,
            tuple(Node._from(n) for n in m.nodes),
            tuple(Gate._from(g) for g in m.gates),
            m.run_dir,
            m.error,
            m.blocks_not_written,
            m.goal,
            m.rerun_of,
            m.stalled_since,
        )

    def node(self, node_id: str) -> Node:
        """The node with this id (KeyError when the graph has none)."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def blocked_gates(self) -> tuple[Gate, ...]:
        return tuple(g for g in self.gates if g.state == GateState.BLOCKED)


@dataclass(frozen=True)
class Event:
    """One line of a run's events.jsonl; `seq` counts 1, 2, 3 ... per run, without gaps."""

    seq: int
    ts: str
    type: str
    run_id: str
    node_id: str
    level: Level
    data: dict[str, Any]
    line: str

    @classmethod
    def _from(cls, m: common_pb.Event) -> Event:
        return cls(
            m.seq,
            m.ts,
            m.type,
            m.run_id,
            m.node_id,
            _enum(Level, m.level),
            _json(m.data_json),
            m.line_json,
        )


@dataclass(frozen=True)
class LogChunk:
    """A piece of one node attempt's output (`end` marks the attempt's last chunk)."""

    node_id: str
    attempt: int
    seq: int
    stream: LogStream
    data: bytes
    dropped_bytes: int
    end: bool
    outcome: str
    error: str

    @classmethod
    def _from(cls, m: orch_pb.LogChunk) -> LogChunk:
        return cls(
            m.node_id,
            m.attempt,
            m.seq,
            _enum(LogStream, m.stream),
            m.data,
            m.dropped_bytes,
            m.end,
            m.outcome,
            m.error,
        )


@dataclass(frozen=True)
class Note:
    seq: int
    ref: str


@dataclass(frozen=True)
class Identity:
    """Who the orchestrator takes the caller for (WhoAmI)."""

    name: str
    role: str
    projects: tuple[str, ...]
    tokens_required: bool


@dataclass(frozen=True)
class PutResult:
    path: str
    sha256: str
    size: int
    outcome: WriteOutcome

    @classmethod
    def _from(cls, m: store_pb.PutResponse) -> PutResult:
        return cls(m.path, m.digest.sha256, m.digest.size_bytes, _enum(WriteOutcome, m.outcome))


@dataclass(frozen=True)
class FileInfo:
    path: str
    kind: EntryKind
    size: int
    sha256: str
    modified_at: str

    @classmethod
    def _from(cls, m: store_pb.FileInfo) -> FileInfo:
        return cls(m.path, _enum(EntryKind, m.kind), m.size_bytes, m.sha256, m.modified_at)


@dataclass(frozen=True)
class Project:
    project_id: str
    created_at: str


@dataclass(frozen=True)
class RunResult:
    """A one-shot sandbox run. A program that fails is a result (exit_code != 0), not an error."""

    exit_code: int
    timed_out: bool
    oom_killed: bool
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    outputs: dict[str, bytes]
    rejected_outputs: tuple[tuple[str, str], ...]
    outputs_truncated: bool
    request_id: str
    job_id: str
    runner_id: str
    backend: str
    limits_enforced: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    @classmethod
    def _from(cls, m: sandbox_pb.RunResult) -> RunResult:
        return cls(
            m.exit_code,
            m.timed_out,
            m.oom_killed,
            m.duration_ms,
            m.stdout,
            m.stderr,
            m.stdout_truncated,
            m.stderr_truncated,
            {f.path: f.content for f in m.output_files},
            tuple((r.path, r.reason) for r in m.rejected_outputs),
            m.outputs_truncated,
            m.request_id,
            m.job_id,
            m.runner_id,
            m.backend,
            m.limits_enforced,
        )


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    writable_area_full: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def _from(cls, m: sandbox_pb.ExecResult) -> ExecResult:
        return cls(
            m.exit_code,
            m.timed_out,
            m.stdout,
            m.stderr,
            m.stdout_truncated,
            m.stderr_truncated,
            m.duration_ms,
            m.writable_area_full,
        )


@dataclass(frozen=True)
class GrepMatch:
    path: str
    line: int
    text: str


@dataclass(frozen=True)
class PackSummary:
    archive_name: str
    sha256: str
    size: int
    entries: int
    excluded: int
    refused: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RunnerInfo:
    runner_id: str
    backend: str
    languages: tuple[str, ...]
    open_sessions: int
    image: str
    allowed_images: tuple[str, ...]
    network_allowed: bool

    @classmethod
    def _from(cls, m: sandbox_pb.RunnerInfo) -> RunnerInfo:
        return cls(
            m.runner_id,
            m.backend,
            tuple(m.languages),
            m.open_sessions,
            m.image,
            tuple(m.allowed_images),
            m.network_allowed,
        )


@dataclass(frozen=True)
class ManifestArtifact:
    """One code block of an ingested document (manifest v1 `artifacts[]`)."""

    index: int
    lang: str
    declared_file: str
    workspace_path: str
    bytes: int
    sha256: str
    status: BlockStatus
    reason: str


@dataclass(frozen=True)
class Manifest:
    """Ingest's manifest v1: the blocks, a summary, and the JSON exactly as stored."""

    version: int
    run_id: str
    node_id: str
    source: dict[str, Any]
    artifacts: tuple[ManifestArtifact, ...]
    total_blocks: int
    written: int
    skipped: int
    rejected: int
    path: str
    level: Level
    errors: tuple[str, ...]
    enabled: bool
    json: str
    document: dict[str, Any] = field(repr=False)

    @classmethod
    def _from(cls, m: ingest_pb.IngestResponse) -> Manifest:
        doc = _json(m.manifest_json)
        doc = doc if isinstance(doc, dict) else {}
        version = str(doc.get("version", "1"))
        source = doc.get("source")
        arts = tuple(
            ManifestArtifact(
                a.index,
                a.lang,
                a.declared_file,
                a.workspace_path,
                a.bytes,
                a.sha256,
                _enum(BlockStatus, a.status),
                a.reason,
            )
            for a in m.artifacts
        )
        s = m.summary
        return cls(
            int(version) if version.isdigit() else 0,
            str(doc.get("run_id", "")),
            str(doc.get("node_id", "")),
            source if isinstance(source, dict) else {},
            arts,
            s.total_blocks,
            s.written,
            s.skipped,
            s.rejected,
            m.manifest_path,
            _enum(Level, m.level),
            tuple(m.errors),
            m.enabled,
            m.manifest_json,
            doc,
        )
