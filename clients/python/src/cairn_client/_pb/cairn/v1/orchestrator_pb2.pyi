from cairn_client._pb.cairn.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_PENDING: _ClassVar[NodeState]
    NODE_STATE_RUNNING: _ClassVar[NodeState]
    NODE_STATE_SUCCEEDED: _ClassVar[NodeState]
    NODE_STATE_FAILED: _ClassVar[NodeState]
    NODE_STATE_SKIPPED: _ClassVar[NodeState]
    NODE_STATE_CANCELED: _ClassVar[NodeState]
    NODE_STATE_BLOCKED: _ClassVar[NodeState]

class LogStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOG_STREAM_UNSPECIFIED: _ClassVar[LogStream]
    LOG_STREAM_STDOUT: _ClassVar[LogStream]
    LOG_STREAM_STDERR: _ClassVar[LogStream]
    LOG_STREAM_STEP: _ClassVar[LogStream]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_PENDING: NodeState
NODE_STATE_RUNNING: NodeState
NODE_STATE_SUCCEEDED: NodeState
NODE_STATE_FAILED: NodeState
NODE_STATE_SKIPPED: NodeState
NODE_STATE_CANCELED: NodeState
NODE_STATE_BLOCKED: NodeState
LOG_STREAM_UNSPECIFIED: LogStream
LOG_STREAM_STDOUT: LogStream
LOG_STREAM_STDERR: LogStream
LOG_STREAM_STEP: LogStream

class ReplayRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "vars", "by", "replay_run_id", "live_sandbox", "live_gates", "graph_yaml", "files", "live_after", "llm")
    class VarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    REPLAY_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_SANDBOX_FIELD_NUMBER: _ClassVar[int]
    LIVE_GATES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_YAML_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    LIVE_AFTER_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    vars: _containers.ScalarMap[str, str]
    by: str
    replay_run_id: str
    live_sandbox: bool
    live_gates: bool
    graph_yaml: str
    files: _containers.RepeatedCompositeFieldContainer[InputFile]
    live_after: bool
    llm: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., vars: _Optional[_Mapping[str, str]] = ..., by: _Optional[str] = ..., replay_run_id: _Optional[str] = ..., live_sandbox: _Optional[bool] = ..., live_gates: _Optional[bool] = ..., graph_yaml: _Optional[str] = ..., files: _Optional[_Iterable[_Union[InputFile, _Mapping]]] = ..., live_after: _Optional[bool] = ..., llm: _Optional[str] = ...) -> None: ...

class DiffRunsRequest(_message.Message):
    __slots__ = ("project_id", "run_a", "run_b")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_A_FIELD_NUMBER: _ClassVar[int]
    RUN_B_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_a: str
    run_b: str
    def __init__(self, project_id: _Optional[str] = ..., run_a: _Optional[str] = ..., run_b: _Optional[str] = ...) -> None: ...

class DiffRunsResponse(_message.Message):
    __slots__ = ("report_json", "verdict", "verdict_json")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_JSON_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    verdict: str
    verdict_json: str
    def __init__(self, report_json: _Optional[str] = ..., verdict: _Optional[str] = ..., verdict_json: _Optional[str] = ...) -> None: ...

class SubmitRunRequest(_message.Message):
    __slots__ = ("project_id", "graph_yaml", "vars", "run_id", "title", "mode", "prompt", "by", "llm", "request_id", "rerun_of", "files", "graph_dir")
    class VarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_YAML_FIELD_NUMBER: _ClassVar[int]
    VARS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_DIR_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    graph_yaml: str
    vars: _containers.ScalarMap[str, str]
    run_id: str
    title: str
    mode: str
    prompt: str
    by: str
    llm: str
    request_id: str
    rerun_of: str
    files: _containers.RepeatedCompositeFieldContainer[InputFile]
    graph_dir: str
    def __init__(self, project_id: _Optional[str] = ..., graph_yaml: _Optional[str] = ..., vars: _Optional[_Mapping[str, str]] = ..., run_id: _Optional[str] = ..., title: _Optional[str] = ..., mode: _Optional[str] = ..., prompt: _Optional[str] = ..., by: _Optional[str] = ..., llm: _Optional[str] = ..., request_id: _Optional[str] = ..., rerun_of: _Optional[str] = ..., files: _Optional[_Iterable[_Union[InputFile, _Mapping]]] = ..., graph_dir: _Optional[str] = ...) -> None: ...

