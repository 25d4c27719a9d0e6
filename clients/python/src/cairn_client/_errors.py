"""Refusals of the cairn services as exceptions: one class per family of gRPC codes, each with
the reason word, message, hint, metadata, field violations and retry delay that the service's
google.rpc.Status details carry. `from_rpc_error` is the one place codes become classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

DETAILS_KEY = "grpc-status-details-bin"
REASON_KEY = "cairn-reason"


@dataclass(frozen=True)
class FieldViolation:
    """One field of a request that was refused (google.rpc.BadRequest)."""

    field: str
    description: str


class CairnError(Exception):
    """A call that a cairn service refused, or that could not reach it.

    `reason` is the stable word of the service's vocabulary (common.proto), `hint` what to do
    about it, `metadata` what was refused (run_id, project, path, field, ...), `retry_delay`
    the wait in seconds the service asked for before a retry (google.rpc.RetryInfo), if any."""

    code: grpc.StatusCode

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        hint: str = "",
        metadata: dict[str, str] | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        retry_delay: float | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.reason = reason or code.name.lower()
        self.hint = hint
        self.metadata = dict(metadata or {})
        self.field_violations = field_violations
        self.retry_delay = retry_delay
        text = f"{message} [{code.name}, reason: {self.reason}]"
        super().__init__(f"{text}\nhint: {hint}" if hint else text)


class InvalidArgumentError(CairnError):
    """INVALID_ARGUMENT, OUT_OF_RANGE: the request itself is wrong; fix it before retrying."""


class NotFoundError(CairnError):
    """NOT_FOUND: the project, run, file, gate or session does not exist."""


class ConflictError(CairnError):
    """ALREADY_EXISTS, ABORTED: the thing exists already, or a concurrent change won."""


class FailedPreconditionError(CairnError):
    """FAILED_PRECONDITION: the request does not fit the current state (e.g. `wrong_state`)."""


class PermissionDeniedError(CairnError):
    """PERMISSION_DENIED, UNAUTHENTICATED: the credentials are missing or may not do this."""


class ResourceExhaustedError(CairnError):
    """RESOURCE_EXHAUSTED: a limit was reached (sizes, sessions, concurrent runs)."""


class UnavailableError(CairnError):
    """UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED: the service could not be reached or did not
    answer in time; retrying later may work."""


class InternalError(CairnError):
    """INTERNAL, UNKNOWN, DATA_LOSS, UNIMPLEMENTED and anything else: a fault of the service
    or a client that does not match it."""


_FAMILIES: dict[grpc.StatusCode, type[CairnError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: ConflictError,
    grpc.StatusCode.ABORTED: ConflictError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}

# What to do when the service gave no advice of its own.
_DEFAULT_HINTS: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAVAILABLE: "is the service at CAIRN_ADDR (or the per-service address) "
    "running and reachable? With TLS, do CAIRN_TLS_DIR's certificates belong to its CA?",
    grpc.StatusCode.UNAUTHENTICATED: "give a token of the service's tokens file: CAIRN_TOKEN, "
    "CAIRN_TOKEN_FILE or token=",
    grpc.StatusCode.PERMISSION_DENIED: "the token's role or projects do not allow this; ask an "
    "admin for a token that does",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the call took longer than its timeout; pass a larger "
    "timeout= or check the service's load",
    grpc.StatusCode.UNIMPLEMENTED: "the address does not serve this service: point CAIRN_ADDR "
    "or the per-service address (CAIRN_STORE_ADDR, ...) at it",
}


def _status_details(trailers: Any) -> status_pb2.Status | None:
    for key, value in trailers or ():
        if key == DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # a malformed trailer: keep the plain status
                return None
            return status
    return None


def from_status(code: grpc.StatusCode, message: str, trailers: Any) -> CairnError:
    """The exception of a failed call, from its code, message and trailing metadata."""
    reason = ""
    hint = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    retry_delay: float | None = None
    for key, value in trailers or ():
        if key == REASON_KEY and isinstance(value, str):
            reason = value
    status = _status_details(trailers)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        bad = error_details_pb2.BadRequest()
        retry = error_details_pb2.RetryInfo()
        help_ = error_details_pb2.Help()
        localized = error_details_pb2.LocalizedMessage()
        if detail.Unpack(info):
            reason = reason or info.reason
            metadata.update(info.metadata)
        elif detail.Unpack(bad):
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
        elif detail.Unpack(retry):
            retry_delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
        elif detail.Unpack(help_):
            hint = hint or "; ".join(f"{l.description} {l.url}".strip() for l in help_.links)
        elif detail.Unpack(localized):
            hint = hint or localized.message
    if not hint and reason and "; " in message:
        # cairn's services word a refusal as "what was wrong; what to do about it".
        hint = message.split("; ", 1)[1]
    if code != grpc.StatusCode.PERMISSION_DENIED or reason in ("role", "project", ""):
        hint = hint or _DEFAULT_HINTS.get(code, "")
    family = _FAMILIES.get(code, InternalError)
    return family(
        code,
        message,
        reason=reason,
        hint=hint,
        metadata=metadata,
        field_violations=tuple(violations),
        retry_delay=retry_delay,
    )


def from_rpc_error(error: grpc.RpcError) -> CairnError:
    """The exception of a failed grpc call (sync or grpc.aio)."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    trailers = getattr(error, "trailing_metadata", None)
    return from_status(
        code() if callable(code) else grpc.StatusCode.UNKNOWN,
        (details() if callable(details) else None) or str(error),
        trailers() if callable(trailers) else None,
    )
