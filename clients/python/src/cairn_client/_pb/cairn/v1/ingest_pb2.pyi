from cairn_client._pb.cairn.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OverwritePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERWRITE_POLICY_UNSPECIFIED: _ClassVar[OverwritePolicy]
    OVERWRITE_POLICY_NEVER: _ClassVar[OverwritePolicy]
    OVERWRITE_POLICY_INGESTED: _ClassVar[OverwritePolicy]
    OVERWRITE_POLICY_ALWAYS: _ClassVar[OverwritePolicy]
OVERWRITE_POLICY_UNSPECIFIED: OverwritePolicy
OVERWRITE_POLICY_NEVER: OverwritePolicy
OVERWRITE_POLICY_INGESTED: OverwritePolicy
OVERWRITE_POLICY_ALWAYS: OverwritePolicy

class IngestRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "node_id", "mode", "doc_path", "content", "overwrite", "source_kind", "overwrite_policy", "claim")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DOC_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_KIND_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_POLICY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    node_id: str
    mode: str
    doc_path: str
    content: bytes
    overwrite: bool
    source_kind: str
    overwrite_policy: OverwritePolicy
    claim: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., mode: _Optional[str] = ..., doc_path: _Optional[str] = ..., content: _Optional[bytes] = ..., overwrite: _Optional[bool] = ..., source_kind: _Optional[str] = ..., overwrite_policy: _Optional[_Union[OverwritePolicy, str]] = ..., claim: _Optional[str] = ...) -> None: ...

class ManifestArtifact(_message.Message):
    __slots__ = ("index", "lang", "declared_file", "workspace_path", "bytes", "sha256", "status", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LANG_FIELD_NUMBER: _ClassVar[int]
    DECLARED_FILE_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    lang: str
    declared_file: str
    workspace_path: str
    bytes: int
    sha256: str
    status: _common_pb2.BlockStatus
    reason: str
    def __init__(self, index: _Optional[int] = ..., lang: _Optional[str] = ..., declared_file: _Optional[str] = ..., workspace_path: _Optional[str] = ..., bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.BlockStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ManifestSummary(_message.Message):
    __slots__ = ("total_blocks", "written", "skipped", "rejected")
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    total_blocks: int
    written: int
    skipped: int
    rejected: int
    def __init__(self, total_blocks: _Optional[int] = ..., written: _Optional[int] = ..., skipped: _Optional[int] = ..., rejected: _Optional[int] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("manifest_json", "artifacts", "summary", "manifest_path", "level", "errors", "enabled")
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_PATH_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    manifest_json: str
    artifacts: _containers.RepeatedCompositeFieldContainer[ManifestArtifact]
    summary: ManifestSummary
    manifest_path: str
    level: _common_pb2.Level
    errors: _containers.RepeatedScalarFieldContainer[str]
    enabled: bool
    def __init__(self, manifest_json: _Optional[str] = ..., artifacts: _Optional[_Iterable[_Union[ManifestArtifact, _Mapping]]] = ..., summary: _Optional[_Union[ManifestSummary, _Mapping]] = ..., manifest_path: _Optional[str] = ..., level: _Optional[_Union[_common_pb2.Level, str]] = ..., errors: _Optional[_Iterable[str]] = ..., enabled: _Optional[bool] = ...) -> None: ...

class SetEnabledRequest(_message.Message):
    __slots__ = ("project_id", "run_id", "enabled")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    enabled: bool
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ..., enabled: _Optional[bool] = ...) -> None: ...

class GetEnabledRequest(_message.Message):
    __slots__ = ("project_id", "run_id")
    PROJECT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    project_id: str
    run_id: str
    def __init__(self, project_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class SetEnabledResponse(_message.Message):
    __slots__ = ("enabled",)
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    def __init__(self, enabled: _Optional[bool] = ...) -> None: ...
