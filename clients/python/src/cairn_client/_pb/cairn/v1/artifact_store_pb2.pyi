from cairn_client._pb.cairn.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_OUTCOME_UNSPECIFIED: _ClassVar[WriteOutcome]
    WRITE_OUTCOME_CREATED: _ClassVar[WriteOutcome]
    WRITE_OUTCOME_UNCHANGED: _ClassVar[WriteOutcome]
    WRITE_OUTCOME_OVERWRITTEN: _ClassVar[WriteOutcome]

class PutDurability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_DURABILITY_UNSPECIFIED: _ClassVar[PutDurability]
    PUT_DURABILITY_SYNC: _ClassVar[PutDurability]
    PUT_DURABILITY_WITH_RUN_EVENTS: _ClassVar[PutDurability]

class EntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_KIND_UNSPECIFIED: _ClassVar[EntryKind]
    ENTRY_KIND_FILE: _ClassVar[EntryKind]
    ENTRY_KIND_DIRECTORY: _ClassVar[EntryKind]
    ENTRY_KIND_OTHER: _ClassVar[EntryKind]

class MergePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MERGE_POLICY_NONE: _ClassVar[MergePolicy]
    MERGE_POLICY_MAX: _ClassVar[MergePolicy]
WRITE_OUTCOME_UNSPECIFIED: WriteOutcome
WRITE_OUTCOME_CREATED: WriteOutcome
WRITE_OUTCOME_UNCHANGED: WriteOutcome
WRITE_OUTCOME_OVERWRITTEN: WriteOutcome
PUT_DURABILITY_UNSPECIFIED: PutDurability
PUT_DURABILITY_SYNC: PutDurability
PUT_DURABILITY_WITH_RUN_EVENTS: PutDurability
ENTRY_KIND_UNSPECIFIED: EntryKind
ENTRY_KIND_FILE: EntryKind
ENTRY_KIND_DIRECTORY: EntryKind
ENTRY_KIND_OTHER: EntryKind
MERGE_POLICY_NONE: MergePolicy
MERGE_POLICY_MAX: MergePolicy

