"""Where the services are and how to reach them: the CLI's settings (CAIRN_ADDR, the per-service
addresses, CAIRN_TLS_DIR and its files, CAIRN_TOKEN / CAIRN_TOKEN_FILE, CAIRN_PROJECT), with
explicit arguments over the environment; and the retry policy of every call."""

from __future__ import annotations

import ipaddress
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Union

import grpc

from ._errors import CairnError

PathLike = Union[str, "os.PathLike[str]"]

# The CLI's identity in a PKI of `cairn certs init`: DIR/cli.pem, DIR/cli.key, DIR/ca.pem.
IDENTITY = "cli"
# Room for sandbox results that carry their output files inline.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# The longest wait a service's RetryInfo may ask for between two attempts.
MAX_SERVER_DELAY = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of calls answered UNAVAILABLE: exponential backoff with jitter, or the delay the
    service asked for (google.rpc.RetryInfo) when it gave one. `reconnect_for` bounds how long a
    stream (watch, logs, events) keeps reconnecting after it lost its service."""

    attempts: int = 6
    initial_backoff: float = 0.25
    max_backoff: float = 4.0
    multiplier: float = 2.0
    reconnect_for: float = 60.0

    def delay(self, attempt: int, error: CairnError | None = None) -> float:
        """Seconds to wait before retry number `attempt` (from 1)."""
        if error is not None and error.retry_delay is not None:
            return min(error.retry_delay, MAX_SERVER_DELAY)
        base = min(self.initial_backoff * self.multiplier ** (attempt - 1), self.max_backoff)
        return base * (0.5 + random.random() / 2)


class Options(TypedDict, total=False):
    """The keyword arguments of Client / AsyncClient and their from_env (each overrides the
    setting of the same name; token_file is read into token)."""

    store_addr: str
    ingest_addr: str
    sandbox_addr: str
    tls_dir: PathLike
    tls_cert: PathLike
    tls_key: PathLike
    tls_ca: PathLike
    tls_server_name: str
    token: str | None
    token_file: PathLike
    project: str
    timeout: float
    transfer_timeout: float
    retry: RetryPolicy


if TYPE_CHECKING:
    from typing_extensions import Unpack as Unpack


@dataclass(frozen=True)
class Settings:
    """How a client reaches cairn. `addr` serves every service (as `cairn up` does);
    `store_addr`, `ingest_addr` and `sandbox_addr` override it for one service."""

    addr: str | None = None
    store_addr: str | None = None
    ingest_addr: str | None = None
    sandbox_addr: str | None = None
    tls_dir: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_server_name: str | None = None
    token: str | None = field(default=None, repr=False)
    project: str = "default"
    timeout: float = 30.0
    transfer_timeout: float = 3600.0
    retry: RetryPolicy = RetryPolicy()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings the CLI reads from the environment."""
        e = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = e.get(name, "").strip()
            return value or None

        def path(name: str) -> Path | None:
            value = get(name)
            return Path(value) if value else None

        token = get("CAIRN_TOKEN")
        token_file = path("CAIRN_TOKEN_FILE")
        if token_file is not None:
            token = read_token_file(token_file)
        return cls(
            addr=get("CAIRN_ADDR"),
            store_addr=get("CAIRN_STORE_ADDR"),
            ingest_addr=get("CAIRN_INGEST_ADDR"),
            sandbox_addr=get("CAIRN_SANDBOX_ADDR"),
            tls_dir=path("CAIRN_TLS_DIR"),
            tls_cert=path("CAIRN_TLS_CERT"),
            tls_key=path("CAIRN_TLS_KEY"),
            tls_ca=path("CAIRN_TLS_CA"),
            tls_server_name=get("CAIRN_TLS_SERVER_NAME"),
            token=token,
            project=get("CAIRN_PROJECT") or "default",
        )

    def merged(self, **overrides: object) -> Settings:
        """These settings with every override that is not None (token_file reads its file)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        token_file = given.pop("token_file", None)
        if token_file is not None:
            given["token"] = read_token_file(Path(str(token_file)))
        for key in ("tls_dir", "tls_cert", "tls_key", "tls_ca"):
            if key in given:
                given[key] = Path(str(given[key]))
        return replace(self, **given)  # type: ignore[arg-type]

    def address(self, service: str) -> str:
        """The address of `service` (store | ingest | sandbox | orchestrator)."""
        own = {
            "store": self.store_addr,
            "ingest": self.ingest_addr,
            "sandbox": self.sandbox_addr,
        }.get(service)
        found = own or self.addr
        if not found:
            flag = {
                "store": "CAIRN_STORE_ADDR",
                "ingest": "CAIRN_INGEST_ADDR",
                "sandbox": "CAIRN_SANDBOX_ADDR",
            }.get(service)
            more = f" (or {flag} for this service alone)" if flag else ""
            raise ValueError(
                f"no address for the {service} service: set CAIRN_ADDR{more} or "
                "pass addr= (e.g. the address `cairn up` prints)"
            )
        return _strip_scheme(found)

    @property
    def tls(self) -> bool:
        return any((self.tls_dir, self.tls_cert, self.tls_key, self.tls_ca))

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Mutual-TLS credentials from the TLS settings, or None for plaintext."""
        if not self.tls:
            return None

        def pick(own: Path | None, name: str, what: str) -> bytes:
            chosen = own or (self.tls_dir / name if self.tls_dir else None)
            if chosen is None:
                raise ValueError(
                    f"TLS needs the {what}: set CAIRN_TLS_DIR (a directory of "
                    f"`cairn certs init`) or the {what} file itself"
                )
            try:
                return chosen.read_bytes()
            except OSError as e:
                raise ValueError(
                    f"cannot read the TLS {what} {chosen}: {e.strerror}; check "
                    "CAIRN_TLS_DIR / CAIRN_TLS_CERT / CAIRN_TLS_KEY / CAIRN_TLS_CA"
                ) from None

        return grpc.ssl_channel_credentials(
            root_certificates=pick(self.tls_ca, "ca.pem", "CA certificate"),
            private_key=pick(self.tls_key, f"{IDENTITY}.key", "private key"),
            certificate_chain=pick(self.tls_cert, f"{IDENTITY}.pem", "certificate"),
        )

    def channel_options(self, address: str) -> list[tuple[str, object]]:
        options: list[tuple[str, object]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 30_000),
            # Reconnect soon after a service restarts (gRPC's default backoff grows to 2 min).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        name = server_name_for(address, self.tls_server_name)
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        return options

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata sent with every call: the bearer token, if any."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def read_token_file(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise ValueError(f"cannot read the token file {path}: {e.strerror}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty: write your token into it")
    return token


def _strip_scheme(addr: str) -> str:
    return addr.split("://", 1)[1] if "://" in addr else addr


def server_name_for(addr: str, name: str | None) -> str | None:
    """The TLS name to check: `name` applies only to a non-loopback IP address (a container's
    address whose certificate names its service), as in the CLI."""
    host = _strip_scheme(addr).rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if ip.is_loopback else name


def open_channel(settings: Settings, address: str) -> grpc.Channel:
    creds = settings.credentials()
    options = settings.channel_options(address)
    if creds is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, creds, options=options)


def open_aio_channel(settings: Settings, address: str) -> grpc.aio.Channel:
    creds = settings.credentials()
    options = settings.channel_options(address)
    if creds is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, creds, options=options)
