"""A Python client of cairn's services: runs (orchestrator), the artifact-store, the
sandbox-runner and ingest, blocking (`Client`) or on asyncio (`AsyncClient`)."""
from ._async import AsyncClient
from ._config import RetryPolicy, Settings
from ._errors import (
    CairnError, ConflictError, FailedPreconditionError, FieldViolation, InternalError,
    InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError,
    UnavailableError,
)
from ._sync import Client, Session
from ._types import (
    FINAL_STATES, BlockStatus, EntryKind, Event, ExecResult, FileInfo, Gate, GateState,
    GrepMatch, Identity, Level, LogChunk, LogStream, Manifest, ManifestArtifact, Node, NodeState,
    Note, PackSummary, Project, PutResult, Run, RunnerInfo, RunResult, TaskState, WriteOutcome,
)

__all__ = [
    "AsyncClient", "BlockStatus", "CairnError", "Client", "ConflictError", "EntryKind", "Event",
    "ExecResult", "FINAL_STATES", "FailedPreconditionError", "FieldViolation", "FileInfo", "Gate",
    "GateState", "GrepMatch", "Identity", "InternalError", "InvalidArgumentError", "Level",
    "LogChunk", "LogStream", "Manifest", "ManifestArtifact", "Node", "NodeState", "NotFoundError",
    "Note", "PackSummary", "PermissionDeniedError", "Project", "PutResult", "ResourceExhaustedError",
    "RetryPolicy", "Run", "RunResult", "RunnerInfo", "Session", "Settings", "TaskState",
    "UnavailableError", "WriteOutcome",
]