class BackupRequest(_message.Message):
    __slots__ = ("project_id",)
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    def __init__(self, project_id: _Optional[str] = ...) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    def __init__(self, chunk: _Optional[bytes] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("chunk", "project_id")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    project_id: str
    def __init__(self, chunk: _Optional[bytes] = ..., project_id: _Optional[str] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("project_ids", "files", "bytes")
    PROJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    project_ids: _containers.RepeatedScalarFieldContainer[str]
    files: int
    bytes: int
    def __init__(self, project_ids: _Optional[_Iterable[str]] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ArchiveRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class ArchiveRunResponse(_message.Message):
    __slots__ = ("path", "size_bytes", "files")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    files: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., files: _Optional[int] = ...) -> None: ...

class UnarchiveRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class UnarchiveRunResponse(_message.Message):
    __slots__ = ("files", "size_bytes")
    FILES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    files: int
    size_bytes: int
    def __init__(self, files: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Project(_message.Message):
    __slots__ = ("project_id", "created_at")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    created_at: str
    def __init__(self, project_id: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...

class CreateProjectRequest(_message.Message):
    __slots__ = ("project_id",)
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    def __init__(self, project_id: _Optional[str] = ...) -> None: ...

class ListProjectsRequest(_message.Message):
    __slots__ = ("page",)
    PAGE_FIELD_NUMBER: _ClassVar[int]
    page: _common_pb2.PageRequest
    def __init__(self, page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ...) -> None: ...

class ListProjectsResponse(_message.Message):
    __slots__ = ("projects", "next_page_token")
    PROJECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    projects: _containers.RepeatedCompositeFieldContainer[Project]
    next_page_token: str
    def __init__(self, projects: _Optional[_Iterable[_Union[Project, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PutHeader(_message.Message):
    __slots__ = ("project_id", "path", "overwrite", "expected_sha256", "expected_size", "allowed_prefixes", "run_id", "create_project", "durability", "fence", "if_sha256", "claim", "digest_at_end")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHA256_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_PROJECT_FIELD_NUMBER: _ClassVar[int]
    DURABILITY_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    IF_SHA256_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_AT_END_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    path: str
    overwrite: bool
    expected_sha256: str
    expected_size: int
    allowed_prefixes: _containers.RepeatedScalarFieldContainer[str]
    run_id: str
    create_project: bool
    durability: PutDurability
    fence: _common_pb2.RunFence
    if_sha256: str
    claim: str
    digest_at_end: bool
    def __init__(self, project_id: _Optional[str] = ..., path: _Optional[str] = ..., overwrite: _Optional[bool] = ..., expected_sha256: _Optional[str] = ..., expected_size: _Optional[int] = ..., allowed_prefixes: _Optional[_Iterable[str]] = ..., run_id: _Optional[str] = ..., create_project: _Optional[bool] = ..., durability: _Optional[_Union[PutDurability, str]] = ..., fence: _Optional[_Union[_common_pb2.RunFence, _Mapping]] = ..., if_sha256: _Optional[str] = ..., claim: _Optional[str] = ..., digest_at_end: _Optional[bool] = ...) -> None: ...

class PutEnd(_message.Message):
    __slots__ = ("sha256", "size_bytes")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    size_bytes: int
    def __init__(self, sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("header", "chunk", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: PutHeader
    chunk: bytes
    end: PutEnd
    def __init__(self, header: _Optional[_Union[PutHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., end: _Optional[_Union[PutEnd, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("path", "digest", "outcome", "publication_token")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PUBLICATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    path: str
    digest: _common_pb2.Digest
    outcome: WriteOutcome
    publication_token: str
    def __init__(self, path: _Optional[str] = ..., digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., outcome: _Optional[_Union[WriteOutcome, str]] = ..., publication_token: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("project_id", "path", "offset", "length")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    path: str
    offset: int
    length: int
    def __init__(self, project_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: FileInfo
    chunk: bytes
    def __init__(self, info: _Optional[_Union[FileInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("project_id", "path", "include_sha256")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SHA256_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    path: str
    include_sha256: bool
    def __init__(self, project_id: _Optional[str] = ..., path: _Optional[str] = ..., include_sha256: _Optional[bool] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "kind", "size_bytes", "sha256", "modified_at")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_AT_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: EntryKind
    size_bytes: int
    sha256: str
    modified_at: str
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[EntryKind, str]] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., modified_at: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("project_id", "prefix", "recursive", "page")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    prefix: str
    recursive: bool
    page: _common_pb2.PageRequest
    def __init__(self, project_id: _Optional[str] = ..., prefix: _Optional[str] = ..., recursive: _Optional[bool] = ..., page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[FileInfo]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRunSummariesRequest(_message.Message):
    __slots__ = ("project_id", "states", "text", "created_after", "created_before", "page", "exclude_run_ids", "include_state_json", "after", "unfinished", "count_only")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    UNFINISHED_FIELD_NUMBER: _ClassVar[int]
    COUNT_ONLY_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    states: _containers.RepeatedScalarFieldContainer[str]
    text: str
    created_after: str
    created_before: str
    page: _common_pb2.PageRequest
    exclude_run_ids: _containers.RepeatedScalarFieldContainer[str]
    include_state_json: bool
    after: RunCursor
    unfinished: bool
    count_only: bool
    def __init__(self, project_id: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ..., text: _Optional[str] = ..., created_after: _Optional[str] = ..., created_before: _Optional[str] = ..., page: _Optional[_Union[_common_pb2.PageRequest, _Mapping]] = ..., exclude_run_ids: _Optional[_Iterable[str]] = ..., include_state_json: _Optional[bool] = ..., after: _Optional[_Union[RunCursor, _Mapping]] = ..., unfinished: _Optional[bool] = ..., count_only: _Optional[bool] = ...) -> None: ...

class RunCursor(_message.Message):
    __slots__ = ("created_at", "run_id")
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    created_at: str
    run_id: str
    def __init__(self, created_at: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ("run_id", "title", "goal", "state", "created_at", "updated_at", "indexed", "state_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    title: str
    goal: str
    state: str
    created_at: str
    updated_at: str
    indexed: bool
    state_json: bytes
    def __init__(self, run_id: _Optional[str] = ..., title: _Optional[str] = ..., goal: _Optional[str] = ..., state: _Optional[str] = ..., created_at: _Optional[str] = ..., updated_at: _Optional[str] = ..., indexed: _Optional[bool] = ..., state_json: _Optional[bytes] = ...) -> None: ...

class ListRunSummariesResponse(_message.Message):
    __slots__ = ("runs", "next_page_token", "total")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    next_page_token: str
    total: int
    def __init__(self, runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("project_id", "path", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    path: str
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., path: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "events", "epoch", "publication_tokens", "claim")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PUBLICATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.EventInput]
    epoch: int
    publication_tokens: _containers.RepeatedScalarFieldContainer[str]
    claim: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_common_pb2.EventInput, _Mapping]]] = ..., epoch: _Optional[int] = ..., publication_tokens: _Optional[_Iterable[str]] = ..., claim: _Optional[str] = ...) -> None: ...

class ClaimRunRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "holder")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    holder: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., holder: _Optional[str] = ...) -> None: ...

class ClaimRunResponse(_message.Message):
    __slots__ = ("epoch", "last_seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    last_seq: int
    def __init__(self, epoch: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class GrantIngestClaimRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "epoch", "ttl_s", "allowed_prefixes")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    epoch: int
    ttl_s: int
    allowed_prefixes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., epoch: _Optional[int] = ..., ttl_s: _Optional[int] = ..., allowed_prefixes: _Optional[_Iterable[str]] = ...) -> None: ...

class GrantIngestClaimResponse(_message.Message):
    __slots__ = ("claim", "expires_at", "allowed_prefixes")
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    claim: str
    expires_at: str
    allowed_prefixes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, claim: _Optional[str] = ..., expires_at: _Optional[str] = ..., allowed_prefixes: _Optional[_Iterable[str]] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("first_seq", "last_seq")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    last_seq: int
    def __init__(self, first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class ReadEventsRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "from_seq", "follow", "limit")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    from_seq: int
    follow: bool
    limit: int
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., follow: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class UpdateJsonRequest(_message.Message):
    __slots__ = ("project_id", "path", "expected_version", "patch_json", "merge", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PATCH_JSON_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    path: str
    expected_version: int
    patch_json: str
    merge: MergePolicy
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., path: _Optional[str] = ..., expected_version: _Optional[int] = ..., patch_json: _Optional[str] = ..., merge: _Optional[_Union[MergePolicy, str]] = ..., run_id: _Optional[str] = ...) -> None: ...

class UpdateJsonResponse(_message.Message):
    __slots__ = ("version", "document_json", "merged_conflict")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    MERGED_CONFLICT_FIELD_NUMBER: _ClassVar[int]
    version: int
    document_json: str
    merged_conflict: bool
    def __init__(self, version: _Optional[int] = ..., document_json: _Optional[str] = ..., merged_conflict: _Optional[bool] = ...) -> None: ...
