from cairn_client._pb.cairn.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StdStream(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STD_STREAM_UNSPECIFIED: _ClassVar[StdStream]
    STD_STREAM_STDOUT: _ClassVar[StdStream]
    STD_STREAM_STDERR: _ClassVar[StdStream]

class WriteMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_MODE_OVERWRITE: _ClassVar[WriteMode]
    WRITE_MODE_APPEND: _ClassVar[WriteMode]

class ArchiveFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARCHIVE_FORMAT_ZIP: _ClassVar[ArchiveFormat]
    ARCHIVE_FORMAT_TAR_GZ: _ClassVar[ArchiveFormat]
STD_STREAM_UNSPECIFIED: StdStream
STD_STREAM_STDOUT: StdStream
STD_STREAM_STDERR: StdStream
WRITE_MODE_OVERWRITE: WriteMode
WRITE_MODE_APPEND: WriteMode
ARCHIVE_FORMAT_ZIP: ArchiveFormat
ARCHIVE_FORMAT_TAR_GZ: ArchiveFormat

class Limits(_message.Message):
    __slots__ = ("timeout_ms", "memory_bytes", "cpu_millis", "pids", "max_input_files", "max_input_bytes", "max_output_files", "max_output_bytes", "max_stdout_bytes", "max_stderr_bytes")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STDOUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STDERR_BYTES_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    memory_bytes: int
    cpu_millis: int
    pids: int
    max_input_files: int
    max_input_bytes: int
    max_output_files: int
    max_output_bytes: int
    max_stdout_bytes: int
    max_stderr_bytes: int
    def __init__(self, timeout_ms: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., pids: _Optional[int] = ..., max_input_files: _Optional[int] = ..., max_input_bytes: _Optional[int] = ..., max_output_files: _Optional[int] = ..., max_output_bytes: _Optional[int] = ..., max_stdout_bytes: _Optional[int] = ..., max_stderr_bytes: _Optional[int] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("request_id", "run_id", "node_id", "language", "code", "code_file", "input_files", "limits", "network", "env", "image", "step_key", "redelivery")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    CODE_FILE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    run_id: str
    node_id: str
    language: str
    code: str
    code_file: str
    input_files: _containers.RepeatedCompositeFieldContainer[_common_pb2.FileContent]
    limits: Limits
    network: bool
    env: _containers.ScalarMap[str, str]
    image: str
    step_key: str
    redelivery: int
    def __init__(self, request_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., language: _Optional[str] = ..., code: _Optional[str] = ..., code_file: _Optional[str] = ..., input_files: _Optional[_Iterable[_Union[_common_pb2.FileContent, _Mapping]]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., network: _Optional[bool] = ..., env: _Optional[_Mapping[str, str]] = ..., image: _Optional[str] = ..., step_key: _Optional[str] = ..., redelivery: _Optional[int] = ...) -> None: ...

class OutputFile(_message.Message):
    __slots__ = ("path", "size_bytes", "sha256", "content")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    sha256: str
    content: bytes
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class RejectedOutput(_message.Message):
    __slots__ = ("path", "reason")
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    path: str
    reason: str
    def __init__(self, path: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RunResult(_message.Message):
    __slots__ = ("request_id", "job_id", "runner_id", "backend", "exit_code", "timed_out", "oom_killed", "duration_ms", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "output_files", "rejected_outputs", "outputs_truncated", "result_json", "rejected_outputs_truncated", "limits_enforced", "writable_area_full")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FILES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    REJECTED_OUTPUTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LIMITS_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_AREA_FULL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    job_id: str
    runner_id: str
    backend: str
    exit_code: int
    timed_out: bool
    oom_killed: bool
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    output_files: _containers.RepeatedCompositeFieldContainer[OutputFile]
    rejected_outputs: _containers.RepeatedCompositeFieldContainer[RejectedOutput]
    outputs_truncated: bool
    result_json: str
    rejected_outputs_truncated: bool
    limits_enforced: bool
    writable_area_full: bool
    def __init__(self, request_id: _Optional[str] = ..., job_id: _Optional[str] = ..., runner_id: _Optional[str] = ..., backend: _Optional[str] = ..., exit_code: _Optional[int] = ..., timed_out: _Optional[bool] = ..., oom_killed: _Optional[bool] = ..., duration_ms: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., output_files: _Optional[_Iterable[_Union[OutputFile, _Mapping]]] = ..., rejected_outputs: _Optional[_Iterable[_Union[RejectedOutput, _Mapping]]] = ..., outputs_truncated: _Optional[bool] = ..., result_json: _Optional[str] = ..., rejected_outputs_truncated: _Optional[bool] = ..., limits_enforced: _Optional[bool] = ..., writable_area_full: _Optional[bool] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("stream", "data")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream: StdStream
    data: bytes
    def __init__(self, stream: _Optional[_Union[StdStream, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunStreamResponse(_message.Message):
    __slots__ = ("output", "result", "heartbeat")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    output: OutputChunk
    result: RunResult
    heartbeat: Heartbeat
    def __init__(self, output: _Optional[_Union[OutputChunk, _Mapping]] = ..., result: _Optional[_Union[RunResult, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("interval_ms", "elapsed_ms")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    elapsed_ms: int
    def __init__(self, interval_ms: _Optional[int] = ..., elapsed_ms: _Optional[int] = ...) -> None: ...

class GitSource(_message.Message):
    __slots__ = ("url", "ref")
    URL_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    url: str
    ref: str
    def __init__(self, url: _Optional[str] = ..., ref: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "git", "network", "limits", "run_id", "node_id", "image")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GIT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    git: GitSource
    network: bool
    limits: Limits
    run_id: str
    node_id: str
    image: str
    def __init__(self, session_id: _Optional[str] = ..., git: _Optional[_Union[GitSource, _Mapping]] = ..., network: _Optional[bool] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., image: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "container_name", "backend", "git_commit", "image", "idle_timeout_ms", "snapshot_of", "memory_restored", "copies")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    GIT_COMMIT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_OF_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RESTORED_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    container_name: str
    backend: str
    git_commit: str
    image: str
    idle_timeout_ms: int
    snapshot_of: str
    memory_restored: bool
    copies: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, session_id: _Optional[str] = ..., container_name: _Optional[str] = ..., backend: _Optional[str] = ..., git_commit: _Optional[str] = ..., image: _Optional[str] = ..., idle_timeout_ms: _Optional[int] = ..., snapshot_of: _Optional[str] = ..., memory_restored: _Optional[bool] = ..., copies: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("session_id", "command", "timeout_ms", "workdir", "max_output_bytes", "detach")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DETACH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    command: str
    timeout_ms: int
    workdir: str
    max_output_bytes: int
    detach: bool
    def __init__(self, session_id: _Optional[str] = ..., command: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., workdir: _Optional[str] = ..., max_output_bytes: _Optional[int] = ..., detach: _Optional[bool] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("exit_code", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms", "writable_area_full")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_AREA_FULL_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    writable_area_full: bool
    def __init__(self, exit_code: _Optional[int] = ..., timed_out: _Optional[bool] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., duration_ms: _Optional[int] = ..., writable_area_full: _Optional[bool] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("session_id", "path", "max_bytes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    max_bytes: int
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("content", "truncated", "size_bytes")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    truncated: bool
    size_bytes: int
    def __init__(self, content: _Optional[bytes] = ..., truncated: _Optional[bool] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("session_id", "path", "content", "mode")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    content: bytes
    mode: WriteMode
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., content: _Optional[bytes] = ..., mode: _Optional[_Union[WriteMode, str]] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("bytes_written", "size_bytes")
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    size_bytes: int
    def __init__(self, bytes_written: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class GlobRequest(_message.Message):
    __slots__ = ("session_id", "pattern", "base_path", "max_results")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    BASE_PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    pattern: str
    base_path: str
    max_results: int
    def __init__(self, session_id: _Optional[str] = ..., pattern: _Optional[str] = ..., base_path: _Optional[str] = ..., max_results: _Optional[int] = ...) -> None: ...

class GlobResponse(_message.Message):
    __slots__ = ("paths", "truncated")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GrepRequest(_message.Message):
    __slots__ = ("session_id", "pattern", "path", "is_regex", "case_sensitive", "max_matches")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    IS_REGEX_FIELD_NUMBER: _ClassVar[int]
    CASE_SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_MATCHES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    pattern: str
    path: str
    is_regex: bool
    case_sensitive: bool
    max_matches: int
    def __init__(self, session_id: _Optional[str] = ..., pattern: _Optional[str] = ..., path: _Optional[str] = ..., is_regex: _Optional[bool] = ..., case_sensitive: _Optional[bool] = ..., max_matches: _Optional[int] = ...) -> None: ...

class GrepMatch(_message.Message):
    __slots__ = ("path", "line", "text")
    PATH_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    path: str
    line: int
    text: str
    def __init__(self, path: _Optional[str] = ..., line: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class GrepResponse(_message.Message):
    __slots__ = ("matches", "truncated")
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    matches: _containers.RepeatedCompositeFieldContainer[GrepMatch]
    truncated: bool
    def __init__(self, matches: _Optional[_Iterable[_Union[GrepMatch, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class PackRequest(_message.Message):
    __slots__ = ("session_id", "format", "exclude_patterns", "archive_name", "max_archive_bytes", "entry_mtime")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_ARCHIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_MTIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    format: ArchiveFormat
    exclude_patterns: _containers.RepeatedScalarFieldContainer[str]
    archive_name: str
    max_archive_bytes: int
    entry_mtime: str
    def __init__(self, session_id: _Optional[str] = ..., format: _Optional[_Union[ArchiveFormat, str]] = ..., exclude_patterns: _Optional[_Iterable[str]] = ..., archive_name: _Optional[str] = ..., max_archive_bytes: _Optional[int] = ..., entry_mtime: _Optional[str] = ...) -> None: ...

class PackSummary(_message.Message):
    __slots__ = ("archive_name", "digest", "entries", "excluded", "refused")
    ARCHIVE_NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    archive_name: str
    digest: _common_pb2.Digest
    entries: int
    excluded: int
    refused: _containers.RepeatedCompositeFieldContainer[RejectedOutput]
    def __init__(self, archive_name: _Optional[str] = ..., digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., entries: _Optional[int] = ..., excluded: _Optional[int] = ..., refused: _Optional[_Iterable[_Union[RejectedOutput, _Mapping]]] = ...) -> None: ...

class PackResponse(_message.Message):
    __slots__ = ("chunk", "summary")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    summary: PackSummary
    def __init__(self, chunk: _Optional[bytes] = ..., summary: _Optional[_Union[PackSummary, _Mapping]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...

class TouchSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class TouchSessionResponse(_message.Message):
    __slots__ = ("idle_timeout_ms",)
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    idle_timeout_ms: int
    def __init__(self, idle_timeout_ms: _Optional[int] = ...) -> None: ...

class PauseSessionRequest(_message.Message):
    __slots__ = ("session_id", "files_only", "keep_open")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_ONLY_FIELD_NUMBER: _ClassVar[int]
    KEEP_OPEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    files_only: bool
    keep_open: bool
    def __init__(self, session_id: _Optional[str] = ..., files_only: _Optional[bool] = ..., keep_open: _Optional[bool] = ...) -> None: ...

class SnapshotHeader(_message.Message):
    __slots__ = ("format", "backend", "image", "memory", "sha256", "size_bytes", "session_id", "network", "limits", "created_unix_ms")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    format: int
    backend: str
    image: str
    memory: bool
    sha256: str
    size_bytes: int
    session_id: str
    network: bool
    limits: Limits
    created_unix_ms: int
    def __init__(self, format: _Optional[int] = ..., backend: _Optional[str] = ..., image: _Optional[str] = ..., memory: _Optional[bool] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., session_id: _Optional[str] = ..., network: _Optional[bool] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class SnapshotEnd(_message.Message):
    __slots__ = ("sha256", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class SnapshotPart(_message.Message):
    __slots__ = ("header", "chunk", "end", "session_id", "copies")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    header: SnapshotHeader
    chunk: bytes
    end: SnapshotEnd
    session_id: str
    copies: int
    def __init__(self, header: _Optional[_Union[SnapshotHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., end: _Optional[_Union[SnapshotEnd, _Mapping]] = ..., session_id: _Optional[str] = ..., copies: _Optional[int] = ...) -> None: ...

class GetRunnerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunnerInfo(_message.Message):
    __slots__ = ("runner_id", "backend", "default_limits", "max_limits", "languages", "open_sessions", "warm_containers", "image", "allowed_images", "network_allowed")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_LIMITS_FIELD_NUMBER: _ClassVar[int]
    MAX_LIMITS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    WARM_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_IMAGES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    backend: str
    default_limits: Limits
    max_limits: Limits
    languages: _containers.RepeatedScalarFieldContainer[str]
    open_sessions: int
    warm_containers: int
    image: str
    allowed_images: _containers.RepeatedScalarFieldContainer[str]
    network_allowed: bool
    def __init__(self, runner_id: _Optional[str] = ..., backend: _Optional[str] = ..., default_limits: _Optional[_Union[Limits, _Mapping]] = ..., max_limits: _Optional[_Union[Limits, _Mapping]] = ..., languages: _Optional[_Iterable[str]] = ..., open_sessions: _Optional[int] = ..., warm_containers: _Optional[int] = ..., image: _Optional[str] = ..., allowed_images: _Optional[_Iterable[str]] = ..., network_allowed: _Optional[bool] = ...) -> None: ...
