"""Settings from the CLI's environment variables, errors decoded from google.rpc.Status
details, retries after UNAVAILABLE that honour RetryInfo (against a stand-in gRPC server), and
what mutual TLS with a tokens file refuses."""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import Secure, make_client
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

import cairn_client
from cairn_client import (
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    PermissionDeniedError,
    RetryPolicy,
    Settings,
    UnavailableError,
)
from cairn_client._pb.cairn.v1 import orchestrator_pb2


def test_settings_from_the_cli_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  from-file\n")
    env = {
        "CAIRN_ADDR": "10.0.0.1:7070",
        "CAIRN_STORE_ADDR": "store:7071",
        "CAIRN_SANDBOX_ADDR": "http://runner:7072",
        "CAIRN_TLS_DIR": str(tmp_path),
        "CAIRN_TLS_SERVER_NAME": "orchestrator",
        "CAIRN_TOKEN": "from-env",
        "CAIRN_PROJECT": "proj",
    }
    s = Settings.from_env(env)
    assert (
        s.address("orchestrator"),
        s.address("store"),
        s.address("sandbox"),
        s.address("ingest"),
    ) == ("10.0.0.1:7070", "store:7071", "runner:7072", "10.0.0.1:7070")
    assert s.tls_dir == tmp_path and s.token == "from-env" and s.project == "proj"
    assert s.metadata() == (("authorization", "Bearer from-env"),)
    assert ("grpc.ssl_target_name_override", "orchestrator") in s.channel_options("10.0.0.1:7070")
    assert all(k != "grpc.ssl_target_name_override" for k, _ in s.channel_options("127.0.0.1:1"))
    assert Settings.from_env({**env, "CAIRN_TOKEN_FILE": str(token_file)}).token == "from-file"
    # Explicit arguments override the environment.
    over = s.merged(addr="127.0.0.1:9", token="explicit", project="other")
    assert (over.address("orchestrator"), over.token, over.project) == (
        "127.0.0.1:9",
        "explicit",
        "other",
    )
    assert over.address("store") == "store:7071"
    with pytest.raises(ValueError, match="CAIRN_ADDR"):
        Settings.from_env({}).address("orchestrator")
    with pytest.raises(ValueError, match="cannot read the TLS CA certificate"):
        s.credentials()
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        Settings().merged(token_file=tmp_path / "empty")


def test_client_from_env_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_ADDR", "127.0.0.1:1")
    monkeypatch.setenv("CAIRN_PROJECT", "envproj")
    with Client.from_env(project="given") as c:
        assert c.settings.addr == "127.0.0.1:1" and c.settings.project == "given"
    with Client.from_env() as c:
        assert c.settings.project == "envproj"


class StandIn:
    """A gRPC server answering WhoAmI: first `failures` times with `status`, then normally."""

    def __init__(self, failures: int, status: status_pb2.Status) -> None:
        self.failures, self.status, self.calls = failures, status, []  # type: list[float]
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        handler = grpc.method_handlers_generic_handler(
            "cairn.v1.Orchestrator",
            {
                "WhoAmI": grpc.unary_unary_rpc_method_handler(
                    self.whoami,
                    request_deserializer=orchestrator_pb2.WhoAmIRequest.FromString,
                    response_serializer=orchestrator_pb2.WhoAmIResponse.SerializeToString,
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def whoami(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            context.abort_with_status(rpc_status.to_status(self.status))
        return orchestrator_pb2.WhoAmIResponse(name="stand-in", role="admin")


def status_with(code: int, message: str, *details: Any) -> status_pb2.Status:
    s = status_pb2.Status(code=code, message=message)
    for d in details:
        s.details.add().Pack(d)
    return s


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stand_in_client(flavour: str, server: StandIn) -> tuple[Any, Any]:
    return make_client(
        flavour,
        addr=f"127.0.0.1:{server.port}",
        retry=RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.02),
    )


def test_unavailable_is_retried_after_the_delay_retry_info_asks(flavour: str) -> None:
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=300_000_000))
    server = StandIn(2, status_with(code_pb2.UNAVAILABLE, "shutting down; try again", retry))
    c, close = stand_in_client(flavour, server)
    try:
        assert c.runs.whoami().name == "stand-in"
        gaps = [b - a for a, b in zip(server.calls, server.calls[1:])]
        assert len(server.calls) == 3 and all(g >= 0.29 for g in gaps), gaps
    finally:
        close()
        server.server.stop(0)


def test_refusals_are_not_retried_and_carry_their_details(flavour: str) -> None:
    info = error_details_pb2.ErrorInfo(
        reason="wrong_state", domain="cairn", metadata={"run_id": "r1"}
    )
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="gate_id", description="unknown")
        ]
    )
    server = StandIn(
        1,
        status_with(
            code_pb2.FAILED_PRECONDITION, "run r1 is completed; rework a node instead", info, bad
        ),
    )
    c, close = stand_in_client(flavour, server)
    try:
        with pytest.raises(FailedPreconditionError) as e:
            c.runs.whoami()
        assert len(server.calls) == 1
        err = e.value
        assert (err.reason, err.hint, err.metadata) == (
            "wrong_state",
            "rework a node instead",
            {"run_id": "r1"},
        )
        assert [(v.field, v.description) for v in err.field_violations] == [("gate_id", "unknown")]
        assert isinstance(err, cairn_client.CairnError)
    finally:
        close()
        server.server.stop(0)


def test_an_unreachable_address_is_unavailable_with_a_hint(flavour: str) -> None:
    from conftest import free_port

    c, close = make_client(
        flavour,
        addr=f"127.0.0.1:{free_port()}",
        retry=RetryPolicy(attempts=2, initial_backoff=0.01),
    )
    try:
        with pytest.raises(UnavailableError) as e:
            c.runs.whoami()
        assert e.value.reason == "unavailable" and "CAIRN_ADDR" in e.value.hint
    finally:
        close()


def test_mtls_refuses_missing_and_weak_tokens(secure_server: Secure, flavour: str) -> None:
    addr, tls = secure_server.server.addr, secure_server.tls_dir
    c, close = make_client(flavour, addr=addr, tls_dir=tls, project="auth")
    try:
        with pytest.raises(PermissionDeniedError) as e:
            c.runs.whoami()
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert e.value.reason == "unauthenticated" and "cairn tokens add" in e.value.hint
    finally:
        close()
    c, close = make_client(
        flavour, addr=addr, tls_dir=tls, token=secure_server.viewer, project="auth"
    )
    try:
        assert c.runs.whoami().role == "viewer"
        with pytest.raises(PermissionDeniedError) as e:
            c.runs.submit({"nodes": []})
        assert e.value.reason == "role" and "operator" in e.value.hint
    finally:
        close()
    # Without a client certificate the TLS handshake fails: the service is unreachable.
    c, close = make_client(
        flavour,
        addr=addr,
        tls_ca=tls / "ca.pem",
        tls_cert=tls / "ca.pem",
        tls_key=tls / "ca.key",
        token=secure_server.admin,
        retry=RetryPolicy(attempts=1),
    )
    try:
        with pytest.raises((UnavailableError, PermissionDeniedError)):
            c.store.put("docs/x.txt", b"x")
    finally:
        close()


def test_from_status_without_details_falls_back_to_the_code() -> None:
    err = cairn_client._errors.from_status(grpc.StatusCode.INVALID_ARGUMENT, "bad", None)
    assert isinstance(err, InvalidArgumentError) and err.reason == "invalid_argument"
    assert err.hint == "" and err.retry_delay is None
