from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BlockStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCK_STATUS_UNSPECIFIED: _ClassVar[BlockStatus]
    BLOCK_STATUS_WRITTEN: _ClassVar[BlockStatus]
    BLOCK_STATUS_SKIPPED: _ClassVar[BlockStatus]
    BLOCK_STATUS_REJECTED: _ClassVar[BlockStatus]

class ResultStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_STATUS_UNSPECIFIED: _ClassVar[ResultStatus]
    RESULT_STATUS_SUCCESS: _ClassVar[ResultStatus]
    RESULT_STATUS_PARTIAL: _ClassVar[ResultStatus]
    RESULT_STATUS_FAILED: _ClassVar[ResultStatus]
    RESULT_STATUS_NO_CHANGES: _ClassVar[ResultStatus]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_CREATED: _ClassVar[TaskState]
    TASK_STATE_WORKING: _ClassVar[TaskState]
    TASK_STATE_INPUT_REQUIRED: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELED: _ClassVar[TaskState]

class GateState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GATE_STATE_UNSPECIFIED: _ClassVar[GateState]
    GATE_STATE_OPEN: _ClassVar[GateState]
    GATE_STATE_BLOCKED: _ClassVar[GateState]
    GATE_STATE_APPROVED: _ClassVar[GateState]
    GATE_STATE_REJECTED: _ClassVar[GateState]
    GATE_STATE_CANCELED: _ClassVar[GateState]

class Level(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEVEL_UNSPECIFIED: _ClassVar[Level]
    LEVEL_DEBUG: _ClassVar[Level]
    LEVEL_INFO: _ClassVar[Level]
    LEVEL_WARNING: _ClassVar[Level]
    LEVEL_ERROR: _ClassVar[Level]
BLOCK_STATUS_UNSPECIFIED: BlockStatus
BLOCK_STATUS_WRITTEN: BlockStatus
BLOCK_STATUS_SKIPPED: BlockStatus
BLOCK_STATUS_REJECTED: BlockStatus
RESULT_STATUS_UNSPECIFIED: ResultStatus
RESULT_STATUS_SUCCESS: ResultStatus
RESULT_STATUS_PARTIAL: ResultStatus
RESULT_STATUS_FAILED: ResultStatus
RESULT_STATUS_NO_CHANGES: ResultStatus
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_CREATED: TaskState
TASK_STATE_WORKING: TaskState
TASK_STATE_INPUT_REQUIRED: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELED: TaskState
GATE_STATE_UNSPECIFIED: GateState
GATE_STATE_OPEN: GateState
GATE_STATE_BLOCKED: GateState
GATE_STATE_APPROVED: GateState
GATE_STATE_REJECTED: GateState
GATE_STATE_CANCELED: GateState
LEVEL_UNSPECIFIED: Level
LEVEL_DEBUG: Level
LEVEL_INFO: Level
LEVEL_WARNING: Level
LEVEL_ERROR: Level

class Digest(_message.Message):
    __slots__ = ("sha256", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class FileContent(_message.Message):
    __slots__ = ("path", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    content: bytes
    def __init__(self, path: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class EventInput(_message.Message):
    __slots__ = ("type", "node_id", "level", "data_json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    node_id: str
    level: Level
    data_json: str
    def __init__(self, type: _Optional[str] = ..., node_id: _Optional[str] = ..., level: _Optional[_Union[Level, str]] = ..., data_json: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "ts", "type", "run_id", "node_id", "level", "data_json", "line_json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    LINE_JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts: str
    type: str
    run_id: str
    node_id: str
    level: Level
    data_json: str
    line_json: str
    def __init__(self, seq: _Optional[int] = ..., ts: _Optional[str] = ..., type: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., level: _Optional[_Union[Level, str]] = ..., data_json: _Optional[str] = ..., line_json: _Optional[str] = ...) -> None: ...

class PageRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class RunFence(_message.Message):
    __slots__ = ("run_id", "epoch")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    epoch: int
    def __init__(self, run_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