class InputFile(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: bytes
    def __init__(self, path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WhoAmIResponse(_message.Message):
    __slots__ = ("name", "role", "projects", "tokens_required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PROJECTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    projects: _containers.RepeatedScalarFieldContainer[str]
    tokens_required: bool
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., projects: _Optional[_Iterable[str]] = ..., tokens_required: _Optional[bool] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("id", "type", "state", "attempts", "started_at", "finished_at", "error", "outputs_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    state: NodeState
    attempts: int
    started_at: str
    finished_at: str
    error: str
    outputs_json: str
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., attempts: _Optional[int] = ..., started_at: _Optional[str] = ..., finished_at: _Optional[str] = ..., error: _Optional[str] = ..., outputs_json: _Optional[str] = ...) -> None: ...

class GateInfo(_message.Message):
    __slots__ = ("id", "state", "reason", "decided_by", "note", "decided_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: _common_pb2.GateState
    reason: str
    decided_by: str
    note: str
    decided_at: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.GateState, str]] = ..., reason: _Optional[str] = ..., decided_by: _Optional[str] = ..., note: _Optional[str] = ..., decided_at: _Optional[str] = ...) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "project_id", "title", "state", "created_at", "updated_at", "nodes", "gates", "run_dir", "error", "blocks_not_written", "goal", "rerun_of", "replica", "stalled_since", "replay_of")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_NOT_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    STALLED_SINCE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_OF_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    project_id: str
    title: str
    state: _common_pb2.TaskState
    created_at: str
    updated_at: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    gates: _containers.RepeatedCompositeFieldContainer[GateInfo]
    run_dir: str
    error: str
    blocks_not_written: int
    goal: str
    rerun_of: str
    replica: str
    stalled_since: str
    replay_of: str
    def __init__(self, run_id: _Optional[str] = ..., project_id: _Optional[str] = ..., title: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.TaskState, str]] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., gates: _Optional[_Iterable[_Union[GateInfo, _Mapping]]] = ..., run_dir: _Optional[str] = ..., error: _Optional[str] = ..., blocks_not_written: _Optional[int] = ..., goal: _Optional[str] = ..., rerun_of: _Optional[str] = ..., replica: _Optional[str] = ..., stalled_since: _Optional[str] = ..., replay_of: _Optional[str] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("project_id", "states", "page", "text", "created_after", "created_before", "stalled")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    STALLED_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.TaskState]
    page: _common_pb2.PageRequest
    text: str
    created_after: str
    created_before: str
    stalled: bool
    def __init__(self, project_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_common_pb2.TaskState, str]]] = ..., page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ..., text: _Optional[str] = ..., created_after: _Optional[str] = ..., created_before: _Optional[str] = ..., stalled: _Optional[bool] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "from_seq", "follow_after_end")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_AFTER_END_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    from_seq: int
    follow_after_end: bool
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., follow_after_end: _Optional[bool] = ...) -> None: ...

class WatchLogsRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "node_id", "follow", "after_attempt", "after_seq")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    AFTER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    node_id: str
    follow: bool
    after_attempt: int
    after_seq: int
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., follow: _Optional[bool] = ..., after_attempt: _Optional[int] = ..., after_seq: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("node_id", "attempt", "seq", "stream", "data", "dropped_bytes", "end", "outcome", "error")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    attempt: int
    seq: int
    stream: LogStream
    data: bytes
    dropped_bytes: int
    end: bool
    outcome: str
    error: str
    def __init__(self, node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., seq: _Optional[int] = ..., stream: _Optional[_Union[LogStream, str]] = ..., data: _Optional[bytes] = ..., dropped_bytes: _Optional[int] = ..., end: _Optional[bool] = ..., outcome: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class RunActionRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "by", "reason")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    by: str
    reason: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., by: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class GateDecisionRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "gate_id", "by", "note")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    gate_id: str
    by: str
    note: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., gate_id: _Optional[str] = ..., by: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class AddNoteRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "by", "text")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    by: str
    text: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., by: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class AddNoteResponse(_message.Message):
    __slots__ = ("seq", "ref")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ref: str
    def __init__(self, seq: _Optional[int] = ..., ref: _Optional[str] = ...) -> None: ...

class ReworkRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "node_id", "by", "note", "from_snapshot")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    FROM_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    node_id: str
    by: str
    note: str
    from_snapshot: bool
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., by: _Optional[str] = ..., note: _Optional[str] = ..., from_snapshot: _Optional[bool] = ...) -> None: ...

class EditContextRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "by", "manifest_yaml")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_YAML_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    by: str
    manifest_yaml: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., by: _Optional[str] = ..., manifest_yaml: _Optional[str] = ...) -> None: ...

class EditTaskRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "by", "title", "goal", "milestone_notes")
    class MilestoneNotesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    MILESTONE_NOTES_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    by: str
    title: str
    goal: str
    milestone_notes: _containers.ScalarMap[str, str]
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., by: _Optional[str] = ..., title: _Optional[str] = ..., goal: _Optional[str] = ..., milestone_notes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EditContextResponse(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...
